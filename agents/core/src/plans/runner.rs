//! The step machine: a revision proposed and classified, put up for
//! approval, then run step by step — precondition, step, expected outcome —
//! each through a fresh verdict and a permit, halted and put up again when
//! it cannot go on.

use std::collections::BTreeSet;

use rusqlite::{OptionalExtension as _, params};

use nisse_bus::proto::{
    self, AgreedScope, ClassifyVerdict, ExecResult, ExecStatus, PlanStep as WireStep,
};
use nisse_policy::approval::approval_current;
use nisse_policy::gate::{ApprovedPlan, Halt};
use nisse_policy::switches::Switches;
use nisse_policy::{ActionClass, RiskClass, Scope, Step};

use super::approval::render_approval;
use super::model::{
    PLAN_COLUMNS, Phase, Plan, PlanSettings, PlanStatus, PlannedStep, Proposal, assessed_from,
    plan_from_row,
};
use crate::gate::ExecFor;
use crate::log::{Actor, ActorKind, Event};
use crate::markdown::{code, md_escape};
use crate::say::Say;
use crate::store::{Cached as _, StoreError, Txn, time_to_ns};
use crate::work::{State, Transition, WorkItem};

impl Txn<'_, '_> {
    /// Records a new plan revision for `item` and sends every command in it
    /// to the classifier. An older open revision is superseded; a running
    /// one must be stopped first.
    pub fn propose_plan(
        &mut self,
        settings: PlanSettings<'_>,
        item: &WorkItem,
        by: &Actor,
        rationale: &str,
        mut steps: Vec<(Step, Option<RiskClass>)>,
    ) -> Result<Proposal, StoreError> {
        let refuse = |txn: &mut Self, reason: String| -> Result<Proposal, StoreError> {
            let event = txn.append(
                &item.id,
                by,
                &Event::PlanRejected {
                    revision: None,
                    reason: reason.clone(),
                },
            )?;
            txn.say(
                settings.agent,
                item,
                event,
                Say::fact(format!("⛔ Plan not recorded: {}", md_escape(&reason))),
            )?;
            Ok(Proposal::Refused(reason))
        };
        if !item.state.is_open() {
            return refuse(self, format!("item #{} is closed", item.number));
        }
        if steps.is_empty() {
            return refuse(self, "the plan has no steps".into());
        }
        if steps.len() > nisse_policy::plan::MAX_STEPS {
            return refuse(
                self,
                format!(
                    "the plan has {} steps; at most {} are allowed",
                    steps.len(),
                    nisse_policy::plan::MAX_STEPS
                ),
            );
        }
        for (i, (step, declared)) in steps.iter_mut().enumerate() {
            // An MCP step is checked against what its instance lists, its
            // arguments (and its checks') normalised by the tool's schema,
            // and the server's hints raising its declared risk.
            match self.mcp_step(step)? {
                Ok(hinted) => *declared = (*declared).max(hinted),
                Err(problem) => return refuse(self, format!("step {}: {problem}", i + 1)),
            }
            if nisse_policy::mcp::split_tool_name(&step.action.tool).is_some() {
                continue;
            }
            let problem = match nisse_policy::FileOp::from_action(&step.action) {
                Err(e) => Some(e.0),
                Ok(None) if step.action.argument_str("command").is_none() => Some(format!(
                    "the `{}` tool is neither a command nor a file tool, and only those run over SSH",
                    step.action.tool
                )),
                Ok(_) => None,
            };
            if let Some(problem) = problem {
                return refuse(self, format!("step {}: {problem}", i + 1));
            }
        }
        let previous = self.current_plan(&item.id)?;
        if let Some(p) = &previous
            && p.status == PlanStatus::Running
        {
            return refuse(
                self,
                format!("{} is running; stop it before proposing another", p.tag()),
            );
        }
        // The harness binds hosts, never the model (L13), and a proposal
        // binds nothing: an operator's plan may name hosts not bound yet,
        // which its approval binds (`plan_decision`), so proposing one
        // (from the CLI, the control room or an MCP client) gives the
        // item's model no host; anyone else's plan may only use bound
        // ones. An MCP step's target is its instance, mounted, not bound.
        let targets: BTreeSet<String> = steps
            .iter()
            .filter(|(s, _)| nisse_policy::mcp::split_tool_name(&s.action.tool).is_none())
            .map(|(s, _)| s.action.target.clone())
            .collect();
        if by.kind != ActorKind::Operator {
            let bound = self.bound_hosts(&item.id)?;
            let unbound: Vec<&str> = targets
                .iter()
                .filter(|t| !bound.contains(*t))
                .map(String::as_str)
                .collect();
            if !unbound.is_empty() {
                return refuse(
                    self,
                    format!(
                        "not bound to item #{}: {} (bound: {})",
                        item.number,
                        unbound.join(", "),
                        if bound.is_empty() {
                            "none".to_string()
                        } else {
                            bound.into_iter().collect::<Vec<_>>().join(", ")
                        }
                    ),
                );
            }
        }
        if let Some(mut p) = previous.filter(|p| p.status.is_open()) {
            p.status = PlanStatus::Superseded;
            self.save_plan(&p)?;
        }
        let revision: u32 = self.tx().row_cached(
            "SELECT COALESCE(MAX(revision), 0) + 1 FROM plans WHERE work_item_id = ?1",
            [&item.id],
            |r| r.get(0),
        )?;
        let plan = Plan {
            work_item_id: item.id.clone(),
            revision,
            status: PlanStatus::Proposed,
            proposed_by: by.to_string(),
            rationale: rationale.to_string(),
            steps: steps
                .into_iter()
                .map(|(step, declared_risk)| PlannedStep {
                    step,
                    declared_risk,
                    assessed: None,
                    pre_assessed: None,
                    post_assessed: None,
                })
                .collect(),
            proposed_at: self.at(),
            put_up_at: None,
            approved_by: None,
            approved_via: None,
            approved_at: None,
            next_step: 0,
            phase: None,
            attempt: 0,
            confirmed: false,
            halted: None,
            runs: 0,
        };
        self.save_plan(&plan)?;
        self.append(
            &item.id,
            by,
            &Event::PlanProposed {
                revision,
                rationale: rationale.to_string(),
                steps: plan.steps.iter().map(|s| s.step.clone()).collect(),
            },
        )?;
        for (index, step) in plan.steps.iter().enumerate() {
            for phase in step.phases() {
                self.classify(settings, &plan, index, phase, "assess", 0, false)?;
            }
        }
        Ok(Proposal::Proposed(revision))
    }

    /// Sends one command of a plan to the classifier.
    #[allow(clippy::too_many_arguments)]
    fn classify(
        &mut self,
        settings: PlanSettings<'_>,
        plan: &Plan,
        index: usize,
        phase: Phase,
        purpose: &str,
        attempt: u32,
        confirmed: bool,
    ) -> Result<(), StoreError> {
        let step = &plan.steps[index];
        let Some(action) = step.action(phase) else {
            return Ok(());
        };
        let request_id = match purpose {
            "assess" => format!(
                "{}:r{}:s{}:{}:assess",
                plan.work_item_id,
                plan.revision,
                index + 1,
                phase.as_str()
            ),
            _ => format!(
                "{}:r{}:x{}:s{}:{}:a{}",
                plan.work_item_id,
                plan.revision,
                plan.runs,
                index + 1,
                phase.as_str(),
                attempt
            ),
        };
        self.tx().exec_cached(
            "INSERT INTO plan_requests (request_id, work_item_id, revision, step, phase, purpose, run, attempt)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (request_id) DO NOTHING",
            params![
                request_id,
                plan.work_item_id,
                plan.revision,
                i64::try_from(index).unwrap_or(i64::MAX),
                phase.as_str(),
                purpose,
                plan.runs,
                attempt
            ],
        )?;
        // The scope is the approved plan once it runs; checks are judged on
        // their own (they must be read-only).
        let scope = (purpose == "execute").then(|| AgreedScope {
            work_item_id: plan.work_item_id.clone(),
            task: String::new(),
            approved_plan_revision: plan.revision,
            approved_steps: plan.steps.iter().map(|s| wire_step(&s.step)).collect(),
            next_step: u32::try_from(plan.next_step).unwrap_or(u32::MAX),
            operator_confirmed: confirmed && phase == Phase::Run,
            contained_targets: Vec::new(),
        });
        // A check declares nothing, but an MCP check's server may say it
        // is not read-only.
        let declared = if phase == Phase::Run {
            step.declared_risk
        } else {
            self.mcp_hinted(&action.tool)?
        };
        self.emit_classify(
            settings.agent,
            &plan.work_item_id,
            &request_id,
            &action,
            declared,
            scope,
        )
    }

    /// Applies a classifier verdict on a plan's command. Every verdict is
    /// recorded on its item, whether or not it still matters.
    pub fn plan_verdict(
        &mut self,
        settings: PlanSettings<'_>,
        verdict: &ClassifyVerdict,
    ) -> Result<(), StoreError> {
        let Some(pending) = self.pending(&verdict.request_id)? else {
            tracing::warn!(request = %verdict.request_id, "a verdict for no request of this brain");
            return Ok(());
        };
        let service = Actor {
            kind: crate::log::ActorKind::Service,
            id: "classifier".into(),
        };
        let assessed = assessed_from(verdict);
        self.append(
            &pending.work_item_id,
            &service,
            &verdict_event(
                verdict,
                pending.revision,
                pending.step + 1,
                pending.phase.as_str(),
            ),
        )?;
        let Some(mut plan) = self.plan(&pending.work_item_id, pending.revision)? else {
            return Ok(());
        };
        let Some(item) = self.item(&plan.work_item_id)? else {
            return Ok(());
        };
        if pending.purpose == "assess" {
            if plan.status != PlanStatus::Proposed {
                return Ok(());
            }
            *plan.steps[pending.step].assessed_mut(pending.phase) = Some(assessed.clone());
            if pending.phase != Phase::Run && assessed.class != ActionClass::NoSideEffects {
                plan.status = PlanStatus::Rejected;
                self.save_plan(&plan)?;
                let reason = format!(
                    "the {} check of step {} is not read-only ({}): checks only look",
                    if pending.phase == Phase::Pre {
                        "precondition"
                    } else {
                        "expected-outcome"
                    },
                    pending.step + 1,
                    assessed.risk.map_or("unknown".into(), |r| r.to_string())
                );
                let event = self.append(
                    &item.id,
                    &Actor::agent(settings.agent),
                    &Event::PlanRejected {
                        revision: Some(plan.revision),
                        reason: reason.clone(),
                    },
                )?;
                self.say(
                    settings.agent,
                    &item,
                    event,
                    Say::fact(format!(
                        "⛔ {} rejected: {}",
                        plan.tag(),
                        md_escape(&reason)
                    )),
                )?;
                return Ok(());
            }
            self.save_plan(&plan)?;
            let complete = plan.steps.iter().all(|s| {
                s.phases().into_iter().all(|p| match p {
                    Phase::Pre => s.pre_assessed.is_some(),
                    Phase::Run => s.assessed.is_some(),
                    Phase::Post => s.post_assessed.is_some(),
                })
            });
            if complete {
                self.put_up(settings, &item, &mut plan, None)?;
            }
            return Ok(());
        }

        // An execution verdict: only the one the plan waits for counts.
        if !plan.awaits(&pending) {
            return Ok(());
        }
        // A halt asked for while this phase waited on its verdict: nothing
        // was sent, so it halts here.
        if let Some(reason) = plan.halted.clone() {
            return self.halt(settings, &item, &mut plan, reason, false);
        }
        let steps = plan.policy_steps();
        let Some(action) = plan.steps[pending.step].action(pending.phase) else {
            return Ok(());
        };
        let confirmed = plan.confirmed && pending.phase == Phase::Run;
        let scope = Scope {
            plan: (pending.phase == Phase::Run).then_some(ApprovedPlan {
                revision: plan.revision,
                steps: &steps,
                done: plan.next_step,
            }),
            operator_confirmed: confirmed,
            contained: &[],
        };
        match crate::gate::permit_for(verdict, &action, scope) {
            Ok(permit) => {
                let host = action.target.clone();
                let what = ExecFor {
                    agent: settings.agent,
                    work_item_id: &plan.work_item_id,
                    request_id: &verdict.request_id,
                    verdict_request_id: &verdict.request_id,
                    revision: plan.revision,
                    step: pending.step + 1,
                    phase: pending.phase.as_str(),
                    attempt: pending.attempt,
                };
                // An MCP step (or check) is called on its instance; the
                // rest runs over SSH.
                let sent = if nisse_policy::mcp::split_tool_name(&action.tool).is_some() {
                    self.emit_mcp(permit, what)?
                } else {
                    self.emit_exec(permit, what)?
                };
                if pending.phase == Phase::Run {
                    plan.confirmed = false;
                }
                self.save_plan(&plan)?;
                // Progress the harness knows is told as a fact (the
                // command itself was shown, byte for byte, in the
                // approval request).
                match sent {
                    Some(event) if pending.phase == Phase::Run => self.say(
                        settings.agent,
                        &item,
                        event,
                        Say::fact(format!(
                            "▶️ Item **#{}**: {} step {} of {} started on **{}**{}.",
                            item.number,
                            plan.tag(),
                            pending.step + 1,
                            plan.steps.len(),
                            md_escape(&host),
                            if pending.attempt > 0 {
                                format!(" (attempt {})", pending.attempt + 1)
                            } else {
                                String::new()
                            }
                        )),
                    ),
                    _ => Ok(()),
                }
            }
            Err(halt) => {
                let reason = format!(
                    "step {} ({}) halted: {}",
                    pending.step + 1,
                    pending.phase.as_str(),
                    halt.explain()
                );
                let final_halt = matches!(halt, Halt::Refused(_));
                self.halt(settings, &item, &mut plan, reason, final_halt)
            }
        }
    }

    /// Applies an executor result on a plan's command.
    pub fn plan_exec_result(
        &mut self,
        settings: PlanSettings<'_>,
        result: &ExecResult,
    ) -> Result<(), StoreError> {
        let Some(pending) = self.pending(&result.request_id)? else {
            return Ok(());
        };
        let status = ExecStatus::try_from(result.status).unwrap_or_default();
        let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
        let logged = self.append(
            &pending.work_item_id,
            &Actor {
                kind: crate::log::ActorKind::Service,
                id: "executor".into(),
            },
            &Event::StepResult {
                request_id: result.request_id.clone(),
                revision: pending.revision,
                step: pending.step + 1,
                phase: pending.phase.as_str().into(),
                attempt: pending.attempt,
                status: status
                    .as_str_name()
                    .trim_start_matches("EXEC_STATUS_")
                    .to_ascii_lowercase(),
                exit_code: result.exit_code,
                reason: result.reason.clone(),
                stdout_tail: tail(&stdout, 2000),
                stderr_tail: tail(&String::from_utf8_lossy(&result.stderr), 2000),
                failure: failure_name(result.failure),
                dropped_bytes: result.stdout_dropped + result.stderr_dropped,
            },
        )?;
        let Some(mut plan) = self.plan(&pending.work_item_id, pending.revision)? else {
            return Ok(());
        };
        if !plan.awaits(&pending) {
            return Ok(());
        }
        let Some(item) = self.item(&plan.work_item_id)? else {
            return Ok(());
        };
        let step = plan.steps[pending.step].clone();
        let n = pending.step + 1;
        if pending.phase == Phase::Run {
            let told = match status {
                ExecStatus::Completed => format!(
                    "☑️ Item **#{}**: {} step {n} of {} finished, exit {}.",
                    item.number,
                    plan.tag(),
                    plan.steps.len(),
                    result.exit_code
                ),
                other => format!(
                    "⚠️ Item **#{}**: {} step {n} of {} did not complete: {}.",
                    item.number,
                    plan.tag(),
                    plan.steps.len(),
                    other
                        .as_str_name()
                        .trim_start_matches("EXEC_STATUS_")
                        .to_ascii_lowercase()
                        .replace('_', " ")
                ),
            };
            self.say(settings.agent, &item, logged, Say::fact(told))?;
        }
        let failure = proto::ExecFailure::try_from(result.failure).unwrap_or_default();
        if matches!(
            failure,
            proto::ExecFailure::HostKeyChanged
                | proto::ExecFailure::HostKeyUnknown
                | proto::ExecFailure::NoBash
        ) {
            // Not a failure to retry: the operator must look at the host
            // (its key, or a bash to run commands under).
            let reason = format!(
                "step {n}: {} Nothing ran.",
                if result.reason.is_empty() {
                    "the host cannot be run on as it is."
                } else {
                    result.reason.as_str()
                }
            );
            return self.halt(settings, &item, &mut plan, reason, false);
        }
        match (status, pending.phase) {
            (ExecStatus::OutcomeUnknown, _) => {
                let mut reason = format!(
                    "the outcome of step {n} is unknown ({}); it is not run again blindly",
                    if result.reason.is_empty() {
                        "the executor stopped while it ran"
                    } else {
                        result.reason.as_str()
                    }
                );
                if let Some(check) = &step.step.expected {
                    reason.push_str(&format!(
                        "; its expected-outcome check `{}` can tell whether it took effect",
                        check.command
                    ));
                }
                self.halt(settings, &item, &mut plan, reason, false)
            }
            (ExecStatus::Completed, Phase::Pre | Phase::Post) => {
                let check = step.check(pending.phase).cloned();
                if check.is_some_and(|c| c.holds(result.exit_code, &stdout)) {
                    self.advance(settings, &item, &mut plan)
                } else {
                    let what = if pending.phase == Phase::Pre {
                        "precondition"
                    } else {
                        "expected outcome"
                    };
                    let reason = format!(
                        "the {what} of step {n} does not hold (exit {}); halted without retry",
                        result.exit_code
                    );
                    self.halt(settings, &item, &mut plan, reason, false)
                }
            }
            (ExecStatus::Completed, Phase::Run) if result.exit_code == 0 => {
                self.advance(settings, &item, &mut plan)
            }
            (_, Phase::Run) if plan.attempt < step.step.retries && plan.halted.is_none() => {
                plan.attempt += 1;
                self.save_plan(&plan)?;
                let confirmed = plan.confirmed;
                self.classify(
                    settings,
                    &plan,
                    pending.step,
                    Phase::Run,
                    "execute",
                    plan.attempt,
                    confirmed,
                )
            }
            (_, phase) => {
                let reason = format!(
                    "step {n} failed ({}{}){}",
                    status
                        .as_str_name()
                        .trim_start_matches("EXEC_STATUS_")
                        .to_ascii_lowercase(),
                    if status == ExecStatus::Completed {
                        format!(", exit {}", result.exit_code)
                    } else {
                        String::new()
                    },
                    if phase == Phase::Run {
                        format!(" after {} attempt(s)", plan.attempt + 1)
                    } else {
                        String::new()
                    }
                );
                self.halt(settings, &item, &mut plan, reason, false)
            }
        }
    }

    /// Moves a running plan past the phase that just succeeded.
    fn advance(
        &mut self,
        settings: PlanSettings<'_>,
        item: &WorkItem,
        plan: &mut Plan,
    ) -> Result<(), StoreError> {
        let phases = plan.steps[plan.next_step].phases();
        let at = phases
            .iter()
            .position(|p| Some(*p) == plan.phase)
            .unwrap_or(phases.len());
        if let Some(next) = phases.get(at + 1) {
            // A halt asked for while this phase was in flight: the step
            // starts again from its first phase once approved again.
            if let Some(reason) = plan.halted.clone() {
                return self.halt(settings, item, plan, reason, false);
            }
            plan.phase = Some(*next);
            plan.attempt = 0;
            self.save_plan(plan)?;
            let confirmed = plan.confirmed;
            let index = plan.next_step;
            return self.classify(settings, plan, index, *next, "execute", 0, confirmed);
        }
        plan.next_step += 1;
        plan.phase = None;
        plan.attempt = 0;
        plan.confirmed = false;
        if plan.next_step == plan.steps.len() {
            plan.status = PlanStatus::Done;
            self.save_plan(plan)?;
            let event = self.append(
                &item.id,
                &Actor::agent(settings.agent),
                &Event::PlanFinished {
                    revision: plan.revision,
                },
            )?;
            return self.say(
                settings.agent,
                item,
                event,
                Say::fact(format!(
                    "✅ Item **#{}**: every step of {} ran.",
                    item.number,
                    plan.tag()
                )),
            );
        }
        if let Some(reason) = plan.halted.clone() {
            return self.halt(settings, item, plan, reason, false);
        }
        self.start_step(settings, plan)
    }

    fn start_step(
        &mut self,
        settings: PlanSettings<'_>,
        plan: &mut Plan,
    ) -> Result<(), StoreError> {
        let index = plan.next_step;
        let first = plan.steps[index].phases()[0];
        plan.phase = Some(first);
        plan.attempt = 0;
        self.save_plan(plan)?;
        let confirmed = plan.confirmed;
        self.classify(settings, plan, index, first, "execute", 0, confirmed)
    }

    /// A call the agent's loop asked for while the item has an approved
    /// plan, which no permit covered (seed O2: an elevated call runs only
    /// as the next unfinished step, and anything else halts and asks: a
    /// call not in the plan, changed arguments, steps out of order, a
    /// completed step run again). The plan runs its steps itself, so
    /// nothing the loop asks for ever runs in their place: the call is
    /// refused, the operator is told what the agent asked for and how it
    /// differs from the plan, and the plan halts and is put up again
    /// with that reason. A phase in flight is never cut off (its answer
    /// must be heard): the halt is kept on the plan and taken when it
    /// answers, before anything else is sent. The agent asking for
    /// exactly the next step is only refused (the plan runs it, once).
    /// Returns what the loop is told; `None` when the item has no
    /// approved or running plan.
    pub(crate) fn plan_refuses_call(
        &mut self,
        settings: PlanSettings<'_>,
        item: &WorkItem,
        call: &nisse_policy::Action,
    ) -> Result<Option<String>, StoreError> {
        let Some(mut plan) = self
            .current_plan(&item.id)?
            .filter(|p| matches!(p.status, PlanStatus::Approved | PlanStatus::Running))
        else {
            return Ok(None);
        };
        let found = nisse_policy::match_call(&plan.policy_steps(), plan.next_step, call);
        let (reason, differs) = match found {
            nisse_policy::StepMatch::Next(_) => (
                format!(
                    "it is the next step of {}, which the plan runs itself, once",
                    plan.tag()
                ),
                None,
            ),
            other => {
                let differs = other.explain();
                (
                    format!("it is not what {} approved: {differs}", plan.tag()),
                    Some(differs),
                )
            }
        };
        let event = self.append(
            &item.id,
            &Actor::agent(settings.agent),
            &Event::Fact {
                text: format!(
                    "the agent asked for `{}` {} on {} outside the plan; not run: {reason}",
                    call.tool, call.arguments, call.target
                ),
                data: serde_json::json!({
                    "refused_call": call.tool,
                    "arguments": call.arguments,
                    "plan_revision": plan.revision,
                }),
            },
        )?;
        self.say(
            settings.agent,
            item,
            event,
            Say::fact(format!(
                "⚠️ Item **#{}**: the agent asked for `{}` on **{}** outside {}; it was not run ({}).",
                item.number,
                code(&call.tool),
                md_escape(&call.target),
                plan.tag(),
                md_escape(&reason)
            )),
        )?;
        let Some(differs) = differs else {
            return Ok(Some(reason));
        };
        let halt = format!(
            "the agent asked for `{}` on {} outside {} ({differs})",
            call.tool,
            call.target,
            plan.tag()
        );
        if plan.status == PlanStatus::Running && plan.phase.is_some() {
            // Taken when the phase in flight answers; every call asked
            // for meanwhile is said.
            plan.halted = Some(match plan.halted.take() {
                Some(before) => format!("{before}; then {halt}"),
                None => halt,
            });
            self.save_plan(&plan)?;
            return Ok(Some(format!(
                "{reason}; {} halts once its step in flight answers, and the operator is asked",
                plan.tag()
            )));
        }
        self.halt(settings, item, &mut plan, halt, false)?;
        Ok(Some(format!(
            "{reason}; {} is halted and put to the operator again",
            plan.tag()
        )))
    }

    /// Stops a plan. A `final_halt` (a `never` target) ends it; otherwise
    /// the same revision is put up again, so the operator can approve
    /// continuing from the halted step, or deny.
    fn halt(
        &mut self,
        settings: PlanSettings<'_>,
        item: &WorkItem,
        plan: &mut Plan,
        reason: String,
        final_halt: bool,
    ) -> Result<(), StoreError> {
        // A halt the plan was already asked for while a phase was in
        // flight is said too, whatever else halts it.
        let reason = match plan.halted.take() {
            Some(asked) if plan.status == PlanStatus::Running && asked != reason => {
                format!("{reason}; {asked}")
            }
            _ => reason,
        };
        plan.phase = None;
        plan.attempt = 0;
        plan.confirmed = false;
        plan.halted = Some(reason.clone());
        let event = self.append(
            &item.id,
            &Actor::agent(settings.agent),
            &Event::PlanHalted {
                revision: plan.revision,
                step: plan.next_step + 1,
                reason: reason.clone(),
                final_halt,
            },
        )?;
        if final_halt {
            plan.status = PlanStatus::Halted;
            self.save_plan(plan)?;
            self.await_operator(item, &reason, settings.agent)?;
            return self.say(
                settings.agent,
                item,
                event,
                Say::fact(format!(
                    "⛔ Item **#{}**: {} stopped for good. {}",
                    item.number,
                    plan.tag(),
                    md_escape(&reason)
                )),
            );
        }
        self.put_up(settings, item, plan, Some(&reason))
    }

    /// Sends the revision's approval request and waits on the operator.
    pub(super) fn put_up(
        &mut self,
        settings: PlanSettings<'_>,
        item: &WorkItem,
        plan: &mut Plan,
        halted: Option<&str>,
    ) -> Result<(), StoreError> {
        let now = self.at();
        plan.status = PlanStatus::Up;
        plan.put_up_at = Some(now);
        plan.approved_by = None;
        plan.approved_via = None;
        plan.approved_at = None;
        self.save_plan(plan)?;
        let expires = now + settings.approval_expiry;
        let steps: Vec<_> = plan.steps.iter().map(|s| s.step.clone()).collect();
        let impact = crate::world::plan_impact(self.world()?.as_ref(), &steps, false);
        let bound = self.bound_hosts(&item.id)?;
        let binds: Vec<String> = plan
            .hosts()
            .into_iter()
            .filter(|h| !bound.contains(h))
            .collect();
        let text = render_approval(settings.agent, item, plan, expires, halted, &impact, &binds);
        let event = self.append(
            &item.id,
            &Actor::agent(settings.agent),
            &Event::ApprovalRequested {
                revision: plan.revision,
                expires_at: expires,
                text: text.clone(),
            },
        )?;
        self.say(
            settings.agent,
            item,
            event,
            Say::approval(text, plan.revision),
        )?;
        self.await_operator(item, "waiting for approval", settings.agent)
    }

    pub(crate) fn await_operator(
        &mut self,
        item: &WorkItem,
        reason: &str,
        agent: &str,
    ) -> Result<(), StoreError> {
        let state = self.item(&item.id)?.map_or(item.state, |i| i.state);
        if matches!(state, State::Active | State::Ready | State::Blocked) {
            self.transition(
                &item.id,
                Transition::AwaitOperator,
                reason,
                &Actor::agent(agent),
            )?;
        }
        Ok(())
    }

    /// Starts the active item's approved plan, if it has one: when the
    /// approval is still good, its first unfinished step; otherwise the
    /// revision is put up again (a plan not started in time needs a new
    /// approval). Called after every message.
    pub fn resume_active_plan(&mut self, settings: PlanSettings<'_>) -> Result<(), StoreError> {
        // Runs for every message: one indexed probe in the common case.
        static ACTIVE_APPROVED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            let columns = PLAN_COLUMNS
                .split(", ")
                .map(|c| format!("p.{c}"))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "SELECT {columns} FROM plans p JOIN work_items w ON w.id = p.work_item_id
                 WHERE w.state = 'active' AND p.status = 'approved'"
            )
        });
        let Some(mut plan) = self
            .tx()
            .row_cached(&ACTIVE_APPROVED, [], plan_from_row)
            .optional()?
        else {
            return Ok(());
        };
        let Some(item) = self.item(&plan.work_item_id)? else {
            return Ok(());
        };
        let approved_at = plan.approved_at.map_or(0, time_to_ns);
        if !approval_current(approved_at, time_to_ns(self.at()), settings.approval_expiry) {
            let reason = format!(
                "the approval of {} expired before it could start; approve it again",
                plan.tag()
            );
            return self.put_up(settings, &item, &mut plan, Some(&reason));
        }
        plan.status = PlanStatus::Running;
        plan.halted = None;
        plan.runs += 1;
        self.start_step(settings, &mut plan)
    }
}

fn wire_step(step: &Step) -> WireStep {
    WireStep {
        tool: step.action.tool.clone(),
        target: step.action.target.clone(),
        command: step.action.argument_str("command").unwrap_or_default(),
        arguments_json: step.action.arguments.clone(),
        precondition: step
            .precondition
            .as_ref()
            .map_or(String::new(), |c| c.command.clone()),
        expected_outcome: step
            .expected
            .as_ref()
            .map_or(String::new(), |c| c.command.clone()),
        retries: step.retries,
    }
}

/// The log's record of a verdict (L4: every verdict is logged), for the
/// plan's step `step` of `revision` (0 and 0 outside a plan) in `phase`.
pub fn verdict_event(verdict: &ClassifyVerdict, revision: u32, step: usize, phase: &str) -> Event {
    let assessed = assessed_from(verdict);
    Event::ClassifierVerdict {
        request_id: verdict.request_id.clone(),
        revision,
        step,
        phase: phase.into(),
        verdict: nisse_policy::wire::verdict_from_wire(verdict.verdict)
            .as_str()
            .into(),
        action_class: assessed.class.number(),
        risk: assessed.risk,
        decided_by: proto::DecidedBy::try_from(verdict.decided_by)
            .unwrap_or_default()
            .as_str_name()
            .trim_start_matches("DECIDED_BY_")
            .to_ascii_lowercase(),
        reasons: verdict.reasons.clone(),
        rules: verdict.matched_rules.clone(),
        switches: Switches::from_wire(verdict.switches.as_ref()),
    }
}

/// An `ExecFailure` as the log names it (`host_key_changed`); empty for
/// none.
pub(crate) fn failure_name(failure: i32) -> String {
    match proto::ExecFailure::try_from(failure) {
        Ok(proto::ExecFailure::Unspecified) | Err(_) => String::new(),
        Ok(f) => f
            .as_str_name()
            .trim_start_matches("EXEC_FAILURE_")
            .to_ascii_lowercase(),
    }
}

pub(crate) use crate::text::tail;
