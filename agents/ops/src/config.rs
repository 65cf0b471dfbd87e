//! The ops agent's settings (`[ops]` in `nisse.toml`).

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use nisse_core::BrainSettings;
use nisse_models::ModelsConfig;

/// The ops brain's settings (`[ops]` in `nisse.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// The alert labels whose values make a finding's fingerprint. Empty:
    /// all of them (the same identity Alertmanager gives an alert).
    pub fingerprint_labels: Vec<String>,
    /// The labels naming a work item's scope, joined with `/` in this
    /// order; the first present of them are used.
    pub scope_labels: Vec<String>,
    /// The label holding an alert's severity.
    pub severity_label: String,
    /// Severities from most to least urgent. Among ready items without an
    /// operator's order, more urgent goes first.
    pub severities: Vec<String>,
    /// Close an item when its alert resolves and nothing on it waits on the
    /// operator.
    pub close_on_resolve: bool,
    /// An alert that fires again within this time after its item closed
    /// reopens that item rather than opening a new one.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub flap_window: Duration,
    /// After this many reopenings an item is flapping: further flaps are
    /// recorded in its log without a message to the operator each time.
    pub flap_quiet_after: u64,
    /// Who may approve, deny, stop and abandon, and propose plans, as
    /// `<channel>:<identity>` (`cli:alice`, `matrix:@alice:example.org`).
    /// Everyone else's commands are recorded as data and never applied.
    /// Empty: `nisse` fills in `cli:<the user it runs as>`.
    pub operators: Vec<String>,
    /// How long an approval request stays open, and how long an approval
    /// lets a plan start: after that the world may have changed, and the
    /// plan must be approved again (O2).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub approval_expiry: Duration,
    /// Hosts bound to every work item (seed L13: the harness binds hosts,
    /// not the model), typically the agent's tool VM. Commands run only on
    /// hosts bound to their item; the executor refuses any other before it
    /// connects.
    pub tool_hosts: Vec<String>,
    /// Alert labels whose value names a host to bind to the alert's item
    /// (`instance = "nas01:9100"` binds `nas01`: a `:port` is dropped).
    pub host_labels: Vec<String>,
    /// Names the operator may address the agent by in chat (`ops: stop`);
    /// its Matrix user id and localpart are added by `nisse`. A message
    /// that begins by addressing anyone else is not for the agent.
    pub names: Vec<String>,
    /// What the agent is for, in a paragraph: the start of every model
    /// call's system prompt. The rules of the loop (tools, labels) are
    /// added by code.
    pub brief: String,
    /// The model-driven loop's limits (escalation triggers, delegation
    /// caps, the `ask_expert` budget). The loop runs only when `[models]`
    /// names roles.
    #[serde(rename = "loop")]
    pub agent_loop: nisse_core::agent_loop::LoopConfig,
}

/// The ops agent's default brief.
pub const DEFAULT_BRIEF: &str = "You are nisse-ops, the operations agent of a homelab. Alerts, checks and the operator's requests become work items; for each you find out what is wrong by looking (read-only commands on the bound hosts), propose a fix as a plan of literal steps the operator approves, and once it has run, verify the result and report what was done, what was verified and what is left open. Prefer the smallest reversible change; never guess at a host's state when you can look.";

impl Default for Config {
    fn default() -> Self {
        Self {
            fingerprint_labels: Vec::new(),
            scope_labels: vec![
                "site".into(),
                "service".into(),
                "job".into(),
                "instance".into(),
            ],
            severity_label: "severity".into(),
            severities: vec![
                "critical".into(),
                "error".into(),
                "warning".into(),
                "info".into(),
            ],
            close_on_resolve: true,
            flap_window: Duration::from_secs(3600),
            flap_quiet_after: 3,
            operators: Vec::new(),
            approval_expiry: nisse_core::plans::DEFAULT_APPROVAL_EXPIRY,
            tool_hosts: Vec::new(),
            host_labels: vec!["instance".into()],
            names: vec!["ops".into(), "nisse-ops".into(), "nisse".into()],
            brief: DEFAULT_BRIEF.into(),
            agent_loop: nisse_core::agent_loop::LoopConfig::default(),
        }
    }
}

impl Config {
    /// Problems as (key under `prefix`, what is wrong); empty when valid.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.severity_label.trim().is_empty() {
            out.push((
                format!("{prefix}.severity-label"),
                "must not be empty".into(),
            ));
        }
        if self.approval_expiry.is_zero() {
            out.push((
                format!("{prefix}.approval-expiry"),
                "must be longer than zero".into(),
            ));
        }
        if let Some(i) = self.operators.iter().position(|o| {
            !o.split_once(':')
                .is_some_and(|(c, id)| !c.is_empty() && !id.is_empty())
        }) {
            out.push((
                format!("{prefix}.operators[{i}]"),
                "must be `<channel>:<identity>`, e.g. `cli:alice`".into(),
            ));
        }
        for (key, list) in [
            ("fingerprint-labels", &self.fingerprint_labels),
            ("scope-labels", &self.scope_labels),
            ("severities", &self.severities),
            ("tool-hosts", &self.tool_hosts),
            ("host-labels", &self.host_labels),
        ] {
            if let Some(i) = list.iter().position(|l| l.trim().is_empty()) {
                out.push((format!("{prefix}.{key}[{i}]"), "must not be empty".into()));
            }
        }
        if self.brief.trim().is_empty() {
            out.push((format!("{prefix}.brief"), "must not be empty".into()));
        }
        out.extend(self.agent_loop.validate(&format!("{prefix}.loop")));
        out
    }

    /// The settings every brain has, from this configuration, for the
    /// agent named `agent` (no models: see `OpsBrain::with_models`).
    pub fn brain_settings(&self, agent: &str) -> BrainSettings {
        BrainSettings {
            agent: agent.to_string(),
            operators: self.operators.clone(),
            names: self.names.clone(),
            approval_expiry: self.approval_expiry,
            brief: self.brief.clone(),
            loop_config: self.agent_loop.clone(),
            models: ModelsConfig::default(),
        }
    }
}
