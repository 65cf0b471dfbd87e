//! The operator's word on a plan: approvals and denials bound to a
//! revision by the rules of L3, `stop` and `abandon`.

use nisse_policy::approval::{Binding, PlanView, Reply, RevisionState, bind};

use super::model::{Decision, Origin, PlanSettings, PlanStatus};
use crate::log::{Actor, Event};
use crate::markdown::{code, md_escape};
use crate::say::Say;
use crate::store::{Cached as _, StoreError, Txn, time_to_ns};
use crate::work::{State, Transition, WorkItem};

impl Txn<'_, '_> {
    /// Applies an operator's approval or denial, bound to a revision by the
    /// rules of L3. Returns what it landed on.
    pub fn plan_decision(
        &mut self,
        settings: PlanSettings<'_>,
        item: &WorkItem,
        from: Origin<'_>,
        decision: Decision,
    ) -> Result<Binding, StoreError> {
        let now = self.at();
        let current = self.current_plan(&item.id)?;
        let last_put_up: Option<u32> = self.tx().row_cached(
            "SELECT MAX(revision) FROM plans WHERE work_item_id = ?1 AND put_up_at_ns IS NOT NULL",
            [&item.id],
            |r| r.get(0),
        )?;
        let view = PlanView {
            current: current.as_ref().map(|p| {
                let state = match p.status {
                    PlanStatus::Proposed => RevisionState::Proposed,
                    PlanStatus::Up => RevisionState::Up {
                        since: p.put_up_at.map_or(0, time_to_ns),
                    },
                    PlanStatus::Approved | PlanStatus::Running => RevisionState::Approved {
                        by: p.approved_by.clone().unwrap_or_default(),
                    },
                    _ => RevisionState::Decided,
                };
                (p.revision, state)
            }),
            last_put_up,
        };
        let names = match &decision {
            Decision::Approve(n) | Decision::Deny(n, _) => *n,
        };
        let reply = Reply {
            names,
            allowed: from.allowed,
            at: time_to_ns(now),
        };
        let binding = bind(&view, &reply, settings.approval_expiry);
        let approving = matches!(decision, Decision::Approve(_));
        let word = if approving { "approval" } else { "denial" };
        let by = from.actor.to_string();
        match (&binding, current) {
            (Binding::Apply(revision), Some(mut plan)) => {
                if approving {
                    plan.status = PlanStatus::Approved;
                    plan.approved_by = Some(by.clone());
                    plan.approved_via = Some(from.via.to_string());
                    plan.approved_at = Some(now);
                    // Approving a halted revision names the halted step.
                    plan.confirmed = plan.halted.is_some();
                    self.save_plan(&plan)?;
                    let event = self.append(
                        &item.id,
                        from.actor,
                        &Event::Approved {
                            revision: *revision,
                            by: by.clone(),
                            via: from.via.to_string(),
                            stamped: names.is_none(),
                        },
                    )?;
                    self.say(
                        settings.agent,
                        item,
                        event,
                        Say::fact(format!(
                            "✅ Approved {} by `{}` via `{}`.",
                            plan.tag(),
                            code(&by),
                            code(from.via)
                        )),
                    )?;
                    if self
                        .item(&item.id)?
                        .is_some_and(|i| i.state == State::WaitingOnOperator)
                    {
                        self.transition(
                            &item.id,
                            Transition::OperatorAnswered,
                            &format!("{} approved", plan.tag()),
                            from.actor,
                        )?;
                    }
                } else {
                    let reason = match &decision {
                        Decision::Deny(_, r) => r.clone(),
                        Decision::Approve(_) => String::new(),
                    };
                    plan.status = PlanStatus::Denied;
                    self.save_plan(&plan)?;
                    let event = self.append(
                        &item.id,
                        from.actor,
                        &Event::Denied {
                            revision: *revision,
                            by: by.clone(),
                            via: from.via.to_string(),
                            reason: reason.clone(),
                        },
                    )?;
                    self.say(
                        settings.agent,
                        item,
                        event,
                        Say::fact(format!(
                            "❌ Denied {} by `{}` via `{}`{}. A new plan is needed, or `abandon`.",
                            plan.tag(),
                            code(&by),
                            code(from.via),
                            if reason.is_empty() {
                                String::new()
                            } else {
                                format!(": {}", md_escape(&reason))
                            }
                        )),
                    )?;
                }
            }
            (other, current) => {
                let reason = match other {
                    Binding::NotAllowed => {
                        format!("{by} is not on the operator allowlist for {}", from.via)
                    }
                    Binding::NothingUp => "no plan is waiting for a decision".into(),
                    Binding::NotCurrent { named, current } => {
                        format!("rev-{named} is not the current plan; rev-{current} is")
                    }
                    Binding::NotYetUp(r) => format!("rev-{r} has not been put up for approval yet"),
                    Binding::AlreadyApproved { revision, by } => {
                        format!("rev-{revision} was already approved by {by}")
                    }
                    Binding::AlreadyDecided(r) => format!(
                        "rev-{r} is {}",
                        current
                            .as_ref()
                            .map_or("closed".into(), |p| p.status.to_string())
                    ),
                    Binding::Expired(r) => {
                        format!("the approval request for rev-{r} expired; it is put up again")
                    }
                    Binding::Apply(_) => "the plan is gone".into(),
                };
                let event = self.append(
                    &item.id,
                    from.actor,
                    &Event::DecisionRefused {
                        named: names,
                        by: by.clone(),
                        via: from.via.to_string(),
                        approve: approving,
                        reason: reason.clone(),
                    },
                )?;
                // A stranger's words are recorded as data, never answered as
                // if they had standing.
                if *other != Binding::NotAllowed {
                    self.say(
                        settings.agent,
                        item,
                        event,
                        Say::fact(format!(
                            "ℹ️ That {word} was not applied: {}.",
                            md_escape(&reason)
                        )),
                    )?;
                }
                if let (Binding::Expired(_), Some(mut plan)) = (other, current) {
                    self.put_up(settings, item, &mut plan, None)?;
                }
            }
        }
        Ok(binding)
    }

    /// `stop` (P5): the item's open plan ends at this step boundary (a
    /// result still in flight is recorded, nothing further runs) and the
    /// operator is asked what next.
    pub fn plan_stop(
        &mut self,
        settings: PlanSettings<'_>,
        item: &WorkItem,
        by: &Actor,
        via: &str,
    ) -> Result<(), StoreError> {
        let mut stopped = None;
        if let Some(mut plan) = self.current_plan(&item.id)?.filter(|p| p.status.is_open()) {
            plan.status = PlanStatus::Halted;
            plan.phase = None;
            plan.halted = Some(format!("stopped by {by}"));
            self.save_plan(&plan)?;
            stopped = Some(plan.revision);
        }
        let event = self.append(
            &item.id,
            by,
            &Event::Stopped {
                by: by.to_string(),
                via: via.to_string(),
                revision: stopped,
            },
        )?;
        self.await_operator(item, "stopped by the operator", settings.agent)?;
        self.say(
            settings.agent,
            item,
            event,
            Say::fact(format!(
                "⏹️ Stopped item **#{}**{}. What next?",
                item.number,
                stopped.map_or(String::new(), |r| format!(" (rev-{r} will not go on)"))
            )),
        )
    }

    /// `abandon` (P5): ends the item from any waiting point, closing it with
    /// the note, and ends its open plan.
    pub fn plan_abandon(
        &mut self,
        settings: PlanSettings<'_>,
        item: &WorkItem,
        by: &Actor,
        via: &str,
        note: &str,
    ) -> Result<(), StoreError> {
        if let Some(mut plan) = self.current_plan(&item.id)?.filter(|p| p.status.is_open()) {
            plan.status = PlanStatus::Abandoned;
            plan.phase = None;
            self.save_plan(&plan)?;
        }
        let event = self.append(
            &item.id,
            by,
            &Event::Abandoned {
                by: by.to_string(),
                via: via.to_string(),
                note: note.to_string(),
            },
        )?;
        if self.item(&item.id)?.is_some_and(|i| i.state.is_open()) {
            self.transition(
                &item.id,
                Transition::Close,
                &format!("abandoned by {by}"),
                by,
            )?;
        }
        self.say(
            settings.agent,
            item,
            event,
            Say::result(format!(
                "🗑️ Abandoned item **#{}**{}.",
                item.number,
                if note.is_empty() {
                    String::new()
                } else {
                    format!(": {}", md_escape(note))
                }
            )),
        )
    }
}
