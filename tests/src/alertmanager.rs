//! A real Prometheus Alertmanager for tests: Debian's
//! `prometheus-alertmanager` on a free loopback port with a temporary
//! store, configured to send everything to one webhook, so tests exercise
//! what Alertmanager really sends (its fingerprints, group keys, retries)
//! rather than a hand-written imitation.
//!
//! A missing binary fails the test naming the package; it never skips.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{Value, json};
use tempfile::TempDir;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::process::{Child, Command};

/// The names Alertmanager's binary goes by: Debian's, then upstream's.
const PROGRAMS: [&str; 2] = ["prometheus-alertmanager", "alertmanager"];

/// How long Alertmanager gets to answer `/-/ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// How the webhook authenticates, as Alertmanager's `http_config` says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookAuth {
    /// No credentials.
    None,
    /// `authorization: {type: Bearer, credentials: <token>}`.
    Bearer(String),
    /// `authorization: {type: Bearer, credentials_file: <path>}`, as
    /// `nisse up` prints it for the token it generated. Alertmanager reads
    /// the file at each notification.
    BearerFile(PathBuf),
    /// `basic_auth: {username, password}`.
    Basic {
        /// The user name.
        username: String,
        /// The password.
        password: String,
    },
}

/// The one receiver Alertmanager routes everything to, and the route's
/// timings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    /// The webhook URL.
    pub url: String,
    /// The credentials sent with every notification.
    pub auth: WebhookAuth,
    /// How long a new group waits for more alerts before its first
    /// notification.
    pub group_wait: Duration,
    /// How long a group waits before notifying about changes (new or
    /// resolved alerts); also roughly how long a failed notification keeps
    /// being retried before the next attempt round.
    pub group_interval: Duration,
    /// How long before an unchanged group is notified again.
    pub repeat_interval: Duration,
    /// The labels alerts are grouped by.
    pub group_by: Vec<String>,
    /// Most alerts per notification (`0`: all).
    pub max_alerts: u64,
}

impl Webhook {
    /// A webhook to `url` without credentials and with timings short
    /// enough for tests: a 100 ms group wait, a 1 s group interval, a 1 h
    /// repeat interval (so nothing repeats within a test), grouped by
    /// `alertname`, no alert limit.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            auth: WebhookAuth::None,
            group_wait: Duration::from_millis(100),
            group_interval: Duration::from_secs(1),
            repeat_interval: Duration::from_secs(3600),
            group_by: vec!["alertname".into()],
            max_alerts: 0,
        }
    }

    /// `alertmanager.yml` for this webhook. It is written as JSON, which
    /// is YAML too, so no value needs YAML quoting rules.
    fn config(&self) -> Value {
        let mut webhook = json!({
            "url": self.url,
            "send_resolved": true,
            "max_alerts": self.max_alerts,
        });
        match &self.auth {
            WebhookAuth::None => {}
            WebhookAuth::Bearer(token) => {
                webhook["http_config"] =
                    json!({ "authorization": { "type": "Bearer", "credentials": token } });
            }
            WebhookAuth::BearerFile(path) => {
                webhook["http_config"] = json!({
                    "authorization": { "type": "Bearer", "credentials_file": path }
                });
            }
            WebhookAuth::Basic { username, password } => {
                webhook["http_config"] =
                    json!({ "basic_auth": { "username": username, "password": password } });
            }
        }
        json!({
            "route": {
                "receiver": "nisse",
                "group_by": self.group_by,
                "group_wait": prometheus_duration(self.group_wait),
                "group_interval": prometheus_duration(self.group_interval),
                "repeat_interval": prometheus_duration(self.repeat_interval),
            },
            "receivers": [ { "name": "nisse", "webhook_configs": [webhook] } ],
        })
    }
}

/// A duration as Prometheus writes them; milliseconds are the finest unit
/// it reads.
fn prometheus_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// A running Alertmanager, killed when dropped.
pub struct TestAlertmanager {
    child: Child,
    url: String,
    log: PathBuf,
    http: reqwest::Client,
    dir: TempDir,
}

impl TestAlertmanager {
    /// Starts Alertmanager sending every alert to `webhook`, and waits
    /// until it is ready.
    pub async fn start(webhook: Webhook) -> anyhow::Result<Self> {
        let program = find_program().with_context(|| {
            format!(
                "the tests need Alertmanager (`{}` or `{}` on PATH): install the Debian package `prometheus-alertmanager`",
                PROGRAMS[0], PROGRAMS[1]
            )
        })?;
        let dir = tempfile::Builder::new()
            .prefix("nisse-alertmanager-")
            .tempdir()?;
        let config = dir.path().join("alertmanager.yml");
        std::fs::write(&config, serde_json::to_string_pretty(&webhook.config())?)?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        // A free port is found by binding and releasing it, which another
        // process could take in between: try again on a fresh port then.
        let mut last_error = None;
        for attempt in 0..3 {
            let port = free_port()?;
            let log = dir.path().join(format!("alertmanager-{attempt}.log"));
            match spawn(&program, dir.path(), &config, port, &log, http.clone()).await {
                Ok(child) => {
                    return Ok(Self {
                        child,
                        url: format!("http://127.0.0.1:{port}"),
                        log,
                        http,
                        dir,
                    });
                }
                Err(e) => {
                    let in_use = tail(&log, 50).contains("address already in use");
                    last_error = Some(e);
                    if !in_use {
                        break;
                    }
                }
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("Alertmanager did not start")))
    }

    /// Kills it and waits until it is gone (dropping it kills it too,
    /// without waiting).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.child
            .kill()
            .await
            .with_context(|| format!("killing Alertmanager; log: {}", self.log_tail()))
    }

    /// Its base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The temporary directory holding its configuration, store and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Posts alerts to Alertmanager's own API (`POST /api/v2/alerts`), as
    /// Prometheus would. Each is `{labels, annotations, startsAt, endsAt,
    /// generatorURL}`; see [`firing`] and [`resolved`].
    pub async fn post_alerts(&self, alerts: &[Value]) -> anyhow::Result<()> {
        let response = self
            .http
            .post(format!("{}/api/v2/alerts", self.url))
            .json(alerts)
            .send()
            .await
            .with_context(|| format!("posting alerts to Alertmanager; log: {}", self.log_tail()))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            anyhow::bail!("Alertmanager refused the alerts ({status}): {body}");
        }
        Ok(())
    }

    /// The alerts Alertmanager holds (`GET /api/v2/alerts`), each with the
    /// `fingerprint` it computed.
    pub async fn alerts(&self) -> anyhow::Result<Vec<Value>> {
        let response = self
            .http
            .get(format!("{}/api/v2/alerts", self.url))
            .send()
            .await?
            .error_for_status()?;
        Ok(response.json().await?)
    }

    /// Its whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of its log, for assertion messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log, 30)
    }

    /// Waits until a log line contains `needle`, failing with the log's
    /// tail after `timeout`.
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(needle) {
            if Instant::now() > deadline {
                anyhow::bail!(
                    "Alertmanager did not log `{needle}` within {timeout:?}; log tail:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

/// A firing alert starting now, with no annotations beyond a summary and a
/// generator URL, for [`TestAlertmanager::post_alerts`].
pub fn firing(labels: &[(&str, &str)]) -> Value {
    json!({
        "labels": label_map(labels),
        "annotations": { "summary": "test alert" },
        "startsAt": now(),
        "generatorURL": "http://prometheus.invalid/graph",
    })
}

/// The alert with `labels` that started at `starts_at` (RFC 3339), resolved
/// now: its end is the moment this is called, so in the past by the time
/// Alertmanager looks at it.
pub fn resolved(labels: &[(&str, &str)], starts_at: &str) -> Value {
    json!({
        "labels": label_map(labels),
        "annotations": { "summary": "test alert" },
        "startsAt": starts_at,
        "endsAt": now(),
        "generatorURL": "http://prometheus.invalid/graph",
    })
}

/// A webhook body (payload version 4) of at most `limit` bytes that asks
/// for far more than it weighs: 10,000 small alerts whose group carries
/// the rest of the body as big `groupLabels` and `commonLabels`. A receiver
/// copying the group's labels into every alert's message would need ten
/// thousand times those labels (~140 GB for 16 MiB). Built straight as
/// text, so the caller's copy is made once, at its final size.
pub fn amplification_body(limit: usize) -> String {
    use std::fmt::Write as _;

    let mut body = String::with_capacity(limit);
    body.push_str(r#"{"version":"4","groupKey":"{}:{alertname=\"Amplified\"}","status":"firing","receiver":"nisse","externalURL":"http://alertmanager.invalid:9093","alerts":["#);
    for i in 0..10_000 {
        if i > 0 {
            body.push(',');
        }
        // Writing to a String cannot fail.
        let _ = write!(
            body,
            r#"{{"status":"firing","labels":{{"alertname":"Amplified","i":"{i}"}},"startsAt":"2024-05-01T10:00:00Z","fingerprint":"{i:016x}"}}"#
        );
    }
    body.push_str("],");
    // The rest, half each, as labels of 64 KiB values.
    let value = "v".repeat(64 * 1024);
    let share = limit.saturating_sub(body.len() + 64) / 2;
    for field in ["groupLabels", "commonLabels"] {
        let end = body.len() + share;
        let _ = write!(body, r#""{field}":{{"#);
        let mut n = 0;
        while body.len() + value.len() + 16 < end {
            if n > 0 {
                body.push(',');
            }
            let _ = write!(body, r#""l{n}":"{value}""#);
            n += 1;
        }
        body.push_str("},");
    }
    body.push_str(r#""commonAnnotations":{}}"#);
    body
}

/// A process's resident memory, from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// Resident now (`VmRSS`), in bytes.
    pub resident: u64,
    /// The highest resident size since start or the last
    /// [`reset_peak_memory`] (`VmHWM`), in bytes.
    pub peak: u64,
}

/// The memory of process `pid` (`"self"` for this one).
pub fn memory(pid: &str) -> anyhow::Result<Memory> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no {name} in {path}"))?;
        Ok(kib * 1024)
    };
    Ok(Memory {
        resident: field("VmRSS:")?,
        peak: field("VmHWM:")?,
    })
}

/// Resets the peak resident size of process `pid` to its current one
/// (Linux's `clear_refs` "5"), so a later [`memory`] reads the peak of
/// what happened since.
pub fn reset_peak_memory(pid: &str) -> anyhow::Result<()> {
    let path = format!("/proc/{pid}/clear_refs");
    std::fs::write(&path, "5").with_context(|| format!("writing {path}"))
}

fn label_map(labels: &[(&str, &str)]) -> Value {
    Value::Object(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_string(), Value::String((*v).to_string())))
            .collect(),
    )
}

fn now() -> String {
    // Formatting the current UTC time as RFC 3339 cannot fail.
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// The first of [`PROGRAMS`] on `PATH` (or in `/usr/bin`, where Debian puts
/// it, for environments with a bare `PATH`).
fn find_program() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push(PathBuf::from("/usr/bin"));
    PROGRAMS
        .iter()
        .flat_map(|name| dirs.iter().map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts Alertmanager on `port` and waits for `/-/ready`.
async fn spawn(
    program: &Path,
    dir: &Path,
    config: &Path,
    port: u16,
    log: &Path,
    http: reqwest::Client,
) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log)?;
    let url = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(program)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg(format!("--web.external-url={url}"))
        // Empty: no cluster listener, so no gossip and no peer wait before
        // notifying.
        .arg("--cluster.listen-address=")
        // Debug shows every notification attempt, which is what a failing
        // test needs to explain itself.
        .arg("--log.level=debug")
        // The webhook is on loopback; a proxy from the environment must
        // not get in the way.
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!(
                "Alertmanager exited ({status}) before it was ready; log tail:\n{}",
                tail(log, 30)
            );
        }
        let ready = http
            .get(format!("{url}/-/ready"))
            .timeout(Duration::from_secs(1))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            return Ok(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill().await;
            anyhow::bail!(
                "Alertmanager was not ready within {READY_TIMEOUT:?}; log tail:\n{}",
                tail(log, 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
