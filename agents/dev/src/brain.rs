//! The dev brain: nisse-core's brain, which handles the operator, plans
//! and the agent loop for every agent, with the dev agent's duties: Gitea
//! issues as work, and the workspace its items run in.

use nisse_bus::AnyMessage;
use nisse_core::markdown::md_escape as md;
use nisse_core::{AgentBrain, Brain, BrainSettings, Duties, StoreError, Txn, WorkItem};
use nisse_models::ModelsConfig;

use crate::config::Config;

/// The prefix of every request id the dev harness sends for an item (its
/// Gitea calls, its workspace commands): their answers are the dev
/// duties', never the loop's or the plan runner's.
pub(crate) const HARNESS_PREFIX: &str = "dev:";

/// The dev agent's brain.
#[derive(Debug, Clone)]
pub struct DevBrain(AgentBrain<DevDuties>);

impl DevBrain {
    /// A brain for the agent named `agent` (normally `dev`), without
    /// models.
    pub fn new(agent: &str, config: Config) -> Self {
        let settings = config.brain_settings(agent);
        Self(AgentBrain::new(settings, DevDuties { config }))
    }

    /// The same brain with `[models]`: when roles are configured, an item
    /// gets the model-driven loop once its workspace is ready.
    pub fn with_models(self, models: ModelsConfig) -> Self {
        Self(self.0.with_models(models))
    }

    /// The same brain with the agent's MCP server instances (`[mcp]`):
    /// its loop mounts the read-only ones and offers their tools.
    pub fn with_mcp(self, instances: Vec<nisse_core::mcp::McpInstance>) -> Self {
        Self(self.0.with_mcp(instances))
    }
}

impl Brain for DevBrain {
    fn apply(&mut self, txn: &mut Txn<'_, '_>, message: &AnyMessage) -> Result<(), StoreError> {
        self.0.apply(txn, message)
    }

    fn refused(
        &mut self,
        txn: &mut Txn<'_, '_>,
        message: &AnyMessage,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.0.refused(txn, message, reason)
    }

    fn timing(&self) -> nisse_core::Timing {
        self.0.timing()
    }
}

/// What only the dev agent does.
#[derive(Debug, Clone)]
pub struct DevDuties {
    pub(crate) config: Config,
}

impl Duties for DevDuties {
    fn apply(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        message: &AnyMessage,
    ) -> Result<(), StoreError> {
        match message {
            AnyMessage::InGitea(event) => self.gitea_event(brain, txn, event),
            AnyMessage::GiteaResult(result) => {
                if self.protection_result(brain, txn, result)?
                    || self.tracking_result(brain, txn, result)?
                {
                    return Ok(());
                }
                self.gitea_result(brain, txn, result)
            }
            AnyMessage::ClassifyVerdict(verdict) => self.harness_verdict(brain, txn, verdict),
            AnyMessage::ExecResult(result) => self.harness_result(brain, txn, result),
            AnyMessage::Tick(_) => {
                self.check_projects(brain, txn)?;
                self.talks_due(brain, txn)?;
                self.merges_due(brain, txn)?;
                self.recheck_blocked(brain, txn)?;
                self.bug_graces(brain, txn)
            }
            _ => Ok(()),
        }
    }

    fn action_ran(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        result: &nisse_bus::proto::ExecResult,
    ) -> Result<(), StoreError> {
        self.record_upkeep(brain, txn, result)
    }

    fn operator_opened(
        &mut self,
        _brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        _hosts: &[String],
    ) -> Result<(), StoreError> {
        // An item with no issue is a conversation, which may lead to a
        // project; its hosts are its project's once it has one.
        DevDuties::start_conversation(txn, item, &item.source)
    }

    fn claims(&self, request_id: &str) -> bool {
        request_id.starts_with(HARNESS_PREFIX)
    }

    fn after(&mut self, brain: &BrainSettings, txn: &mut Txn<'_, '_>) -> Result<(), StoreError> {
        let closed: Vec<String> = txn
            .state_changes()
            .iter()
            .filter(|c| c.changed.to == nisse_core::State::Closed)
            .map(|c| c.work_item_id.clone())
            .collect();
        for id in closed {
            if let Some(item) = txn.item(&id)? {
                self.close_finished(brain, txn, &item)?;
            }
        }
        self.start_active(brain, txn)?;
        self.agent_tools(brain, txn)
    }

    fn retry(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
    ) -> Result<Option<String>, StoreError> {
        let Some(rec) = crate::issues::item_record(txn, &item.id)? else {
            return self.retry_tracking(brain, txn, item);
        };
        // Stopped by its project's protection (a held pull request, or a
        // parked item blocked from returning): it is checked again now.
        let held = crate::milestones::holds_publish(txn, &item.id)?
            || (matches!(rec.phase, crate::issues::Phase::Parked { .. })
                && item.state == nisse_core::State::Blocked);
        if self.retry_protection(brain, txn, &rec, held)? {
            return Ok(Some("the branch protection is checked again".to_string()));
        }
        // A preparation that halted left the item queued with no operation
        // in flight: it starts again, under new request ids, once the item
        // is active.
        let halted = rec.op.is_none()
            && match rec.phase {
                crate::issues::Phase::Queued => rec.ops > 0,
                crate::issues::Phase::Parked { .. } => true,
                _ => false,
            };
        Ok(halted.then(|| "the workspace is prepared again".to_string()))
    }

    fn use_project(
        &mut self,
        _brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        project: &str,
    ) -> Result<String, StoreError> {
        // An item is one issue on one repository (D1): its project is the
        // issue's, and `use` cannot move it.
        let current = crate::issues::item_record(txn, &item.id)?.map(|r| r.project);
        Ok(match current {
            Some(p) if p == project => format!(
                "Item **#{}** is already project `{}`'s.",
                item.number,
                md(&p)
            ),
            Some(p) => format!(
                "Item **#{}** is an issue of project `{}`; an item's project is its issue's and `use {}` cannot change it.",
                item.number,
                md(&p),
                md(project)
            ),
            None if self.config.projects.contains_key(project) => format!(
                "Item **#{}** is not a Gitea issue; project `{}` takes work as issues assigned to `{}`.",
                item.number,
                md(project),
                md(&self.config.account)
            ),
            None => format!(
                "There is no project `{}`; the projects are: {}.",
                md(project),
                if self.config.projects.is_empty() {
                    "none".to_string()
                } else {
                    self.config
                        .projects
                        .keys()
                        .map(|k| format!("`{}`", md(k)))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        })
    }
}
