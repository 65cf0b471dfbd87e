//! A second brain, [`Desk`], on the shared test rig (`tests/support/rig.rs`,
//! which nisse-ops' tests share): a real state store and the services
//! around it, the real classifier's verdicts included.

use nisse_bus::AnyMessage;
use nisse_core::markdown::code;
use nisse_core::{Actor, AgentBrain, BrainSettings, Duties, NewItem, StoreError, Txn, WorkItem};

pub(crate) use crate::rig::{OP, OP2, OP3, at, check, step};

/// The second brain's agent.
pub(crate) const AGENT: &str = "desk";

pub(crate) const CPU: &[(&str, &str)] = &[
    ("alertname", "HighCPU"),
    ("instance", "host1"),
    ("severity", "warning"),
];

/// A second brain's duties: a firing alert opens a work item, and `use
/// <project>` is only noted. That is all it implements; the operator's
/// commands and chat, plans, approvals, the gates and the loop are
/// nisse-core's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Desk;

impl Duties for Desk {
    fn apply(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        message: &AnyMessage,
    ) -> Result<(), StoreError> {
        let AnyMessage::InAlert(msg) = message else {
            return Ok(());
        };
        let alert = msg.alert.clone().unwrap_or_default();
        if alert.status != "firing" {
            return Ok(());
        }
        let env = msg.envelope.clone().unwrap_or_default();
        txn.open_item(
            NewItem {
                title: alert.labels.get("alertname").cloned().unwrap_or_default(),
                scope: "desk".into(),
                source: "alertmanager".into(),
                fingerprint: None,
                external_link: None,
                severity: None,
                priority: 0,
                id_seed: env.message_id,
            },
            &Actor::agent(&brain.agent),
        )?;
        Ok(())
    }

    fn use_project(
        &mut self,
        _brain: &BrainSettings,
        _txn: &mut Txn<'_, '_>,
        _item: &WorkItem,
        project: &str,
    ) -> Result<String, StoreError> {
        Ok(format!("Noted: `{}`.", code(project)))
    }
}

/// The second brain's settings, with `OP` and `OP2` as its operators.
pub(crate) fn settings() -> BrainSettings {
    BrainSettings {
        operators: vec![OP.into(), OP2.into(), OP3.into()],
        ..BrainSettings::new(AGENT)
    }
}

/// The second brain on a real state store.
pub(crate) type Harness = crate::rig::Harness<AgentBrain<Desk>>;
/// The second brain with the services around it.
pub(crate) type Gates = crate::rig::Gates<AgentBrain<Desk>>;

impl Harness {
    /// The second brain with `settings`, on a new store.
    pub(crate) fn desk(settings: BrainSettings) -> Self {
        Self::new(AGENT, AgentBrain::new(settings, Desk))
    }

    /// Applies an alert `minutes` after T0: its status, labels and start.
    pub(crate) fn alert(&mut self, minutes: i64, status: &str, labels: &[(&str, &str)]) {
        self.alert_with(minutes, status, labels, |_| ());
    }
}

impl Gates {
    /// A brain with one active item (#1, from an alert at minute 0).
    pub(crate) fn new() -> Self {
        let mut h = Harness::desk(settings());
        h.alert(0, "firing", CPU);
        Self::around(h)
    }
}
