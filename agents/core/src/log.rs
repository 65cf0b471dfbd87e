//! The canonical log (seed Nisse L7): the durable, append-only record of
//! every work item. Every event carries its work item and its actor; the
//! log is never edited (the store's triggers refuse updates and deletes),
//! so a correction is a new event.

use rusqlite::{OptionalExtension as _, params};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::store::{Cached as _, StoreError, Txn, ns_to_time, time_to_ns};
use crate::work::{State, Transition};

/// Who an event is from. Only `operator` actors can instruct or approve;
/// everything else is data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    /// A human on the operator allowlist.
    Operator,
    /// An agent brain.
    Agent,
    /// A Nisse service.
    Service,
    /// An outside system or person (Alertmanager, a stranger).
    External,
}

impl ActorKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Agent => "agent",
            Self::Service => "service",
            Self::External => "external",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Self::Operator, Self::Agent, Self::Service, Self::External]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// An actor: its kind and its identity within the kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Actor {
    /// What kind of actor.
    pub kind: ActorKind,
    /// Who: a Matrix user id, an agent name, `alertmanager:<receiver>`.
    pub id: String,
}

impl Actor {
    /// The agent itself (its brain).
    pub fn agent(name: &str) -> Self {
        Self {
            kind: ActorKind::Agent,
            id: name.to_string(),
        }
    }

    /// The actor a bus envelope names; a missing or unknown kind is
    /// external, never an operator.
    pub fn from_envelope(env: &nisse_bus::proto::Envelope) -> Self {
        use nisse_bus::proto::ActorKind as K;
        match &env.actor {
            Some(a) => Self {
                kind: match K::try_from(a.kind) {
                    Ok(K::Operator) => ActorKind::Operator,
                    Ok(K::Agent) => ActorKind::Agent,
                    Ok(K::Service) => ActorKind::Service,
                    _ => ActorKind::External,
                },
                id: a.id.clone(),
            },
            None => Self {
                kind: ActorKind::External,
                id: "unknown".into(),
            },
        }
    }
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind.as_str(), self.id)
    }
}

/// What can be in the log. The names follow L7; events the later agent
/// loop adds (tool calls, model turns) join this enum as they land.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// The item opened.
    Opened {
        /// Its title.
        title: String,
        /// Its scope.
        scope: String,
        /// Its source.
        source: String,
        /// The finding fingerprint that opened it.
        fingerprint: Option<String>,
        /// Severity as the source said it.
        severity: Option<String>,
        /// The external record, if any.
        external_link: Option<String>,
    },
    /// A duty's finding attached to the item: the first one that opened it,
    /// or a later one for the same problem (deduplicated by fingerprint).
    Finding {
        /// The duty that produced it (`alert-intake`, a check name).
        duty: String,
        /// The finding's stable fingerprint.
        fingerprint: String,
        /// What it says: `firing`, `resolved`, `repeat`...
        status: String,
        /// One line for people.
        summary: String,
        /// The finding as received. Anything written outside Nisse in it
        /// (alert annotations) is untrusted text.
        detail: serde_json::Value,
    },
    /// Something the orchestrator observed or did.
    Fact {
        /// What, for people.
        text: String,
        /// The same, for code.
        #[serde(default)]
        data: serde_json::Value,
    },
    /// The item's state changed (always through the guard).
    StateChanged {
        /// Before.
        from: State,
        /// After.
        to: State,
        /// Which transition.
        transition: Transition,
        /// Why.
        reason: String,
    },
    /// The operator set (or cleared) the item's place in the ready order.
    OperatorOrder {
        /// Lower goes first; `None` cleared it.
        rank: Option<i64>,
    },
    /// A plan revision was proposed.
    PlanProposed {
        /// `rev-N`'s N.
        revision: u32,
        /// The proposer's prose (never scope).
        rationale: String,
        /// The literal steps.
        steps: Vec<nisse_policy::Step>,
    },
    /// A plan was not accepted (before or after it got a revision).
    PlanRejected {
        /// The revision, when it had one.
        revision: Option<u32>,
        /// Why.
        reason: String,
    },
    /// A revision's approval request was sent.
    ApprovalRequested {
        /// The revision.
        revision: u32,
        /// Until when an approval is accepted.
        #[serde(with = "time::serde::rfc3339")]
        expires_at: OffsetDateTime,
        /// The request as rendered.
        text: String,
    },
    /// A channel delivered a revision's approval request to the operator
    /// (intake-matrix: the homeserver accepted the post). A bare `approve`
    /// on that channel binds the revision only when its latest request
    /// was delivered there.
    ApprovalDelivered {
        /// The revision.
        revision: u32,
        /// The channel (`matrix`).
        via: String,
        /// The request's message id (`out:<item>:<its approval_requested
        /// event>`).
        message_id: String,
        /// The channel's own id of the post (the Matrix event id).
        posted_id: String,
    },
    /// The classifier's verdict on one command (seed L4: every verdict is
    /// logged).
    ClassifierVerdict {
        /// The request it answers.
        request_id: String,
        /// The plan revision.
        revision: u32,
        /// The step (1-based).
        step: usize,
        /// `pre`, `run` or `post`.
        phase: String,
        /// `safe`, `dangerous but in scope`, `dangerous, needs discussion`.
        verdict: String,
        /// 1, 2 or 3.
        action_class: u8,
        /// The risk class, when known.
        risk: Option<nisse_policy::RiskClass>,
        /// `fast_path`, `model`, `fail_closed`, `kill_switch`, `no_model`.
        decided_by: String,
        /// Why.
        reasons: Vec<String>,
        /// The policy rules that matched.
        rules: Vec<String>,
        /// The switches it was given under.
        switches: nisse_policy::Switches,
    },
    /// An operator approved a revision.
    Approved {
        /// The revision.
        revision: u32,
        /// Who.
        by: String,
        /// Through which channel.
        via: String,
        /// The reply named no revision and was stamped with the one up.
        stamped: bool,
    },
    /// An operator denied a revision.
    Denied {
        /// The revision.
        revision: u32,
        /// Who.
        by: String,
        /// Through which channel.
        via: String,
        /// Their reason.
        reason: String,
    },
    /// An approval or denial that was not applied (L3 binding), recorded
    /// as data.
    DecisionRefused {
        /// The revision it named, if any.
        named: Option<u32>,
        /// Who sent it.
        by: String,
        /// Through which channel.
        via: String,
        /// An approval (else a denial).
        approve: bool,
        /// Why it was not applied.
        reason: String,
    },
    /// An execution was requested, through a permit.
    ExecRequested {
        /// The request id (the executor's idempotency key).
        request_id: String,
        /// The plan revision.
        revision: u32,
        /// The step (1-based).
        step: usize,
        /// `pre`, `run` or `post`.
        phase: String,
        /// The attempt (0 first).
        attempt: u32,
        /// Where.
        host: String,
        /// What.
        command: String,
        /// What permitted it.
        basis: String,
    },
    /// The executor's result for a step's command.
    StepResult {
        /// The request id.
        request_id: String,
        /// The plan revision.
        revision: u32,
        /// The step (1-based).
        step: usize,
        /// `pre`, `run` or `post`.
        phase: String,
        /// The attempt (0 first).
        attempt: u32,
        /// `completed`, `refused`, `failed`, `outcome_unknown`.
        status: String,
        /// The exit code, when it completed.
        exit_code: i32,
        /// Why it was refused or failed.
        reason: String,
        /// The end of its standard output.
        stdout_tail: String,
        /// The end of its standard error.
        stderr_tail: String,
        /// What kind of failure (`host_key_changed`, `circuit_open`…),
        /// empty when it completed.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        failure: String,
        /// Bytes of output the executor's cap dropped from the middle.
        #[serde(default, skip_serializing_if = "is_zero")]
        dropped_bytes: u64,
    },
    /// Someone said something in the agent's room about the item. Only an
    /// allowlisted operator's words addressed to the agent are
    /// instructions; everyone else's are data.
    Said {
        /// Through which channel (`matrix`).
        via: String,
        /// The words.
        text: String,
        /// From an allowlisted operator.
        operator: bool,
        /// How code read it: `command`, `question`, `talk`, `for-someone-else`.
        read_as: String,
    },
    /// Hosts were bound to the item: execution may reach them, and no
    /// other host (seed L13: the harness binds the host, not the model).
    HostsBound {
        /// The hosts added by this binding.
        added: Vec<String>,
        /// Every host bound to the item now.
        hosts: Vec<String>,
        /// Why (an alert label, the operator's plan, the agent's tool hosts).
        reason: String,
    },
    /// A running plan stopped at a step.
    PlanHalted {
        /// The revision.
        revision: u32,
        /// The step (1-based).
        step: usize,
        /// Why.
        reason: String,
        /// It cannot go on (else it was put up again).
        final_halt: bool,
    },
    /// Every step of a revision ran.
    PlanFinished {
        /// The revision.
        revision: u32,
    },
    /// The operator said `stop`.
    Stopped {
        /// Who.
        by: String,
        /// Through which channel.
        via: String,
        /// The revision that will not go on, if one was open.
        revision: Option<u32>,
    },
    /// The operator abandoned the item.
    Abandoned {
        /// Who.
        by: String,
        /// Through which channel.
        via: String,
        /// Their note.
        note: String,
    },
    /// The item's roles were resolved to models and pinned (L9): every
    /// model call for the item uses these, whatever the configuration
    /// says later.
    RolesPinned {
        /// Role name → the pinned model and its profile.
        roles: std::collections::BTreeMap<String, nisse_models::Pin>,
    },
    /// A model call was sent. The context it carried is not stored: it is
    /// rendered from this log at call time (L6).
    ModelRequested {
        /// The request id.
        request_id: String,
        /// The role asked.
        role: String,
        /// The pinned model.
        model: String,
        /// The estimated prompt size, in tokens.
        prompt_tokens: u64,
        /// Events left out to fit the window.
        #[serde(default, skip_serializing_if = "is_zero")]
        dropped_events: u64,
        /// Old tool results shortened to fit the window.
        #[serde(default, skip_serializing_if = "is_zero")]
        shortened_results: u64,
    },
    /// A model call came back as an error (the brain sees it as one: a
    /// cut-off, empty or malformed reply is never taken for an answer).
    ModelFailed {
        /// The request id.
        request_id: String,
        /// The role asked.
        role: String,
        /// The model that failed, when the gateway got that far.
        model: String,
        /// `timeout`, `budget_exceeded`, `truncated`, `empty`, `malformed`,
        /// `upstream`, `context_too_long`, `no_fit`.
        error: String,
        /// What it said.
        message: String,
    },
    /// A model's text (L7 `assistant_text`).
    AssistantText {
        /// The model request it answered.
        request_id: String,
        /// The role that said it.
        role: String,
        /// The model that said it.
        model: String,
        /// The text.
        text: String,
    },
    /// A model called a tool (L7 `tool_call`). The id is minted locally;
    /// the provider's id is kept only to answer it.
    ToolCall {
        /// The canonical call id.
        call_id: String,
        /// The model request whose reply made the call.
        request_id: String,
        /// The provider's id for the call.
        provider_id: String,
        /// The role that called.
        role: String,
        /// The tool.
        tool: String,
        /// The arguments exactly as the model wrote them.
        arguments: String,
    },
    /// A tool call's result (L7 `tool_result`).
    ToolResult {
        /// The canonical call id.
        call_id: String,
        /// The result, as the model will see it.
        result: String,
        /// Whether the tool did what was asked.
        success: bool,
        /// The result holds text from outside (command output, a file):
        /// data, never instructions (L11).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        untrusted: bool,
    },
    /// The agent asked the operator a question and waits for the answer
    /// (L2: a pending question is durable).
    QuestionAsked {
        /// The `ask_human` call.
        call_id: String,
        /// The question.
        question: String,
    },
    /// A note the agent wrote for itself (`note`), also written to its
    /// memory in the vault.
    Note {
        /// The `note` call.
        call_id: String,
        /// The note.
        text: String,
    },
    /// Notes read from the vault for the item (L6 "how memory is used"):
    /// each snapshotted here with its provenance the first time the item
    /// reads it, so the item's log holds what it knew and a replay never
    /// reads the vault again.
    KnowledgeRetrieved {
        /// The vault query.
        request_id: String,
        /// What was asked: `recall`, `search: <words>`, `read: <path>`.
        query: String,
        /// The notes, first read by this item.
        notes: Vec<RetrievedNote>,
        /// Procedures the item is bound to that are not in the vault.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        missing: Vec<String>,
    },
    /// The helper took over the item (L9 delegation).
    DelegationStarted {
        /// What it is asked to do, rendered by code.
        brief: String,
        /// Why: the trigger.
        trigger: String,
        /// The helper's model.
        model: String,
        /// Its caps: turns.
        max_turns: u32,
        /// Its caps: tokens.
        max_tokens: u64,
        /// Its caps: wall-clock seconds.
        max_seconds: u64,
    },
    /// The helper handed back (or hit a cap).
    DelegationCompleted {
        /// The handback note for the driver.
        note: String,
        /// `handed_back`, `turn_cap`, `token_cap`, `time_cap`, `failed`,
        /// `stopped`.
        status: String,
        /// Model calls it made.
        turns: u32,
        /// Tokens it used.
        tokens: u64,
        /// How long it ran, in seconds.
        seconds: u64,
    },
}

impl Event {
    /// The event's kind as stored (`opened`, `finding`...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Opened { .. } => "opened",
            Self::Finding { .. } => "finding",
            Self::Fact { .. } => "fact",
            Self::StateChanged { .. } => "state_changed",
            Self::OperatorOrder { .. } => "operator_order",
            Self::PlanProposed { .. } => "plan_proposed",
            Self::PlanRejected { .. } => "plan_rejected",
            Self::ApprovalRequested { .. } => "approval_requested",
            Self::ApprovalDelivered { .. } => "approval_delivered",
            Self::ClassifierVerdict { .. } => "classifier_verdict",
            Self::Approved { .. } => "approved",
            Self::Denied { .. } => "denied",
            Self::DecisionRefused { .. } => "decision_refused",
            Self::ExecRequested { .. } => "exec_requested",
            Self::StepResult { .. } => "step_result",
            Self::HostsBound { .. } => "hosts_bound",
            Self::Said { .. } => "said",
            Self::PlanHalted { .. } => "plan_halted",
            Self::PlanFinished { .. } => "plan_finished",
            Self::Stopped { .. } => "stopped",
            Self::Abandoned { .. } => "abandoned",
            Self::RolesPinned { .. } => "roles_pinned",
            Self::ModelRequested { .. } => "model_requested",
            Self::ModelFailed { .. } => "model_failed",
            Self::AssistantText { .. } => "assistant_text",
            Self::ToolCall { .. } => "tool_call",
            Self::ToolResult { .. } => "tool_result",
            Self::QuestionAsked { .. } => "question_asked",
            Self::Note { .. } => "note",
            Self::KnowledgeRetrieved { .. } => "knowledge_retrieved",
            Self::DelegationStarted { .. } => "delegation_started",
            Self::DelegationCompleted { .. } => "delegation_completed",
        }
    }
}

/// An event as the log holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoggedEvent {
    /// Its place in the agent's log (ascending, gap-free per store).
    pub id: i64,
    /// Its work item.
    pub work_item_id: String,
    /// When it happened (the time of the stream message that caused it).
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// Who it is from.
    pub actor: Actor,
    /// The stream sequence of the message that caused it.
    pub stream_sequence: u64,
    /// The id of the message that caused it.
    pub causation_id: String,
    /// The event.
    pub event: Event,
}

pub(crate) const EVENT_COLUMNS: &str =
    "id, work_item_id, at_ns, actor_kind, actor_id, stream_sequence, causation_id, payload";

pub(crate) fn event_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<LoggedEvent> {
    let bad = |col: usize, e: String| {
        rusqlite::Error::FromSqlConversionFailure(
            col,
            rusqlite::types::Type::Text,
            Box::<dyn std::error::Error + Send + Sync>::from(e),
        )
    };
    let kind: String = row.get(3)?;
    let payload: String = row.get(7)?;
    Ok(LoggedEvent {
        id: row.get(0)?,
        work_item_id: row.get(1)?,
        at: ns_to_time(row.get(2)?),
        actor: Actor {
            kind: ActorKind::parse(&kind)
                .ok_or_else(|| bad(3, format!("unknown actor kind `{kind}`")))?,
            id: row.get(4)?,
        },
        stream_sequence: u64::try_from(row.get::<_, i64>(5)?).unwrap_or(0),
        causation_id: row.get(6)?,
        event: serde_json::from_str(&payload).map_err(|e| bad(7, e.to_string()))?,
    })
}

/// A work item's log, in order, on any connection of the store.
pub(crate) fn item_events(
    conn: &rusqlite::Connection,
    work_item_id: &str,
) -> Result<Vec<LoggedEvent>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {EVENT_COLUMNS} FROM events WHERE work_item_id = ?1 ORDER BY id"
    ))?;
    let rows = stmt.query_map([work_item_id], event_from_row)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

impl Txn<'_, '_> {
    /// Appends an event to a work item's log, caused by the message being
    /// applied. Returns its id.
    pub fn append(
        &mut self,
        work_item_id: &str,
        actor: &Actor,
        event: &Event,
    ) -> Result<i64, StoreError> {
        let payload = serde_json::to_string(event)
            .map_err(|e| StoreError::Corrupt(format!("cannot encode event: {e}")))?;
        let at_ns = time_to_ns(self.at());
        let (seq, causation) = self.cause();
        let causation = causation.to_string();
        self.tx().exec_cached(
            "INSERT INTO events (work_item_id, at_ns, actor_kind, actor_id, kind, stream_sequence, causation_id, payload)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                work_item_id,
                at_ns,
                actor.kind.as_str(),
                actor.id,
                event.kind(),
                i64::try_from(seq).unwrap_or(i64::MAX),
                causation,
                payload
            ],
        )?;
        let id = self.tx().last_insert_rowid();
        self.first_event.get_or_insert(id);
        Ok(id)
    }

    /// A work item's log, in order.
    pub fn events(&self, work_item_id: &str) -> Result<Vec<LoggedEvent>, StoreError> {
        item_events(self.tx(), work_item_id)
    }

    /// The events the message being applied has caused so far, in order,
    /// on any item.
    pub fn events_caused(&self) -> Result<Vec<LoggedEvent>, StoreError> {
        let Some(first) = self.first_event else {
            return Ok(Vec::new());
        };
        let mut stmt = self.tx().prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE id >= ?1 AND causation_id = ?2 ORDER BY id"
        ))?;
        let rows = stmt.query_map(params![first, self.cause().1], event_from_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// A top-level text field of the last event of `kind` in an item's
    /// log, read by SQLite from the stored JSON: for a question that needs
    /// one field, decoding the whole event (a finding's detail, every
    /// label of its alert) was most of its cost.
    pub fn last_event_field(
        &self,
        work_item_id: &str,
        kind: &str,
        field: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(self
            .tx()
            .row_cached(
                "SELECT json_extract(payload, '$.' || ?3) FROM events WHERE work_item_id = ?1 AND kind = ?2 ORDER BY id DESC LIMIT 1",
                params![work_item_id, kind, field],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()?
            .flatten())
    }

    /// Whether the item has a `fact` event after event `after` whose data
    /// holds `key`: a marker that something was said once.
    pub fn has_fact_after(
        &self,
        work_item_id: &str,
        after: i64,
        key: &str,
    ) -> Result<bool, StoreError> {
        Ok(self.tx().row_cached(
            "SELECT EXISTS (SELECT 1 FROM events WHERE work_item_id = ?1 AND id > ?2 AND kind = 'fact'
               AND json_extract(payload, '$.data.' || ?3) IS NOT NULL)",
            params![work_item_id, after, key],
            |r| r.get(0),
        )?)
    }

    /// How many times an item went through `transition`.
    pub fn count_transitions(
        &self,
        work_item_id: &str,
        transition: Transition,
    ) -> Result<u64, StoreError> {
        let name = serde_json::to_value(transition)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let n: i64 = self.tx().row_cached(
            "SELECT COUNT(*) FROM events WHERE work_item_id = ?1 AND kind = 'state_changed'
             AND json_extract(payload, '$.transition') = ?2",
            params![work_item_id, name],
            |r| r.get(0),
        )?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// How many events of `kind` an item's log holds.
    pub fn count_events(&self, work_item_id: &str, kind: &str) -> Result<u64, StoreError> {
        let n: i64 = self.tx().row_cached(
            "SELECT COUNT(*) FROM events WHERE work_item_id = ?1 AND kind = ?2",
            params![work_item_id, kind],
            |r| r.get(0),
        )?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One note as an item read it from the vault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetrievedNote {
    /// Its path in the vault.
    pub path: String,
    /// SHA-256 of the file as read: the revision the item knew.
    pub sha256: String,
    /// Its title.
    pub title: String,
    /// `procedure`, `incident`, `memory`, `world` or `note`.
    pub kind: String,
    /// Whether it is the operator's words (else it is data, fenced).
    pub trusted: bool,
    /// Why it was found.
    pub why: String,
    /// What was read: the note, or the excerpt a search gave.
    pub content: String,
}
