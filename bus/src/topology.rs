//! The shape of the bus, in one place: agents and their streams, the subject
//! of every message kind, and the durable consumer of every service.
//!
//! Each agent has one stream, `AGENT_<NAME>`, holding `nisse.<agent>.>`:
//! intake addressed to it, its requests to services, the services' replies,
//! its outbound messages and its dead letters. One stream is therefore the
//! full, replayable history of one agent.
//!
//! Subjects say direction: everything the agent's brain consumes is under
//! `nisse.<agent>.in.>` (intake, the services' replies, its notes to
//! itself), everything it emits under `nisse.<agent>.out.>` (requests to
//! services, messages for the operator), and what neither is (progress,
//! captures, dead letters) beside them. So the brain's one filtered
//! consumer reads its inputs and never its own outputs.
//!
//! Every consumer has exactly one filter subject, so the topology works on
//! NATS 2.9 (Debian 12's server) as well as on newer servers.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use async_nats::jetstream::{consumer, kv, stream};
use serde::Serialize;

use crate::{Bus, Error, Result};

/// A validated agent name: lowercase ASCII letters, digits and `-`, starting
/// with a letter, at most 32 characters. It is a subject token and, upper-cased
/// with `-` as `_`, part of a stream name, so nothing else is allowed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct AgentName(String);

impl AgentName {
    /// The name as written in subjects and configuration.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The agent's stream, e.g. `AGENT_OPS`.
    pub fn stream(&self) -> String {
        format!("AGENT_{}", self.0.to_ascii_uppercase().replace('-', "_"))
    }

    /// Every subject of the agent's stream, `nisse.<agent>.>`.
    pub fn stream_subjects(&self) -> String {
        format!("nisse.{}.>", self.0)
    }

    /// The subject of a message kind for this agent.
    pub fn subject(&self, kind: SubjectKind) -> String {
        format!("nisse.{}.{}", self.0, kind.suffix())
    }
}

impl FromStr for AgentName {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let ok = !s.is_empty()
            && s.len() <= 32
            && s.starts_with(|c: char| c.is_ascii_lowercase())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(Error::Config(format!(
                "`{s}` is not a valid agent name: use lowercase letters, digits and `-`, starting with a letter, at most 32 characters"
            )))
        }
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Every kind of message on the bus. Each kind has one subject per agent,
/// `nisse.<agent>.<suffix>`, and one protobuf message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubjectKind {
    /// An Alertmanager alert for the agent (`in.alert`).
    InAlert,
    /// An event from the agent's Matrix room (`in.matrix`).
    InMatrix,
    /// An operator's command from the CLI (`in.operator`).
    InOperator,
    /// Retired: a message for the agent's Matrix room (`out.matrix`),
    /// which brains wrote before [`SubjectKind::Tell`]. Read back from
    /// streams written then, never written.
    OutMatrix,
    /// Something the agent tells the operator, for every channel the
    /// conversation is on to render (`out.tell`).
    Tell,
    /// A channel delivered an approval request the agent told the
    /// operator (`in.tell.posted`): what a bare `approve` may bind.
    TellPosted,
    /// The brain's answer to an operator's command
    /// (`out.operator.<command id>`: one subject per command, so its
    /// sender finds the answer by subject).
    OperatorReply,
    /// A request to classify an action (`out.classify.req`).
    ClassifyReq,
    /// The classifier's verdict (`in.classify.verdict.<request>`: one
    /// subject per request, [`verdict_token`], so a service finds the
    /// verdict a request names by subject, and only the classifier may
    /// publish there).
    ClassifyVerdict,
    /// A model call (`out.model.req`).
    ModelReq,
    /// The model gateway's answer (`in.model.resp`).
    ModelResp,
    /// A model call captured for evaluation (`model.capture`).
    ModelCapture,
    /// A work item's roles pinned to models, sent by the brain to itself
    /// (`in.loop.pin`).
    LoopPin,
    /// A command to execute over SSH (`out.exec.req`).
    ExecReq,
    /// The executor's result (`in.exec.result`).
    ExecResult,
    /// Output of a command still running (`exec.progress`).
    ExecProgress,
    /// The hosts bound to a work item (`out.exec.bind.<work item id>`: one
    /// subject per item, so the last message on it is the binding).
    ExecBind,
    /// A note to write into the vault (`out.vault.write`).
    VaultWrite,
    /// The vault writer's answer (`in.vault.written`).
    VaultWritten,
    /// A read of the vault: a search, a note, what an item starts with
    /// (`out.vault.query`).
    VaultQuery,
    /// The vault reader's answer (`in.vault.found`).
    VaultFound,
    /// The world model as the vault reader loaded it, sent when it
    /// changes (`in.world`).
    World,
    /// Something that happened in Gitea: a verified webhook delivery or
    /// what the poll found (`in.gitea`).
    InGitea,
    /// An API call for the Gitea intake to make (`out.gitea.req`).
    GiteaReq,
    /// The Gitea intake's answer (`in.gitea.result`).
    GiteaResult,
    /// Something that happened in Vikunja: a verified webhook delivery or
    /// what the poll found (`in.vikunja`).
    InVikunja,
    /// An API call for the Vikunja intake to make (`out.vikunja.req`).
    VikunjaReq,
    /// The Vikunja intake's answer (`in.vikunja.result`).
    VikunjaResult,
    /// A tool call for the mcp service to make on an MCP server instance
    /// (`out.mcp.req`).
    McpReq,
    /// The mcp service's answer (`in.mcp.result`).
    McpResult,
    /// The MCP instances mounted for a work item
    /// (`out.mcp.mount.<work item id>`), signed by the brain.
    McpMount,
    /// An MCP instance's tools as its server lists them (`in.mcp.tools`).
    McpTools,
    /// A tick of the agent's clock (`in.tick`).
    Tick,
    /// A duty is due (`in.duty.<duty item>`: one subject per duty, so the
    /// last message on it says when it was last due).
    DutyDue,
    /// A network check for the prober (`out.probe.req`).
    ProbeReq,
    /// The prober's answer (`in.probe.result`).
    ProbeResult,
    /// The brain started, sent to itself (`in.started`).
    BrainStarted,
    /// A message some consumer could never process (`deadletter`).
    DeadLetter,
}

/// Which way a kind of message flows, seen from the agent's brain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// The brain consumes it (`nisse.<agent>.in.>`).
    In,
    /// The brain emits it (`nisse.<agent>.out.>`).
    Out,
    /// Neither: services' progress and captures, dead letters.
    Aside,
}

/// A part of Nisse that connects to the bus as its own identity, one per
/// agent it serves: the brain and each service. Its name is the service's
/// name (`nisse serve <name>`) and its durable consumer's. What each role
/// may publish, consume and keep is read from the tables in this module
/// ([`SubjectKind::publishers`], [`ConsumerSpec::role`],
/// [`BucketSpec::access`]), and the NATS permissions of its identity are
/// derived from them (`crate::auth`), so the bus's walls are never written
/// twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// The agent's brain.
    Brain,
    /// The action classifier.
    Classifier,
    /// The model gateway.
    ModelGateway,
    /// The executor.
    Executor,
    /// The Matrix service (intake and outbound).
    IntakeMatrix,
    /// Alertmanager's webhook receiver.
    IntakeAlerts,
    /// The scheduler: ticks and due duties.
    Scheduler,
    /// The prober: duties' network checks.
    Prober,
    /// The vault writer: the agent's notes into its memory folder.
    VaultWriter,
    /// The vault reader: searches, notes and the world model, from the
    /// folders the agent may read.
    VaultReader,
    /// Gitea's webhook receiver and poller, and the agent's Gitea API
    /// calls.
    IntakeGitea,
    /// Vikunja's webhook receiver and poller, and the agent's Vikunja API
    /// calls.
    IntakeVikunja,
    /// The MCP client: the agent's MCP server instances, their tools and
    /// the calls made on them.
    Mcp,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 13] = [
        Self::Brain,
        Self::Classifier,
        Self::ModelGateway,
        Self::Executor,
        Self::IntakeMatrix,
        Self::IntakeAlerts,
        Self::Scheduler,
        Self::Prober,
        Self::VaultWriter,
        Self::VaultReader,
        Self::IntakeGitea,
        Self::IntakeVikunja,
        Self::Mcp,
    ];

    /// Its name: the service's, and its NATS identity's prefix.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Brain => "brain",
            Self::Classifier => "classifier",
            Self::ModelGateway => "model-gateway",
            Self::Executor => "executor",
            Self::IntakeMatrix => "intake-matrix",
            Self::IntakeAlerts => "intake-alerts",
            Self::Scheduler => "scheduler",
            Self::Prober => "prober",
            Self::VaultWriter => "vault-writer",
            Self::VaultReader => "vault-reader",
            Self::IntakeGitea => "intake-gitea",
            Self::IntakeVikunja => "intake-vikunja",
            Self::Mcp => "mcp",
        }
    }

    /// The role named `name`.
    pub fn named(name: &str) -> Option<Role> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The reads of an agent's stream beyond its own consumer that the
    /// role needs.
    pub const fn stream_reads(self) -> StreamReads {
        match self {
            // Gaps and the outbox check at start are read from the stream.
            Self::Brain => StreamReads::Range,
            // A work item's host binding is the last message on its subject;
            // when a duty was last due is the last message on its subject;
            // the world model the agent has is the last on its subject.
            // An item's MCP mount is the last message on its subject. The
            // verdict a request names is the last on its request's subject
            // (the executor and the mcp service read it; only the
            // classifier publishes it).
            Self::Executor | Self::Scheduler | Self::VaultReader | Self::Mcp => {
                StreamReads::LastOnSubject
            }
            _ => StreamReads::None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a role reads an agent's stream besides taking from its durable
/// consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StreamReads {
    /// Not at all.
    None,
    /// The last message on a subject (one request by subject).
    LastOnSubject,
    /// Ranges, through ephemeral ordered consumers (and the last message
    /// on a subject).
    Range,
}

/// Who may put a kind of message on an agent's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Publisher {
    /// The agent's brain or one of its services.
    Role(Role),
    /// An operator, each on the subject that names them
    /// (`in.operator.<operator>`), with their own credentials.
    Operator,
}

impl SubjectKind {
    /// Every kind, in subject order.
    pub const ALL: [SubjectKind; 38] = [
        Self::InAlert,
        Self::InMatrix,
        Self::InOperator,
        Self::OutMatrix,
        Self::Tell,
        Self::TellPosted,
        Self::OperatorReply,
        Self::ClassifyReq,
        Self::ClassifyVerdict,
        Self::ModelReq,
        Self::ModelResp,
        Self::ModelCapture,
        Self::LoopPin,
        Self::ExecReq,
        Self::ExecResult,
        Self::ExecProgress,
        Self::ExecBind,
        Self::VaultWrite,
        Self::VaultWritten,
        Self::VaultQuery,
        Self::VaultFound,
        Self::World,
        Self::InGitea,
        Self::GiteaReq,
        Self::GiteaResult,
        Self::InVikunja,
        Self::VikunjaReq,
        Self::VikunjaResult,
        Self::McpReq,
        Self::McpResult,
        Self::McpMount,
        Self::McpTools,
        Self::Tick,
        Self::DutyDue,
        Self::ProbeReq,
        Self::ProbeResult,
        Self::BrainStarted,
        Self::DeadLetter,
    ];

    /// The subject after `nisse.<agent>.`. Its first token is its
    /// direction: `in`, `out`, or neither.
    pub const fn suffix(self) -> &'static str {
        match self {
            Self::InAlert => "in.alert",
            Self::InMatrix => "in.matrix",
            Self::InOperator => "in.operator",
            Self::OutMatrix => "out.matrix",
            Self::Tell => "out.tell",
            Self::TellPosted => "in.tell.posted",
            Self::OperatorReply => "out.operator",
            Self::ClassifyReq => "out.classify.req",
            Self::ClassifyVerdict => "in.classify.verdict",
            Self::ModelReq => "out.model.req",
            Self::ModelResp => "in.model.resp",
            Self::ModelCapture => "model.capture",
            Self::LoopPin => "in.loop.pin",
            Self::ExecReq => "out.exec.req",
            Self::ExecResult => "in.exec.result",
            Self::ExecProgress => "exec.progress",
            Self::ExecBind => "out.exec.bind",
            Self::VaultWrite => "out.vault.write",
            Self::VaultWritten => "in.vault.written",
            Self::VaultQuery => "out.vault.query",
            Self::VaultFound => "in.vault.found",
            Self::World => "in.world",
            Self::InGitea => "in.gitea",
            Self::GiteaReq => "out.gitea.req",
            Self::GiteaResult => "in.gitea.result",
            Self::InVikunja => "in.vikunja",
            Self::VikunjaReq => "out.vikunja.req",
            Self::VikunjaResult => "in.vikunja.result",
            Self::McpReq => "out.mcp.req",
            Self::McpResult => "in.mcp.result",
            Self::McpMount => "out.mcp.mount",
            Self::McpTools => "in.mcp.tools",
            Self::Tick => "in.tick",
            Self::DutyDue => "in.duty",
            Self::ProbeReq => "out.probe.req",
            Self::ProbeResult => "in.probe.result",
            Self::BrainStarted => "in.started",
            Self::DeadLetter => "deadletter",
        }
    }

    /// The suffix the kind had before subjects said direction, for kinds
    /// that moved. Streams written then still hold them: they are read
    /// back (replay, rebuild, a binding) as the same kind, never written.
    pub const fn legacy_suffix(self) -> Option<&'static str> {
        match self {
            Self::ClassifyReq => Some("classify.req"),
            Self::ClassifyVerdict => Some("classify.verdict"),
            Self::ModelReq => Some("model.req"),
            Self::ModelResp => Some("model.resp"),
            Self::LoopPin => Some("loop.pin"),
            Self::ExecReq => Some("exec.req"),
            Self::ExecResult => Some("exec.result"),
            Self::ExecBind => Some("exec.bind"),
            Self::VaultWrite => Some("vault.write"),
            Self::VaultWritten => Some("vault.written"),
            _ => None,
        }
    }

    /// Which way it flows, read from its subject.
    pub fn direction(self) -> Direction {
        let suffix = self.suffix();
        if suffix.starts_with("in.") {
            Direction::In
        } else if suffix.starts_with("out.") {
            Direction::Out
        } else {
            Direction::Aside
        }
    }

    /// Who may publish it: the one table NATS permissions are derived
    /// from. Dead letters are written by whichever consumer gave up on a
    /// message; captures by the gateway and by the classifier, which calls
    /// the gateway's library in-process.
    pub const fn publishers(self) -> &'static [Publisher] {
        use Publisher::{Operator, Role as R};
        match self {
            Self::InAlert => &[R(Role::IntakeAlerts)],
            Self::InMatrix | Self::TellPosted => &[R(Role::IntakeMatrix)],
            Self::InOperator => &[Operator],
            Self::ClassifyVerdict => &[R(Role::Classifier)],
            Self::ModelResp => &[R(Role::ModelGateway)],
            Self::ModelCapture => &[R(Role::ModelGateway), R(Role::Classifier)],
            Self::ExecResult | Self::ExecProgress => &[R(Role::Executor)],
            Self::Tick | Self::DutyDue => &[R(Role::Scheduler)],
            Self::ProbeResult => &[R(Role::Prober)],
            Self::VaultWritten => &[R(Role::VaultWriter)],
            Self::VaultFound | Self::World => &[R(Role::VaultReader)],
            Self::InGitea | Self::GiteaResult => &[R(Role::IntakeGitea)],
            Self::InVikunja | Self::VikunjaResult => &[R(Role::IntakeVikunja)],
            Self::McpResult | Self::McpTools => &[R(Role::Mcp)],
            Self::OutMatrix
            | Self::Tell
            | Self::OperatorReply
            | Self::ClassifyReq
            | Self::ModelReq
            | Self::LoopPin
            | Self::ExecReq
            | Self::ExecBind
            | Self::VaultWrite
            | Self::VaultQuery
            | Self::GiteaReq
            | Self::VikunjaReq
            | Self::McpReq
            | Self::McpMount
            | Self::ProbeReq
            | Self::BrainStarted => &[R(Role::Brain)],
            Self::DeadLetter => &[
                R(Role::Brain),
                R(Role::Classifier),
                R(Role::ModelGateway),
                R(Role::Executor),
                R(Role::IntakeMatrix),
                R(Role::Prober),
                R(Role::VaultWriter),
                R(Role::VaultReader),
                R(Role::IntakeGitea),
                R(Role::IntakeVikunja),
                R(Role::Mcp),
            ],
        }
    }

    /// The kind that answers a request of this kind: every request the
    /// brain sends a service has one answer, and a deadline for it (the
    /// brain never waits unexplained, seed L2).
    pub const fn answered_by(self) -> Option<SubjectKind> {
        match self {
            Self::ClassifyReq => Some(Self::ClassifyVerdict),
            Self::ModelReq => Some(Self::ModelResp),
            Self::ExecReq => Some(Self::ExecResult),
            Self::ProbeReq => Some(Self::ProbeResult),
            Self::VaultWrite => Some(Self::VaultWritten),
            Self::VaultQuery => Some(Self::VaultFound),
            Self::GiteaReq => Some(Self::GiteaResult),
            Self::VikunjaReq => Some(Self::VikunjaResult),
            Self::McpReq => Some(Self::McpResult),
            _ => None,
        }
    }

    /// Whether `publisher` may publish this kind.
    pub fn published_by(self, publisher: Publisher) -> bool {
        self.publishers().contains(&publisher)
    }

    /// Whether subjects of this kind end in one more token: the work item
    /// id of a binding (`out.exec.bind.<id>`), the command id of an
    /// operator reply (`out.operator.<id>`), the operator who sent a
    /// command (`in.operator.<operator>`), the duty that is due
    /// (`in.duty.<duty item>`), the request a verdict answers
    /// (`in.classify.verdict.<request>`, [`verdict_token`]).
    pub const fn per_item(self) -> bool {
        matches!(
            self,
            Self::ExecBind
                | Self::OperatorReply
                | Self::InOperator
                | Self::DutyDue
                | Self::McpMount
                | Self::ClassifyVerdict
        )
    }

    /// Whether a subject of this kind written before the kind ended in a
    /// token may still be read without one (on its suffix or its legacy
    /// suffix): commands from before each operator had a subject of their
    /// own (`in.operator`), verdicts from before each request had one
    /// (`in.classify.verdict`, `classify.verdict`).
    const fn legacy_untokened(self) -> bool {
        matches!(self, Self::InOperator | Self::ClassifyVerdict)
    }

    /// The kind whose subject suffix (after `nisse.<agent>.`) is `suffix`,
    /// today's or its legacy one.
    fn of_suffix(suffix: &str) -> Option<SubjectKind> {
        let matches = |kind: SubjectKind, known: &str| {
            if kind.per_item() {
                suffix
                    .strip_prefix(known)
                    .and_then(|rest| rest.strip_prefix('.'))
                    .is_some_and(is_token)
            } else {
                known == suffix
            }
        };
        Self::ALL.into_iter().find(|k| {
            matches(*k, k.suffix())
                || k.legacy_suffix().is_some_and(|l| matches(*k, l))
                || (k.legacy_untokened()
                    && (suffix == k.suffix() || k.legacy_suffix() == Some(suffix)))
        })
    }

    /// The token after the kind in `subject` (a per-item kind's work
    /// item, command or operator), if it has one.
    pub fn token_of(self, subject: &str) -> Option<&str> {
        if !self.per_item() {
            return None;
        }
        let (_, tail) = subject.rsplit_once('.')?;
        let before = &subject[..subject.len() - tail.len() - 1];
        let ends = |known: &str| {
            before
                .strip_suffix(known)
                .is_some_and(|head| head.ends_with('.'))
        };
        (ends(self.suffix()) || self.legacy_suffix().is_some_and(ends))
            .then_some(tail)
            .filter(|t| is_token(t))
    }

    /// Splits a subject into its agent and kind; `None` for anything that is
    /// not a Nisse subject of a known kind.
    pub fn parse(subject: &str) -> Option<(AgentName, SubjectKind)> {
        let rest = subject.strip_prefix("nisse.")?;
        let (agent, suffix) = rest.split_once('.')?;
        let kind = Self::of_suffix(suffix)?;
        Some((agent.parse().ok()?, kind))
    }

    /// The kind of `subject` if it is one of `agent`'s, without allocating:
    /// this runs for every delivered message.
    pub fn of(agent: &AgentName, subject: &str) -> Option<SubjectKind> {
        let suffix = subject
            .strip_prefix("nisse.")?
            .strip_prefix(agent.as_str())?
            .strip_prefix('.')?;
        Self::of_suffix(suffix)
    }
}

/// Whether `s` can be one token of a subject: not empty, no `.`, no
/// wildcard, no whitespace.
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c == '.' || c == '*' || c == '>' || c.is_whitespace() || c.is_control())
}

/// The work item id a duty's messages carry (`duty-<name>`): the last
/// token of its due subject (`in.duty.duty-<name>`), and the item its
/// requests and host binding are under. A duty has no work item; work
/// item ids are UUIDs, so none starts like this.
pub const DUTY_ITEM_PREFIX: &str = "duty-";

/// The longest duty name.
pub const MAX_DUTY_NAME: usize = 64;

/// Whether `name` can be a duty's name: lowercase letters, digits and `-`,
/// not starting with `-`, at most [`MAX_DUTY_NAME`]. It becomes a subject
/// token and part of dedup ids, so only what is safe in both.
pub fn is_duty_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_DUTY_NAME
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The item id of duty `name` ([`DUTY_ITEM_PREFIX`]).
pub fn duty_item(name: &str) -> String {
    format!("{DUTY_ITEM_PREFIX}{name}")
}

/// The duty whose item id this is, if it is a duty's.
pub fn duty_of(work_item_id: &str) -> Option<&str> {
    work_item_id.strip_prefix(DUTY_ITEM_PREFIX)
}

/// The longest request id a verdict's subject holds as it is; a longer one
/// is hashed ([`verdict_token`]), keeping subjects short.
const MAX_VERDICT_TOKEN: usize = 128;

/// The last token of the subject the verdict for request `request_id` is
/// published on (`in.classify.verdict.<token>`): the id itself when it can
/// be one subject token of at most 128 bytes (the brain's ids can:
/// `<item>:<call>:classify`), else the [`crate::key_hash`] of it. The
/// classifier publishes there, and the executor and the mcp service read
/// the verdict a request names there; a reader still checks the verdict's
/// own `request_id`, so a hash that happened to equal another id finds
/// nothing it could mistake.
pub fn verdict_token(request_id: &str) -> std::borrow::Cow<'_, str> {
    if is_token(request_id) && request_id.len() <= MAX_VERDICT_TOKEN {
        std::borrow::Cow::Borrowed(request_id)
    } else {
        std::borrow::Cow::Owned(crate::key_hash(request_id))
    }
}

/// The subject of the verdict for request `request_id` on `agent`'s
/// stream ([`verdict_token`]).
pub fn verdict_subject(agent: &AgentName, request_id: &str) -> String {
    format!(
        "{}.{}",
        agent.subject(SubjectKind::ClassifyVerdict),
        verdict_token(request_id)
    )
}

/// The agent's dead-letter subject, `nisse.<agent>.deadletter`.
pub fn dead_letter_subject(agent: &AgentName) -> String {
    agent.subject(SubjectKind::DeadLetter)
}

/// What a durable consumer takes from an agent's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Filter {
    /// One kind of message (a service's requests).
    Kind(SubjectKind),
    /// Everything the brain consumes, `nisse.<agent>.in.>`, in order.
    BrainInputs,
}

impl Filter {
    /// The filter subject on an agent's stream.
    pub fn subject(&self, agent: &AgentName) -> String {
        match self {
            Self::Kind(kind) => agent.subject(*kind),
            Self::BrainInputs => format!("nisse.{agent}.in.>"),
        }
    }

    /// Whether a message of `kind` passes it.
    pub fn admits(&self, kind: SubjectKind) -> bool {
        match self {
            Self::Kind(k) => *k == kind,
            Self::BrainInputs => kind.direction() == Direction::In,
        }
    }
}

/// The least `max_ack_pending` of the brain's consumer: four of its
/// largest batches (512 messages).
pub const BRAIN_MAX_ACK_PENDING: u32 = 2048;

/// A durable pull consumer that exists on every agent stream. All instances
/// of a service share it, so scaling out is starting another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConsumerSpec {
    /// The durable name.
    pub name: &'static str,
    /// Who takes from it: only that role's identity may.
    pub role: Role,
    /// What it takes.
    pub filter: Filter,
    /// What it is for, stored as the consumer's description.
    pub description: &'static str,
}

impl ConsumerSpec {
    /// The agent's brain: every input of the stream, in order, and none
    /// of its own outputs.
    pub const BRAIN: Self = Self {
        name: "brain",
        role: Role::Brain,
        filter: Filter::BrainInputs,
        description: "the agent brain: every input of the stream, in order",
    };
    /// The classifier service.
    pub const CLASSIFIER: Self = Self {
        name: "classifier",
        role: Role::Classifier,
        filter: Filter::Kind(SubjectKind::ClassifyReq),
        description: "the classifier: classify requests",
    };
    /// The model gateway service.
    pub const MODEL_GATEWAY: Self = Self {
        name: "model-gateway",
        role: Role::ModelGateway,
        filter: Filter::Kind(SubjectKind::ModelReq),
        description: "the model gateway: model requests",
    };
    /// The executor service.
    pub const EXECUTOR: Self = Self {
        name: "executor",
        role: Role::Executor,
        filter: Filter::Kind(SubjectKind::ExecReq),
        description: "the executor: commands to run over SSH",
    };
    /// The prober: network checks of duties.
    pub const PROBER: Self = Self {
        name: "prober",
        role: Role::Prober,
        filter: Filter::Kind(SubjectKind::ProbeReq),
        description: "the prober: duties' network checks",
    };
    /// The vault writer: notes to write.
    pub const VAULT_WRITER: Self = Self {
        name: "vault-writer",
        role: Role::VaultWriter,
        filter: Filter::Kind(SubjectKind::VaultWrite),
        description: "the vault writer: notes to write into the agent's memory",
    };
    /// The vault reader: searches and notes to read.
    pub const VAULT_READER: Self = Self {
        name: "vault-reader",
        role: Role::VaultReader,
        filter: Filter::Kind(SubjectKind::VaultQuery),
        description: "the vault reader: searches and notes to read",
    };
    /// The Gitea intake: the agent's API calls.
    pub const INTAKE_GITEA: Self = Self {
        name: "intake-gitea",
        role: Role::IntakeGitea,
        filter: Filter::Kind(SubjectKind::GiteaReq),
        description: "intake-gitea: the agent's Gitea API calls",
    };
    /// The Vikunja intake: the agent's API calls.
    pub const INTAKE_VIKUNJA: Self = Self {
        name: "intake-vikunja",
        role: Role::IntakeVikunja,
        filter: Filter::Kind(SubjectKind::VikunjaReq),
        description: "intake-vikunja: the agent's Vikunja API calls",
    };
    /// The mcp service: the agent's MCP tool calls.
    pub const MCP: Self = Self {
        name: "mcp",
        role: Role::Mcp,
        filter: Filter::Kind(SubjectKind::McpReq),
        description: "mcp: the agent's MCP tool calls",
    };
    /// The Matrix sender half of intake-matrix: everything the agent
    /// tells the operator, posted in the room.
    pub const MATRIX_TELL: Self = Self {
        name: "matrix-tell",
        role: Role::IntakeMatrix,
        filter: Filter::Kind(SubjectKind::Tell),
        description: "intake-matrix: what the agent tells the operator, for its room",
    };
    /// The Vikunja intake's writer: what the agent tells the operator
    /// about items that have a ticket, posted on the ticket. Its own
    /// consumer, apart from the API calls', so a ticket's comments keep
    /// their order whatever the calls do.
    pub const VIKUNJA_TELL: Self = Self {
        name: "vikunja-tell",
        role: Role::IntakeVikunja,
        filter: Filter::Kind(SubjectKind::Tell),
        description: "intake-vikunja: what the agent tells the operator, for tickets",
    };

    /// Every consumer `ensure_topology` creates on each agent stream: one
    /// per service that exists (a service's consumer arrives with it).
    pub const ALL: [Self; 12] = [
        Self::BRAIN,
        Self::CLASSIFIER,
        Self::MODEL_GATEWAY,
        Self::EXECUTOR,
        Self::MATRIX_TELL,
        Self::PROBER,
        Self::VAULT_WRITER,
        Self::VAULT_READER,
        Self::INTAKE_GITEA,
        Self::INTAKE_VIKUNJA,
        Self::VIKUNJA_TELL,
        Self::MCP,
    ];

    /// The most messages one instance may hold un-acked (the consumer's
    /// `max_ack_pending`) under `tuning`. The brain gets room for several
    /// of its largest batches whatever the tuning says: it is one
    /// instance, applies in order in group commits, and acks a batch only
    /// once its commit is durable, while it applies the next; the default
    /// of 256 held its batches under 128 messages in an alert storm.
    pub fn max_ack_pending(&self, tuning: &crate::config::ConsumerTuning) -> u32 {
        match self.filter {
            Filter::BrainInputs => tuning.max_ack_pending.max(BRAIN_MAX_ACK_PENDING),
            Filter::Kind(_) => tuning.max_ack_pending,
        }
    }

    /// How the consumer's messages are acknowledged. The brain applies its
    /// inputs in stream order and a batch's commit covers every input up
    /// to its last, so it acks once a batch, the last message, and the
    /// server takes that for everything before it (`AckAll`): one ack
    /// instead of one a message, for the server and the brain. Services
    /// handle messages independently, and several instances split them,
    /// so they ack each one. An ack floor ahead of what the brain applied
    /// (a dead-lettered message's termination acks what precedes it too)
    /// loses nothing: the brain reads its stream from its own applied
    /// position when it starts, not from the consumer.
    pub fn ack_policy(&self) -> consumer::AckPolicy {
        match self.filter {
            Filter::BrainInputs => consumer::AckPolicy::All,
            Filter::Kind(_) => consumer::AckPolicy::Explicit,
        }
    }

    /// How many messages one pull asks for: what may be pending, at most
    /// 128 for a service (several instances split the work that finely),
    /// at most [`BRAIN_MAX_ACK_PENDING`]` / 4` for the brain (its largest
    /// batch).
    pub fn pull_batch(&self, tuning: &crate::config::ConsumerTuning) -> usize {
        let most = match self.filter {
            Filter::BrainInputs => BRAIN_MAX_ACK_PENDING / 4,
            Filter::Kind(_) => 128,
        };
        self.max_ack_pending(tuning).clamp(1, most) as usize
    }

    /// The filter subject on an agent's stream.
    pub fn filter_subject(&self, agent: &AgentName) -> String {
        self.filter.subject(agent)
    }

    /// The filter this consumer had before subjects said direction, when
    /// it differs: `ensure_topology` moves a consumer from it.
    fn legacy_filter_subject(&self, agent: &AgentName) -> Option<String> {
        match self.filter {
            Filter::BrainInputs => Some(agent.stream_subjects()),
            Filter::Kind(kind) => kind.legacy_suffix().map(|l| format!("nisse.{agent}.{l}")),
        }
    }
}

/// A key-value bucket of the topology. What its records mean is the
/// owning service's; the bus only keeps the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketSpec {
    /// The bucket's name.
    pub name: &'static str,
    /// What it holds, stored as its description.
    pub description: &'static str,
    /// Past values kept per key.
    pub history: i64,
    /// How long an entry lives after its last write.
    pub max_age: BucketAge,
    /// Who may read and write which keys: NATS permissions are derived
    /// from it. Anyone not listed has no access; operators read every
    /// bucket (`nisse streams`).
    pub access: &'static [BucketAccess],
}

/// One party's access to a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketAccess {
    /// Who.
    pub party: Publisher,
    /// Whether it may write (put, create, update, delete); reading is
    /// always allowed to whoever is listed.
    pub write: bool,
    /// Which keys.
    pub keys: BucketKeys,
}

/// Which keys of a bucket an access covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketKeys {
    /// The keys of the identity's own agent, `<agent>.…` (see
    /// [`crate::kv_key`]): one agent's services never touch another's
    /// records.
    OwnAgent,
    /// Every key (the switch board is one value for every agent).
    All,
}

const fn own(role: Role, write: bool) -> BucketAccess {
    BucketAccess {
        party: Publisher::Role(role),
        write,
        keys: BucketKeys::OwnAgent,
    }
}

/// How long a bucket's entries live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketAge {
    /// Until deleted.
    Forever,
    /// This long after the last write.
    After(Duration),
    /// `bus.lease-ttl` after the last write (leases lapse when not renewed).
    LeaseTtl,
}

/// The leases (one active brain per agent).
pub const LEASE_BUCKET: &str = "nisse_leases";
/// The kill switches.
pub const SWITCH_BUCKET: &str = "nisse_switches";
/// The executor's execution records, keyed by agent and request.
pub const EXEC_BUCKET: &str = "nisse_exec";
/// The executors' circuit states, keyed by agent and host.
pub const CIRCUIT_BUCKET: &str = "nisse_circuits";
/// Services' durable notes (the Matrix service's sync position and
/// threads), keyed by agent.
pub const MEMO_BUCKET: &str = "nisse_memo";
/// The model gateway's usage per work item and role.
pub const MODEL_USAGE_BUCKET: &str = "nisse_model_usage";
/// The vault writer's records of the writes it applied, keyed by agent
/// and message.
pub const VAULT_BUCKET: &str = "nisse_vault";
/// The Gitea intake's records: webhook deliveries taken, poll cursors and
/// API calls made, keyed by agent.
pub const GITEA_BUCKET: &str = "nisse_gitea";
/// The Vikunja intake's records: events stored, poll cursors, API calls
/// made and the agent's own writes, keyed by agent.
pub const VIKUNJA_BUCKET: &str = "nisse_vikunja";
/// The mcp service's records: each call's start and answer (a request id
/// is called at most once) and its instances' circuits, keyed by agent.
pub const MCP_BUCKET: &str = "nisse_mcp";

/// How long an execution record is kept. A request redelivered later than
/// this would run again; JetStream gives up redelivering long before.
pub const EXEC_RECORD_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long a work item's model usage is kept after its last model call.
/// Longer than any item stays open in practice; should one outlive it,
/// its budget starts again, which is the lesser harm than keeping counts
/// forever.
pub const MODEL_USAGE_MAX_AGE: Duration = Duration::from_secs(180 * 24 * 3600);

/// Every bucket `ensure_topology` creates.
pub const BUCKETS: [BucketSpec; 10] = [
    BucketSpec {
        name: LEASE_BUCKET,
        description: "leases: one active holder per name (brains)",
        history: 1,
        max_age: BucketAge::LeaseTtl,
        access: &[own(Role::Brain, true)],
    },
    BucketSpec {
        name: SWITCH_BUCKET,
        description: "kill switches: global autonomy and per-target never",
        // Past boards, for an operator asking who flipped what.
        history: 32,
        max_age: BucketAge::Forever,
        access: &[
            // Only operators flip the kill switches; the classifier and
            // the executor read them for every action.
            BucketAccess {
                party: Publisher::Operator,
                write: true,
                keys: BucketKeys::All,
            },
            BucketAccess {
                party: Publisher::Role(Role::Classifier),
                write: false,
                keys: BucketKeys::All,
            },
            BucketAccess {
                party: Publisher::Role(Role::Executor),
                write: false,
                keys: BucketKeys::All,
            },
            BucketAccess {
                party: Publisher::Role(Role::Mcp),
                write: false,
                keys: BucketKeys::All,
            },
        ],
    },
    BucketSpec {
        name: EXEC_BUCKET,
        description: "execution records: each request id runs at most once",
        history: 1,
        max_age: BucketAge::After(EXEC_RECORD_MAX_AGE),
        access: &[own(Role::Executor, true)],
    },
    BucketSpec {
        name: CIRCUIT_BUCKET,
        description: "circuit breakers of the executors, per agent and host",
        history: 1,
        // A state nobody refreshed for a day is stale.
        max_age: BucketAge::After(Duration::from_secs(24 * 3600)),
        access: &[own(Role::Executor, true)],
    },
    BucketSpec {
        name: MEMO_BUCKET,
        description: "services' durable notes (Matrix sync position, threads)",
        history: 1,
        max_age: BucketAge::After(Duration::from_secs(366 * 24 * 3600)),
        access: &[own(Role::IntakeMatrix, true)],
    },
    BucketSpec {
        name: MODEL_USAGE_BUCKET,
        description: "model calls and tokens spent per work item and role",
        history: 1,
        max_age: BucketAge::After(MODEL_USAGE_MAX_AGE),
        access: &[own(Role::ModelGateway, true), own(Role::Classifier, true)],
    },
    BucketSpec {
        name: VAULT_BUCKET,
        description: "vault writes applied: each message id is written once",
        history: 1,
        // As long as an execution record: JetStream gives up redelivering
        // a write long before.
        max_age: BucketAge::After(EXEC_RECORD_MAX_AGE),
        access: &[own(Role::VaultWriter, true)],
    },
    BucketSpec {
        name: GITEA_BUCKET,
        description: "Gitea intake: deliveries taken, poll cursors, API calls made",
        history: 1,
        // A delivery id is refused again for as long as its record lives;
        // Gitea never redelivers one that old by itself.
        max_age: BucketAge::After(EXEC_RECORD_MAX_AGE),
        access: &[own(Role::IntakeGitea, true)],
    },
    BucketSpec {
        name: VIKUNJA_BUCKET,
        description: "Vikunja intake: events stored, poll cursors, API calls made",
        history: 1,
        // An event is refused again for as long as its record lives;
        // Vikunja's own retries are over within seconds.
        max_age: BucketAge::After(EXEC_RECORD_MAX_AGE),
        access: &[own(Role::IntakeVikunja, true)],
    },
    BucketSpec {
        name: MCP_BUCKET,
        description: "mcp: calls started and answered, circuits per instance",
        history: 1,
        // As long as an execution record: JetStream gives up redelivering
        // a call long before.
        max_age: BucketAge::After(EXEC_RECORD_MAX_AGE),
        access: &[own(Role::Mcp, true)],
    },
];

/// How long `ensure_topology` waits for JetStream to answer.
const JETSTREAM_READY: Duration = Duration::from_secs(30);

/// What `ensure_topology` did to one stream or consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyChange {
    /// It did not exist and was created.
    Created,
    /// It existed with a different configuration and was updated.
    Updated,
    /// It existed as configured.
    Unchanged,
}

/// The outcome of `ensure_topology`, stream by stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopologyReport {
    /// The servers of the cluster it was made on (1: a single server).
    pub servers: usize,
    /// The replicas each stream, consumer and bucket has.
    pub replicas: usize,
    /// One entry per agent stream.
    pub streams: Vec<StreamReport>,
    /// Each key-value bucket, by name.
    pub buckets: Vec<(String, TopologyChange)>,
}

/// What happened to one agent stream and its consumers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StreamReport {
    /// The stream name.
    pub stream: String,
    /// The stream itself.
    pub change: TopologyChange,
    /// Each consumer, by durable name.
    pub consumers: Vec<(String, TopologyChange)>,
}

impl Bus {
    /// The configuration every agent stream should have, with `replicas`.
    pub(crate) fn stream_config(&self, agent: &AgentName, replicas: usize) -> stream::Config {
        let limits = &self.config().streams;
        stream::Config {
            name: agent.stream(),
            description: Some(format!("every message of the {agent} agent")),
            subjects: vec![agent.stream_subjects()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            discard: stream::DiscardPolicy::New,
            max_age: limits.max_age,
            max_bytes: i64::try_from(limits.max_bytes.as_u64()).unwrap_or(i64::MAX),
            num_replicas: replicas,
            duplicate_window: limits.duplicate_window,
            ..Default::default()
        }
    }

    /// The configuration a consumer should have on an agent's stream. The
    /// server's `max_deliver` is one more than configured: that last delivery
    /// is never handled, only dead-lettered, so a message whose handling
    /// crashed the process every time still ends up recorded, not dropped.
    pub(crate) fn consumer_config(
        &self,
        agent: &AgentName,
        spec: &ConsumerSpec,
        replicas: usize,
    ) -> consumer::pull::Config {
        let tuning = &self.config().consumers;
        consumer::pull::Config {
            durable_name: Some(spec.name.to_string()),
            description: Some(spec.description.to_string()),
            deliver_policy: consumer::DeliverPolicy::All,
            ack_policy: spec.ack_policy(),
            ack_wait: tuning.ack_wait,
            max_deliver: i64::from(tuning.max_deliver) + 1,
            filter_subject: spec.filter_subject(agent),
            max_ack_pending: i64::from(spec.max_ack_pending(tuning)),
            num_replicas: replicas,
            ..Default::default()
        }
    }

    /// Creates every agent stream and every durable consumer that does not
    /// exist, and updates those whose configuration differs. Safe to run any
    /// number of times, from any number of processes.
    #[tracing::instrument(name = "bus.ensure_topology", skip(self), fields(agents = ?self.agents()))]
    pub async fn ensure_topology(&self) -> Result<TopologyReport> {
        self.wait_jetstream().await?;
        let servers = self.cluster_size();
        let replicas = self.config().streams.replicas.on(servers);
        let mut streams = Vec::new();
        for agent in self.agents() {
            streams.push(self.ensure_stream(agent, replicas).await?);
        }
        let mut buckets = Vec::new();
        for spec in BUCKETS {
            let change = self
                .ensure_bucket(self.bucket_config(&spec, replicas))
                .await?;
            buckets.push((spec.name.to_string(), change));
        }
        Ok(TopologyReport {
            servers,
            replicas,
            streams,
            buckets,
        })
    }

    /// The servers of the cluster this connection is on, as the server's
    /// greeting lists their client addresses (1 for a single server).
    pub fn cluster_size(&self) -> usize {
        let info = self.client().server_info();
        if info.cluster.is_none() {
            return 1;
        }
        let urls: std::collections::BTreeSet<&str> =
            info.connect_urls.iter().map(String::as_str).collect();
        urls.len().max(1)
    }

    /// Waits until JetStream answers API requests: a cluster's servers
    /// accept clients before they have elected the leader that serves
    /// them, and a topology made meanwhile would fail.
    async fn wait_jetstream(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + JETSTREAM_READY;
        loop {
            // The account info request as raw JSON: async-nats's typed
            // query cannot parse NATS 2.9's answer. Not ready is an
            // answer with an `error` (503), or no responder at all.
            let answer = self
                .client()
                .request("$JS.API.INFO", bytes::Bytes::new())
                .await
                .map_err(|e| e.to_string())
                .and_then(|m| {
                    let v: serde_json::Value =
                        serde_json::from_slice(&m.payload).map_err(|e| e.to_string())?;
                    match v.get("error") {
                        Some(e) => Err(e.to_string()),
                        None => Ok(()),
                    }
                });
            match answer {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!("JetStream is not answering yet: {e}");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => {
                    return Err(Error::JetStream {
                        action: "reach JetStream".into(),
                        reason: format!(
                            "{e} (for {JETSTREAM_READY:?}; a cluster needs a majority of its servers up)"
                        ),
                    });
                }
            }
        }
    }

    /// A bucket's configuration, with `replicas`.
    fn bucket_config(&self, spec: &BucketSpec, replicas: usize) -> kv::Config {
        kv::Config {
            bucket: spec.name.to_string(),
            description: spec.description.to_string(),
            history: spec.history,
            max_age: match spec.max_age {
                BucketAge::Forever => Duration::ZERO,
                BucketAge::After(age) => age,
                BucketAge::LeaseTtl => self.config().lease_ttl,
            },
            num_replicas: replicas,
            storage: stream::StorageType::File,
            ..Default::default()
        }
    }

    /// A key-value bucket (leases, switches) as `want` says: created when
    /// missing, its entry age updated when it differs.
    async fn ensure_bucket(&self, want: kv::Config) -> Result<TopologyChange> {
        let js = self.jetstream();
        let err = |action: &str, e: &dyn fmt::Display| Error::JetStream {
            action: format!("{action} the key-value bucket {}", want.bucket),
            reason: e.to_string(),
        };
        let stream_name = format!("KV_{}", want.bucket);
        match js.get_stream(&stream_name).await {
            Ok(mut s) => {
                let mut have = s.info().await.map_err(|e| err("read", &e))?.config.clone();
                if have.max_age == want.max_age && have.num_replicas == want.num_replicas {
                    return Ok(TopologyChange::Unchanged);
                }
                have.max_age = want.max_age;
                have.num_replicas = want.num_replicas;
                js.update_stream(have)
                    .await
                    .map_err(|e| err("update", &e))?;
                Ok(TopologyChange::Updated)
            }
            Err(e) if stream_not_found(&e) => {
                // The bucket's stream, made as NATS's own clients make a
                // key-value bucket. Not `create_key_value`: async-nats
                // cannot parse NATS 2.9's answer to it.
                let window = if want.max_age.is_zero() {
                    Duration::from_secs(120)
                } else {
                    want.max_age.min(Duration::from_secs(120))
                };
                js.create_stream(stream::Config {
                    name: stream_name.clone(),
                    description: want.description.clone().into(),
                    subjects: vec![format!("$KV.{}.>", want.bucket)],
                    max_messages_per_subject: want.history,
                    max_age: want.max_age,
                    max_bytes: -1,
                    max_message_size: -1,
                    storage: stream::StorageType::File,
                    num_replicas: want.num_replicas,
                    discard: stream::DiscardPolicy::New,
                    allow_rollup: true,
                    deny_delete: true,
                    allow_direct: true,
                    duplicate_window: window,
                    ..Default::default()
                })
                .await
                .map_err(|e| err("create", &e))?;
                Ok(TopologyChange::Created)
            }
            Err(e) => Err(err("look up", &e)),
        }
    }

    async fn ensure_stream(&self, agent: &AgentName, replicas: usize) -> Result<StreamReport> {
        let js = self.jetstream();
        let want = self.stream_config(agent, replicas);
        let name = want.name.clone();
        let err = |action: &str, e: &dyn fmt::Display| Error::JetStream {
            action: format!("{action} stream {name}"),
            reason: e.to_string(),
        };
        let change = match js.get_stream(&name).await {
            Ok(mut s) => {
                let have = s.info().await.map_err(|e| err("read", &e))?.config.clone();
                if stream_matches(&have, &want) {
                    TopologyChange::Unchanged
                } else {
                    js.update_stream(want.clone())
                        .await
                        .map_err(|e| err("update", &e))?;
                    TopologyChange::Updated
                }
            }
            Err(e) if stream_not_found(&e) => {
                js.create_stream(want.clone())
                    .await
                    .map_err(|e| err("create", &e))?;
                TopologyChange::Created
            }
            Err(e) => return Err(err("look up", &e)),
        };
        let stream = js.get_stream(&name).await.map_err(|e| err("open", &e))?;
        let mut consumers = Vec::new();
        for spec in ConsumerSpec::ALL {
            let want = self.consumer_config(agent, &spec, replicas);
            let cerr = |action: &str, e: &dyn fmt::Display| Error::JetStream {
                action: format!("{action} consumer {} on {name}", spec.name),
                reason: e.to_string(),
            };
            let change = match stream.consumer_info(spec.name).await {
                Ok(info) if consumer_matches(&info.config, &want) => TopologyChange::Unchanged,
                Ok(info)
                    if spec.legacy_filter_subject(agent).as_ref()
                        == Some(&info.config.filter_subject)
                        || (info.config.filter_subject == want.filter_subject
                            && info.config.ack_policy != want.ack_policy) =>
                {
                    // Made before subjects said direction, or before the
                    // brain acked once a batch. NATS cannot change a
                    // filter (2.9) or an ack policy in place, so the
                    // consumer is made anew, starting after what the old
                    // one had settled: nothing un-acked is skipped, what
                    // was acked above the floor comes again (a brain
                    // recognises it as applied), and a brain reads what
                    // lies between from the stream itself.
                    let mut moved = want;
                    moved.deliver_policy = consumer::DeliverPolicy::ByStartSequence {
                        start_sequence: info.ack_floor.stream_sequence + 1,
                    };
                    stream
                        .delete_consumer(spec.name)
                        .await
                        .map_err(|e| cerr("replace", &e))?;
                    stream
                        .create_consumer(moved)
                        .await
                        .map_err(|e| cerr("replace", &e))?;
                    tracing::info!(
                        stream = %name,
                        consumer = spec.name,
                        filter = %spec.filter_subject(agent),
                        ack_policy = ?spec.ack_policy(),
                        from = info.ack_floor.stream_sequence + 1,
                        "made a consumer anew: its filter or ack policy cannot change in place"
                    );
                    TopologyChange::Updated
                }
                Ok(info) => {
                    if info.config.filter_subject != want.filter_subject {
                        // NATS 2.9 cannot change a filter in place; saying so
                        // beats a cryptic server error.
                        return Err(cerr(
                            "update",
                            &format!(
                                "its filter is `{}` but should be `{}`; delete it with `nats consumer rm {name} {}` and run again",
                                info.config.filter_subject, want.filter_subject, spec.name
                            ),
                        ));
                    }
                    stream
                        .create_consumer(want)
                        .await
                        .map_err(|e| cerr("update", &e))?;
                    TopologyChange::Updated
                }
                Err(_) => {
                    stream
                        .create_consumer(want)
                        .await
                        .map_err(|e| cerr("create", &e))?;
                    TopologyChange::Created
                }
            };
            consumers.push((spec.name.to_string(), change));
        }
        Ok(StreamReport {
            stream: name,
            change,
            consumers,
        })
    }
}

impl Bus {
    /// Checks that what `role` relies on exists on the server: each
    /// served agent's stream, the role's durable consumers on it and the
    /// key-value buckets it reads or writes. Only the admin identity makes
    /// them (`nisse bus init`, `nisse up`), so a service started against
    /// a server nobody initialised stops at once, naming what is missing
    /// and that command, instead of failing every message or answering
    /// 503 forever.
    pub async fn require_topology(&self, role: Role) -> Result<()> {
        use async_nats::jetstream::context::ConsumerInfoErrorKind;
        let js = self.jetstream();
        let err = |action: String, e: &dyn fmt::Display| Error::JetStream {
            action,
            reason: e.to_string(),
        };
        let mut missing = Vec::new();
        for agent in self.agents() {
            let name = agent.stream();
            let stream = match js.get_stream(&name).await {
                Ok(s) => s,
                Err(e) if stream_not_found(&e) => {
                    missing.push(format!("stream {name}"));
                    continue;
                }
                Err(e) => return Err(err(format!("look up stream {name}"), &e)),
            };
            for spec in ConsumerSpec::ALL.iter().filter(|c| c.role == role) {
                match stream.consumer_info(spec.name).await {
                    Ok(_) => {}
                    Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {
                        missing.push(format!("consumer {} on {name}", spec.name));
                    }
                    Err(e) => {
                        return Err(err(format!("look up consumer {} on {name}", spec.name), &e));
                    }
                }
            }
        }
        let party = Publisher::Role(role);
        for bucket in BUCKETS
            .iter()
            .filter(|b| b.access.iter().any(|a| a.party == party))
        {
            match js.get_stream(format!("KV_{}", bucket.name)).await {
                Ok(_) => {}
                Err(e) if stream_not_found(&e) => {
                    missing.push(format!("key-value bucket {}", bucket.name));
                }
                Err(e) => {
                    return Err(err(format!("look up the bucket {}", bucket.name), &e));
                }
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Error::NotInitialised {
                missing: missing.join(", "),
            })
        }
    }
}

fn stream_not_found(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    use async_nats::jetstream::{ErrorCode, context::GetStreamErrorKind};
    matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

fn stream_matches(have: &stream::Config, want: &stream::Config) -> bool {
    have.subjects == want.subjects
        && have.description == want.description
        && have.retention == want.retention
        && have.storage == want.storage
        && have.discard == want.discard
        && have.max_age == want.max_age
        && have.max_bytes == want.max_bytes
        && have.num_replicas == want.num_replicas
        && have.duplicate_window == want.duplicate_window
}

fn consumer_matches(have: &consumer::Config, want: &consumer::pull::Config) -> bool {
    have.filter_subject == want.filter_subject
        && have.description == want.description
        && have.ack_policy == want.ack_policy
        && have.ack_wait == want.ack_wait
        && have.max_deliver == want.max_deliver
        && have.max_ack_pending == want.max_ack_pending
}

/// Shortest wait a consumer's progress ticks use, so a tiny ack wait in a
/// test does not turn into a busy loop.
pub(crate) const MIN_PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_brain_may_hold_several_full_batches_acked_in_order_and_services_keep_their_tuning() {
        let default = crate::config::ConsumerTuning::default();
        let brain = ConsumerSpec::BRAIN;
        assert_eq!(brain.max_ack_pending(&default), BRAIN_MAX_ACK_PENDING);
        assert_eq!(brain.pull_batch(&default), 512);
        // A larger tuning is kept; a smaller one cannot starve the brain.
        let large = crate::config::ConsumerTuning {
            max_ack_pending: 10_000,
            ..default.clone()
        };
        let small = crate::config::ConsumerTuning {
            max_ack_pending: 4,
            ..default.clone()
        };
        assert_eq!(brain.max_ack_pending(&large), 10_000);
        assert_eq!(brain.max_ack_pending(&small), BRAIN_MAX_ACK_PENDING);
        // The brain acks a batch by its last message; services each one.
        assert_eq!(brain.ack_policy(), consumer::AckPolicy::All);
        for spec in ConsumerSpec::ALL.iter().filter(|s| s.name != "brain") {
            assert_eq!(
                spec.ack_policy(),
                consumer::AckPolicy::Explicit,
                "{}",
                spec.name
            );
            assert_eq!(spec.max_ack_pending(&default), 256, "{}", spec.name);
            assert_eq!(spec.pull_batch(&default), 128, "{}", spec.name);
            assert_eq!(spec.max_ack_pending(&small), 4, "{}", spec.name);
            assert_eq!(spec.pull_batch(&small), 4, "{}", spec.name);
        }
    }

    #[test]
    fn agent_names_are_subject_tokens() {
        for ok in ["ops", "dev", "media-2"] {
            assert!(ok.parse::<AgentName>().is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Ops",
            "2ops",
            "ops.x",
            "ops>",
            "o*",
            "a b",
            &"x".repeat(33),
        ] {
            assert!(bad.parse::<AgentName>().is_err(), "{bad}");
        }
        let a: AgentName = "media-2".parse().unwrap();
        assert_eq!(a.stream(), "AGENT_MEDIA_2");
        assert_eq!(
            a.subject(SubjectKind::ExecReq),
            "nisse.media-2.out.exec.req"
        );
    }

    #[test]
    fn every_subject_parses_back_to_its_kind() {
        let a: AgentName = "ops".parse().unwrap();
        // Kinds published per work item end in its id.
        let subject = |kind: SubjectKind| {
            if kind.per_item() {
                format!("{}.0190-item", a.subject(kind))
            } else {
                a.subject(kind)
            }
        };
        for kind in SubjectKind::ALL {
            assert_eq!(SubjectKind::parse(&subject(kind)), Some((a.clone(), kind)));
            assert_eq!(SubjectKind::of(&a, &subject(kind)), Some(kind));
        }
        assert_eq!(SubjectKind::parse("nisse.ops.in.nothing"), None);
        assert_eq!(SubjectKind::parse("nisse.ops.exec.bind"), None);
        assert_eq!(SubjectKind::parse("nisse.ops.exec.bind.a.b"), None);
        assert_eq!(SubjectKind::parse("nisse.ops.exec.result.x"), None);
        let other: AgentName = "opsx".parse().unwrap();
        assert_eq!(
            SubjectKind::of(&a, &other.subject(SubjectKind::InAlert)),
            None
        );
        assert_eq!(SubjectKind::parse("other.ops.in.alert"), None);
    }

    #[test]
    fn a_verdict_is_on_its_requests_subject_and_older_ones_still_read_as_verdicts() {
        let a: AgentName = "ops".parse().unwrap();
        let id = "0190c0de-0000-7000-8000-000000000001:r1:s0:run:0";
        let subject = verdict_subject(&a, id);
        assert_eq!(subject, format!("nisse.ops.in.classify.verdict.{id}"));
        assert_eq!(
            SubjectKind::of(&a, &subject),
            Some(SubjectKind::ClassifyVerdict)
        );
        assert_eq!(SubjectKind::ClassifyVerdict.token_of(&subject), Some(id));
        // An id that cannot be one token is hashed into one: never a
        // wildcard, never two tokens.
        let long = "x".repeat(129);
        for odd in ["a.b", "x y", "*", ">", "", long.as_str()] {
            let s = verdict_subject(&a, odd);
            assert_eq!(
                SubjectKind::ClassifyVerdict.token_of(&s),
                Some(crate::key_hash(odd).as_str()),
                "{odd:?}"
            );
        }
        // Verdicts written before each had a subject of its own.
        for old in [
            "nisse.ops.in.classify.verdict",
            "nisse.ops.classify.verdict",
        ] {
            assert_eq!(
                SubjectKind::of(&a, old),
                Some(SubjectKind::ClassifyVerdict),
                "{old}"
            );
        }
    }

    #[test]
    fn consumer_names_are_unique_and_services_take_one_kind_each() {
        let mut names: Vec<_> = ConsumerSpec::ALL.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ConsumerSpec::ALL.len());
        let taken: Vec<_> = ConsumerSpec::ALL
            .iter()
            .filter_map(|c| match c.filter {
                Filter::Kind(k) => Some((c.role, k)),
                Filter::BrainInputs => None,
            })
            .collect();
        assert_eq!(
            taken.len(),
            ConsumerSpec::ALL.len() - 1,
            "only the brain takes more than one kind"
        );
        for (role, kind) in &taken {
            // Services take what the brain emits, never what it consumes.
            assert_eq!(kind.direction(), Direction::Out, "{kind:?}");
            // A kind is one service's work, except what the operator is
            // told, which every channel renders.
            let sharing: Vec<_> = taken.iter().filter(|(_, k)| k == kind).collect();
            assert!(
                sharing.len() == 1 || *kind == SubjectKind::Tell,
                "{role:?} shares {kind:?}: {sharing:?}"
            );
        }
    }

    #[test]
    fn the_brain_takes_every_input_and_nothing_it_emits() {
        let a: AgentName = "ops".parse().unwrap();
        let inputs = ConsumerSpec::BRAIN.filter_subject(&a);
        assert_eq!(inputs, "nisse.ops.in.>");
        for kind in SubjectKind::ALL {
            let subject = a.subject(kind);
            let matched = subject.starts_with(inputs.trim_end_matches('>'));
            assert_eq!(matched, Filter::BrainInputs.admits(kind), "{subject}");
            assert_eq!(matched, kind.direction() == Direction::In, "{subject}");
        }
        // What the brain emits: requests to services and messages out.
        for kind in [
            SubjectKind::Tell,
            SubjectKind::OperatorReply,
            SubjectKind::ClassifyReq,
            SubjectKind::ModelReq,
            SubjectKind::ExecReq,
            SubjectKind::ExecBind,
            SubjectKind::VaultWrite,
        ] {
            assert_eq!(kind.direction(), Direction::Out, "{kind:?}");
        }
    }

    /// The wire guard for subjects: every subject a stream may hold (the
    /// committed `subjects.snapshot`, today's and every earlier one) still
    /// reads back as its kind, so a recorded stream replays after any
    /// change; and today's table is all in the snapshot, so no subject
    /// changes without the snapshot saying so.
    #[test]
    fn every_subject_ever_written_still_reads_as_its_kind() {
        let snapshot = include_str!("../subjects.snapshot");
        let a: AgentName = "ops".parse().unwrap();
        let mut listed = Vec::new();
        for line in snapshot.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (kind, suffix) = line.split_once(' ').unwrap();
            let subject = if suffix.ends_with(".<item>") {
                format!("nisse.ops.{}", suffix.replace("<item>", "0190-item"))
            } else {
                format!("nisse.ops.{suffix}")
            };
            let parsed = SubjectKind::of(&a, &subject).map(|k| format!("{k:?}"));
            assert_eq!(parsed.as_deref(), Some(kind), "{subject}");
            listed.push((
                kind.to_string(),
                suffix.trim_end_matches(".<item>").to_string(),
            ));
        }
        for kind in SubjectKind::ALL {
            let entry = (format!("{kind:?}"), kind.suffix().to_string());
            assert!(
                listed.contains(&entry),
                "{entry:?} is not in bus/subjects.snapshot: add it there"
            );
        }
    }
}
