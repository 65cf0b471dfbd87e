//! intake-vikunja as its own `nisse serve intake-vikunja` process on a
//! secured server:
//!
//! - SIGKILLed in the middle of a burst of 200 tasks made in Vikunja,
//!   whose webhooks the stand-in keeps trying as Vikunja does: restarted,
//!   every task is in the stream exactly once, and the ones whose every
//!   delivery attempt fell while it was down are found by the poll;
//! - posting what the agent tells the operator (`Tell`s on `out.tell`,
//!   published here as the brain does) on the item's ticket: a comment
//!   once however often the Tell comes, the result closing the task,
//!   nothing for Tells that are not the ticket's, a task of a project not
//!   served refused naming why, and a kill between a comment and its
//!   answer costing no second comment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use tokio::process::Child;

use nisse_bus::proto::{
    Actor, ActorKind, ChannelRef, Envelope, Tell, TellKind, VikunjaCallStatus, VikunjaEvent,
    VikunjaResult, VikunjaSource,
};
use nisse_bus::{AnyMessage, Bus};
use nisse_intake_vikunja::marker;
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

/// A secured server whose stream keeps message ids for only a second, so
/// a Tell published again more than a second later is stored and
/// delivered again, as a redelivered or rebuilt one is; the stand-in with
/// the operator's project, which the agent may write to and serves, and
/// `nisse serve intake-vikunja` running.
struct Desk {
    _nats: TestNats,
    admin: Bus,
    vikunja: VikunjaStandIn,
    project: i64,
    install: Install,
}

impl Desk {
    async fn start() -> (Self, Child) {
        let nats = TestNats::secured(&["ops"]).await.unwrap();
        let mut cfg = nats.bus_config();
        cfg.streams.duplicate_window = Duration::from_secs(1);
        let admin = nats.bus_with(cfg, &["ops"]).await.unwrap();
        admin.ensure_topology().await.unwrap();
        let vikunja = VikunjaStandIn::start().await.unwrap();
        let token = vikunja.add_user(ACCOUNT).unwrap();
        vikunja.add_user(OPERATOR).unwrap();
        let project = vikunja.add_project(OPERATOR, "Operations").unwrap();
        vikunja
            .share_project(project, ACCOUNT, Permission::Write)
            .await
            .unwrap();
        let install = Install::new(&nats, &vikunja, &token, project);
        let service = install.serve().await;
        let desk = Self {
            _nats: nats,
            admin,
            vikunja,
            project,
            install,
        };
        (desk, service)
    }

    /// A task the operator opened in `project`.
    async fn task(&self, project: i64, title: &str) -> i64 {
        self.vikunja
            .create_task(project, OPERATOR, title, "")
            .await
            .unwrap()
    }

    /// Publishes `tell` as the brain does; whether the stream stored it
    /// (not a duplicate of one within its window).
    async fn tell(&self, tell: Tell) -> bool {
        !self.admin.publish(tell).await.unwrap().duplicate
    }

    /// Every `VikunjaResult` in the stream answering `request_id`.
    async fn results(&self, request_id: &str) -> Vec<VikunjaResult> {
        let mut reader = self
            .admin
            .read_range(&nisse_tests::ops(), 1, None)
            .await
            .unwrap();
        let mut out = Vec::new();
        while let Some(m) = reader.next().await {
            if let Ok(AnyMessage::VikunjaResult(r)) = m.unwrap().decode()
                && r.request_id == request_id
            {
                out.push(r);
            }
        }
        out
    }

    /// The answers to `request_id` once there are `count` of them.
    async fn answers(&self, request_id: &str, count: usize) -> Vec<VikunjaResult> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = self.results(request_id).await;
            if now.len() >= count {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {count} answers to {request_id}: {}",
                now.len(),
                self.install.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The first answer to `request_id`.
    async fn answer(&self, request_id: &str) -> VikunjaResult {
        self.answers(request_id, 1).await.remove(0)
    }

    /// The agent's comments on `task` carrying `request_id`'s marker.
    fn marked(&self, task: i64, request_id: &str) -> Vec<String> {
        let marker = marker(request_id);
        self.vikunja
            .comments(task)
            .into_iter()
            .filter(|c| c.author == ACCOUNT && c.comment.contains(&marker))
            .map(|c| c.comment)
            .collect()
    }

    /// The comments Vikunja was asked to make on `task`.
    fn comment_posts(&self, task: i64) -> usize {
        let path = format!("/api/v1/tasks/{task}/comments");
        self.vikunja
            .requests()
            .iter()
            .filter(|r| r.method == "PUT" && r.path == path)
            .count()
    }
}

/// What the brain tells the operator about item `item-1` under
/// `message_id`, its ticket `task` named among the item's records when
/// there is one, for the channels `only` names (all when empty).
fn tell(
    message_id: &str,
    kind: TellKind,
    markdown: &str,
    task: Option<i64>,
    only: &[&str],
) -> Tell {
    Tell {
        envelope: Some(Envelope {
            agent: "ops".into(),
            work_item_id: "item-1".into(),
            actor: Some(Actor {
                kind: ActorKind::Agent as i32,
                id: "ops".into(),
            }),
            message_id: message_id.into(),
            ..Envelope::default()
        }),
        kind: kind as i32,
        markdown: markdown.into(),
        item_number: 1,
        records: task
            .map(|t| ChannelRef {
                channel: "vikunja".into(),
                id: t.to_string(),
            })
            .into_iter()
            .collect(),
        only: only.iter().map(|c| (*c).to_string()).collect(),
        ..Tell::default()
    }
}

fn assert_done(result: &VikunjaResult) {
    assert_eq!(
        result.status,
        VikunjaCallStatus::Done as i32,
        "{}",
        result.reason
    );
}

#[tokio::test]
async fn a_tell_is_commented_on_its_ticket_once_however_often_it_comes_and_other_channels_tells_post_nothing()
 {
    let (desk, mut service) = Desk::start().await;
    let task = desk.task(desk.project, "Backups failing").await;

    let picked = tell(
        "say:item-1:1",
        TellKind::Fact,
        "Picked up: **backups** first.",
        Some(task),
        &[],
    );
    assert!(desk.tell(picked.clone()).await);
    let first = desk.answer("tell:say:item-1:1").await;
    assert_done(&first);
    assert!(!first.adopted);
    let env = first.envelope.as_ref().unwrap();
    assert_eq!(env.work_item_id, "item-1", "answered on the Tell's item");
    assert_eq!(env.message_id, "vikunja-result:tell:say:item-1:1");
    assert_eq!(
        desk.marked(task, "tell:say:item-1:1"),
        vec![format!(
            "<p>Picked up: <strong>backups</strong> first.</p>\n{}",
            marker("tell:say:item-1:1")
        )],
        "the Markdown rendered to the HTML Vikunja keeps, the marker after it"
    );

    // The same Tell again, past the stream's duplicate window: stored and
    // delivered again, answered from the record, nothing made again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(desk.tell(picked).await, "stored again: a second delivery");
    let again = desk.answers("tell:say:item-1:1", 2).await;
    assert_done(&again[1]);
    assert_eq!(desk.marked(task, "tell:say:item-1:1").len(), 1);
    assert_eq!(desk.comment_posts(task), 1, "Vikunja was asked once");

    // A catch-up for the room only, and a Tell about an item with no
    // ticket: nothing on the ticket. The Tell after them is taken after
    // them (one at a time, in order), so once it is posted they were
    // passed over.
    assert!(
        desk.tell(tell(
            "say:item-1:2",
            TellKind::Fact,
            "For the room only.",
            Some(task),
            &["matrix"],
        ))
        .await
    );
    assert!(
        desk.tell(tell(
            "say:item-1:3",
            TellKind::Fact,
            "About an item with no ticket.",
            None,
            &[],
        ))
        .await
    );
    assert!(
        desk.tell(tell(
            "say:item-1:4",
            TellKind::Question,
            "Which host holds the backups?",
            Some(task),
            &["vikunja"],
        ))
        .await
    );
    assert_done(&desk.answer("tell:say:item-1:4").await);
    assert_eq!(desk.marked(task, "tell:say:item-1:4").len(), 1);
    assert!(desk.results("tell:say:item-1:2").await.is_empty());
    assert!(desk.results("tell:say:item-1:3").await.is_empty());
    let comments: Vec<String> = desk
        .vikunja
        .comments(task)
        .into_iter()
        .map(|c| c.comment)
        .collect();
    assert_eq!(comments.len(), 2, "{comments:?}");
    assert_eq!(desk.comment_posts(task), 2);
    stop(&mut service).await;
}

#[tokio::test]
async fn a_result_tell_closes_the_ticket_with_the_outcome_and_a_task_not_served_is_refused_naming_why()
 {
    let (desk, mut service) = Desk::start().await;
    let task = desk.task(desk.project, "Disk full on db1").await;

    assert!(
        desk.tell(tell(
            "say:item-1:9",
            TellKind::Result,
            "Fixed: the **disk** was full of old logs.",
            Some(task),
            &[],
        ))
        .await
    );
    let closed = desk.answer("tell:say:item-1:9").await;
    assert_done(&closed);
    assert!(closed.task.as_ref().unwrap().done, "{closed:?}");
    assert!(desk.vikunja.task(task).unwrap().done, "the task is done");
    assert_eq!(
        desk.marked(task, "tell:say:item-1:9"),
        vec![format!(
            "<p>Fixed: the <strong>disk</strong> was full of old logs.</p>\n{}",
            marker("tell:say:item-1:9")
        )],
        "the outcome is the note"
    );

    // A task the agent could write to, in a project it does not serve:
    // refused before anything is written, the answer saying why, on the
    // item, for the brain to record.
    let elsewhere = desk.vikunja.add_project(OPERATOR, "Elsewhere").unwrap();
    desk.vikunja
        .share_project(elsewhere, ACCOUNT, Permission::Write)
        .await
        .unwrap();
    let foreign = desk.task(elsewhere, "Not ours").await;
    assert!(
        desk.tell(tell(
            "say:item-1:10",
            TellKind::Fact,
            "Picked up.",
            Some(foreign),
            &[],
        ))
        .await
    );
    let refused = desk.answer("tell:say:item-1:10").await;
    assert_eq!(
        refused.status,
        VikunjaCallStatus::Refused as i32,
        "{}",
        refused.reason
    );
    assert!(
        refused.reason.contains(&format!(
            "task {foreign}'s project {elsewhere} is not among the projects agent ops serves"
        )),
        "{}",
        refused.reason
    );
    assert_eq!(refused.envelope.as_ref().unwrap().work_item_id, "item-1");
    assert!(desk.vikunja.comments(foreign).is_empty());
    assert_eq!(desk.comment_posts(foreign), 0);
    assert!(!desk.vikunja.task(foreign).unwrap().done);
    stop(&mut service).await;
}

#[tokio::test]
async fn intake_vikunja_killed_between_a_tells_comment_and_its_answer_comments_once_after_restart()
{
    let (desk, mut service) = Desk::start().await;
    let task = desk.task(desk.project, "Backup job stuck").await;
    let request_id = "tell:say:item-1:5";

    // Vikunja makes the comment and a proxy loses its answer: the service
    // waits to try again (looking for it first), and is killed meanwhile.
    desk.vikunja
        .lose_answers("PUT", &format!("/api/v1/tasks/{task}/comments"), 502, 1);
    assert!(
        desk.tell(tell(
            "say:item-1:5",
            TellKind::Progress,
            "Restarting the **backup** job.",
            Some(task),
            &[],
        ))
        .await
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while desk.marked(task, request_id).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the comment was never made: {}",
            desk.install.log()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    signal(service.id().unwrap() as i32, Signal::SIGKILL);
    service.wait().await.unwrap();
    assert!(
        desk.results(request_id).await.is_empty(),
        "killed between the comment and its answer"
    );

    // Restarted, the Tell comes again: the comment made before is found
    // by its marker and adopted, not made again.
    let mut service = desk.install.serve().await;
    let answer = desk.answer(request_id).await;
    assert_done(&answer);
    assert!(
        answer.adopted,
        "the comment made before the kill is adopted"
    );
    assert_eq!(
        desk.marked(task, request_id),
        vec![format!(
            "<p>Restarting the <strong>backup</strong> job.</p>\n{}",
            marker(request_id)
        )]
    );
    assert_eq!(desk.comment_posts(task), 1, "Vikunja was asked once");
    stop(&mut service).await;
}
