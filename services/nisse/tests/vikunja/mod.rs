//! intake-vikunja as its own `nisse serve intake-vikunja` process on a
//! secured server, SIGKILLed in the middle of a burst of 200 tasks made in
//! Vikunja, whose webhooks the stand-in keeps trying as Vikunja does:
//! restarted, every task is in the stream exactly once, and the ones whose
//! every delivery attempt fell while it was down are found by the poll.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use tokio::process::Child;

use nisse_bus::proto::{VikunjaEvent, VikunjaSource};
use nisse_bus::{AnyMessage, Bus};
use nisse_tests::TestNats;
use nisse_tests::vikunja::{Permission, VikunjaStandIn};

use crate::alerts::stop;
use crate::{nisse, signal};

/// Tasks made by the burst.
const TASKS: usize = 200;
/// The agent's Vikunja username.
const ACCOUNT: &str = "nisse";
/// The operator's.
const OPERATOR: &str = "alice";
/// The webhook's secret.
const SECRET: &str = "hook-s3cret";

/// A free loopback port (the listener is closed again at once).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A directory with a `nisse.toml` for `nisse serve intake-vikunja`
/// against `nats` and the stand-in, the receiver on a port of its own
/// that stays the same across restarts (the webhook's target).
struct Install {
    dir: tempfile::TempDir,
    port: u16,
}

impl Install {
    fn new(nats: &TestNats, vikunja: &VikunjaStandIn, token: &str, project: i64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let data = nats.data_dir().unwrap();
        let token_file = dir.path().join("vikunja.token");
        let secret_file = dir.path().join("vikunja-hook.secret");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
        std::fs::write(
            dir.path().join("nisse.toml"),
            format!(
                "data-dir = {data:?}\n\
                 [bus]\nurl = \"{}\"\n\
                 [vikunja]\nurl = \"{}\"\naccount = \"{ACCOUNT}\"\n\
                 token-file = {token_file:?}\nwebhook-secret-file = {secret_file:?}\n\
                 listen = \"127.0.0.1:{port}\"\nprojects = [{project}]\n\
                 poll-interval = \"1s\"\ncall-timeout = \"5s\"\n",
                nats.url(),
                vikunja.url()
            ),
        )
        .unwrap();
        Self { dir, port }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn webhook(&self) -> String {
        format!(
            "http://127.0.0.1:{}{}",
            self.port,
            nisse_intake_vikunja::WEBHOOK_PATH
        )
    }

    fn log_file(&self) -> PathBuf {
        self.path().join("intake-vikunja.log")
    }

    /// `nisse serve intake-vikunja`, its output appended to its log, and
    /// waits until its receiver answers `/readyz`.
    async fn serve(&self) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_file())
            .unwrap();
        let mut child = nisse(self.path())
            .args(["serve", "intake-vikunja"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("http://127.0.0.1:{}/readyz", self.port);
        loop {
            if let Ok(r) = reqwest::get(&url).await
                && r.status().is_success()
            {
                return child;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("intake-vikunja exited with {status}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "intake-vikunja never became ready: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }
}

/// Every `VikunjaEvent` in the ops stream.
async fn events(admin: &Bus) -> Vec<VikunjaEvent> {
    let mut reader = admin
        .read_range(&nisse_tests::ops(), 1, None)
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(m) = reader.next().await {
        if let Ok(AnyMessage::InVikunja(e)) = m.unwrap().decode() {
            out.push(e);
        }
    }
    out
}

/// Each task's `task.created` messages in the stream, by task id, with
/// where each came from.
async fn created(admin: &Bus) -> BTreeMap<i64, Vec<i32>> {
    let mut out: BTreeMap<i64, Vec<i32>> = BTreeMap::new();
    for e in events(admin).await {
        if e.event == "task.created" {
            let id = e.task.as_ref().unwrap().id;
            assert_eq!(
                e.envelope.as_ref().unwrap().message_id,
                format!("vikunja:task:{id}:created")
            );
            out.entry(id).or_default().push(e.source);
        }
    }
    out
}

#[tokio::test]
async fn intake_vikunja_killed_mid_burst_takes_each_task_once_and_the_poll_finds_what_webhooks_lost()
 {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let admin = nats.bus(&["ops"]).await.unwrap();
    admin.ensure_topology().await.unwrap();

    let vikunja = Arc::new(VikunjaStandIn::start().await.unwrap());
    let token = vikunja.add_user(ACCOUNT).unwrap();
    vikunja.add_user(OPERATOR).unwrap();
    let project = vikunja.add_project(OPERATOR, "Operations").unwrap();
    vikunja
        .share_project(project, ACCOUNT, Permission::Write)
        .await
        .unwrap();
    let install = Install::new(&nats, &vikunja, &token, project);
    let mut service = install.serve().await;
    vikunja.add_webhook(
        project,
        &install.webhook(),
        SECRET,
        &nisse_intake_vikunja::EVENTS,
    );

    // The burst, made while the service takes it: each task's webhook is
    // tried once before the next task is made, and retried behind it.
    let burst = {
        let vikunja = vikunja.clone();
        tokio::spawn(async move {
            let mut ids = Vec::with_capacity(TASKS);
            for i in 0..TASKS {
                ids.push(
                    vikunja
                        .create_task(project, OPERATOR, &format!("Burst task {i}"), "")
                        .await
                        .unwrap(),
                );
            }
            ids
        })
    };
    // Killed once it is some way in.
    let deadline = Instant::now() + Duration::from_secs(60);
    while created(&admin).await.len() < 40 {
        assert!(
            Instant::now() < deadline,
            "the burst did not start: {}",
            install.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(service.id().unwrap() as i32, Signal::SIGKILL);
    service.wait().await.unwrap();
    let at_kill = created(&admin).await.len();
    assert!(
        at_kill < TASKS,
        "killed in the middle: {at_kill} of {TASKS}"
    );
    // Down for longer than Vikunja keeps retrying two deliveries (the
    // stand-in's retries of one take 1.55 s, and the one the kill cut off
    // may have been stored): some are lost for good, as they would be.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut service = install.serve().await;

    let ids = burst.await.unwrap();
    vikunja.flush_webhooks().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = created(&admin).await;
        if ids.iter().all(|id| now.contains_key(id)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {TASKS} tasks are in the stream: {}",
            now.len(),
            install.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A few more polls: nothing comes twice.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop(&mut service).await;

    let stored = created(&admin).await;
    assert_eq!(stored.len(), TASKS, "every task and no other");
    let twice: Vec<_> = stored.iter().filter(|(_, s)| s.len() != 1).collect();
    assert!(twice.is_empty(), "taken more than once: {twice:?}");

    // Which tasks' webhooks were lost: no attempt reached the service
    // (one cut off by the kill may have been stored before it).
    let mut attempts: BTreeMap<String, Vec<bool>> = BTreeMap::new();
    for d in vikunja.deliveries() {
        let refused = d.status.is_none()
            && d.error
                .as_deref()
                .is_some_and(|e| e.contains("Connection refused"));
        attempts.entry(d.body.clone()).or_default().push(refused);
    }
    let lost: Vec<i64> = attempts
        .iter()
        .filter(|(_, refused)| refused.iter().all(|r| *r))
        .filter_map(|(body, _)| {
            let payload: serde_json::Value = serde_json::from_str(body).unwrap();
            (payload["event_name"] == "task.created")
                .then(|| payload["data"]["task"]["id"].as_i64().unwrap())
        })
        .collect();
    assert!(
        !lost.is_empty(),
        "the service was down longer than Vikunja retries: some webhooks were lost"
    );
    let poll = VikunjaSource::Poll as i32;
    for id in &lost {
        assert_eq!(
            stored.get(id),
            Some(&vec![poll]),
            "task {id}'s webhook was lost: the poll found it"
        );
    }
}
