//! nisse-ops: the ops agent's brain.
//!
//! Alert intake is a duty (seed Nisse L1, O5): each alert from
//! Alertmanager is a finding with a stable fingerprint taken from its
//! labels. A finding whose fingerprint matches an open work item attaches
//! to it; a new one opens an item. A resolved alert is recorded on its item
//! and, when configured and nothing waits on the operator, closes it. An
//! alert that fires again soon after its item closed reopens that item
//! instead of opening one per flap (Oikos §6.1: dedup, resolve).
//!
//! New items and state changes produce operator messages rendered here, by
//! code, from labels only: annotations are untrusted text (seed L11) and
//! stay in the item's log.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use nisse_bus::AnyMessage;
use nisse_bus::proto::{self, AlertReceived, OperatorCommand, operator_command};
use nisse_core::agent_loop::LoopSettings;
use nisse_core::markdown::{code, md_escape as md};
use nisse_core::plans::{Decision, Origin, PlanSettings};
use nisse_core::say::Say;
use nisse_core::{Actor, ActorKind, Brain, Event, NewItem, State, StoreError, Transition, Txn};
use nisse_models::ModelsConfig;
use nisse_policy::{Action, Check, Step};

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
}

/// The duty name findings from Alertmanager carry.
pub const ALERT_DUTY: &str = "alert-intake";

/// The ops agent's brain.
#[derive(Debug, Clone)]
pub struct OpsBrain {
    agent: String,
    config: Config,
    models: ModelsConfig,
}

impl OpsBrain {
    /// A brain for the agent named `agent` (normally `ops`), without
    /// models: it works from the operator's plans only.
    pub fn new(agent: &str, config: Config) -> Self {
        Self {
            agent: agent.to_string(),
            config,
            models: ModelsConfig::default(),
        }
    }

    /// The same brain with `[models]`: when roles are configured, every
    /// new item gets the model-driven loop.
    pub fn with_models(mut self, models: ModelsConfig) -> Self {
        self.models = models;
        self
    }

    fn loop_settings(&self) -> LoopSettings<'_> {
        LoopSettings {
            plans: self.plan_settings(),
            models: &self.models,
            config: &self.config.agent_loop,
            brief: &self.config.brief,
        }
    }

    /// A finding's fingerprint: a hash of the chosen labels' names and
    /// values, independent of label order and of everything else in the
    /// alert (times, annotations), so every repeat and flap of one problem
    /// gets the same one.
    pub fn fingerprint(&self, labels: &std::collections::HashMap<String, String>) -> String {
        let chosen: BTreeMap<&str, &str> = if self.config.fingerprint_labels.is_empty() {
            labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect()
        } else {
            self.config
                .fingerprint_labels
                .iter()
                .map(|k| (k.as_str(), labels.get(k).map_or("", String::as_str)))
                .collect()
        };
        let mut hash = sha2::Sha256::new();
        for (k, v) in chosen {
            // Length-prefixed, so no choice of values can collide by
            // shifting text between a name and a value.
            hash.update((k.len() as u64).to_be_bytes());
            hash.update(k.as_bytes());
            hash.update((v.len() as u64).to_be_bytes());
            hash.update(v.as_bytes());
        }
        let digest = hash.finalize();
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("alert-{hex}")
    }

    fn severity(&self, labels: &std::collections::HashMap<String, String>) -> Option<String> {
        labels
            .get(&self.config.severity_label)
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
    }

    /// More urgent severities rank higher; unknown ones lowest.
    fn priority(&self, severity: Option<&str>) -> i64 {
        let n = self.config.severities.len();
        severity
            .and_then(|s| {
                self.config
                    .severities
                    .iter()
                    .position(|x| x.eq_ignore_ascii_case(s))
            })
            .map_or(0, |i| i64::try_from(n - i).unwrap_or(0))
    }

    fn scope(&self, labels: &std::collections::HashMap<String, String>) -> String {
        let parts: Vec<&str> = self
            .config
            .scope_labels
            .iter()
            .filter_map(|l| labels.get(l).map(String::as_str))
            .filter(|v| !v.is_empty())
            .take(2)
            .collect();
        if parts.is_empty() {
            "unscoped".into()
        } else {
            parts.join("/")
        }
    }

    fn apply_alert(&self, txn: &mut Txn<'_, '_>, msg: &AlertReceived) -> Result<(), StoreError> {
        let env = msg.envelope.clone().unwrap_or_default();
        let alert = msg
            .alert
            .as_ref()
            .ok_or_else(|| StoreError::Corrupt("an AlertReceived without its alert".into()))?;
        let actor = Actor::from_envelope(&env);
        let fingerprint = self.fingerprint(&alert.labels);
        let severity = self.severity(&alert.labels);
        let firing = alert.status == "firing";
        let detail = alert_detail(msg, alert);
        let finding = |status: &str| Event::Finding {
            duty: ALERT_DUTY.into(),
            fingerprint: fingerprint.clone(),
            status: status.into(),
            summary: alert_title(alert),
            detail: detail.clone(),
        };
        let me = Actor::agent(&self.agent);

        if let Some(item) = txn.open_item_by_fingerprint(&fingerprint)? {
            if firing {
                let refired = last_finding_status(txn, &item.id)?.as_deref() == Some("resolved");
                let event = txn.append(
                    &item.id,
                    &actor,
                    &finding(if refired { "firing" } else { "repeat" }),
                )?;
                if refired {
                    txn.say(
                        &self.agent,
                        &item,
                        event,
                        Say::notice(format!(
                            "🔥 **{}** is firing again on item **#{}**.",
                            md(&alert_title(alert)),
                            item.number
                        )),
                    )?;
                }
                return Ok(());
            }
            let event = txn.append(&item.id, &actor, &finding("resolved"))?;
            let waits = item.state == State::WaitingOnOperator;
            if self.config.close_on_resolve && !waits {
                txn.transition(&item.id, Transition::Close, "its alert resolved", &me)?;
                txn.say(
                    &self.agent,
                    &item,
                    event,
                    Say::notice(format!(
                        "✅ **{}** resolved; item **#{}** is closed.",
                        md(&alert_title(alert)),
                        item.number
                    )),
                )?;
            } else {
                let why = if waits {
                    "it stays open because it waits on the operator"
                } else {
                    "it stays open (ops.close-on-resolve is off)"
                };
                txn.append(
                    &item.id,
                    &me,
                    &Event::Fact {
                        text: format!("the alert resolved; {why}"),
                        data: serde_json::json!({ "resolved": true }),
                    },
                )?;
                txn.say(
                    &self.agent,
                    &item,
                    event,
                    Say::notice(format!(
                        "✅ **{}** resolved; item **#{}** {why}.",
                        md(&alert_title(alert)),
                        item.number
                    )),
                )?;
            }
            return Ok(());
        }

        let last_closed = txn.last_closed_by_fingerprint(&fingerprint)?;
        if !firing {
            // A resolve for an item already closed (a repeat of the resolved
            // notification) is recorded there; one for a problem never seen
            // firing opens nothing.
            if let Some(item) = last_closed {
                txn.append(&item.id, &actor, &finding("resolved"))?;
            } else {
                tracing::debug!(%fingerprint, "resolved alert with no item; nothing to record it on");
            }
            return Ok(());
        }

        let flapped = last_closed.filter(|item| {
            item.closed_at
                .is_some_and(|closed| txn.at() - closed <= self.config.flap_window)
        });
        if let Some(item) = flapped {
            let flaps = txn.count_transitions(&item.id, Transition::Reopen)? + 1;
            txn.transition(
                &item.id,
                Transition::Reopen,
                &format!(
                    "its alert fired again within {} of closing (flap {flaps})",
                    humantime::format_duration(self.config.flap_window)
                ),
                &me,
            )?;
            let event = txn.append(&item.id, &actor, &finding("firing"))?;
            txn.loop_open(self.loop_settings(), &item, "the item reopened")?;
            if flaps <= self.config.flap_quiet_after {
                let quiet = if flaps == self.config.flap_quiet_after {
                    " It is flapping: further flaps are recorded in its log without a message."
                } else {
                    ""
                };
                txn.say(
                    &self.agent,
                    &item,
                    event,
                    Say::notice(format!(
                        "🔁 **{}** fired again; item **#{}** is reopened (flap {flaps}).{quiet}",
                        md(&alert_title(alert)),
                        item.number
                    )),
                )?;
            }
            return Ok(());
        }

        let item = txn.open_item(
            NewItem {
                title: alert_title(alert),
                scope: self.scope(&alert.labels),
                source: env
                    .actor
                    .as_ref()
                    .map_or_else(|| "alertmanager".into(), |a| a.id.clone()),
                fingerprint: Some(fingerprint.clone()),
                external_link: None,
                severity: severity.clone(),
                priority: self.priority(severity.as_deref()),
                id_seed: env.message_id.clone(),
            },
            &me,
        )?;
        let event = txn.append(&item.id, &actor, &finding("firing"))?;
        let mut text = format!(
            "🔥 **{}** · severity **{}** · scope `{}`\n\nWork item **#{}** (`{}`), from {}.",
            md(&item.title),
            md(severity.as_deref().unwrap_or("unknown")),
            code(&item.scope),
            item.number,
            item.id,
            code(&item.source),
        );
        if let Some(url) = Some(&alert.generator_url).filter(|u| u.starts_with("http")) {
            text.push_str(&format!(" [Source]({})", url.replace(')', "%29")));
        }
        txn.say(&self.agent, &item, event, Say::thread_root(text))?;
        let hosts = self.hosts_for(&alert.labels);
        txn.bind_hosts(
            &self.agent,
            &item,
            &me,
            hosts,
            "the agent's tool hosts and the hosts the alert's labels name",
        )?;
        txn.loop_open(self.loop_settings(), &item, "the item opened")
    }

    /// The hosts an alert's item is bound to: the tool hosts, and the hosts
    /// named by the configured labels.
    fn hosts_for(&self, labels: &std::collections::HashMap<String, String>) -> Vec<String> {
        let mut hosts = self.config.tool_hosts.clone();
        for label in &self.config.host_labels {
            if let Some(value) = labels.get(label) {
                hosts.push(host_of(value).to_string());
            }
        }
        hosts
    }
}

/// The host part of an `instance`-style label value: `nas01:9100` →
/// `nas01`, `[fd00::1]:9100` → `fd00::1`; anything else as it is.
fn host_of(value: &str) -> &str {
    let value = value.trim();
    if let Some(rest) = value.strip_prefix('[') {
        return rest.split_once(']').map_or(value, |(h, _)| h);
    }
    match value.rsplit_once(':') {
        Some((host, port))
            if !host.contains(':')
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            host
        }
        _ => value,
    }
}

impl OpsBrain {
    /// Tells the operator when an item became active because another one
    /// stopped being active (the store switches at safe points). An item
    /// activated as it opened was announced by its opening message.
    fn announce_switches(&self, txn: &mut Txn<'_, '_>) -> Result<(), StoreError> {
        let switched: Vec<(String, i64)> = txn
            .state_changes()
            .iter()
            .filter(|c| c.changed.to == State::Active && c.changed.from == State::Ready)
            .map(|c| (c.work_item_id.clone(), c.event_id))
            .collect();
        for (id, event) in switched {
            let Some(item) = txn.item(&id)? else { continue };
            let opened_now = txn
                .events(&id)?
                .first()
                .is_some_and(|e| e.causation_id == txn.cause().1);
            if opened_now {
                continue;
            }
            txn.say(
                &self.agent,
                &item,
                event,
                Say::notice(format!(
                    "▶️ Now working on item **#{}**: **{}**.",
                    item.number,
                    md(&item.title)
                )),
            )?;
        }
        Ok(())
    }
}

impl Brain for OpsBrain {
    fn apply(&mut self, txn: &mut Txn<'_, '_>, message: &AnyMessage) -> Result<(), StoreError> {
        let settings = self.plan_settings();
        // Everything else in the stream is for later issues' loops, or the
        // brain's own outputs coming back (the store clears those from the
        // outbox).
        match message {
            AnyMessage::InAlert(alert) => self.apply_alert(txn, alert)?,
            AnyMessage::InOperator(command) => self.apply_operator(txn, command)?,
            AnyMessage::InMatrix(event) => self.apply_matrix(txn, event)?,
            // The loop's own requests first; the rest are the plan
            // machinery's.
            AnyMessage::ClassifyVerdict(verdict)
                if !txn.loop_verdict(self.loop_settings(), verdict)? =>
            {
                txn.plan_verdict(settings, verdict)?;
            }
            AnyMessage::ExecResult(result)
                if !txn.loop_exec_result(self.loop_settings(), result)? =>
            {
                txn.plan_exec_result(settings, result)?;
            }
            AnyMessage::LoopPin(pinned) => txn.loop_pinned(self.loop_settings(), pinned)?,
            AnyMessage::ModelResp(response) => {
                txn.loop_model_response(self.loop_settings(), response)?;
            }
            _ => {}
        }
        // Every message is a moment at which a waiting item's grace period
        // may have run out, at which an approved plan's item may be the
        // active one, and at which the active item's loop may have a turn
        // due.
        txn.switch_if_due(&Actor::agent(&self.agent))?;
        txn.resume_active_plan(settings)?;
        txn.drive_loop(self.loop_settings())?;
        self.announce_switches(txn)
    }
}

impl OpsBrain {
    fn plan_settings(&self) -> PlanSettings<'_> {
        PlanSettings {
            agent: &self.agent,
            approval_expiry: self.config.approval_expiry,
        }
    }

    /// An event from the agent's Matrix room. Who may instruct is the
    /// allowlist (`matrix:<user id>` in `ops.operators`); what a message
    /// says is read by code (`conversation::read`). Everything said about
    /// an item goes in its log; only an operator's words addressed to the
    /// agent act, and a question is answered, never acted on.
    fn apply_matrix(
        &self,
        txn: &mut Txn<'_, '_>,
        event: &proto::MatrixEventReceived,
    ) -> Result<(), StoreError> {
        use nisse_core::conversation::{Command as C, Said, read};
        let operator = self
            .config
            .operators
            .iter()
            .any(|o| *o == format!("matrix:{}", event.sender));
        let actor = Actor {
            kind: if operator {
                ActorKind::Operator
            } else {
                ActorKind::External
            },
            id: event.sender.clone(),
        };
        let env = event.envelope.clone().unwrap_or_default();
        // The item: the thread (or the message reacted to) it belongs to,
        // else the one being worked on.
        let item = match txn.item(&env.work_item_id)? {
            Some(item) => Some(item),
            None if event.thread_root_event_id.is_empty() => txn.active_item()?,
            None => None,
        };
        let Some(item) = item else {
            // Nothing to record it on. An operator's question or `status`
            // still gets an answer, in the room.
            let names: Vec<&str> = self.config.names.iter().map(String::as_str).collect();
            let asks = matches!(
                read(&event.body, &names),
                Said::Question | Said::Command(C::Status)
            );
            if operator && event.kind == proto::MatrixEventKind::Message as i32 && asks {
                let text = match txn.next_ready()? {
                    Some(next) => format!(
                        "No work item is being worked on; next is **#{}**: {}.",
                        next.number,
                        md(&next.title)
                    ),
                    None => "No work item is open.".to_string(),
                };
                let answer = proto::MatrixOutbound {
                    envelope: Some(txn.agent_envelope(
                        &self.agent,
                        "",
                        format!("out:matrix:{}", event.event_id),
                    )),
                    markdown: text,
                    kind: proto::MatrixOutboundKind::Notice as i32,
                    ..Default::default()
                };
                txn.emit(&answer)?;
            }
            return Ok(());
        };
        let settings = self.plan_settings();
        let origin = Origin {
            actor: &actor,
            via: "matrix",
            allowed: operator,
        };
        let kind = proto::MatrixEventKind::try_from(event.kind).unwrap_or_default();
        if kind == proto::MatrixEventKind::Reaction {
            let approve = matches!(event.reaction_key.trim_end_matches('\u{fe0f}'), "✅" | "👍");
            let deny = matches!(event.reaction_key.trim_end_matches('\u{fe0f}'), "❌" | "👎");
            if event.reacted_plan_revision > 0 && (approve || deny) {
                let rev = Some(event.reacted_plan_revision);
                let decision = if approve {
                    Decision::Approve(rev)
                } else {
                    Decision::Deny(rev, "denied with a reaction".into())
                };
                txn.plan_decision(settings, &item, origin, decision)?;
            }
            return Ok(());
        }
        if kind != proto::MatrixEventKind::Message {
            return Ok(());
        }
        let names: Vec<&str> = self.config.names.iter().map(String::as_str).collect();
        let said = read(&event.body, &names);
        let read_as = match &said {
            Said::Command(_) => "command",
            Said::Question => "question",
            Said::ForSomeoneElse(_) => "for-someone-else",
            Said::Talk => "talk",
        };
        let logged = txn.append(
            &item.id,
            &actor,
            &Event::Said {
                via: "matrix".into(),
                text: event.body.clone(),
                operator,
                read_as: read_as.into(),
            },
        )?;
        if !operator {
            return Ok(());
        }
        match said {
            Said::ForSomeoneElse(_) => {}
            Said::Command(C::Approve(rev)) => {
                txn.plan_decision(settings, &item, origin, Decision::Approve(rev))?;
            }
            Said::Command(C::Deny(rev, reason)) => {
                txn.plan_decision(settings, &item, origin, Decision::Deny(rev, reason))?;
            }
            Said::Command(C::Stop) => {
                txn.plan_stop(settings, &item, &actor, "matrix")?;
                txn.loop_stop(self.loop_settings(), &item)?;
            }
            Said::Command(C::Abandon(note)) => {
                txn.plan_abandon(settings, &item, &actor, "matrix", &note)?;
            }
            Said::Command(C::DoNext(n)) => {
                let target = txn.find_item(&format!("#{n}"))?;
                let text = match target {
                    Some(t) if t.state.is_open() => {
                        txn.set_operator_rank(&t.id, Some(0), &actor)?;
                        format!("Item **#{n}** goes next.")
                    }
                    _ => format!("There is no open item **#{n}**."),
                };
                txn.say(&self.agent, &item, logged, Say::notice(text))?;
            }
            Said::Command(C::Use(project)) => {
                txn.say(
                    &self.agent,
                    &item,
                    logged,
                    Say::notice(format!(
                        "The ops agent has no projects; `use {}` changes nothing.",
                        md(&project)
                    )),
                )?;
            }
            // A question on an item the model works is answered by the
            // model from the item's context; `status`, and any question
            // without a loop, by code. Neither changes anything.
            Said::Question if txn.loop_answer(self.loop_settings(), &item, logged)? => {}
            Said::Command(C::Status) | Said::Question => {
                let status = self.status(txn, &item)?;
                txn.say(&self.agent, &item, logged, Say::notice(status))?;
            }
            Said::Talk => {
                // An answer: an item waiting on the operator is ready again.
                if item.state == State::WaitingOnOperator {
                    txn.transition(
                        &item.id,
                        Transition::OperatorAnswered,
                        "the operator answered in Matrix",
                        &actor,
                    )?;
                }
                txn.loop_operator_said(&item, &event.body)?;
            }
        }
        Ok(())
    }

    /// Where an item stands, rendered by code.
    fn status(&self, txn: &Txn<'_, '_>, item: &nisse_core::WorkItem) -> Result<String, StoreError> {
        let mut text = format!(
            "Item **#{}** · **{}** · {}",
            item.number,
            md(&item.title),
            item.state.as_str().replace('_', " ")
        );
        if let Some(state) = txn.loop_state(&item.id)? {
            use nisse_core::agent_loop::Status;
            let doing = match &state.status {
                Status::Asking { call_id } => {
                    let question = txn
                        .events(&item.id)?
                        .into_iter()
                        .rev()
                        .find_map(|e| match e.event {
                            Event::QuestionAsked {
                                call_id: c,
                                question,
                            } if c == *call_id => Some(question),
                            _ => None,
                        })
                        .unwrap_or_default();
                    format!("waiting for your answer to: {}", md(&question))
                }
                Status::Stuck { reason } => format!("stopped: {}", md(reason)),
                Status::Stopped => "stopped by the operator".into(),
                Status::Thinking { .. } => format!("the {} is thinking", state.role),
                Status::Acting { .. } => format!("the {} is running a tool", state.role),
                Status::Idle | Status::Done => String::new(),
            };
            if !doing.is_empty() {
                text.push_str(&format!("\n\nAgent: {doing}"));
            }
        }
        if let Some(plan) = txn.current_plan(&item.id)? {
            text.push_str(&format!(
                "\n\nPlan {}: {}{}",
                plan.tag(),
                plan.status,
                match &plan.halted {
                    Some(reason) => format!(" (halted: {})", md(reason)),
                    None => String::new(),
                }
            ));
        }
        Ok(text)
    }

    /// An operator command from the CLI: authenticated by the channel,
    /// checked here against the allowlist. A command from anyone else is
    /// recorded on the item as data and changes nothing.
    fn apply_operator(
        &self,
        txn: &mut Txn<'_, '_>,
        cmd: &OperatorCommand,
    ) -> Result<(), StoreError> {
        use operator_command::Command;
        let env = cmd.envelope.clone().unwrap_or_default();
        let actor = Actor::from_envelope(&env);
        let item = txn
            .find_item(&cmd.work_item)?
            .ok_or_else(|| StoreError::Missing(format!("no work item `{}`", cmd.work_item)))?;
        let allowed = actor.kind == ActorKind::Operator
            && self
                .config
                .operators
                .iter()
                .any(|o| *o == format!("{}:{}", cmd.channel, actor.id));
        let settings = self.plan_settings();
        let origin = Origin {
            actor: &actor,
            via: &cmd.channel,
            allowed,
        };
        let revision = |r: u32| (r > 0).then_some(r);
        match &cmd.command {
            Some(Command::Approve(a)) => {
                txn.plan_decision(
                    settings,
                    &item,
                    origin,
                    Decision::Approve(revision(a.revision)),
                )?;
            }
            Some(Command::Deny(d)) => {
                txn.plan_decision(
                    settings,
                    &item,
                    origin,
                    Decision::Deny(revision(d.revision), d.reason.clone()),
                )?;
            }
            Some(_) if !allowed => {
                txn.append(
                    &item.id,
                    &actor,
                    &Event::Fact {
                        text: format!(
                            "a command from {actor} via {} was ignored: not on the operator allowlist",
                            cmd.channel
                        ),
                        data: serde_json::json!({ "ignored": true, "channel": cmd.channel }),
                    },
                )?;
            }
            Some(Command::Stop(_)) => {
                txn.plan_stop(settings, &item, &actor, &cmd.channel)?;
                txn.loop_stop(self.loop_settings(), &item)?;
            }
            Some(Command::Abandon(a)) => {
                txn.plan_abandon(settings, &item, &actor, &cmd.channel, &a.note)?;
            }
            Some(Command::ProposePlan(p)) => {
                let plan = p.plan.clone().unwrap_or_default();
                match steps_from_wire(&plan) {
                    Ok(steps) => {
                        txn.propose_plan(settings, &item, &actor, &plan.rationale, steps)?;
                    }
                    Err(reason) => {
                        let event = txn.append(
                            &item.id,
                            &actor,
                            &Event::PlanRejected {
                                revision: None,
                                reason: reason.clone(),
                            },
                        )?;
                        txn.say(
                            &self.agent,
                            &item,
                            event,
                            Say::notice(format!("⛔ Plan not recorded: {}", md(&reason))),
                        )?;
                    }
                }
            }
            None => {
                return Err(StoreError::Corrupt(
                    "an operator command without a command".into(),
                ));
            }
        }
        Ok(())
    }
}

/// The plan's steps, each checked: a step that is not well formed names
/// itself and what is wrong.
fn steps_from_wire(
    plan: &proto::Plan,
) -> Result<Vec<(Step, Option<nisse_policy::RiskClass>)>, String> {
    let check = |c: &Option<proto::StepCheck>| {
        c.as_ref()
            .filter(|c| !c.command.trim().is_empty())
            .map(|c| Check {
                command: c.command.trim().to_string(),
                exit_code: c.exit_code,
                output_contains: (!c.output_contains.is_empty()).then(|| c.output_contains.clone()),
            })
    };
    plan.steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let action = Action::from_json(&s.tool, &s.target, &s.arguments_json)
                .map_err(|e| format!("step {}: {}", i + 1, e.0))?;
            Ok((
                Step {
                    action,
                    precondition: check(&s.precondition),
                    expected: check(&s.expected),
                    retries: s.retries.unwrap_or(nisse_policy::plan::DEFAULT_RETRIES),
                },
                nisse_policy::wire::risk_from_wire(s.declared_risk),
            ))
        })
        .collect()
}

/// The status of the last finding on an item, if any.
fn last_finding_status(txn: &Txn<'_, '_>, id: &str) -> Result<Option<String>, StoreError> {
    Ok(txn
        .last_event_of_kind(id, "finding")?
        .and_then(|e| match e.event {
            Event::Finding { status, .. } => Some(if status == "repeat" {
                "firing".into()
            } else {
                status
            }),
            _ => None,
        }))
}

/// A title from labels only (never annotations: they are untrusted).
fn alert_title(alert: &proto::Alert) -> String {
    let name = alert
        .labels
        .get("alertname")
        .map_or("alert", String::as_str);
    match alert.labels.get("instance").filter(|i| !i.is_empty()) {
        Some(instance) => format!("{name} on {instance}"),
        None => name.to_string(),
    }
}

/// Everything the webhook said about the alert, for the item's log.
fn alert_detail(msg: &AlertReceived, alert: &proto::Alert) -> serde_json::Value {
    let ts = |t: &Option<prost_types::Timestamp>| {
        t.as_ref().map(|t| {
            time::OffsetDateTime::from_unix_timestamp(t.seconds)
                .map(|d| d + time::Duration::nanoseconds(i64::from(t.nanos)))
                .ok()
                .and_then(|d| {
                    d.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                })
        })
    };
    let sorted = |m: &std::collections::HashMap<String, String>| -> BTreeMap<String, String> {
        m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    serde_json::json!({
        "status": alert.status,
        "labels": sorted(&alert.labels),
        "annotations_untrusted": sorted(&alert.annotations),
        "starts_at": ts(&alert.starts_at),
        "ends_at": ts(&alert.ends_at),
        "generator_url": alert.generator_url,
        "alertmanager_fingerprint": alert.fingerprint,
        "receiver": msg.receiver,
        "group_key": msg.group_key,
        "group_status": msg.group_status,
        "truncated_alerts": msg.truncated_alerts,
        "external_url": msg.external_url,
    })
}

#[cfg(test)]
mod host_tests {
    use super::host_of;

    #[test]
    fn a_port_is_dropped_from_an_instance_label() {
        assert_eq!(host_of("nas01:9100"), "nas01");
        assert_eq!(host_of("nas01"), "nas01");
        assert_eq!(host_of("[fd00::1]:9100"), "fd00::1");
        assert_eq!(host_of("fd00::1"), "fd00::1");
        assert_eq!(host_of("web:http"), "web:http");
    }
}
