//! The ops brain: nisse-core's brain, which handles the operator, plans
//! and the agent loop for every agent, with the ops agent's duties.

use std::collections::HashMap;
use std::sync::Arc;

use nisse_bus::AnyMessage;
use nisse_core::markdown::md_escape as md;
use nisse_core::requests::Overdue;
use nisse_core::{Actor, AgentBrain, Brain, BrainSettings, Duties, StoreError, Txn, WorkItem};
use nisse_models::ModelsConfig;

use crate::checks::Duty;
use crate::config::Config;

/// The ops agent's brain.
#[derive(Debug, Clone)]
pub struct OpsBrain(AgentBrain<OpsDuties>);

impl OpsBrain {
    /// A brain for the agent named `agent` (normally `ops`), without
    /// models: it works from the operator's plans only.
    pub fn new(agent: &str, config: Config) -> Self {
        let settings = config.brain_settings(agent);
        Self(AgentBrain::new(
            settings,
            OpsDuties {
                config,
                duties: Arc::new(Vec::new()),
            },
        ))
    }

    /// The same brain with these scheduled checks (loaded and checked by
    /// [`crate::checks::load`]).
    pub fn with_duties(self, duties: Vec<Duty>) -> Self {
        Self(self.0.map_duties(|d| OpsDuties {
            config: d.config,
            duties: Arc::new(duties),
        }))
    }

    /// The same brain with `[models]`: when roles are configured, every
    /// new item gets the model-driven loop.
    pub fn with_models(self, models: ModelsConfig) -> Self {
        Self(self.0.with_models(models))
    }

    /// The same brain with the agent's MCP server instances (`[mcp]`):
    /// its loop mounts the read-only ones and offers their tools.
    pub fn with_mcp(self, instances: Vec<nisse_core::mcp::McpInstance>) -> Self {
        Self(self.0.with_mcp(instances))
    }

    /// A finding's fingerprint for these alert labels.
    pub fn fingerprint(&self, labels: &HashMap<String, String>) -> String {
        self.0.duties().fingerprint(labels)
    }
}

impl Brain for OpsBrain {
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

/// What only the ops agent does: alert findings become work items.
#[derive(Debug, Clone)]
pub(crate) struct OpsDuties {
    pub(crate) config: Config,
    /// The scheduled checks.
    pub(crate) duties: Arc<Vec<Duty>>,
}

impl Duties for OpsDuties {
    fn apply(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        message: &AnyMessage,
    ) -> Result<(), StoreError> {
        match message {
            AnyMessage::InAlert(alert) => self.apply_alert(brain, txn, alert),
            AnyMessage::DutyDue(due) => self.duty_due(brain, txn, due),
            AnyMessage::Tick(_) => self.sweep_stale(brain, txn),
            AnyMessage::ProbeResult(_)
            | AnyMessage::ClassifyVerdict(_)
            | AnyMessage::ExecResult(_) => self.duty_answer(brain, txn, message),
            _ => Ok(()),
        }
    }

    fn run_duty(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        name: &str,
        by: &Actor,
    ) -> Result<Result<String, String>, StoreError> {
        self.run_now(brain, txn, name, by)
    }

    fn request_expired(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        overdue: &Overdue,
    ) -> Result<(), StoreError> {
        self.duty_request_expired(brain, txn, overdue)
    }

    fn operator_opened(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        hosts: &[String],
    ) -> Result<(), StoreError> {
        // As for an alert's item: the agent's tool hosts, and the hosts
        // the operator named.
        let all: Vec<String> = self
            .config
            .tool_hosts
            .iter()
            .chain(hosts)
            .cloned()
            .collect();
        txn.bind_hosts(
            item,
            &Actor::agent(&brain.agent),
            all,
            "the agent's tool hosts and the hosts the operator named",
        )?;
        txn.loop_open(brain.agent_loop(), item, "the operator opened it")
    }

    fn use_project(
        &mut self,
        _brain: &BrainSettings,
        _txn: &mut Txn<'_, '_>,
        _item: &WorkItem,
        project: &str,
    ) -> Result<String, StoreError> {
        Ok(format!(
            "The ops agent has no projects; `use {}` changes nothing.",
            md(project)
        ))
    }
}
