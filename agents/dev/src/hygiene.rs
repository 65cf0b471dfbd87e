//! What the agent installs on a project's build host is recorded, and
//! what it repairs there is reported (seed Nisse D3: "every install is
//! recorded as a fact and in the project's scope memory, so the VM can be
//! rebuilt"; the agent "may clean caches and build artifacts or reinstall
//! project dependencies to fix a broken build, and reports what it did").
//!
//! After each of the loop's (or a plan's) commands on a build host that
//! ran and succeeded, the package and toolchain installs it made (as
//! `nisse_policy::Policy::installs` reads the line) become a fact in the
//! item's log and, with memory on, a note in the agent's memory naming
//! the project, its build host and the command; the repairs it made
//! (`Policy::repairs`: caches and artifacts cleaned, dependencies
//! reinstalled) become a fact and a notice in the item's thread.
//! Installing there and repairing the environment are class 2 in scope
//! (D6): they run without a plan, and the facts say what was done.

use nisse_bus::proto::{ExecResult, ExecStatus};
use nisse_core::markdown::md_escape as md;
use nisse_core::memory::{Fact, MemoryKind};
use nisse_core::{Actor, BrainSettings, Event, Say, StoreError, Txn};

use crate::brain::DevDuties;
use crate::issues::item_record;

impl DevDuties {
    /// `result` came back for one of the loop's or a plan's commands:
    /// what it installed on the item's build host, recorded, and what it
    /// repaired there, reported.
    pub(crate) fn record_upkeep(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        result: &ExecResult,
    ) -> Result<(), StoreError> {
        let done = ExecStatus::try_from(result.status).unwrap_or_default() == ExecStatus::Completed
            && result.exit_code == 0;
        let item_id =
            nisse_bus::Decode::envelope(&nisse_bus::AnyMessage::ExecResult(result.clone()))
                .work_item_id
                .clone();
        if !done || item_id.is_empty() {
            return Ok(());
        }
        let Some(rec) = item_record(txn, &item_id)? else {
            return Ok(());
        };
        let Some(project) = self.config.projects.get(&rec.project) else {
            return Ok(());
        };
        let ran = txn
            .events(&item_id)?
            .into_iter()
            .rev()
            .find_map(|e| match e.event {
                Event::ExecRequested {
                    request_id,
                    host,
                    command,
                    ..
                } if request_id == result.request_id => Some((host, command)),
                _ => None,
            });
        let Some((host, command)) = ran.filter(|(h, _)| *h == project.build_host) else {
            return Ok(());
        };
        // The built-in rules read the line's words; the gates judged it.
        let Some(policy) = nisse_policy::Policy::builtin_shared() else {
            return Ok(());
        };
        let installs = policy.installs(&command);
        let repairs = policy.repairs(&command);
        let me = Actor::agent(&brain.agent);
        if let (false, Some(item)) = (repairs.is_empty(), txn.item(&item_id)?) {
            let event = txn.append(
                &item_id,
                &me,
                &Event::Fact {
                    text: format!(
                        "repaired the environment on {host} (project {}): {}",
                        rec.project,
                        repairs.join("; ")
                    ),
                    data: serde_json::json!({ "repaired": repairs, "host": host, "project": rec.project }),
                },
            )?;
            let shown: Vec<String> = repairs
                .iter()
                .map(|r| nisse_core::markdown::code_span(r).unwrap_or_else(|| md(r)))
                .collect();
            txn.say(
                &brain.agent,
                &item,
                event,
                Say::fact(format!(
                    "🧹 Repaired the environment on `{}`: {}.",
                    md(&host),
                    shown.join(", ")
                )),
            )?;
        }
        for (i, install) in installs.iter().enumerate() {
            let text = format!("installed on {host} (project {}): {install}", rec.project);
            txn.append(
                &item_id,
                &me,
                &Event::Fact {
                    text: text.clone(),
                    data: serde_json::json!({ "installed": install, "host": host, "project": rec.project }),
                },
            )?;
            if brain.memory {
                let fact = Fact {
                    kind: MemoryKind::Observation,
                    text: format!(
                        "Project {} needs this on its build host {host}, which the agent installed: `{install}`",
                        rec.project
                    ),
                    source: format!("the harness, from a command the agent ran on {host}"),
                    operator: false,
                    said_by: None,
                };
                txn.remember(
                    &brain.agent,
                    &item_id,
                    &format!("install:{}:{i}", result.request_id),
                    &fact,
                )?;
            }
        }
        Ok(())
    }
}
