//! The brain every agent shares, and the one thing each agent adds.
//!
//! [`AgentBrain`] is a [`Brain`] that gives any agent what the operator
//! expects of all of them: the chat vocabulary in Matrix (seed L5:
//! `status`, `stop`, `abandon`, `approve`, `deny`, `do #N next`, `use
//! <project>`, questions answered and never acted on, reactions as
//! approvals), the CLI's operator commands, the allowlist that says whose
//! words instruct, verdicts and results routed to the agent loop or the
//! plan runner, and after every message the switch to the next item, the
//! approved plan's start, the loop's next turn and the announcement of a
//! switch. An agent implements [`Duties`]: its own intake (alerts for ops)
//! and its own words where the vocabulary is about its kind of work.

mod chat;
mod operator;
mod status;

use std::time::Duration;

use nisse_bus::AnyMessage;
use nisse_models::ModelsConfig;

use crate::agent_loop::{LoopConfig, LoopSettings};
use crate::log::Actor;
use crate::markdown::md_escape;
use crate::plans::{DEFAULT_APPROVAL_EXPIRY, PlanSettings};
use crate::reactor::Brain;
use crate::say::Say;
use crate::store::{StoreError, Txn};
use crate::work::{State, WorkItem};

/// What an agent does that no other agent does.
pub trait Duties: Send + 'static {
    /// Applies a message [`AgentBrain`] does not handle itself: the agent's
    /// own intake (`AlertReceived` for ops), turned into work items. Like
    /// [`Brain::apply`], it uses only the message and the store; messages
    /// it has nothing to do with are ignored.
    fn apply(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        message: &AnyMessage,
    ) -> Result<(), StoreError>;

    /// The operator said `use <project>` about `item`: whatever the agent
    /// makes of it, and its answer (Markdown, rendered by code).
    fn use_project(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        project: &str,
    ) -> Result<String, StoreError>;
}

/// What the shared brain needs to know about its agent.
#[derive(Debug, Clone)]
pub struct BrainSettings {
    /// The agent's name (`ops`): its actor, and the agent of every message
    /// it sends.
    pub agent: String,
    /// Who may approve, deny, stop, abandon and propose plans, as
    /// `<channel>:<identity>` (`cli:alice`, `matrix:@alice:example.org`).
    /// Everyone else's words are recorded as data and never applied.
    pub operators: Vec<String>,
    /// Names the operator may address the agent by in chat.
    pub names: Vec<String>,
    /// How long an approval request, and an approval, stays good.
    pub approval_expiry: Duration,
    /// What the agent is for, in a paragraph: the start of every model
    /// call's system prompt.
    pub brief: String,
    /// The agent loop's limits.
    pub loop_config: LoopConfig,
    /// `[models]`: with roles configured, every new item gets the loop.
    pub models: ModelsConfig,
}

impl BrainSettings {
    /// Settings for the agent named `agent`, addressed by that name, with
    /// no operators, no brief and no models, and the default approval
    /// expiry and loop limits.
    pub fn new(agent: &str) -> Self {
        Self {
            agent: agent.to_string(),
            operators: Vec::new(),
            names: vec![agent.to_string()],
            approval_expiry: DEFAULT_APPROVAL_EXPIRY,
            brief: String::new(),
            loop_config: LoopConfig::default(),
            models: ModelsConfig::default(),
        }
    }

    /// What the plan machinery needs.
    pub fn plans(&self) -> PlanSettings<'_> {
        PlanSettings {
            agent: &self.agent,
            approval_expiry: self.approval_expiry,
        }
    }

    /// What the agent loop needs.
    pub fn agent_loop(&self) -> LoopSettings<'_> {
        LoopSettings {
            plans: self.plans(),
            models: &self.models,
            config: &self.loop_config,
            brief: &self.brief,
        }
    }

    /// Whether `identity`, authenticated by `channel`, is on the operator
    /// allowlist.
    pub fn is_operator(&self, channel: &str, identity: &str) -> bool {
        self.operators.contains(&format!("{channel}:{identity}"))
    }
}

/// A brain: the shared handling of operators, plans and the loop, with
/// `D`'s duties for the agent's own intake.
#[derive(Debug, Clone)]
pub struct AgentBrain<D> {
    settings: BrainSettings,
    duties: D,
}

impl<D: Duties> AgentBrain<D> {
    /// A brain with these settings and duties.
    pub fn new(settings: BrainSettings, duties: D) -> Self {
        Self { settings, duties }
    }

    /// The same brain with `[models]`: when roles are configured, every
    /// new item gets the model-driven loop.
    pub fn with_models(mut self, models: ModelsConfig) -> Self {
        self.settings.models = models;
        self
    }

    /// Its duties.
    pub fn duties(&self) -> &D {
        &self.duties
    }
}

impl<D: Duties> Brain for AgentBrain<D> {
    fn apply(&mut self, txn: &mut Txn<'_, '_>, message: &AnyMessage) -> Result<(), StoreError> {
        let Self { settings, duties } = self;
        let mut applied = Ok(());
        match message {
            AnyMessage::InOperator(command) => applied = operator::apply(settings, txn, command)?,
            AnyMessage::InMatrix(event) => chat::apply(settings, duties, txn, event)?,
            // The loop's own requests first; the rest are the plan
            // machinery's.
            AnyMessage::ClassifyVerdict(verdict) => {
                if !txn.loop_verdict(settings.agent_loop(), verdict)? {
                    txn.plan_verdict(settings.plans(), verdict)?;
                }
            }
            AnyMessage::ExecResult(result) => {
                if !txn.loop_exec_result(settings.agent_loop(), result)? {
                    txn.plan_exec_result(settings.plans(), result)?;
                }
            }
            AnyMessage::LoopPin(pinned) => txn.loop_pinned(settings.agent_loop(), pinned)?,
            AnyMessage::ModelResp(response) => {
                txn.loop_model_response(settings.agent_loop(), response)?;
            }
            // The agent's own intake. The rest of the stream is the brain's
            // own outputs coming back (the store clears those from the
            // outbox), which the duties ignore like anything else not theirs.
            other => duties.apply(settings, txn, other)?,
        }
        // Every message is a moment at which a waiting item's grace period
        // may have run out, at which an approved plan's item may be the
        // active one, and at which the active item's loop may have a turn
        // due.
        txn.switch_if_due(&Actor::agent(&settings.agent))?;
        txn.resume_active_plan(settings.plans())?;
        txn.drive_loop(settings.agent_loop())?;
        announce_switches(settings, txn)?;
        // Last, so the answer holds everything the command caused.
        if let AnyMessage::InOperator(command) = message {
            operator::answer(
                settings,
                txn,
                command,
                applied.as_ref().map_err(String::as_str).copied(),
            )?;
        }
        Ok(())
    }

    fn refused(
        &mut self,
        txn: &mut Txn<'_, '_>,
        message: &AnyMessage,
        reason: &str,
    ) -> Result<(), StoreError> {
        match message {
            AnyMessage::InOperator(command) => {
                operator::answer(&self.settings, txn, command, Err(reason))
            }
            _ => Ok(()),
        }
    }
}

/// Tells the operator when an item became active because another one
/// stopped being active (the store switches at safe points). An item
/// activated as it opened was announced by its opening message.
fn announce_switches(settings: &BrainSettings, txn: &mut Txn<'_, '_>) -> Result<(), StoreError> {
    let switched: Vec<(String, i64)> = txn
        .state_changes()
        .iter()
        .filter(|c| c.changed.to == State::Active && c.changed.from == State::Ready)
        .map(|c| (c.work_item_id.clone(), c.event_id))
        .collect();
    for (id, event) in switched {
        let Some(item) = txn.item(&id)? else { continue };
        let opened_now = txn
            .events(&id)?
            .first()
            .is_some_and(|e| e.causation_id == txn.cause().1);
        if opened_now {
            continue;
        }
        txn.say(
            &settings.agent,
            &item,
            event,
            Say::notice(format!(
                "▶️ Now working on item **#{}**: **{}**.",
                item.number,
                md_escape(&item.title)
            )),
        )?;
    }
    Ok(())
}
