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
use nisse_bus::proto::{self, AlertReceived, Envelope, MatrixOutbound, MatrixOutboundKind};
use nisse_core::{Actor, Brain, Event, NewItem, State, StoreError, Transition, Txn, WorkItem};

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
}

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
        for (key, list) in [
            ("fingerprint-labels", &self.fingerprint_labels),
            ("scope-labels", &self.scope_labels),
            ("severities", &self.severities),
        ] {
            if let Some(i) = list.iter().position(|l| l.trim().is_empty()) {
                out.push((format!("{prefix}.{key}[{i}]"), "must not be empty".into()));
            }
        }
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
}

impl OpsBrain {
    /// A brain for the agent named `agent` (normally `ops`).
    pub fn new(agent: &str, config: Config) -> Self {
        Self {
            agent: agent.to_string(),
            config,
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
                    self.say(
                        txn,
                        &item,
                        event,
                        format!(
                            "🔥 **{}** is firing again on item **#{}**.",
                            md(&alert_title(alert)),
                            item.number
                        ),
                        false,
                    )?;
                }
                return Ok(());
            }
            let event = txn.append(&item.id, &actor, &finding("resolved"))?;
            let waits = item.state == State::WaitingOnOperator;
            if self.config.close_on_resolve && !waits {
                txn.transition(&item.id, Transition::Close, "its alert resolved", &me)?;
                self.say(
                    txn,
                    &item,
                    event,
                    format!(
                        "✅ **{}** resolved; item **#{}** is closed.",
                        md(&alert_title(alert)),
                        item.number
                    ),
                    false,
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
                self.say(
                    txn,
                    &item,
                    event,
                    format!(
                        "✅ **{}** resolved; item **#{}** {why}.",
                        md(&alert_title(alert)),
                        item.number
                    ),
                    false,
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
            if flaps <= self.config.flap_quiet_after {
                let quiet = if flaps == self.config.flap_quiet_after {
                    " It is flapping: further flaps are recorded in its log without a message."
                } else {
                    ""
                };
                self.say(
                    txn,
                    &item,
                    event,
                    format!(
                        "🔁 **{}** fired again; item **#{}** is reopened (flap {flaps}).{quiet}",
                        md(&alert_title(alert)),
                        item.number
                    ),
                    false,
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
        self.say(txn, &item, event, text, true)
    }

    /// Queues an operator message about `item`, announcing its log event
    /// `event`: in the item's thread, or opening it.
    fn say(
        &self,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        event: i64,
        markdown: String,
        opens_thread: bool,
    ) -> Result<(), StoreError> {
        let (_, cause) = txn.cause();
        let message = MatrixOutbound {
            envelope: Some(Envelope {
                agent: self.agent.clone(),
                work_item_id: item.id.clone(),
                actor: Some(proto::Actor {
                    kind: proto::ActorKind::Agent as i32,
                    id: self.agent.clone(),
                }),
                causation_id: cause.to_string(),
                // The event it announces: applying the same message again
                // emits the same id, which JetStream drops.
                message_id: format!("out:{}:{event}", item.id),
                created_at: Some(std::time::SystemTime::from(txn.at()).into()),
                ..Default::default()
            }),
            room_id: String::new(),
            markdown,
            thread_root_event_id: String::new(),
            opens_thread,
            kind: MatrixOutboundKind::Notice as i32,
            plan_revision: 0,
        };
        txn.emit(&message)
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
            self.say(
                txn,
                &item,
                event,
                format!(
                    "▶️ Now working on item **#{}**: **{}**.",
                    item.number,
                    md(&item.title)
                ),
                false,
            )?;
        }
        Ok(())
    }
}

impl Brain for OpsBrain {
    fn apply(&mut self, txn: &mut Txn<'_, '_>, message: &AnyMessage) -> Result<(), StoreError> {
        // Everything else in the stream is for later issues' loops, or the
        // brain's own outputs coming back (the store clears those from the
        // outbox).
        if let AnyMessage::InAlert(alert) = message {
            self.apply_alert(txn, alert)?;
        }
        // Every message is a moment at which a waiting item's grace period
        // may have run out.
        txn.switch_if_due(&Actor::agent(&self.agent))?;
        self.announce_switches(txn)
    }
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

/// Text for Markdown emphasis: markup characters escaped so label values
/// cannot restyle or link the message.
fn md(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\`*_[]<>|~".contains(c) {
            out.push('\\');
        }
        if c != '\n' && c != '\r' {
            out.push(c);
        }
    }
    out
}

/// Text for an inline code span (backticks and newlines removed).
fn code(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, '`' | '\n' | '\r'))
        .collect()
}
