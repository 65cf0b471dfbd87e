//! The walls on the bus, tried the way a process on the same machine would
//! try them: with no credentials, with another service's, with another
//! agent's brain's, and with an operator's own credentials but someone
//! else's name. The server runs with the authorization `nisse up`
//! generates; the brain, the classifier and the executor run as their own
//! identities in front of a real `sshd`. Every forgery must be refused by
//! the server itself, nothing may reach the host, and the brain's state
//! must not move.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message as _;

use nisse_bus::auth::{Credentials, Identity};
use nisse_bus::proto::{self, Envelope, OperatorReply, operator_command::Command};
use nisse_bus::{AgentName, Bus, Role};
use nisse_tests::sshd::TestSshd;
use nisse_tests::{InProcess, TestNats, local_plan, ops};

/// The operators of the installation besides the user running the tests.
const ALICE: &str = "alice";
const BOB: &str = "bob";

struct Rig {
    nats: TestNats,
    sshd: TestSshd,
    data: std::path::PathBuf,
    admin: Bus,
    services: Vec<InProcess>,
}

impl Rig {
    async fn start() -> Self {
        let plan = local_plan(&["ops", "dev"], &[ALICE, BOB]).unwrap();
        let nats = TestNats::with_auth(&plan).await.unwrap();
        let data = nats.data_dir().unwrap();
        let admin = nats.bus(&["ops", "dev"]).await.unwrap();
        admin.ensure_topology().await.unwrap();
        let sshd = TestSshd::start().await.unwrap();
        let known_hosts = data.join("known_hosts");
        sshd.write_known_hosts(&known_hosts, "127.0.0.1").unwrap();

        let as_ = |role: Role| {
            let nats = &nats;
            async move {
                nats.bus_as(&Identity::service(role, &ops()), &["ops"])
                    .await
                    .unwrap()
            }
        };
        // The brain, as the brain: its own key, its own identity.
        let (key_file, public_file) = nisse_bus::signing::key_files(&data, "ops");
        let (key, _) =
            nisse_bus::signing::SigningKey::load_or_create(&key_file, &public_file).unwrap();
        let ops_config = nisse_ops::Config {
            operators: vec![format!("cli:{ALICE}"), format!("cli:{BOB}")],
            ..Default::default()
        };
        let brain_bus = as_(Role::Brain).await;
        let store = nisse_core::Store::path_in(&data, "ops");
        let brain = InProcess::spawn(move |token| async move {
            nisse_core::reactor::run(
                brain_bus,
                ops(),
                store,
                nisse_ops::OpsBrain::new("ops", ops_config),
                key,
                token,
                tokio::sync::watch::Sender::new(0),
            )
            .await
            .map_err(anyhow::Error::from)
        });
        let policy = Arc::new(nisse_policy::Policy::builtin().unwrap());
        let classifier = InProcess::service(
            &as_(Role::Classifier).await,
            nisse_classifier::Config {
                policy: policy.clone(),
                models: Default::default(),
            },
            &data,
            nisse_classifier::run,
        )
        .await
        .unwrap();
        let mut executor_config = nisse_executor::config::Config::default();
        let mut agent = nisse_executor::config::AgentConfig {
            key_file: Some(sshd.client_key()),
            known_hosts: Some(known_hosts),
            ..Default::default()
        };
        agent.hosts.insert(
            "tool".into(),
            nisse_executor::config::HostConfig {
                address: "127.0.0.1".into(),
                port: sshd.port(),
                user: sshd.user().to_string(),
                ..Default::default()
            },
        );
        executor_config.agents.insert("ops".into(), agent);
        let executor = InProcess::service(
            &as_(Role::Executor).await,
            nisse_executor::Config {
                executor: executor_config,
                policy,
            },
            &data,
            nisse_executor::run,
        )
        .await
        .unwrap();
        let rig = Self {
            nats,
            sshd,
            data,
            admin,
            services: vec![brain, classifier, executor],
        };
        // A real alert, from intake-alerts' own identity, opens item #1
        // bound to `tool`.
        let intake = rig
            .nats
            .bus_as(&Identity::service(Role::IntakeAlerts, &ops()), &["ops"])
            .await
            .unwrap();
        intake
            .publish(super::alerts::alert_received("ServiceDown", "tool:9100"))
            .await
            .unwrap();
        rig.wait("item #1 is bound to tool", |s| {
            s.events.iter().any(|e| e.event.kind() == "hosts_bound")
        })
        .await;
        rig
    }

    fn snapshot(&self) -> Option<nisse_core::Snapshot> {
        let path = nisse_core::Store::path_in(&self.data, "ops");
        nisse_core::Store::open_read_only(&path, "ops")
            .ok()?
            .snapshot()
            .ok()
    }

    async fn wait(
        &self,
        what: &str,
        check: impl Fn(&nisse_core::Snapshot) -> bool,
    ) -> nisse_core::Snapshot {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.snapshot()
                && check(&s)
            {
                return s;
            }
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn item_id(&self) -> String {
        self.snapshot().unwrap().items[0].id.clone()
    }

    /// Messages in the ops stream.
    async fn stream_len(&self) -> u64 {
        self.admin.stream_bounds(&ops()).await.unwrap().messages
    }

    /// Waits until the stream stops growing (the services answered what
    /// they were sent), returning its length.
    async fn settled(&self) -> u64 {
        let mut last = self.stream_len().await;
        loop {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let now = self.stream_len().await;
            if now == last {
                return now;
            }
            last = now;
        }
    }

    /// The brain's state once it stops changing: taken before the brain
    /// has applied the stream's last messages, a snapshot would differ
    /// from a later one with nothing forged.
    async fn quiet_snapshot(&self) -> nisse_core::Snapshot {
        let mut last = self.snapshot();
        loop {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let now = self.snapshot();
            if let Some(s) = &now
                && now == last
            {
                return s.clone();
            }
            last = now;
        }
    }

    async fn stop(self) {
        for s in self.services {
            s.stop(Duration::from_secs(10)).await.unwrap();
        }
    }
}

/// A raw NATS client as `identity` (its seed from the installation's
/// credentials, its inbox prefix), recording every error the server sends
/// it: what a process holding that seed could do, with no Nisse code in
/// the way.
async fn raw_client(
    nats: &TestNats,
    credentials: &Credentials,
    identity: &Identity,
) -> (async_nats::Client, Arc<Mutex<Vec<String>>>) {
    let seed = std::fs::read_to_string(credentials.seed_file(identity)).unwrap();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let client = async_nats::ConnectOptions::new()
        .nkey(seed.trim().to_string())
        .custom_inbox_prefix(identity.inbox_prefix())
        .request_timeout(Some(Duration::from_secs(2)))
        .event_callback(move |event| {
            let seen = seen.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    seen.lock().unwrap().push(e.to_string());
                }
            }
        })
        .connect(nats.url())
        .await
        .unwrap();
    (client, errors)
}

/// One forgery: a subject, headers and payload to publish (or, for the
/// JetStream API, to request).
struct Forgery {
    what: &'static str,
    subject: String,
    headers: Vec<(&'static str, String)>,
    payload: Vec<u8>,
}

fn forgeries(item: &str, marker: &std::path::Path, operator: &str) -> Vec<Forgery> {
    let env = |id: &str| Envelope {
        agent: "ops".into(),
        work_item_id: item.into(),
        actor: Some(proto::Actor {
            kind: proto::ActorKind::Operator as i32,
            id: operator.into(),
        }),
        message_id: id.into(),
        ..Default::default()
    };
    let approve = proto::OperatorCommand {
        envelope: Some(env("cmd:forged")),
        channel: "cli".into(),
        work_item: "#1".into(),
        command: Some(Command::Abandon(proto::Abandon {
            note: "forged".into(),
        })),
    };
    let binding = proto::HostBinding {
        envelope: Some(env("bind:forged")),
        work_item_id: item.into(),
        hosts: vec!["tool".into(), "router".into()],
        reason: "forged".into(),
        signature: None,
    };
    let request = proto::ExecRequest {
        envelope: Some(env("exec:forged")),
        request_id: "forged".into(),
        host: "tool".into(),
        command: format!("touch {}", marker.display()),
        timeout_ms: 10_000,
        permission: Some(proto::ExecPermission {
            verdict_request_id: "forged".into(),
            plan_revision: 1,
            step: 0,
            operator_confirmed: true,
        }),
        ..Default::default()
    };
    let verdict = proto::ClassifyVerdict {
        envelope: Some(env("verdict:forged")),
        request_id: "forged".into(),
        verdict: proto::Verdict::Safe as i32,
        ..Default::default()
    };
    // A bare `approve` binds the revision whose request a channel reports
    // delivered: only the Matrix service may say so.
    let posted = proto::TellPosted {
        envelope: Some(env("posted:forged")),
        channel: "matrix".into(),
        tell_message_id: format!("out:{item}:99"),
        plan_revision: 1,
        posted_id: "$forged".into(),
    };
    let record = serde_json::json!({
        "request_id": "r-future", "phase": "finished", "instance": "forger",
        "heartbeat_ms": 0, "result": null
    });
    vec![
        Forgery {
            what: "an operator command",
            subject: format!("nisse.ops.in.operator.{operator}"),
            headers: vec![("Nats-Msg-Id", "cmd:forged".into())],
            payload: approve.encode_to_vec(),
        },
        Forgery {
            what: "a host binding",
            subject: format!("nisse.ops.out.exec.bind.{item}"),
            headers: vec![("Nats-Msg-Id", "bind:forged".into())],
            payload: binding.encode_to_vec(),
        },
        Forgery {
            what: "an execution request",
            subject: "nisse.ops.out.exec.req".into(),
            headers: vec![("Nats-Msg-Id", "exec:forged".into())],
            payload: request.encode_to_vec(),
        },
        Forgery {
            what: "a classifier verdict",
            // On the subject of the request it answers, where the
            // executor and the mcp service read it.
            subject: "nisse.ops.in.classify.verdict.forged".into(),
            headers: vec![("Nats-Msg-Id", "verdict:forged".into())],
            payload: verdict.encode_to_vec(),
        },
        Forgery {
            what: "a delivery report",
            subject: "nisse.ops.in.tell.posted".into(),
            headers: vec![("Nats-Msg-Id", "posted:forged".into())],
            payload: posted.encode_to_vec(),
        },
        Forgery {
            what: "deleting the switch board",
            subject: "$KV.nisse_switches.board".into(),
            headers: vec![("KV-Operation", "DEL".into())],
            payload: Vec::new(),
        },
        Forgery {
            what: "a pre-seeded execution record",
            subject: format!("$KV.nisse_exec.ops.{}", nisse_bus::key_hash("r-future")),
            headers: Vec::new(),
            payload: record.to_string().into_bytes(),
        },
        Forgery {
            what: "purging the stream",
            subject: "$JS.API.STREAM.PURGE.AGENT_OPS".into(),
            headers: Vec::new(),
            payload: b"{}".to_vec(),
        },
        Forgery {
            what: "deleting the stream",
            subject: "$JS.API.STREAM.DELETE.AGENT_OPS".into(),
            headers: Vec::new(),
            payload: Vec::new(),
        },
        Forgery {
            what: "deleting the executor's consumer",
            subject: "$JS.API.CONSUMER.DELETE.AGENT_OPS.executor".into(),
            headers: Vec::new(),
            payload: Vec::new(),
        },
    ]
}

/// Tries every forgery as `identity`; each must be refused by the server
/// with a permissions violation naming its subject. `skip` names the ones
/// this identity may legitimately do.
async fn try_all(rig: &Rig, identity: &Identity, skip: &[&str]) {
    let credentials = rig.nats.credentials().unwrap();
    let (client, errors) = raw_client(&rig.nats, credentials, identity).await;
    let marker = rig.sshd.dir().join("forged");
    let user = nisse_tests::local_plan(&["ops"], &[])
        .unwrap()
        .operators
        .keys()
        .next()
        .unwrap()
        .to_string();
    // Every attempt asks for an answer, as JetStream publishes and API
    // requests do; none may ever come.
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(format!("{inbox}.>")).await.unwrap();
    for (n, f) in forgeries(&rig.item_id(), &marker, &user)
        .into_iter()
        .enumerate()
    {
        if skip.contains(&f.what) {
            continue;
        }
        let mut headers = async_nats::HeaderMap::new();
        for (k, v) in &f.headers {
            headers.insert(*k, v.as_str());
        }
        client
            .publish_with_reply_and_headers(
                f.subject.clone(),
                format!("{inbox}.{n}"),
                headers,
                Bytes::from(f.payload.clone()),
            )
            .await
            .unwrap();
        client.flush().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let refused = errors.lock().unwrap().iter().any(|e| {
                e.to_lowercase().contains("permissions violation") && e.contains(&f.subject)
            });
            if refused {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{identity}: the server did not refuse {} on {}: {:?}",
                f.what,
                f.subject,
                errors.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let answered = tokio::time::timeout(
        Duration::from_millis(500),
        futures::StreamExt::next(&mut answers),
    )
    .await;
    assert!(
        answered.is_err(),
        "{identity}: a forgery was answered: {answered:?}"
    );
}

#[tokio::test]
async fn forgeries_without_credentials_or_with_another_identitys_are_refused_by_the_server() {
    let rig = Rig::start().await;
    let messages = rig.settled().await;
    let before = rig.quiet_snapshot().await;
    let board = rig.admin.switches().await.unwrap();

    // No credentials: not even a connection.
    let anonymous = async_nats::connect(rig.nats.url()).await;
    assert!(
        anonymous
            .as_ref()
            .is_err_and(|e| e.to_string().contains("authorization violation")),
        "a client without credentials connected: {anonymous:?}"
    );

    // The webhook's identity, the one facing the network.
    try_all(&rig, &Identity::service(Role::IntakeAlerts, &ops()), &[]).await;
    // The executor: it keeps execution records, nothing else.
    try_all(
        &rig,
        &Identity::service(Role::Executor, &ops()),
        &["a pre-seeded execution record"],
    )
    .await;
    // The Matrix service, which reads strangers' words.
    try_all(
        &rig,
        &Identity::service(Role::IntakeMatrix, &ops()),
        &["a delivery report"],
    )
    .await;
    // Another agent's brain: nothing of the ops stream is its to write.
    let dev: AgentName = "dev".parse().unwrap();
    try_all(&rig, &Identity::service(Role::Brain, &dev), &[]).await;
    // An operator cannot speak for another (the commands are on the
    // local user's subject here), nor touch the stream's administration.
    try_all(
        &rig,
        &Identity::Operator(ALICE.parse().unwrap()),
        &["deleting the switch board"],
    )
    .await;

    // Nothing moved: the stream, the brain's state, the switches, the
    // execution records; no connection reached the host.
    assert_eq!(rig.settled().await, messages, "the stream changed");
    assert_eq!(rig.snapshot().unwrap(), before, "the brain's state changed");
    let after = rig.admin.switches().await.unwrap();
    assert_eq!((after.revision, after.board), (board.revision, board.board));
    let forged_key = format!("ops.{}", nisse_bus::key_hash("r-future"));
    assert_eq!(
        rig.admin
            .kv_get(nisse_bus::topology::EXEC_BUCKET, &forged_key)
            .await
            .unwrap(),
        None,
        "a forged execution record was stored"
    );
    assert!(!rig.sshd.dir().join("forged").exists());
    assert_eq!(rig.sshd.connections(), 0, "{}", rig.sshd.log());
    rig.stop().await;
}

/// Publishes `command` with `operator`'s credentials on their own subject
/// and returns the brain's answer.
async fn command_as(
    rig: &Rig,
    operator: &str,
    claims: &str,
    id: &str,
    command: Command,
) -> OperatorReply {
    let bus = rig
        .nats
        .bus_as(&Identity::Operator(operator.parse().unwrap()), &["ops"])
        .await
        .unwrap();
    let reply_subject = format!("nisse.ops.out.operator.{id}");
    let mut answers = bus.client().subscribe(reply_subject).await.unwrap();
    let msg = proto::OperatorCommand {
        envelope: Some(Envelope {
            agent: "ops".into(),
            actor: Some(proto::Actor {
                kind: proto::ActorKind::Operator as i32,
                id: claims.into(),
            }),
            message_id: id.into(),
            ..Default::default()
        }),
        channel: "cli".into(),
        work_item: "#1".into(),
        command: Some(command),
    };
    // The bus puts a command on the subject of whom its envelope names:
    // publish where the server lets this operator publish, whatever the
    // envelope claims, as a hand-made client would.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", id);
    bus.jetstream()
        .publish_with_headers(
            format!("nisse.ops.in.operator.{operator}"),
            headers,
            msg.encode_to_vec().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        futures::StreamExt::next(&mut answers),
    )
    .await
    .expect("the brain answered")
    .unwrap();
    OperatorReply::decode(answer.payload).unwrap()
}

#[tokio::test]
async fn an_operators_credentials_speak_only_in_their_own_name() {
    let rig = Rig::start().await;

    // Alice's credentials, an envelope claiming Bob: recorded, refused.
    let reply = command_as(
        &rig,
        ALICE,
        BOB,
        "cli-claims-bob",
        Command::Abandon(proto::Abandon {
            note: "not me".into(),
        }),
    )
    .await;
    assert!(!reply.applied, "{reply:?}");
    assert!(
        reply
            .error
            .contains("credentials of alice but claims to be from operator:bob"),
        "{}",
        reply.error
    );
    let s = rig
        .wait("the forgery is on the item's log", |s| {
            s.events.iter().any(|e| {
                matches!(&e.event, nisse_core::Event::Fact { text, .. }
                    if text.contains("claims to be from operator:bob"))
            })
        })
        .await;
    assert!(s.items[0].state.is_open(), "the item was not abandoned");

    // Under her own name the same command is hers and applies.
    let reply = command_as(
        &rig,
        ALICE,
        ALICE,
        "cli-alice",
        Command::Stop(proto::Stop {}),
    )
    .await;
    assert!(reply.applied, "{reply:?}");
    rig.stop().await;
}
