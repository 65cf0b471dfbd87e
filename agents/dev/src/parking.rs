//! Several items on one project (seed Nisse D4: "parking commits and
//! pushes the item's branch, so another work item on the same project
//! starts from a fresh checkout and the parked one resumes from its
//! branch").
//!
//! A project has one workspace, and at most one item holds it: the one
//! whose workspace was last prepared or put back (the project record's
//! `holder`). When another item's turn comes, the holder is parked first,
//! by harness operations the incoming item runs on the build host:
//! 1. the holder's loop is held ([`Txn::loop_hold`]: no turn, no queued
//!    call) and the harness waits until none of its actions is on its way
//!    (classify or execution requests, its own harness operations);
//! 2. **park** (no key): everything the holder changed is committed on
//!    the branch it is on (always an agent's `nisse/` branch; artifacts
//!    left out by the same excludes as a milestone's commit);
//! 3. **push** (the policy's own keyed line): that branch, so the work is
//!    in Gitea, the one copy that has to survive.
//!
//! The holder is then `Parked` on that branch and the incoming item is
//! prepared as usual, from a fresh checkout. A parked item whose turn
//! comes again is put back: **fetch**, then **resume** (no key: its branch
//! checked out as the repository has it, the tree cleaned), and its loop
//! is let go. Two items interleaved on one project therefore never see
//! each other's changes: each works only on its own branch, and nothing
//! uncommitted crosses from one to the other. The operations run under the
//! incoming item's request ids, so their failures wait on its operator
//! like any preparation's, and `retry` goes on.

use serde_json::json;

use nisse_core::markdown::code;
use nisse_core::{Actor, BrainSettings, Event, Say, StoreError, Txn, WorkItem};
use nisse_policy::BuildHost;
use nisse_policy::dev::{GitNetwork, shell_word};

use crate::brain::DevDuties;
use crate::config::Project;
use crate::issues::{ItemRecord, Phase, item_record, save_item};
use crate::milestones::STANDARD_EXCLUDES;
use crate::workspace::{LOCAL_TIMEOUT_MS, OpKind, PUSH_TIMEOUT_MS};

/// The line that commits everything the holder changed on the branch its
/// workspace is on, and reports the branch, the head before and after.
pub(crate) fn park_line(host: &BuildHost, author: (&str, &str), message: &str) -> String {
    let git = nisse_policy::dev::harness::LOCAL_GIT;
    let excludes = STANDARD_EXCLUDES.join("\\n");
    [
        format!("cd {}", shell_word(&host.workspace)),
        format!("export {}", nisse_policy::dev::harness::GIT_ENV),
        "mkdir -p .git/info".to_string(),
        format!("printf '{excludes}\\n' > .git/info/exclude"),
        format!("{git} add -A"),
        format!("echo \"nisse: before $({git} rev-parse HEAD)\""),
        format!(
            "if ! {git} diff --cached --quiet; then {git} -c user.name={} -c user.email={} commit -q -m {}; fi",
            shell_word(author.0),
            shell_word(author.1),
            shell_word(message)
        ),
        format!("echo \"nisse: branch $({git} rev-parse --abbrev-ref HEAD)\""),
        format!("echo \"nisse: head $({git} rev-parse HEAD)\""),
    ]
    .join(" && ")
}

/// The line that puts the workspace back on `branch` as the repository
/// has it, with a clean tree.
pub(crate) fn resume_line(host: &BuildHost, branch: &str) -> String {
    let git = nisse_policy::dev::harness::LOCAL_GIT;
    let remote = shell_word(&format!("refs/remotes/origin/{branch}"));
    [
        format!("cd {}", shell_word(&host.workspace)),
        format!("export {}", nisse_policy::dev::harness::GIT_ENV),
        format!("{git} checkout -q -f -B {} {remote}", shell_word(branch)),
        format!("{git} clean -q -ffdx"),
        format!("echo \"nisse: branch $({git} rev-parse --abbrev-ref HEAD)\""),
        format!("echo \"nisse: head $({git} rev-parse HEAD)\""),
    ]
    .join(" && ")
}

/// The `nisse: <what> <value>` line of a harness report.
fn reported<'a>(stdout: &'a str, what: &str) -> Option<&'a str> {
    stdout.lines().find_map(|l| {
        l.strip_prefix("nisse: ")
            .and_then(|r| r.strip_prefix(what))
            .and_then(|r| r.strip_prefix(' '))
            .map(str::trim)
    })
}

impl DevDuties {
    /// The item other than `item_id` that holds `project`'s workspace, if
    /// one still does (open, and on its branch there). The project record
    /// names it; an item prepared before records named holders is found
    /// by its phase.
    pub(crate) fn other_holder(
        &self,
        txn: &Txn<'_, '_>,
        project: &str,
        item_id: &str,
    ) -> Result<Option<(WorkItem, ItemRecord)>, StoreError> {
        let holding = |item: &WorkItem, rec: &ItemRecord| {
            item.id != item_id
                && item.state.is_open()
                && rec.project == project
                && rec.phase == Phase::Started
        };
        if let Some(holder) = self.project_record_of(txn, project)?.holder
            && let (Some(item), Some(rec)) = (txn.item(&holder)?, item_record(txn, &holder)?)
        {
            return Ok(holding(&item, &rec).then_some((item, rec)));
        }
        for (id, rec) in crate::issues::item_records(txn)? {
            if let Some(item) = txn.item(&id)?
                && holding(&item, &rec)
            {
                return Ok(Some((item, rec)));
            }
        }
        Ok(None)
    }

    /// Makes `holder` (or nobody) the item holding `project`'s workspace.
    pub(crate) fn set_holder(
        &self,
        txn: &mut Txn<'_, '_>,
        project: &str,
        holder: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut rec = self.project_record_of(txn, project)?;
        rec.holder = holder.map(str::to_string);
        self.save_project(txn, project, &rec)
    }

    /// Lets go of `item`'s loop, held for a parking, unless another item's
    /// operations are parking it now (then it is parked, and put back when
    /// its turn comes).
    pub(crate) fn release_unless_parking(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
    ) -> Result<(), StoreError> {
        if txn.loop_state(&item.id)?.is_none_or(|s| s.held.is_none()) {
            return Ok(());
        }
        let parking = crate::issues::item_records(txn)?
            .into_iter()
            .any(|(_, r)| r.parking.as_deref() == Some(item.id.as_str()) && r.op.is_some());
        if parking {
            return Ok(());
        }
        txn.loop_release(brain.agent_loop(), item)
    }

    /// Parks `holder` for `item`, whose turn it is: holds its loop, and
    /// once nothing of it is on its way, commits its work (the first of
    /// two operations, run as `item`'s).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn park(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        rec: &mut ItemRecord,
        project: &Project,
        holder: &WorkItem,
        holder_rec: &ItemRecord,
    ) -> Result<(), StoreError> {
        txn.loop_hold(
            &holder.id,
            &format!("its workspace is parked for item #{}", item.number),
        )?;
        if holder_rec.op.is_some() || txn.actions_in_flight(&holder.id)? {
            // What it is doing finishes first; its answer brings the next
            // look.
            return Ok(());
        }
        let line = park_line(
            &project.build_host(),
            (&self.config.account, &self.config.email()),
            &format!(
                "Work in progress on item #{}, parked by nisse-dev for item #{}",
                holder.number, item.number
            ),
        );
        rec.parking = Some(holder.id.clone());
        let run = self.new_run(item, rec, OpKind::Park, line, Vec::new(), LOCAL_TIMEOUT_MS);
        self.send_run(brain, txn, item, project, rec, run)
    }

    /// A parking or resuming operation of `item` finished with `stdout`.
    pub(crate) fn parking_step(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        rec: &mut ItemRecord,
        kind: OpKind,
        stdout: &str,
    ) -> Result<(), StoreError> {
        let Some(project) = self.config.projects.get(&rec.project).cloned() else {
            return save_item(txn, &item.id, rec);
        };
        let project = &project;
        let me = Actor::agent(&brain.agent);
        match kind {
            OpKind::Park => {
                let branch = reported(stdout, "branch").unwrap_or_default().to_string();
                let pushable = branch.starts_with(nisse_policy::dev::harness::AGENT_BRANCH_PREFIX);
                let line = project
                    .build_host()
                    .git_network_line(&GitNetwork::Push {
                        branch: branch.clone(),
                    })
                    .filter(|_| pushable);
                let Some(line) = line else {
                    return self.harness_halted(
                        brain,
                        txn,
                        item,
                        &format!(
                            "the workspace was on `{branch}`, not one of the agent's branches: it was not parked"
                        ),
                    );
                };
                let before = reported(stdout, "before").unwrap_or_default();
                let head = reported(stdout, "head").unwrap_or_default();
                if let Some(holder) = rec.parking.clone()
                    && before != head
                {
                    crate::milestones::parked_at(txn, &holder, before)?;
                }
                rec.parking_branch = Some(branch);
                let run = self.new_run(
                    item,
                    rec,
                    OpKind::ParkPush,
                    line,
                    vec![project.push_secret.clone()],
                    PUSH_TIMEOUT_MS,
                );
                self.send_run(brain, txn, item, project, rec, run)
            }
            OpKind::ParkPush => {
                let branch = rec.parking_branch.take().unwrap_or_default();
                let Some(holder_id) = rec.parking.take() else {
                    return save_item(txn, &item.id, rec);
                };
                save_item(txn, &item.id, rec)?;
                if let (Some(holder), Some(mut holder_rec)) =
                    (txn.item(&holder_id)?, item_record(txn, &holder_id)?)
                {
                    holder_rec.phase = Phase::Parked {
                        branch: branch.clone(),
                    };
                    save_item(txn, &holder.id, &holder_rec)?;
                    let event = txn.append(
                        &holder.id,
                        &me,
                        &Event::Fact {
                            text: format!(
                                "parked for item #{}: its work is committed and pushed on {branch}",
                                item.number
                            ),
                            data: json!({ "parked_on": branch, "for": item.id }),
                        },
                    )?;
                    txn.say(
                        &brain.agent,
                        &holder,
                        event,
                        Say::fact(format!(
                            "⏸️ Item **#{}** is parked while item **#{}** uses the workspace: its work is committed and pushed on {}, where it resumes.",
                            holder.number,
                            item.number,
                            code(&branch)
                        )),
                    )?;
                }
                self.set_holder(txn, &rec.project, None)
            }
            OpKind::Resume => {
                let branch = reported(stdout, "branch").unwrap_or_default().to_string();
                let head = reported(stdout, "head").unwrap_or_default().to_string();
                rec.phase = Phase::Started;
                save_item(txn, &item.id, rec)?;
                self.set_holder(txn, &rec.project, Some(&item.id))?;
                txn.append(
                    &item.id,
                    &me,
                    &Event::Fact {
                        text: format!(
                            "the workspace {} on {} is back on branch {branch} at {head}",
                            project.workspace, project.build_host
                        ),
                        data: json!({ "resumed_on": branch, "head": head }),
                    },
                )?;
                txn.loop_release(brain.agent_loop(), item)
            }
            _ => Ok(()),
        }
    }
}
