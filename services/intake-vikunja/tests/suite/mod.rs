//! Shared steps: a NATS server with the topology, the Vikunja stand-in
//! with an operator, the agent's account and a project the agent may
//! write to, the service running in-process, signed deliveries, the
//! brain's requests, and reading back what the stream holds.

mod calls;
mod poll;
mod walls;
mod webhook;

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use nisse_bus::service::Readiness;
use nisse_bus::{AnyMessage, Bus, StoredMessage};
use nisse_intake_vikunja::Config;
use nisse_proto::v1::{
    Envelope, VikunjaEvent, VikunjaRequest, VikunjaResult, vikunja_request::Call,
};
use nisse_tests::vikunja::{Permission, VikunjaStandIn};
use nisse_tests::{InProcess, TestNats};

/// The agent's Vikunja username.
const ACCOUNT: &str = "nisse";
/// The operator's.
const OPERATOR: &str = "alice";
/// The webhook's secret.
const SECRET: &str = "hook-s3cret";

/// How long a stopped service may take to finish.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A NATS server of the test's own with the topology in place, and a bus
/// for agent `ops`.
async fn nats() -> (TestNats, Bus) {
    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    (nats, bus)
}

/// [`nats`] with a duplicate window of one second, so anything published
/// twice more than a second apart would be stored twice: what a test of
/// "stored once" needs, since the usual window would hide a repeat.
async fn nats_short_window() -> (TestNats, Bus) {
    let nats = TestNats::start().await.unwrap();
    let mut cfg = nats.bus_config();
    cfg.streams.duplicate_window = Duration::from_secs(1);
    let bus = nats.bus_with(cfg, &["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    (nats, bus)
}

/// The agent's token and the webhook's secret in files of their own.
struct Secrets {
    _dir: tempfile::TempDir,
    token: PathBuf,
    secret: PathBuf,
}

impl Secrets {
    fn new(token: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("vikunja.token");
        let secret_file = dir.path().join("vikunja-hook.secret");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
        Self {
            _dir: dir,
            token: token_file,
            secret: secret_file,
        }
    }
}

/// The service's configuration for the Vikunja at `url`, serving
/// `projects`, polling every `poll` (zero: not at all), on a free
/// loopback port.
fn config(url: &str, secrets: &Secrets, projects: &[i64], poll: Duration) -> Config {
    Config {
        url: Some(url.to_string()),
        agent: "ops".into(),
        account: ACCOUNT.into(),
        token_file: Some(secrets.token.clone()),
        webhook_secret_file: Some(secrets.secret.clone()),
        listen: "127.0.0.1:0".parse().unwrap(),
        projects: projects.to_vec(),
        poll_interval: poll,
        call_timeout: Duration::from_secs(5),
        ..Config::default()
    }
}

/// The service running in-process.
struct Service {
    /// The webhook's URL.
    url: String,
    /// `http://127.0.0.1:<port>`.
    base: String,
    running: InProcess,
}

impl Service {
    /// Starts it as `nisse` does and waits until it is ready.
    async fn start(bus: &Bus, cfg: Config) -> Self {
        let readiness = Readiness::default();
        let reporter = readiness.reporter("intake-vikunja");
        let bus = bus.clone();
        let running = InProcess::spawn(move |token| {
            let mut ctx = nisse_tests::service_context(&bus, cfg, token);
            ctx.ready = reporter;
            ctx.data_dir = std::env::temp_dir();
            nisse_intake_vikunja::run(ctx)
        });
        let listeners = tokio::time::timeout(
            Duration::from_secs(30),
            readiness.wait_for(&["intake-vikunja".to_string()]),
        )
        .await
        .expect("intake-vikunja did not get ready");
        let url = listeners[nisse_intake_vikunja::LISTENER].clone();
        let base = url
            .strip_suffix(nisse_intake_vikunja::WEBHOOK_PATH)
            .unwrap()
            .to_string();
        Self { url, base, running }
    }

    async fn stop(self) {
        self.running.stop(STOP_GRACE).await.unwrap();
    }
}

/// The stand-in with the operator, the agent's account (its token
/// returned) and the operator's project, shared with the agent to write.
struct Desk {
    vikunja: VikunjaStandIn,
    token: String,
    project: i64,
}

async fn desk() -> Desk {
    let vikunja = VikunjaStandIn::start().await.unwrap();
    let token = vikunja.add_user(ACCOUNT).unwrap();
    vikunja.add_user(OPERATOR).unwrap();
    let project = vikunja.add_project(OPERATOR, "Operations").unwrap();
    vikunja
        .share_project(project, ACCOUNT, Permission::Write)
        .await
        .unwrap();
    Desk {
        vikunja,
        token,
        project,
    }
}

impl Desk {
    /// The project's webhook to `url`, for every event the service takes.
    fn hook(&self, url: &str) {
        self.vikunja
            .add_webhook(self.project, url, SECRET, &nisse_intake_vikunja::EVENTS);
    }

    /// A call to the stand-in's API as the agent's account.
    async fn api(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let response = http()
            .request(method, format!("{}{path}", self.vikunja.api_url()))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// Asserts that every delivery so far was answered `status`.
    fn all_answered(&self, status: u16) {
        for d in self.vikunja.deliveries() {
            assert_eq!(
                d.status,
                Some(status),
                "{} (attempt {}): {:?}",
                d.event,
                d.attempt,
                d.error
            );
        }
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .no_proxy()
        .build()
        .unwrap()
}

/// Vikunja's headers for `body`, signed with `secret` when given.
fn hook_headers(body: &[u8], secret: Option<&str>) -> Vec<(String, String)> {
    let mut h = vec![
        ("Content-Type".to_string(), "application/json".to_string()),
        ("User-Agent".to_string(), "Vikunja/v2.5.0".to_string()),
    ];
    if let Some(secret) = secret {
        h.push((
            "X-Vikunja-Signature".to_string(),
            nisse_intake_vikunja::sign(secret.as_bytes(), body),
        ));
    }
    h
}

/// Posts `body` with `headers` to `url`; the status and the JSON answer.
async fn post(url: &str, headers: &[(String, String)], body: &[u8]) -> (u16, Value) {
    let mut request = http().post(url).body(body.to_vec());
    for (k, v) in headers {
        request = request.header(k, v);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let json = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the answer is not JSON ({e}): {text}"));
    (status, json)
}

/// Asserts a problem document with `status` whose detail holds `needle`.
fn assert_problem(answer: &(u16, Value), status: u16, needle: &str) {
    let (got, body) = answer;
    assert_eq!(*got, status, "{body}");
    assert_eq!(body["status"], status, "{body}");
    assert!(
        body["type"]
            .as_str()
            .unwrap()
            .starts_with("https://nisse.invalid/problems/vikunja/"),
        "{body}"
    );
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains(needle), "`{needle}` not in: {detail}");
}

/// Every `VikunjaEvent` the `ops` stream holds, in order.
async fn events(bus: &Bus) -> Vec<(StoredMessage, VikunjaEvent)> {
    let mut reader = bus
        .read_range(&nisse_tests::agent("ops"), 1, None)
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(m) = reader.next().await {
        let m = m.unwrap();
        if let Ok(AnyMessage::InVikunja(e)) = m.decode() {
            out.push((m, e));
        }
    }
    out
}

/// Every `VikunjaResult` the `ops` stream holds, in order.
async fn results(bus: &Bus) -> Vec<VikunjaResult> {
    let mut reader = bus
        .read_range(&nisse_tests::agent("ops"), 1, None)
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(m) = reader.next().await {
        if let Ok(AnyMessage::VikunjaResult(r)) = m.unwrap().decode() {
            out.push(r);
        }
    }
    out
}

/// How many messages the `ops` stream holds.
async fn stored_count(bus: &Bus) -> u64 {
    let mut stream = bus.jetstream().get_stream("AGENT_OPS").await.unwrap();
    stream.info().await.unwrap().state.messages
}

/// An event's message id.
fn id_of(e: &VikunjaEvent) -> &str {
    e.envelope.as_ref().unwrap().message_id.as_str()
}

/// Publishes the brain's request `request_id` for `call`, as delivery
/// `attempt` of it (the brain retries under the same request id with a
/// new message id).
async fn request(bus: &Bus, request_id: &str, attempt: u32, call: Call) {
    bus.publish(VikunjaRequest {
        envelope: Some(Envelope {
            agent: "ops".into(),
            work_item_id: "item-1".into(),
            message_id: format!("vikunja-req:{request_id}:{attempt}"),
            ..Envelope::default()
        }),
        request_id: request_id.to_string(),
        call: Some(call),
    })
    .await
    .unwrap();
}

/// The answer to `request_id`, once there is one.
async fn answer(bus: &Bus, request_id: &str) -> VikunjaResult {
    eventually(
        &format!("the answer to {request_id}"),
        Duration::from_secs(30),
        || async {
            results(bus)
                .await
                .into_iter()
                .find(|r| r.request_id == request_id)
        },
    )
    .await
}

/// Whether the poll has written its cursor of `project`.
async fn cursor(bus: &Bus, project: i64) -> Option<nisse_intake_vikunja::records::Cursor> {
    let key = nisse_intake_vikunja::records::cursor_key(&nisse_tests::agent("ops"), project);
    bus.kv_read(nisse_bus::topology::VIKUNJA_BUCKET, &key)
        .await
        .unwrap()
        .map(|(c, _)| c)
}

/// Polls `check` until it yields a value, failing with `what` after
/// `timeout`.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
