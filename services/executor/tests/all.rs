//! The executor against a real NATS server and a real OpenSSH `sshd`
//! standing in for a tool VM. Requests are published the way a brain
//! publishes them (each after the classifier's verdict it names), and
//! also the way a buggy or hostile one might (an unbound host, a switch
//! flipped after approval, a hundred duplicates, a verdict about another
//! action or none), since the executor's walls must hold on their own.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test by panicking"
)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;

use nisse_bus::proto::{
    self, Envelope, ExecFailure, ExecPermission, ExecRequest, ExecResult, ExecStatus, HostBinding,
};
use nisse_bus::{AnyMessage, Bus, NeverEntry};
use nisse_executor::config::{AgentConfig, Config, HostConfig, SecretGrant, SecretSource};
use nisse_tests::sshd::{SshdOptions, TestSshd};
use nisse_tests::{BrainKey, InProcess, TestNats, ops};

mod shell;

const ITEM: &str = "0190c0de-0000-7000-8000-000000000001";
const SECRET: &str = "s3cr3t-hunter2-correct-horse";

/// NATS, sshd, and an executor configured to reach the sshd as `tool`.
struct Rig {
    nats: TestNats,
    sshd: TestSshd,
    dir: tempfile::TempDir,
    /// The ops brain's key, which signs what the rig publishes.
    brain: BrainKey,
    bus: Bus,
    config: Config,
    executor: Option<InProcess>,
}

impl Rig {
    async fn new(tweak: impl FnOnce(&mut Config)) -> Self {
        Self::on(SshdOptions::new(), tweak).await
    }

    /// A rig whose host `tool` is as `host` describes (another login
    /// shell, no bash).
    async fn on(host: SshdOptions, tweak: impl FnOnce(&mut Config)) -> Self {
        let nats = TestNats::start().await.unwrap();
        let sshd = TestSshd::start_with(host).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bus = nats.bus(&["ops"]).await.unwrap();
        bus.ensure_topology().await.unwrap();
        let known_hosts = dir.path().join("known_hosts");
        sshd.write_known_hosts(&known_hosts, "127.0.0.1").unwrap();
        std::fs::write(dir.path().join("secret"), format!("{SECRET}\n")).unwrap();
        let mut agent = AgentConfig {
            key_file: Some(sshd.client_key()),
            known_hosts: Some(known_hosts),
            ..AgentConfig::default()
        };
        agent.hosts.insert(
            "tool".into(),
            HostConfig {
                address: "127.0.0.1".into(),
                port: sshd.port(),
                user: sshd.user().to_string(),
                secrets: vec![SecretGrant {
                    name: "token".into(),
                    env: Some("NISSE_TEST_SECRET".into()),
                    stdin: false,
                }],
                ..HostConfig::default()
            },
        );
        agent.secrets.insert(
            "token".into(),
            SecretSource {
                file: Some(dir.path().join("secret")),
                env: None,
            },
        );
        let mut config = Config {
            progress_interval: Duration::from_millis(200),
            breaker_cooldown: Duration::from_secs(2),
            ..Config::default()
        };
        config.agents.insert("ops".into(), agent);
        tweak(&mut config);
        let brain = BrainKey::install(dir.path(), "ops").unwrap();
        let mut rig = Self {
            nats,
            sshd,
            dir,
            brain,
            bus,
            config,
            executor: None,
        };
        rig.start_executor().await;
        rig
    }

    async fn start_executor(&mut self) {
        let bus = self.nats.bus(&["ops"]).await.unwrap();
        let config = nisse_executor::Config {
            executor: self.config.clone(),
            policy: Arc::new(policy()),
        };
        self.executor = Some(
            InProcess::service(&bus, config, self.dir.path(), nisse_executor::run)
                .await
                .unwrap(),
        );
    }

    async fn stop_executor(&mut self) {
        if let Some(e) = self.executor.take() {
            e.stop(Duration::from_secs(10)).await.unwrap();
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    async fn bind(&self, hosts: &[&str]) {
        self.bus
            .publish(self.brain.binding(HostBinding {
                envelope: Some(Envelope {
                    agent: "ops".into(),
                    work_item_id: ITEM.into(),
                    message_id: format!("bind:{ITEM}:{}", hosts.join(",")),
                    ..Default::default()
                }),
                work_item_id: ITEM.into(),
                hosts: hosts.iter().map(|h| h.to_string()).collect(),
                reason: "test".into(),
                signature: None,
            }))
            .await
            .unwrap();
    }

    fn request(id: &str, host: &str, command: &str) -> ExecRequest {
        ExecRequest {
            envelope: Some(Envelope {
                agent: "ops".into(),
                work_item_id: ITEM.into(),
                message_id: format!("exec:{id}"),
                ..Default::default()
            }),
            request_id: id.into(),
            host: host.into(),
            command: command.into(),
            timeout_ms: 20_000,
            permission: Some(ExecPermission {
                verdict_request_id: id.into(),
                plan_revision: 1,
                step: 0,
                operator_confirmed: false,
            }),
            ..Default::default()
        }
    }

    /// Publishes `request` signed by the ops brain, as the brain (or a
    /// buggy one) would, after the verdict it names, as the classifier
    /// would have given it ([`verdict_for`]).
    async fn send(&self, request: ExecRequest) {
        self.classified(&request).await;
        self.bus.publish(self.brain.exec(request)).await.unwrap();
    }

    /// Publishes the verdict `request` names, agreeing with it: what the
    /// classifier would have said before the brain asked for it.
    async fn classified(&self, request: &ExecRequest) {
        if let Some(verdict) = verdict_for(request) {
            self.verdict(verdict).await;
        }
    }

    /// Publishes `verdict` where the classifier publishes it.
    async fn verdict(&self, verdict: proto::ClassifyVerdict) {
        self.bus.publish(verdict).await.unwrap();
    }

    /// Publishes `request` signed by the ops brain and no verdict: the
    /// verdict it names is whatever the stream holds.
    async fn send_alone(&self, request: ExecRequest) {
        self.bus.publish(self.brain.exec(request)).await.unwrap();
    }

    /// Publishes `request` as it is: unsigned, or signed by someone else.
    async fn send_unsigned(&self, request: ExecRequest) {
        self.bus.publish(request).await.unwrap();
    }

    /// Every message in the stream, decoded.
    async fn stream(&self) -> Vec<AnyMessage> {
        let mut reader = self.bus.read_range(&ops(), 1, None).await.unwrap();
        let mut out = Vec::new();
        while let Some(m) = reader.next().await {
            if let Ok(msg) = m.unwrap().decode() {
                out.push(msg);
            }
        }
        out
    }

    async fn results(&self, id: &str) -> Vec<ExecResult> {
        self.stream()
            .await
            .into_iter()
            .filter_map(|m| match m {
                AnyMessage::ExecResult(r) if r.request_id == id => Some(r),
                _ => None,
            })
            .collect()
    }

    /// Waits for the result of request `id`.
    async fn result(&self, id: &str) -> ExecResult {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(r) = self.results(id).await.pop() {
                return r;
            }
            assert!(Instant::now() < deadline, "no result for {id}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn run(&self, id: &str, host: &str, command: &str) -> ExecResult {
        self.send(Self::request(id, host, command)).await;
        self.result(id).await
    }
}

/// The action `request` asks for, as the brain's permit held it: a
/// command line (with the secrets it names) or a file operation, on its
/// host.
fn action_of(request: &ExecRequest) -> nisse_policy::Action {
    match &request.file {
        Some(f) => nisse_policy::FileOp::from_wire(f)
            .unwrap()
            .to_action(&request.host)
            .unwrap(),
        None => {
            let mut arguments = serde_json::json!({ "command": request.command });
            if !request.secret_names.is_empty() {
                arguments["secrets"] = serde_json::json!(request.secret_names);
            }
            nisse_policy::Action::new("shell", &request.host, &arguments).unwrap()
        }
    }
}

/// A verdict agreeing with `request`, under the id it names: "safe", for
/// its very action, of the class the test policy gives it, judged under
/// the plan step and the confirmation the request claims. What a
/// classifier that permitted it said; the executor's other walls (the
/// binding, the switches read now, the secrets granted) must still hold
/// on their own. `None` for a request that names no verdict (or whose
/// file operation does not parse).
fn verdict_for(request: &ExecRequest) -> Option<proto::ClassifyVerdict> {
    let permission = request.permission.as_ref()?;
    if permission.verdict_request_id.is_empty()
        || request
            .file
            .as_ref()
            .is_some_and(|f| nisse_policy::FileOp::from_wire(f).is_err())
    {
        return None;
    }
    let action = action_of(request);
    let class = policy().assess(&action, None).class;
    Some(proto::ClassifyVerdict {
        envelope: Some(Envelope {
            agent: "ops".into(),
            work_item_id: request
                .envelope
                .as_ref()
                .map(|e| e.work_item_id.clone())
                .unwrap_or_default(),
            message_id: format!("verdict:{}", permission.verdict_request_id),
            ..Default::default()
        }),
        request_id: permission.verdict_request_id.clone(),
        verdict: proto::Verdict::Safe as i32,
        action_class: proto::ActionClass::from(class) as i32,
        action: Some(action.to_wire(None)),
        scope: Some(proto::JudgedScope {
            plan_revision: permission.plan_revision,
            plan_step: (permission.plan_revision > 0).then_some(permission.step),
            operator_confirmed: permission.operator_confirmed,
            contained: false,
        }),
        ..Default::default()
    })
}

/// The verdict the real classifier gives (`nisse_classifier::decide`, no
/// switch set) on `request`'s action, under the id `id`, in `scope`.
fn decided(
    request: &ExecRequest,
    id: &str,
    scope: Option<proto::AgreedScope>,
) -> proto::ClassifyVerdict {
    nisse_classifier::decide(
        &policy(),
        &proto::ClassifyRequest {
            envelope: request.envelope.clone(),
            request_id: id.into(),
            action: Some(action_of(request).to_wire(None)),
            scope,
            model: String::new(),
        },
        Ok(nisse_bus::SwitchBoard::default()),
    )
}

/// An agreed scope whose approved plan `revision` has `request`'s action
/// as its step `step` (0-based), the next one.
fn plan_scope(request: &ExecRequest, revision: u32, step: u32) -> proto::AgreedScope {
    let action = action_of(request).to_wire(None);
    proto::AgreedScope {
        work_item_id: ITEM.into(),
        approved_plan_revision: revision,
        approved_steps: (0..=step)
            .map(|_| proto::PlanStep {
                tool: action.tool.clone(),
                target: action.target.clone(),
                command: action.command.clone(),
                arguments_json: action.arguments_json.clone(),
                ..Default::default()
            })
            .collect(),
        next_step: step,
        ..Default::default()
    }
}

/// The built-in policy with the test's secret granted to the programs the
/// leak test prints it with (read-only ones, so the grant says so), as an
/// operator's policy file grants one.
fn policy() -> nisse_policy::Policy {
    nisse_policy::Policy::with_file(
        "test-policy.toml",
        "version = 1\n\n[[secret]]\nname = \"token\"\ncommands = [\"printf\", \"sleep\", \"base64\", \"echo\"]\nread-only = true\n",
    )
    .unwrap()
}

fn status(r: &ExecResult) -> (ExecStatus, ExecFailure) {
    (
        ExecStatus::try_from(r.status).unwrap(),
        ExecFailure::try_from(r.failure).unwrap(),
    )
}

fn stdout(r: &ExecResult) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

#[tokio::test]
async fn a_command_runs_on_a_bound_host_over_one_reused_connection() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    let r = rig
        .run("r1", "tool", "echo hello; echo oops >&2; exit 3")
        .await;
    assert_eq!(
        status(&r),
        (ExecStatus::Completed, ExecFailure::Unspecified),
        "{}",
        r.reason
    );
    assert_eq!(r.exit_code, 3);
    assert_eq!(stdout(&r), "hello\n");
    assert_eq!(String::from_utf8_lossy(&r.stderr), "oops\n");
    let env = r.envelope.as_ref().unwrap();
    assert_eq!(env.message_id, "result:r1");
    assert_eq!(env.work_item_id, ITEM);

    for i in 0..5 {
        let r = rig.run(&format!("again{i}"), "tool", "true").await;
        assert_eq!(r.exit_code, 0);
    }
    // Six commands, one TCP connection.
    assert_eq!(rig.sshd.connections(), 1, "{}", rig.sshd.log());
}

#[tokio::test]
async fn a_host_not_bound_to_the_item_is_refused_before_any_connection() {
    let rig = Rig::new(|_| {}).await;
    // Nothing bound at all.
    let r = rig.run("r1", "tool", "touch x").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::HostNotBound));
    assert!(r.reason.contains("not bound to work item"), "{}", r.reason);
    // Another host bound, not this one.
    rig.bind(&["nas01"]).await;
    let r = rig.run("r2", "tool", "true").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::HostNotBound));
    assert!(r.reason.contains("bound: nas01"), "{}", r.reason);
    // A request naming another work item's binding does not borrow it.
    rig.bind(&["nas01", "tool"]).await;
    let mut other = Rig::request("r3", "tool", "true");
    other.envelope.as_mut().unwrap().work_item_id = "0190c0de-0000-7000-8000-000000000002".into();
    rig.send(other).await;
    let r = rig.result("r3").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::HostNotBound));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rig.sshd.connections(), 0, "{}", rig.sshd.log());
    // Once bound, the same host works.
    let r = rig.run("r4", "tool", "true").await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
}

#[tokio::test]
async fn unknown_and_changed_host_keys_are_refused_with_the_offered_key() {
    let mut rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    let r = rig.run("before", "tool", "true").await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
    rig.stop_executor().await;

    // The host is reinstalled: a new key on the same address.
    rig.sshd.rotate_host_key().await.unwrap();
    rig.start_executor().await;
    let r = rig.run("after", "tool", "touch changed").await;
    assert_eq!(
        status(&r),
        (ExecStatus::Failed, ExecFailure::HostKeyChanged)
    );
    assert!(r.reason.contains("CHANGED"), "{}", r.reason);
    assert!(
        r.offered_host_key.starts_with("SHA256:"),
        "{}",
        r.offered_host_key
    );
    assert!(!rig.sshd.dir().join("changed").exists());
    // Still refused on the next request: nothing was learnt.
    let r = rig.run("after2", "tool", "true").await;
    assert_eq!(status(&r).1, ExecFailure::HostKeyChanged);

    // A host with no pinned key at all.
    std::fs::write(rig.path("known_hosts"), "").unwrap();
    let r = rig.run("unknown", "tool", "true").await;
    assert_eq!(
        status(&r),
        (ExecStatus::Failed, ExecFailure::HostKeyUnknown)
    );
    assert!(r.reason.contains("ssh-keyscan"), "{}", r.reason);
    assert_eq!(
        std::fs::read_to_string(rig.path("known_hosts")).unwrap(),
        ""
    );
}

#[tokio::test]
async fn trust_on_first_use_pins_the_key_when_the_operator_enabled_it() {
    let rig = Rig::new(|c| {
        let a = c.agents.get_mut("ops").unwrap();
        a.hosts.get_mut("tool").unwrap().trust_on_first_use = true;
    })
    .await;
    std::fs::write(rig.path("known_hosts"), "").unwrap();
    rig.bind(&["tool"]).await;
    let r = rig.run("r1", "tool", "true").await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
    let pinned = std::fs::read_to_string(rig.path("known_hosts")).unwrap();
    let key = rig.sshd.host_public_key();
    let key_b64 = key.split_whitespace().nth(1).unwrap();
    assert!(pinned.contains(key_b64), "{pinned}");
}

#[tokio::test]
async fn the_kill_switch_is_read_again_by_the_executor_itself() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    rig.bus
        .update_switches("operator:test", |b| b.autonomy_off = true)
        .await
        .unwrap();
    let marker = rig.sshd.dir().join("marker");
    let r = rig
        .run("change", "tool", &format!("touch {}", marker.display()))
        .await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::KillSwitch));
    assert!(r.reason.contains("autonomy is off"), "{}", r.reason);
    assert!(!marker.exists());
    // Reading still works with autonomy off.
    let r = rig.run("read", "tool", "uptime").await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
    // The operator's go-ahead for this very action passes autonomy off...
    let mut confirmed = Rig::request("confirmed", "tool", &format!("touch {}", marker.display()));
    confirmed.permission.as_mut().unwrap().operator_confirmed = true;
    rig.send(confirmed).await;
    assert_eq!(
        status(&rig.result("confirmed").await).0,
        ExecStatus::Completed
    );
    assert!(marker.exists());
    // ...but never a `never` target.
    rig.bus
        .update_switches("operator:test", |b| {
            b.autonomy_off = false;
            b.never.insert(
                "tool".into(),
                NeverEntry {
                    reason: "under maintenance".into(),
                    set_by: "operator:test".into(),
                },
            );
        })
        .await
        .unwrap();
    let mut never = Rig::request("never", "tool", "rm -f /tmp/x");
    never.permission.as_mut().unwrap().operator_confirmed = true;
    rig.send(never).await;
    let r = rig.result("never").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::KillSwitch));
    assert!(r.reason.contains("under maintenance"), "{}", r.reason);
}

#[tokio::test]
async fn a_secret_never_leaves_the_executor_plain_split_or_in_base64() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    // Printed whole, in two writes with a pause between (two SSH data
    // packets), base64-encoded, and on stderr.
    let command = r#"printf '%s\n' "$NISSE_TEST_SECRET"; printf '%s' "${NISSE_TEST_SECRET%????????????}"; sleep 0.3; printf '%s\n' "${NISSE_TEST_SECRET#????????????????}"; printf 'pre:%s' "$NISSE_TEST_SECRET" | base64; printf '%s' "$NISSE_TEST_SECRET" >&2; sleep 0.5"#;
    let mut leak = Rig::request("leak", "tool", command);
    leak.secret_names = vec!["token".into()];
    rig.send(leak).await;
    let r = rig.result("leak").await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
    let out = stdout(&r);
    assert!(out.contains("[REDACTED]"), "{out}");
    assert!(String::from_utf8_lossy(&r.stderr).contains("[REDACTED]"));

    let b64 = base64::engine::general_purpose::STANDARD;
    let encodings = [
        SECRET.to_string(),
        b64.encode(SECRET),
        b64.encode(format!("pre:{SECRET}")),
    ];
    // Nowhere in the stream: results, progress, anything.
    let mut reader = rig.bus.read_range(&ops(), 1, None).await.unwrap();
    let mut seen = 0;
    while let Some(m) = reader.next().await {
        let m = m.unwrap();
        let bytes = m.payload.to_vec();
        let text = String::from_utf8_lossy(&bytes);
        for e in &encodings {
            assert!(!text.contains(e.as_str()), "{e} leaked in {}", m.subject);
        }
        assert!(
            !text.contains(&SECRET[..16]),
            "a part of the secret leaked in {}",
            m.subject
        );
        seen += 1;
    }
    assert!(seen >= 3);
    // The split halves and the base64 core are gone too, not only the
    // whole value.
    assert!(!out.contains(&SECRET[..12]), "{out}");
}

#[tokio::test]
async fn a_hundred_duplicates_run_the_command_once() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    let counter = rig.sshd.dir().join("counter");
    let command = format!("echo ran >> {}; sleep 0.5", counter.display());
    for i in 0..100 {
        let mut req = Rig::request("dup", "tool", &command);
        // Distinct message ids, so JetStream's own dedup does not hide
        // them: every one reaches the executor.
        req.envelope.as_mut().unwrap().message_id = format!("exec:dup:{i}");
        rig.send(req).await;
    }
    let r = rig.result("dup").await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
    // Wait until the consumer has nothing left, then count.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = rig
            .bus
            .jetstream()
            .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                "executor",
                ops().stream(),
            )
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .clone();
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "duplicates still pending: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ran = std::fs::read_to_string(&counter).unwrap();
    assert_eq!(ran.lines().count(), 1, "{ran}");
    // One result on the stream (the same id each time: JetStream kept one).
    assert_eq!(rig.results("dup").await.len(), 1);
    let dead: Vec<_> = rig
        .stream()
        .await
        .into_iter()
        .filter(|m| matches!(m, AnyMessage::DeadLetter(_)))
        .collect();
    assert!(dead.is_empty(), "{dead:?}");
}

/// Scaling out is starting another executor: two share the agent's
/// durable consumer and the work of 200 commands, and each command runs
/// exactly once, whichever took it.
#[tokio::test]
async fn two_executors_share_two_hundred_commands_and_each_runs_once() {
    let rig = Rig::new(|c| c.max_in_flight = 8).await;
    let second = InProcess::service(
        &rig.nats.bus(&["ops"]).await.unwrap(),
        nisse_executor::Config {
            executor: rig.config.clone(),
            policy: Arc::new(policy()),
        },
        rig.dir.path(),
        nisse_executor::run,
    )
    .await
    .unwrap();
    rig.bind(&["tool"]).await;
    let ran = rig.sshd.dir().join("ran");
    const COMMANDS: usize = 200;
    for i in 0..COMMANDS {
        let command = format!("echo c{i} >> {}; sleep 0.05", ran.display());
        rig.send(Rig::request(&format!("c{i}"), "tool", &command))
            .await;
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let done = rig
            .stream()
            .await
            .into_iter()
            .filter(|m| matches!(m, AnyMessage::ExecResult(_)))
            .count();
        if done == COMMANDS {
            break;
        }
        assert!(Instant::now() < deadline, "{done} of {COMMANDS} answered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lines = std::fs::read_to_string(&ran).unwrap();
    let mut seen: std::collections::BTreeMap<&str, usize> = Default::default();
    for l in lines.lines() {
        *seen.entry(l).or_default() += 1;
    }
    assert_eq!(seen.len(), COMMANDS, "every command ran");
    assert!(
        seen.values().all(|n| *n == 1),
        "a command ran twice: {seen:?}"
    );
    // Both took a share: the records name the process that ran each.
    let ledger = nisse_bus::once::Ledger {
        bucket: nisse_bus::topology::EXEC_BUCKET,
        token: None,
    };
    let mut processes = std::collections::BTreeSet::new();
    for i in 0..COMMANDS {
        let (record, _) = ledger
            .read(&rig.bus, &ops(), &format!("c{i}"))
            .await
            .unwrap()
            .expect("a record per command");
        assert_eq!(record.phase, nisse_bus::once::Phase::Finished);
        processes.insert(record.process);
    }
    assert_eq!(
        processes.len(),
        2,
        "both executors ran commands: {processes:?}"
    );
    second.stop(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn an_unreachable_host_opens_its_circuit_which_recovers_after_the_cooldown() {
    let mut rig = Rig::new(|c| c.breaker_failures = 2).await;
    rig.bind(&["tool"]).await;
    rig.sshd.stop().await.unwrap();
    for id in ["down1", "down2"] {
        let r = rig.run(id, "tool", "true").await;
        assert_eq!(
            status(&r),
            (ExecStatus::Failed, ExecFailure::Connect),
            "{}",
            r.reason
        );
    }
    // Open: fails at once, without trying.
    let began = Instant::now();
    let r = rig.run("fast", "tool", "true").await;
    assert_eq!(
        status(&r),
        (ExecStatus::Failed, ExecFailure::CircuitOpen),
        "{}",
        r.reason
    );
    assert!(
        r.reason.contains("circuit for tool is open"),
        "{}",
        r.reason
    );
    assert!(began.elapsed() < Duration::from_secs(2));
    // Visible to the operator.
    let circuits = nisse_executor::circuits(&rig.bus, &ops()).await.unwrap();
    assert_eq!(circuits.len(), 1, "{circuits:?}");
    assert_eq!(circuits[0].state, "open");
    assert_eq!(circuits[0].host, "tool");

    rig.sshd.restart().await.unwrap();
    tokio::time::sleep(rig.config.breaker_cooldown + Duration::from_millis(200)).await;
    let r = rig.run("back", "tool", "echo back").await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
    let deadline = Instant::now() + Duration::from_secs(5);
    while nisse_executor::circuits(&rig.bus, &ops()).await.unwrap()[0].state != "closed" {
        assert!(Instant::now() < deadline, "the circuit never showed closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn long_output_is_capped_and_streamed_as_progress() {
    let rig = Rig::new(|c| c.output_cap = bytesize::ByteSize::b(1024)).await;
    rig.bind(&["tool"]).await;
    let r = rig
        .run(
            "long",
            "tool",
            "echo first; seq 1 100000; sleep 0.6; echo last",
        )
        .await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
    let out = stdout(&r);
    assert!(out.starts_with("first\n1\n"), "{out}");
    assert!(out.ends_with("100000\nlast\n"), "{out}");
    assert!(r.stdout_dropped > 500_000, "{}", r.stdout_dropped);
    assert!(out.contains("bytes dropped by the output cap"));
    let progress: Vec<proto::ExecProgress> = rig
        .stream()
        .await
        .into_iter()
        .filter_map(|m| match m {
            AnyMessage::ExecProgress(p) if p.request_id == "long" => Some(p),
            _ => None,
        })
        .collect();
    assert!(!progress.is_empty());
    assert_eq!(progress[0].seq, 1);
    assert!(progress.iter().all(|p| p.stdout.len() <= 4096));
}

#[tokio::test]
async fn a_command_that_outruns_its_timeout_has_an_unknown_outcome() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    let mut req = Rig::request("slow", "tool", "sleep 5");
    req.timeout_ms = 500;
    rig.send(req).await;
    let r = rig.result("slow").await;
    assert_eq!(
        status(&r),
        (ExecStatus::OutcomeUnknown, ExecFailure::Timeout)
    );
    assert!(r.reason.contains("may still be running"), "{}", r.reason);
}

#[tokio::test]
async fn a_secret_the_host_is_not_granted_and_a_request_without_permission_are_refused() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    let mut req = Rig::request("greedy", "tool", "env");
    req.secret_names = vec!["root-password".into()];
    rig.send(req).await;
    let r = rig.result("greedy").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::BadRequest));
    assert!(
        r.reason.contains("`root-password` is not granted"),
        "{}",
        r.reason
    );

    // A request nothing permitted is refused too.
    let mut bare = Rig::request("bare", "tool", "touch /tmp/nisse-unpermitted");
    bare.permission = None;
    rig.send(bare).await;
    let r = rig.result("bare").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::BadRequest));
    assert!(r.reason.contains("no permission"), "{}", r.reason);
    assert_eq!(rig.sshd.connections(), 0);
}

fn file_request(id: &str, op: nisse_policy::FileOp) -> ExecRequest {
    ExecRequest {
        command: String::new(),
        file: Some(op.to_wire()),
        ..Rig::request(id, "tool", "unused")
    }
}

#[tokio::test]
async fn file_tools_read_write_atomically_and_list_over_ssh() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    let dir = rig.sshd.dir().join("files");
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("motd");
    std::fs::write(&target, "old\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
    let path = target.display().to_string();

    // A write replaces the file whole and keeps its mode.
    rig.send(file_request(
        "write",
        nisse_policy::FileOp::Write {
            path: path.clone(),
            content: "it's new; $(not run)\n".into(),
            mode: None,
        },
    ))
    .await;
    let r = rig.result("write").await;
    assert_eq!(
        status(&r),
        (ExecStatus::Completed, ExecFailure::Unspecified),
        "{}",
        r.reason
    );
    assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "it's new; $(not run)\n"
    );
    let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    // No temporary file is left beside it.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["motd"]);

    // A new file with a mode asked for.
    let fresh = dir.join("fresh.conf").display().to_string();
    rig.send(file_request(
        "new",
        nisse_policy::FileOp::Write {
            path: fresh.clone(),
            content: "x = 1\n".into(),
            mode: Some("0600".into()),
        },
    ))
    .await;
    assert_eq!(rig.result("new").await.exit_code, 0);
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    rig.send(file_request(
        "read",
        nisse_policy::FileOp::Read { path: path.clone() },
    ))
    .await;
    assert_eq!(stdout(&rig.result("read").await), "it's new; $(not run)\n");
    rig.send(file_request(
        "list",
        nisse_policy::FileOp::List {
            path: dir.display().to_string(),
        },
    ))
    .await;
    let listing = stdout(&rig.result("list").await);
    assert!(
        listing.contains("motd") && listing.contains("fresh.conf"),
        "{listing}"
    );

    // A write into a directory that does not exist fails and leaves nothing.
    rig.send(file_request(
        "nodir",
        nisse_policy::FileOp::Write {
            path: dir.join("missing/x").display().to_string(),
            content: "x".into(),
            mode: None,
        },
    ))
    .await;
    let r = rig.result("nodir").await;
    assert_eq!(status(&r).0, ExecStatus::Completed);
    assert_ne!(r.exit_code, 0);

    // The same walls: a file tool on an unbound host is refused, and a
    // malformed operation too.
    let mut other = file_request("unbound", nisse_policy::FileOp::Read { path: path.clone() });
    other.host = "nas01".into();
    rig.send(other).await;
    assert_eq!(
        status(&rig.result("unbound").await).1,
        ExecFailure::HostNotBound
    );
    let mut bad = file_request(
        "relative",
        nisse_policy::FileOp::Read { path: path.clone() },
    );
    bad.file.as_mut().unwrap().path = "etc/passwd".into();
    rig.send(bad).await;
    let r = rig.result("relative").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::BadRequest));
    assert!(r.reason.contains("absolute"), "{}", r.reason);
}

#[tokio::test]
async fn only_what_the_agents_brain_signed_runs() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    let marker = rig.sshd.dir().join("forged");
    let touch = format!("touch {}", marker.display());

    // Unsigned: refused, naming why.
    rig.send_unsigned(Rig::request("unsigned", "tool", &touch))
        .await;
    let r = rig.result("unsigned").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::Signature));
    assert!(r.reason.contains("not signed"), "{}", r.reason);

    // Signed by the ops brain, then altered in one field each time.
    type Alteration = Box<dyn Fn(&mut ExecRequest)>;
    let alterations: Vec<(&str, Alteration)> = vec![
        ("command", Box::new(|r| r.command.push_str(" && id"))),
        ("host", Box::new(|r| r.host = "tool2".into())),
        (
            "confirmed",
            Box::new(|r| r.permission.as_mut().unwrap().operator_confirmed = true),
        ),
        (
            "secrets",
            Box::new(|r| r.secret_names = vec!["token".into()]),
        ),
        (
            "item",
            Box::new(|r| {
                r.envelope.as_mut().unwrap().work_item_id =
                    "0190c0de-0000-7000-8000-000000000009".into()
            }),
        ),
    ];
    for (what, alter) in alterations {
        let id = format!("altered-{what}");
        let mut signed = rig.brain.exec(Rig::request(&id, "tool", &touch));
        alter(&mut signed);
        rig.send_unsigned(signed).await;
        let r = rig.result(&id).await;
        assert_eq!(
            status(&r),
            (ExecStatus::Refused, ExecFailure::Signature),
            "{what}: {}",
            r.reason
        );
        assert!(
            r.reason.contains("altered after the brain signed it"),
            "{what}: {}",
            r.reason
        );
    }

    // A real request replayed under a new id: the id is signed too.
    let original = rig.brain.exec(Rig::request("original", "tool", "true"));
    rig.classified(&original).await;
    rig.send_unsigned(original.clone()).await;
    assert_eq!(
        status(&rig.result("original").await).0,
        ExecStatus::Completed
    );
    let mut replayed = original;
    replayed.request_id = "replayed".into();
    replayed.envelope.as_mut().unwrap().message_id = "exec:replayed".into();
    rig.send_unsigned(replayed).await;
    let r = rig.result("replayed").await;
    assert_eq!(
        status(&r),
        (ExecStatus::Refused, ExecFailure::Signature),
        "{}",
        r.reason
    );

    // Signed by another agent's brain (its key known here): named.
    let dev = BrainKey::install(rig.dir.path(), "dev").unwrap();
    rig.send_unsigned(dev.exec(Rig::request("by-dev", "tool", &touch)))
        .await;
    let r = rig.result("by-dev").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::Signature));
    assert!(
        r.reason
            .contains("signed by the dev brain's key, not by the ops brain's key"),
        "{}",
        r.reason
    );
    // By a key nobody here holds.
    let stranger = nisse_bus::signing::SigningKey::ephemeral();
    let mut forged = Rig::request("by-stranger", "tool", &touch);
    stranger.sign(&mut forged);
    rig.send_unsigned(forged).await;
    let r = rig.result("by-stranger").await;
    assert!(
        r.reason.contains("a key no brain here holds"),
        "{}",
        r.reason
    );

    // Too old: signed long ago, the signature itself intact.
    let mut old = Rig::request("stale", "tool", &touch);
    old.envelope.as_mut().unwrap().created_at = Some(prost_types::Timestamp {
        seconds: 1_600_000_000,
        nanos: 0,
    });
    rig.send(old).await;
    let r = rig.result("stale").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::Signature));
    assert!(r.reason.contains("longer than it accepts"), "{}", r.reason);

    // Only the first real request connected; nothing forged ran.
    assert!(!marker.exists(), "a forged request ran");
    assert_eq!(rig.sshd.connections(), 1, "{}", rig.sshd.log());
}

#[tokio::test]
async fn a_host_binding_the_brain_did_not_sign_binds_nothing() {
    let rig = Rig::new(|_| {}).await;
    // A forged binding: unsigned, on the item's binding subject.
    rig.bus
        .publish(HostBinding {
            envelope: Some(Envelope {
                agent: "ops".into(),
                work_item_id: ITEM.into(),
                message_id: "bind:forged".into(),
                ..Default::default()
            }),
            work_item_id: ITEM.into(),
            hosts: vec!["tool".into()],
            reason: "forged".into(),
            signature: None,
        })
        .await
        .unwrap();
    let r = rig.run("on-forged", "tool", "true").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::Signature));
    assert!(
        r.reason.contains("the host binding of work item") && r.reason.contains("not signed"),
        "{}",
        r.reason
    );
    assert_eq!(rig.sshd.connections(), 0, "{}", rig.sshd.log());
}

#[tokio::test]
async fn a_command_gets_only_the_secrets_it_asked_for_and_the_policy_grants() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    let show = r#"echo "x${NISSE_TEST_SECRET}x""#;
    // The host is granted the secret, but this command did not ask: none.
    let r = rig.run("unasked", "tool", show).await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
    assert_eq!(stdout(&r), "xx\n");
    // Asked for and granted by the policy to `echo`: handed over (and
    // redacted from what comes back).
    let mut asked = Rig::request("asked", "tool", show);
    asked.secret_names = vec!["token".into()];
    rig.send(asked).await;
    let r = rig.result("asked").await;
    assert_eq!(stdout(&r), "x[REDACTED]x\n", "{}", r.reason);
    // Asked for by a program the policy does not grant it to, or by a line
    // that reads the environment out: refused, nothing run.
    for (id, command) in [
        ("not-listed", r#"cat /dev/null; echo "$NISSE_TEST_SECRET""#),
        ("printenv", "printenv | rev"),
    ] {
        let mut req = Rig::request(id, "tool", command);
        req.secret_names = vec!["token".into()];
        rig.send(req).await;
        let r = rig.result(id).await;
        assert_eq!(
            status(&r),
            (ExecStatus::Refused, ExecFailure::BadRequest),
            "{id}: {}",
            r.reason
        );
        assert!(r.reason.contains("token"), "{id}: {}", r.reason);
    }
    assert_eq!(rig.sshd.connections(), 1, "{}", rig.sshd.log());
}

/// A request names the classifier's verdict it passed; the executor reads
/// that verdict itself, from the classifier's own subject, and refuses a
/// request it does not cover, naming what differs, however well the brain
/// signed it: a brain bug cannot run what the classifier never judged.
#[tokio::test]
async fn a_request_whose_verdict_judged_another_action_is_refused_naming_what_differs() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool", "nas01"]).await;
    let marker = rig.sshd.dir().join("marker");
    let touch = format!("touch {}", marker.display());
    let naming = |mut r: ExecRequest, verdict: &str| {
        r.permission.as_mut().unwrap().verdict_request_id = verdict.into();
        r
    };

    // The classifier judged `uptime` on tool, as step 1 of rev-1.
    rig.classified(&Rig::request("uptime", "tool", "uptime"))
        .await;
    // It judged `touch` as step 1 of rev-1, without the operator.
    let judged_touch = Rig::request("touch", "tool", &touch);
    rig.classified(&judged_touch).await;
    // It judged `touch` with no plan at all: it needs discussion.
    rig.verdict(decided(&judged_touch, "touch-unplanned", None))
        .await;
    // It judged `uptime` for another work item.
    let mut elsewhere = Rig::request("elsewhere", "tool", "uptime");
    elsewhere.envelope.as_mut().unwrap().work_item_id =
        "0190c0de-0000-7000-8000-000000000002".into();
    rig.classified(&elsewhere).await;

    let mut with_secret = Rig::request("other-secrets", "tool", "uptime");
    with_secret.secret_names = vec!["token".into()];
    let mut other_step = Rig::request("other-step", "tool", &touch);
    other_step.permission.as_mut().unwrap().step = 1;
    let mut no_plan = Rig::request("no-plan", "tool", &touch);
    no_plan.permission.as_mut().unwrap().plan_revision = 0;
    let mut confirmed = Rig::request("claims-confirmed", "tool", &touch);
    confirmed.permission.as_mut().unwrap().operator_confirmed = true;
    let cases: Vec<(ExecRequest, &str, String)> = vec![
        (
            Rig::request("other-command", "tool", &touch),
            "uptime",
            format!(
                "is not the action the classifier's verdict `uptime` judged (command: the verdict judged `uptime`, the request runs `{touch}`)"
            ),
        ),
        (
            Rig::request("other-host", "nas01", "uptime"),
            "uptime",
            "(host: the verdict judged it on tool, the request is for nas01)".into(),
        ),
        (
            with_secret,
            "uptime",
            "(secrets: the verdict judged it with [], the request asks for [token])".into(),
        ),
        (
            file_request(
                "other-tool",
                nisse_policy::FileOp::Write {
                    path: marker.display().to_string(),
                    content: "x".into(),
                    mode: None,
                },
            ),
            "uptime",
            "(tool: the verdict judged `shell`, the request is `file.write`)".into(),
        ),
        (
            Rig::request("elsewhere-item", "tool", "uptime"),
            "elsewhere",
            format!(
                "the classifier's verdict `elsewhere` is about work item 0190c0de-0000-7000-8000-000000000002, and the request is for work item {ITEM}"
            ),
        ),
        (
            Rig::request("unplanned", "tool", &touch),
            "touch-unplanned",
            "the classifier's verdict `touch-unplanned` says it needs discussion".into(),
        ),
        (
            other_step,
            "touch",
            "the request claims step 2 of the approved plan rev-1, and the classifier's verdict `touch` judged it as step 1 of rev-1".into(),
        ),
        (
            no_plan,
            "touch",
            "which is carried out only as a step of an approved plan".into(),
        ),
        (
            confirmed,
            "touch",
            "the request says the operator confirmed it, and the classifier's verdict `touch` judged it without that confirmation".into(),
        ),
    ];
    for (request, verdict, why) in cases {
        let id = request.request_id.clone();
        rig.send_alone(naming(request, verdict)).await;
        let r = rig.result(&id).await;
        assert_eq!(
            status(&r),
            (ExecStatus::Refused, ExecFailure::Verdict),
            "{id}: {}",
            r.reason
        );
        assert!(r.reason.contains(&why), "{id}: {}", r.reason);
        assert!(
            r.reason
                .ends_with("nothing was run and no connection was made"),
            "{id}: {}",
            r.reason
        );
    }
    assert!(!marker.exists(), "a request its verdict did not cover ran");
    assert_eq!(rig.sshd.connections(), 0, "{}", rig.sshd.log());

    // The verdicts themselves are good for their own requests: the real
    // classifier's, on the step the request is, runs it.
    let step = Rig::request("the-step", "tool", &touch);
    rig.verdict(decided(&step, "the-step", Some(plan_scope(&step, 1, 0))))
        .await;
    rig.send_alone(step).await;
    let r = rig.result("the-step").await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
    assert!(marker.exists());
}

/// A request naming no verdict, or one the classifier never published, is
/// refused; one whose verdict arrives a moment after it (a stream leader
/// that moved) is looked for again, a bounded number of times, and runs.
#[tokio::test]
async fn a_request_naming_no_verdict_or_one_never_given_is_refused() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    let marker = rig.sshd.dir().join("marker");
    let touch = format!("touch {}", marker.display());

    let mut unnamed = Rig::request("unnamed", "tool", &touch);
    unnamed.permission.as_mut().unwrap().verdict_request_id = String::new();
    rig.send_alone(unnamed).await;
    let r = rig.result("unnamed").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::Verdict));
    assert!(
        r.reason.contains("names no verdict of the classifier"),
        "{}",
        r.reason
    );

    let began = Instant::now();
    rig.send_alone(Rig::request("never-given", "tool", &touch))
        .await;
    let r = rig.result("never-given").await;
    assert_eq!(status(&r), (ExecStatus::Refused, ExecFailure::Verdict));
    assert!(
        r.reason.contains(
            "names the classifier's verdict `never-given`, and the classifier published none under that id (on nisse.ops.in.classify.verdict.never-given)"
        ),
        "{}",
        r.reason
    );
    // Looked for again before giving up, and not for long.
    let waited = began.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    assert!(!marker.exists());
    assert_eq!(rig.sshd.connections(), 0, "{}", rig.sshd.log());

    // The verdict a moment late: found on a later look.
    let late = Rig::request("late", "tool", &touch);
    let verdict = verdict_for(&late).unwrap();
    rig.send_alone(late).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    rig.verdict(verdict).await;
    let r = rig.result("late").await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
    assert!(marker.exists());
}
