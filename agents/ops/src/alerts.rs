//! Alert intake (seed Nisse L1, O5): each alert from Alertmanager is a
//! finding. A finding whose fingerprint matches an open work item attaches
//! to it; a new one opens an item, bound to the hosts its labels name. A
//! resolved alert is recorded on its item and, when configured and nothing
//! waits on the operator, closes it. An alert that fires again soon after
//! its item closed reopens that item instead of opening one per flap
//! (Oikos §6.1: dedup, resolve). Everything in an alert is written outside
//! Nisse (seed L11): its labels by whoever runs the exporter or writes the
//! rule, its annotations by the rule and what it templates in from the
//! target. Messages to the operator are rendered from labels only, escaped
//! for Markdown, with the generator URL made a plain link target;
//! annotations stay in the item's log. The model sees labels and
//! annotations alike as untrusted data (`nisse_core::render`). With
//! `ops.ticket-project` set, a finding's new item gets a Vikunja task of
//! its own (`crate::tickets`).

use std::collections::{BTreeMap, HashMap};

use nisse_bus::proto::{self, AlertReceived};
use nisse_core::markdown::{code, link_target, md_escape as md};
use nisse_core::{Actor, BrainSettings, Event, NewItem, Say, State, StoreError, Transition, Txn};

use crate::brain::OpsDuties;

/// The duty name findings from Alertmanager carry.
pub const ALERT_DUTY: &str = "alert-intake";

impl OpsDuties {
    /// Applies one alert from Alertmanager: a finding, attached to its
    /// item, resolving it, reopening it, or opening a new one.
    pub(crate) fn apply_alert(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        msg: &AlertReceived,
    ) -> Result<(), StoreError> {
        let env = msg.envelope.clone().unwrap_or_default();
        let alert = msg
            .alert
            .as_ref()
            .ok_or_else(|| StoreError::Corrupt("an AlertReceived without its alert".into()))?;
        let finding = Finding {
            duty: ALERT_DUTY,
            what: "alert",
            fingerprint: self.fingerprint(&alert.labels),
            firing: alert.status == "firing",
            title: alert_title(alert),
            scope: self.scope(&alert.labels),
            severity: self.severity(&alert.labels),
            detail: alert_detail(msg, alert),
            hosts: self.hosts_for(&alert.labels),
            source: env
                .actor
                .as_ref()
                .map_or_else(|| "alertmanager".into(), |a| a.id.clone()),
            link: link_target(&alert.generator_url),
            id_seed: env.message_id.clone(),
            actor: Actor::from_envelope(&env),
        };
        self.apply_finding(brain, txn, &finding)
    }

    /// Applies one finding of any duty (an alert, a failed or recovered
    /// check): one open item per fingerprint, repeats attached to it,
    /// recovery resolving it, a finding soon after its item closed
    /// reopening it (and flapping told once).
    pub(crate) fn apply_finding(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        f: &Finding<'_>,
    ) -> Result<(), StoreError> {
        let fingerprint = &f.fingerprint;
        let actor = &f.actor;
        let finding = |status: &str| Event::Finding {
            duty: f.duty.into(),
            fingerprint: fingerprint.clone(),
            status: status.into(),
            summary: f.title.clone(),
            detail: f.detail.clone(),
        };
        let me = Actor::agent(&brain.agent);

        if let Some(item) = txn.open_item_by_fingerprint(fingerprint)? {
            if f.firing {
                // Firing after its last finding said resolved.
                let refired = txn
                    .last_event_field(&item.id, "finding", "status")?
                    .as_deref()
                    == Some("resolved");
                let event = txn.append(
                    &item.id,
                    actor,
                    &finding(if refired { "firing" } else { "repeat" }),
                )?;
                if refired {
                    txn.say(
                        &brain.agent,
                        &item,
                        event,
                        Say::fact(format!(
                            "🔥 **{}** is firing again on item **#{}**.",
                            md(&f.title),
                            item.number
                        )),
                    )?;
                }
                return Ok(());
            }
            let event = txn.append(&item.id, actor, &finding("resolved"))?;
            let waits = item.state == State::WaitingOnOperator;
            if self.config.close_on_resolve && !waits {
                txn.transition(
                    &item.id,
                    Transition::Close,
                    &format!("its {} resolved", f.what),
                    &me,
                )?;
                txn.say(
                    &brain.agent,
                    &item,
                    event,
                    Say::result(format!(
                        "✅ **{}** resolved; item **#{}** is closed.",
                        md(&f.title),
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
                        text: format!("the {} resolved; {why}", f.what),
                        data: serde_json::json!({ "resolved": true }),
                    },
                )?;
                txn.say(
                    &brain.agent,
                    &item,
                    event,
                    Say::fact(format!(
                        "✅ **{}** resolved; item **#{}** {why}.",
                        md(&f.title),
                        item.number
                    )),
                )?;
            }
            return Ok(());
        }

        let last_closed = txn.last_closed_by_fingerprint(fingerprint)?;
        if !f.firing {
            // A resolve for an item already closed (a repeat of the resolved
            // notification) is recorded there; one for a problem never seen
            // firing opens nothing.
            if let Some(item) = last_closed {
                txn.append(&item.id, actor, &finding("resolved"))?;
            } else {
                tracing::debug!(%fingerprint, "a resolved finding with no item; nothing to record it on");
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
                    "its {} fired again within {} of closing (flap {flaps})",
                    f.what,
                    humantime::format_duration(self.config.flap_window)
                ),
                &me,
            )?;
            let event = txn.append(&item.id, actor, &finding("firing"))?;
            txn.loop_open(brain.agent_loop(), &item, "the item reopened")?;
            if flaps <= self.config.flap_quiet_after {
                let quiet = if flaps == self.config.flap_quiet_after {
                    " It is flapping: further flaps are recorded in its log without a message."
                } else {
                    ""
                };
                txn.say(
                    &brain.agent,
                    &item,
                    event,
                    Say::fact(format!(
                        "🔁 **{}** fired again; item **#{}** is reopened (flap {flaps}).{quiet}",
                        md(&f.title),
                        item.number
                    )),
                )?;
            }
            return Ok(());
        }

        let item = txn.open_item(
            NewItem {
                title: f.title.clone(),
                scope: f.scope.clone(),
                source: f.source.clone(),
                fingerprint: Some(fingerprint.clone()),
                external_link: None,
                severity: f.severity.clone(),
                priority: self.priority(f.severity.as_deref()),
                id_seed: f.id_seed.clone(),
            },
            &me,
        )?;
        let event = txn.append(&item.id, actor, &finding("firing"))?;
        let mut text = format!(
            "🔥 **{}** · severity **{}** · scope `{}`\n\nWork item **#{}** (`{}`), from {}.",
            md(&item.title),
            md(f.severity.as_deref().unwrap_or("unknown")),
            code(&item.scope),
            item.number,
            item.id,
            code(&item.source),
        );
        if let Some(url) = &f.link {
            text.push_str(&format!(" [Source]({url})"));
        }
        txn.say(&brain.agent, &item, event, Say::thread_root(text))?;
        self.open_ticket(brain, txn, &item, f)?;
        txn.bind_hosts(
            &item,
            &me,
            f.hosts.clone(),
            &format!("the agent's tool hosts and the hosts the {} names", f.what),
        )?;
        txn.loop_open(brain.agent_loop(), &item, "the item opened")
    }
}

/// A finding of one of the agent's duties, ready to become (or attach
/// to) a work item.
#[derive(Debug, Clone)]
pub(crate) struct Finding<'a> {
    /// The duty (`alert-intake`, a check's name).
    pub duty: &'a str,
    /// What it is, in the words of messages: `alert`, `check`.
    pub what: &'a str,
    /// Its fingerprint: one open item per fingerprint.
    pub fingerprint: String,
    /// Firing (failing), or resolved (recovered).
    pub firing: bool,
    /// A new item's title.
    pub title: String,
    /// A new item's scope.
    pub scope: String,
    /// Its severity.
    pub severity: Option<String>,
    /// Everything it says, for the log.
    pub detail: serde_json::Value,
    /// The hosts a new item is bound to.
    pub hosts: Vec<String>,
    /// Where it came from.
    pub source: String,
    /// A link to its source, already a safe link target.
    pub link: Option<String>,
    /// The id of the message that raised it: a new item's id is derived
    /// from it.
    pub id_seed: String,
    /// Who reported it.
    pub actor: Actor,
}

/// A title from labels only (never annotations). Labels too are written
/// outside Nisse: every place that shows the title escapes or quotes it.
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
    let sorted = |m: &HashMap<String, String>| -> BTreeMap<String, String> {
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
