//! Escalation and delegation (L9), on observable triggers only: the
//! helper takes over under hard caps and hands back a note; with no helper
//! left, the item waits on the operator with the reason.

use serde_json::json;

use nisse_models::Role;

use super::state::{Delegation, LoopSettings, LoopState, Status};
use crate::log::{Actor, Event};
use crate::markdown::md_escape;
use crate::say::Say;
use crate::store::{StoreError, Txn, ns_to_time, time_to_ns};
use crate::work::WorkItem;

impl Txn<'_, '_> {
    /// Hands the item to the helper, when there is one and it has not been
    /// called too often; otherwise the item waits on the operator.
    pub(super) fn escalate(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        trigger: String,
    ) -> Result<(), StoreError> {
        let helper = state.pins.get(&Role::Helper).cloned();
        let Some(helper) = helper.filter(|_| state.role == Role::Driver) else {
            return self.stuck(
                settings,
                item,
                state,
                format!("{trigger}, and there is no helper to hand over to"),
            );
        };
        if state.delegations >= settings.config.max_delegations {
            return self.stuck(
                settings,
                item,
                state,
                format!(
                    "{trigger}, and the helper has already been called {} times on this item",
                    state.delegations
                ),
            );
        }
        let cfg = settings.config;
        state.delegations += 1;
        state.role = Role::Helper;
        state.failures = 0;
        state.violations = 0;
        state.delegation = Some(Delegation {
            since_ns: time_to_ns(self.at()),
            turns: 0,
            tokens: 0,
            trigger: trigger.clone(),
        });
        let brief = format!(
            "The driver escalated because {trigger}. Work item #{}: {}. Find out what is wrong and what to do, act through the same tools and gates, and hand back with hand_back: what changed, what is now true, what to do next. Caps: {} model calls, {} tokens, {}.",
            item.number,
            crate::render::quoted(&item.title),
            cfg.delegation_turns,
            cfg.delegation_tokens,
            humantime::format_duration(cfg.delegation_time)
        );
        let event = self.append(
            &item.id,
            &Actor::agent(settings.plans.agent),
            &Event::DelegationStarted {
                brief,
                trigger: trigger.clone(),
                model: helper.model,
                max_turns: cfg.delegation_turns,
                max_tokens: cfg.delegation_tokens,
                max_seconds: cfg.delegation_time.as_secs(),
            },
        )?;
        self.say(
            settings.plans.agent,
            item,
            event,
            Say::fact(format!(
                "🆘 Item **#{}**: handing over to the helper ({}).",
                item.number,
                md_escape(&trigger)
            )),
        )?;
        state.status = Status::Idle;
        state.wake = Some("delegation started".into());
        Ok(())
    }

    pub(super) fn end_delegation(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        status: &str,
        note: String,
    ) -> Result<(), StoreError> {
        let Some(d) = state.delegation.take() else {
            return Ok(());
        };
        let seconds =
            u64::try_from((self.at() - ns_to_time(d.since_ns)).whole_seconds()).unwrap_or(0);
        let event = self.append(
            &item.id,
            &Actor::agent(&format!("{}:helper", settings.plans.agent)),
            &Event::DelegationCompleted {
                note,
                status: status.into(),
                turns: d.turns,
                tokens: d.tokens,
                seconds,
            },
        )?;
        self.say(
            settings.plans.agent,
            item,
            event,
            Say::fact(format!(
                "↩️ Item **#{}**: the helper handed back ({}).",
                item.number,
                status.replace('_', " ")
            )),
        )?;
        state.role = Role::Driver;
        state.failures = 0;
        state.violations = 0;
        state.driver_turns = 0;
        state.driver_since_ns = time_to_ns(self.at());
        Ok(())
    }

    /// A context that does not fit: the driver escalates (the helper's
    /// window is its profile's); a helper that cannot fit either hands back
    /// and the item waits on the operator.
    pub(super) fn context_too_big(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        why: String,
    ) -> Result<(), StoreError> {
        if state.role == Role::Driver {
            self.escalate(
                settings,
                item,
                state,
                format!("the context does not fit the driver's window: {why}"),
            )
        } else {
            self.end_delegation(
                settings,
                item,
                state,
                "failed",
                format!("The context does not fit the helper's window either: {why}"),
            )?;
            self.stuck(
                settings,
                item,
                state,
                format!("the context does not fit any model's window ({why})"),
            )
        }
    }

    /// The loop cannot go on by itself: the operator is told why and the
    /// item waits on them. Anything they say goes on from here.
    pub(super) fn stuck(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        reason: String,
    ) -> Result<(), StoreError> {
        let event = self.append(
            &item.id,
            &Actor::agent(settings.plans.agent),
            &Event::Fact {
                text: format!("The agent loop stopped: {reason}."),
                data: json!({ "loop": "stuck" }),
            },
        )?;
        self.say(
            settings.plans.agent,
            item,
            event,
            Say::question(format!(
                "⚠️ Item **#{}** needs you: {}. Tell me how to go on, or `abandon` it.",
                item.number,
                md_escape(&reason)
            )),
        )?;
        self.await_operator(item, "the agent loop is stuck", settings.plans.agent)?;
        state.status = Status::Stuck { reason };
        state.wake = None;
        Ok(())
    }
}
