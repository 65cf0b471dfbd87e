//! The `nisse` binary as an operator runs it, against real `nats-server`s.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test by panicking"
)]

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use tokio::process::{Child, Command};

use nisse_bus::proto::ExecRequest;
use nisse_tests::{TestNats, exec_request};

mod agent_loop;
mod alerts;
mod cluster;
mod control;
mod dev;
mod duties;
mod eval;
mod exec;
mod gates;
mod matrix;
mod mcp;
mod mcp_e2e;
mod mcp_serve;
mod vault;
mod vikunja;
mod walls;

const NISSE: &str = env!("CARGO_BIN_EXE_nisse");

/// A `nisse` command with a clean environment: no NISSE_* from the caller,
/// and its own working directory so no stray `nisse.toml` is read.
fn nisse(dir: &Path) -> Command {
    let mut cmd = Command::new(NISSE);
    cmd.current_dir(dir).env("NISSE_LOG", "info");
    // Never the default webhook port: tests run beside anything.
    for (k, _) in std::env::vars() {
        if k.starts_with("NISSE_") && k != "NISSE_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.env("NISSE_INTAKE_ALERTS__LISTEN", "127.0.0.1:0");
    cmd.kill_on_drop(true);
    cmd
}

async fn run(cmd: &mut Command) -> Output {
    tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("command finished in time")
        .expect("command ran")
}

/// The user `nisse` runs as, as its CLI names it (`cli:<user>`).
fn local_user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .unwrap()
        .name
}

/// Waits until intake-matrix reads `room`: `operator` asks `status?`
/// until the agent `agent_id` answers (what was said before the service
/// first started is history, not for it).
async fn room_listening(operator: &nisse_tests::synapse::TestClient, room: &str, agent_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        operator.send_text(room, "status?").await.unwrap();
        let answered = operator
            .wait_for_message(
                room,
                |e| {
                    e["sender"] == agent_id
                        && e["content"]["body"]
                            .as_str()
                            .is_some_and(|b| b.contains("No work item"))
                },
                Duration::from_secs(3),
            )
            .await;
        if answered.is_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "intake-matrix never read the room"
        );
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn spawn_up(dir: &Path, data: &Path) -> Child {
    nisse(dir)
        .arg("up")
        .arg("--data-dir")
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nisse up starts")
}

/// Waits for `nisse up` to write its endpoints file.
async fn wait_endpoints(data: &Path, child: &mut Child) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(bytes) = std::fs::read(data.join("endpoints.json")) {
            return serde_json::from_slice(&bytes).unwrap();
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("nisse up exited early with {status}");
        }
        assert!(Instant::now() < deadline, "nisse up never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Messages in the ops stream that are not time passing, as `nisse replay
/// --json` prints them.
async fn stream_messages(dir: &Path, data: &Path) -> u64 {
    let out = run(nisse(dir)
        .args(["replay", "--agent", "ops", "--json", "--data-dir"])
        .arg(data))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Time goes on in every stream (ticks, due duties) and the brain says
    // when it started: what a test counts is everything else.
    text(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|m| {
            let subject = m["subject"].as_str().unwrap_or_default();
            !(subject.ends_with(".in.tick")
                || subject.ends_with(".in.started")
                || subject.contains(".in.duty."))
        })
        .count() as u64
}

/// Waits until the executor of a running `nisse up` has answered the one
/// execution request published (a refusal: it carries no permission), so
/// the stream holds two messages and no more are coming; returns that.
async fn answered(dir: &Path, data: &Path) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = stream_messages(dir, data).await;
        if n >= 2 {
            return n;
        }
        assert!(Instant::now() < deadline, "the executor never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The pid in the embedded server's ports file, `nats-server_<pid>.ports`.
fn embedded_server_pid(data: &Path) -> u32 {
    std::fs::read_dir(data.join("nats"))
        .unwrap()
        .filter_map(|e| e.ok())
        .find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("nats-server_")?
                .strip_suffix(".ports")?
                .parse()
                .ok()
        })
        .expect("the embedded server's ports file")
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

fn sigterm(child: &Child) {
    let pid = child.id().expect("running") as i32;
    // The test harness sends what a supervisor would.
    signal(pid, Signal::SIGTERM);
}

/// Sends SIGTERM and asserts `nisse up` exits successfully within 5 s.
async fn stop_within_5s(child: &mut Child) {
    sigterm(child);
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("stopped within 5 s")
        .unwrap();
    assert!(status.success(), "exit status {status}");
}

/// A bus connection for agent `ops` to the server at `url`.
/// A connection to the server of the `nisse up` whose data directory is
/// `data`, as its admin (the only identity that may publish anything:
/// these tests stand in for the services).
async fn bus_at(url: &str, data: &Path) -> nisse_bus::Bus {
    let cfg = nisse_bus::BusConfig {
        url: Some(url.to_string()),
        ..Default::default()
    };
    nisse_bus::Bus::connect_as(
        &cfg,
        vec![nisse_tests::ops()],
        &nisse_bus::auth::Identity::Admin,
        &nisse_bus::auth::Credentials::in_data_dir(data),
    )
    .await
    .unwrap()
}

fn signal(pid: i32, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
}

/// `nisse up --cluster 3` runs three embedded servers as one cluster:
/// every stream and bucket has a replica on each, the services reach them
/// all, and a server killed under it is started again while the rest goes
/// on; it stops cleanly on SIGTERM.
#[tokio::test]
async fn up_with_a_cluster_replicates_every_stream_on_each_server_and_restarts_a_dead_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut up = nisse(dir.path());
    up.args(["up", "--cluster", "3", "--data-dir"])
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = up.spawn().unwrap();
    let endpoints = wait_endpoints(&data, &mut child).await;
    let url = endpoints["nats_url"].as_str().unwrap().to_string();
    assert_eq!(url.split(',').count(), 3, "{url}");
    let out = run(nisse(dir.path())
        .args(["streams", "--json", "--data-dir"])
        .arg(&data))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let admin = nisse_bus::Bus::connect_as(
        &nisse_bus::BusConfig {
            url: Some(url.clone()),
            ..Default::default()
        },
        vec![nisse_tests::ops()],
        &nisse_bus::auth::Identity::Admin,
        &nisse_bus::auth::Credentials::in_data_dir(&data),
    )
    .await
    .unwrap();
    for stream in ["AGENT_OPS", "KV_nisse_leases"] {
        let mut s = admin.jetstream().get_stream(stream).await.unwrap();
        let info = s.info().await.unwrap();
        assert_eq!(info.config.num_replicas, 3, "{stream}");
    }
    // A server dies: `nisse up` starts it again on its ports and store.
    let pid_file = std::fs::read_dir(data.join("nats/node-1"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "ports"))
        .expect("node 1's ports file");
    let pid: i32 = pid_file
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .rsplit('_')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    signal(pid, Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let restarted = std::fs::read_dir(data.join("nats/node-1"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .any(|p| {
                p.extension().is_some_and(|x| x == "ports")
                    && !p.to_string_lossy().ends_with(&format!("_{pid}.ports"))
            });
        if restarted {
            break;
        }
        assert!(Instant::now() < deadline, "node 1 was not started again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(child.try_wait().unwrap().is_none(), "nisse up exited");
    stop_within_5s(&mut child).await;
}

#[tokio::test]
async fn up_starts_its_own_server_reports_its_topology_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Another server already holds the preferred port: `nisse up` must still
    // start, on a free port.
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = squatter.local_addr().unwrap().port();
    let mut up = nisse(dir.path());
    up.arg("up")
        .arg("--data-dir")
        .arg(&data)
        .env("NISSE_EMBEDDED__PORT", taken.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = up.spawn().unwrap();
    let endpoints = wait_endpoints(&data, &mut child).await;
    assert_eq!(endpoints["nats_embedded"], true);
    assert_eq!(endpoints["agents"], serde_json::json!(["ops"]));
    assert_eq!(
        endpoints["services"],
        serde_json::json!([
            "brain",
            "classifier",
            "model-gateway",
            "executor",
            "intake-matrix",
            "scheduler",
            "prober",
            "vault-writer",
            "vault-reader",
            "intake-alerts",
            "intake-gitea",
            "intake-vikunja",
            "mcp",
            "control"
        ])
    );
    // The webhook address is written only once it answers.
    let webhook = endpoints["listeners"]["alertmanager-webhook"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(webhook.starts_with("http://127.0.0.1:"), "{webhook}");
    let health = reqwest::get(webhook.replace("/api/v1/alerts", "/healthz"))
        .await
        .unwrap();
    assert!(health.status().is_success(), "{}", health.status());
    let url = endpoints["nats_url"].as_str().unwrap().to_string();
    assert!(url.starts_with("nats://127.0.0.1:"), "{url}");
    assert!(
        !url.ends_with(&format!(":{taken}")),
        "used the taken port: {url}"
    );
    let server_pid = embedded_server_pid(&data);
    assert!(process_exists(server_pid));

    // Other commands find the server through the data directory.
    let out = run(nisse(dir.path())
        .args(["streams", "--json", "--data-dir"])
        .arg(&data))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let streams: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ops = &streams["streams"][0];
    assert_eq!(ops["stream"], "AGENT_OPS");
    assert_eq!(ops["agent"], "ops");
    assert_eq!(ops["dead_letters"], 0);
    let consumers: Vec<(&str, &str)> = ops["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["filter"].as_str().unwrap()))
        .collect();
    assert_eq!(
        consumers,
        vec![
            ("brain", "nisse.ops.in.>"),
            ("classifier", "nisse.ops.out.classify.req"),
            ("model-gateway", "nisse.ops.out.model.req"),
            ("executor", "nisse.ops.out.exec.req"),
            ("matrix-tell", "nisse.ops.out.tell"),
            ("prober", "nisse.ops.out.probe.req"),
            ("vault-writer", "nisse.ops.out.vault.write"),
            ("vault-reader", "nisse.ops.out.vault.query"),
            ("intake-gitea", "nisse.ops.out.gitea.req"),
            ("intake-vikunja", "nisse.ops.out.vikunja.req"),
            ("vikunja-tell", "nisse.ops.out.tell"),
            ("mcp", "nisse.ops.out.mcp.req"),
        ]
    );

    // A second `nisse up` on the same data directory is refused.
    let second = run(nisse(dir.path()).arg("up").arg("--data-dir").arg(&data)).await;
    assert!(!second.status.success());
    assert!(
        text(&second.stderr).contains("already running"),
        "{}",
        text(&second.stderr)
    );

    stop_within_5s(&mut child).await;
    let out = child.wait_with_output().await.unwrap();
    let stdout = text(&out.stdout);
    assert!(stdout.contains("stream:    AGENT_OPS"), "{stdout}");
    assert!(
        !process_exists(server_pid),
        "the embedded nats-server outlived nisse up"
    );
    assert!(
        !data.join("endpoints.json").exists(),
        "endpoints.json left behind"
    );

    // Afterwards, commands say nothing runs there.
    let out = run(nisse(dir.path())
        .arg("streams")
        .arg("--data-dir")
        .arg(&data))
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no endpoints.json"),
        "{}",
        text(&out.stderr)
    );
    drop(squatter);
}

#[tokio::test]
async fn up_keeps_the_streams_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut child = spawn_up(dir.path(), &data);
    let endpoints = wait_endpoints(&data, &mut child).await;
    let url = endpoints["nats_url"].as_str().unwrap().to_string();
    let bus = bus_at(&url, &data).await;
    bus.publish(exec_request("kept")).await.unwrap();
    bus.flush().await.unwrap();
    let before = answered(dir.path(), &data).await;
    stop_within_5s(&mut child).await;

    let mut child = spawn_up(dir.path(), &data);
    wait_endpoints(&data, &mut child).await;
    assert_eq!(stream_messages(dir.path(), &data).await, before);
    stop_within_5s(&mut child).await;
}

#[tokio::test]
async fn up_restarts_its_embedded_server_when_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut child = spawn_up(dir.path(), &data);
    let endpoints = wait_endpoints(&data, &mut child).await;
    let url = endpoints["nats_url"].as_str().unwrap().to_string();
    let bus = bus_at(&url, &data).await;
    bus.publish(exec_request("before-crash")).await.unwrap();
    let before = answered(dir.path(), &data).await;

    let first = embedded_server_pid(&data);
    signal(first as i32, Signal::SIGKILL);

    // A new server comes up on the same port with the same store.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = std::fs::read_dir(data.join("nats"))
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.ends_with(".ports") && !name.contains(&first.to_string())
            });
        if now {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "nisse up exited instead of restarting the server"
        );
        assert!(Instant::now() < deadline, "the server was not restarted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        stream_messages(dir.path(), &data).await,
        before,
        "the stored messages survived"
    );
    let endpoints_after = wait_endpoints(&data, &mut child).await;
    assert_eq!(endpoints_after["nats_url"], url.as_str());
    // The connection made before the crash reconnects by itself.
    let deadline = Instant::now() + Duration::from_secs(10);
    while bus.publish(exec_request("after-crash")).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "no reconnect to the restarted server"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    stop_within_5s(&mut child).await;
}

#[tokio::test]
async fn up_without_nats_server_says_how_to_install_one() {
    let dir = tempfile::tempdir().unwrap();
    // A machine without the server: neither on PATH nor in /usr/sbin.
    let out = run(nisse(dir.path())
        .arg("up")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("NISSE_EMBEDDED__PROGRAM", "nats-server-not-installed"))
    .await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("nats-server") && err.contains("apt-get install nats-server"),
        "{err}"
    );
}

#[tokio::test]
async fn up_uses_nisse_nats_url_and_replay_prints_the_stream() {
    let nats = TestNats::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut up = nisse(dir.path());
    up.arg("up")
        .arg("--data-dir")
        .arg(&data)
        .env("NISSE_NATS_URL", nats.url())
        .env("NISSE_AGENTS", "ops,dev")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = up.spawn().unwrap();
    let endpoints = wait_endpoints(&data, &mut child).await;
    assert_eq!(endpoints["nats_embedded"], false);
    assert_eq!(endpoints["nats_url"], nats.url());
    assert!(
        !data.join("nats").exists(),
        "no embedded server when a URL is given"
    );

    let bus = nats.bus(&["ops"]).await.unwrap();
    // All three handed to the connection before any ack is awaited, so
    // they are stored back to back, before the executor (which answers
    // each request) can put its answers in between.
    let a = bus.send(exec_request("a")).await.unwrap();
    let b = bus.send(exec_request("b")).await.unwrap();
    // Something that is not a valid message shows up as undecodable.
    let bad = bus
        .jetstream()
        .publish("nisse.ops.out.exec.req", bytes::Bytes::from_static(b"\x08"))
        .await
        .unwrap();
    let first = a.acked().await.unwrap().sequence;
    b.acked().await.unwrap();
    bad.await.unwrap();

    // The brain's start and the clock's ticks are in the stream too.
    let (from, to) = ((first + 1).to_string(), (first + 2).to_string());
    let out = run(nisse(dir.path())
        // b and the bad message: the brain dead-letters the bad one right
        // after.
        .args([
            "replay",
            "--agent",
            "ops",
            "--from-seq",
            from.as_str(),
            "--to-seq",
            to.as_str(),
            "--json",
        ])
        .env("NISSE_NATS_URL", nats.url()))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["seq"], first + 1);
    assert_eq!(lines[0]["type"], "nisse.v1.ExecRequest");
    assert_eq!(lines[0]["headers"]["Nats-Msg-Id"], "exec:b");
    assert_eq!(lines[0]["message"]["request_id"], "b");
    assert_eq!(lines[0]["message"]["envelope"]["work_item_id"], "wi-1");
    assert_eq!(lines[0]["message"]["command"], "zpool status # b");
    assert_eq!(lines[1]["seq"], first + 2);
    assert!(
        lines[1]["error"]
            .as_str()
            .unwrap()
            .contains("nisse.v1.ExecRequest"),
        "{}",
        lines[1]
    );

    // Both configured agents got their streams.
    let out = run(nisse(dir.path())
        .args(["streams", "--json"])
        .env("NISSE_NATS_URL", nats.url()))
    .await;
    let streams: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = streams["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stream"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["AGENT_DEV", "AGENT_OPS"]);

    stop_within_5s(&mut child).await;
}

#[tokio::test]
async fn streams_counts_dead_letters() {
    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    bus.jetstream()
        .publish("nisse.ops.out.exec.req", bytes::Bytes::from_static(b"\xff"))
        .await
        .unwrap()
        .await
        .unwrap();
    let mut c = bus
        .consumer::<ExecRequest>(&nisse_tests::ops(), nisse_bus::ConsumerSpec::EXECUTOR)
        .await
        .unwrap();
    let token = tokio_util::sync::CancellationToken::new();
    // The poison is dead-lettered on the way; nothing valid arrives.
    assert!(
        tokio::time::timeout(Duration::from_secs(2), c.next(&token))
            .await
            .is_err()
    );

    let dir = tempfile::tempdir().unwrap();
    let out = run(nisse(dir.path())
        .args(["streams", "--json"])
        .env("NISSE_NATS_URL", nats.url()))
    .await;
    let streams: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(streams["streams"][0]["dead_letters"], 1);
    let out = run(nisse(dir.path())
        .arg("streams")
        .env("NISSE_NATS_URL", nats.url()))
    .await;
    assert!(
        text(&out.stdout).contains("dead-letters=1"),
        "{}",
        text(&out.stdout)
    );
}

#[tokio::test]
async fn config_check_names_each_bad_key_and_masks_secrets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("nisse.toml"),
        "agents = [\"ops\", \"Dev\"]\n[bus]\nuser = \"nisse\"\n[bus.consumers]\nmax-deliver = 0\n",
    )
    .unwrap();
    let out = run(nisse(dir.path()).args(["config", "check"])).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    for key in ["agents[1]", "bus.user", "bus.consumers.max-deliver"] {
        assert!(err.contains(key), "{key} not named in: {err}");
    }

    std::fs::write(
        dir.path().join("nisse.toml"),
        "[bus]\nuser = \"nisse\"\npassword = \"hunter2\"\n",
    )
    .unwrap();
    let out = run(nisse(dir.path())
        .args(["config", "check"])
        .env("NISSE_BUS__STREAMS__MAX_AGE", "7d"))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("password = \"<redacted>\""), "{shown}");
    assert!(shown.contains("max-age = \"7days\""), "{shown}");
}

#[tokio::test]
async fn serve_refuses_an_unknown_service_by_name() {
    let nats = TestNats::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = run(nisse(dir.path())
        .args(["serve", "teleporter"])
        .env("NISSE_NATS_URL", nats.url()))
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(
            "unknown service `teleporter`; known services: brain, classifier, model-gateway, executor, intake-matrix, scheduler, prober, vault-writer, vault-reader, intake-alerts"
        ),
        "{}",
        text(&out.stderr)
    );
}

/// With `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans reach the collector over
/// OTLP/HTTP. The collector here is a loopback listener that records the
/// requests it gets.
#[tokio::test]
async fn traces_are_exported_over_otlp_when_an_endpoint_is_set() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let collector = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", collector.local_addr().unwrap());
    let requests = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Ok(Ok((mut sock, _))) =
            tokio::time::timeout(Duration::from_secs(20), collector.accept()).await
        {
            let mut buf = vec![0u8; 1 << 16];
            let mut got = Vec::new();
            // Read the head and as much body as arrives promptly.
            while let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(300), sock.read(&mut buf)).await
            {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
                .await;
            seen.push(got);
            let needle = b"bus.ensure_topology";
            if seen
                .iter()
                .any(|r| r.windows(needle.len()).any(|w| w == needle))
            {
                break;
            }
        }
        seen
    });

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut up = nisse(dir.path());
    up.arg("up")
        .arg("--data-dir")
        .arg(&data)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = up.spawn().unwrap();
    wait_endpoints(&data, &mut child).await;
    stop_within_5s(&mut child).await;

    let seen = requests.await.unwrap();
    let traces: Vec<String> = seen
        .iter()
        .map(|r| String::from_utf8_lossy(r).into_owned())
        .filter(|r| r.starts_with("POST /v1/traces"))
        .collect();
    assert!(
        !traces.is_empty(),
        "no OTLP request arrived: {} connections",
        seen.len()
    );
    assert!(
        traces
            .iter()
            .any(|t| t.contains("bus.ensure_topology") && t.contains("nisse")),
        "the topology span was not exported"
    );
}

/// A rebuild from a stream whose first messages aged out says so loudly,
/// and what that means for the state it built.
#[tokio::test]
async fn replay_rebuild_warns_when_history_aged_out() {
    let nats = TestNats::start().await.unwrap();
    let mut cfg = nats.bus_config();
    cfg.streams.max_age = Duration::from_secs(2);
    cfg.streams.duplicate_window = Duration::from_secs(1);
    let bus = nats.bus_with(cfg, &["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    let ops = nisse_tests::ops();
    alerts::publish_alert(&nats, "Old1", "a").await;
    alerts::publish_alert(&nats, "Old2", "b").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while bus.stream_bounds(&ops).await.unwrap().messages > 0 {
        assert!(Instant::now() < deadline, "the old messages never aged out");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    alerts::publish_alert(&nats, "New1", "c").await;

    let dir = tempfile::tempdir().unwrap();
    let out = run(nisse(dir.path())
        .args(["replay", "--agent", "ops", "--rebuild"])
        .arg(dir.path().join("rebuilt"))
        .env("NISSE_NATS_URL", nats.url()))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("WARNING")
            && err.contains("begins at sequence 3")
            && err.contains("sequences 1 to 2 aged out"),
        "{err}"
    );
    assert!(
        text(&out.stdout).contains("1 work items"),
        "{}",
        text(&out.stdout)
    );
}
