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
use nisse_tests::gitea::{GiteaRepo, GiteaStandIn, PushKey};
use nisse_tests::sshd::TestSshd;

use super::{nisse, run, signal, text};

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

/// The user running the tests, as `nisse` names a CLI operator.
fn local_user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .expect("the test's user has a name")
        .name
}

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
}

impl Rig {
    /// Everything but `nisse up`, which [`Rig::up`] starts. The known
    /// hosts the build host's git reads hold Gitea's host key.
    async fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("nisse-dev-e2e-")
            .tempdir()
            .unwrap();
        let gitea = GiteaStandIn::start().await.unwrap();
        let token = gitea.add_user(ACCOUNT).unwrap();
        gitea.add_user(OPERATOR).unwrap();
        let (owner, name) = REPOSITORY.split_once('/').unwrap();
        let repo = gitea.create_repo(owner, name, "main", FILES).await.unwrap();
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
        let config = format!(
            "agents = [\"ops\", \"dev\"]\n\
             data-dir = {data:?}\n\
             [embedded]\nport = {nats_port}\n\
             [dev]\naccount = \"{ACCOUNT}\"\n\
             operators = [\"gitea:{OPERATOR}\", \"cli:{me}\"]\n\
             [dev.projects.widget]\n\
             repository = \"{REPOSITORY}\"\n\
             base-branch = \"main\"\n\
             build-host = \"{BUILD_HOST}\"\n\
             workspace = {workspace:?}\n\
             clone-url = {clone_url:?}\n\
             git-known-hosts = {git_known_hosts:?}\n\
             [gitea]\nurl = {gitea_url:?}\naccount = \"{ACCOUNT}\"\n\
             token-file = {token_file:?}\nwebhook-secret-file = {secret_file:?}\n\
             listen = \"127.0.0.1:0\"\nrepositories = [\"{REPOSITORY}\"]\n\
             poll-interval = \"0s\"\n\
             [executor.agents.dev]\nkey-file = {client_key:?}\nknown-hosts = {build_known_hosts:?}\n\
             [executor.agents.dev.hosts.{BUILD_HOST}]\naddress = \"127.0.0.1\"\nport = {build_port}\n\
             user = {user:?}\nsecrets = [{{ name = \"gitea-push-key\", stdin = true }}]\n\
             [executor.agents.dev.secrets.gitea-push-key]\nfile = {push_key:?}\n",
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

    /// What `nisse up` wrote so far, standard output then error.
    fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.path().join(f)).unwrap_or_default();
        format!("{}{}", read("up.stdout"), read("up.stderr"))
    }

    /// The operator opens an issue and assigns it to the agent; the
    /// stand-in delivers the webhooks. Returns the issue's number.
    async fn assign_issue(&self, title: &str) -> i64 {
        let number = self
            .repo
            .open_issue(OPERATOR, title, "It should work.", &[])
            .await
            .unwrap();
        self.repo.assign(number, ACCOUNT, OPERATOR).await.unwrap();
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
        .filter(|l| l.contains("\"nisse.dev.out.matrix\"") && l.contains("set aside"))
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
        .find(|l| l.contains("\"nisse.dev.out.matrix\"") && l.contains("fetching the repository"))
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
