//! The trust dial's `agent-merges-after-approval` (seed Nisse L3, D5):
//! the agent merges its own pull request once an operator's approval is
//! recorded in Gitea on its head and its checks pass.
//!
//! Gitea enforces the rule, not the agent: the project is worked on only
//! while its branch protection requires an approval the agent's account
//! cannot give ([`crate::protection`]), and the merge names the head it
//! was checked at, so a push in between makes Gitea refuse it. The
//! harness still reads first, to merge only what it should and to say why
//! it does not:
//! - an operator's (allowlisted `gitea:<login>`) approval on a published
//!   milestone's pull request starts a read of the pull request, its
//!   reviews and its head's checks;
//! - an approval that is an operator's, on the head, not stale or
//!   dismissed, with every reported check `success`: the merge is asked
//!   for;
//! - checks still pending: read again at ticks, every
//!   `dev.checks-recheck`;
//! - a check failed, or no operator's current approval: no merge, said
//!   in the item's log (and the thread, for failed checks), until the
//!   next approval.
//!
//! With the default dial (`operator-merges`) none of this runs: the
//! operator merges, and a merge the model tries (a push to the default
//! branch) is class 3, which needs an approved plan.

use serde_json::json;

use nisse_bus::proto::{self, GiteaCallStatus, GiteaEvent, GiteaResult};
use nisse_core::markdown::md_escape as md;
use nisse_core::{
    Actor, ActorKind, BrainSettings, Event, Say, State, StoreError, Transition, Txn, WorkItem,
};

use crate::brain::{DevDuties, HARNESS_PREFIX};
use crate::issues::{gitea_actor, item_record, item_records};
use crate::milestones::{MilestoneState, emit_gitea, load_work, save_work};

/// What a read says of a pull request's merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Approved on its head by `by`, every check green.
    Ready { by: String },
    /// Approved by `by`, checks still running.
    Pending { by: String, state: String },
    /// A check failed: which.
    Failed(Vec<String>),
    /// No operator's approval on the head.
    Unapproved,
}

/// Whether the pull request `result` read may be merged, by the rules in
/// the module's doc. `operator` says whether a login is an allowlisted
/// operator.
pub(crate) fn readiness(result: &GiteaResult, operator: impl Fn(&str) -> bool) -> Readiness {
    let head = result
        .pull
        .as_ref()
        .map(|p| p.head_sha.as_str())
        .unwrap_or_default();
    let approval = result.reviews.iter().rev().find(|r| {
        r.state == "APPROVED"
            && !r.stale
            && !r.dismissed
            && !head.is_empty()
            && r.commit_id == head
            && operator(&r.reviewer)
    });
    let Some(approval) = approval else {
        return Readiness::Unapproved;
    };
    let by = approval.reviewer.clone();
    let checks = result.checks.clone().unwrap_or_default();
    let failed: Vec<String> = checks
        .statuses
        .iter()
        .filter(|c| matches!(c.state.as_str(), "failure" | "error"))
        .map(|c| format!("{} ({})", c.context, c.state))
        .collect();
    if !failed.is_empty() {
        return Readiness::Failed(failed);
    }
    let green = checks.statuses.iter().all(|c| c.state == "success");
    if green && (checks.statuses.is_empty() || checks.state == "success") {
        Readiness::Ready { by }
    } else {
        Readiness::Pending {
            by,
            state: checks.state,
        }
    }
}

impl DevDuties {
    /// An event on one of `item`'s pull requests that may start a merge:
    /// an operator's approval, with the dial letting the agent merge.
    pub(crate) fn approval_event(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        event: &GiteaEvent,
    ) -> Result<(), StoreError> {
        if !(event.event.starts_with("pull_request_review") && event.event.contains("approved")) {
            return Ok(());
        }
        if gitea_actor(brain, &event.sender).kind != ActorKind::Operator {
            return Ok(());
        }
        let Some(rec) = item_record(txn, &item.id)? else {
            return Ok(());
        };
        if !self
            .config
            .projects
            .get(&rec.project)
            .is_some_and(|p| p.agent_merges())
        {
            return Ok(());
        }
        let number = event.pull.as_ref().map(|p| p.number).unwrap_or_default();
        let mut work = load_work(txn, &item.id)?;
        let Some(m) = work
            .milestones
            .iter_mut()
            .find(|m| m.pull == Some(number) && m.state == MilestoneState::Published)
        else {
            return Ok(());
        };
        m.wants_merge = true;
        let k = m.k;
        self.read_for_merge(brain, txn, item, &rec.repository, &mut work, k)?;
        save_work(txn, &item.id, &work)
    }

    /// Reads milestone `k`'s pull request for its merge, unless a read or
    /// the merge is in flight.
    fn read_for_merge(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        repository: &str,
        work: &mut crate::milestones::Work,
        k: u32,
    ) -> Result<(), StoreError> {
        work.calls += 1;
        let n = work.calls;
        let now = txn.at().unix_timestamp_nanos();
        let Some(m) = work.milestones.iter_mut().find(|m| m.k == k) else {
            return Ok(());
        };
        let (Some(number), None) = (m.pull, &m.merging) else {
            return Ok(());
        };
        let request_id = format!("{HARNESS_PREFIX}{}:merge-read:{k}:{n}", item.id);
        m.merging = Some(request_id.clone());
        m.merge_read_at_ns = Some(now);
        let call = proto::gitea_request::Call::ReadPull(proto::GiteaPullRead { number });
        emit_gitea(brain, txn, item, repository, request_id, call)
    }

    /// At a tick: merges waiting for checks read them again, every
    /// `dev.checks-recheck`.
    pub(crate) fn merges_due(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
    ) -> Result<(), StoreError> {
        // Only a project whose dial lets the agent merge has merges to wait
        // for: the walk over the items is skipped otherwise.
        if !self.config.projects.values().any(|p| p.agent_merges()) {
            return Ok(());
        }
        let now = txn.at().unix_timestamp_nanos();
        let every = i128::try_from(self.config.checks_recheck.as_nanos()).unwrap_or(i128::MAX);
        for (item_id, rec) in item_records(txn)? {
            let Some(item) = txn.item(&item_id)?.filter(|i| i.state.is_open()) else {
                continue;
            };
            let mut work = load_work(txn, &item.id)?;
            let due: Vec<u32> = work
                .milestones
                .iter()
                .filter(|m| {
                    m.wants_merge
                        && m.merging.is_none()
                        && m.state == MilestoneState::Published
                        && m.merge_read_at_ns
                            .is_none_or(|at| now.saturating_sub(at) >= every)
                })
                .map(|m| m.k)
                .collect();
            if due.is_empty() {
                continue;
            }
            for k in due {
                self.read_for_merge(brain, txn, &item, &rec.repository, &mut work, k)?;
            }
            save_work(txn, &item.id, &work)?;
        }
        Ok(())
    }

    /// A Gitea answer that is a merge's (its read, or the merge): applied,
    /// and whether it was one.
    pub(crate) fn merge_result(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        result: &GiteaResult,
    ) -> Result<bool, StoreError> {
        let reading = result.request_id.contains(":merge-read:");
        if !reading && !result.request_id.contains(":merge:") {
            return Ok(false);
        }
        let Some(rec) = item_record(txn, &item.id)? else {
            return Ok(true);
        };
        let mut work = load_work(txn, &item.id)?;
        let Some(m) = work
            .milestones
            .iter_mut()
            .find(|m| m.merging.as_deref() == Some(result.request_id.as_str()))
        else {
            return Ok(true);
        };
        m.merging = None;
        let (k, number, name) = (m.k, m.pull.unwrap_or_default(), m.name.clone());
        let me = Actor::agent(&brain.agent);
        let done =
            GiteaCallStatus::try_from(result.status).unwrap_or_default() == GiteaCallStatus::Done;
        if !done {
            // A read that failed is read again at a tick; a merge Gitea
            // refused waits for the next approval.
            if !reading {
                m.wants_merge = false;
            }
            save_work(txn, &item.id, &work)?;
            let what = if reading {
                "reading it for its merge"
            } else {
                "merging it"
            };
            let event = txn.append(
                &item.id,
                &me,
                &Event::Fact {
                    text: format!(
                        "pull request #{number}: {what} failed (HTTP {}): {}",
                        result.http_status, result.reason
                    ),
                    data: json!({ "pull": number, "merge_failed": result.request_id }),
                },
            )?;
            if reading {
                return Ok(true);
            }
            txn.say(
                &brain.agent,
                item,
                event,
                Say::fact(format!(
                    "⚠️ Item **#{}**: Gitea refused to merge pull request #{number}: {}. It is yours to merge, or approve it again.",
                    item.number,
                    md(&result.reason)
                )),
            )?;
            return Ok(true);
        }
        if !reading {
            m.state = MilestoneState::Merged;
            m.wants_merge = false;
            save_work(txn, &item.id, &work)?;
            let news = format!(
                "pull request #{number} (milestone {k}) was merged by the agent, as the project's trust dial allows after an operator's approval"
            );
            txn.append(
                &item.id,
                &me,
                &Event::Fact {
                    text: news.clone(),
                    data: json!({ "pull": number, "merged": true, "by": "agent" }),
                },
            )?;
            let note = format!("Milestone {k}: pull request #{number} merged.");
            self.progress(brain, txn, item, k, "merged", note)?;
            if item.state == State::WaitingOnOperator {
                txn.transition(&item.id, Transition::OperatorAnswered, &news, &me)?;
            }
            txn.loop_wake(&item.id, &news)?;
            return Ok(true);
        }
        // Merged or closed meanwhile (by the operator): nothing to merge;
        // their webhook records it.
        if result
            .pull
            .as_ref()
            .is_some_and(|p| p.merged || p.state == "closed")
        {
            if let Some(m) = work.milestones.iter_mut().find(|m| m.k == k) {
                m.wants_merge = false;
            }
            save_work(txn, &item.id, &work)?;
            return Ok(true);
        }
        let operators = |login: &str| gitea_actor(brain, login).kind == ActorKind::Operator;
        match readiness(result, operators) {
            Readiness::Ready { by } => {
                let head = result
                    .pull
                    .as_ref()
                    .map(|p| p.head_sha.clone())
                    .unwrap_or_default();
                work.calls += 1;
                let request_id = format!("{HARNESS_PREFIX}{}:merge:{k}:{}", item.id, work.calls);
                if let Some(m) = work.milestones.iter_mut().find(|m| m.k == k) {
                    m.merging = Some(request_id.clone());
                }
                txn.append(
                    &item.id,
                    &me,
                    &Event::Fact {
                        text: format!(
                            "pull request #{number} is approved by {by} at {head} and its checks pass: the agent merges it"
                        ),
                        data: json!({ "pull": number, "approved_by": by, "head": head }),
                    },
                )?;
                let call = proto::gitea_request::Call::MergePull(proto::GiteaMergePull {
                    number,
                    head_sha: head,
                    title: format!("Merge pull request #{number}: {name}"),
                    message: format!("Part of #{}. Approved by {by}.", rec.number),
                });
                emit_gitea(brain, txn, item, &rec.repository, request_id, call)?;
            }
            Readiness::Pending { by, state } => {
                txn.append(
                    &item.id,
                    &me,
                    &Event::Fact {
                        text: format!(
                            "pull request #{number} is approved by {by}; its checks are {}: merged once they pass",
                            if state.is_empty() { "not reported yet" } else { state.as_str() }
                        ),
                        data: json!({ "pull": number, "checks": state }),
                    },
                )?;
            }
            Readiness::Failed(failed) => {
                if let Some(m) = work.milestones.iter_mut().find(|m| m.k == k) {
                    m.wants_merge = false;
                }
                let news = format!(
                    "pull request #{number}'s checks failed: {}; it is not merged",
                    failed.join(", ")
                );
                let event = txn.append(
                    &item.id,
                    &me,
                    &Event::Fact {
                        text: news.clone(),
                        data: json!({ "pull": number, "failed": failed }),
                    },
                )?;
                txn.say(
                    &brain.agent,
                    item,
                    event,
                    Say::fact(format!("❌ Item **#{}**: {}.", item.number, md(&news))),
                )?;
                txn.loop_wake(&item.id, &news)?;
            }
            Readiness::Unapproved => {
                if let Some(m) = work.milestones.iter_mut().find(|m| m.k == k) {
                    m.wants_merge = false;
                }
                txn.append(
                    &item.id,
                    &me,
                    &Event::Fact {
                        text: format!(
                            "pull request #{number} has no operator's approval on its head: it is not merged"
                        ),
                        data: json!({ "pull": number, "approved": false }),
                    },
                )?;
            }
        }
        save_work(txn, &item.id, &work)?;
        Ok(true)
    }
}
