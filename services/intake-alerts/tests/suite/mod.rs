//! Shared steps: a NATS server with the topology, the receiver running
//! in-process, posting, and reading back what the stream holds.

mod alertmanager;
mod webhook;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nisse_bus::{AnyMessage, Bus, StoredMessage};
use nisse_intake_alerts::Config;
use nisse_proto::v1::AlertReceived;
use nisse_tests::{InProcess, TestNats};

/// How long a stopped receiver may take to finish.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A NATS server of the test's own with the topology in place, and a bus
/// for agent `ops`.
async fn nats() -> (TestNats, Bus) {
    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    (nats, bus)
}

/// The receiver's configuration for tests: a free loopback port, no
/// credentials configured (so it generates its token).
fn config() -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Config::default()
    }
}

/// A receiver serving in-process, with a data directory of its own.
struct Intake {
    /// `http://127.0.0.1:<port>`.
    base: String,
    /// The webhook URL.
    url: String,
    /// The file its bearer token is read from, when it is read from one.
    token_file: Option<PathBuf>,
    /// That file's token, which [`Intake::post`] sends.
    token: Option<String>,
    data: tempfile::TempDir,
    service: InProcess,
}

impl Intake {
    async fn start(cfg: &Config, bus: &Bus) -> Self {
        Self::start_in(cfg, bus, tempfile::tempdir().unwrap()).await
    }

    /// Starts it on the data directory `data` (a restart keeps it).
    async fn start_in(cfg: &Config, bus: &Bus, data: tempfile::TempDir) -> Self {
        let bound = nisse_intake_alerts::bind(cfg, bus.clone(), data.path())
            .await
            .unwrap();
        let base = format!("http://{}", bound.local_addr());
        let url = bound.webhook_url();
        assert_eq!(url, format!("{base}/api/v1/alerts"));
        let token_file = bound.token_file().map(Path::to_path_buf);
        let token = token_file
            .as_ref()
            .map(|p| std::fs::read_to_string(p).unwrap().trim().to_string());
        let service = InProcess::spawn(|token| async move { Ok(bound.serve(token).await?) });
        Self {
            base,
            url,
            token_file,
            token,
            data,
            service,
        }
    }

    /// Stops it and hands back its data directory.
    async fn stop(self) -> tempfile::TempDir {
        self.service.stop(STOP_GRACE).await.unwrap();
        self.data
    }

    /// Posts a JSON body as Alertmanager does, with the token from the
    /// receiver's token file when it has one.
    async fn post(&self, body: &serde_json::Value) -> reqwest::Response {
        self.post_with(body.to_string(), |r| r).await
    }

    /// [`Intake::post`] of any body, after `customize` (headers).
    async fn post_with(
        &self,
        body: impl Into<reqwest::Body>,
        customize: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> reqwest::Response {
        let token = self.token.clone();
        post_as(&self.url, body, move |r| {
            customize(match token {
                Some(t) => r.bearer_auth(t),
                None => r,
            })
        })
        .await
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Posts `body` as JSON with no credentials but what `customize` adds.
async fn post_as(
    url: &str,
    body: impl Into<reqwest::Body>,
    customize: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
) -> reqwest::Response {
    let request = http()
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    customize(request).send().await.unwrap()
}

/// A response's status, content type and parsed JSON body.
async fn read(response: reqwest::Response) -> (u16, String, serde_json::Value) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = response.text().await.unwrap();
    let json = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("response body is not JSON ({e}): {body}"));
    (status, content_type, json)
}

/// How many messages the `ops` stream holds.
async fn stored_count(bus: &Bus) -> u64 {
    let mut stream = bus.jetstream().get_stream("AGENT_OPS").await.unwrap();
    stream.info().await.unwrap().state.messages
}

/// Every message of the `ops` stream, decoded as alerts.
async fn stored(bus: &Bus) -> Vec<(StoredMessage, AlertReceived)> {
    let mut reader = bus.read_range(&nisse_tests::ops(), 1, None).await.unwrap();
    let mut out = Vec::new();
    while let Some(m) = reader.next().await {
        let m = m.unwrap();
        match m.decode().unwrap() {
            AnyMessage::InAlert(alert) => out.push((m, alert)),
            other => panic!("unexpected message on {}: {other:?}", m.subject),
        }
    }
    out
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
