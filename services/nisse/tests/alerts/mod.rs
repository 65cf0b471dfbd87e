//! Alerts becoming work items, end to end: Alertmanager → intake-alerts →
//! the ops stream → the ops brain in its own process → the state store,
//! read back with `nisse items` / `nisse item show`, rebuilt with `nisse
//! replay --rebuild`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use tokio::process::Child;

use nisse_core::{Event, State, Store};
use nisse_tests::TestNats;
use nisse_tests::alertmanager::{TestAlertmanager, Webhook, WebhookAuth, firing, resolved};

use super::{nisse, run, signal, text};

pub(super) const TOKEN: &str = "test-webhook-token";

/// A free loopback port (the listener is closed again at once).
pub(super) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A directory with a `nisse.toml` for `nisse serve` against `nats`, an
/// intake on `port` requiring the bearer token, and a data directory.
pub(super) struct Install {
    dir: tempfile::TempDir,
    port: u16,
    /// Its data directory: its own, or the one whose credentials a
    /// server started with authorization made (so every `nisse serve`
    /// and CLI process connects as its own identity).
    data: PathBuf,
}

impl Install {
    pub(super) fn new(nats: &TestNats) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let data = nats.data_dir().unwrap_or_else(|| dir.path().join("data"));
        std::fs::write(
            dir.path().join("nisse.toml"),
            format!(
                "data-dir = {data:?}\n\
                 [bus]\nurl = \"{}\"\n\
                 [intake-alerts]\nlisten = \"127.0.0.1:{port}\"\n\
                 [intake-alerts.auth]\nbearer-token = \"{TOKEN}\"\n",
                nats.url()
            ),
        )
        .unwrap();
        Self { dir, port, data }
    }

    /// Creates the topology with `cfg`'s stream and consumer settings,
    /// then starts intake-alerts (waiting until it is ready) and the brain,
    /// each in its own `nisse serve` process.
    pub(super) async fn start(nats: &TestNats, cfg: nisse_bus::BusConfig) -> (Self, Child, Child) {
        nats.bus_with(cfg, &["ops"])
            .await
            .unwrap()
            .ensure_topology()
            .await
            .unwrap();
        let install = Self::new(nats);
        let mut intake = install.serve(&["intake-alerts"]);
        install.wait_intake(&mut intake).await;
        let brain = install.serve(&["brain"]);
        (install, intake, brain)
    }

    pub(super) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(super) fn data(&self) -> PathBuf {
        self.data.clone()
    }

    pub(super) fn webhook(&self) -> String {
        format!("http://127.0.0.1:{}/api/v1/alerts", self.port)
    }

    /// `nisse serve <services>`, its output in `<name>.log`.
    pub(super) fn serve(&self, services: &[&str]) -> Child {
        let log =
            std::fs::File::create(self.path().join(format!("{}.log", services.join("+")))).unwrap();
        nisse(self.path())
            // The port is in nisse.toml.
            .env_remove("NISSE_INTAKE_ALERTS__LISTEN")
            .arg("serve")
            .args(services)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    pub(super) fn log(&self, services: &[&str]) -> String {
        std::fs::read_to_string(self.path().join(format!("{}.log", services.join("+"))))
            .unwrap_or_default()
    }

    /// Waits until the intake answers `/readyz`.
    pub(super) async fn wait_intake(&self, child: &mut Child) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = format!("http://127.0.0.1:{}/readyz", self.port);
        loop {
            if let Ok(r) = reqwest::get(&url).await
                && r.status().is_success()
            {
                return;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "intake exited with {status}: {}",
                    self.log(&["intake-alerts"])
                );
            }
            assert!(Instant::now() < deadline, "intake never became ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The ops store's state, read-only (`None` before the brain made it).
    pub(super) fn snapshot(&self) -> Option<nisse_core::Snapshot> {
        let path = Store::path_in(&self.data(), "ops");
        Store::open_read_only(&path, "ops").ok()?.snapshot().ok()
    }

    /// Waits until `check` holds for the store's state.
    pub(super) async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&nisse_core::Snapshot) -> bool,
    ) -> nisse_core::Snapshot {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.snapshot()
                && check(&s)
            {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting until {what}; brain log:\n{}\nstate: {:#?}",
                self.log(&["brain"]),
                self.snapshot().map(|s| s.items)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The last sequence stored in the ops stream.
pub(super) async fn last_sequence(nats: &TestNats) -> u64 {
    let bus = nats.bus(&["ops"]).await.unwrap();
    let mut stream = bus.jetstream().get_stream("AGENT_OPS").await.unwrap();
    stream.info().await.unwrap().state.last_sequence
}

/// Waits until the brain has applied every input in the stream and
/// published everything it produced, so its state is final.
pub(super) async fn wait_quiet(install: &Install, nats: &TestNats) -> nisse_core::Snapshot {
    let deadline = Instant::now() + Duration::from_secs(30);
    let bus = nats.bus(&["ops"]).await.unwrap();
    loop {
        let last = last_sequence(nats).await;
        let last_input = nisse_tests::last_input_sequence(&bus, &nisse_tests::ops())
            .await
            .unwrap();
        let outbox_empty = Store::open_read_only(&Store::path_in(&install.data(), "ops"), "ops")
            .and_then(|s| s.outbox())
            .is_ok_and(|o| o.is_empty());
        if let Some(s) = install.snapshot()
            && s.applied_sequence == last_input
            && outbox_empty
        {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if last_sequence(nats).await == last {
                return s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the brain never caught up with the stream; its log's end:\n{}",
            nisse_tests::tail(&install.log(&["brain"]), 30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `nisse replay --agent ops --rebuild <install>/rebuilt`: the rebuilt
/// directory, the rebuilt store's state, and what the command printed.
pub(super) async fn rebuild(install: &Install) -> (PathBuf, nisse_core::Snapshot, String) {
    let dir = install.path().join("rebuilt");
    let out = run(nisse(install.path())
        .args(["replay", "--agent", "ops", "--rebuild"])
        .arg(&dir))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rebuilt = Store::open_read_only(&Store::path_in(&dir, "ops"), "ops")
        .unwrap()
        .snapshot()
        .unwrap();
    (dir, rebuilt, text(&out.stdout))
}

pub(super) async fn stop(child: &mut Child) {
    signal(child.id().unwrap() as i32, Signal::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("stopped in time")
        .unwrap();
    assert!(status.success(), "{status}");
}

fn findings(s: &nisse_core::Snapshot, item: &str) -> Vec<String> {
    s.events
        .iter()
        .filter(|e| e.work_item_id == item)
        .filter_map(|e| match &e.event {
            Event::Finding { status, .. } => Some(status.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn alertmanager_alerts_become_one_work_item_per_problem_and_replay_rebuilds_them() {
    let nats = TestNats::start().await.unwrap();
    // Alertmanager's repeats carry the same dedup id as the first
    // notification; in production they come hours apart, long after the
    // duplicate window. Here they come seconds apart, so the window is
    // shorter still, and the repeats reach the brain as they would there.
    let mut cfg = nats.bus_config();
    cfg.streams.duplicate_window = Duration::from_millis(500);
    let (install, mut intake, mut brain) = Install::start(&nats, cfg).await;

    let mut webhook = Webhook::new(install.webhook());
    webhook.auth = WebhookAuth::Bearer(TOKEN.into());
    // Alertmanager re-sends still-firing alerts every few seconds: those
    // repeats must attach, not open items.
    webhook.repeat_interval = Duration::from_secs(2);
    let am = TestAlertmanager::start(webhook).await.unwrap();

    let cpu1 = [
        ("alertname", "HighCPU"),
        ("instance", "host1"),
        ("severity", "warning"),
    ];
    let cpu2 = [
        ("alertname", "HighCPU"),
        ("instance", "host2"),
        ("severity", "warning"),
    ];
    let disk = [
        ("alertname", "DiskFull"),
        ("instance", "nas"),
        ("severity", "critical"),
    ];
    let cpu1_alert = firing(&cpu1);
    let cpu1_start = cpu1_alert["startsAt"].as_str().unwrap().to_string();
    am.post_alerts(&[cpu1_alert, firing(&cpu2), firing(&disk)])
        .await
        .unwrap();

    let s = install
        .wait_until(
            "three items exist and one of them got a repeat",
            Duration::from_secs(30),
            |s| {
                s.items.len() == 3
                    && s.items
                        .iter()
                        .any(|i| findings(s, &i.id).contains(&"repeat".to_string()))
            },
        )
        .await;
    // The critical one ranks first among the ready ones; exactly one is active.
    assert_eq!(
        s.items.iter().filter(|i| i.state == State::Active).count(),
        1
    );

    am.post_alerts(&[resolved(&cpu1, &cpu1_start)])
        .await
        .unwrap();
    let s = install
        .wait_until("host1's item closed", Duration::from_secs(30), |s| {
            s.items
                .iter()
                .any(|i| i.title == "HighCPU on host1" && i.state == State::Closed)
        })
        .await;
    assert_eq!(
        s.items.len(),
        3,
        "repeats and the resolution opened nothing new"
    );
    let host1 = s
        .items
        .iter()
        .find(|i| i.title == "HighCPU on host1")
        .unwrap();
    let f = findings(&s, &host1.id);
    assert_eq!(f.first().map(String::as_str), Some("firing"));
    assert_eq!(f.last().map(String::as_str), Some("resolved"));
    assert!(s.unapplied.is_empty(), "{:?}", s.unapplied);

    // The operator's view.
    let out = run(nisse(install.path()).args(["items", "--json"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["items"].as_array().unwrap().len(), 3);
    let out = run(nisse(install.path()).args(["items", "--state", "closed"])).await;
    let shown = text(&out.stdout);
    assert!(
        shown.contains("HighCPU on host1") && !shown.contains("DiskFull"),
        "{shown}"
    );
    let out = run(nisse(install.path()).args(["items", "--state", "sleeping"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("`sleeping` is not a work item state"),
        "{}",
        text(&out.stderr)
    );
    let out = run(nisse(install.path()).args(["item", "show", &host1.id, "--json"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let item: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(item["item"]["state"], "closed");
    let kinds: Vec<&str> = item["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"finding") && kinds.contains(&"state_changed"),
        "{kinds:?}"
    );
    let out =
        run(nisse(install.path()).args(["item", "show", &format!("#{}", host1.number)])).await;
    assert!(
        text(&out.stdout).contains("HighCPU on host1"),
        "{}",
        text(&out.stdout)
    );
    let out = run(nisse(install.path()).args(["item", "show", "#999"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no work item `#999`"),
        "{}",
        text(&out.stderr)
    );
    // A command about no item is answered by the brain, over the bus, and
    // changes nothing (nothing unapplied either: it is not the brain's
    // error).
    let out = run(nisse(install.path()).args(["approve", "#999"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("agent ops has no work item `#999`"),
        "{}",
        text(&out.stderr)
    );

    // The brain announced each new item and the resolution on out.tell.
    let bus = nats.bus(&["ops"]).await.unwrap();
    let mut reader = bus.read_range(&nisse_tests::ops(), 1, None).await.unwrap();
    let mut told = Vec::new();
    while let Some(m) = reader.next().await {
        if let Ok(nisse_bus::AnyMessage::Tell(t)) = m.unwrap().decode() {
            told.push(t);
        }
    }
    assert_eq!(told.iter().filter(|t| t.opens_conversation).count(), 3);
    assert!(told.iter().any(|t| t.markdown.contains("resolved")));

    // Quiesce, then rebuild from the stream: the same state.
    drop(am);
    stop(&mut intake).await;
    let live = wait_quiet(&install, &nats).await;
    stop(&mut brain).await;
    let (rebuilt_dir, rebuilt, said) = rebuild(&install).await;
    assert!(said.contains("3 work items"), "{said}");
    assert_eq!(rebuilt, live);

    // Never over existing state.
    let out = run(nisse(install.path())
        .args(["replay", "--agent", "ops", "--rebuild"])
        .arg(&rebuilt_dir))
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is not empty"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn killing_the_brain_mid_burst_applies_every_alert_exactly_once() {
    let nats = TestNats::start().await.unwrap();
    // A short ack wait, so what the killed brain held comes back quickly.
    let mut cfg = nats.bus_config();
    cfg.consumers.ack_wait = Duration::from_secs(2);
    cfg.consumers.max_deliver = 5;
    let (install, mut intake, mut brain) = Install::start(&nats, cfg).await;

    const ALERTS: usize = 500;
    // Killed while it is busy with the burst.
    burst_killing(&install, &mut brain, ALERTS, 60).await;

    let mut brain = install.serve(&["brain"]);
    stop(&mut intake).await;
    let s = wait_quiet(&install, &nats).await;
    stop(&mut brain).await;
    each_alert_once(&nats, &s, ALERTS).await;
}

/// Publishes a firing alert `alertname` for `instance` on the ops stream,
/// as intake-alerts would, with the dedup id `alert:<name>:firing:1`.
pub(super) async fn publish_alert(nats: &TestNats, alertname: &str, instance: &str) {
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.publish(alert_received(alertname, instance))
        .await
        .unwrap();
}

/// A firing alert `alertname` on `instance` for agent ops, as intake-alerts
/// publishes one (fingerprint `fp-<alertname>`).
pub(super) fn alert_received(alertname: &str, instance: &str) -> nisse_bus::proto::AlertReceived {
    use nisse_bus::proto::{self, AlertReceived, Envelope};
    AlertReceived {
        envelope: Some(Envelope {
            agent: "ops".into(),
            actor: Some(proto::Actor {
                kind: proto::ActorKind::External as i32,
                id: "alertmanager:test".into(),
            }),
            message_id: format!("alert:{alertname}:firing:1"),
            ..Default::default()
        }),
        payload_version: "4".into(),
        receiver: "test".into(),
        group_status: "firing".into(),
        alert: Some(proto::Alert {
            status: "firing".into(),
            labels: [("alertname", alertname), ("instance", instance)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            fingerprint: format!("fp-{alertname}"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A small webhook body of one alert, as Alertmanager sends it.
fn one_alert(name: &str) -> String {
    serde_json::json!({
        "version": "4",
        "groupKey": format!("{{}}:{{alertname=\"{name}\"}}"),
        "status": "firing",
        "receiver": "nisse",
        "groupLabels": {"alertname": name},
        "commonLabels": {"alertname": name, "instance": "nas"},
        "externalURL": "http://alertmanager.invalid:9093",
        "alerts": [{
            "status": "firing",
            "labels": {"alertname": name, "instance": "nas"},
            "startsAt": "2024-05-01T10:00:00Z",
            "fingerprint": "00000000000000aa"
        }]
    })
    .to_string()
}

async fn post_alerts(url: &str, body: String, token: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap()
}

/// Stops `nisse up` with SIGTERM and returns what it printed.
async fn stop_up(child: Child) -> String {
    signal(child.id().unwrap() as i32, Signal::SIGTERM);
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("stopped in time")
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[tokio::test]
async fn up_requires_the_token_it_generates_and_alertmanager_delivers_with_the_printed_snippet() {
    use std::os::unix::fs::PermissionsExt as _;

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut up = super::spawn_up(dir.path(), &data);
    let endpoints = super::wait_endpoints(&data, &mut up).await;
    let webhook = endpoints["listeners"]["alertmanager-webhook"]
        .as_str()
        .unwrap()
        .to_string();
    let token_file = PathBuf::from(
        endpoints["listeners"]["alertmanager-token-file"]
            .as_str()
            .unwrap(),
    );
    assert_eq!(
        token_file,
        data.join("credentials/alertmanager-webhook.token")
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&token_file), 0o600);
    // Its directory (shared with the bus's credentials) is neither
    // listable nor writable by others.
    let dir_mode = mode(token_file.parent().unwrap());
    assert_eq!(dir_mode & 0o066, 0, "{dir_mode:o}");
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_string();

    // Without the token: refused, nothing stored.
    let response = post_alerts(&webhook, one_alert("Forged"), None).await;
    assert_eq!(response.status(), 401);
    let response = post_alerts(&webhook, one_alert("Forged"), Some("guess")).await;
    assert_eq!(response.status(), 401);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(super::stream_messages(dir.path(), &data).await, 0);

    // Alertmanager configured as `nisse up` says delivers.
    let mut hook = Webhook::new(&webhook);
    hook.auth = WebhookAuth::BearerFile(token_file.clone());
    let am = TestAlertmanager::start(hook).await.unwrap();
    am.post_alerts(&[firing(&[("alertname", "DiskFull"), ("instance", "nas")])])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = run(nisse(dir.path())
            .args(["items", "--json", "--data-dir"])
            .arg(&data))
        .await;
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let titles: Vec<&str> = listed["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["title"].as_str())
            .collect();
        if titles == ["DiskFull on nas"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Alertmanager's alert never became an item ({titles:?}): {}",
            am.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    am.stop().await.unwrap();

    let printed = stop_up(up).await;
    for line in [
        format!("        - url: {webhook}"),
        "            authorization:".to_string(),
        format!("              credentials_file: {}", token_file.display()),
    ] {
        assert!(
            printed.lines().any(|l| l == line),
            "`{line}` not printed:\n{printed}"
        );
    }

    // The next start keeps the token Alertmanager was given, and names
    // it by its absolute path even when the data directory is given
    // relative (Alertmanager would read a relative one from elsewhere).
    let mut up = super::spawn_up(dir.path(), Path::new("data"));
    let endpoints = super::wait_endpoints(&data, &mut up).await;
    assert_eq!(
        endpoints["listeners"]["alertmanager-token-file"],
        token_file.display().to_string()
    );
    assert_eq!(std::fs::read_to_string(&token_file).unwrap().trim(), token);
    let webhook = endpoints["listeners"]["alertmanager-webhook"]
        .as_str()
        .unwrap();
    let response = post_alerts(webhook, one_alert("Again"), Some(&token)).await;
    assert_eq!(response.status(), 200);
    stop_up(up).await;
}

/// How much the peak resident memory of `nisse serve intake-alerts` may
/// grow while it refuses the 16 MiB amplification body: the body it
/// buffers, and 16 MiB for the HTTP server's buffers and the allocator.
/// The alerts would expand to over 140 GB. docs/ARCHITECTURE.md states the
/// same bound.
const AMPLIFICATION_GROWTH: u64 = 32 * 1024 * 1024;

#[tokio::test]
async fn an_amplifying_alert_body_gets_413_and_the_intake_process_stays_small() {
    use nisse_tests::alertmanager::{amplification_body, memory, reset_peak_memory};

    let nats = TestNats::start().await.unwrap();
    nats.bus(&["ops"])
        .await
        .unwrap()
        .ensure_topology()
        .await
        .unwrap();
    let install = Install::new(&nats);
    let mut intake = install.serve(&["intake-alerts"]);
    install.wait_intake(&mut intake).await;
    let pid = intake.id().unwrap().to_string();

    let body = amplification_body(16 * 1024 * 1024);
    let before = memory(&pid).unwrap();
    reset_peak_memory(&pid).unwrap();
    let response = post_alerts(&install.webhook(), body, Some(TOKEN)).await;
    let after = memory(&pid).unwrap();
    assert_eq!(response.status(), 413);
    let problem: serde_json::Value = response.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("10000 alerts") && detail.contains("intake-alerts.max-expanded"),
        "{detail}"
    );
    let growth = after.peak.saturating_sub(before.resident);
    eprintln!(
        "nisse serve intake-alerts: {} MiB resident before, peak {} MiB while refusing",
        before.resident / (1024 * 1024),
        after.peak / (1024 * 1024)
    );
    assert!(
        growth < AMPLIFICATION_GROWTH,
        "the intake's peak memory grew by {growth} bytes (bound {AMPLIFICATION_GROWTH})"
    );
    assert_eq!(last_sequence(&nats).await, 0, "something was stored");
    stop(&mut intake).await;
}

/// A fresh NATS gets its topology from one command: `nisse serve` on a
/// server nobody initialised exits at once naming `nisse bus init` (the
/// brain and the webhook alike, rather than dying on `stream not found`
/// or answering 503 forever); `nisse bus init` makes everything and says
/// what it did, and again changes nothing; then each service started
/// alone with `nisse serve` works.
#[tokio::test]
async fn bus_init_makes_what_serve_needs_and_serve_refuses_a_server_without_it() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let install = Install::new(&nats);
    for service in ["brain", "intake-alerts"] {
        let mut child = install.serve(&[service]);
        let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
            .await
            .unwrap_or_else(|_| panic!("nisse serve {service} did not exit"))
            .unwrap();
        assert!(!status.success());
        let log = install.log(&[service]);
        assert!(
            log.contains("the NATS server has no stream AGENT_OPS")
                && log.contains("run `nisse bus init`"),
            "{service}: {log}"
        );
    }

    let init = || {
        let mut c = nisse(install.path());
        c.env_remove("NISSE_INTAKE_ALERTS__LISTEN")
            .args(["bus", "init"]);
        c
    };
    let out = run(&mut init()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    for line in [
        "stream AGENT_OPS",
        "consumer brain",
        "consumer executor",
        "bucket nisse_leases",
        "bucket nisse_exec",
    ] {
        let shown = said
            .lines()
            .find(|l| l.trim_start().starts_with(line))
            .unwrap_or_else(|| panic!("{line}: {said}"));
        assert!(shown.ends_with("created"), "{shown}");
    }
    let out = run(&mut init()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let again = text(&out.stdout);
    assert!(
        again
            .lines()
            .skip(1)
            .all(|l| l.trim_end().ends_with("unchanged")),
        "{again}"
    );

    // Each service alone, in its own process: an alert becomes an item.
    let mut intake = install.serve(&["intake-alerts"]);
    install.wait_intake(&mut intake).await;
    let mut brain = install.serve(&["brain"]);
    let r = post_alerts(&install.webhook(), one_alert("DiskFull"), Some(TOKEN)).await;
    assert!(r.status().is_success(), "{}", r.status());
    install
        .wait_until("the alert is an item", Duration::from_secs(30), |s| {
            s.items.len() == 1
        })
        .await;
    stop(&mut brain).await;
    stop(&mut intake).await;
}

/// `count` distinct firing alerts from `first`, as one Alertmanager post.
pub(super) fn burst_body(first: usize, count: usize) -> serde_json::Value {
    let alerts: Vec<serde_json::Value> = (first..first + count)
        .map(|n| {
            serde_json::json!({
                "status": "firing",
                "labels": { "alertname": "Burst", "instance": format!("host{n}") },
                "annotations": {},
                "startsAt": "2026-12-01T10:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": format!("{n:016x}"),
            })
        })
        .collect();
    serde_json::json!({
        "version": "4", "groupKey": "{}:{alertname=\"Burst\"}", "truncatedAlerts": 0,
        "status": "firing", "receiver": "nisse", "groupLabels": {}, "commonLabels": {},
        "commonAnnotations": {}, "externalURL": "http://am", "alerts": alerts,
    })
}

/// Posts `alerts` distinct alerts ten to a post to `install`'s webhook,
/// SIGKILLing `brain` once the store holds `kill_at` items (or after the
/// last post, if the burst outran its first commits), and checks it was
/// killed mid-burst, with alerts left to apply.
async fn burst_killing(install: &Install, brain: &mut Child, alerts: usize, kill_at: usize) {
    let client = reqwest::Client::new();
    let mut killed = false;
    for post in 0..alerts / 10 {
        let r = client
            .post(install.webhook())
            .bearer_auth(TOKEN)
            .json(&burst_body(post * 10, 10))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        if !killed && install.snapshot().is_some_and(|s| s.items.len() >= kill_at) {
            signal(brain.id().unwrap() as i32, Signal::SIGKILL);
            brain.wait().await.unwrap();
            killed = true;
        }
    }
    if !killed {
        signal(brain.id().unwrap() as i32, Signal::SIGKILL);
        brain.wait().await.unwrap();
    }
    let applied = install.snapshot().map_or(0, |s| s.items.len());
    assert!(applied < alerts, "killed mid-burst ({applied} applied)");
}

/// A standby brain: an install of its own (its own data directory, so its
/// own state store), on the same server, with `lease-ttl` as the first's.
fn standby_of(nats: &TestNats, lease_ttl: &str) -> Install {
    let standby = Install::new(nats);
    with_lease_ttl(&standby, lease_ttl);
    standby
}

/// [`Install::start`] with the brain's lease lapsing after `cfg`'s
/// `lease_ttl` (2 s): the topology made with it, written in `nisse.toml`
/// before the brain starts.
async fn start_with_lease_ttl(
    nats: &TestNats,
    cfg: nisse_bus::BusConfig,
) -> (Install, Child, Child) {
    nats.bus_with(cfg, &["ops"])
        .await
        .unwrap()
        .ensure_topology()
        .await
        .unwrap();
    let install = Install::new(nats);
    with_lease_ttl(&install, "2s");
    let mut intake = install.serve(&["intake-alerts"]);
    install.wait_intake(&mut intake).await;
    let brain = install.serve(&["brain"]);
    (install, intake, brain)
}

fn with_lease_ttl(install: &Install, ttl: &str) {
    let cfg = install.path().join("nisse.toml");
    let text = std::fs::read_to_string(&cfg).unwrap().replacen(
        "[bus]\n",
        &format!("[bus]\nlease-ttl = \"{ttl}\"\n"),
        1,
    );
    std::fs::write(&cfg, text).unwrap();
}

/// Every alert caused exactly one finding, and every item was announced
/// once: nothing applied or told twice across the takeover.
pub(super) async fn each_alert_once(nats: &TestNats, s: &nisse_core::Snapshot, alerts: usize) {
    each_alert_once_on(&nats.bus(&["ops"]).await.unwrap(), s, alerts).await;
}

/// [`each_alert_once`], reading the stream with `bus`.
pub(super) async fn each_alert_once_on(
    bus: &nisse_bus::Bus,
    s: &nisse_core::Snapshot,
    alerts: usize,
) {
    assert_eq!(s.items.len(), alerts);
    let mut per_message: HashMap<&str, usize> = HashMap::new();
    for e in &s.events {
        if matches!(e.event, Event::Finding { .. }) {
            *per_message.entry(e.causation_id.as_str()).or_default() += 1;
        }
    }
    assert_eq!(per_message.len(), alerts);
    assert!(
        per_message.values().all(|n| *n == 1),
        "an alert was applied twice"
    );
    let mut reader = bus.read_range(&nisse_tests::ops(), 1, None).await.unwrap();
    let mut announced: HashMap<String, usize> = HashMap::new();
    while let Some(m) = reader.next().await {
        if let Ok(nisse_bus::AnyMessage::Tell(t)) = m.unwrap().decode() {
            *announced
                .entry(t.envelope.unwrap().work_item_id)
                .or_default() += 1;
        }
    }
    assert_eq!(announced.len(), alerts);
    assert!(
        announced.values().all(|n| *n == 1),
        "an item was announced twice"
    );
}

/// Seed L8 and the design's one active brain per agent: a standby brain
/// with its own store waits while the active one applies a burst; the
/// active one is SIGKILLed after it applied everything; the standby takes
/// the lease and, with no new traffic, applies everything the stream
/// holds before anything else: its items and their logs equal what the
/// dead one had, nothing applied or told twice, and `nisse streams` said
/// it was catching up or shows it caught up. The time to take over is
/// reported.
#[tokio::test]
async fn a_standby_brain_catches_up_when_it_takes_over_without_new_traffic() {
    let nats = TestNats::start().await.unwrap();
    let mut cfg = nats.bus_config();
    cfg.lease_ttl = Duration::from_secs(2);
    let (install, mut intake, mut brain) = start_with_lease_ttl(&nats, cfg).await;
    const ALERTS: usize = 400;
    let client = reqwest::Client::new();
    for batch in 0..ALERTS / 10 {
        let r = client
            .post(install.webhook())
            .bearer_auth(TOKEN)
            .json(&burst_body(batch * 10, 10))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
    stop(&mut intake).await;
    let active = wait_quiet(&install, &nats).await;
    assert_eq!(active.items.len(), ALERTS);

    let standby = standby_of(&nats, "2s");
    let mut second = standby.serve(&["brain"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !standby.log(&["brain"]).contains("standing by") {
        assert!(Instant::now() < deadline, "{}", standby.log(&["brain"]));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(brain.id().unwrap() as i32, Signal::SIGKILL);
    brain.wait().await.unwrap();
    let killed = Instant::now();
    let s = standby
        .wait_until(
            "the standby applied everything",
            Duration::from_secs(30),
            |s| s.items.len() == ALERTS,
        )
        .await;
    let took = killed.elapsed();
    eprintln!(
        "takeover: {} ms from the kill to every item applied",
        took.as_millis()
    );
    // It says so once the catch-up has read to the stream's end (the
    // brain's own outputs after the last alert).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !standby
        .log(&["brain"])
        .contains("caught up with the stream")
    {
        assert!(Instant::now() < deadline, "{}", standby.log(&["brain"]));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = wait_quiet(&standby, &nats).await;
    let items = |s: &nisse_core::Snapshot| {
        s.items
            .iter()
            .map(|i| (i.id.clone(), i.number, i.title.clone(), i.state))
            .collect::<Vec<_>>()
    };
    assert_eq!(items(&after), items(&active));
    let log = |s: &nisse_core::Snapshot, item: &str| {
        s.events
            .iter()
            .filter(|e| e.work_item_id == item)
            .map(|e| (e.causation_id.clone(), e.event.kind().to_string()))
            .collect::<Vec<_>>()
    };
    for i in &active.items {
        assert_eq!(log(&after, &i.id), log(&active, &i.id), "item {}", i.number);
    }
    each_alert_once(&nats, &after, ALERTS).await;
    assert!(s.applied_sequence > 0);

    // `nisse streams` names the holder, and where it stands.
    let out = run(nisse(standby.path()).args(["streams"])).await;
    let shown = text(&out.stdout);
    let line = shown
        .lines()
        .find(|l| l.trim_start().starts_with("brain applied"))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(
        line.contains(&standby.data().display().to_string()) && !line.contains("catching up"),
        "{line}"
    );
    stop(&mut second).await;
}

/// The same takeover mid-burst: the active brain is SIGKILLed while
/// alerts keep arriving; the standby takes over, catches up and goes on
/// with the rest, each alert applied and each item told once.
#[tokio::test]
async fn a_standby_brain_takes_over_mid_burst_and_applies_each_alert_once() {
    let nats = TestNats::start().await.unwrap();
    let mut cfg = nats.bus_config();
    cfg.lease_ttl = Duration::from_secs(2);
    cfg.consumers.ack_wait = Duration::from_secs(2);
    cfg.consumers.max_deliver = 5;
    let (install, mut intake, mut brain) = start_with_lease_ttl(&nats, cfg).await;
    let standby = standby_of(&nats, "2s");
    let mut second = standby.serve(&["brain"]);

    const ALERTS: usize = 500;
    burst_killing(&install, &mut brain, ALERTS, 100).await;

    stop(&mut intake).await;
    let s = wait_quiet(&standby, &nats).await;
    each_alert_once(&nats, &s, ALERTS).await;
    stop(&mut second).await;
}
