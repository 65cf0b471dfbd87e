//! The ops agent's settings (`[ops]` in `nisse.toml`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use nisse_core::BrainSettings;
use nisse_core::requests::Deadlines;

use crate::checks::DutyEntry;
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
    /// How long an item that went to wait on the operator keeps the
    /// agent's attention before another ready item is taken up (L1: a
    /// watching operator can answer first).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub switch_grace: Duration,
    /// How long each kind of request may go unanswered before the item
    /// waits on the operator with the reason.
    #[schemars(with = "std::collections::BTreeMap<String, String>")]
    pub deadlines: Deadlines,
    /// Scheduled checks (`[[ops.duty]]`): each a table with `name`,
    /// `kind` (http, tcp, tls, ping, disk, ssh-script) and its fields.
    pub duty: Vec<DutyEntry>,
    /// A directory holding one `<name>.toml` per duty, read with
    /// `ops.duty`.
    pub duties_dir: Option<PathBuf>,
    /// Make the starter duties for each host the executor knows (reachable
    /// over SSH, root filesystem use). Each can be turned off by its name
    /// (`<host>-ssh`, `<host>-root-disk`) with `enabled = false`.
    pub starter_duties: bool,
    /// Rules that give an alert and a check's findings one fingerprint, so
    /// they land on one item.
    pub fingerprint_rules: Vec<FingerprintRule>,
    /// Alertmanager's `repeat_interval` for the agent's receiver: a firing
    /// alert is sent again at least this often.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub alert_repeat_interval: Duration,
    /// A firing alert not sent again for this long is stale (Alertmanager
    /// or its rule may be gone): the operator is told once. Default three
    /// repeat intervals.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "Option<String>")]
    pub stale_after: Option<Duration>,
    /// Whether the agent keeps memory in the knowledge vault (seed L6,
    /// L10): its notes, the operator's corrections and a summary of every
    /// closed item go to `memory/ops/`, and an item's loop starts with the
    /// procedures, earlier incidents and notes the vault recalls for it.
    pub memory: bool,
    /// A Vikunja project (its id, the number in the project's URL) in
    /// which every item a finding opens (an alert's or a check's) gets a
    /// task of its own, its record there: the agent writes back to it as it
    /// does to a ticket the operator opened. intake-vikunja must serve the
    /// project (`vikunja.projects`). Unset: findings open no tickets.
    pub ticket_project: Option<i64>,
}

/// A rule linking an alert and checks: findings of the named duties, and
/// alerts whose labels have all the given values, share one fingerprint
/// (`rule-<name>`), so they open one item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FingerprintRule {
    /// The rule's name.
    pub name: String,
    /// Duties whose findings it covers.
    #[serde(default)]
    pub duties: Vec<String>,
    /// Label values an alert must all have.
    #[serde(default)]
    pub alert_labels: BTreeMap<String, String>,
}

impl FingerprintRule {
    /// The fingerprint of what it covers.
    pub fn fingerprint(&self) -> String {
        format!("rule-{}", self.name)
    }
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
            switch_grace: nisse_core::store::DEFAULT_SWITCH_GRACE,
            deadlines: Deadlines::default(),
            duty: Vec::new(),
            duties_dir: None,
            starter_duties: true,
            fingerprint_rules: Vec::new(),
            alert_repeat_interval: Duration::from_secs(4 * 3600),
            stale_after: None,
            memory: true,
            ticket_project: None,
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
        if self.alert_repeat_interval.is_zero() {
            out.push((
                format!("{prefix}.alert-repeat-interval"),
                "must be longer than zero".into(),
            ));
        }
        if self.ticket_project.is_some_and(|p| p <= 0) {
            out.push((
                format!("{prefix}.ticket-project"),
                "must be a Vikunja project's id (a positive number)".into(),
            ));
        }
        for (i, rule) in self.fingerprint_rules.iter().enumerate() {
            if rule.name.trim().is_empty()
                || (rule.duties.is_empty() && rule.alert_labels.is_empty())
            {
                out.push((
                    format!("{prefix}.fingerprint-rules[{i}]"),
                    "needs a name and at least one duty or alert label".into(),
                ));
            }
        }
        out
    }

    /// How long a firing alert may go without being sent again before it
    /// is stale.
    pub fn stale_after(&self) -> Duration {
        self.stale_after
            .unwrap_or_else(|| self.alert_repeat_interval.saturating_mul(3))
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
            switch_grace: self.switch_grace,
            deadlines: self.deadlines,
            memory: self.memory,
            ..BrainSettings::new(agent)
        }
    }
}
