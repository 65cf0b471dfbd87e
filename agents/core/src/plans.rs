//! Approved step sequences (seed Nisse O2) and approvals bound to plan
//! revisions (L3), as the brain keeps them.
//!
//! A plan is a list of literal steps. Every revision of an item's plan gets
//! the next work-item-wide number, `rev-N`. A revision goes through:
//!
//! - `proposed`: each step's command (and its checks) is sent to the
//!   classifier; a check that is not read-only rejects the revision;
//! - `up`: every verdict is in; the approval request, rendered here by code
//!   from the steps and verdicts, has been sent;
//! - `approved` → `running`: an allowlisted operator approved exactly this
//!   revision in time; it starts when its item is active and the approval
//!   has not expired, each step as precondition → command → expected
//!   outcome, each one classified again (with the approved plan as scope
//!   and the switches as they are then) and run only through a permit;
//! - `done`, `halted` (a `never` target), `denied`, `rejected`,
//!   `superseded` (a newer revision came), `abandoned`.
//!
//! A step that cannot go on (autonomy off, the classifier asks, a check or
//! the command failed beyond its retries, an outcome that is unknown) puts
//! the same revision up again with the reason at the top: approving it
//! then is the operator naming that step, and it starts over from its
//! precondition. Nothing here reads the wall clock or the policy file:
//! time is the message's and every judgement is a verdict in the stream, so
//! a replay reaches the same state.

use std::collections::BTreeSet;
use std::time::Duration;

use rusqlite::{OptionalExtension as _, params};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use nisse_bus::proto::{
    self, AgreedScope, ClassifyRequest, ClassifyVerdict, ExecResult, ExecStatus, MatrixOutbound,
    MatrixOutboundKind, PlanStep as WireStep,
};
use nisse_policy::approval::{Binding, PlanView, Reply, RevisionState, approval_current, bind};
use nisse_policy::gate::{ApprovedPlan, Halt};
use nisse_policy::switches::Switches;
use nisse_policy::{Action, ActionClass, Check, RiskClass, Scope, Step};

use crate::gate::ExecFor;
use crate::log::{Actor, ActorKind, Event};
use crate::store::{Cached as _, StoreError, Txn, ns_to_time, time_to_ns};
use crate::work::{State, Transition, WorkItem};

/// How long an approval request, and an approval, stays good unless
/// configured: the world changes underneath a plan (O2).
pub const DEFAULT_APPROVAL_EXPIRY: Duration = Duration::from_secs(3600);

/// Where a plan revision stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanStatus {
    /// Being classified.
    Proposed,
    /// Its approval request was sent.
    Up,
    /// Approved; starts when its item is active.
    Approved,
    /// Its steps are running.
    Running,
    /// Every step ran.
    Done,
    /// Stopped for good (a `never` target, or the operator's `stop`).
    Halted,
    /// The operator denied it.
    Denied,
    /// It cannot be approved (a check that is not read-only, no steps).
    Rejected,
    /// A newer revision replaced it.
    Superseded,
    /// Its item was abandoned.
    Abandoned,
}

impl PlanStatus {
    fn as_str(self) -> &'static str {
        match self {
            Self::Proposed => "proposed",
            Self::Up => "up",
            Self::Approved => "approved",
            Self::Running => "running",
            Self::Done => "done",
            Self::Halted => "halted",
            Self::Denied => "denied",
            Self::Rejected => "rejected",
            Self::Superseded => "superseded",
            Self::Abandoned => "abandoned",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Self::Proposed,
            Self::Up,
            Self::Approved,
            Self::Running,
            Self::Done,
            Self::Halted,
            Self::Denied,
            Self::Rejected,
            Self::Superseded,
            Self::Abandoned,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }

    /// Whether the revision can still run or be decided on.
    pub fn is_open(self) -> bool {
        matches!(
            self,
            Self::Proposed | Self::Up | Self::Approved | Self::Running
        )
    }
}

impl std::fmt::Display for PlanStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which part of a step a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The precondition check.
    Pre,
    /// The step's own action.
    Run,
    /// The expected-outcome check.
    Post,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pre => "pre",
            Self::Run => "run",
            Self::Post => "post",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Self::Pre, Self::Run, Self::Post]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

/// How the classifier assessed one command of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assessed {
    /// The risk.
    pub risk: Option<RiskClass>,
    /// The action class.
    pub class: ActionClass,
    /// Why a target is protected (empty: none is).
    pub protected: Vec<String>,
    /// It runs on the agent's own host and can take it down.
    pub takes_agent_host_down: bool,
    /// It runs on the agent's own host.
    pub on_agent_host: bool,
    /// The classifier's reasons.
    pub reasons: Vec<String>,
}

/// One step as the brain keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedStep {
    /// The literal step.
    pub step: Step,
    /// The risk its proposer declared.
    pub declared_risk: Option<RiskClass>,
    /// The step's own action, as classified.
    pub assessed: Option<Assessed>,
    /// Its precondition check, as classified.
    pub pre_assessed: Option<Assessed>,
    /// Its expected-outcome check, as classified.
    pub post_assessed: Option<Assessed>,
}

impl PlannedStep {
    fn assessed_mut(&mut self, phase: Phase) -> &mut Option<Assessed> {
        match phase {
            Phase::Pre => &mut self.pre_assessed,
            Phase::Run => &mut self.assessed,
            Phase::Post => &mut self.post_assessed,
        }
    }

    fn check(&self, phase: Phase) -> Option<&Check> {
        match phase {
            Phase::Pre => self.step.precondition.as_ref(),
            Phase::Run => None,
            Phase::Post => self.step.expected.as_ref(),
        }
    }

    /// The action a phase runs: the step's own, or its check as a shell
    /// command on the step's target.
    fn action(&self, phase: Phase) -> Option<Action> {
        match phase {
            Phase::Run => Some(self.step.action.clone()),
            Phase::Pre | Phase::Post => self
                .check(phase)
                .map(|c| Action::shell(&self.step.action.target, &c.command)),
        }
    }

    fn phases(&self) -> Vec<Phase> {
        let mut out = Vec::new();
        if self.step.precondition.is_some() {
            out.push(Phase::Pre);
        }
        out.push(Phase::Run);
        if self.step.expected.is_some() {
            out.push(Phase::Post);
        }
        out
    }
}

/// One plan revision as the brain keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Its work item.
    pub work_item_id: String,
    /// `rev-N`.
    pub revision: u32,
    /// Where it stands.
    pub status: PlanStatus,
    /// Who proposed it.
    pub proposed_by: String,
    /// The proposer's prose; shown, never scope.
    pub rationale: String,
    /// The steps.
    pub steps: Vec<PlannedStep>,
    /// When it was proposed.
    #[serde(with = "time::serde::rfc3339")]
    pub proposed_at: OffsetDateTime,
    /// When its approval request was last sent.
    #[serde(with = "time::serde::rfc3339::option")]
    pub put_up_at: Option<OffsetDateTime>,
    /// Who approved it, through which channel, when.
    pub approved_by: Option<String>,
    /// See `approved_by`.
    pub approved_via: Option<String>,
    /// See `approved_by`.
    #[serde(with = "time::serde::rfc3339::option")]
    pub approved_at: Option<OffsetDateTime>,
    /// How many steps have finished.
    pub next_step: usize,
    /// The phase of the current step in flight, if any.
    pub phase: Option<Phase>,
    /// The attempt of the current phase (0 first).
    pub attempt: u32,
    /// The operator named the current step after it was halted.
    pub confirmed: bool,
    /// Why it was last halted, if it was.
    pub halted: Option<String>,
    /// How many times it has started (after each approval); part of every
    /// request id, so running a step again after a halt is a new request
    /// and never the executor's stored answer to the old one.
    pub runs: u32,
}

impl Plan {
    /// The revision tag.
    pub fn tag(&self) -> String {
        format!("rev-{}", self.revision)
    }

    /// Whether this is the answer the running plan waits for (a late
    /// answer for an earlier attempt, phase or run changes nothing).
    fn awaits(&self, p: &Pending) -> bool {
        self.status == PlanStatus::Running
            && p.purpose == "execute"
            && self.runs == p.run
            && self.next_step == p.step
            && self.phase == Some(p.phase)
            && self.attempt == p.attempt
    }

    fn policy_steps(&self) -> Vec<Step> {
        self.steps.iter().map(|s| s.step.clone()).collect()
    }
}

/// How a proposal went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proposal {
    /// Recorded as this revision; its steps are being classified.
    Proposed(u32),
    /// Not recorded, for this reason (told to the operator).
    Refused(String),
}

/// An operator's decision on a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Approve (the named revision, or the one up).
    Approve(Option<u32>),
    /// Deny (the named revision, or the one up), with the reason.
    Deny(Option<u32>, String),
}

/// Who sent an operator command and through what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin<'a> {
    /// The actor.
    pub actor: &'a Actor,
    /// The channel (`cli`, `matrix`).
    pub via: &'a str,
    /// Whether the channel's allowlist holds them.
    pub allowed: bool,
}

/// Settings the plan machinery needs from the agent's configuration.
#[derive(Debug, Clone, Copy)]
pub struct PlanSettings<'a> {
    /// The agent's name.
    pub agent: &'a str,
    /// How long an approval request and an approval stay good.
    pub approval_expiry: Duration,
}

const PLAN_COLUMNS: &str = "work_item_id, revision, status, proposed_by, rationale, steps, proposed_at_ns, put_up_at_ns, approved_by, approved_via, approved_at_ns, next_step, phase, attempt, confirmed, halted, runs";

fn plan_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Plan> {
    let bad = |col: usize, e: String| {
        rusqlite::Error::FromSqlConversionFailure(
            col,
            rusqlite::types::Type::Text,
            Box::<dyn std::error::Error + Send + Sync>::from(e),
        )
    };
    let status: String = row.get(2)?;
    let steps: String = row.get(5)?;
    let phase: Option<String> = row.get(12)?;
    Ok(Plan {
        work_item_id: row.get(0)?,
        revision: row.get(1)?,
        status: PlanStatus::parse(&status).ok_or_else(|| bad(2, format!("status `{status}`")))?,
        proposed_by: row.get(3)?,
        rationale: row.get(4)?,
        steps: serde_json::from_str(&steps).map_err(|e| bad(5, e.to_string()))?,
        proposed_at: ns_to_time(row.get(6)?),
        put_up_at: row.get::<_, Option<i64>>(7)?.map(ns_to_time),
        approved_by: row.get(8)?,
        approved_via: row.get(9)?,
        approved_at: row.get::<_, Option<i64>>(10)?.map(ns_to_time),
        next_step: usize::try_from(row.get::<_, i64>(11)?).unwrap_or(0),
        phase: phase.as_deref().and_then(Phase::parse),
        attempt: row.get(13)?,
        confirmed: row.get(14)?,
        halted: row.get(15)?,
        runs: row.get(16)?,
    })
}

/// Every revision of an item's plan, oldest first, on any connection.
pub(crate) fn item_plans(
    conn: &rusqlite::Connection,
    work_item_id: &str,
) -> Result<Vec<Plan>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {PLAN_COLUMNS} FROM plans WHERE work_item_id = ?1 ORDER BY revision"
    ))?;
    let rows = stmt.query_map([work_item_id], plan_from_row)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// An outstanding request of the plan machinery.
#[derive(Debug, Clone)]
struct Pending {
    work_item_id: String,
    revision: u32,
    step: usize,
    phase: Phase,
    /// `assess` (at proposal) or `execute`.
    purpose: String,
    run: u32,
    attempt: u32,
}

impl Txn<'_, '_> {
    /// Every revision of an item's plan, oldest first.
    pub fn plans(&self, work_item_id: &str) -> Result<Vec<Plan>, StoreError> {
        item_plans(self.tx(), work_item_id)
    }

    /// The item's latest revision.
    pub fn current_plan(&self, work_item_id: &str) -> Result<Option<Plan>, StoreError> {
        Ok(self
            .tx()
            .row_cached(
                &format!(
                    "SELECT {PLAN_COLUMNS} FROM plans WHERE work_item_id = ?1 ORDER BY revision DESC LIMIT 1"
                ),
                [work_item_id],
                plan_from_row,
            )
            .optional()?)
    }

    fn save_plan(&mut self, plan: &Plan) -> Result<(), StoreError> {
        let steps = serde_json::to_string(&plan.steps)
            .map_err(|e| StoreError::Corrupt(format!("cannot encode plan steps: {e}")))?;
        self.tx().exec_cached(
            &format!(
                "INSERT INTO plans ({PLAN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)
                 ON CONFLICT (work_item_id, revision) DO UPDATE SET status = excluded.status, steps = excluded.steps,
                   put_up_at_ns = excluded.put_up_at_ns, approved_by = excluded.approved_by, approved_via = excluded.approved_via,
                   approved_at_ns = excluded.approved_at_ns, next_step = excluded.next_step, phase = excluded.phase,
                   attempt = excluded.attempt, confirmed = excluded.confirmed, halted = excluded.halted,
                   runs = excluded.runs"
            ),
            params![
                plan.work_item_id,
                plan.revision,
                plan.status.as_str(),
                plan.proposed_by,
                plan.rationale,
                steps,
                time_to_ns(plan.proposed_at),
                plan.put_up_at.map(time_to_ns),
                plan.approved_by,
                plan.approved_via,
                plan.approved_at.map(time_to_ns),
                i64::try_from(plan.next_step).unwrap_or(i64::MAX),
                plan.phase.map(Phase::as_str),
                plan.attempt,
                plan.confirmed,
                plan.halted,
                plan.runs,
            ],
        )?;
        Ok(())
    }

    /// Records a new plan revision for `item` and sends every command in it
    /// to the classifier. An older open revision is superseded; a running
    /// one must be stopped first.
    pub fn propose_plan(
        &mut self,
        settings: PlanSettings<'_>,
        item: &WorkItem,
        by: &Actor,
        rationale: &str,
        steps: Vec<(Step, Option<RiskClass>)>,
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
                Say::notice(format!("⛔ Plan not recorded: {}", md_escape(&reason))),
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
        for (i, (step, _)) in steps.iter().enumerate() {
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
        // The harness binds hosts, never the model (L13): an operator's plan
        // binds the hosts it names; anyone else's may only use bound ones.
        let targets: BTreeSet<String> =
            steps.iter().map(|(s, _)| s.action.target.clone()).collect();
        if by.kind == ActorKind::Operator {
            self.bind_hosts(
                settings.agent,
                item,
                by,
                targets,
                "named in a plan the operator proposed",
            )?;
        } else {
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
        });
        let declared = if phase == Phase::Run {
            step.declared_risk
        } else {
            None
        };
        let request = ClassifyRequest {
            envelope: Some(self.agent_envelope(
                settings.agent,
                &plan.work_item_id,
                format!("classify:{request_id}"),
            )),
            request_id,
            action: Some(action.to_wire(declared)),
            scope,
            model: self.pinned_model(&plan.work_item_id, nisse_models::Role::Classifier)?,
        };
        self.emit(&request)
    }

    fn pending(&self, request_id: &str) -> Result<Option<Pending>, StoreError> {
        Ok(self
            .tx()
            .row_cached(
                "SELECT work_item_id, revision, step, phase, purpose, attempt, run FROM plan_requests WHERE request_id = ?1",
                [request_id],
                |r| {
                    let phase: String = r.get(3)?;
                    Ok(Pending {
                        work_item_id: r.get(0)?,
                        revision: r.get(1)?,
                        step: usize::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
                        phase: Phase::parse(&phase).unwrap_or(Phase::Run),
                        purpose: r.get(4)?,
                        attempt: r.get(5)?,
                        run: r.get(6)?,
                    })
                },
            )
            .optional()?)
    }

    fn plan(&self, work_item_id: &str, revision: u32) -> Result<Option<Plan>, StoreError> {
        Ok(self
            .tx()
            .row_cached(
                &format!(
                    "SELECT {PLAN_COLUMNS} FROM plans WHERE work_item_id = ?1 AND revision = ?2"
                ),
                params![work_item_id, revision],
                plan_from_row,
            )
            .optional()?)
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
                    Say::notice(format!(
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
        };
        match crate::gate::permit_for(verdict, &action, scope) {
            Ok(permit) => {
                let basis = format!("{:?}", permit.basis());
                self.emit_exec(
                    permit,
                    ExecFor {
                        agent: settings.agent,
                        work_item_id: &plan.work_item_id,
                        request_id: &verdict.request_id,
                        verdict_request_id: &verdict.request_id,
                    },
                )?;
                if pending.phase == Phase::Run {
                    plan.confirmed = false;
                }
                self.save_plan(&plan)?;
                self.append(
                    &plan.work_item_id,
                    &Actor::agent(settings.agent),
                    &Event::ExecRequested {
                        request_id: verdict.request_id.clone(),
                        revision: plan.revision,
                        step: pending.step + 1,
                        phase: pending.phase.as_str().into(),
                        attempt: pending.attempt,
                        host: action.target.clone(),
                        command: crate::gate::action_line(&action),
                        basis,
                    },
                )?;
                Ok(())
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
        self.append(
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
        let failure = proto::ExecFailure::try_from(result.failure).unwrap_or_default();
        if matches!(
            failure,
            proto::ExecFailure::HostKeyChanged | proto::ExecFailure::HostKeyUnknown
        ) {
            // Not a failure to retry: the operator must look at the host.
            let reason = format!(
                "step {n}: {} Nothing ran.",
                if result.reason.is_empty() {
                    "the host key could not be verified."
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
            (_, Phase::Run) if plan.attempt < step.step.retries => {
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
                Say::notice(format!(
                    "✅ Item **#{}**: every step of {} ran.",
                    item.number,
                    plan.tag()
                )),
            );
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
                Say::notice(format!(
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
    fn put_up(
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
        let text = render_approval(item, plan, expires, halted);
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
                        Say::notice(format!(
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
                        Say::notice(format!(
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
                        Say::notice(format!(
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
            Say::notice(format!(
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
            Say::notice(format!(
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

    /// Queues an operator message about `item` for its Matrix thread,
    /// announcing its log event `event` (whose id makes the message's id,
    /// so applying the same message again emits the same one).
    pub fn say(
        &mut self,
        agent: &str,
        item: &WorkItem,
        event: i64,
        say: Say,
    ) -> Result<(), StoreError> {
        let message = MatrixOutbound {
            envelope: Some(self.agent_envelope(
                agent,
                &item.id,
                format!("out:{}:{event}", item.id),
            )),
            room_id: String::new(),
            markdown: say.markdown,
            thread_root_event_id: String::new(),
            opens_thread: say.opens_thread,
            kind: say.kind as i32,
            plan_revision: say.plan_revision,
        };
        self.emit(&message)
    }
}

/// An operator message, rendered by code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Say {
    /// Markdown.
    pub markdown: String,
    /// Its kind.
    pub kind: MatrixOutboundKind,
    /// For approval requests, the revision shown.
    pub plan_revision: u32,
    /// It opens the item's thread.
    pub opens_thread: bool,
}

impl Say {
    /// A notice in the item's thread.
    pub fn notice(markdown: String) -> Self {
        Self {
            markdown,
            kind: MatrixOutboundKind::Notice,
            plan_revision: 0,
            opens_thread: false,
        }
    }

    /// The message that opens the item's thread.
    pub fn thread_root(markdown: String) -> Self {
        Self {
            opens_thread: true,
            ..Self::notice(markdown)
        }
    }

    /// An approval request showing `revision`.
    pub fn approval(markdown: String, revision: u32) -> Self {
        Self {
            markdown,
            kind: MatrixOutboundKind::ApprovalRequest,
            plan_revision: revision,
            opens_thread: false,
        }
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

/// The log's record of a verdict (L4: every verdict is logged).
pub(crate) fn verdict_event(
    verdict: &ClassifyVerdict,
    revision: u32,
    step: usize,
    phase: &str,
) -> Event {
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

pub(crate) fn assessed_from(verdict: &ClassifyVerdict) -> Assessed {
    Assessed {
        risk: nisse_policy::wire::risk_from_wire(verdict.risk_class),
        class: nisse_policy::wire::class_from_wire(verdict.action_class),
        protected: verdict.protected.clone(),
        takes_agent_host_down: verdict.takes_agent_host_down,
        on_agent_host: verdict.on_agent_host,
        reasons: verdict.reasons.clone(),
    }
}

/// The approval request, rendered by code from the steps and their
/// verdicts (L3: never from anyone's description of them). Anything
/// irreversible, touching a protected target or taking down the agent's
/// own host is flagged at the top.
pub fn render_approval(
    item: &WorkItem,
    plan: &Plan,
    expires: OffsetDateTime,
    halted: Option<&str>,
) -> String {
    let mut out = format!(
        "📝 **Approval needed: item #{} {}** — {}\n",
        item.number,
        plan.tag(),
        md_escape(&item.title)
    );
    if let Some(reason) = halted {
        out.push_str(&format!(
            "\n⏸️ **Halted:** {}. Approving {} continues from step {}.\n",
            md_escape(reason),
            plan.tag(),
            plan.next_step + 1
        ));
    }
    let mut flags = Vec::new();
    for (i, s) in plan.steps.iter().enumerate() {
        let n = i + 1;
        let Some(a) = &s.assessed else { continue };
        if a.risk.is_none_or(RiskClass::is_irreversible) {
            flags.push(format!("❗ **Irreversible:** step {n}"));
        }
        for p in &a.protected {
            flags.push(format!(
                "🛡️ **Protected target:** step {n} — {}",
                md_escape(p)
            ));
        }
        if a.takes_agent_host_down {
            flags.push(format!(
                "💥 **Takes down the agent's own host:** step {n} ({})",
                code(&s.step.action.target)
            ));
        }
    }
    if !flags.is_empty() {
        out.push('\n');
        for f in flags {
            out.push_str(&format!("- {f}\n"));
        }
    }
    out.push_str("\n**Steps:**\n");
    for (i, s) in plan.steps.iter().enumerate() {
        let a = &s.step.action;
        let what = match a.argument_str("command") {
            Some(c) if a.tool == "shell" => format!("`{}`", code(&c)),
            _ => format!(
                "{} {}",
                code(&a.tool),
                format_args!("`{}`", code(&a.arguments))
            ),
        };
        let class = s.assessed.as_ref().map_or("unclassified".to_string(), |x| {
            format!(
                "{}, class {}",
                x.risk.map_or("unknown".into(), |r| r.to_string()),
                x.class.number()
            )
        });
        out.push_str(&format!(
            "{}. on **{}**: {what} — {class}\n",
            i + 1,
            md_escape(&a.target)
        ));
        if let Some(c) = &s.step.precondition {
            out.push_str(&format!("   - before: {}\n", render_check(c)));
        }
        if let Some(c) = &s.step.expected {
            out.push_str(&format!("   - after: {}\n", render_check(c)));
        }
        out.push_str(&format!("   - retries: {}\n", s.step.retries));
    }
    if !plan.rationale.trim().is_empty() {
        out.push_str(&format!(
            "\n_Rationale from {} (not part of what is approved):_ {}\n",
            md_escape(&plan.proposed_by),
            md_escape(plan.rationale.trim())
        ));
    }
    let when = expires
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    out.push_str(&format!(
        "\nReply `approve {tag}` or `deny {tag}`. This request expires {when}.",
        tag = plan.tag()
    ));
    out
}

fn render_check(c: &Check) -> String {
    let mut s = format!("`{}` exits {}", code(&c.command), c.exit_code);
    if let Some(want) = &c.output_contains {
        s.push_str(&format!(" and prints `{}`", code(want)));
    }
    s
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

/// The last `max` bytes of `s`, cut at a character boundary.
pub(crate) fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &s[start..])
}

/// Text for Markdown: markup characters escaped so that no value can
/// restyle or link a message.
pub fn md_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\`*_[]<>|~".contains(c) {
            out.push('\\');
        }
        if c != '\n' && c != '\r' {
            out.push(c);
        }
    }
    out
}

/// Text for an inline code span (backticks and newlines removed).
pub fn code(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, '`' | '\n' | '\r'))
        .collect()
}
