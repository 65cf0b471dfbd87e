//! Alertmanager's webhook payload (version 4) and its mapping to one
//! `AlertReceived` per alert.
//!
//! The payload is documented at
//! <https://prometheus.io/docs/alerting/latest/configuration/#webhook_config>.
//! Every field is kept. Everything is checked here, before anything is
//! published, so a bad request publishes nothing, not even its good alerts.
//!
//! A body is read twice. The first pass ([`Shape`]) keeps nothing but
//! lengths and counts, so its memory does not grow with the body; from it
//! the size the alerts would take as messages is computed and held to
//! `max-expanded` before the second pass allocates a single label. Parsing
//! straight into maps would not be bounded by `max-body`: a label costs far
//! more in a hash map than its few bytes of JSON, and each alert's message
//! carries its own copy of every group label.

use std::collections::HashMap;
use std::fmt;

use bytesize::ByteSize;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use nisse_proto::v1::{Actor, ActorKind, Alert, AlertReceived, Envelope};

use crate::problem::{Kind, Problem};

/// The only payload version this service reads.
pub(crate) const VERSION: &str = "4";

/// Longest fingerprint accepted. Alertmanager's are 16 hex digits; the limit
/// only keeps the dedup id (a NATS header) sane.
const MAX_FINGERPRINT: usize = 128;

/// The actor id's prefix before the receiver's name.
const ACTOR_PREFIX: &str = "alertmanager:";

/// What a label or annotation costs in a message beside its text: the two
/// string headers and the hash-table slot holding them, with the table's
/// spare capacity and the allocator's rounding of two small strings.
const ENTRY_OVERHEAD: u64 = 96;

/// What one message costs beside the text counted: its structs and maps,
/// the fixed part of its dedup id, its two timestamps.
const MESSAGE_OVERHEAD: u64 = 512;

/// What one request may become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Most alerts (`max-alerts`).
    pub(crate) max_alerts: usize,
    /// Most the messages may take together (`max-expanded`).
    pub(crate) max_expanded: ByteSize,
}

/// The webhook body, as Alertmanager sends it. Unknown fields are ignored so
/// that a newer Alertmanager adding one (within version 4) is not refused.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Webhook {
    version: String,
    group_key: String,
    #[serde(default)]
    truncated_alerts: u64,
    status: String,
    receiver: String,
    #[serde(default, deserialize_with = "map_or_null")]
    group_labels: HashMap<String, String>,
    #[serde(default, deserialize_with = "map_or_null")]
    common_labels: HashMap<String, String>,
    #[serde(default, deserialize_with = "map_or_null")]
    common_annotations: HashMap<String, String>,
    #[serde(rename = "externalURL", default)]
    external_url: String,
    alerts: Vec<WebhookAlert>,
}

/// One alert of the webhook body.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WebhookAlert {
    status: String,
    #[serde(default, deserialize_with = "map_or_null")]
    labels: HashMap<String, String>,
    #[serde(default, deserialize_with = "map_or_null")]
    annotations: HashMap<String, String>,
    #[serde(deserialize_with = "rfc3339")]
    starts_at: OffsetDateTime,
    #[serde(default, deserialize_with = "rfc3339_or_null")]
    ends_at: Option<OffsetDateTime>,
    #[serde(rename = "generatorURL", default)]
    generator_url: String,
    // Optional here so that its absence is reported as what it is (a
    // missing fingerprint, 422) rather than as a JSON shape error.
    #[serde(default)]
    fingerprint: Option<String>,
}

/// The first pass over a body: the webhook's fields as lengths, its alerts
/// as a count and a sum. Its fields and types mirror [`Webhook`]'s, so
/// anything the second pass would refuse for its shape is refused here
/// with the same words, before anything is allocated for it; what only the
/// second pass checks (times, trailing data) it reads with its memory
/// already bounded.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Shape {
    version: String,
    group_key: Text,
    status: Text,
    receiver: Text,
    #[serde(default)]
    group_labels: Labels,
    #[serde(default)]
    common_labels: Labels,
    #[serde(default)]
    common_annotations: Labels,
    #[serde(rename = "externalURL", default)]
    external_url: Text,
    alerts: Alerts,
}

/// One alert of the first pass; see [`Shape`].
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AlertShape {
    status: Text,
    #[serde(default)]
    labels: Labels,
    #[serde(default)]
    annotations: Labels,
    #[serde(rename = "generatorURL", default)]
    generator_url: Text,
    #[serde(default)]
    fingerprint: Option<Text>,
}

/// A string's length in bytes, the string itself not kept.
#[derive(Debug, Default, Clone, Copy)]
struct Text(u64);

/// A map of strings (or `null`, as Go writes an empty one) as its number
/// of entries and their text.
#[derive(Debug, Default, Clone, Copy)]
struct Labels {
    entries: u64,
    text: u64,
}

/// The alerts: how many, and what they cost on their own (without the
/// group's fields).
#[derive(Debug, Default, Clone, Copy)]
struct Alerts {
    count: u64,
    own: u64,
}

impl Labels {
    /// What the map costs in a message.
    fn cost(self) -> u64 {
        self.entries
            .saturating_mul(ENTRY_OVERHEAD)
            .saturating_add(self.text)
    }
}

impl AlertShape {
    /// What the alert costs in its message, the group's fields aside. The
    /// fingerprint counts twice: it is in the dedup id too.
    fn cost(&self) -> u64 {
        let fingerprint = self.fingerprint.map_or(0, |f| f.0);
        [
            self.status.0,
            self.generator_url.0,
            fingerprint.saturating_mul(2),
            self.labels.cost(),
            self.annotations.cost(),
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }
}

impl Shape {
    /// What every alert's message carries of the group, for `agent`'s
    /// stream: the group's fields, the envelope, the fixed overhead.
    fn group_cost(&self, agent: &str) -> u64 {
        [
            MESSAGE_OVERHEAD,
            self.version.len() as u64,
            self.group_key.0,
            self.status.0,
            // The receiver is its own field and part of the actor id.
            self.receiver.0.saturating_mul(2),
            ACTOR_PREFIX.len() as u64,
            agent.len() as u64,
            self.external_url.0,
            self.group_labels.cost(),
            self.common_labels.cost(),
            self.common_annotations.cost(),
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// What all the messages of the request take together.
    fn expanded(&self, agent: &str) -> u64 {
        self.alerts
            .count
            .saturating_mul(self.group_cost(agent))
            .saturating_add(self.alerts.own)
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.len() as u64))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Labels;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<Labels, E> {
                Ok(Labels::default())
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Labels, E> {
                Ok(Labels::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Labels, D::Error> {
                d.deserialize_map(self)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Labels, A::Error> {
                let mut labels = Labels::default();
                while let Some((k, v)) = map.next_entry::<Text, Text>()? {
                    labels.entries = labels.entries.saturating_add(1);
                    labels.text = labels.text.saturating_add(k.0).saturating_add(v.0);
                }
                Ok(labels)
            }
        }
        d.deserialize_option(V)
    }
}

impl<'de> Deserialize<'de> for Alerts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Alerts;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Alerts, A::Error> {
                let mut alerts = Alerts::default();
                while let Some(alert) = seq.next_element::<AlertShape>()? {
                    alerts.count = alerts.count.saturating_add(1);
                    alerts.own = alerts.own.saturating_add(alert.cost());
                }
                Ok(alerts)
            }
        }
        d.deserialize_seq(V)
    }
}

/// Just the version, to name a wrong version even when the rest of the
/// body has another version's shape. Anything but a string is no version
/// to name, and is skipped without being kept.
#[derive(Deserialize)]
struct VersionOnly {
    #[serde(default)]
    version: VersionText,
}

/// A version if it is a string; see [`VersionOnly`].
#[derive(Default)]
struct VersionText(Option<String>);

impl<'de> Deserialize<'de> for VersionText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = VersionText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<VersionText, E> {
                Ok(VersionText(Some(v.to_string())))
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<VersionText, E> {
                Ok(VersionText(None))
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<VersionText, E> {
                Ok(VersionText(None))
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<VersionText, E> {
                Ok(VersionText(None))
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<VersionText, E> {
                Ok(VersionText(None))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<VersionText, E> {
                Ok(VersionText(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<VersionText, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(VersionText(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<VersionText, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(VersionText(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A checked webhook request, ready to publish.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Accepted {
    /// The Alertmanager receiver that sent it.
    pub(crate) receiver: String,
    /// Its group key.
    pub(crate) group_key: String,
    /// One message per alert, in the request's order.
    pub(crate) messages: Vec<AlertReceived>,
}

/// Parses and checks a webhook body and maps each alert to the message for
/// `agent`'s stream, refusing it before anything is built when it is over
/// `limits`.
pub(crate) fn parse(body: &[u8], agent: &str, limits: Limits) -> Result<Accepted, Problem> {
    let shape = measure(body)?;
    check_limits(&shape, agent, limits)?;
    let hook: Webhook = decode(body).map_err(|detail| Problem::new(Kind::InvalidJson, detail))?;

    let Webhook {
        version,
        group_key,
        truncated_alerts,
        status,
        receiver,
        group_labels,
        common_labels,
        common_annotations,
        external_url,
        alerts,
    } = hook;
    if alerts.is_empty() {
        return Err(invalid("alerts: the request carries no alerts".into()));
    }
    check_status("status", &status)?;

    // The group's fields go into every message so no message depends on
    // another; each clone then gets its own alert and id.
    let template = AlertReceived {
        envelope: Some(Envelope {
            agent: agent.to_string(),
            actor: Some(Actor {
                kind: ActorKind::External.into(),
                id: format!("{ACTOR_PREFIX}{receiver}"),
            }),
            ..Envelope::default()
        }),
        payload_version: version,
        receiver: receiver.clone(),
        group_status: status,
        group_key: group_key.clone(),
        group_labels,
        common_labels,
        common_annotations,
        external_url,
        truncated_alerts,
        alert: None,
    };
    let messages = alerts
        .into_iter()
        .enumerate()
        .map(|(i, alert)| to_message(i, alert, &template))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Accepted {
        receiver,
        group_key,
        messages,
    })
}

/// Deserializes all of `body` as `T`; the error names the path at fault
/// (`alerts[1].startsAt: ...`). A body is read without tracking the path
/// first, and again with it only when it fails: tracking costs at every
/// field of every post, and the same body fails the same way twice.
fn decode<'de, T: Deserialize<'de>>(body: &'de [u8]) -> Result<T, String> {
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize::<_, T>(&mut de)
        .map_err(|e| {
            let path = e.path().to_string();
            // The root's path is `.`, which says nothing.
            if path == "." {
                e.inner().to_string()
            } else {
                format!("{path}: {}", e.inner())
            }
        })
        // Trailing data after the object is as wrong as a missing brace.
        .and_then(|value| de.end().map(|()| value).map_err(|e| e.to_string()))
}

/// The first pass: the body's shape, in version 4.
fn measure(body: &[u8]) -> Result<Shape, Problem> {
    match decode::<Shape>(body) {
        Ok(shape) if shape.version == VERSION => Ok(shape),
        Ok(shape) => Err(unsupported_version(&shape.version)),
        // Another version's payload may fail on its shape first; the
        // version is the better thing to tell its sender.
        Err(detail) => Err(match other_version(body) {
            Some(v) => unsupported_version(&v),
            None => Problem::new(Kind::InvalidJson, detail),
        }),
    }
}

/// Refuses a request with more alerts than allowed, or whose alerts would
/// take more than the budget once each carries the group's fields.
fn check_limits(shape: &Shape, agent: &str, limits: Limits) -> Result<(), Problem> {
    let count = shape.alerts.count;
    if count > limits.max_alerts as u64 {
        return Err(Problem::new(
            Kind::TooManyAlerts,
            format!(
                "the request carries {count} alerts; the limit is {} per request (intake-alerts.max-alerts; set Alertmanager's webhook `max_alerts` at or below it)",
                limits.max_alerts
            ),
        ));
    }
    let expanded = shape.expanded(agent);
    if expanded > limits.max_expanded.as_u64() {
        return Err(Problem::new(
            Kind::ExpansionTooLarge,
            format!(
                "the request's {count} alerts would take {} ({expanded} bytes) as messages, each carrying its own copy of the group's labels and annotations ({} per alert); the budget is {} (intake-alerts.max-expanded): set Alertmanager's webhook `max_alerts` lower, or raise the budget",
                ByteSize::b(expanded),
                ByteSize::b(shape.group_cost(agent)),
                limits.max_expanded
            ),
        ));
    }
    Ok(())
}

/// Checks one alert and makes its message from the group's `template`.
fn to_message(
    i: usize,
    alert: WebhookAlert,
    template: &AlertReceived,
) -> Result<AlertReceived, Problem> {
    check_status(&format!("alerts[{i}].status"), &alert.status)?;
    let fingerprint = match alert.fingerprint {
        Some(f) if !f.is_empty() => f,
        _ => return Err(invalid(format!("alerts[{i}].fingerprint: missing"))),
    };
    // The fingerprint goes into the dedup id, which travels as a NATS
    // header: no spaces or control characters, and a sane length.
    if fingerprint.len() > MAX_FINGERPRINT || !fingerprint.chars().all(|c| c.is_ascii_graphic()) {
        return Err(invalid(format!(
            "alerts[{i}].fingerprint: must be at most {MAX_FINGERPRINT} printable ASCII characters without spaces"
        )));
    }
    // Alertmanager sends Go's zero time as the end of a firing alert.
    let ends_at = alert.ends_at.filter(|t| *t != GO_ZERO_TIME);
    let resolved = alert.status == "resolved";
    let mut message_id = format!(
        "alert:{fingerprint}:{}:{}",
        alert.status,
        stamp(alert.starts_at)
    );
    if resolved {
        let Some(end) = ends_at else {
            return Err(invalid(format!(
                "alerts[{i}].endsAt: a resolved alert needs its end time"
            )));
        };
        message_id.push(':');
        message_id.push_str(&stamp(end));
    }

    let mut msg = template.clone();
    if let Some(env) = msg.envelope.as_mut() {
        env.message_id = message_id;
    }
    msg.alert = Some(Alert {
        status: alert.status,
        labels: alert.labels,
        annotations: alert.annotations,
        starts_at: Some(timestamp(alert.starts_at)),
        ends_at: ends_at.map(timestamp),
        generator_url: alert.generator_url,
        fingerprint,
    });
    Ok(msg)
}

/// Go's zero `time.Time`, `0001-01-01T00:00:00Z`.
const GO_ZERO_TIME: OffsetDateTime = time::macros::datetime!(0001-01-01 0:00 UTC);

fn check_status(key: &str, status: &str) -> Result<(), Problem> {
    if status == "firing" || status == "resolved" {
        Ok(())
    } else {
        Err(invalid(format!(
            "{key}: `{status}` is neither `firing` nor `resolved`"
        )))
    }
}

fn invalid(detail: String) -> Problem {
    Problem::new(Kind::InvalidPayload, detail)
}

fn unsupported_version(version: &str) -> Problem {
    Problem::new(
        Kind::UnsupportedVersion,
        format!(
            "version: payload version `{version}` is not supported; this receiver reads version `{VERSION}`"
        ),
    )
}

/// The payload's version when it is a string other than the one this
/// service reads.
fn other_version(body: &[u8]) -> Option<String> {
    let probe: VersionOnly = serde_json::from_slice(body).ok()?;
    probe.version.0.filter(|v| v != VERSION)
}

/// A time as it appears in dedup ids: UTC, always nine fractional digits.
/// Fixed width, so the same instant always gives the same id however the
/// sender wrote it (Go trims trailing zeros, offsets vary).
fn stamp(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.nanosecond()
    )
}

fn timestamp(t: OffsetDateTime) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.unix_timestamp(),
        // Always below 10^9, so it fits.
        nanos: i32::try_from(t.nanosecond()).unwrap_or(0),
    }
}

fn rfc3339<'de, D: Deserializer<'de>>(d: D) -> Result<OffsetDateTime, D::Error> {
    let s = String::deserialize(d)?;
    parse_time(&s).map_err(serde::de::Error::custom)
}

fn rfc3339_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OffsetDateTime>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| parse_time(&s))
        .transpose()
        .map_err(serde::de::Error::custom)
}

fn parse_time(s: &str) -> Result<OffsetDateTime, String> {
    OffsetDateTime::parse(s, &Rfc3339).map_err(|e| format!("`{s}` is not an RFC 3339 time: {e}"))
}

/// Go marshals a nil map as `null`; treat it as empty.
fn map_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<HashMap<String, String>, D::Error> {
    Ok(Option::<HashMap<String, String>>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A group of two alerts as Alertmanager 0.25 sends it.
    fn payload() -> Value {
        json!({
            "receiver": "nisse",
            "status": "firing",
            "alerts": [
                {
                    "status": "firing",
                    "labels": {"alertname": "DiskFull", "instance": "nas:9100", "severity": "critical"},
                    "annotations": {"summary": "Disk almost full", "description": "/ is at 97%"},
                    "startsAt": "2024-05-01T10:00:00.123456789+02:00",
                    "endsAt": "0001-01-01T00:00:00Z",
                    "generatorURL": "http://prometheus:9090/graph?g0.expr=disk",
                    "fingerprint": "6934e8a3b3b6e0d1"
                },
                {
                    "status": "resolved",
                    "labels": {"alertname": "DiskFull", "instance": "pi:9100"},
                    "annotations": {},
                    "startsAt": "2024-05-01T08:00:00Z",
                    "endsAt": "2024-05-01T08:30:00.5Z",
                    "generatorURL": "",
                    "fingerprint": "0123456789abcdef"
                }
            ],
            "groupLabels": {"alertname": "DiskFull"},
            "commonLabels": {"alertname": "DiskFull"},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093",
            "version": "4",
            "groupKey": "{}:{alertname=\"DiskFull\"}",
            "truncatedAlerts": 2
        })
    }

    fn limits(max_alerts: usize) -> Limits {
        Limits {
            max_alerts,
            max_expanded: ByteSize::mib(64),
        }
    }

    fn parse_value(v: &Value) -> Result<Accepted, Problem> {
        parse(&serde_json::to_vec(v).unwrap(), "ops", limits(100))
    }

    fn refused(v: &Value) -> Problem {
        parse_value(v).unwrap_err()
    }

    #[test]
    fn maps_every_field_of_every_alert() {
        let got = parse_value(&payload()).unwrap();
        assert_eq!(got.receiver, "nisse");
        assert_eq!(got.group_key, "{}:{alertname=\"DiskFull\"}");
        assert_eq!(got.messages.len(), 2);

        let m = &got.messages[0];
        let env = m.envelope.as_ref().unwrap();
        assert_eq!(env.agent, "ops");
        assert_eq!(env.work_item_id, "");
        assert_eq!(
            env.actor,
            Some(Actor {
                kind: ActorKind::External.into(),
                id: "alertmanager:nisse".into()
            })
        );
        // UTC, nine digits: 10:00+02:00 is 08:00Z.
        assert_eq!(
            env.message_id,
            "alert:6934e8a3b3b6e0d1:firing:2024-05-01T08:00:00.123456789Z"
        );
        assert_eq!(m.payload_version, "4");
        assert_eq!(m.receiver, "nisse");
        assert_eq!(m.group_status, "firing");
        assert_eq!(m.group_key, "{}:{alertname=\"DiskFull\"}");
        assert_eq!(m.group_labels["alertname"], "DiskFull");
        assert_eq!(m.common_labels["alertname"], "DiskFull");
        assert!(m.common_annotations.is_empty());
        assert_eq!(m.external_url, "http://alertmanager:9093");
        assert_eq!(m.truncated_alerts, 2);
        let a = m.alert.as_ref().unwrap();
        assert_eq!(a.status, "firing");
        assert_eq!(a.labels.len(), 3);
        assert_eq!(a.labels["instance"], "nas:9100");
        assert_eq!(a.annotations["description"], "/ is at 97%");
        assert_eq!(
            a.starts_at,
            Some(prost_types::Timestamp {
                seconds: 1_714_550_400,
                nanos: 123_456_789
            })
        );
        assert_eq!(a.ends_at, None, "Go's zero time means still firing");
        assert_eq!(a.generator_url, "http://prometheus:9090/graph?g0.expr=disk");
        assert_eq!(a.fingerprint, "6934e8a3b3b6e0d1");

        let m = &got.messages[1];
        assert_eq!(
            m.envelope.as_ref().unwrap().message_id,
            "alert:0123456789abcdef:resolved:2024-05-01T08:00:00.000000000Z:2024-05-01T08:30:00.500000000Z"
        );
        let a = m.alert.as_ref().unwrap();
        assert_eq!(a.status, "resolved");
        assert_eq!(
            a.ends_at,
            Some(prost_types::Timestamp {
                seconds: 1_714_552_200,
                nanos: 500_000_000
            })
        );
        // Group fields are copied into each message.
        assert_eq!(m.group_key, got.messages[0].group_key);
        assert_eq!(m.truncated_alerts, 2);
    }

    #[test]
    fn tolerates_null_maps_absent_optionals_and_unknown_fields() {
        let mut v = payload();
        v["commonAnnotations"] = Value::Null;
        v["alerts"][0]["annotations"] = Value::Null;
        v["alerts"][0].as_object_mut().unwrap().remove("endsAt");
        v["alerts"][0]
            .as_object_mut()
            .unwrap()
            .remove("generatorURL");
        v["someFutureField"] = json!(1);
        let got = parse_value(&v).unwrap();
        let a = got.messages[0].alert.as_ref().unwrap();
        assert!(a.annotations.is_empty());
        assert_eq!(a.ends_at, None);
        assert_eq!(a.generator_url, "");
    }

    #[test]
    fn malformed_json_names_the_position() {
        let p = parse(b"{\"version\": \"4\",", "ops", limits(100)).unwrap_err();
        assert_eq!(p.kind(), Kind::InvalidJson);
        assert!(p.detail().contains("line 1 column"), "{}", p.detail());

        let p = parse(b"{} trailing", "ops", limits(100)).unwrap_err();
        assert_eq!(p.kind(), Kind::InvalidJson);
    }

    #[test]
    fn bad_time_names_the_alert_and_field() {
        let mut v = payload();
        v["alerts"][1]["startsAt"] = json!("yesterday");
        let p = refused(&v);
        assert_eq!(p.kind(), Kind::InvalidJson);
        assert!(
            p.detail()
                .starts_with("alerts[1].startsAt: `yesterday` is not an RFC 3339 time"),
            "{}",
            p.detail()
        );

        let mut v = payload();
        v["alerts"][0]["endsAt"] = json!("2024-13-01T00:00:00Z");
        assert!(refused(&v).detail().starts_with("alerts[0].endsAt:"));
    }

    #[test]
    fn wrong_shape_names_the_path() {
        let mut v = payload();
        v["alerts"][0]["labels"] = json!({"a": 1});
        let p = refused(&v);
        assert_eq!(p.kind(), Kind::InvalidJson);
        assert!(
            p.detail().starts_with("alerts[0].labels.a:"),
            "{}",
            p.detail()
        );

        let mut v = payload();
        v.as_object_mut().unwrap().remove("groupKey");
        assert!(refused(&v).detail().contains("groupKey"));
    }

    #[test]
    fn other_versions_are_named_even_in_another_shape() {
        let mut v = payload();
        v["version"] = json!("5");
        let p = refused(&v);
        assert_eq!(p.kind(), Kind::UnsupportedVersion);
        assert_eq!(p.status(), axum::http::StatusCode::UNPROCESSABLE_ENTITY);
        assert!(p.detail().contains("`5`"), "{}", p.detail());

        let p = refused(&json!({"version": "3", "alerts": "elsewhere"}));
        assert_eq!(p.kind(), Kind::UnsupportedVersion);
        assert!(p.detail().contains("`3`"), "{}", p.detail());
    }

    #[test]
    fn missing_fingerprint_or_bad_status_names_the_alert() {
        let mut v = payload();
        v["alerts"][1]
            .as_object_mut()
            .unwrap()
            .remove("fingerprint");
        let p = refused(&v);
        assert_eq!(p.kind(), Kind::InvalidPayload);
        assert_eq!(p.detail(), "alerts[1].fingerprint: missing");

        let mut v = payload();
        v["alerts"][0]["fingerprint"] = json!("a b\r\nX-Evil: 1");
        assert!(refused(&v).detail().starts_with("alerts[0].fingerprint:"));

        let mut v = payload();
        v["alerts"][0]["status"] = json!("pending");
        let p = refused(&v);
        assert_eq!(p.kind(), Kind::InvalidPayload);
        assert!(p.detail().starts_with("alerts[0].status: `pending`"));

        let mut v = payload();
        v["status"] = json!("unknown");
        assert!(refused(&v).detail().starts_with("status:"));
    }

    #[test]
    fn resolved_alert_needs_an_end() {
        let mut v = payload();
        v["alerts"][1]["endsAt"] = json!("0001-01-01T00:00:00Z");
        let p = refused(&v);
        assert_eq!(p.kind(), Kind::InvalidPayload);
        assert!(
            p.detail().starts_with("alerts[1].endsAt:"),
            "{}",
            p.detail()
        );
    }

    #[test]
    fn alert_count_is_bounded_and_not_zero() {
        let p = parse(&serde_json::to_vec(&payload()).unwrap(), "ops", limits(1)).unwrap_err();
        assert_eq!(p.kind(), Kind::TooManyAlerts);
        assert_eq!(p.status(), axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        assert!(p.detail().contains("limit is 1 "), "{}", p.detail());

        let mut v = payload();
        v["alerts"] = json!([]);
        let p = refused(&v);
        assert_eq!(p.kind(), Kind::InvalidPayload);
        assert!(p.detail().contains("no alerts"));
    }

    #[test]
    fn the_same_instant_always_gives_the_same_id() {
        let mut a = payload();
        let mut b = payload();
        a["alerts"][0]["startsAt"] = json!("2024-05-01T08:00:00.1Z");
        b["alerts"][0]["startsAt"] = json!("2024-05-01T10:00:00.100000000+02:00");
        let id = |v: &Value| {
            parse_value(v).unwrap().messages[0]
                .envelope
                .as_ref()
                .unwrap()
                .message_id
                .clone()
        };
        assert_eq!(id(&a), id(&b));
        assert_eq!(
            id(&a),
            "alert:6934e8a3b3b6e0d1:firing:2024-05-01T08:00:00.100000000Z"
        );
    }

    /// `n` alerts whose group carries `common` bytes of common labels,
    /// in `labels` labels.
    fn amplified(n: usize, labels: usize, common: usize) -> Value {
        let mut v = payload();
        let alert = v["alerts"][0].clone();
        v["alerts"] = (0..n)
            .map(|i| {
                let mut a = alert.clone();
                a["fingerprint"] = json!(format!("{i:016x}"));
                a
            })
            .collect();
        let value = "x".repeat(common / labels);
        v["commonLabels"] = (0..labels)
            .map(|i| (format!("l{i}"), json!(value)))
            .collect::<serde_json::Map<_, _>>()
            .into();
        v
    }

    #[test]
    fn the_expanded_size_counts_the_group_once_per_alert() {
        // 100 alerts carrying 100 KiB of common labels each: about 10 MiB
        // as messages, from a body of about 140 KiB.
        let v = amplified(100, 10, 100 * 1024);
        let body = serde_json::to_vec(&v).unwrap();
        assert!(body.len() < 150 * 1024, "{}", body.len());
        let shape = measure(&body).unwrap();
        assert_eq!(shape.alerts.count, 100);
        let expanded = shape.expanded("ops");
        assert!(
            (100 * 100 * 1024..11 * 1024 * 1024).contains(&expanded),
            "{expanded}"
        );

        let tight = Limits {
            max_alerts: 100,
            max_expanded: ByteSize::mib(8),
        };
        let p = parse(&body, "ops", tight).unwrap_err();
        assert_eq!(p.kind(), Kind::ExpansionTooLarge);
        assert_eq!(p.status(), axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        for needle in [
            "100 alerts",
            &format!("({expanded} bytes)"),
            "8.0 MiB",
            "intake-alerts.max-expanded",
        ] {
            assert!(p.detail().contains(needle), "{needle}: {}", p.detail());
        }
        let roomy = Limits {
            max_alerts: 100,
            max_expanded: ByteSize::mib(16),
        };
        assert_eq!(parse(&body, "ops", roomy).unwrap().messages.len(), 100);

        // The same labels on one alert only are no amplification.
        let one = serde_json::to_vec(&amplified(1, 10, 100 * 1024)).unwrap();
        assert!(measure(&one).unwrap().expanded("ops") < 120 * 1024);
    }

    #[test]
    fn every_alert_field_and_label_is_counted() {
        let base = measure(&serde_json::to_vec(&payload()).unwrap())
            .unwrap()
            .expanded("ops");
        // Each edit sets one field to a 10,000-byte value.
        type Edit = fn(&mut Value, Value);
        let grown = |edit: Edit| {
            let mut v = payload();
            edit(&mut v, json!("y".repeat(10_000)));
            measure(&serde_json::to_vec(&v).unwrap())
                .unwrap()
                .expanded("ops")
        };
        // Alert fields count once, group fields once per alert (two here):
        // 10,000 bytes each time, less what they replace (under 100), plus
        // a new entry's overhead.
        let edits: [(Edit, u64); 7] = [
            (|v, big| v["alerts"][0]["labels"]["big"] = big, 1),
            (|v, big| v["alerts"][1]["annotations"]["big"] = big, 1),
            (|v, big| v["alerts"][0]["generatorURL"] = big, 1),
            (|v, big| v["groupLabels"]["big"] = big, 2),
            (|v, big| v["commonAnnotations"]["big"] = big, 2),
            (|v, big| v["groupKey"] = big, 2),
            (|v, big| v["externalURL"] = big, 2),
        ];
        for (i, (edit, copies)) in edits.into_iter().enumerate() {
            let growth = grown(edit) - base;
            let expected = copies * 9_900..=copies * (10_003 + ENTRY_OVERHEAD);
            assert!(
                expected.contains(&growth),
                "edit {i}: {growth} not in {expected:?}"
            );
        }
    }

    #[test]
    fn the_first_pass_refuses_wrong_shapes_in_the_second_pass_words() {
        let mut v = payload();
        v["commonLabels"] = json!({"a": 1});
        let p = refused(&v);
        assert_eq!(p.kind(), Kind::InvalidJson);
        assert!(p.detail().starts_with("commonLabels.a:"), "{}", p.detail());
        assert!(p.detail().contains("expected a string"), "{}", p.detail());

        let mut v = payload();
        v["alerts"] = json!({"not": "a list"});
        let p = refused(&v);
        assert!(p.detail().starts_with("alerts:"), "{}", p.detail());

        let mut v = payload();
        v["groupLabels"] = Value::Null;
        v["alerts"][1]["labels"] = Value::Null;
        assert!(parse_value(&v).is_ok());
    }

    #[test]
    fn a_version_that_is_not_a_string_is_skipped_not_kept() {
        // A huge array as the version is no version to name, and the
        // probe reads past it without building it.
        let body = format!("{{\"version\": [{}0]}}", "0,".repeat(100_000));
        assert_eq!(other_version(body.as_bytes()), None);
        let p = parse(body.as_bytes(), "ops", limits(100)).unwrap_err();
        assert_eq!(p.kind(), Kind::InvalidJson);
        assert_eq!(
            other_version(br#"{"version": "5", "x": [1, {"a": 2}]}"#),
            Some("5".into())
        );
        assert_eq!(other_version(br#"{"version": "4"}"#), None);
    }
}
