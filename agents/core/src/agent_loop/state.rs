//! An item's loop state and its outstanding requests, as the store keeps
//! them (`loops`, `loop_requests`), and the loop's settings.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use rusqlite::{OptionalExtension as _, params};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use nisse_bus::proto;
use nisse_models::{ModelsConfig, Pin, Role};

use crate::log::{Actor, ActorKind};
use crate::plans::PlanSettings;
use crate::store::{Cached as _, StoreError, Txn};

/// The loop's limits (`[ops.loop]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct LoopConfig {
    /// Replies without a tool call in a row before the loop escalates.
    pub max_violations: u32,
    /// Failed actions (or model errors) in a row before the loop escalates.
    pub max_failures: u32,
    /// Driver model calls on one item before the loop escalates.
    pub driver_turns: u32,
    /// How long the driver may work on one item before the loop escalates.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub driver_time: Duration,
    /// A delegation's cap on model calls.
    pub delegation_turns: u32,
    /// A delegation's cap on tokens.
    pub delegation_tokens: u64,
    /// A delegation's cap on wall-clock time.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub delegation_time: Duration,
    /// How many times one item may be handed to the helper.
    pub max_delegations: u32,
    /// `ask_expert` questions per item.
    pub expert_calls: u32,
    /// The most recent model turns and events that fitting never shortens
    /// or drops.
    pub keep_recent: usize,
}

impl Default for LoopConfig {
    fn default() -> Self {
        Self {
            max_violations: 3,
            max_failures: 3,
            driver_turns: 40,
            driver_time: Duration::from_secs(3600),
            delegation_turns: 20,
            delegation_tokens: 400_000,
            delegation_time: Duration::from_secs(1800),
            max_delegations: 2,
            expert_calls: 3,
            keep_recent: 8,
        }
    }
}

impl LoopConfig {
    /// Problems as (key under `prefix`, what is wrong); empty when valid.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (key, v) in [
            ("max-violations", u64::from(self.max_violations)),
            ("max-failures", u64::from(self.max_failures)),
            ("driver-turns", u64::from(self.driver_turns)),
            ("delegation-turns", u64::from(self.delegation_turns)),
            ("delegation-tokens", self.delegation_tokens),
        ] {
            if v == 0 {
                out.push((format!("{prefix}.{key}"), "must be more than zero".into()));
            }
        }
        out
    }
}

/// What the loop needs from the agent.
#[derive(Debug, Clone, Copy)]
pub struct LoopSettings<'a> {
    /// The plan machinery's settings (the agent's name among them).
    pub plans: PlanSettings<'a>,
    /// `[models]`.
    pub models: &'a ModelsConfig,
    /// The loop's limits.
    pub config: &'a LoopConfig,
    /// What the agent is for, in a paragraph: the start of every system
    /// prompt.
    pub brief: &'a str,
    /// Whether the agent has a knowledge vault: an item's loop starts with
    /// what the vault recalls, and notes go to its memory.
    pub memory: bool,
    /// Secrets no model's command or plan may name
    /// ([`crate::BrainSettings::harness_secrets`]).
    pub harness_secrets: &'a [String],
    /// The tools the agent adds for its driver
    /// ([`crate::BrainSettings::agent_tools`]).
    pub agent_tools: &'a [super::AgentTool],
    /// How the agent acts, in the system prompt
    /// ([`crate::BrainSettings::how_to_act`]).
    pub how_to_act: &'a str,
    /// The agent's MCP instances ([`crate::BrainSettings::mcp`]).
    pub mcp: &'a [crate::mcp::McpInstance],
}

/// A tool call waiting to be handled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// The canonical id.
    pub id: String,
    /// The tool.
    pub tool: String,
    /// The arguments as the model wrote them.
    pub arguments: String,
}

/// What an item's loop is doing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "is", rename_all = "snake_case")]
pub enum Status {
    /// Nothing outstanding; a turn starts when woken and the item is
    /// active.
    Idle,
    /// A model call is out.
    Thinking {
        /// Its request id.
        request_id: String,
    },
    /// A tool call is with the classifier, the executor or the expert.
    Acting {
        /// The outstanding request.
        request_id: String,
    },
    /// The operator was asked a question (`ask_human`).
    Asking {
        /// The call the answer completes.
        call_id: String,
    },
    /// The operator said `stop`: nothing goes on until they speak again.
    Stopped,
    /// The loop cannot go on by itself (a budget spent, caps reached with
    /// no helper left); the operator was told why.
    Stuck {
        /// Why.
        reason: String,
    },
    /// The item closed.
    Done,
}

/// A delegation in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegation {
    /// When it started (ns since the epoch, message time).
    pub since_ns: i64,
    /// Model calls made.
    pub turns: u32,
    /// Tokens used.
    pub tokens: u64,
    /// Why it started.
    pub trigger: String,
}

/// An item's loop position, kept in the store with the item (never the
/// rendered context: that is made from the log at call time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopState {
    /// The roles pinned when the item's loop started.
    pub pins: BTreeMap<Role, Pin>,
    /// Who drives now: the driver, or the helper during a delegation.
    pub role: Role,
    /// What it is doing.
    pub status: Status,
    /// Why a turn is due, if one is.
    pub wake: Option<String>,
    /// The plan revision it proposed and waits to hear the end of.
    pub watch_plan: Option<u32>,
    /// Model turns made (the request counter).
    pub turn: u32,
    /// Calls of the last reply not handled yet, in order.
    pub queue: VecDeque<Call>,
    /// Replies without a tool call, in a row.
    pub violations: u32,
    /// Failed actions and model errors, in a row.
    pub failures: u32,
    /// Driver turns since the loop started or last escalated.
    pub driver_turns: u32,
    /// When the driver's time started counting (ns, message time).
    pub driver_since_ns: i64,
    /// The delegation in progress.
    pub delegation: Option<Delegation>,
    /// Delegations so far.
    pub delegations: u32,
    /// `ask_expert` questions so far.
    pub expert_calls: u32,
    /// The vault recall the first turn waits for, while it is out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<String>,
    /// The hosts the item's agreed scope contains: a class-2 action
    /// (contained to the host) on one of them runs without a plan, on a
    /// `ContainedInScope` permit. Set by the agent's harness
    /// ([`Txn::loop_contain`]), never by a model: the dev agent's build
    /// host (D6). Empty for the ops agent, where every change is a plan.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub contained: Vec<String>,
    /// Why the agent's harness holds the loop, while it does: no turn
    /// starts and no queued call runs until it lets go
    /// ([`Txn::loop_hold`], [`Txn::loop_release`]). The dev agent holds an
    /// item's loop while its workspace is parked or being put back, so
    /// nothing the model does lands in another item's checkout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

/// The loop state of `work_item_id`, on any connection.
pub(crate) fn item_loop(
    conn: &rusqlite::Connection,
    work_item_id: &str,
) -> Result<Option<LoopState>, StoreError> {
    let text: Option<String> = conn
        .prepare_cached("SELECT state FROM loops WHERE work_item_id = ?1")?
        .query_row([work_item_id], |r| r.get(0))
        .optional()?;
    text.map(|t| {
        serde_json::from_str(&t)
            .map_err(|e| StoreError::Corrupt(format!("the loop state of item {work_item_id}: {e}")))
    })
    .transpose()
}

impl Txn<'_, '_> {
    /// The item's loop state, if its loop started.
    pub fn loop_state(&self, work_item_id: &str) -> Result<Option<LoopState>, StoreError> {
        item_loop(self.tx(), work_item_id)
    }

    /// The question the loop asked with the `ask_human` call `call_id` on
    /// the item, if it is in the item's log.
    pub fn question_asked(
        &self,
        work_item_id: &str,
        call_id: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(self
            .events(work_item_id)?
            .into_iter()
            .rev()
            .find_map(|e| match e.event {
                crate::log::Event::QuestionAsked {
                    call_id: c,
                    question,
                } if c == call_id => Some(question),
                _ => None,
            }))
    }

    /// The loop state of every open item that has a loop, in item order.
    pub fn open_loops(&self) -> Result<Vec<(String, LoopState)>, StoreError> {
        let mut stmt = self.tx().prepare_cached(
            "SELECT l.work_item_id, l.state FROM loops l JOIN work_items w ON w.id = l.work_item_id
             WHERE w.state <> 'closed' ORDER BY w.number",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, text) = row?;
            let state = serde_json::from_str(&text)
                .map_err(|e| StoreError::Corrupt(format!("the loop state of item {id}: {e}")))?;
            out.push((id, state));
        }
        Ok(out)
    }

    /// The model pinned for `role` on the item, or empty when the item's
    /// loop has not pinned one (the role's current mapping then applies).
    pub(crate) fn pinned_model(
        &self,
        work_item_id: &str,
        role: Role,
    ) -> Result<String, StoreError> {
        Ok(self
            .loop_state(work_item_id)?
            .and_then(|s| s.pins.get(&role).map(|p| p.model.clone()))
            .unwrap_or_default())
    }

    pub(super) fn save_loop(
        &mut self,
        work_item_id: &str,
        state: &LoopState,
    ) -> Result<(), StoreError> {
        let text = serde_json::to_string(state)
            .map_err(|e| StoreError::Corrupt(format!("cannot encode a loop state: {e}")))?;
        self.tx().exec_cached(
            "INSERT INTO loops (work_item_id, state) VALUES (?1, ?2)
             ON CONFLICT (work_item_id) DO UPDATE SET state = excluded.state",
            params![work_item_id, text],
        )?;
        Ok(())
    }

    pub(super) fn track(
        &mut self,
        request_id: &str,
        work_item_id: &str,
        call_id: &str,
        kind: &str,
    ) -> Result<(), StoreError> {
        self.tx().exec_cached(
            "INSERT INTO loop_requests (request_id, work_item_id, call_id, kind) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (request_id) DO NOTHING",
            params![request_id, work_item_id, call_id, kind],
        )?;
        Ok(())
    }

    /// The item and call a loop request belongs to, and its kind.
    pub(super) fn tracked(
        &self,
        request_id: &str,
    ) -> Result<Option<(String, String, String)>, StoreError> {
        Ok(self
            .tx()
            .row_cached(
                "SELECT work_item_id, call_id, kind FROM loop_requests WHERE request_id = ?1",
                [request_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?)
    }

    pub(super) fn agent_actor(settings: LoopSettings<'_>, role: Role) -> Actor {
        Actor {
            kind: ActorKind::Agent,
            id: format!("{}:{role}", settings.plans.agent),
        }
    }
}

pub(super) fn pin_to_wire(role: Role, pin: Pin) -> proto::PinnedRole {
    proto::PinnedRole {
        role: role.as_str().into(),
        model: pin.model,
        context_window: pin.profile.context_window,
        max_output_tokens: pin.profile.max_output_tokens,
        tools: pin.profile.tools,
        tool_choice: pin.profile.tool_choice,
        notes: pin.profile.notes,
    }
}

/// A pinned role from the wire; an unknown role (a newer build's) is left
/// out.
pub(super) fn pin_from_wire(p: &proto::PinnedRole) -> Option<(Role, Pin)> {
    Some((
        Role::parse(&p.role)?,
        Pin {
            model: p.model.clone(),
            profile: nisse_models::Profile {
                context_window: p.context_window,
                max_output_tokens: p.max_output_tokens,
                tools: p.tools,
                tool_choice: p.tool_choice,
                notes: p.notes.clone(),
            },
        },
    ))
}

#[cfg(test)]
mod tests {
    use crate::store::{ns_to_time, time_to_ns};

    #[test]
    fn now_is_message_time() {
        // The loop's clocks are the stream's: ns round-trips through time.
        let t = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        assert_eq!(ns_to_time(time_to_ns(t)), t);
    }
}
