//! Beyond one machine, from the deployment `nisse deploy render` writes:
//! the plain-process layout started as it says (a 3-node NATS cluster,
//! `nisse bus init` once, every service of the agent in a process of its
//! own holding only its own credentials), a burst of alerts that outlives
//! the server leading the agent's stream being killed and started again;
//! and the compose file of the same layout, checked against the compose
//! specification and against what the repository holds.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::process::{Child, Command};

use nisse_bus::Bus;
use nisse_bus::auth::{Credentials, Identity};

use super::alerts::{burst_body, each_alert_once_on};
use super::{nisse, run, signal, text};

/// One process of the rendered layout, as started.
struct Running {
    name: String,
    spec: Value,
    child: Child,
    log: PathBuf,
}

impl Running {
    /// Starts `spec` (a process of `layout.json`), its output in
    /// `logs/<name>.log`.
    fn start(spec: &Value, logs: &Path) -> Self {
        let name = spec["name"].as_str().unwrap().to_string();
        let command: Vec<&str> = spec["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let log = logs.join(format!("{name}.log"));
        let mut cmd = Command::new(command[0]);
        cmd.args(&command[1..])
            .env("NISSE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true);
        for (k, _) in std::env::vars() {
            if k.starts_with("NISSE_") && k != "NISSE_LOG" {
                cmd.env_remove(k);
            }
        }
        for (k, v) in spec["env"].as_object().unwrap() {
            cmd.env(k, v.as_str().unwrap());
        }
        Self {
            name,
            spec: spec.clone(),
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Waits until `url` answers 2xx, or panics with `log()`.
async fn ready(url: &str, log: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = reqwest::get(url).await
            && r.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never ready:\n{}", log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Seed X3/X4 and the design's scale-out, from the rendered layout: on a
/// 3-node cluster `nisse bus init` gives every stream and bucket three
/// replicas; each unit holds its own seed and no other; 2,000 alerts
/// posted in bursts of ten while the server leading the agent's stream is
/// killed and started again are each applied once, no item twice, and the
/// stream keeps three replicas. Posts the intake could not store meanwhile
/// are sent again, as Alertmanager does; every unit's process rides the
/// failover out.
#[tokio::test]
async fn the_rendered_processes_on_a_three_node_cluster_apply_every_alert_once_though_a_server_dies()
 {
    let dir = tempfile::tempdir().unwrap();
    let port = super::alerts::free_port();
    let control_port = super::alerts::free_port();
    std::fs::write(
        dir.path().join("nisse.toml"),
        format!(
            "[intake-alerts]\nlisten = \"127.0.0.1:{port}\"\n[ops]\noperators = [\"control:alice\"]\n[control]\nlisten = \"127.0.0.1:{control_port}\"\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("deploy");
    // The webhook's port is the configuration's (the rendered units read
    // the configuration the render wrote, environment included).
    let rendered = run(nisse(dir.path())
        .env_remove("NISSE_INTAKE_ALERTS__LISTEN")
        .args([
            "deploy",
            "render",
            "--processes",
            "--nats-nodes",
            "3",
            "--out",
        ])
        .arg(&out))
    .await;
    assert!(rendered.status.success(), "{}", text(&rendered.stderr));
    let layout: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("layout.json")).unwrap()).unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();

    // Every unit holds its own NATS seed and no other.
    let units = layout["units"].as_array().unwrap();
    let names: Vec<&str> = units.iter().map(|u| u["name"].as_str().unwrap()).collect();
    for expected in [
        "brain-ops",
        "classifier-ops",
        "executor-ops",
        "scheduler-ops",
        "prober-ops",
        "vault-writer-ops",
        "vault-reader-ops",
        "intake-alerts-ops",
        "control",
    ] {
        assert!(names.contains(&expected), "{expected}: {names:?}");
    }
    for unit in &names {
        let seeds: Vec<String> =
            std::fs::read_dir(out.join("units").join(unit).join("credentials/nats"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
        assert_eq!(seeds, [format!("{unit}.nk")], "{unit}");
    }

    // The servers, together (a cluster serves once a majority is up).
    let mut nats: Vec<Running> = layout["nats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| Running::start(n, &logs))
        .collect();
    let url = layout["nats_url"].as_str().unwrap().to_string();
    // The init, run until it succeeds, as compose restarts it on failure.
    let deadline = Instant::now() + Duration::from_secs(60);
    let init = loop {
        let mut init = Running::start(&layout["init"], &logs);
        let status = init.child.wait().await.unwrap();
        if status.success() {
            break init.log();
        }
        assert!(Instant::now() < deadline, "init failed:\n{}", init.log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut processes: Vec<Running> = units.iter().map(|u| Running::start(u, &logs)).collect();
    for p in &processes {
        ready(p.spec["ready_url"].as_str().unwrap(), || p.log()).await;
    }
    let admin = Bus::connect_as(
        &nisse_bus::BusConfig {
            url: Some(url.clone()),
            ..Default::default()
        },
        vec![nisse_tests::ops()],
        &Identity::Admin,
        &Credentials::in_data_dir(&out),
    )
    .await
    .unwrap();
    assert_eq!(admin.cluster_size(), 3, "{init}");
    for stream in ["AGENT_OPS", "KV_nisse_leases", "KV_nisse_exec"] {
        let mut s = admin.jetstream().get_stream(stream).await.unwrap();
        assert_eq!(s.info().await.unwrap().config.num_replicas, 3, "{stream}");
    }

    const ALERTS: usize = 2_000;
    const PER_POST: usize = 10;
    let token = std::fs::read_to_string(
        out.join("units/intake-alerts-ops/credentials/alertmanager-webhook.token"),
    )
    .unwrap();
    let webhook = format!("http://127.0.0.1:{port}/api/v1/alerts");
    let client = reqwest::Client::new();
    let mut refused = 0;
    let mut killed = None;
    for post in 0..ALERTS / PER_POST {
        if post == 60 {
            // The stream's leader: the server every publish goes through.
            let mut stream = admin.jetstream().get_stream("AGENT_OPS").await.unwrap();
            let info = stream.info().await.unwrap();
            let node: usize = info
                .cluster
                .as_ref()
                .and_then(|c| c.leader.as_deref()?.strip_prefix("nisse-")?.parse().ok())
                .unwrap_or_else(|| panic!("no leader named: {:?}", info.cluster));
            signal(nats[node].child.id().unwrap() as i32, Signal::SIGKILL);
            nats[node].child.wait().await.unwrap();
            killed = Some(node);
        }
        if post == 120 {
            let node = killed.unwrap();
            nats[node] = Running::start(&nats[node].spec.clone(), &logs);
        }
        // As Alertmanager does: a post that is not stored is sent again.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = client
                .post(&webhook)
                .bearer_auth(token.trim())
                .json(&burst_body(post * PER_POST, PER_POST))
                .send()
                .await;
            match r {
                Ok(r) if r.status().is_success() => break,
                other => {
                    refused += 1;
                    assert!(
                        Instant::now() < deadline,
                        "post {post} never stored: {other:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    eprintln!("{refused} posts were answered with an error and sent again");

    let store = nisse_core::Store::path_in(&out.join("units/brain-ops"), "ops");
    let deadline = Instant::now() + Duration::from_secs(90);
    let s = loop {
        if let Ok(s) = nisse_core::Store::open_read_only(&store, "ops").and_then(|s| s.snapshot())
            && s.items.len() == ALERTS
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the brain never applied every alert:\n{}",
            nisse_tests::tail(&processes[0].log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Its outputs published too (a tell and a host binding an item, after
    // its commit), then each alert once, each item told once.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let stream = admin.jetstream().get_stream("AGENT_OPS").await.unwrap();
        let mut counts = stream.info_with_subjects("nisse.ops.out.*").await.unwrap();
        let mut held = std::collections::BTreeMap::new();
        while let Some(c) = futures::StreamExt::next(&mut counts).await {
            let (subject, n) = c.unwrap();
            held.insert(subject, n);
        }
        if held.get("nisse.ops.out.tell").copied().unwrap_or(0) >= ALERTS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the brain never published a tell for every item: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    each_alert_once_on(&admin, &s, ALERTS).await;
    let mut stream = admin.jetstream().get_stream("AGENT_OPS").await.unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(info.config.num_replicas, 3);
    assert_eq!(info.cluster.clone().unwrap().replicas.len(), 2);
    // The control unit's read model has them too, and an operator on
    // another machine reads them over TLS with the CA the render made.
    let token = run(nisse(dir.path())
        .arg("--config")
        .arg(out.join("nisse.toml"))
        .arg("--data-dir")
        .arg(out.join("units/control"))
        .args(["control", "token", "alice"]))
    .await;
    assert!(token.status.success(), "{}", text(&token.stderr));
    let elsewhere = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = run(nisse(elsewhere.path())
            .env("NISSE_CONTROL_TOKEN", text(&token.stdout).trim())
            .arg("--control")
            .arg(format!("https://127.0.0.1:{control_port}"))
            .arg("--control-ca")
            .arg(out.join("credentials/control-tls/ca.pem"))
            .args(["items", "--json"]))
        .await;
        let items = serde_json::from_slice::<Value>(&listed.stdout)
            .ok()
            .and_then(|v| Some(v.get("items")?.as_array()?.len()));
        if items == Some(ALERTS) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the control unit never showed every item ({items:?}): {}\n{}",
            text(&listed.stderr),
            processes
                .iter()
                .find(|p| p.name == "control")
                .map(|p| nisse_tests::tail(&p.log(), 40))
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for p in &mut processes {
        assert!(
            p.child.try_wait().unwrap().is_none(),
            "{} exited:\n{}",
            p.name,
            p.log()
        );
    }
    for p in processes.iter_mut().chain(nats.iter_mut()) {
        signal(p.child.id().unwrap() as i32, Signal::SIGTERM);
        let _ = tokio::time::timeout(Duration::from_secs(10), p.child.wait()).await;
    }
}

/// The compose deployment of `compose/nisse.toml` (the ops agent with
/// Matrix and models) is the one this repository holds in
/// `compose/compose.yaml`, written from the same layout the process test
/// starts, and it is valid against the compose specification's schema
/// (check-jsonschema, PyPI, which carries it).
#[tokio::test]
async fn the_compose_file_is_what_the_render_writes_and_valid_against_the_compose_specification() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("site");
    // The example configuration, the webhook on its default port.
    let compose = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../compose");
    let rendered = run(nisse(dir.path())
        .env_remove("NISSE_INTAKE_ALERTS__LISTEN")
        .arg("--config")
        .arg(compose.join("nisse.toml"))
        .args(["deploy", "render", "--compose", "--out"])
        .arg(&out))
    .await;
    assert!(rendered.status.success(), "{}", text(&rendered.stderr));
    let written = std::fs::read_to_string(out.join("compose.yaml")).unwrap();
    let held = std::fs::read_to_string(compose.join("compose.yaml")).unwrap_or_default();
    assert!(
        written == held,
        "compose/compose.yaml is not what `nisse deploy render --compose` writes for compose/nisse.toml; render it again into a scratch directory and copy its compose.yaml\n--- written\n{written}"
    );
    // The homeserver and the model proxy the configuration uses are there.
    assert!(written.contains("\n  synapse:\n") && written.contains("\n  litellm:\n"));
    // Each unit's secrets are its own.
    assert!(written.contains("target: \"/data/credentials/nats/brain-ops.nk\""));
    assert!(written.contains("brain-ops-signing-key"));
    let executor = service_block(&written, "executor-ops");
    assert!(!executor.contains("signing-key\""), "{executor}");
    assert!(executor.contains("signing-pub"), "{executor}");

    let venv = std::env::var_os("NISSE_CHECK_JSONSCHEMA_VENV").map(PathBuf::from);
    let check = venv
        .map(|v| v.join("bin/check-jsonschema"))
        .filter(|p| p.is_file())
        .expect("this test needs check-jsonschema (PyPI `check-jsonschema`): run it through scripts/test, which installs it and sets NISSE_CHECK_JSONSCHEMA_VENV");
    let checked = run(Command::new(check)
        .args(["--builtin-schema", "vendor.compose-spec"])
        .arg(out.join("compose.yaml")))
    .await;
    assert!(
        checked.status.success(),
        "{}{}",
        text(&checked.stdout),
        text(&checked.stderr)
    );
}

/// The lines of service `name` in a compose file: its key at two spaces,
/// and what is indented under it.
fn service_block(yaml: &str, name: &str) -> String {
    let head = format!("  {name}:");
    yaml.lines()
        .skip_while(|l| *l != head)
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .collect::<Vec<_>>()
        .join("\n")
}
