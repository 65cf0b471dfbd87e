//! Alertmanager's webhook payload (version 4) and its mapping to one
//! `AlertReceived` per alert.
//!
//! The payload is documented at
//! <https://prometheus.io/docs/alerting/latest/configuration/#webhook_config>.
//! Every field is kept. Everything is checked here, before anything is
//! published, so a bad request publishes nothing, not even its good alerts.

use std::collections::HashMap;

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

/// Just the version, to name a wrong version even when the rest of the
/// body has another version's shape.
#[derive(Deserialize)]
struct VersionOnly {
    version: Option<serde_json::Value>,
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
/// `agent`'s stream.
pub(crate) fn parse(body: &[u8], agent: &str, max_alerts: usize) -> Result<Accepted, Problem> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = serde_path_to_error::deserialize::<_, Webhook>(&mut de)
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
        .and_then(|hook| de.end().map(|()| hook).map_err(|e| e.to_string()));
    let hook = match parsed {
        Ok(hook) => hook,
        Err(detail) => {
            // Another version's payload may fail on its shape first; the
            // version is the better thing to tell its sender.
            if let Some(v) = other_version(body) {
                return Err(unsupported_version(&v));
            }
            return Err(Problem::new(Kind::InvalidJson, detail));
        }
    };

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
    if version != VERSION {
        return Err(unsupported_version(&version));
    }
    if alerts.len() > max_alerts {
        return Err(Problem::new(
            Kind::TooManyAlerts,
            format!(
                "the request carries {} alerts; the limit is {max_alerts} per request (intake-alerts.max-alerts; set Alertmanager's webhook `max_alerts` at or below it)",
                alerts.len()
            ),
        ));
    }
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
                id: format!("alertmanager:{receiver}"),
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
    match probe.version? {
        serde_json::Value::String(v) if v != VERSION => Some(v),
        _ => None,
    }
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

    fn parse_value(v: &Value) -> Result<Accepted, Problem> {
        parse(&serde_json::to_vec(v).unwrap(), "ops", 100)
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
        let p = parse(b"{\"version\": \"4\",", "ops", 100).unwrap_err();
        assert_eq!(p.kind(), Kind::InvalidJson);
        assert!(p.detail().contains("line 1 column"), "{}", p.detail());

        let p = parse(b"{} trailing", "ops", 100).unwrap_err();
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
        let p = parse(&serde_json::to_vec(&payload()).unwrap(), "ops", 1).unwrap_err();
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
}
