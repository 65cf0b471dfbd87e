//! Each project's default branch is protected, verified rather than
//! assumed (seed Nisse D4; L3 and D5 for the trust dial). The project's
//! record (`dev.project.<name>`) also says which item holds its
//! workspace ([`crate::parking`]).
//!
//! intake-gitea asks Gitea with the agent's own token whether that token
//! may push to the default branch and whether a merge into it needs an
//! approval the agent cannot give (`check_protection`, see
//! `nisse_intake_gitea`'s `protection`). The harness asks:
//!
//! - when a project's first item comes up (or at the first tick), and
//!   again every `dev.protection-recheck`;
//! - before every publish: the publish call makes the same check of its
//!   base first, and is refused when it fails;
//! - when the operator says `retry` on an item the protection stopped, or
//!   runs `nisse dev check <project>` (which asks Gitea directly and
//!   prints what it found).
//!
//! A project whose protection does not hold is not worked on: an item
//! whose turn comes is blocked (phase `Unprotected`) and a pull request
//! waiting to be published is held, each told in its thread with what
//! failed; the room is told when the project's protection stops holding
//! and when it holds again. The first check that finds it restored
//! queues the blocked items again and publishes the held pull requests.
//! A check Gitea could not answer changes nothing it knew: an unverified
//! project stays unverified, a verified one stays verified until a check
//! (or a publish) finds otherwise.

use serde::{Deserialize, Serialize};

use nisse_bus::proto::{self, GiteaCallStatus, GiteaRequest, GiteaResult};
use nisse_core::markdown::md_escape as md;
use nisse_core::{Actor, BrainSettings, Event, Say, State, StoreError, Transition, Txn, WorkItem};

use crate::brain::{DevDuties, HARNESS_PREFIX};
use crate::issues::{ItemRecord, Phase, item_records, read, save_item, write};

/// The prefix of a project's record in the store's duty table.
const PROJECT_RECORD: &str = "dev.project.";

/// What the harness knows of one project's protection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ProjectRecord {
    /// Whether it held at the last answer; `None` until one came.
    pub holds: Option<bool>,
    /// What did not hold, each naming the check.
    pub problems: Vec<String>,
    /// When the last answer came (ns since the epoch).
    pub checked_at_ns: Option<i128>,
    /// The check in flight and when it was sent.
    pub checking: Option<(String, i128)>,
    /// Checks sent so far (each its own request id).
    pub checks: u32,
    /// The item whose work is in the project's workspace
    /// ([`crate::parking`]).
    #[serde(default)]
    pub holder: Option<String>,
}

/// Whether an item of a project may go on.
pub(crate) enum Gate {
    /// The protection holds.
    Go,
    /// Not known yet: a check is out.
    Wait,
    /// It does not hold: what failed.
    Stop(Vec<String>),
}

fn record_key(project: &str) -> String {
    format!("{PROJECT_RECORD}{project}")
}

/// The work item id a project's own requests carry: no item's, so an
/// unanswered check is no item's to wait on (the next tick sends another).
fn scope(project: &str) -> String {
    format!("dev-project-{project}")
}

/// The request id prefix of `project`'s checks.
fn check_prefix(project: &str) -> String {
    format!("{HARNESS_PREFIX}project:{project}:protection:")
}

/// `problems` as a Markdown list.
fn listed(problems: &[String]) -> String {
    problems.iter().map(|p| format!("\n- {}", md(p))).collect()
}

impl DevDuties {
    pub(crate) fn save_project(
        &self,
        txn: &mut Txn<'_, '_>,
        project: &str,
        rec: &ProjectRecord,
    ) -> Result<(), StoreError> {
        write(txn, &record_key(project), rec)
    }

    pub(crate) fn project_record_of(
        &self,
        txn: &Txn<'_, '_>,
        project: &str,
    ) -> Result<ProjectRecord, StoreError> {
        Ok(read(txn, &record_key(project))?.unwrap_or_default())
    }

    /// Whether `project`'s items may go on; an unverified project gets a
    /// check sent if none is out.
    pub(crate) fn protection_gate(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        project: &str,
    ) -> Result<Gate, StoreError> {
        let mut rec = self.project_record_of(txn, project)?;
        Ok(match rec.holds {
            Some(true) => Gate::Go,
            Some(false) => Gate::Stop(rec.problems.clone()),
            None => {
                if rec.checking.is_none() {
                    self.send_check(brain, txn, project, &mut rec)?;
                }
                Gate::Wait
            }
        })
    }

    /// At a tick: every project unchecked, or checked `protection-recheck`
    /// ago, is checked; a check unanswered past the Gitea deadline is
    /// given up and sent again.
    pub(crate) fn check_projects(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
    ) -> Result<(), StoreError> {
        let now = txn.at().unix_timestamp_nanos();
        let every = i128::try_from(self.config.protection_recheck.as_nanos()).unwrap_or(i128::MAX);
        let lost = i128::try_from(self.config.deadlines.gitea.as_nanos()).unwrap_or(i128::MAX);
        let names: Vec<String> = self.config.projects.keys().cloned().collect();
        for name in names {
            let mut rec = self.project_record_of(txn, &name)?;
            let due = match &rec.checking {
                Some((_, sent)) => now.saturating_sub(*sent) >= lost,
                None => rec
                    .checked_at_ns
                    .is_none_or(|at| now.saturating_sub(at) >= every),
            };
            if due {
                self.send_check(brain, txn, &name, &mut rec)?;
            }
        }
        Ok(())
    }

    /// Sends a check of `project`'s protection (replacing one in flight).
    pub(crate) fn send_check(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        project: &str,
        rec: &mut ProjectRecord,
    ) -> Result<(), StoreError> {
        let Some(p) = self.config.projects.get(project) else {
            return Ok(());
        };
        rec.checks += 1;
        let request_id = format!("{}{}", check_prefix(project), rec.checks);
        let request = GiteaRequest {
            envelope: Some(txn.agent_envelope(
                &brain.agent,
                &scope(project),
                format!("gitea:{request_id}"),
            )),
            request_id: request_id.clone(),
            repository: p.repository.clone(),
            call: Some(proto::gitea_request::Call::CheckProtection(
                proto::GiteaProtectionCheck {
                    branch: p.base_branch.clone(),
                    agent_merges: p.agent_merges(),
                },
            )),
        };
        txn.emit(&request)?;
        rec.checking = Some((request_id, txn.at().unix_timestamp_nanos()));
        write(txn, &record_key(project), rec)
    }

    /// A Gitea answer that is a project's check: applied, and whether it
    /// was one.
    pub(crate) fn protection_result(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        result: &GiteaResult,
    ) -> Result<bool, StoreError> {
        let Some(project) = self
            .config
            .projects
            .keys()
            .find(|p| result.request_id.starts_with(&check_prefix(p)))
            .cloned()
        else {
            return Ok(false);
        };
        let mut rec = self.project_record_of(txn, &project)?;
        if rec.checking.as_ref().map(|(id, _)| id.as_str()) != Some(result.request_id.as_str()) {
            // An answer to a check given up on: a later one is out.
            return Ok(true);
        }
        rec.checking = None;
        let status = GiteaCallStatus::try_from(result.status).unwrap_or_default();
        match (&result.protection, status) {
            (_, GiteaCallStatus::Done) => self.verdict(brain, txn, &project, rec, Vec::new())?,
            (Some(p), _) if !p.problems.is_empty() => {
                self.verdict(brain, txn, &project, rec, p.problems.clone())?
            }
            _ => {
                // Gitea could not tell: what was known stays known, and
                // the next check is at the usual interval.
                rec.checked_at_ns = Some(txn.at().unix_timestamp_nanos());
                tracing::warn!(project, reason = %result.reason, "the branch protection could not be checked");
                write(txn, &record_key(&project), &rec)?;
            }
        }
        Ok(true)
    }

    /// What a check (or a publish's check) found for `project`: recorded;
    /// a change is told in the room; restored, the items it stopped go on.
    pub(crate) fn verdict(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        project: &str,
        mut rec: ProjectRecord,
        problems: Vec<String>,
    ) -> Result<(), StoreError> {
        let holds = problems.is_empty();
        let was = rec.holds;
        let changed = problems != rec.problems || was != Some(holds);
        rec.holds = Some(holds);
        rec.problems = problems;
        rec.checked_at_ns = Some(txn.at().unix_timestamp_nanos());
        write(txn, &record_key(project), &rec)?;
        let Some(p) = self.config.projects.get(project) else {
            return Ok(());
        };
        if changed && (!holds || was == Some(false)) {
            let text = if holds {
                format!(
                    "✅ The branch protection of `{}` in {} holds again: work on project `{}` goes on.",
                    md(&p.base_branch),
                    md(&p.repository),
                    md(project)
                )
            } else {
                format!(
                    "⛔ Project `{}` is not worked on: the branch protection of `{}` in {} does not hold for the agent's own account:{}\n\nFix it in Gitea's repository settings; I check again every {} (or run `nisse dev check {}`).",
                    md(project),
                    md(&p.base_branch),
                    md(&p.repository),
                    listed(&rec.problems),
                    humantime::format_duration(self.config.protection_recheck),
                    md(project)
                )
            };
            txn.tell_room(
                &brain.agent,
                format!("out:{}:{}", scope(project), rec.checks),
                text,
            )?;
        }
        if holds {
            self.protection_restored(brain, txn, project)?;
        }
        Ok(())
    }

    /// The project's protection holds: its blocked items are queued again
    /// and its held pull requests published.
    fn protection_restored(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        project: &str,
    ) -> Result<(), StoreError> {
        let me = Actor::agent(&brain.agent);
        for (item_id, mut rec) in item_records(txn)? {
            if rec.project != project {
                continue;
            }
            let Some(item) = txn.item(&item_id)?.filter(|i| i.state.is_open()) else {
                continue;
            };
            // Blocked before its start, or before its return from parking
            // (after its start, nothing else blocks an item).
            let parked = matches!(rec.phase, Phase::Parked { .. }) && item.state == State::Blocked;
            let queued = rec.phase == Phase::Unprotected || parked;
            if rec.phase == Phase::Unprotected {
                rec.phase = Phase::Queued;
                save_item(txn, &item.id, &rec)?;
            }
            let published = self.publish_held(brain, txn, &item)?;
            if (queued || published) && item.state == State::Blocked {
                let why = "its project's branch protection holds again";
                txn.transition(&item.id, Transition::Unblock, why, &me)?;
                let event = txn.append(
                    &item.id,
                    &me,
                    &Event::Fact {
                        text: why.into(),
                        data: serde_json::json!({ "protection": "holds" }),
                    },
                )?;
                txn.say(
                    &brain.agent,
                    &item,
                    event,
                    Say::fact(format!(
                        "✅ Item **#{}**: the branch protection holds again; {}.",
                        item.number,
                        if published {
                            "its pull request is published"
                        } else {
                            "it is queued again"
                        }
                    )),
                )?;
            }
        }
        Ok(())
    }

    /// Blocks `item`, whose project's protection does not hold: `what`
    /// says what waits (its start, its pull request), `problems` why.
    pub(crate) fn block_unprotected(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        rec: &ItemRecord,
        what: &str,
        problems: &[String],
    ) -> Result<(), StoreError> {
        let me = Actor::agent(&brain.agent);
        let event = txn.append(
            &item.id,
            &me,
            &Event::Fact {
                text: format!(
                    "{what} waits: the branch protection of project {} does not hold: {}",
                    rec.project,
                    problems.join("; ")
                ),
                data: serde_json::json!({ "protection": "fails", "problems": problems }),
            },
        )?;
        if matches!(
            item.state,
            State::Active | State::Ready | State::WaitingOnOperator
        ) {
            txn.transition(
                &item.id,
                Transition::Block,
                "its project's branch protection does not hold",
                &me,
            )?;
        }
        txn.say(
            &brain.agent,
            item,
            event,
            Say::fact(format!(
                "⛔ Item **#{}**: {what} waits, because the branch protection of **{}** does not hold for the agent's own account:{}\n\nIt goes on once a check finds it restored (say `retry` to check now).",
                item.number,
                md(&rec.repository),
                listed(problems)
            )),
        )
    }

    /// The operator's `retry` on an item its project's protection stopped
    /// (blocked before its start, or `held` otherwise): a check is sent
    /// now. Whether it was such an item.
    pub(crate) fn retry_protection(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        rec: &ItemRecord,
        held: bool,
    ) -> Result<bool, StoreError> {
        if rec.phase != Phase::Unprotected && !held {
            return Ok(false);
        }
        let mut project = self.project_record_of(txn, &rec.project)?;
        self.send_check(brain, txn, &rec.project, &mut project)?;
        Ok(true)
    }
}
