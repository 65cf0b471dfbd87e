//! Approved steps run end to end, each service in its own process: an
//! alert opens an item bound to the host its `instance` label names, the
//! operator proposes and approves a plan, and the executor runs every
//! check and step over SSH on a real OpenSSH `sshd`. Then the executor is
//! killed in the middle of a step: the step's outcome is reported unknown
//! and it is never run again.

use std::time::{Duration, Instant};

use base64::Engine as _;
use nix::sys::signal::Signal;

use nisse_bus::AnyMessage;
use nisse_core::Event;
use nisse_core::plans::PlanStatus;
use nisse_tests::TestNats;
use nisse_tests::sshd::TestSshd;

use super::alerts::{Install, publish_alert, rebuild, stop, wait_quiet};
use super::gates::{cli, stream_kinds};
use super::signal;

const SECRET: &str = "e2e-s3cr3t-value-0123456789";

/// An install whose executor reaches `sshd` as host `tool`, with a secret
/// the host allows and the policy grants to the step that asks for it, and
/// consumers timed for tests.
pub(super) async fn install(
    nats: &TestNats,
    sshd: &TestSshd,
) -> (Install, Vec<tokio::process::Child>) {
    let (install, intake, brain) = Install::start(nats, nats.bus_config()).await;
    let known_hosts = install.path().join("known_hosts");
    sshd.write_known_hosts(&known_hosts, "127.0.0.1").unwrap();
    std::fs::write(install.path().join("secret"), SECRET).unwrap();
    // The policy grants the secret to the programs of the step that needs
    // it, as an operator's policy file does.
    std::fs::write(
        install.path().join("policy.toml"),
        "version = 1\n\n[[secret]]\nname = \"token\"\ncommands = [\"printf\", \"base64\", \"echo\"]\n",
    )
    .unwrap();
    let cfg = install.path().join("nisse.toml");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "[policy]\nfile = {:?}\n",
        install.path().join("policy.toml").display().to_string()
    ));
    text.push_str(&format!(
        "[executor.agents.ops]\n\
         key-file = {key:?}\n\
         known-hosts = {known:?}\n\
         [executor.agents.ops.secrets.token]\n\
         file = {secret:?}\n\
         [executor.agents.ops.hosts.tool]\n\
         address = \"127.0.0.1\"\n\
         port = {port}\n\
         user = {user:?}\n\
         secrets = [{{ name = \"token\", env = \"NISSE_TEST_SECRET\" }}]\n",
        key = sshd.client_key().display().to_string(),
        known = known_hosts.display().to_string(),
        secret = install.path().join("secret").display().to_string(),
        port = sshd.port(),
        user = sshd.user(),
    ));
    std::fs::write(&cfg, text).unwrap();
    let classifier = install.serve(&["classifier"]);
    let executor = install.serve(&["executor"]);
    (install, vec![intake, brain, classifier, executor])
}

fn results(s: &nisse_core::Snapshot) -> Vec<(usize, String, String, i32)> {
    s.events
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepResult {
                step,
                phase,
                status,
                exit_code,
                ..
            } => Some((*step, phase.clone(), status.clone(), *exit_code)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn an_approved_three_step_plan_runs_over_ssh_and_lands_on_the_item() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let sshd = TestSshd::start().await.unwrap();
    let (install, mut children) = install(&nats, &sshd).await;
    publish_alert(&nats, "ServiceDown", "tool:9100").await;
    let s = install
        .wait_until("item #1 is bound to tool", Duration::from_secs(20), |s| {
            s.events.iter().any(|e| e.event.kind() == "hosts_bound")
        })
        .await;
    assert!(s.events.iter().any(|e| matches!(&e.event,
        Event::HostsBound { hosts, .. } if hosts == &["tool".to_string()])));

    let work = sshd.dir().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let w = work.display();
    std::fs::write(
        install.path().join("plan.toml"),
        format!(
            r#"
rationale = "Restart the service the way the runbook says."

[[step]]
target = "tool"
tool = "file.write"
arguments = {{ path = "{w}/state", content = "stopped\n", mode = "0640" }}
expected = {{ command = "cat {w}/state", output-contains = "stopped" }}

[[step]]
target = "tool"
command = "printf '%s' \"$NISSE_TEST_SECRET\" | base64; echo \"token $NISSE_TEST_SECRET\"; echo started > {w}/state"
secrets = ["token"]
precondition = {{ command = "test -f {w}/state" }}

[[step]]
target = "tool"
command = "cat {w}/state"
expected = {{ command = "grep -c started {w}/state", output-contains = "1" }}
"#
        ),
    )
    .unwrap();
    let out = cli(&install, &["plan", "propose", "1", "plan.toml"]).await;
    assert!(out.contains("plan rev-1 proposed (3 steps)"), "{out}");
    install
        .wait_until("rev-1 is up", Duration::from_secs(20), |s| {
            s.plans.iter().any(|p| p.status == PlanStatus::Up)
        })
        .await;
    let out = cli(&install, &["approve", "1", "rev-1"]).await;
    assert!(out.contains("approved rev-1"), "{out}");

    let s = install
        .wait_until("rev-1 finished", Duration::from_secs(30), |s| {
            s.plans.iter().any(|p| p.status == PlanStatus::Done)
                || s.plans.iter().any(|p| p.halted.is_some())
        })
        .await;
    assert_eq!(s.plans[0].status, PlanStatus::Done, "{:#?}", s.plans[0]);
    // Every check and step ran, in order, with its exit code.
    assert_eq!(
        results(&s),
        [
            (1, "run".into(), "completed".into(), 0),
            (1, "post".into(), "completed".into(), 0),
            (2, "pre".into(), "completed".into(), 0),
            (2, "run".into(), "completed".into(), 0),
            (3, "run".into(), "completed".into(), 0),
            (3, "post".into(), "completed".into(), 0),
        ]
    );
    assert_eq!(
        std::fs::read_to_string(work.join("state")).unwrap(),
        "started\n"
    );

    // `nisse item show` shows the results and their output.
    let shown = cli(&install, &["item", "show", "#1"]).await;
    assert!(shown.contains("hosts bound: tool"), "{shown}");
    assert!(
        shown.contains(&format!("step 1 run on tool: file.write {w}/state")),
        "{shown}"
    );
    assert!(
        shown.contains("result: rev-1 step 3 run: completed (exit 0)"),
        "{shown}"
    );
    assert!(shown.contains("stdout │ started"), "{shown}");
    assert!(shown.contains("plan rev-1 finished"), "{shown}");

    // The secret the executor handed to step 2 is nowhere: not in the
    // item's log, not in `item show`, not anywhere in the stream.
    let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
    let live = wait_quiet(&install, &nats).await;
    let log = serde_json::to_string(&live.events).unwrap();
    assert!(log.contains("token [REDACTED]"), "{log}");
    for text in [&log, &shown] {
        assert!(!text.contains(SECRET) && !text.contains(&b64), "{text}");
    }
    let bus = nats.bus(&["ops"]).await.unwrap();
    let mut reader = bus.read_range(&nisse_tests::ops(), 1, None).await.unwrap();
    while let Some(m) = reader.next().await {
        let m = m.unwrap();
        let raw = String::from_utf8_lossy(&m.payload).into_owned();
        assert!(
            !raw.contains(SECRET) && !raw.contains(&b64),
            "{}",
            m.subject
        );
    }

    for child in &mut children {
        stop(child).await;
    }
    let (_, rebuilt, _) = rebuild(&install).await;
    assert_eq!(rebuilt, live);
}

/// An alert's item #1 on `tool`, and the operator's approved plan of one
/// step that sleeps 3 s there and then appends to a marker file: returns
/// the item's id and the marker's path.
async fn approve_a_slow_step(
    nats: &TestNats,
    install: &Install,
    sshd: &TestSshd,
) -> (String, std::path::PathBuf) {
    publish_alert(nats, "ServiceDown", "tool:9100").await;
    let s = install
        .wait_until("item #1 exists", Duration::from_secs(20), |s| {
            s.items.len() == 1
        })
        .await;
    let marker = sshd.dir().join("marker");
    std::fs::write(
        install.path().join("plan.toml"),
        format!(
            "[[step]]\ntarget = \"tool\"\ncommand = \"sleep 3; echo done >> {}\"\n",
            marker.display()
        ),
    )
    .unwrap();
    cli(install, &["plan", "propose", "1", "plan.toml"]).await;
    install
        .wait_until("rev-1 is up", Duration::from_secs(20), |s| {
            s.plans.iter().any(|p| p.status == PlanStatus::Up)
        })
        .await;
    cli(install, &["approve", "1", "rev-1"]).await;
    (s.items[0].id.clone(), marker)
}

#[tokio::test]
async fn an_executor_killed_mid_step_reports_the_outcome_unknown_and_never_reruns_it() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let sshd = TestSshd::start().await.unwrap();
    let (install, mut children) = install(&nats, &sshd).await;
    let (_, marker) = approve_a_slow_step(&nats, &install, &sshd).await;

    // Wait until the command is running on the host, then kill the
    // executor as a crash would.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sshd.log().contains("Accepted publickey") {
        assert!(Instant::now() < deadline, "the step never reached sshd");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut executor = children.pop().unwrap();
    signal(executor.id().unwrap() as i32, Signal::SIGKILL);
    executor.wait().await.unwrap();
    let mut executor = install.serve(&["executor"]);

    let s = install
        .wait_until(
            "the step's outcome is unknown",
            Duration::from_secs(30),
            |s| results(s).iter().any(|r| r.2 == "outcome_unknown"),
        )
        .await;
    let halted = s.plans[0].halted.clone().unwrap_or_default();
    assert!(halted.contains("outcome of step 1 is unknown"), "{halted}");
    assert!(halted.contains("not run again"), "{halted}");
    assert_eq!(
        s.plans[0].status,
        PlanStatus::Up,
        "put up again for the operator"
    );

    // Long after the command would have finished: it ran at most once.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let runs = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(runs.lines().count() <= 1, "{runs}");
    let execs = stream_kinds(&nats)
        .await
        .into_iter()
        .filter(|m| matches!(m, AnyMessage::ExecReq(_)))
        .count();
    assert_eq!(execs, 1);
    assert_eq!(results(&install.snapshot().unwrap()).len(), 1);
    stop(&mut executor).await;
    for child in &mut children {
        stop(child).await;
    }
}

/// The gate for an updater (seed X4): `nisse idle` says whether an agent
/// is in the middle of a step and exits 1 while one runs; `nisse idle
/// --wait` returns only after the running step finished, and then the
/// step's result is on the item.
#[tokio::test]
async fn idle_wait_returns_only_after_the_running_step_finished() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let sshd = TestSshd::start().await.unwrap();
    let (install, mut children) = install(&nats, &sshd).await;
    let idle = |wait: bool| {
        let mut c = super::nisse(install.path());
        c.env_remove("NISSE_INTAKE_ALERTS__LISTEN").arg("idle");
        if wait {
            c.arg("--wait");
        }
        c
    };
    let out = super::run(&mut idle(false)).await;
    assert!(out.status.success(), "{}", super::text(&out.stderr));
    assert!(super::text(&out.stdout).starts_with("idle"));

    let (item, marker) = approve_a_slow_step(&nats, &install, &sshd).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let busy = loop {
        let out = super::run(&mut idle(false)).await;
        if !out.status.success() {
            break super::text(&out.stdout);
        }
        assert!(
            Instant::now() < deadline,
            "never busy: {}\n{}",
            super::text(&out.stderr),
            install.log(&["brain"])
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        busy.trim(),
        format!("busy: ops: in the middle of a step on {item}")
    );
    assert!(
        !marker.exists(),
        "busy is said while the step runs, before it finished"
    );
    let out = super::run(&mut idle(true)).await;
    assert!(out.status.success(), "{}", super::text(&out.stderr));
    assert!(super::text(&out.stdout).starts_with("idle"));
    assert!(
        marker.exists(),
        "idle --wait returned before the running step finished: {}{}\n{}",
        super::text(&out.stdout),
        super::text(&out.stderr),
        install.log(&["brain"])
    );
    let s = install.snapshot().unwrap();
    assert_eq!(results(&s).len(), 1, "the step's result is on the item");
    for child in &mut children {
        stop(child).await;
    }
}

#[tokio::test]
async fn streams_shows_an_open_circuit_with_its_last_error() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    let in_a_minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 60_000;
    nisse_executor::put_circuit(
        &bus,
        &nisse_tests::ops(),
        &nisse_executor::CircuitState {
            agent: "ops".into(),
            host: "nas01".into(),
            state: "open".into(),
            failures: 3,
            open_until_ms: in_a_minute,
            last_error: "cannot connect to nas01 (10.0.0.5:22): connection refused".into(),
        },
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = super::run(
        super::nisse(dir.path())
            .arg("streams")
            .arg("--data-dir")
            .arg(nats.data_dir().unwrap())
            .env("NISSE_NATS_URL", nats.url()),
    )
    .await;
    let text = super::text(&out.stdout);
    assert!(text.contains("circuit nas01"), "{text}");
    assert!(
        text.contains("open for ") && text.contains("s more"),
        "{text}"
    );
    assert!(text.contains("failures=3"), "{text}");
    assert!(text.contains("connection refused"), "{text}");
    let out = super::run(
        super::nisse(dir.path())
            .args(["streams", "--json", "--data-dir"])
            .arg(nats.data_dir().unwrap())
            .env("NISSE_NATS_URL", nats.url()),
    )
    .await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["streams"][0]["circuits"][0]["state"], "open");
}

#[tokio::test]
async fn ssh_key_makes_the_agents_key_once_and_prints_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key_cmd = || {
        let mut c = super::nisse(dir.path());
        c.args(["ssh-key", "--data-dir"]).arg(&data);
        c
    };
    let out = super::run(&mut key_cmd()).await;
    assert!(out.status.success(), "{}", super::text(&out.stderr));
    let public = super::text(&out.stdout);
    assert!(public.starts_with("ssh-ed25519 "), "{public}");
    assert!(public.trim_end().ends_with(" nisse-ops"), "{public}");
    assert!(super::text(&out.stderr).contains("made a new key"));
    let key = data.join("agents/ops/ssh/id_ed25519");
    assert!(key.exists());
    // Again: the same key, not a new one.
    let again = super::run(&mut key_cmd()).await;
    assert_eq!(super::text(&again.stdout), public);
    assert!(!super::text(&again.stderr).contains("made a new key"));

    // A key the operator names is never made: its absence is an error.
    let out = super::run(key_cmd().env(
        "NISSE_EXECUTOR__AGENTS__OPS__KEY_FILE",
        dir.path().join("nope"),
    ))
    .await;
    assert!(!out.status.success());
    assert!(
        super::text(&out.stderr).contains("nope"),
        "{}",
        super::text(&out.stderr)
    );
    assert!(!dir.path().join("nope").exists());
}
