//! The plan model: revisions, their steps and how each was assessed, and
//! how they are kept in the store (`plans` and `plan_requests`).

use std::time::Duration;

use rusqlite::{OptionalExtension as _, params};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use nisse_bus::proto::ClassifyVerdict;
use nisse_policy::{Action, ActionClass, Check, RiskClass, Step};

use crate::log::Actor;
use crate::store::{Cached as _, StoreError, Txn, ns_to_time, time_to_ns};

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
    pub(super) fn as_str(self) -> &'static str {
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
    pub(super) fn assessed_mut(&mut self, phase: Phase) -> &mut Option<Assessed> {
        match phase {
            Phase::Pre => &mut self.pre_assessed,
            Phase::Run => &mut self.assessed,
            Phase::Post => &mut self.post_assessed,
        }
    }

    pub(super) fn check(&self, phase: Phase) -> Option<&Check> {
        match phase {
            Phase::Pre => self.step.precondition.as_ref(),
            Phase::Run => None,
            Phase::Post => self.step.expected.as_ref(),
        }
    }

    /// The action a phase runs: the step's own, or its check (a shell
    /// command on the step's target, or its MCP call). A malformed check
    /// never reaches a plan: it is refused when proposed.
    pub(super) fn action(&self, phase: Phase) -> Option<Action> {
        match phase {
            Phase::Run => Some(self.step.action.clone()),
            Phase::Pre | Phase::Post => self
                .check(phase)
                .and_then(|c| c.action(&self.step.action.target).ok()),
        }
    }

    pub(super) fn phases(&self) -> Vec<Phase> {
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
    /// Why it was last halted, if it was. While it runs, a halt asked for
    /// while a phase was in flight (a call outside the plan): the plan
    /// halts with it as soon as that phase answers, before anything else
    /// is sent.
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
    pub(super) fn awaits(&self, p: &Pending) -> bool {
        self.status == PlanStatus::Running
            && p.purpose == "execute"
            && self.runs == p.run
            && self.next_step == p.step
            && self.phase == Some(p.phase)
            && self.attempt == p.attempt
    }

    pub(super) fn policy_steps(&self) -> Vec<Step> {
        self.steps.iter().map(|s| s.step.clone()).collect()
    }

    /// The hosts its steps act on, which approving it binds to its item:
    /// every step's target but an MCP step's (its instance, mounted while
    /// the plan runs, never bound).
    pub fn hosts(&self) -> std::collections::BTreeSet<String> {
        self.steps
            .iter()
            .filter(|s| nisse_policy::mcp::split_tool_name(&s.step.action.tool).is_none())
            .map(|s| s.step.action.target.clone())
            .filter(|h| !h.is_empty())
            .collect()
    }

    /// The steps (1-based) an approval must name back: those declared
    /// destructive, or assessed destructive or of unknown risk (an
    /// unknown risk counts as destructive).
    pub fn destructive_steps(&self) -> Vec<usize> {
        self.steps
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.declared_risk == Some(RiskClass::Destructive)
                    || [&s.assessed, &s.pre_assessed, &s.post_assessed]
                        .into_iter()
                        .flatten()
                        .any(|a| a.risk.is_none_or(|r| r == RiskClass::Destructive))
            })
            .map(|(n, _)| n + 1)
            .collect()
    }

    /// What approving this revision of item `#number` must carry, typed
    /// back by the operator, when it has destructive steps: the item and
    /// those steps (`#14 step 2`, `#14 steps 2, 3`). An approval alone does
    /// not confirm them, on any channel.
    pub fn confirmation(&self, number: i64) -> Option<String> {
        let steps: Vec<String> = self
            .destructive_steps()
            .iter()
            .map(ToString::to_string)
            .collect();
        match steps.as_slice() {
            [] => None,
            [one] => Some(format!("#{number} step {one}")),
            many => Some(format!("#{number} steps {}", many.join(", "))),
        }
    }
}

/// Whether `typed` names back the confirmation `wanted`: the same words,
/// whatever their case and the space between them (`#14 Step 2`).
pub fn confirms(typed: &str, wanted: &str) -> bool {
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect()
    };
    words(typed) == words(wanted)
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
    /// Approve (the named revision, or the one up), with what the operator
    /// typed to confirm its destructive steps (`#14 step 2`), if anything.
    Approve(Option<u32>, Option<String>),
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

pub(super) const PLAN_COLUMNS: &str = "work_item_id, revision, status, proposed_by, rationale, steps, proposed_at_ns, put_up_at_ns, approved_by, approved_via, approved_at_ns, next_step, phase, attempt, confirmed, halted, runs";

pub(super) fn plan_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Plan> {
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
pub(super) struct Pending {
    pub(super) work_item_id: String,
    pub(super) revision: u32,
    pub(super) step: usize,
    pub(super) phase: Phase,
    /// `assess` (at proposal) or `execute`.
    pub(super) purpose: String,
    pub(super) run: u32,
    pub(super) attempt: u32,
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

    pub(super) fn save_plan(&mut self, plan: &Plan) -> Result<(), StoreError> {
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

    pub(super) fn pending(&self, request_id: &str) -> Result<Option<Pending>, StoreError> {
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

    pub(super) fn plan(
        &self,
        work_item_id: &str,
        revision: u32,
    ) -> Result<Option<Plan>, StoreError> {
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
