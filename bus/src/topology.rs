//! The shape of the bus, in one place: agents and their streams, the subject
//! of every message kind, and the durable consumer of every service.
//!
//! Each agent has one stream, `AGENT_<NAME>`, holding `nisse.<agent>.>`:
//! intake addressed to it, its requests to services, the services' replies,
//! its outbound messages and its dead letters. One stream is therefore the
//! full, replayable history of one agent.
//!
//! Every consumer has exactly one filter subject, so the topology works on
//! NATS 2.9 (Debian 12's server) as well as on newer servers. The brain's
//! consumer takes the whole stream: it is an event-sourced reactor whose state
//! is a function of everything in it, its own requests included.

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
    /// A message for the agent's Matrix room (`out.matrix`).
    OutMatrix,
    /// A request to classify an action (`classify.req`).
    ClassifyReq,
    /// The classifier's verdict (`classify.verdict`).
    ClassifyVerdict,
    /// A model call (`model.req`).
    ModelReq,
    /// The model gateway's answer (`model.resp`).
    ModelResp,
    /// A model call captured for evaluation (`model.capture`).
    ModelCapture,
    /// A work item's roles pinned to models, sent by the brain to itself
    /// (`loop.pin`).
    LoopPin,
    /// A command to execute over SSH (`exec.req`).
    ExecReq,
    /// The executor's result (`exec.result`).
    ExecResult,
    /// Output of a command still running (`exec.progress`).
    ExecProgress,
    /// The hosts bound to a work item (`exec.bind.<work item id>`: one
    /// subject per item, so the last message on it is the binding).
    ExecBind,
    /// A note to write into the vault (`vault.write`).
    VaultWrite,
    /// The vault writer's answer (`vault.written`).
    VaultWritten,
    /// A message some consumer could never process (`deadletter`).
    DeadLetter,
}

impl SubjectKind {
    /// Every kind, in subject order.
    pub const ALL: [SubjectKind; 17] = [
        Self::InAlert,
        Self::InMatrix,
        Self::InOperator,
        Self::OutMatrix,
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
        Self::DeadLetter,
    ];

    /// The subject after `nisse.<agent>.`.
    pub const fn suffix(self) -> &'static str {
        match self {
            Self::InAlert => "in.alert",
            Self::InMatrix => "in.matrix",
            Self::InOperator => "in.operator",
            Self::OutMatrix => "out.matrix",
            Self::ClassifyReq => "classify.req",
            Self::ClassifyVerdict => "classify.verdict",
            Self::ModelReq => "model.req",
            Self::ModelResp => "model.resp",
            Self::ModelCapture => "model.capture",
            Self::LoopPin => "loop.pin",
            Self::ExecReq => "exec.req",
            Self::ExecResult => "exec.result",
            Self::ExecProgress => "exec.progress",
            Self::ExecBind => "exec.bind",
            Self::VaultWrite => "vault.write",
            Self::VaultWritten => "vault.written",
            Self::DeadLetter => "deadletter",
        }
    }

    /// Whether subjects of this kind end in one more token, the work item
    /// id (`exec.bind.<id>`).
    pub const fn per_item(self) -> bool {
        matches!(self, Self::ExecBind)
    }

    /// The kind whose subject suffix (after `nisse.<agent>.`) is `suffix`.
    fn of_suffix(suffix: &str) -> Option<SubjectKind> {
        Self::ALL.into_iter().find(|k| {
            if k.per_item() {
                suffix
                    .strip_prefix(k.suffix())
                    .and_then(|rest| rest.strip_prefix('.'))
                    .is_some_and(is_token)
            } else {
                k.suffix() == suffix
            }
        })
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

/// The agent's dead-letter subject, `nisse.<agent>.deadletter`.
pub fn dead_letter_subject(agent: &AgentName) -> String {
    agent.subject(SubjectKind::DeadLetter)
}

/// A durable pull consumer that exists on every agent stream. All instances
/// of a service share it, so scaling out is starting another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConsumerSpec {
    /// The durable name.
    pub name: &'static str,
    /// The one subject kind it takes; `None` takes the whole stream.
    pub filter: Option<SubjectKind>,
    /// What it is for, stored as the consumer's description.
    pub description: &'static str,
}

impl ConsumerSpec {
    /// The agent's brain: the whole stream, in order.
    pub const BRAIN: Self = Self {
        name: "brain",
        filter: None,
        description: "the agent brain: every message of the stream, in order",
    };
    /// The classifier service.
    pub const CLASSIFIER: Self = Self {
        name: "classifier",
        filter: Some(SubjectKind::ClassifyReq),
        description: "the classifier: classify requests",
    };
    /// The model gateway service.
    pub const MODEL_GATEWAY: Self = Self {
        name: "model-gateway",
        filter: Some(SubjectKind::ModelReq),
        description: "the model gateway: model requests",
    };
    /// The executor service.
    pub const EXECUTOR: Self = Self {
        name: "executor",
        filter: Some(SubjectKind::ExecReq),
        description: "the executor: commands to run over SSH",
    };
    /// The vault writer service.
    pub const VAULT_WRITER: Self = Self {
        name: "vault-writer",
        filter: Some(SubjectKind::VaultWrite),
        description: "the vault writer: notes to write",
    };
    /// The Matrix sender half of intake-matrix.
    pub const MATRIX_OUTBOUND: Self = Self {
        name: "matrix-outbound",
        filter: Some(SubjectKind::OutMatrix),
        description: "intake-matrix: messages to post in the agent's room",
    };

    /// Every consumer `ensure_topology` creates on each agent stream.
    pub const ALL: [Self; 6] = [
        Self::BRAIN,
        Self::CLASSIFIER,
        Self::MODEL_GATEWAY,
        Self::EXECUTOR,
        Self::VAULT_WRITER,
        Self::MATRIX_OUTBOUND,
    ];

    /// The filter subject on an agent's stream.
    pub fn filter_subject(&self, agent: &AgentName) -> String {
        match self.filter {
            Some(kind) => agent.subject(kind),
            None => agent.stream_subjects(),
        }
    }
}

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
    /// One entry per agent stream.
    pub streams: Vec<StreamReport>,
    /// The lease bucket.
    pub leases: TopologyChange,
    /// The kill-switch bucket.
    pub switches: TopologyChange,
    /// The execution-record bucket.
    pub exec_records: TopologyChange,
    /// The circuit-state bucket.
    pub circuits: TopologyChange,
    /// The services' note bucket.
    pub memo: TopologyChange,
    /// The model gateway's usage bucket (budgets per work item and role).
    pub model_usage: TopologyChange,
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
    /// The configuration every agent stream should have.
    pub(crate) fn stream_config(&self, agent: &AgentName) -> stream::Config {
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
            num_replicas: limits.replicas,
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
    ) -> consumer::pull::Config {
        let tuning = &self.config().consumers;
        consumer::pull::Config {
            durable_name: Some(spec.name.to_string()),
            description: Some(spec.description.to_string()),
            deliver_policy: consumer::DeliverPolicy::All,
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: tuning.ack_wait,
            max_deliver: i64::from(tuning.max_deliver) + 1,
            filter_subject: spec.filter_subject(agent),
            max_ack_pending: i64::from(tuning.max_ack_pending),
            num_replicas: self.config().streams.replicas,
            ..Default::default()
        }
    }

    /// Creates every agent stream and every durable consumer that does not
    /// exist, and updates those whose configuration differs. Safe to run any
    /// number of times, from any number of processes.
    #[tracing::instrument(name = "bus.ensure_topology", skip(self), fields(agents = ?self.agents()))]
    pub async fn ensure_topology(&self) -> Result<TopologyReport> {
        let mut streams = Vec::new();
        for agent in self.agents() {
            streams.push(self.ensure_stream(agent).await?);
        }
        let leases = self.ensure_bucket(self.lease_bucket_config()).await?;
        let switches = self.ensure_bucket(self.switch_bucket_config()).await?;
        let exec_records = self.ensure_bucket(self.exec_bucket_config()).await?;
        let circuits = self.ensure_bucket(self.circuit_bucket_config()).await?;
        let memo = self.ensure_bucket(self.memo_bucket_config()).await?;
        let model_usage = self.ensure_bucket(self.model_usage_bucket_config()).await?;
        Ok(TopologyReport {
            streams,
            leases,
            switches,
            exec_records,
            circuits,
            memo,
            model_usage,
        })
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
                if have.max_age == want.max_age {
                    return Ok(TopologyChange::Unchanged);
                }
                have.max_age = want.max_age;
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

    async fn ensure_stream(&self, agent: &AgentName) -> Result<StreamReport> {
        let js = self.jetstream();
        let want = self.stream_config(agent);
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
            let want = self.consumer_config(agent, &spec);
            let cerr = |action: &str, e: &dyn fmt::Display| Error::JetStream {
                action: format!("{action} consumer {} on {name}", spec.name),
                reason: e.to_string(),
            };
            let change = match stream.consumer_info(spec.name).await {
                Ok(info) if consumer_matches(&info.config, &want) => TopologyChange::Unchanged,
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
        assert_eq!(a.subject(SubjectKind::ExecReq), "nisse.media-2.exec.req");
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
    fn consumer_names_are_unique_and_services_take_one_kind_each() {
        let mut names: Vec<_> = ConsumerSpec::ALL.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ConsumerSpec::ALL.len());
        let mut filters: Vec<_> = ConsumerSpec::ALL.iter().filter_map(|c| c.filter).collect();
        filters.sort_unstable();
        filters.dedup();
        assert_eq!(
            filters.len(),
            ConsumerSpec::ALL.len() - 1,
            "only the brain takes the whole stream"
        );
    }
}
