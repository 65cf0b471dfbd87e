//! The operator's word on a plan: approvals and denials bound to a
//! revision by the rules of L3, `stop` and `abandon`.

use nisse_bus::proto::TellPosted;
use nisse_policy::approval::{Binding, PlanView, Reply, RevisionState, bind};

use super::model::{Decision, Origin, Plan, PlanSettings, PlanStatus, confirms};
use crate::log::{Actor, ActorKind, Event};
use crate::markdown::{code, md_escape};
use crate::say::Say;
use crate::store::{Cached as _, StoreError, Txn, time_to_ns};
use crate::work::{State, Transition, WorkItem};

/// Why a decision the binding would apply is held back by the brain's own
/// rules: in plain words for the log, and in Markdown for the operator.
struct Held {
    reason: String,
    told: String,
}

impl Txn<'_, '_> {
    /// Applies an operator's approval or denial, bound to a revision by the
    /// rules of L3, then by the brain's own: a decision that names no
    /// revision binds only one whose latest approval request its channel
    /// delivered ([`Txn::approval_delivered`]), so it never lands on a
    /// request the operator could not have seen there; and an approval of
    /// a revision with destructive steps binds only with those steps named
    /// back ([`Plan::confirmation`]), whichever channel it came by. An
    /// approval binds the hosts the revision's steps act on to the item
    /// (seed L13: the harness binds hosts; proposing one binds nothing).
    /// Returns the revision it was applied to, if any.
    pub fn plan_decision(
        &mut self,
        settings: PlanSettings<'_>,
        item: &WorkItem,
        from: Origin<'_>,
        decision: Decision,
    ) -> Result<Option<u32>, StoreError> {
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
            Decision::Approve(n, _) | Decision::Deny(n, _) => *n,
        };
        let reply = Reply {
            names,
            allowed: from.allowed,
            at: time_to_ns(now),
        };
        let binding = bind(&view, &reply, settings.approval_expiry);
        let approving = matches!(decision, Decision::Approve(..));
        let word = if approving { "approval" } else { "denial" };
        let by = from.actor.to_string();
        let held = match (&binding, &current) {
            (Binding::Apply(_), Some(plan)) => self.held(item, &from, &decision, plan)?,
            _ => None,
        };
        match (&binding, current, held) {
            (Binding::Apply(revision), Some(mut plan), None) => {
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
                    // What the approved steps act on is bound now, and only
                    // that: the hosts of this revision, none of another.
                    // An MCP step's target is its instance, mounted while
                    // the plan runs, not bound.
                    let bound = self.bind_hosts(
                        item,
                        from.actor,
                        plan.hosts(),
                        &format!(
                            "named in {}, which {by} approved via {}",
                            plan.tag(),
                            from.via
                        ),
                    )?;
                    self.say(
                        settings.agent,
                        item,
                        event,
                        Say::fact(format!(
                            "✅ Approved {} by `{}` via `{}`.{}",
                            plan.tag(),
                            code(&by),
                            code(from.via),
                            if bound.is_empty() {
                                String::new()
                            } else {
                                format!(
                                    " Bound to item **#{}** now: {}.",
                                    item.number,
                                    bound
                                        .iter()
                                        .map(|h| format!("**{}**", md_escape(h)))
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                )
                            }
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
                        Decision::Approve(..) => String::new(),
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
                Ok(Some(*revision))
            }
            (other, current, held) => {
                let Held { reason, told } = match held {
                    Some(held) => held,
                    None => {
                        let reason = refusal(other, current.as_ref(), &by, from.via);
                        Held {
                            told: md_escape(&reason),
                            reason,
                        }
                    }
                };
                let event = self.append(
                    &item.id,
                    from.actor,
                    &Event::DecisionRefused {
                        named: names,
                        by: by.clone(),
                        via: from.via.to_string(),
                        approve: approving,
                        reason,
                    },
                )?;
                // A stranger's words are recorded as data, never answered as
                // if they had standing.
                if *other != Binding::NotAllowed {
                    self.say(
                        settings.agent,
                        item,
                        event,
                        Say::fact(format!("ℹ️ That {word} was not applied: {told}.")),
                    )?;
                }
                if let (Binding::Expired(_), Some(mut plan)) = (other, current) {
                    self.put_up(settings, item, &mut plan, None)?;
                }
                Ok(None)
            }
        }
    }

    /// What holds back a decision the binding would apply to `plan`, if
    /// anything: a bare word about a request its channel did not deliver,
    /// or an approval of destructive steps that does not name them back.
    fn held(
        &self,
        item: &WorkItem,
        from: &Origin<'_>,
        decision: &Decision,
        plan: &Plan,
    ) -> Result<Option<Held>, StoreError> {
        let (named, verb) = match decision {
            Decision::Approve(n, _) => (*n, "approve"),
            Decision::Deny(n, _) => (*n, "deny"),
        };
        let rev = plan.tag();
        if named.is_none() && !self.approval_was_delivered(&item.id, plan.revision, from.via)? {
            let show = format!("nisse plan show #{}", item.number);
            return Ok(Some(Held {
                reason: format!(
                    "name the revision: {verb} {rev} (its approval request was not shown via {}; {show} prints it)",
                    from.via
                ),
                told: format!(
                    "name the revision: `{verb} {rev}` (its approval request was not shown via `{}`; `{show}` prints it)",
                    code(from.via)
                ),
            }));
        }
        let Decision::Approve(_, typed) = decision else {
            return Ok(None);
        };
        let Some(phrase) = plan.confirmation(item.number) else {
            return Ok(None);
        };
        if typed.as_deref().is_some_and(|t| confirms(t, &phrase)) {
            return Ok(None);
        }
        // What to type, as the channel takes it.
        let what = match from.via {
            "cli" => format!("nisse approve #{} {rev} --confirm '{phrase}'", item.number),
            "control" => phrase.clone(),
            _ => format!("approve {rev} {phrase}"),
        };
        let wrong = match typed.as_deref().map(str::trim) {
            Some(t) if !t.is_empty() => format!("{t:?} does not name them; "),
            _ => String::new(),
        };
        Ok(Some(Held {
            reason: format!(
                "{rev} has destructive steps: {wrong}type {what} to confirm them (an approval alone does not)"
            ),
            told: format!(
                "{rev} has destructive steps: {}type `{}` to confirm them (an approval alone does not)",
                md_escape(&wrong),
                code(&what)
            ),
        }))
    }

    /// Whether the latest approval request of `revision` on item `item_id`
    /// was delivered on channel `via` (a channel's [`TellPosted`] for it
    /// is in the log).
    fn approval_was_delivered(
        &self,
        item_id: &str,
        revision: u32,
        via: &str,
    ) -> Result<bool, StoreError> {
        let mut requested = self.tx().prepare_cached(
            "SELECT id, payload FROM events WHERE work_item_id = ?1 AND kind = 'approval_requested' ORDER BY id DESC",
        )?;
        let mut rows = requested.query([item_id])?;
        let mut latest = None;
        while let Some(row) = rows.next()? {
            let payload: String = row.get(1)?;
            if let Ok(Event::ApprovalRequested { revision: r, .. }) = serde_json::from_str(&payload)
                && r == revision
            {
                latest = Some(row.get::<_, i64>(0)?);
                break;
            }
        }
        let Some(latest) = latest else {
            return Ok(false);
        };
        let request = format!("out:{item_id}:{latest}");
        let mut delivered = self.tx().prepare_cached(
            "SELECT payload FROM events WHERE work_item_id = ?1 AND kind = 'approval_delivered' AND id > ?2",
        )?;
        let mut rows = delivered.query(rusqlite::params![item_id, latest])?;
        while let Some(row) = rows.next()? {
            let payload: String = row.get(0)?;
            if let Ok(Event::ApprovalDelivered {
                via: v, message_id, ..
            }) = serde_json::from_str(&payload)
                && v == via
                && message_id == request
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A channel delivered an approval request (`posted`, from intake-matrix
    /// once the homeserver took the post): recorded on its item, where a
    /// bare `approve` on that channel finds it. A report about no item of
    /// this brain, or about no revision, is passed over, and so is one for
    /// another channel than Matrix: only intake-matrix may publish these
    /// (the bus's walls), and it vouches for its own room alone.
    pub fn approval_delivered(&mut self, posted: &TellPosted) -> Result<(), StoreError> {
        let env = posted.envelope.clone().unwrap_or_default();
        if posted.plan_revision == 0 || posted.channel != "matrix" {
            tracing::warn!(channel = %posted.channel, revision = posted.plan_revision, "a delivery report that vouches for nothing this brain takes; passed over");
            return Ok(());
        }
        let Some(item) = self.item(&env.work_item_id)? else {
            return Ok(());
        };
        let actor = Actor {
            kind: ActorKind::Service,
            id: env
                .actor
                .map(|a| a.id)
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| format!("intake-{}", posted.channel)),
        };
        self.append(
            &item.id,
            &actor,
            &Event::ApprovalDelivered {
                revision: posted.plan_revision,
                via: posted.channel.clone(),
                message_id: posted.tell_message_id.clone(),
                posted_id: posted.posted_id.clone(),
            },
        )?;
        Ok(())
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

/// Why the binding did not apply a decision, in plain words.
fn refusal(binding: &Binding, current: Option<&Plan>, by: &str, via: &str) -> String {
    match binding {
        Binding::NotAllowed => format!("{by} is not on the operator allowlist for {via}"),
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
            current.map_or("closed".into(), |p| p.status.to_string())
        ),
        Binding::Expired(r) => {
            format!("the approval request for rev-{r} expired; it is put up again")
        }
        Binding::Apply(_) => "the plan is gone".into(),
    }
}
