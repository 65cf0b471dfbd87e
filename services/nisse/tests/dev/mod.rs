//! The dev agent's workspace preparation as `nisse up` runs it, against
//! real servers: a Gitea stand-in (its REST API, signed webhooks, and bare
//! repositories served by git over a real OpenSSH `sshd`, the push key
//! restricted to `git-shell`), a build host that is another real `sshd`
//! with git, and `nisse up`'s own embedded NATS server.
//!
//! An issue assigned to the agent's account by an operator arrives by
//! webhook and becomes a work item; its turn comes and the harness fetches
//! with the push key (handed to the build host on standard input), sets
//! aside what an earlier item left in the workspace, checks out the
//! item's branch at the base branch and records the toolchains. What the
//! operator sees is read back with the `nisse` CLI and with git in the
//! workspace; the push key is looked for everywhere it must not be.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::Child;

use nisse_bus::auth::{Credentials, Identity};
use nisse_bus::{AnyMessage, StoredMessage};
use nisse_core::{Event, Snapshot, State, Store};
use nisse_tests::gitea::{GiteaRepo, GiteaStandIn, Protection, PushKey};
use nisse_tests::model::{Reply, ScriptedModel};
use nisse_tests::sshd::TestSshd;
use nisse_tests::synapse::{TestClient, TestSynapse};
use serde_json::json;

use super::{local_user, nisse, run, signal, text};

/// The agent's Gitea login.
const ACCOUNT: &str = "dev-agent";
/// The operator, in Gitea.
const OPERATOR: &str = "alice";
/// The repository, `owner/name`.
const REPOSITORY: &str = "alice/widget";
/// The executor host the project's workspace is on.
const BUILD_HOST: &str = "build";
/// The webhook's secret.
const HOOK_SECRET: &str = "dev-hook-s3cret";

/// How long preparation may take end to end.
const PREPARED_WITHIN: Duration = Duration::from_secs(40);

/// The files the repository starts with: a document and a marker that
/// says the project needs Python.
const FILES: &[(&str, &str)] = &[
    ("README.md", "# widget\n"),
    ("ARCHITECTURE.md", "# How widget works\n"),
    ("pyproject.toml", "[project]\nname = \"widget\"\n"),
];

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// git in `dir`, with an identity for the commits the test makes; its
/// trimmed standard output, or the test fails with its error.
async fn git(dir: &Path, args: &[&str]) -> String {
    let out = tokio::process::Command::new("git")
        .args([
            "-c",
            "user.name=Earlier Item",
            "-c",
            "user.email=earlier@example.invalid",
        ])
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        text(&out.stderr)
    );
    text(&out.stdout).trim().to_string()
}

/// The texts of the facts in a log.
fn facts(s: &Snapshot) -> Vec<String> {
    s.events
        .iter()
        .filter_map(|e| match &e.event {
            Event::Fact { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// Everything one test needs: the Gitea stand-in with the operator, the
/// agent's account and the repository; the build host; a directory with
/// `nisse.toml`, the secrets' files, the data directory and `nisse up`'s
/// output.
struct Rig {
    dir: tempfile::TempDir,
    gitea: GiteaStandIn,
    repo: GiteaRepo,
    build: TestSshd,
    key: PushKey,
    /// The workspace on the build host (this machine: the build host is a
    /// local `sshd`).
    workspace: PathBuf,
    /// The known-hosts file the build host's git checks Gitea's host key
    /// against.
    git_known_hosts: PathBuf,
    up: Option<Child>,
    /// The agent's Matrix room, when the test asked for one.
    matrix: Option<Room>,
}

/// A real Synapse with the operator and the agent in the dev agent's
/// room.
struct Room {
    synapse: TestSynapse,
    /// The operator's client (`@op`, on the agent's allowlist).
    operator: TestClient,
    agent_id: String,
    room: String,
}

/// What a test adds to the rig's `nisse.toml`: lines for `[dev]`, for the
/// project, and whole sections at the end.
#[derive(Default)]
struct Extra {
    dev: String,
    project: String,
    tail: String,
    /// The repository's files, instead of [`FILES`].
    files: Option<&'static [(&'static str, &'static str)]>,
    /// A real Synapse and a room for the agent, its operator on the
    /// allowlist.
    synapse: bool,
}

impl Rig {
    /// Everything but `nisse up`, which [`Rig::up`] starts. The known
    /// hosts the build host's git reads hold Gitea's host key.
    async fn new() -> Self {
        Self::with(Extra::default()).await
    }

    /// Like [`Rig::new`], with `extra` in the configuration.
    async fn with(extra: Extra) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("nisse-dev-e2e-")
            .tempdir()
            .unwrap();
        let gitea = GiteaStandIn::start().await.unwrap();
        let token = gitea.add_user(ACCOUNT).unwrap();
        gitea.add_user(OPERATOR).unwrap();
        let (owner, name) = REPOSITORY.split_once('/').unwrap();
        let repo = gitea
            .create_repo(owner, name, "main", extra.files.unwrap_or(FILES))
            .await
            .unwrap();
        let key = gitea.create_push_key(ACCOUNT).await.unwrap();
        let build = TestSshd::start().await.unwrap();

        let p = dir.path();
        let workspace = p.join("build-host/work/widget");
        std::fs::create_dir_all(workspace.parent().unwrap()).unwrap();
        let git_known_hosts = p.join("build-host/gitea_known_hosts");
        gitea.write_known_hosts(&git_known_hosts).unwrap();
        let build_known_hosts = p.join("build_known_hosts");
        build
            .write_known_hosts(&build_known_hosts, "127.0.0.1")
            .unwrap();
        std::fs::write(p.join("gitea.token"), format!("{token}\n")).unwrap();
        std::fs::write(p.join("gitea-hook.secret"), format!("{HOOK_SECRET}\n")).unwrap();
        let s = |path: &Path| path.display().to_string();
        let matrix = if extra.synapse {
            Some(Room::start().await)
        } else {
            None
        };
        let (matrix_operator, matrix_section) = match &matrix {
            None => (String::new(), String::new()),
            Some(m) => {
                let password = p.join("agent-password");
                std::fs::write(&password, "agent-password\n").unwrap();
                (
                    format!(", \"matrix:{}\"", m.operator.user_id()),
                    format!(
                        "[matrix]\nhomeserver = \"{}\"\nbackoff-max = \"1s\"\n\
                         [matrix.agents.dev]\nuser-id = \"{}\"\npassword-file = {:?}\nroom = \"{}\"\n",
                        m.synapse.base_url(),
                        m.agent_id,
                        s(&password),
                        m.room
                    ),
                )
            }
        };
        let config = format!(
            "agents = [\"ops\", \"dev\"]\n\
             data-dir = {data:?}\n\
             [embedded]\nport = {nats_port}\n\
             [dev]\naccount = \"{ACCOUNT}\"\n\
             operators = [\"gitea:{OPERATOR}\", \"cli:{me}\"{matrix_operator}]\n\
             {dev_extra}\
             [dev.projects.widget]\n\
             repository = \"{REPOSITORY}\"\n\
             base-branch = \"main\"\n\
             build-host = \"{BUILD_HOST}\"\n\
             workspace = {workspace:?}\n\
             clone-url = {clone_url:?}\n\
             git-known-hosts = {git_known_hosts:?}\n\
             {project_extra}\
             [gitea]\nurl = {gitea_url:?}\naccount = \"{ACCOUNT}\"\n\
             token-file = {token_file:?}\nwebhook-secret-file = {secret_file:?}\n\
             listen = \"127.0.0.1:0\"\nrepositories = [\"{REPOSITORY}\"]\n\
             poll-interval = \"0s\"\n\
             [executor.agents.dev]\nkey-file = {client_key:?}\nknown-hosts = {build_known_hosts:?}\n\
             [executor.agents.dev.hosts.{BUILD_HOST}]\naddress = \"127.0.0.1\"\nport = {build_port}\n\
             user = {user:?}\nsecrets = [{{ name = \"gitea-push-key\", stdin = true }}]\n\
             [executor.agents.dev.secrets.gitea-push-key]\nfile = {push_key:?}\n\
             {tail}{matrix_section}",
            dev_extra = extra.dev,
            project_extra = extra.project,
            tail = extra.tail,
            data = s(&p.join("data")),
            nats_port = free_port(),
            me = local_user(),
            workspace = s(&workspace),
            clone_url = repo.clone_url(),
            git_known_hosts = s(&git_known_hosts),
            gitea_url = gitea.url(),
            token_file = s(&p.join("gitea.token")),
            secret_file = s(&p.join("gitea-hook.secret")),
            client_key = s(&build.client_key()),
            build_known_hosts = s(&build_known_hosts),
            build_port = build.port(),
            user = build.user(),
            push_key = s(&key.private_key),
        );
        std::fs::write(p.join("nisse.toml"), config).unwrap();
        Self {
            dir,
            gitea,
            repo,
            build,
            key,
            workspace,
            git_known_hosts,
            up: None,
            matrix,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn data(&self) -> PathBuf {
        self.path().join("data")
    }

    /// Starts `nisse up` (its output in `up.stdout` and `up.stderr`),
    /// waits until it is ready, and points the repository's webhook at
    /// the address it prints.
    async fn up(&mut self) {
        let out = std::fs::File::create(self.path().join("up.stdout")).unwrap();
        let err = std::fs::File::create(self.path().join("up.stderr")).unwrap();
        let mut child = nisse(self.path())
            .arg("up")
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let endpoints: serde_json::Value = loop {
            if let Ok(bytes) = std::fs::read(self.data().join("endpoints.json")) {
                break serde_json::from_slice(&bytes).unwrap();
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("nisse up exited early with {status}:\n{}", self.logs());
            }
            assert!(Instant::now() < deadline, "nisse up never became ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let hook = endpoints["listeners"]["gitea-webhook"]
            .as_str()
            .unwrap_or_else(|| panic!("no gitea-webhook listener in {endpoints}"))
            .to_string();
        self.gitea.add_webhook(&hook, HOOK_SECRET);
        self.up = Some(child);
    }

    /// Stops `nisse up` as a supervisor would; it must exit cleanly.
    async fn stop(&mut self) {
        let Some(mut child) = self.up.take() else {
            return;
        };
        signal(
            child.id().unwrap() as i32,
            nix::sys::signal::Signal::SIGTERM,
        );
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("nisse up stopped in time")
            .unwrap();
        assert!(status.success(), "nisse up exited with {status}");
    }

    /// Kills `nisse up` with SIGKILL (no shutdown of its own, as a crash
    /// or the OOM killer would) and waits until its embedded NATS server,
    /// which dies with it, has let go of the port, so that [`Rig::up`]
    /// can start it again on the same data. Its `endpoints.json` is left
    /// behind by the kill and removed here, so the next start's is read.
    async fn kill(&mut self) {
        let mut child = self.up.take().expect("nisse up is running");
        let endpoints: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.data().join("endpoints.json")).unwrap())
                .unwrap();
        let port: u16 = endpoints["nats_url"]
            .as_str()
            .and_then(|u| u.rsplit(':').next())
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .unwrap_or_else(|| panic!("no NATS port in {endpoints}"));
        signal(
            child.id().unwrap() as i32,
            nix::sys::signal::Signal::SIGKILL,
        );
        child.wait().await.unwrap();
        std::fs::remove_file(self.data().join("endpoints.json")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the embedded NATS server outlived nisse up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What `nisse up` wrote so far, standard output then error.
    fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.path().join(f)).unwrap_or_default();
        format!("{}{}", read("up.stdout"), read("up.stderr"))
    }

    /// The operator opens an issue and assigns it to the agent; the
    /// stand-in delivers the webhooks. Returns the issue's number.
    async fn assign_issue(&self, title: &str) -> i64 {
        self.assign_labelled(title, &[]).await
    }

    /// [`Rig::assign_issue`] for an issue with `labels`.
    async fn assign_labelled(&self, title: &str, labels: &[&str]) -> i64 {
        let number = self
            .repo
            .open_issue(OPERATOR, title, "It should work.", labels)
            .await
            .unwrap();
        self.repo.assign(number, ACCOUNT, OPERATOR).await.unwrap();
        // Every delivery so far answered (the agent's own comments' may
        // still be on their way: waited for, not read half done).
        self.gitea.flush_webhooks().await.unwrap();
        let refused: Vec<_> = self
            .gitea
            .deliveries()
            .into_iter()
            .filter(|d| d.status != Some(200))
            .collect();
        assert!(refused.is_empty(), "{refused:#?}\n{}", self.logs());
        number
    }

    /// The dev brain's state, read-only (`None` before it made its store).
    fn snapshot(&self) -> Option<Snapshot> {
        let path = Store::path_in(&self.data(), "dev");
        Store::open_read_only(&path, "dev").ok()?.snapshot().ok()
    }

    /// Waits until `check` holds for the dev brain's state.
    async fn wait_until(&self, what: &str, check: impl Fn(&Snapshot) -> bool) -> Snapshot {
        let deadline = Instant::now() + PREPARED_WITHIN;
        loop {
            if let Some(s) = self.snapshot()
                && check(&s)
            {
                return s;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting until {what}\nitems: {:#?}\nfacts: {:#?}\nnisse up:\n{}",
                    self.snapshot().map(|s| s.items),
                    self.snapshot().map(|s| facts(&s)),
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the item's workspace is prepared: the toolchain facts,
    /// which come last, are in its log.
    async fn prepared(&self) -> Snapshot {
        self.wait_until("the workspace is prepared", |s| {
            facts(s)
                .iter()
                .any(|f| f.starts_with(&format!("toolchain on {BUILD_HOST}: git: ")))
        })
        .await
    }

    /// `nisse <args>` in the rig's directory: its standard output, or the
    /// test fails with its error.
    async fn cli(&self, args: &[&str]) -> String {
        let out = run(nisse(self.path()).args(args)).await;
        assert!(
            out.status.success(),
            "nisse {args:?} failed: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// git in the workspace on the build host.
    async fn ws_git(&self, args: &[&str]) -> String {
        git(&self.workspace, args).await
    }

    /// The build host's own `git --version`, as a command run there by
    /// the executor sees it.
    async fn build_host_git_version(&self) -> String {
        let out = self
            .build
            .ssh_command("git --version")
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_string()
    }

    /// Every message of `agent`'s stream, as the bus stores them.
    async fn stream(&self, agent: &str) -> Vec<StoredMessage> {
        let endpoints: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.data().join("endpoints.json")).unwrap())
                .unwrap();
        let cfg = nisse_bus::BusConfig {
            url: Some(endpoints["nats_url"].as_str().unwrap().to_string()),
            ..Default::default()
        };
        let name = nisse_tests::agent(agent);
        let bus = nisse_bus::Bus::connect_as(
            &cfg,
            vec![name.clone()],
            &Identity::Admin,
            &Credentials::in_data_dir(&self.data()),
        )
        .await
        .unwrap();
        let mut reader = bus.read_range(&name, 1, None).await.unwrap();
        let mut out = Vec::new();
        while let Some(m) = reader.next().await {
            out.push(m.unwrap());
        }
        out
    }
}

impl Room {
    /// Synapse with the operator `@op` and the agent `@nisse-dev`; the
    /// operator creates the room and invites the agent, who joins when
    /// intake-matrix starts.
    async fn start() -> Self {
        let synapse = TestSynapse::start().await.unwrap();
        let op = synapse.register("op", "op-password", false).await.unwrap();
        let agent = synapse
            .register("nisse-dev", "agent-password", false)
            .await
            .unwrap();
        let operator = synapse.client(&op);
        let room = operator
            .create_room("dev", &[&agent.user_id], false)
            .await
            .unwrap();
        Self {
            synapse,
            operator,
            agent_id: agent.user_id,
            room,
        }
    }

    /// Waits for a message from the agent whose event and body satisfy
    /// `matches`, as the operator's client reads the room.
    async fn agent_posts(
        &self,
        matches: impl Fn(&serde_json::Value, &str) -> bool,
    ) -> serde_json::Value {
        self.operator
            .wait_for_message(
                &self.room,
                |e| {
                    e["sender"] == self.agent_id.as_str()
                        && e["content"]["body"].as_str().is_some_and(|b| matches(e, b))
                },
                STEP_WITHIN,
            )
            .await
            .unwrap()
    }

    /// Waits for the agent's reply in the thread rooted at `root` that
    /// contains every one of `words`.
    async fn in_thread(&self, root: &str, words: &[&str]) -> serde_json::Value {
        self.agent_posts(|e, b| {
            e["content"]["m.relates_to"]["rel_type"] == "m.thread"
                && e["content"]["m.relates_to"]["event_id"] == root
                && words.iter().all(|w| b.contains(w))
        })
        .await
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(child) = &mut self.up {
            let _ = child.start_kill();
        }
    }
}

/// The push key's secret parts: the whole file, and each line of its
/// base64 body (any one of them anywhere would be a leak, escaped into
/// JSON or not).
fn key_needles(key: &PushKey) -> Vec<String> {
    let whole = std::fs::read_to_string(&key.private_key).unwrap();
    let mut needles: Vec<String> = whole
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .map(str::to_string)
        .collect();
    assert!(!needles.is_empty(), "the push key has a body");
    needles.push(whole.trim().to_string());
    needles
}

/// The push key's SHA-256 fingerprint as `sshd` logs it (`SHA256:…`).
async fn key_fingerprint(key: &PushKey) -> String {
    let out = tokio::process::Command::new("ssh-keygen")
        .args(["-l", "-E", "sha256", "-f"])
        .arg(key.private_key.with_extension("pub"))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    listed
        .split_whitespace()
        .find(|w| w.starts_with("SHA256:"))
        .unwrap_or_else(|| panic!("no fingerprint in {listed}"))
        .to_string()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// A stored message whole: its payload and its headers, which the stream
/// keeps too.
fn whole(m: &StoredMessage) -> Vec<u8> {
    let mut out = m.payload.to_vec();
    for (k, v) in &m.headers {
        out.extend_from_slice(format!("\n{k}: {v}").as_bytes());
    }
    out
}

#[tokio::test]
async fn an_assigned_issue_gets_a_fresh_workspace_on_its_branch_and_the_push_key_stays_secret() {
    let mut rig = Rig::new().await;
    rig.up().await;
    let issue = rig.assign_issue("The widget does not spin").await;
    let s = rig.prepared().await;
    assert_eq!(s.items.len(), 1, "{:#?}", s.items);
    let item = &s.items[0];
    assert_eq!(item.title, format!("{REPOSITORY}#{issue}"));

    // On disk, on the build host: a clone on the item's branch, at the
    // base branch's commit, with a clean tree.
    let base = rig.repo.branch_sha("main").await.unwrap().unwrap();
    let branch = format!("nisse/issue-{issue}");
    assert_eq!(
        rig.ws_git(&["rev-parse", "--abbrev-ref", "HEAD"]).await,
        branch
    );
    assert_eq!(rig.ws_git(&["rev-parse", "HEAD"]).await, base);
    assert_eq!(rig.ws_git(&["status", "--porcelain"]).await, "");
    assert_eq!(
        std::fs::read_to_string(rig.workspace.join("ARCHITECTURE.md")).unwrap(),
        "# How widget works\n"
    );

    // The item's log, as the operator reads it: the branch and the
    // toolchains the project needs, as facts.
    let shown = rig
        .cli(&[
            "item",
            "show",
            &format!("#{}", item.number),
            "--agent",
            "dev",
        ])
        .await;
    let ws = rig.workspace.display();
    assert!(
        shown.contains(&format!(
            "fact: the workspace {ws} on {BUILD_HOST} is on branch {branch} at {base} (base branch main; documents: ARCHITECTURE.md)"
        )),
        "{shown}"
    );
    let git_version = rig.build_host_git_version().await;
    assert!(
        shown.contains(&format!(
            "fact: toolchain on {BUILD_HOST}: git: {git_version}"
        )),
        "{shown}"
    );
    // pyproject.toml says Python: its version (or `missing`) is recorded.
    assert!(
        shown.contains(&format!("fact: toolchain on {BUILD_HOST}: python3: ")),
        "{shown}"
    );
    assert!(!shown.contains("set aside"), "nothing was left: {shown}");

    // The push key reached the fetch (Gitea's sshd let it in with that
    // key, the only one in the build host's short-lived ssh-agent) and is
    // nowhere it must not be: not in any message of the agent's stream
    // (nor the other agent's), not in the item's log, not in what nisse
    // logged.
    let fingerprint = key_fingerprint(&rig.key).await;
    let gitea_log = rig.gitea.sshd().log();
    assert!(
        gitea_log
            .lines()
            .any(|l| l.contains("Accepted publickey") && l.contains(&fingerprint)),
        "the fetch never logged in to Gitea's sshd with the push key {fingerprint}:\n{gitea_log}"
    );
    let needles = key_needles(&rig.key);
    let dev_stream = rig.stream("dev").await;
    // Three operations ran, the fetch alone asking for the key, by name.
    let asked: Vec<(String, Vec<String>)> = dev_stream
        .iter()
        .filter_map(|m| match m.decode() {
            Ok(AnyMessage::ExecReq(r)) => Some((
                r.request_id
                    .rsplit(':')
                    .nth(1)
                    .unwrap_or_default()
                    .to_string(),
                r.secret_names,
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        asked,
        [
            ("fetch".to_string(), vec!["gitea-push-key".to_string()]),
            ("reset".to_string(), vec![]),
            ("preflight".to_string(), vec![]),
        ]
    );
    let ops_stream = rig.stream("ops").await;
    for m in dev_stream.iter().chain(&ops_stream) {
        let whole = whole(m);
        for n in &needles {
            assert!(
                !contains(&whole, n),
                "the push key is in {} at sequence {}",
                m.subject,
                m.sequence
            );
        }
    }
    let log_json = rig
        .cli(&["item", "show", &item.id, "--agent", "dev", "--json"])
        .await;
    rig.stop().await;
    let logs = rig.logs();
    assert!(logs.contains("nisse is up"), "{logs}");
    for n in &needles {
        assert!(
            !log_json.contains(n.as_str()),
            "the push key is in the item's log"
        );
        assert!(
            !shown.contains(n.as_str()),
            "the push key is in `nisse item show`"
        );
        assert!(
            !logs.contains(n.as_str()),
            "the push key is in nisse's output"
        );
    }
}

#[tokio::test]
async fn what_an_earlier_item_left_in_the_workspace_is_set_aside_and_reported() {
    let mut rig = Rig::new().await;
    // An earlier item's clone: on a branch of its own with a commit never
    // pushed, and back on main with a change never committed and a file
    // never added.
    let ws = rig.workspace.clone();
    let bare = rig.repo.path();
    git(
        ws.parent().unwrap(),
        &["clone", "-q", bare.to_str().unwrap(), ws.to_str().unwrap()],
    )
    .await;
    git(&ws, &["checkout", "-q", "-b", "wip"]).await;
    std::fs::write(ws.join("spin.py"), "print('spinning')\n").unwrap();
    git(&ws, &["add", "spin.py"]).await;
    git(&ws, &["commit", "-q", "-m", "Half a fix"]).await;
    let wip = git(&ws, &["rev-parse", "HEAD"]).await;
    git(&ws, &["checkout", "-q", "main"]).await;
    std::fs::write(
        ws.join("README.md"),
        "# widget\n\nEdited, never committed.\n",
    )
    .unwrap();
    std::fs::write(ws.join("scratch.txt"), "notes\n").unwrap();
    let old_main = git(&ws, &["rev-parse", "HEAD"]).await;

    // Meanwhile the base branch moved on in Gitea.
    let other = tempfile::tempdir().unwrap();
    git(other.path(), &["clone", "-q", bare.to_str().unwrap(), "."]).await;
    std::fs::write(other.path().join("CHANGELOG.md"), "- spins\n").unwrap();
    git(other.path(), &["add", "CHANGELOG.md"]).await;
    git(other.path(), &["commit", "-q", "-m", "Changelog"]).await;
    git(
        other.path(),
        &[
            "--git-dir",
            bare.to_str().unwrap(),
            "fetch",
            "-q",
            other.path().to_str().unwrap(),
            "+HEAD:refs/heads/main",
        ],
    )
    .await;
    let base = rig.repo.branch_sha("main").await.unwrap().unwrap();
    assert_ne!(base, old_main);

    rig.up().await;
    // An issue nobody assigned comes first: the item's number (1) and the
    // issue's (2) differ, and each is used where it belongs.
    rig.repo
        .open_issue(OPERATOR, "Backlog", "Some day.", &[])
        .await
        .unwrap();
    let issue = rig.assign_issue("The widget does not spin").await;
    assert_eq!(issue, 2);
    let s = rig.prepared().await;
    let item = &s.items[0];
    assert_eq!(item.number, 1);
    let aside = format!("refs/nisse/set-aside/item-{}", item.number);

    // On disk: nothing was discarded. The uncommitted work is a commit
    // under .../worktree, the unpushed branch under .../branches/wip.
    let kept = rig
        .ws_git(&["rev-parse", &format!("{aside}/worktree")])
        .await;
    assert_eq!(
        rig.ws_git(&["show", &format!("{kept}:README.md")]).await,
        "# widget\n\nEdited, never committed."
    );
    assert_eq!(
        rig.ws_git(&["show", &format!("{kept}:scratch.txt")]).await,
        "notes"
    );
    assert_eq!(
        rig.ws_git(&["rev-parse", &format!("{aside}/branches/wip")])
            .await,
        wip
    );
    // main held nothing the repository lacks: not set aside.
    let refs = rig
        .ws_git(&["for-each-ref", "--format=%(refname)", "refs/nisse/"])
        .await;
    assert_eq!(
        refs.lines().collect::<Vec<_>>(),
        [format!("{aside}/branches/wip"), format!("{aside}/worktree")],
        "{refs}"
    );
    // And the workspace is on the item's branch at the latest base, clean.
    assert_eq!(
        rig.ws_git(&["rev-parse", "--abbrev-ref", "HEAD"]).await,
        format!("nisse/issue-{issue}")
    );
    assert_eq!(rig.ws_git(&["rev-parse", "HEAD"]).await, base);
    assert_eq!(rig.ws_git(&["status", "--porcelain"]).await, "");
    assert!(!ws.join("scratch.txt").exists());
    assert!(ws.join("CHANGELOG.md").exists());

    // The log says what was set aside and where.
    let shown = rig.cli(&["item", "show", "#1", "--agent", "dev"]).await;
    assert!(
        shown.contains(&format!(
            "fact: set aside in the workspace: uncommitted changes, kept under {aside}/worktree"
        )),
        "{shown}"
    );
    assert!(
        shown.contains(&format!(
            "fact: set aside in the workspace: branch wip with 1 commit(s) not in the repository, kept under {aside}/branches/wip"
        )),
        "{shown}"
    );
    // And so does the item's thread: the notice the agent posts.
    let replay = rig.cli(&["replay", "--agent", "dev", "--json"]).await;
    let notices: Vec<&str> = replay
        .lines()
        .filter(|l| l.contains("\"nisse.dev.out.tell\"") && l.contains("set aside"))
        .collect();
    assert_eq!(notices.len(), 1, "{replay}");
    for what in [
        format!("{aside}/worktree"),
        format!("{aside}/branches/wip"),
        "nothing was discarded".to_string(),
    ] {
        assert!(notices[0].contains(&what), "{what} not in {}", notices[0]);
    }
    rig.stop().await;
}

#[tokio::test]
async fn a_wrong_gitea_host_key_halts_preparation_until_the_operator_fixes_it_and_retries() {
    let mut rig = Rig::new().await;
    // The build host's known hosts pin another key for Gitea's address:
    // the build host's own, as a mistaken copy would.
    std::fs::write(
        &rig.git_known_hosts,
        format!(
            "[127.0.0.1]:{} {}\n",
            rig.gitea.sshd().port(),
            rig.build.host_public_key()
        ),
    )
    .unwrap();
    rig.up().await;
    let issue = rig.assign_issue("The widget does not spin").await;
    let s = rig
        .wait_until("the item waits on the operator", |s| {
            s.items
                .first()
                .is_some_and(|i| i.state == State::WaitingOnOperator)
        })
        .await;
    let halted: Vec<String> = s
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::Fact { text, data } if data.get("halted").is_some() => Some(text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(halted.len(), 1, "{:#?}", facts(&s));
    // Nothing was checked out.
    assert!(!rig.workspace.join("README.md").exists());

    // The operator reads why in the item's log and in its thread.
    let shown = rig.cli(&["item", "show", "#1", "--agent", "dev"]).await;
    assert!(
        shown.contains("state:       waiting_on_operator"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!(
            "fact: fetching the repository on {BUILD_HOST} failed (exit 128)"
        )),
        "{shown}"
    );
    let replay = rig.cli(&["replay", "--agent", "dev", "--json"]).await;
    let notice = replay
        .lines()
        .find(|l| l.contains("\"nisse.dev.out.tell\"") && l.contains("fetching the repository"))
        .unwrap_or_else(|| panic!("no notice in the thread: {replay}"))
        .to_string();
    // What went wrong is ssh's refusal of Gitea's host key, which the
    // executor's result carries: the halt must name it for the operator
    // to know what to fix. Checked at the end, so that the retry below is
    // tested whatever this finds.
    let why = "Host key verification failed";
    let results: Vec<String> = rig
        .stream("dev")
        .await
        .iter()
        .filter_map(|m| match m.decode() {
            Ok(AnyMessage::ExecResult(r)) if r.request_id.ends_with(":fetch:exec") => {
                Some(text(&r.stderr))
            }
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 1, "{results:#?}");
    assert!(results[0].contains(why), "{}", results[0]);
    let named_why = (shown.contains(why), notice.contains(why));

    // Fixed: Gitea's own key. `nisse retry` prepares the workspace again.
    std::fs::write(&rig.git_known_hosts, "").unwrap();
    rig.gitea.write_known_hosts(&rig.git_known_hosts).unwrap();
    let out = rig.cli(&["retry", "#1", "--agent", "dev"]).await;
    assert!(out.contains("the workspace is prepared again"), "{out}");
    rig.prepared().await;
    let base = rig.repo.branch_sha("main").await.unwrap().unwrap();
    assert_eq!(
        rig.ws_git(&["rev-parse", "--abbrev-ref", "HEAD"]).await,
        format!("nisse/issue-{issue}")
    );
    assert_eq!(rig.ws_git(&["rev-parse", "HEAD"]).await, base);
    let s = rig.snapshot().unwrap();
    assert_ne!(s.items[0].state, State::WaitingOnOperator);
    let shown = rig.cli(&["item", "show", "#1", "--agent", "dev"]).await;
    assert!(
        shown.contains("fact: retry: the workspace is prepared again"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("is on branch nisse/issue-{issue} at {base}")),
        "{shown}"
    );
    rig.stop().await;

    // The operator is told why the fetch failed (git's generic advice
    // lines come after the one that says it), in the log and the thread.
    assert_eq!(
        named_why,
        (true, true),
        "the halt does not say why the fetch failed (item log, thread): {}",
        halted[0]
    );
}

// ---------------------------------------------------------------------------
// The model-driven flow: restatement, milestones, review, merge
// ---------------------------------------------------------------------------

/// A repository whose widget does not spin, with the project's test.
const SPIN_FILES: &[(&str, &str)] = &[
    ("README.md", "# widget\n"),
    ("ARCHITECTURE.md", "# How widget works\n"),
    ("widget.sh", "spins=no\n"),
    (
        "test.sh",
        "#!/bin/sh\n. ./widget.sh\ntest \"$spins\" = yes\n",
    ),
];
/// The project's declared test command.
const TEST_COMMAND: &str = "sh test.sh";
/// The model's edit: the fix, and an artifact in `build/`.
const EDIT: &str = "printf 'spins=yes\\n' > widget.sh && mkdir -p build && printf 'spun once\\n' > build/report.txt";
/// The model's edit after the review.
const EDIT_AGAIN: &str = "printf 'spins=yes\\nspeed=fast\\n' > widget.sh";
/// A Gitea user who is no operator.
const STRANGER: &str = "mallory";
/// How long any one step of the flow may take.
const STEP_WITHIN: Duration = Duration::from_secs(30);

/// The configuration the flow needs: the scripted model as the driver, a
/// bug's grace of a second and a clock that ticks every second (the
/// grace is noticed at a tick), the test command, and no memory notes.
fn model_extra(model: &ScriptedModel) -> Extra {
    Extra {
        dev: "bug-grace = \"1s\"\nmemory = false\n".into(),
        project: format!("test-commands = [\"{TEST_COMMAND}\"]\n"),
        tail: format!(
            "[scheduler]\ntick = \"1s\"\n\
             [models]\nendpoint = \"{}\"\nretry-backoff = \"50ms\"\n\
             roles = {{ driver = \"local-driver\" }}\n\
             [models.models.local-driver]\ncontext-window = 32000\nmax-output-tokens = 1024\n",
            model.base_url()
        ),
        files: Some(SPIN_FILES),
        synapse: false,
    }
}

/// The model's replies for one milestone: it restates `understanding`,
/// makes the widget spin ([`EDIT`]) and finishes the milestone.
fn spin_milestone(ws: &Path, understanding: &str) -> [Reply; 3] {
    [
        call("restate", json!({ "understanding": understanding })),
        shell(ws, EDIT),
        call(
            "finish_milestone",
            json!({ "summary": "Make the widget spin" }),
        ),
    ]
}

/// The model calls `tool` with `arguments`.
fn call(tool: &str, arguments: serde_json::Value) -> Reply {
    Reply::ToolCall {
        name: tool.into(),
        arguments,
    }
}

/// The model runs `command` in the workspace on the build host.
fn shell(ws: &Path, command: &str) -> Reply {
    call(
        "shell",
        json!({ "host": BUILD_HOST, "command": format!("cd {} && {command}", ws.display()) }),
    )
}

/// Every tool call's tool and the result it got, in order.
fn tool_results(s: &Snapshot) -> Vec<(String, bool, String)> {
    let mut tools = std::collections::HashMap::new();
    let mut out = Vec::new();
    for e in &s.events {
        match &e.event {
            Event::ToolCall { call_id, tool, .. } => {
                tools.insert(call_id.clone(), tool.clone());
            }
            Event::ToolResult {
                call_id,
                result,
                success,
                ..
            } => out.push((
                tools.get(call_id).cloned().unwrap_or_default(),
                *success,
                result.clone(),
            )),
            _ => {}
        }
    }
    out
}

/// What the operators and others said, as logged: `(text, operator)`.
fn said(s: &Snapshot) -> Vec<(String, bool)> {
    s.events
        .iter()
        .filter_map(|e| match &e.event {
            Event::Said { text, operator, .. } => Some((text.clone(), *operator)),
            _ => None,
        })
        .collect()
}

/// git on a bare repository.
async fn bare_git(bare: &Path, args: &[&str]) -> String {
    let mut all = vec!["--git-dir", bare.to_str().unwrap()];
    all.extend_from_slice(args);
    git(Path::new("/"), &all).await
}

impl Rig {
    /// The thread's notices so far (the agent's `out.tell` messages,
    /// as `nisse replay --json` prints them).
    async fn thread(&self) -> Vec<String> {
        self.cli(&["replay", "--agent", "dev", "--json"])
            .await
            .lines()
            .filter(|l| l.contains("\"nisse.dev.out.tell\""))
            .map(str::to_string)
            .collect()
    }

    /// Waits until the thread has a notice containing every one of
    /// `words`; returns it.
    async fn notice(&self, words: &[&str]) -> String {
        let deadline = Instant::now() + STEP_WITHIN;
        loop {
            if let Some(n) = self
                .thread()
                .await
                .into_iter()
                .find(|n| words.iter().all(|w| n.contains(w)))
            {
                return n;
            }
            assert!(
                Instant::now() < deadline,
                "no notice with {words:?} in the thread: {:#?}\nfacts: {:#?}\n{}",
                self.thread().await,
                self.snapshot().map(|s| facts(&s)),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until `check` holds (not on the store).
    async fn wait_for(&self, what: &str, check: impl Fn() -> bool) {
        let deadline = Instant::now() + STEP_WITHIN;
        while !check() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting until {what}\nfacts: {:#?}\nresults: {:#?}\n{}",
                self.snapshot().map(|s| facts(&s)),
                self.snapshot().map(|s| tool_results(&s)),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the brain applied everything in its stream and its
    /// outbox is empty, twice 300 ms apart with nothing new.
    async fn quiet(&self) -> Snapshot {
        let deadline = Instant::now() + STEP_WITHIN;
        loop {
            let store = Store::open_read_only(&Store::path_in(&self.data(), "dev"), "dev").unwrap();
            let outbox_empty = store.outbox().is_ok_and(|o| o.is_empty());
            let before = store.snapshot().unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            let after = self.snapshot().unwrap();
            if outbox_empty && before.events.len() == after.events.len() {
                return after;
            }
            assert!(Instant::now() < deadline, "the dev brain never went quiet");
        }
    }
}

/// Waits for the result of the model's shell call `n` (counting its
/// shell calls from 0) and asserts it ran: an edit in the workspace is
/// class 2 on the item's build host, which its agreed scope contains, so
/// it runs at once without a plan (D6).
async fn edit_ran(rig: &Rig, n: usize) {
    let s = rig
        .wait_until("the model's edit has its result", |s| {
            tool_results(s)
                .iter()
                .filter(|(t, ..)| t == "shell")
                .count()
                > n
        })
        .await;
    let results = tool_results(&s);
    let (_, ok, result) = results
        .iter()
        .filter(|(t, ..)| t == "shell")
        .nth(n)
        .unwrap();
    assert!(*ok, "the model's edit {n} did not run: {result}");
}

#[tokio::test]
async fn a_bug_goes_from_restatement_through_a_reviewed_pull_request_to_a_closed_issue() {
    let model = ScriptedModel::start().await.unwrap();
    let mut rig = Rig::with(Extra {
        synapse: true,
        ..model_extra(&model)
    })
    .await;
    rig.gitea.add_user(STRANGER).unwrap();
    let ws = rig.workspace.clone();
    model.push([
        call(
            "restate",
            json!({ "understanding": "widget.sh says spins=no, so the widget never spins. I will set spins=yes and verify with sh test.sh." }),
        ),
        shell(&ws, EDIT),
        shell(&ws, TEST_COMMAND),
        call(
            "finish_milestone",
            json!({ "summary": "Make the widget spin\n\nwidget.sh sets spins=yes; sh test.sh passes." }),
        ),
    ]);
    rig.up().await;
    let issue = rig
        .assign_labelled("The widget does not spin", &["bug"])
        .await;
    assert_eq!(issue, 1);

    // Queued, restated in the thread, and (a bug, nobody answering) gone
    // ahead after the grace.
    rig.notice(&["Queued", "as item **#1**"]).await;
    rig.notice(&["My understanding of", "spins=yes", "I go ahead in 1s"])
        .await;
    rig.notice(&["did not answer the restatement of a bug within 1s"])
        .await;
    // In the agent's Synapse room: the acknowledgement with its place in
    // the queue is the item's thread root, the restatement a reply in it.
    let m = rig.matrix.as_ref().unwrap();
    let root = m
        .agent_posts(|e, b| {
            e["content"]["m.relates_to"].is_null()
                && b.contains("Queued **alice/widget#1**")
                && b.contains("as item **#1**, nothing ahead")
        })
        .await;
    let root = root["event_id"].as_str().unwrap().to_string();
    m.in_thread(
        &root,
        &["My understanding of", "spins=yes", "I go ahead in 1s"],
    )
    .await;

    // The model edits and builds, tests, then finishes the milestone: the
    // harness commits, pushes and opens the pull request.
    edit_ran(&rig, 0).await;
    let branch = "nisse/issue-1-1-make-the-widget-spin";
    rig.wait_for("the pull request is opened", || {
        rig.repo.pulls().len() == 1
            && rig.snapshot().is_some_and(|s| {
                tool_results(&s)
                    .iter()
                    .any(|(t, ok, r)| t == "finish_milestone" && *ok && r.contains("opened"))
            })
    })
    .await;
    let s = rig.snapshot().unwrap();
    let results = tool_results(&s);
    let shells: Vec<_> = results.iter().filter(|(t, ..)| t == "shell").collect();
    assert_eq!(shells.len(), 2, "{results:#?}");
    assert!(
        shells[1].1 && shells[1].2.starts_with("exit 0"),
        "the test command ran and passed: {results:#?}"
    );
    assert_eq!(
        s.items[0].state,
        State::WaitingOnOperator,
        "it waits for review"
    );
    let pulls = rig.repo.pulls();
    let pull = &pulls[0];
    assert_eq!(
        (
            pull.number,
            pull.head.as_str(),
            pull.base.as_str(),
            pull.user.as_str()
        ),
        (2, branch, "main", ACCOUNT)
    );
    assert!(!pull.closed);
    assert!(
        pull.body.contains("Part of #1") && pull.body.contains("build/"),
        "{}",
        pull.body
    );
    let bare = rig.repo.path();
    let first_head = rig.repo.branch_sha(branch).await.unwrap().unwrap();
    assert_eq!(
        bare_git(&bare, &["diff", "--name-only", "main", branch]).await,
        "widget.sh",
        "only the changed file is in the pull request, build/ is not"
    );
    assert_eq!(
        bare_git(&bare, &["log", "-1", "--format=%an <%ae>", branch]).await,
        format!("{ACCOUNT} <{ACCOUNT}@users.noreply.invalid>")
    );
    assert_eq!(
        bare_git(&bare, &["show", &format!("{branch}:widget.sh")]).await,
        "spins=yes"
    );
    let shown = rig.cli(&["item", "show", "#1", "--agent", "dev"]).await;
    assert!(
        shown.contains("left out: build/")
            && shown.contains("pull request #2 for milestone 1 opened"),
        "{shown}"
    );
    rig.notice(&["pull request [#2]", "opened", "waits for your review"])
        .await;
    m.in_thread(
        &root,
        &["pull request [#2]", "opened", "waits for your review"],
    )
    .await;
    let turns = model.requests().len();
    assert_eq!(turns, 4, "one model turn per call so far");

    // A stranger's inline comment is on record and wakes nothing.
    rig.repo
        .inline_comment(2, STRANGER, "widget.sh", 1, "Also delete test.sh")
        .await
        .unwrap();
    rig.wait_until("the stranger's comment is logged", |s| {
        said(s)
            .iter()
            .any(|(t, op)| !op && t.contains("Also delete test.sh"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        model.requests().len(),
        turns,
        "a stranger's comment is no turn"
    );

    // The operator's inline comment is an instruction: the model edits and
    // finishes the milestone again, which updates the same pull request
    // and answers the comment where it was made.
    model.push([
        shell(&ws, EDIT_AGAIN),
        call(
            "finish_milestone",
            json!({ "summary": "Spin fast, as asked in review" }),
        ),
    ]);
    let asked = rig
        .repo
        .inline_comment(2, OPERATOR, "widget.sh", 1, "Make it spin fast")
        .await
        .unwrap();
    edit_ran(&rig, 2).await;
    rig.wait_for("the operator's comment is answered in Gitea", || {
        rig.repo
            .review_comments(2)
            .iter()
            .any(|c| c.user == ACCOUNT && c.path == "widget.sh" && c.line == 1)
    })
    .await;
    let comments = rig.repo.review_comments(2);
    let reply = comments.iter().find(|c| c.user == ACCOUNT).unwrap();
    assert!(reply.id > asked, "{comments:#?}");
    assert!(
        reply.body.contains("Spin fast, as asked in review"),
        "{}",
        reply.body
    );
    assert_eq!(
        comments.iter().filter(|c| c.user == ACCOUNT).count(),
        1,
        "one reply, to the operator's comment alone: {comments:#?}"
    );
    let second_head = rig.repo.branch_sha(branch).await.unwrap().unwrap();
    assert_ne!(second_head, first_head);
    assert_eq!(
        bare_git(&bare, &["rev-parse", &format!("{second_head}^")]).await,
        first_head,
        "a new commit on the same branch"
    );
    assert!(
        reply.body.contains(&second_head[..10]),
        "the reply names the new commit: {}",
        reply.body
    );
    assert_eq!(rig.repo.pulls().len(), 1, "still one pull request");
    assert_eq!(
        bare_git(&bare, &["diff", "--name-only", "main", branch]).await,
        "widget.sh"
    );
    rig.wait_until("the update is logged", |s| {
        facts(s)
            .iter()
            .any(|f| f.contains("pull request #2 for milestone 1 updated"))
    })
    .await;
    assert_eq!(model.requests().len(), turns + 2);

    // The operator merges: the merge is news, and the model finishes; the
    // Gitea issue is closed with a note.
    model.push([call(
        "finish",
        json!({ "done": "The widget spins, fast", "verified": "sh test.sh passes", "left_open": "nothing" }),
    )]);
    rig.repo.merge_pull(2, OPERATOR).await.unwrap();
    rig.wait_for("the Gitea issue is closed", || {
        rig.repo.issue(1).is_some_and(|i| i.closed)
    })
    .await;
    let notes = rig.repo.comments(1);
    let note = notes
        .iter()
        .find(|c| c.user == ACCOUNT && c.body.contains("Done by the agent"))
        .unwrap_or_else(|| panic!("no closing note on the issue: {notes:#?}"));
    for what in ["The widget spins, fast", "sh test.sh passes", "#2 merged"] {
        assert!(note.body.contains(what), "{what} not in {}", note.body);
    }
    let s = rig
        .wait_until("the item is closed", |s| s.items[0].state == State::Closed)
        .await;
    assert_eq!(model.requests().len(), turns + 3);

    // The push key is in no command the model ran, no stream message, no
    // log.
    let needles = key_needles(&rig.key);
    let commands: Vec<&String> = s
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::ExecRequested { command, .. } => Some(command),
            Event::ToolCall { arguments, .. } => Some(arguments),
            _ => None,
        })
        .collect();
    assert!(commands.len() >= 8, "{commands:#?}");
    for m in rig.stream("dev").await {
        let whole = whole(&m);
        for n in &needles {
            assert!(
                !contains(&whole, n),
                "the push key is in {} at sequence {}",
                m.subject,
                m.sequence
            );
        }
    }
    let logs = rig.logs();
    for n in &needles {
        assert!(commands.iter().all(|c| !c.contains(n.as_str())));
        assert!(
            !logs.contains(n.as_str()),
            "the push key is in nisse's output"
        );
        for body in model.requests() {
            assert!(
                !body.to_string().contains(n.as_str()),
                "the push key reached the model"
            );
        }
    }

    // With the model server and Gitea gone, the stream rebuilds the same
    // state (the embedded NATS lives in `nisse up`, which keeps running:
    // its clock ticks every second, so the rebuild is compared with the
    // live state when both stand at the same sequence).
    drop(model);
    let gone = std::mem::replace(&mut rig.gitea, GiteaStandIn::start().await.unwrap());
    drop(gone);
    rig.quiet().await;
    let mut compared = false;
    for attempt in 0..8 {
        let dir = rig.path().join(format!("rebuilt-{attempt}"));
        let out = rig
            .cli(&[
                "replay",
                "--agent",
                "dev",
                "--rebuild",
                dir.to_str().unwrap(),
            ])
            .await;
        assert!(out.contains("1 work items (0 open)"), "{out}");
        let rebuilt = Store::open_read_only(&Store::path_in(&dir, "dev"), "dev")
            .unwrap()
            .snapshot()
            .unwrap();
        let live = rig.snapshot().unwrap();
        if live.applied_sequence == rebuilt.applied_sequence {
            pretty_assertions::assert_eq!(rebuilt, live);
            compared = true;
            break;
        }
    }
    assert!(compared, "the live state never stood where a rebuild did");
    rig.stop().await;
}

#[tokio::test]
async fn a_publish_whose_answer_was_lost_adopts_the_pull_request_it_made() {
    let model = ScriptedModel::start().await.unwrap();
    let mut rig = Rig::with(model_extra(&model)).await;
    let ws = rig.workspace.clone();
    model.push([
        call(
            "restate",
            json!({ "understanding": "I will set spins=yes in widget.sh." }),
        ),
        shell(&ws, "printf 'spins=yes\\n' > widget.sh"),
        call(
            "finish_milestone",
            json!({ "summary": "Make the widget spin" }),
        ),
    ]);
    // Gitea makes the pull request, and the answer is lost on the way back
    // (a proxy that gave up waiting): intake-gitea cannot tell it was made.
    let pulls_path = format!("/api/v1/repos/{REPOSITORY}/pulls");
    rig.gitea.lose_answers("POST", &pulls_path, 1, 504).unwrap();
    rig.up().await;
    // Not a bug: it waits for the word, given as a comment on the issue.
    let issue = rig.assign_issue("The widget does not spin").await;
    rig.notice(&["My understanding of", "Say **go** to start"])
        .await;
    rig.repo.comment(issue, OPERATOR, "go").await.unwrap();
    rig.wait_until("the go-ahead is logged", |s| {
        facts(s)
            .iter()
            .any(|f| f == "the operator gave the go-ahead")
    })
    .await;
    edit_ran(&rig, 0).await;
    rig.wait_until("the pull request is published", |s| {
        tool_results(s)
            .iter()
            .any(|(t, ..)| t == "finish_milestone")
    })
    .await;
    let s = rig.snapshot().unwrap();
    let results = tool_results(&s);
    let (_, ok, result) = results
        .iter()
        .find(|(t, ..)| t == "finish_milestone")
        .unwrap();
    assert!(*ok, "{results:#?}\n{:#?}", facts(&s));
    assert!(
        result.contains("pull request #2 for milestone 1 adopted (it was already open for the branch) and updated"),
        "{result}"
    );
    // One pull request: the one the lost call made, found again.
    let pulls = rig.repo.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(pulls[0].head, "nisse/issue-1-1-make-the-widget-spin");
    let posts: Vec<u16> = rig
        .gitea
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == pulls_path)
        .map(|r| r.status)
        .collect();
    assert_eq!(posts, [504], "the pull request was asked for once");
    let shown = rig.cli(&["item", "show", "#1", "--agent", "dev"]).await;
    assert!(shown.contains("adopted"), "{shown}");
    rig.notice(&["pull request [#2]", "adopted"]).await;
    rig.stop().await;
}

#[tokio::test]
async fn a_publish_gitea_refused_is_made_again_by_the_next_finish_milestone() {
    let model = ScriptedModel::start().await.unwrap();
    let mut rig = Rig::with(model_extra(&model)).await;
    let ws = rig.workspace.clone();
    model.push([
        call(
            "restate",
            json!({ "understanding": "I will set spins=yes in widget.sh." }),
        ),
        shell(&ws, EDIT),
        call(
            "finish_milestone",
            json!({ "summary": "Make the widget spin" }),
        ),
        // Told the publish failed and that finish_milestone publishes it
        // again, the model does so.
        call(
            "finish_milestone",
            json!({ "summary": "Make the widget spin" }),
        ),
    ]);
    // Gitea refuses the pull request unread, with an error no retry of
    // intake-gitea's gets past: the branch is pushed, no pull request.
    let pulls_path = format!("/api/v1/repos/{REPOSITORY}/pulls");
    rig.gitea
        .refuse_next(
            "POST",
            &pulls_path,
            1,
            422,
            nisse_tests::gitea::RetryAfter::None,
        )
        .unwrap();
    rig.up().await;
    let issue = rig.assign_issue("The widget does not spin").await;
    rig.notice(&["My understanding of", "Say **go** to start"])
        .await;
    rig.repo.comment(issue, OPERATOR, "go").await.unwrap();
    edit_ran(&rig, 0).await;
    let s = rig
        .wait_until("both finish_milestone calls have results", |s| {
            tool_results(s)
                .iter()
                .filter(|(t, ..)| t == "finish_milestone")
                .count()
                >= 2
        })
        .await;
    let results: Vec<_> = tool_results(&s)
        .into_iter()
        .filter(|(t, ..)| t == "finish_milestone")
        .collect();
    assert!(
        !results[0].1 && results[0].2.contains("could not be published (HTTP 422)"),
        "{results:#?}"
    );
    // The branch was pushed before the refusal.
    let branch = "nisse/issue-1-1-make-the-widget-spin";
    assert!(rig.repo.branch_sha(branch).await.unwrap().is_some());
    // The second call publishes what the first pushed: one pull request.
    assert!(
        results[1].1
            && results[1]
                .2
                .contains("pull request #2 for milestone 1 opened"),
        "the next finish_milestone did not publish the pushed branch: {:#?}\nfacts: {:#?}",
        results[1],
        facts(&s)
    );
    assert_eq!(rig.repo.pulls().len(), 1);
    rig.stop().await;
}

/// A feature (no `bug` label) waits for the operator's word, which the
/// operator gives in the item's thread in a real Synapse room: the
/// queue notice is the thread's root, the restatement and the pull
/// request's notice are replies in it, and the go-ahead is recorded as
/// the operator's.
#[tokio::test]
async fn a_feature_waits_for_the_go_ahead_given_in_its_matrix_thread() {
    let model = ScriptedModel::start().await.unwrap();
    let mut rig = Rig::with(Extra {
        synapse: true,
        ..model_extra(&model)
    })
    .await;
    let ws = rig.workspace.clone();
    model.push(spin_milestone(
        &ws,
        "widget.sh says spins=no. I will set spins=yes and check with sh test.sh.",
    ));
    rig.up().await;
    rig.assign_issue("Make the widget spin").await;
    let m = rig.matrix.as_ref().unwrap();
    let root = m
        .agent_posts(|e, b| e["content"]["m.relates_to"].is_null() && b.contains("as item **#1**"))
        .await;
    let root = root["event_id"].as_str().unwrap().to_string();
    m.in_thread(
        &root,
        &["My understanding of", "spins=yes", "Say **go** to start"],
    )
    .await;

    // Past a bug's grace (1 s) and a few ticks: nothing started without
    // the word.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = rig.snapshot().unwrap();
    assert!(
        tool_results(&s).iter().all(|(t, ..)| t != "shell"),
        "the model worked before the go-ahead: {:#?}",
        tool_results(&s)
    );
    assert!(!facts(&s).iter().any(|f| f.contains("go-ahead")));

    m.operator
        .send_thread_reply(&m.room, &root, "go ahead")
        .await
        .unwrap();
    let s = rig
        .wait_until("the go-ahead is logged", |s| {
            facts(s)
                .iter()
                .any(|f| f == "the operator gave the go-ahead")
        })
        .await;
    assert!(
        said(&s).contains(&("go ahead".to_string(), true)),
        "{:#?}",
        said(&s)
    );
    edit_ran(&rig, 0).await;
    m.in_thread(&root, &["pull request [#2]", "It waits for your review"])
        .await;
    let pulls = rig.repo.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(pulls[0].head, "nisse/issue-1-1-make-the-widget-spin");
    rig.stop().await;
}

/// `nisse up` is killed while its pull request call is in flight: the
/// branch is pushed, and Gitea either never got to the call or made the
/// pull request without the answer reaching anyone (`served`). Started
/// again on the same data, it ends with exactly one pull request, made
/// then or found, from the commit pushed before the kill.
async fn killed_while_publishing(served: bool) {
    let model = ScriptedModel::start().await.unwrap();
    let mut extra = model_extra(&model);
    // The call the kill interrupted was taken and never acknowledged: it
    // comes again once the server's wait for its ack runs out.
    extra.tail.push_str("[bus.consumers]\nack-wait = \"5s\"\n");
    let mut rig = Rig::with(extra).await;
    let ws = rig.workspace.clone();
    model.push(spin_milestone(&ws, "I will set spins=yes in widget.sh."));
    let pulls_path = format!("/api/v1/repos/{REPOSITORY}/pulls");
    let hang = rig.gitea.hang_next("POST", &pulls_path, served);
    rig.up().await;
    let issue = rig.assign_issue("The widget does not spin").await;
    rig.notice(&["My understanding of", "Say **go** to start"])
        .await;
    rig.repo.comment(issue, OPERATOR, "go").await.unwrap();
    tokio::time::timeout(STEP_WITHIN, hang.arrived())
        .await
        .unwrap_or_else(|_| panic!("the pull request was never asked for\n{}", rig.logs()));
    let branch = "nisse/issue-1-1-make-the-widget-spin";
    let pushed = rig
        .repo
        .branch_sha(branch)
        .await
        .unwrap()
        .expect("the branch is pushed before its pull request is asked for");
    assert_eq!(rig.repo.pulls().len(), usize::from(served));

    rig.kill().await;
    rig.up().await;
    let s = rig
        .wait_until("the milestone is published after the restart", |s| {
            tool_results(s)
                .iter()
                .any(|(t, ..)| t == "finish_milestone")
        })
        .await;
    let results = tool_results(&s);
    let (_, ok, result) = results
        .iter()
        .find(|(t, ..)| t == "finish_milestone")
        .unwrap();
    let how = if served {
        "adopted (it was already open for the branch)"
    } else {
        "opened"
    };
    assert!(
        *ok && result.contains(&format!("pull request #2 for milestone 1 {how}")),
        "{results:#?}\nfacts: {:#?}",
        facts(&s)
    );
    let pulls = rig.repo.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(pulls[0].head, branch);
    let posts = rig
        .gitea
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == pulls_path)
        .count();
    assert_eq!(
        posts,
        usize::from(!served),
        "asked for again only when Gitea had not made it"
    );
    // Nothing was committed or pushed again: the one commit of before.
    assert_eq!(rig.repo.branch_sha(branch).await.unwrap(), Some(pushed));
    assert_eq!(
        bare_git(
            &rig.repo.path(),
            &["rev-list", "--count", &format!("main..{branch}")]
        )
        .await,
        "1"
    );
    rig.notice(&["pull request [#2]", "It waits for your review"])
        .await;
    rig.stop().await;
}

#[tokio::test]
async fn nisse_up_killed_before_gitea_made_the_pull_request_makes_it_once_after_a_restart() {
    killed_while_publishing(false).await;
}

#[tokio::test]
async fn nisse_up_killed_after_gitea_made_the_pull_request_adopts_it_after_a_restart() {
    killed_while_publishing(true).await;
}

/// The project's branch protection is verified with the agent's own
/// token, not assumed (D4): relaxed by the operator (the agent's account
/// on the push allowlist), `nisse dev check` names the failing check and
/// exits non-zero, and an assigned issue is not worked on, its thread and
/// the room saying what failed; restored, the next check finds it and the
/// item's workspace is prepared.
#[tokio::test]
async fn a_project_whose_protection_is_relaxed_is_not_worked_on_until_it_is_restored() {
    let mut rig = Rig::with(Extra {
        dev: "protection-recheck = \"1s\"\n".into(),
        tail: "[scheduler]\ntick = \"1s\"\n".into(),
        ..Extra::default()
    })
    .await;
    rig.repo
        .set_protection(Protection {
            push_allowlist: vec![ACCOUNT.into()],
            ..Protection::default()
        })
        .unwrap();
    rig.up().await;
    let out = run(nisse(rig.path()).args(["dev", "check", "widget"])).await;
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout)
            .lines()
            .any(|l| l.contains("the agent may push to it:") && l.ends_with(" yes"))
            && text(&out.stderr).contains(&format!("`{ACCOUNT}` may push to `main`")),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    rig.assign_issue("Make the widget spin").await;
    rig.notice(&["Item **#1**", "its start waits", "may push to"])
        .await;
    rig.notice(&["Project `widget` is not worked on", "may push to"])
        .await;
    let s = rig.snapshot().unwrap();
    assert_eq!(s.items[0].state, State::Blocked);
    assert!(
        !facts(&s).iter().any(|f| f.starts_with("toolchain on")),
        "nothing was prepared: {:#?}",
        facts(&s)
    );
    assert!(!rig.workspace.join(".git").exists(), "nothing was fetched");

    // The operator restores the rule: the next check finds it, and the
    // item goes on.
    rig.repo.set_protection(Protection::default()).unwrap();
    rig.prepared().await;
    rig.notice(&["Item **#1**", "holds again", "queued again"])
        .await;
    rig.notice(&["holds again: work on project `widget` goes on"])
        .await;
    let held = rig.cli(&["dev", "check", "widget"]).await;
    assert!(held.contains("the protection holds"), "{held}");
    rig.stop().await;
}

/// Two items on one project, worked in turn (D4 parking): each takes the
/// workspace from the other by parking it (its work committed and pushed
/// on its own branch) and is put back on its own branch when its turn
/// comes again, so each pull request holds only its own changes, the
/// work left uncommitted when an item was parked included.
#[tokio::test]
async fn two_items_on_one_project_parked_and_resumed_in_turn_each_publish_only_their_own_changes() {
    let model = ScriptedModel::start().await.unwrap();
    let mut extra = model_extra(&model);
    extra.dev.push_str("switch-grace = \"1s\"\n");
    let mut rig = Rig::with(extra).await;
    let ws = rig.workspace.clone();
    let bare = rig.repo.path();
    model.push([
        call(
            "restate",
            json!({ "understanding": "I will set spins=yes in widget.sh." }),
        ),
        shell(&ws, "printf 'spins=yes\\n' > widget.sh"),
        call(
            "finish_milestone",
            json!({ "summary": "Make the widget spin" }),
        ),
    ]);
    rig.up().await;
    assert_eq!(
        rig.assign_labelled("The widget does not spin", &["bug"])
            .await,
        1
    );
    rig.wait_for("item #1's pull request is opened", || {
        rig.repo.pulls().len() == 1
    })
    .await;

    // Item #2 takes the workspace while #1 waits for its review, works,
    // and asks a question with its edit not committed.
    model.push([
        call(
            "restate",
            json!({ "understanding": "I will say in the README that the widget spins." }),
        ),
        shell(&ws, "printf 'It spins.\\n' >> README.md"),
        call(
            "ask_human",
            json!({ "question": "Should the README also say how fast?" }),
        ),
    ]);
    assert_eq!(rig.assign_labelled("Document spinning", &["bug"]).await, 3);
    rig.notice(&[
        "Item **#1** is parked",
        "nisse/issue-1-1-make-the-widget-spin",
    ])
    .await;
    rig.notice(&["Should the README also say how fast?"]).await;

    // The operator asks for more on #1's pull request: #1's turn comes,
    // #2 is parked with its edit committed on its own branch.
    model.push([
        shell(&ws, "printf 'spins=yes\\nspeed=fast\\n' > widget.sh"),
        call(
            "finish_milestone",
            json!({ "summary": "Make the widget spin fast" }),
        ),
    ]);
    rig.repo
        .comment(2, OPERATOR, "Make it spin fast too.")
        .await
        .unwrap();
    rig.notice(&["Item **#2** is parked", "nisse/issue-3"])
        .await;
    rig.wait_until("item #1's pull request is updated", |s| {
        tool_results(s).iter().any(|(t, ok, r)| {
            t == "finish_milestone" && *ok && r.contains("#2 for milestone 1 updated")
        })
    })
    .await;
    let first = "nisse/issue-1-1-make-the-widget-spin";
    assert_eq!(
        bare_git(&bare, &["diff", "--name-only", "main", first]).await,
        "widget.sh",
        "item #1's pull request has only its own change"
    );
    assert_eq!(
        bare_git(&bare, &["show", &format!("{first}:widget.sh")]).await,
        "spins=yes\nspeed=fast"
    );
    assert_eq!(
        bare_git(&bare, &["diff", "--name-only", "main", "nisse/issue-3"]).await,
        "README.md",
        "item #2's parked edit is pushed on its own branch"
    );

    // The operator answers #2: it is put back on its branch and publishes
    // what it did, the parked edit included.
    model.push([call(
        "finish_milestone",
        json!({ "summary": "Say that the widget spins" }),
    )]);
    rig.repo
        .comment(3, OPERATOR, "No, only that it spins.")
        .await
        .unwrap();
    rig.wait_for("item #2's pull request is opened", || {
        rig.repo.pulls().len() == 2
    })
    .await;
    let pulls = rig.repo.pulls();
    let second = pulls
        .iter()
        .find(|p| p.head != first)
        .expect("item #2's pull request");
    assert_eq!(second.head, "nisse/issue-3-1-say-that-the-widget-spins");
    assert!(second.body.contains("Part of #3"), "{}", second.body);
    assert_eq!(
        bare_git(&bare, &["diff", "--name-only", "main", &second.head]).await,
        "README.md",
        "item #2's pull request has only its own change"
    );
    assert_eq!(
        bare_git(&bare, &["show", &format!("{}:widget.sh", second.head)]).await,
        "spins=no",
        "nothing of item #1's reached item #2's branch"
    );
    // #1 was parked twice: for #2's start and for its return.
    let parked = rig
        .thread()
        .await
        .iter()
        .filter(|n| n.contains("Item **#1** is parked"))
        .count();
    assert_eq!(parked, 2);
    rig.stop().await;
}

/// A feature longer than one pull request (D2, D4): the first pull
/// request holds the whole build plan, each marks its own milestone done,
/// each milestone's branch is cut only after the previous pull request
/// merged and holds only that milestone's changes; the last merge lets
/// the agent finish, and the issue is closed.
#[tokio::test]
async fn a_three_milestone_feature_goes_one_merged_pull_request_at_a_time() {
    let model = ScriptedModel::start().await.unwrap();
    let mut rig = Rig::with(model_extra(&model)).await;
    let ws = rig.workspace.clone();
    let bare = rig.repo.path();
    let plan = "docs/plans/spin.md";
    let mark =
        |k: u32| format!("sed -i 's/^- \\[ \\] Milestone {k}:/- [x] Milestone {k}:/' {plan}");
    model.push([
        call(
            "restate",
            json!({ "understanding": "Three milestones: the widget spins, then fast, then the README says so. I will write the build plan first." }),
        ),
        call("start_milestone", json!({ "name": "Spin" })),
        shell(
            &ws,
            &format!(
                "mkdir -p docs/plans && printf '%s\\n' '# Plan: the widget spins, fast, and says so' '- [x] Milestone 1: spin. Goal: widget.sh sets spins=yes. Acceptance: sh test.sh passes.' '- [ ] Milestone 2: speed. Goal: widget.sh sets speed=fast. Acceptance: grep -q speed=fast widget.sh.' '- [ ] Milestone 3: docs. Goal: the README says it spins. Acceptance: grep -q spins README.md.' > {plan} && printf 'spins=yes\\n' > widget.sh"
            ),
        ),
        call(
            "finish_milestone",
            json!({ "summary": "Spin (milestone 1 of docs/plans/spin.md)" }),
        ),
    ]);
    rig.up().await;
    let issue = rig
        .assign_issue("Make the widget spin fast, and say so")
        .await;
    rig.notice(&["My understanding of", "Say **go** to start"])
        .await;
    rig.repo.comment(issue, OPERATOR, "go").await.unwrap();

    let branches = [
        "nisse/issue-1-1-spin",
        "nisse/issue-1-2-speed",
        "nisse/issue-1-3-docs",
    ];
    let next = [
        (
            "Speed",
            format!(
                "printf 'spins=yes\\nspeed=fast\\n' > widget.sh && {}",
                mark(2)
            ),
        ),
        (
            "Docs",
            format!("printf 'It spins, fast.\\n' >> README.md && {}", mark(3)),
        ),
    ];
    for k in 0..3usize {
        rig.wait_for(&format!("milestone {}'s pull request", k + 1), || {
            rig.repo.pulls().len() == k + 1
        })
        .await;
        let pull = rig
            .repo
            .pulls()
            .into_iter()
            .find(|p| p.head == branches[k])
            .unwrap_or_else(|| panic!("no pull request from {}", branches[k]));
        let changed = bare_git(&bare, &["diff", "--name-only", "main", branches[k]]).await;
        let expected = if k < 2 {
            format!("{plan}\nwidget.sh")
        } else {
            format!("README.md\n{plan}")
        };
        assert_eq!(
            changed,
            expected,
            "milestone {} changed only its own",
            k + 1
        );
        let text = bare_git(&bare, &["show", &format!("{}:{plan}", branches[k])]).await;
        assert_eq!(
            text.lines().filter(|l| l.contains("Milestone")).count(),
            3,
            "the whole plan is in every pull request: {text}"
        );
        assert!(
            text.contains(&format!("- [x] Milestone {}:", k + 1)),
            "pull request {} marks its milestone done: {text}",
            pull.number
        );
        if let Some(later) = branches.get(k + 1) {
            assert_eq!(
                rig.repo.branch_sha(later).await.unwrap(),
                None,
                "the next milestone waits for the merge"
            );
            let (name, edit) = &next[k];
            model.push([
                call("start_milestone", json!({ "name": name })),
                shell(&ws, edit),
                call(
                    "finish_milestone",
                    json!({ "summary": format!("{name} (milestone {} of {plan})", k + 2) }),
                ),
            ]);
        } else {
            model.push([call(
                "finish",
                json!({ "done": "The widget spins, fast, and the README says so", "verified": "sh test.sh; the plan's acceptance checks", "left_open": "nothing" }),
            )]);
        }
        rig.repo.merge_pull(pull.number, OPERATOR).await.unwrap();
    }
    rig.wait_for("the issue is closed", || {
        rig.repo.issue(issue).is_some_and(|i| i.closed_at.is_some())
    })
    .await;
    let merged = rig
        .repo
        .pulls()
        .iter()
        .filter(|p| p.merged.is_some())
        .count();
    assert_eq!(merged, 3);
    let progress: Vec<String> = rig
        .repo
        .comments(issue)
        .into_iter()
        .filter(|c| c.user == ACCOUNT)
        .map(|c| c.body)
        .collect();
    for k in 1..=3 {
        assert!(
            progress
                .iter()
                .any(|c| c.starts_with(&format!("Milestone {k} ("))),
            "milestone {k} started is told on the issue: {progress:#?}"
        );
        assert!(
            progress
                .iter()
                .any(|c| c.starts_with(&format!("Milestone {k}: pull request"))
                    && c.contains("merged")),
            "milestone {k}'s merge is told on the issue: {progress:#?}"
        );
    }
    rig.stop().await;
}

/// The trust dial at `agent-merges-after-approval` (L3, D5), with Gitea
/// enforcing it: the agent does not merge while no operator approved, nor
/// while the required check runs; once the operator approved its head and
/// the check passed, the agent merges its own pull request, Gitea letting
/// it, and says so on the issue.
#[tokio::test]
async fn with_the_dial_at_agent_merges_the_agent_merges_after_an_operators_approval_and_green_checks()
 {
    let model = ScriptedModel::start().await.unwrap();
    let mut extra = model_extra(&model);
    extra.dev.push_str("checks-recheck = \"1s\"\n");
    extra
        .project
        .push_str("trust = \"agent-merges-after-approval\"\n");
    let mut rig = Rig::with(extra).await;
    rig.repo
        .set_protection(Protection {
            status_check_contexts: vec!["ci/test".into()],
            ..Protection::default()
        })
        .unwrap();
    let ws = rig.workspace.clone();
    model.push(spin_milestone(&ws, "I will set spins=yes in widget.sh."));
    rig.up().await;
    rig.assign_labelled("The widget does not spin", &["bug"])
        .await;
    rig.wait_for("the pull request is opened", || rig.repo.pulls().len() == 1)
        .await;
    let branch = "nisse/issue-1-1-make-the-widget-spin";
    let head = rig.repo.branch_sha(branch).await.unwrap().unwrap();
    rig.repo
        .set_status(&head, "ci/test", "pending", "running")
        .await
        .unwrap();

    // Approved, the check still running: not merged.
    rig.repo.approve(2, OPERATOR).await.unwrap();
    rig.wait_until("the approval is read", |s| {
        facts(s)
            .iter()
            .any(|f| f.contains("is approved by alice") && f.contains("merged once they pass"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        rig.repo.pulls()[0].merged.is_none(),
        "not while the check runs"
    );

    // The check passes: read again at a tick, and merged by the agent.
    model.push([call(
        "finish",
        json!({ "done": "The widget spins", "verified": "sh test.sh and ci/test", "left_open": "nothing" }),
    )]);
    rig.repo
        .set_status(&head, "ci/test", "success", "passed")
        .await
        .unwrap();
    rig.wait_for("the agent merges the pull request", || {
        rig.repo.pulls()[0].merged.is_some()
    })
    .await;
    let merge = rig.repo.pulls()[0].merged.clone().unwrap();
    assert_eq!(merge.by, ACCOUNT);
    let s = rig
        .wait_until("the merge is recorded", |s| {
            facts(s).iter().any(|f| f.contains("merged by the agent"))
        })
        .await;
    assert!(
        facts(&s)
            .iter()
            .any(|f| f.contains(&format!("approved by alice at {head}"))),
        "{:#?}",
        facts(&s)
    );
    rig.wait_for("the issue is closed", || {
        rig.repo.issue(1).is_some_and(|i| i.closed_at.is_some())
    })
    .await;
    assert!(
        rig.repo.comments(1).iter().any(
            |c| c.user == ACCOUNT && c.body.starts_with("Milestone 1: pull request #2 merged.")
        )
    );
    rig.stop().await;
}

/// `nisse dev project add` registers a project the operator provisioned
/// (D1): refused with the problem named, and the file untouched, while
/// the configuration with it would be invalid; written with the file's
/// own comments kept, its repository added to those intake-gitea serves,
/// and its protection checked with the agent's token, once it is valid.
#[tokio::test]
async fn a_provisioned_project_is_registered_in_the_configuration_and_its_protection_checked() {
    let rig = Rig::new().await;
    let gadget = rig
        .gitea
        .create_repo(OPERATOR, "gadget", "main", FILES)
        .await
        .unwrap();
    let file = rig.path().join("nisse.toml");
    let before = format!(
        "# The operator's own words stay.\n{}",
        std::fs::read_to_string(&file).unwrap()
    );
    std::fs::write(&file, &before).unwrap();
    let add = |host: &str| {
        let mut cmd = nisse(rig.path());
        cmd.args([
            "dev",
            "project",
            "add",
            "gadget",
            "--repository",
            "alice/gadget",
            "--build-host",
            host,
            "--workspace",
            "/srv/work/gadget",
            "--clone-url",
            &gadget.clone_url(),
            "--test-command",
            "sh test.sh",
        ]);
        cmd
    };

    // Its build host is not an executor host yet: nothing is written.
    let out = run(&mut add("build-gadget")).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("dev.projects.gadget.build-host")
            && text(&out.stderr).contains("unchanged"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);

    // The operator adds the build host; the project goes in.
    let with_host = format!(
        "{before}[executor.agents.dev.hosts.build-gadget]\naddress = \"127.0.0.1\"\nport = {}\nuser = {:?}\nsecrets = [{{ name = \"gitea-push-key\", stdin = true }}]\n",
        rig.build.port(),
        rig.build.user()
    );
    std::fs::write(&file, &with_host).unwrap();
    let out = run(&mut add("build-gadget")).await;
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("project gadget added")
            && text(&out.stdout).contains("the protection holds"),
        "{}",
        text(&out.stdout)
    );
    let after = std::fs::read_to_string(&file).unwrap();
    assert!(
        after.starts_with("# The operator's own words stay.\n"),
        "{after}"
    );
    let cfg: toml::Table = after.parse().unwrap();
    let project = &cfg["dev"]["projects"]["gadget"];
    assert_eq!(project["repository"].as_str(), Some("alice/gadget"));
    assert_eq!(project["build-host"].as_str(), Some("build-gadget"));
    assert_eq!(project["test-commands"][0].as_str(), Some("sh test.sh"));
    let served: Vec<&str> = cfg["gitea"]["repositories"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    assert_eq!(served, [REPOSITORY, "alice/gadget"]);
    // The widget project is as it was, and the whole file loads.
    let checked = rig.cli(&["config", "check"]).await;
    assert!(
        checked.contains("gadget = { base-branch = \"main\", build-host = \"build-gadget\"")
            && checked.contains("widget = { base-branch = \"main\", build-host = \"build\""),
        "{checked}"
    );

    // Added twice: refused, naming where it is.
    let out = run(&mut add("build-gadget")).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("dev.projects.gadget exists already"),
        "{}",
        text(&out.stderr)
    );
}

/// Seed D1: a conversation in the agent's room that leads to a project
/// ends with the agent saying what it needs provisioned; once the operator
/// registers it, the agent opens a tracking issue and lands the
/// architecture in a first pull request.
#[tokio::test]
async fn a_conversation_in_the_room_becomes_a_project_whose_architecture_is_the_first_pull_request()
{
    let model = ScriptedModel::start().await.unwrap();
    let mut rig = Rig::with(Extra {
        synapse: true,
        ..model_extra(&model)
    })
    .await;
    let gadget_ws = rig.path().join("build-host/work/gadget");
    model.push([
        call(
            "ask_human",
            json!({ "question": "Which backups should it watch, and how should it tell you?" }),
        ),
        call(
            "propose_project",
            json!({
                "name": "gadget",
                "repository": "alice/gadget",
                "summary": "A small service that checks each night that the restic backups ran.",
                "issue_title": "Gadget: a watcher for the nightly backups",
                "issue_body": "## Goals\n- Read restic's snapshots each morning.\n- Tell the operator in the room when one is missing.\n\n## First milestone\nThe architecture.",
                "build_host_needs": ["Python 3.11", "restic"]
            }),
        ),
        // Hours later, after the operator registered it: the workspace is
        // ready and the architecture goes first.
        call("start_milestone", json!({ "name": "The architecture" })),
        call(
            "shell",
            json!({ "host": "build-gadget", "command": format!(
                "cd {} && printf '# How gadget works\\n\\nA timer reads restic snapshots and posts what is missing.\\n' > ARCHITECTURE.md",
                gadget_ws.display()
            ) }),
        ),
        call(
            "finish_milestone",
            json!({ "summary": "The architecture: components, data and tests" }),
        ),
    ]);
    rig.up().await;
    // Owned here: the rig restarts `nisse up` under it.
    let m = rig.matrix.take().unwrap();
    super::room_listening(&m.operator, &m.room, &m.agent_id).await;

    // The operator talks at the top of the room: a conversation opens in
    // a thread on their own message.
    let first = m
        .operator
        .send_text(
            &m.room,
            "I would like a little tool that checks our backups ran every night",
        )
        .await
        .unwrap();
    m.in_thread(&first, &["Item **#1**", "opened by", "via matrix"])
        .await;
    m.in_thread(&first, &["Which backups should it watch"])
        .await;
    m.operator
        .send_thread_reply(&m.room, &first, "The restic jobs on the NAS; tell me here.")
        .await
        .unwrap();
    let asked = m
        .in_thread(
            &first,
            &[
                "Proposed project **gadget** on `alice/gadget`",
                "Branch protection on `main`",
                "nisse dev project add gadget --repository alice/gadget",
                "restic",
            ],
        )
        .await;
    assert!(
        asked["content"]["body"]
            .as_str()
            .unwrap()
            .contains("Gadget: a watcher for the nightly backups"),
        "{asked}"
    );
    let s = rig
        .wait_until("the conversation waits on the operator", |s| {
            s.items
                .iter()
                .any(|i| i.number == 1 && i.state == State::WaitingOnOperator)
        })
        .await;
    assert_eq!(s.items.len(), 1, "{:#?}", s.items);
    // A reply outside the thread (as clients without threads send) to
    // the request is about the conversation: `status` is answered there.
    m.operator
        .send_event(
            &m.room,
            "m.room.message",
            &json!({
                "msgtype": "m.text",
                "body": "status",
                "m.relates_to": { "m.in_reply_to": { "event_id": asked["event_id"] } },
            }),
        )
        .await
        .unwrap();
    m.in_thread(&first, &["Item **#1**", "waiting on operator"])
        .await;
    assert!(
        said(&s).contains(&(
            "I would like a little tool that checks our backups ran every night".into(),
            true
        )) && said(&s).contains(&("The restic jobs on the NAS; tell me here.".into(), true)),
        "{:#?}",
        said(&s)
    );
    // Nothing ran anywhere while they talked.
    assert!(
        tool_results(&s).iter().all(|(t, ..)| t != "shell"),
        "{:#?}",
        tool_results(&s)
    );

    // The operator provisions what was asked: the repository with its
    // protection, a build host, and the registration; then restarts.
    let gadget = rig
        .gitea
        .create_repo(OPERATOR, "gadget", "main", &[("README.md", "# gadget\n")])
        .await
        .unwrap();
    let file = rig.path().join("nisse.toml");
    let mut config = std::fs::read_to_string(&file).unwrap();
    config.push_str(&format!(
        "[executor.agents.dev.hosts.build-gadget]\naddress = \"127.0.0.1\"\nport = {}\nuser = {:?}\nsecrets = [{{ name = \"gitea-push-key\", stdin = true }}]\n",
        rig.build.port(),
        rig.build.user()
    ));
    std::fs::write(&file, config).unwrap();
    let added = rig
        .cli(&[
            "dev",
            "project",
            "add",
            "gadget",
            "--repository",
            "alice/gadget",
            "--build-host",
            "build-gadget",
            "--workspace",
            gadget_ws.to_str().unwrap(),
            "--clone-url",
            &gadget.clone_url(),
            "--git-known-hosts",
            rig.git_known_hosts.to_str().unwrap(),
        ])
        .await;
    assert!(added.contains("the protection holds"), "{added}");
    rig.stop().await;
    rig.up().await;

    // The agent opens the tracking issue, assigned to itself, with the
    // model's words and where it came from.
    m.in_thread(&first, &["Project **gadget** is registered"])
        .await;
    m.in_thread(&first, &["Opened the tracking issue", "alice/gadget#1"])
        .await;
    let issues = gadget.issues();
    assert_eq!(issues.len(), 1, "{issues:#?}");
    let tracking = &issues[0];
    assert_eq!(tracking.title, "Gadget: a watcher for the nightly backups");
    assert_eq!(tracking.user, ACCOUNT);
    assert_eq!(tracking.assignees, [ACCOUNT]);
    assert!(
        tracking.body.contains("Read restic's snapshots")
            && tracking.body.contains("from a conversation with"),
        "{}",
        tracking.body
    );

    // The architecture is the first pull request, on the new project.
    rig.wait_for("the architecture's pull request is open", || {
        !gadget.pulls().is_empty()
    })
    .await;
    let pulls = gadget.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(pulls[0].head, "nisse/issue-1-1-the-architecture");
    assert_eq!(pulls[0].base, "main");
    assert_eq!(pulls[0].user, ACCOUNT);
    let shown = bare_git(
        &gadget.path(),
        &["show", &format!("{}:ARCHITECTURE.md", pulls[0].head)],
    )
    .await;
    assert!(shown.contains("A timer reads restic snapshots"), "{shown}");
    let changed = bare_git(
        &gadget.path(),
        &["diff", "--name-only", "main", &pulls[0].head],
    )
    .await;
    assert_eq!(changed.trim(), "ARCHITECTURE.md");
    // The widget project saw none of it.
    assert!(rig.repo.pulls().is_empty() && rig.repo.issues().is_empty());
    let s = rig.snapshot().unwrap();
    assert!(
        facts(&s)
            .iter()
            .any(|f| f.starts_with("opened the tracking issue alice/gadget#1 of project gadget")),
        "{:#?}",
        facts(&s)
    );
    assert_eq!(s.items.len(), 1, "{:#?}", s.items);
    rig.stop().await;
}
