//! The ops brain: nisse-core's brain, which handles the operator, plans
//! and the agent loop for every agent, with the ops agent's duties.

use std::collections::HashMap;

use nisse_bus::AnyMessage;
use nisse_core::markdown::md_escape as md;
use nisse_core::{AgentBrain, Brain, BrainSettings, Duties, StoreError, Txn, WorkItem};
use nisse_models::ModelsConfig;

use crate::config::Config;

/// The ops agent's brain.
#[derive(Debug, Clone)]
pub struct OpsBrain(AgentBrain<OpsDuties>);

impl OpsBrain {
    /// A brain for the agent named `agent` (normally `ops`), without
    /// models: it works from the operator's plans only.
    pub fn new(agent: &str, config: Config) -> Self {
        let settings = config.brain_settings(agent);
        Self(AgentBrain::new(settings, OpsDuties { config }))
    }

    /// The same brain with `[models]`: when roles are configured, every
    /// new item gets the model-driven loop.
    pub fn with_models(self, models: ModelsConfig) -> Self {
        Self(self.0.with_models(models))
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
}

/// What only the ops agent does: alert findings become work items.
#[derive(Debug, Clone)]
pub(crate) struct OpsDuties {
    pub(crate) config: Config,
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
            _ => Ok(()),
        }
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
