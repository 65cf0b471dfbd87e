//! The webhook as Alertmanager's HTTP client sees it: payloads posted
//! directly, and what ends up in the stream.

use std::collections::HashMap;
use std::time::Duration;

use bytesize::ByteSize;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use nisse_intake_alerts::BasicAuth;
use nisse_proto::v1::{Actor, ActorKind, Alert, AlertReceived, Envelope};
use nisse_tests::alertmanager::{amplification_body, memory, reset_peak_memory};

use super::{Intake, config, eventually, nats, post_as, read, stored, stored_count};

const PROBLEM: &str = "application/problem+json";

/// One alert as Alertmanager writes it. `i` picks the instance and the
/// fingerprint, so alerts of different `i` are different alerts.
fn alert(i: usize) -> Value {
    json!({
        "status": "firing",
        "labels": {
            "alertname": "DiskFull",
            "instance": format!("host-{i}:9100"),
            "job": "node",
            "mountpoint": "/",
            "severity": "warning"
        },
        "annotations": {
            "summary": format!("Disk on host-{i} is almost full"),
            "description": "/ has 3% space left",
            "runbook_url": "https://runbooks.example/disk-full"
        },
        "startsAt": "2024-05-01T10:00:00.5+02:00",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.example:9090/graph?g0.expr=node_filesystem_avail_bytes+%3C+0.05&g0.tab=1",
        "fingerprint": format!("{:016x}", 0xd15c_0000_u64 + i as u64)
    })
}

/// A webhook body (version 4) around `alerts`.
fn group(alerts: Vec<Value>) -> Value {
    json!({
        "receiver": "nisse-ops",
        "status": "firing",
        "alerts": alerts,
        "groupLabels": {"alertname": "DiskFull"},
        "commonLabels": {"alertname": "DiskFull", "job": "node", "mountpoint": "/"},
        "commonAnnotations": {"description": "/ has 3% space left"},
        "externalURL": "http://alertmanager.example:9093",
        "version": "4",
        "groupKey": "{}/{severity=~\"warning|critical\"}:{alertname=\"DiskFull\"}",
        "truncatedAlerts": 1
    })
}

/// Three alerts: two firing, one resolved.
fn three() -> Value {
    let mut resolved = alert(2);
    resolved["status"] = json!("resolved");
    resolved["startsAt"] = json!("2024-05-01T07:00:00Z");
    resolved["endsAt"] = json!("2024-05-01T07:45:30.25Z");
    group(vec![alert(0), alert(1), resolved])
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// Posts `body` to the webhook with chunked transfer encoding (no declared
/// length), over a raw connection since the HTTP client always declares
/// one, with the receiver's token. Returns the response head and body.
async fn post_chunked(intake: &Intake, body: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let addr = intake.base.trim_start_matches("http://");
    let token = intake.token.as_deref().unwrap();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!(
        "POST /api/v1/alerts HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for chunk in body.as_bytes().chunks(8192) {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    // The server may answer and close before taking the whole body; the
    // answer is what counts.
    let _ = conn.write_all(&request).await;
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (head.to_string(), body.to_string())
}

/// Asserts a problem response: status, media type, and a detail
/// containing every one of `needles`.
async fn assert_problem(response: reqwest::Response, status: u16, needles: &[&str]) -> Value {
    let (got, content_type, body) = read(response).await;
    assert_eq!(got, status, "{body}");
    assert_eq!(content_type, PROBLEM);
    assert_eq!(body["status"], status);
    assert!(
        body["type"]
            .as_str()
            .unwrap()
            .starts_with("https://nisse.invalid/problems/"),
        "{body}"
    );
    assert!(body["title"].is_string(), "{body}");
    let detail = body["detail"].as_str().unwrap();
    for needle in needles {
        assert!(
            detail.contains(needle),
            "`{needle}` not in detail: {detail}"
        );
    }
    body
}

/// Posts `body` with the `Authorization` header `auth` (none when `None`)
/// and asserts a 401 asking for a bearer token, its detail holding
/// `needle`.
async fn assert_unauthorized(intake: &Intake, body: &Value, auth: Option<&str>, needle: &str) {
    let response = post_as(&intake.url, body.to_string(), |r| match auth {
        Some(a) => r.header("authorization", a),
        None => r,
    })
    .await;
    assert_eq!(
        response.headers()["www-authenticate"],
        "Bearer realm=\"nisse\""
    );
    assert_problem(response, 401, &[needle]).await;
}

#[tokio::test]
async fn a_valid_payload_stores_each_alert_once_with_every_field() {
    let (_nats, bus) = nats().await;
    let intake = Intake::start(&config(), &bus).await;

    let health = reqwest::get(format!("{}/healthz", intake.base))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let ready = reqwest::get(format!("{}/readyz", intake.base))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);

    let (status, content_type, body) = read(intake.post(&three()).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(content_type, "application/json");
    assert_eq!(body, json!({"accepted": 3, "duplicates": 0}));

    let messages = stored(&bus).await;
    let ids: Vec<&str> = messages
        .iter()
        .map(|(_, m)| m.envelope.as_ref().unwrap().message_id.as_str())
        .collect();
    assert_eq!(
        ids,
        [
            "alert:00000000d15c0000:firing:2024-05-01T08:00:00.500000000Z",
            "alert:00000000d15c0001:firing:2024-05-01T08:00:00.500000000Z",
            "alert:00000000d15c0002:resolved:2024-05-01T07:00:00.000000000Z:2024-05-01T07:45:30.250000000Z",
        ]
    );
    for (stored, m) in &messages {
        assert_eq!(stored.subject, "nisse.ops.in.alert");
        assert_eq!(
            stored.header("Nats-Msg-Id"),
            Some(m.envelope.as_ref().unwrap().message_id.as_str())
        );
        assert_eq!(stored.header("Nisse-Type"), Some("nisse.v1.AlertReceived"));
    }

    // Every field of the payload, for the resolved one.
    let (_, got) = &messages[2];
    let env = got.envelope.as_ref().unwrap();
    assert!(env.created_at.is_some());
    let expected = AlertReceived {
        envelope: Some(Envelope {
            agent: "ops".into(),
            work_item_id: String::new(),
            actor: Some(Actor {
                kind: ActorKind::External.into(),
                id: "alertmanager:nisse-ops".into(),
            }),
            causation_id: String::new(),
            trace: env.trace.clone(),
            created_at: env.created_at,
            message_id: env.message_id.clone(),
        }),
        payload_version: "4".into(),
        receiver: "nisse-ops".into(),
        group_status: "firing".into(),
        group_key: "{}/{severity=~\"warning|critical\"}:{alertname=\"DiskFull\"}".into(),
        group_labels: map(&[("alertname", "DiskFull")]),
        common_labels: map(&[("alertname", "DiskFull"), ("job", "node"), ("mountpoint", "/")]),
        common_annotations: map(&[("description", "/ has 3% space left")]),
        external_url: "http://alertmanager.example:9093".into(),
        truncated_alerts: 1,
        alert: Some(Alert {
            status: "resolved".into(),
            labels: map(&[
                ("alertname", "DiskFull"),
                ("instance", "host-2:9100"),
                ("job", "node"),
                ("mountpoint", "/"),
                ("severity", "warning"),
            ]),
            annotations: map(&[
                ("summary", "Disk on host-2 is almost full"),
                ("description", "/ has 3% space left"),
                ("runbook_url", "https://runbooks.example/disk-full"),
            ]),
            starts_at: Some(prost_types::Timestamp {
                seconds: 1_714_546_800,
                nanos: 0,
            }),
            ends_at: Some(prost_types::Timestamp {
                seconds: 1_714_549_530,
                nanos: 250_000_000,
            }),
            generator_url: "http://prometheus.example:9090/graph?g0.expr=node_filesystem_avail_bytes+%3C+0.05&g0.tab=1".into(),
            fingerprint: "00000000d15c0002".into(),
        }),
    };
    assert_eq!(got, &expected);
    // A firing alert has no end.
    let firing = messages[0].1.alert.as_ref().unwrap();
    assert_eq!(firing.ends_at, None);
    assert_eq!(
        firing.starts_at,
        Some(prost_types::Timestamp {
            seconds: 1_714_550_400,
            nanos: 500_000_000
        })
    );

    // Alertmanager retrying the same notification stores nothing new.
    let (status, _, body) = read(intake.post(&three()).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"accepted": 3, "duplicates": 3}));
    assert_eq!(stored_count(&bus).await, 3);

    intake.stop().await;
}

#[tokio::test]
async fn credentials_are_checked_before_anything_is_stored() {
    let (_nats, bus) = nats().await;
    let one = group(vec![alert(0)]);

    let mut cfg = config();
    cfg.auth.bearer_token = Some("am-token".into());
    let intake = Intake::start(&cfg, &bus).await;
    for (auth, needle) in [
        (None, "requires bearer"),
        (Some("Bearer wrong"), "not valid"),
    ] {
        assert_unauthorized(&intake, &one, auth, needle).await;
    }
    // Basic credentials are not a bearer token.
    let response = post_as(&intake.url, one.to_string(), |r| {
        r.basic_auth("am", Some("am-token"))
    })
    .await;
    assert_problem(response, 401, &["requires bearer"]).await;
    assert_eq!(stored_count(&bus).await, 0);

    let response = post_as(&intake.url, one.to_string(), |r| r.bearer_auth("am-token")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(stored_count(&bus).await, 1);
    // Configured credentials: no token is generated beside them.
    let data = intake.stop().await;
    assert!(!nisse_intake_alerts::generated_token_file(data.path()).exists());

    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "s3cret\n").unwrap();
    let mut cfg = config();
    cfg.auth.basic = Some(BasicAuth {
        username: "alertmanager".into(),
        password: None,
        password_file: Some(password_file),
    });
    let intake = Intake::start(&cfg, &bus).await;
    let two = group(vec![alert(1)]);
    for (user, password) in [("alertmanager", "wrong"), ("someone", "s3cret")] {
        let response = post_as(&intake.url, two.to_string(), |r| {
            r.basic_auth(user, Some(password))
        })
        .await;
        assert_eq!(
            response.headers()["www-authenticate"],
            "Basic realm=\"nisse\", charset=\"UTF-8\""
        );
        assert_problem(response, 401, &["not valid"]).await;
    }
    let response = post_as(&intake.url, two.to_string(), |r| r).await;
    assert_problem(response, 401, &["requires basic"]).await;
    assert_eq!(stored_count(&bus).await, 1);

    let response = post_as(&intake.url, two.to_string(), |r| {
        r.basic_auth("alertmanager", Some("s3cret"))
    })
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(stored_count(&bus).await, 2);
    intake.stop().await;
}

#[tokio::test]
async fn without_configured_credentials_a_generated_token_is_required() {
    use std::os::unix::fs::PermissionsExt as _;

    let (_nats, bus) = nats().await;
    let intake = Intake::start(&config(), &bus).await;
    let token_file = intake.token_file.clone().unwrap();
    assert_eq!(
        token_file,
        intake
            .data
            .path()
            .join("credentials/alertmanager-webhook.token")
    );
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&token_file), 0o600);
    assert_eq!(mode(token_file.parent().unwrap()), 0o700);
    let token = intake.token.clone().unwrap();
    assert!(token.len() >= 64, "{token}");

    let one = group(vec![alert(0)]);
    for (auth, needle) in [
        (None, "requires bearer"),
        (Some("Bearer not-the-token".to_string()), "not valid"),
        // The file's path is no credential.
        (
            Some(format!("Bearer {}", token_file.display())),
            "not valid",
        ),
    ] {
        assert_unauthorized(&intake, &one, auth.as_deref(), needle).await;
    }
    assert_eq!(stored_count(&bus).await, 0);
    let (status, _, body) = read(intake.post(&one).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stored_count(&bus).await, 1);

    // The next start on the same data directory keeps the token: what
    // Alertmanager was configured with still works.
    let data = intake.stop().await;
    let intake = Intake::start_in(&config(), &bus, data).await;
    assert_eq!(intake.token.as_deref(), Some(token.as_str()));
    let response = post_as(&intake.url, group(vec![alert(1)]).to_string(), |r| {
        r.bearer_auth(&token)
    })
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(stored_count(&bus).await, 2);
    intake.stop().await;
}

/// The process's peak memory may grow by this much while it refuses the
/// 16 MiB amplification body: the body the receiver buffers (the test's
/// own copy exists before the measure starts), and 16 MiB for the HTTP
/// client's and server's buffers. Nothing in proportion to the ~140 GB
/// the alerts would expand to. docs/ARCHITECTURE.md states the same bound.
const AMPLIFICATION_GROWTH: u64 = 32 * 1024 * 1024;

#[tokio::test]
async fn an_amplifying_body_is_refused_before_expansion_with_memory_bounded() {
    let (_nats, bus) = nats().await;
    let intake = Intake::start(&config(), &bus).await;
    let limit = 16 * 1024 * 1024;
    let body = amplification_body(limit);
    let size = body.len();
    assert!((limit - 256 * 1024..=limit).contains(&size), "{size}");

    let before = memory("self").unwrap().resident;
    reset_peak_memory("self").unwrap();
    let response = intake.post_with(body, |r| r).await;
    let peak = memory("self").unwrap().peak;
    let problem = assert_problem(
        response,
        413,
        &[
            "10000 alerts",
            "64.0 MiB",
            "intake-alerts.max-expanded",
            "GiB",
        ],
    )
    .await;
    assert_eq!(
        problem["type"],
        "https://nisse.invalid/problems/expansion-too-large"
    );
    // The computed size, in bytes: at least the group's labels once per
    // alert.
    let detail = problem["detail"].as_str().unwrap();
    let bytes: u64 = detail
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(" bytes)"))
        .map(|(n, _)| n.parse().unwrap())
        .unwrap_or_else(|| panic!("no size in bytes in: {detail}"));
    assert!(
        bytes > 10_000 * 13 * 1024 * 1024,
        "{bytes} for a {size}-byte body"
    );
    let growth = peak.saturating_sub(before);
    eprintln!(
        "refusing a {size}-byte body that expands to {bytes} bytes: peak resident memory {} MiB above the {} MiB before",
        growth / (1024 * 1024),
        before / (1024 * 1024)
    );
    assert!(
        growth < AMPLIFICATION_GROWTH,
        "resident memory grew by {growth} bytes (bound {AMPLIFICATION_GROWTH})"
    );
    assert_eq!(stored_count(&bus).await, 0);

    // A body within the budget still passes.
    let (status, _, body) = read(intake.post(&three()).await).await;
    assert_eq!(status, 200, "{body}");
    intake.stop().await;
}

#[tokio::test]
async fn an_alert_larger_than_the_bus_takes_gets_413_not_a_503_retried_forever() {
    let (_nats, bus) = nats().await;
    let intake = Intake::start(&config(), &bus).await;
    // Well within the body and expansion budgets, but one message over the
    // NATS server's 1 MiB max_payload: no retry could ever store it.
    let mut big = alert(1);
    big["annotations"]["description"] = json!("x".repeat(1_100_000));
    let response = intake.post(&group(vec![alert(0), big])).await;
    let problem = assert_problem(
        response,
        413,
        &["alerts[1]", "max_payload", "nothing was stored"],
    )
    .await;
    assert_eq!(
        problem["type"],
        "https://nisse.invalid/problems/message-too-large"
    );
    assert_eq!(stored_count(&bus).await, 0, "not even the small one");
    intake.stop().await;
}

#[tokio::test]
async fn bad_requests_get_a_problem_naming_what_is_wrong_and_store_nothing() {
    let (_nats, bus) = nats().await;
    let mut cfg = config();
    cfg.max_body = ByteSize::kib(64);
    cfg.max_alerts = 5;
    let intake = Intake::start(&cfg, &bus).await;

    // Malformed JSON: the position.
    let truncated = &three().to_string()[..100];
    let response = intake.post_with(truncated.to_string(), |r| r).await;
    assert_problem(response, 400, &["line 1 column"]).await;

    // Another payload version.
    let mut v = three();
    v["version"] = json!("5");
    assert_problem(intake.post(&v).await, 422, &["version", "`5`"]).await;

    // A bad time in the second alert: the first, valid one is not stored
    // either.
    let mut v = three();
    v["alerts"][1]["startsAt"] = json!("2024-05-01 10:00");
    assert_problem(
        intake.post(&v).await,
        400,
        &["alerts[1].startsAt", "RFC 3339"],
    )
    .await;

    // No fingerprint.
    let mut v = three();
    v["alerts"][2]
        .as_object_mut()
        .unwrap()
        .remove("fingerprint");
    assert_problem(intake.post(&v).await, 422, &["alerts[2].fingerprint"]).await;

    // An unknown status.
    let mut v = three();
    v["alerts"][0]["status"] = json!("pending");
    assert_problem(intake.post(&v).await, 422, &["alerts[0].status"]).await;

    // Larger than max-body, both declared and streamed without a length.
    let big = group((0..200).map(alert).collect());
    assert!(big.to_string().len() > 64 * 1024);
    assert_problem(intake.post(&big).await, 413, &["64.0 KiB", "max-body"]).await;
    let (head, body) = post_chunked(&intake, &big.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(head.to_ascii_lowercase().contains(PROBLEM), "{head}");
    assert!(body.contains("64.0 KiB"), "{body}");

    // More alerts than max-alerts.
    let six = group((0..6).map(alert).collect());
    assert_problem(intake.post(&six).await, 413, &["6 alerts", "limit is 5"]).await;

    // No alerts.
    assert_problem(intake.post(&group(vec![])).await, 422, &["no alerts"]).await;

    // Not JSON.
    let response = reqwest::Client::new()
        .post(&intake.url)
        .bearer_auth(intake.token.as_deref().unwrap())
        .header("content-type", "text/plain")
        .body(three().to_string())
        .send()
        .await
        .unwrap();
    assert_problem(response, 415, &["`text/plain`"]).await;

    // Wrong method, unknown path.
    let response = reqwest::get(&intake.url).await.unwrap();
    assert_eq!(response.headers()["allow"], "POST");
    assert_problem(response, 405, &["POST"]).await;
    let response = reqwest::get(format!("{}/nope", intake.base)).await.unwrap();
    assert_problem(response, 404, &["/nope"]).await;

    assert_eq!(stored_count(&bus).await, 0);
    intake.stop().await;
}

#[tokio::test]
async fn ten_thousand_alerts_in_one_request_are_all_stored() {
    let (_nats, bus) = nats().await;
    let intake = Intake::start(&config(), &bus).await;
    let body = group((0..10_000).map(alert).collect());

    let started = std::time::Instant::now();
    let (status, _, body) = read(intake.post(&body).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"accepted": 10_000, "duplicates": 0}));
    assert_eq!(stored_count(&bus).await, 10_000);
    eprintln!("10,000 alerts stored in {:?}", started.elapsed());
    intake.stop().await;
}

#[tokio::test]
async fn a_nats_outage_answers_503_and_the_retry_stores_every_alert_once() {
    let (mut nats, bus) = nats().await;
    let mut cfg = config();
    cfg.publish_timeout = Duration::from_secs(1);
    let intake = Intake::start(&cfg, &bus).await;
    let readyz = format!("{}/readyz", intake.base);

    nats.kill().await.unwrap();
    let response = eventually("/readyz to answer 503", Duration::from_secs(10), || async {
        let r = reqwest::get(&readyz).await.unwrap();
        (r.status() == 503).then_some(r)
    })
    .await;
    assert_eq!(response.headers()["retry-after"], "5");
    assert_problem(response, 503, &["NATS connection is"]).await;

    let response = intake.post(&three()).await;
    assert!(response.headers().contains_key("retry-after"));
    assert_problem(response, 503, &["publish-timeout", "retrying is safe"]).await;

    nats.restart().await.unwrap();
    let body = eventually(
        "the retried POST to succeed",
        Duration::from_secs(30),
        || async {
            let (status, _, body) = read(intake.post(&three()).await).await;
            (status == 200).then_some(body)
        },
    )
    .await;
    assert_eq!(body["accepted"], 3);
    let ready = reqwest::get(&readyz).await.unwrap();
    assert_eq!(ready.status(), 200);

    // Publishes of the failed request may have reached the server after it
    // came back; with the retry's they are one copy of each alert.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut ids: Vec<String> = stored(&bus)
        .await
        .into_iter()
        .map(|(_, m)| m.envelope.unwrap().message_id)
        .collect();
    ids.sort();
    assert_eq!(ids.len(), 3, "{ids:?}");
    ids.dedup();
    assert_eq!(ids.len(), 3, "{ids:?}");
    intake.stop().await;
}

#[tokio::test]
async fn unauthenticated_posts_are_taken_on_loopback_only_when_allowed() {
    let (_nats, bus) = nats().await;
    let mut cfg = config();
    cfg.auth.allow_unauthenticated = true;
    let intake = Intake::start(&cfg, &bus).await;
    assert_eq!(intake.token_file, None);
    let response = post_as(&intake.url, group(vec![alert(0)]).to_string(), |r| r).await;
    assert_eq!(response.status(), 200);
    assert_eq!(stored_count(&bus).await, 1);
    let data = intake.stop().await;
    // No token was made for it.
    assert!(!nisse_intake_alerts::generated_token_file(data.path()).exists());

    // Beyond loopback it is refused, naming the address and the setting.
    cfg.listen = "0.0.0.0:0".parse().unwrap();
    let err = nisse_intake_alerts::bind(&cfg, bus.clone(), data.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("0.0.0.0:0"), "{err}");
    assert!(err.contains("allow-unauthenticated"), "{err}");

    // There the generated token (or configured credentials) is required.
    cfg.auth.allow_unauthenticated = false;
    let bound = nisse_intake_alerts::bind(&cfg, bus.clone(), data.path())
        .await
        .unwrap();
    assert!(bound.local_addr().ip().is_unspecified());
    assert_ne!(bound.local_addr().port(), 0);
    assert_eq!(
        bound.token_file(),
        Some(nisse_intake_alerts::generated_token_file(data.path()).as_path())
    );
    drop(bound);

    // An agent this process does not serve is refused too.
    let mut cfg = config();
    cfg.agent = "dev".into();
    let err = nisse_intake_alerts::bind(&cfg, bus, data.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("`dev`") && err.contains("ops"), "{err}");
}

#[tokio::test]
async fn shutdown_lets_a_request_in_flight_finish() {
    let (_nats, bus) = nats().await;
    let intake = Intake::start(&config(), &bus).await;
    let (url, token) = (intake.url.clone(), intake.token.clone().unwrap());
    let body = group((0..2_000).map(alert).collect());
    let request = tokio::spawn(async move {
        read(post_as(&url, body.to_string(), |r| r.bearer_auth(token)).await).await
    });
    // Stop once the request is being handled.
    eventually(
        "the request to start storing",
        Duration::from_secs(10),
        || async { (stored_count(&bus).await > 0).then_some(()) },
    )
    .await;
    intake.stop().await;
    let (status, _, body) = request.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(stored_count(&bus).await, 2_000);
}
