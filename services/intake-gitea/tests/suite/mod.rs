//! Shared steps: a NATS server with the topology, the Gitea stand-in with
//! an operator, the agent's account and a repository, the service running
//! in-process, signed deliveries, the brain's requests, and reading back
//! what the stream holds.

mod calls;
mod limits;
mod poll;
mod walls;
mod webhook;

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use nisse_bus::service::Readiness;
use nisse_bus::{AnyMessage, Bus, StoredMessage};
use nisse_intake_gitea::Config;
use nisse_proto::v1::{Envelope, GiteaEvent, GiteaRequest, GiteaResult, gitea_request::Call};
use nisse_tests::gitea::{GiteaRepo, GiteaStandIn};
use nisse_tests::{InProcess, TestNats};

/// The agent's Gitea login.
const ACCOUNT: &str = "nisse";
/// The operator's.
const OPERATOR: &str = "alice";
/// The repository served.
const REPO: &str = "alice/project";
/// The webhook's secret.
const SECRET: &str = "hook-s3cret";

/// How long a stopped service may take to finish.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A NATS server of the test's own with the topology in place, and a bus
/// for agent `dev`.
async fn nats() -> (TestNats, Bus) {
    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["dev"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    (nats, bus)
}

/// [`nats`] with a duplicate window of one second, so anything published
/// twice more than a second apart is stored twice: what a test of "never
/// published again" needs, since the usual window would hide a repeat.
async fn nats_short_window() -> (TestNats, Bus) {
    let nats = TestNats::start().await.unwrap();
    let mut cfg = nats.bus_config();
    cfg.streams.duplicate_window = Duration::from_secs(1);
    let bus = nats.bus_with(cfg, &["dev"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    (nats, bus)
}

/// The agent's token and the webhook's secret in files of their own.
struct Secrets {
    dir: tempfile::TempDir,
    token: PathBuf,
    secret: PathBuf,
}

impl Secrets {
    fn new(token: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("gitea.token");
        let secret_file = dir.path().join("gitea-hook.secret");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
        Self {
            dir,
            token: token_file,
            secret: secret_file,
        }
    }

    /// Writes `token` as the agent's token (a rotation).
    fn rotate_token(&self, token: &str) {
        let tmp = self.dir.path().join("gitea.token.new");
        std::fs::write(&tmp, format!("{token}\n")).unwrap();
        std::fs::rename(&tmp, &self.token).unwrap();
    }
}

/// The service's configuration for `url` (Gitea's), polling every
/// `poll` (zero: not at all), on a free loopback port.
fn config(url: &str, secrets: &Secrets, poll: Duration) -> Config {
    Config {
        url: Some(url.to_string()),
        agent: "dev".into(),
        account: ACCOUNT.into(),
        token_file: Some(secrets.token.clone()),
        webhook_secret_file: Some(secrets.secret.clone()),
        listen: "127.0.0.1:0".parse().unwrap(),
        repositories: vec![REPO.into()],
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
        let reporter = readiness.reporter("intake-gitea");
        let bus = bus.clone();
        let running = InProcess::spawn(move |token| {
            let mut ctx = nisse_tests::service_context(&bus, cfg, token);
            ctx.ready = reporter;
            ctx.data_dir = std::env::temp_dir();
            nisse_intake_gitea::run(ctx)
        });
        let listeners = tokio::time::timeout(
            Duration::from_secs(30),
            readiness.wait_for(&["intake-gitea".to_string()]),
        )
        .await
        .expect("intake-gitea did not get ready");
        let url = listeners[nisse_intake_gitea::LISTENER].clone();
        let base = url
            .strip_suffix(nisse_intake_gitea::WEBHOOK_PATH)
            .unwrap()
            .to_string();
        Self { url, base, running }
    }

    async fn stop(self) {
        self.running.stop(STOP_GRACE).await.unwrap();
    }
}

/// The stand-in with the operator, the agent's account (its token
/// returned) and the repository with a little code.
struct Forge {
    gitea: GiteaStandIn,
    repo: GiteaRepo,
    token: String,
}

async fn forge() -> Forge {
    let gitea = GiteaStandIn::start().await.unwrap();
    let token = gitea.add_user(ACCOUNT).unwrap();
    gitea.add_user(OPERATOR).unwrap();
    let repo = gitea
        .create_repo(
            OPERATOR,
            "project",
            "main",
            &[
                ("README.md", "# project\n"),
                ("src/lib.rs", "pub fn one() -> u32 {\n    1\n}\n"),
            ],
        )
        .await
        .unwrap();
    Forge { gitea, repo, token }
}

impl Forge {
    /// Pushes `branch` off `main` with `path` set to `content`, straight
    /// into the bare repository (as the harness's push would).
    async fn push_branch(&self, branch: &str, path: &str, content: &str) {
        let work = tempfile::tempdir().unwrap();
        let git = |args: Vec<String>| {
            let dir = work.path().to_path_buf();
            async move {
                let out = tokio::process::Command::new("git")
                    .args([
                        "-c",
                        "user.name=Nisse",
                        "-c",
                        "user.email=nisse@example.invalid",
                    ])
                    .args(&args)
                    .current_dir(&dir)
                    .output()
                    .await
                    .unwrap();
                assert!(
                    out.status.success(),
                    "git {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        };
        let s = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        git(s(&["clone", "-q", self.repo.path().to_str().unwrap(), "."])).await;
        git(s(&["checkout", "-q", "-b", branch])).await;
        let file = work.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, content).unwrap();
        git(s(&["add", path])).await;
        git(s(&["commit", "-q", "-m", &format!("change {path}")])).await;
        git(s(&["push", "-q", "origin", branch])).await;
    }

    /// A call to the stand-in's API as the holder of `token`.
    async fn api(&self, token: &str, method: reqwest::Method, path: &str, body: Value) -> Value {
        let response = http()
            .request(method, format!("{}{path}", self.gitea.api_url()))
            .header("authorization", format!("token {token}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// Opens a pull request of `branch` into `main` as the agent.
    async fn open_pull(&self, branch: &str, title: &str) -> i64 {
        let pr = self
            .api(
                &self.token,
                reqwest::Method::POST,
                &format!("/repos/{REPO}/pulls"),
                json!({"head": branch, "base": "main", "title": title, "body": "first"}),
            )
            .await;
        pr["number"].as_i64().unwrap()
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .no_proxy()
        .build()
        .unwrap()
}

/// Gitea's headers for a delivery of `event_type` (its coarse name
/// `event`), signed with `secret` when given.
fn hook_headers(
    event: &str,
    event_type: &str,
    delivery: &str,
    body: &[u8],
    secret: Option<&str>,
) -> Vec<(String, String)> {
    let mut h = vec![
        ("Content-Type".to_string(), "application/json".to_string()),
        ("X-Gitea-Delivery".to_string(), delivery.to_string()),
        ("X-Gitea-Event".to_string(), event.to_string()),
        ("X-Gitea-Event-Type".to_string(), event_type.to_string()),
    ];
    if let Some(secret) = secret {
        h.push((
            "X-Gitea-Signature".to_string(),
            nisse_intake_gitea::sign(secret.as_bytes(), body),
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

/// A delivery as Gitea sends it: signed with the webhook's secret.
async fn deliver(
    url: &str,
    event: &str,
    event_type: &str,
    delivery: &str,
    body: &Value,
) -> (u16, Value) {
    let bytes = serde_json::to_vec_pretty(body).unwrap();
    post(
        url,
        &hook_headers(event, event_type, delivery, &bytes, Some(SECRET)),
        &bytes,
    )
    .await
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
            .starts_with("https://nisse.invalid/problems/gitea/"),
        "{body}"
    );
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains(needle), "`{needle}` not in: {detail}");
}

/// A Gitea `User`.
fn user(login: &str, id: i64) -> Value {
    json!({"id": id, "login": login, "full_name": "", "email": format!("{login}@example.invalid")})
}

/// An `issues` payload (`IssuePayload`) for issue `number` of `repo`.
fn issue_payload(action: &str, number: u64, repo: &str, sender: &str) -> Value {
    json!({
        "action": action,
        "number": number,
        "issue": {
            "id": 100 + number,
            "url": format!("http://gitea.invalid/api/v1/repos/{repo}/issues/{number}"),
            "html_url": format!("http://gitea.invalid/{repo}/issues/{number}"),
            "number": number,
            "user": user(sender, 2),
            "title": "The parser drops the last line",
            "body": "Steps: feed it a file without a final newline.",
            "labels": [{"id": 1, "name": "bug", "color": "ee0701"}],
            "milestone": null,
            "assignee": null,
            "assignees": null,
            "state": "open",
            "is_locked": false,
            "comments": 0,
            "created_at": "2024-05-01T10:00:00+02:00",
            "updated_at": "2024-05-01T10:00:00+02:00",
            "closed_at": null,
            "pull_request": null,
            "repository": {"id": 1, "name": "project", "owner": "alice", "full_name": repo}
        },
        "repository": {"id": 1, "name": "project", "full_name": repo, "owner": user("alice", 2)},
        "sender": user(sender, 2),
        "commit_id": ""
    })
}

/// An `issue_comment` payload for comment `id` on issue `number`.
fn comment_payload(id: i64, number: u64, sender: &str, body: &str) -> Value {
    let mut p = issue_payload("created", number, REPO, sender);
    p["comment"] = json!({
        "id": id,
        "html_url": format!("http://gitea.invalid/{REPO}/issues/{number}#issuecomment-{id}"),
        "pull_request_url": "",
        "issue_url": format!("http://gitea.invalid/{REPO}/issues/{number}"),
        "user": user(sender, 2),
        "body": body,
        "created_at": "2024-05-01T10:05:00+02:00",
        "updated_at": "2024-05-01T10:05:00+02:00"
    });
    p["is_pull"] = json!(false);
    p
}

/// Every `GiteaEvent` the `dev` stream holds, in order.
async fn events(bus: &Bus) -> Vec<(StoredMessage, GiteaEvent)> {
    let mut reader = bus
        .read_range(&nisse_tests::agent("dev"), 1, None)
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(m) = reader.next().await {
        let m = m.unwrap();
        if let Ok(AnyMessage::InGitea(e)) = m.decode() {
            out.push((m, e));
        }
    }
    out
}

/// Every `GiteaResult` the `dev` stream holds, in order.
async fn results(bus: &Bus) -> Vec<GiteaResult> {
    let mut reader = bus
        .read_range(&nisse_tests::agent("dev"), 1, None)
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(m) = reader.next().await {
        if let Ok(AnyMessage::GiteaResult(r)) = m.unwrap().decode() {
            out.push(r);
        }
    }
    out
}

/// How many messages the `dev` stream holds.
async fn stored_count(bus: &Bus) -> u64 {
    let mut stream = bus.jetstream().get_stream("AGENT_DEV").await.unwrap();
    stream.info().await.unwrap().state.messages
}

/// An event's message id.
fn id_of(e: &GiteaEvent) -> &str {
    e.envelope.as_ref().unwrap().message_id.as_str()
}

/// Publishes the brain's request `request_id` for `call`, as delivery
/// `attempt` of it (the brain retries under the same request id with a
/// new message id).
async fn request(bus: &Bus, request_id: &str, attempt: u32, repository: &str, call: Call) {
    bus.publish(GiteaRequest {
        envelope: Some(Envelope {
            agent: "dev".into(),
            work_item_id: "item-1".into(),
            message_id: format!("gitea-req:{request_id}:{attempt}"),
            ..Envelope::default()
        }),
        request_id: request_id.to_string(),
        repository: repository.to_string(),
        call: Some(call),
    })
    .await
    .unwrap();
}

/// The answer to `request_id`, once there is one.
async fn answer(bus: &Bus, request_id: &str) -> GiteaResult {
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
