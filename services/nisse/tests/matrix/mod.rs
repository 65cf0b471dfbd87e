//! The operator and the agent in the agent's Matrix room, on a real
//! Synapse, each Nisse service in its own process: an alert's item gets a
//! thread, the operator's reply in it lands on the item's log, a question
//! gets the item's status and changes nothing, and a ✅ on the approval
//! request approves exactly the revision it showed; a stranger's ✅ and
//! words change nothing. A file sent in a thread is recorded on the item
//! by reference, with its size and hash.

use std::time::Duration;

use nisse_core::Event;
use nisse_core::plans::PlanStatus;
use nisse_tests::TestNats;
use nisse_tests::synapse::{TestClient, TestSynapse, sha256_hex};

use super::alerts::{Install, publish_alert, stop};
use super::gates::cli;
use super::local_user;

/// Messages the agent posted in the room, oldest first.
async fn from_agent(operator: &TestClient, room: &str, agent: &str) -> Vec<serde_json::Value> {
    operator
        .messages(room)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e["type"] == "m.room.message" && e["sender"] == agent)
        .collect()
}

/// NATS, Synapse with an operator, a stranger and the agent in a room,
/// and an install whose services run each in its own process.
struct Rig {
    nats: TestNats,
    synapse: TestSynapse,
    install: Install,
    operator: TestClient,
    /// Someone in the room who is not on the allowlist.
    stranger: TestClient,
    agent_id: String,
    room: String,
    /// intake-alerts, brain, classifier.
    children: Vec<tokio::process::Child>,
    matrix: Option<tokio::process::Child>,
}

impl Rig {
    async fn start(extra: &str) -> Self {
        Self::start_in(extra, false, false).await
    }

    /// Like `start`, in an end-to-end encrypted room when `encrypted`, and
    /// with Synapse's low message rate limit when `rate_limited`.
    async fn start_in(extra: &str, encrypted: bool, rate_limited: bool) -> Self {
        let nats = TestNats::secured(&["ops"]).await.unwrap();
        let cfg = nats.bus_config();
        Self::start_on(nats, cfg, extra, encrypted, rate_limited).await
    }

    async fn start_on(
        nats: TestNats,
        bus: nisse_bus::BusConfig,
        extra: &str,
        encrypted: bool,
        rate_limited: bool,
    ) -> Self {
        let synapse = if rate_limited {
            TestSynapse::start_with_rate_limits().await.unwrap()
        } else {
            TestSynapse::start().await.unwrap()
        };
        let op_user = synapse.register("op", "op-password", false).await.unwrap();
        let stranger_user = synapse
            .register("stranger", "stranger-pw", false)
            .await
            .unwrap();
        let agent_user = synapse
            .register("nisse-ops", "agent-password", false)
            .await
            .unwrap();
        let operator = synapse.client(&op_user);
        let stranger = synapse.client(&stranger_user);
        let room = operator
            .create_room(
                "ops",
                &[&agent_user.user_id, &stranger_user.user_id],
                encrypted,
            )
            .await
            .unwrap();
        stranger.join(&room).await.unwrap();
        nats.bus_with(bus, &["ops"])
            .await
            .unwrap()
            .ensure_topology()
            .await
            .unwrap();
        let install = Install::new(&nats);
        std::fs::write(install.path().join("agent-password"), "agent-password\n").unwrap();
        let cfg = install.path().join("nisse.toml");
        let mut text = std::fs::read_to_string(&cfg).unwrap();
        text.push_str(&format!(
            "[ops]\noperators = [\"matrix:{op}\", \"cli:{me}\"]\n\
             [matrix]\nhomeserver = \"{hs}\"\nbackoff-max = \"1s\"\n\
             [matrix.agents.ops]\nuser-id = \"{agent}\"\npassword-file = {pw:?}\nroom = \"{room}\"\n{extra}",
            op = op_user.user_id,
            me = local_user(),
            hs = synapse.base_url(),
            agent = agent_user.user_id,
            pw = install.path().join("agent-password").display().to_string(),
        ));
        std::fs::write(&cfg, text).unwrap();
        let mut children = Vec::new();
        let mut intake = install.serve(&["intake-alerts"]);
        install.wait_intake(&mut intake).await;
        children.push(intake);
        children.push(install.serve(&["brain"]));
        children.push(install.serve(&["classifier"]));
        // Said before the agent's first start: room history, not for it.
        operator.send_text(&room, "status?").await.unwrap();
        let matrix = Some(install.serve(&["intake-matrix"]));
        Self {
            nats,
            synapse,
            install,
            operator,
            stranger,
            agent_id: agent_user.user_id,
            room,
            children,
            matrix,
        }
    }

    /// Waits for a message from the agent whose event and body satisfy
    /// `matches`.
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
                Duration::from_secs(60),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", self.install.log(&["intake-matrix"])))
    }

    /// Waits for the thread root of item `#n`.
    async fn root(&self, n: u64) -> String {
        let needle = format!("#{n}**");
        let e = self
            .agent_posts(|e, b| e["content"]["m.relates_to"].is_null() && b.contains(&needle))
            .await;
        e["event_id"].as_str().unwrap().to_string()
    }

    /// The words recorded as said, in order.
    fn said(&self) -> Vec<String> {
        self.install
            .snapshot()
            .map(|s| {
                s.events
                    .iter()
                    .filter_map(|e| match &e.event {
                        Event::Said { text, .. } => Some(text.clone()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn wait_said(&self, n: usize) {
        self.install
            .wait_until(
                &format!("{n} messages recorded"),
                Duration::from_secs(60),
                |s| {
                    s.events
                        .iter()
                        .filter(|e| matches!(e.event, Event::Said { .. }))
                        .count()
                        >= n
                },
            )
            .await;
    }

    async fn stop_all(mut self) {
        if let Some(mut m) = self.matrix.take() {
            stop(&mut m).await;
        }
        for child in &mut self.children {
            stop(child).await;
        }
    }
}

#[tokio::test]
async fn a_file_sent_in_an_items_thread_is_recorded_by_reference_with_its_size_and_hash() {
    let rig = Rig::start("").await;
    let (install, operator, room) = (&rig.install, &rig.operator, &rig.room);
    publish_alert(&rig.nats, "DiskFull", "nas01").await;
    let root_id = rig.root(1).await;

    let bytes = b"zpool status: ONLINE\nerrors: No known data errors\n".repeat(40);
    let url = operator
        .upload("text/plain", "zpool.txt", bytes.clone())
        .await
        .unwrap();
    assert!(url.starts_with("mxc://"), "{url}");
    operator
        .send_event(
            room,
            "m.room.message",
            &serde_json::json!({
                "msgtype": "m.file",
                "body": "zpool.txt",
                "url": url,
                "info": { "mimetype": "text/plain", "size": bytes.len() },
                "m.relates_to": {
                    "rel_type": "m.thread",
                    "event_id": root_id,
                    "is_falling_back": true,
                    "m.in_reply_to": { "event_id": root_id },
                },
            }),
        )
        .await
        .unwrap();
    let s = install
        .wait_until(
            "the attachment is on the item",
            Duration::from_secs(60),
            |s| {
                s.events.iter().any(
                    |e| matches!(&e.event, Event::Fact { data, .. } if !data["attachment"].is_null()),
                )
            },
        )
        .await;
    let (text, attachment) = s
        .events
        .iter()
        .find_map(|e| match &e.event {
            Event::Fact { text, data } if !data["attachment"].is_null() => {
                Some((text.clone(), data["attachment"].clone()))
            }
            _ => None,
        })
        .unwrap();
    let sha = sha256_hex(&bytes);
    assert_eq!(attachment["url"], url.as_str());
    assert_eq!(attachment["name"], "zpool.txt");
    assert_eq!(attachment["mimetype"], "text/plain");
    assert_eq!(attachment["kind"], "m.file");
    assert_eq!(attachment["size"], bytes.len() as u64);
    assert_eq!(attachment["sha256"], sha.as_str(), "{attachment}");
    assert_eq!(attachment["error"], "");
    assert_eq!(attachment["from"], operator.user_id());
    assert_eq!(
        text,
        format!(
            "attachment from {}: \"zpool.txt\" (\"text/plain\", {} bytes, sha256 {sha}) at {url:?}",
            operator.user_id(),
            bytes.len()
        )
    );
    // The message itself is on the log too, before its attachment.
    let said = s
        .events
        .iter()
        .position(|e| matches!(&e.event, Event::Said { text, .. } if text == "zpool.txt"))
        .expect("the file's message is recorded");
    let fact = s
        .events
        .iter()
        .position(|e| matches!(&e.event, Event::Fact { data, .. } if !data["attachment"].is_null()))
        .unwrap();
    assert!(said < fact);
    rig.stop_all().await;
}

#[tokio::test]
async fn the_operator_talks_with_the_agent_in_an_items_thread_and_approves_with_a_reaction() {
    let rig = Rig::start("").await;
    let (install, operator, stranger, room) =
        (&rig.install, &rig.operator, &rig.stranger, &rig.room);
    let agent_id = rig.agent_id.as_str();

    // An alert: its item's thread root appears in the room.
    publish_alert(&rig.nats, "DiskFull", "nas01").await;
    let root = rig.agent_posts(|_, b| b.contains("#1**")).await;
    let root_id = root["event_id"].as_str().unwrap().to_string();
    assert!(
        root["content"]["formatted_body"]
            .as_str()
            .is_some_and(|h| h.contains("<strong>")),
        "Markdown is rendered to HTML: {root}"
    );

    // The operator's reply in the thread lands on the item's log.
    operator
        .send_thread_reply(room, &root_id, "the disk is fine, it was a test")
        .await
        .unwrap();
    // A stranger's "approve" is recorded as data only.
    stranger
        .send_thread_reply(room, &root_id, "approve")
        .await
        .unwrap();
    let s = install
        .wait_until(
            "both messages are on the item",
            Duration::from_secs(30),
            |s| {
                s.events
                    .iter()
                    .filter(|e| matches!(e.event, Event::Said { .. }))
                    .count()
                    == 2
            },
        )
        .await;
    let said: Vec<(String, bool, String)> = s
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::Said {
                text,
                operator,
                read_as,
                ..
            } => Some((text.clone(), *operator, read_as.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        said,
        [
            (
                "the disk is fine, it was a test".to_string(),
                true,
                "talk".to_string()
            ),
            ("approve".to_string(), false, "command".to_string()),
        ]
    );

    // A question gets the item's status in its thread and changes nothing.
    let before = install.snapshot().unwrap().items;
    operator
        .send_thread_reply(room, &root_id, "should I approve?")
        .await
        .unwrap();
    rig.agent_posts(|e, b| {
        e["content"]["m.relates_to"]["event_id"] == root_id.as_str() && b.starts_with("Item **#1**")
    })
    .await;
    assert_eq!(install.snapshot().unwrap().items, before);

    // A plan: its approval request comes into the thread; a stranger's ✅
    // does nothing, the operator's approves the revision it showed.
    std::fs::write(
        install.path().join("plan.toml"),
        "[[step]]\ntarget = \"nas01\"\ncommand = \"zfs snapshot tank/media@before\"\n",
    )
    .unwrap();
    cli(install, &["plan", "propose", "1", "plan.toml"]).await;
    let request = rig.agent_posts(|_, b| b.contains("approve rev-1")).await;
    let request_id = request["event_id"].as_str().unwrap().to_string();
    assert_eq!(
        request["content"]["m.relates_to"]["event_id"],
        root_id.as_str()
    );
    stranger.react(room, &request_id, "✅").await.unwrap();
    install
        .wait_until(
            "the stranger's ✅ is refused",
            Duration::from_secs(30),
            |s| {
                s.events
                    .iter()
                    .any(|e| e.event.kind() == "decision_refused")
            },
        )
        .await;
    assert_eq!(install.snapshot().unwrap().plans[0].status, PlanStatus::Up);
    operator.react(room, &request_id, "✅").await.unwrap();
    let s = install
        .wait_until("rev-1 is approved", Duration::from_secs(30), |s| {
            s.plans.iter().any(|p| p.approved_by.is_some())
        })
        .await;
    let by = format!("operator:{}", operator.user_id());
    assert_eq!(s.plans[0].approved_by.as_deref(), Some(by.as_str()));
    assert_eq!(s.plans[0].approved_via.as_deref(), Some("matrix"));
    // The approval is echoed in the thread.
    rig.agent_posts(|_, b| b.contains("Approved rev-1") || b.contains("approved rev-1"))
        .await;
    // Nothing the agent posted went twice, and the question asked before
    // its first start (history) was never answered.
    let posted = from_agent(operator, room, agent_id).await;
    assert!(
        !posted
            .iter()
            .any(|e| e["content"]["body"] == "No work item is open."),
        "{posted:#?}"
    );
    assert_posted_once(&posted);

    rig.stop_all().await;
}

#[tokio::test]
async fn restarts_crashes_and_an_outage_lose_nothing_and_post_nothing_twice() {
    let mut rig = Rig::start("").await;
    publish_alert(&rig.nats, "Alert1", "nas01").await;
    let root = rig.root(1).await;

    // A restart of the Matrix service between two operator messages.
    rig.operator
        .send_thread_reply(&rig.room, &root, "first note")
        .await
        .unwrap();
    rig.wait_said(1).await;
    stop(rig.matrix.as_mut().unwrap()).await;
    rig.operator
        .send_thread_reply(&rig.room, &root, "second note")
        .await
        .unwrap();
    rig.matrix = Some(rig.install.serve(&["intake-matrix"]));
    rig.wait_said(2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rig.said(), ["first note", "second note"]);

    // Killed while posting: five new items' thread roots are being sent
    // when the service dies; after a restart each is there exactly once.
    for i in 2..=6 {
        publish_alert(&rig.nats, &format!("Alert{i}"), "nas01").await;
    }
    rig.root(2).await;
    let m = rig.matrix.as_mut().unwrap();
    super::signal(m.id().unwrap() as i32, nix::sys::signal::Signal::SIGKILL);
    m.wait().await.unwrap();
    rig.matrix = Some(rig.install.serve(&["intake-matrix"]));
    rig.root(6).await;

    // The homeserver away for 30 s: what the agent says meanwhile waits,
    // and arrives in order when it is back; no item changes state.
    rig.synapse.stop().await.unwrap();
    let before = rig.install.snapshot().unwrap().items;
    for i in 7..=9 {
        publish_alert(&rig.nats, &format!("Alert{i}"), "nas01").await;
    }
    rig.install
        .wait_until("items #7 to #9 exist", Duration::from_secs(30), |s| {
            s.items.len() == 9
        })
        .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let during = rig.install.snapshot().unwrap();
    for item in &before {
        let now = during.items.iter().find(|i| i.id == item.id).unwrap();
        assert_eq!(
            now.state, item.state,
            "item #{} changed state in the outage",
            item.number
        );
    }
    rig.synapse.restart().await.unwrap();
    rig.root(9).await;

    let roots: Vec<String> = from_agent(&rig.operator, &rig.room, &rig.agent_id)
        .await
        .into_iter()
        .filter(|e| e["content"]["m.relates_to"].is_null())
        .filter_map(|e| e["content"]["body"].as_str().map(str::to_string))
        .collect();
    let numbers: Vec<u64> = roots
        .iter()
        .filter_map(|b| {
            let at = b.find("Work item **#")? + "Work item **#".len();
            b[at..].split("**").next()?.parse().ok()
        })
        .collect();
    assert_eq!(numbers, (1..=9).collect::<Vec<_>>(), "{roots:#?}");
    rig.stop_all().await;
}

#[tokio::test]
async fn commands_work_in_any_case_and_an_approval_for_an_older_revision_is_refused() {
    let rig = Rig::start("").await;
    publish_alert(&rig.nats, "DiskFull", "nas01").await;
    let root = rig.root(1).await;
    let plan = rig.install.path().join("plan.toml");
    for (i, command) in ["zfs snapshot tank/a@x", "zfs snapshot tank/b@x"]
        .iter()
        .enumerate()
    {
        std::fs::write(
            &plan,
            format!("[[step]]\ntarget = \"nas01\"\ncommand = \"{command}\"\n"),
        )
        .unwrap();
        cli(&rig.install, &["plan", "propose", "1", "plan.toml"]).await;
        let rev = i + 1;
        rig.install
            .wait_until(&format!("rev-{rev} is up"), Duration::from_secs(30), |s| {
                s.plans
                    .iter()
                    .any(|p| p.revision as usize == rev && p.status == PlanStatus::Up)
            })
            .await;
    }
    // intake-matrix told the brain each request it posted, by the event
    // the room has: what lets a bare `approve` bind rev-2 below.
    let s = rig
        .install
        .wait_until("both posts reported", Duration::from_secs(30), |s| {
            s.events
                .iter()
                .filter(|e| e.event.kind() == "approval_delivered")
                .count()
                == 2
        })
        .await;
    let delivered: Vec<(u32, String)> = s
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::ApprovalDelivered {
                revision,
                via,
                posted_id,
                ..
            } if via == "matrix" => Some((*revision, posted_id.clone())),
            _ => None,
        })
        .collect();
    let requests: Vec<(u32, String)> = from_agent(&rig.operator, &rig.room, &rig.agent_id)
        .await
        .into_iter()
        .filter_map(|e| {
            let body = e["content"]["body"].as_str()?;
            let rev =
                (1..=2).find(|r| body.contains(&format!("Approval needed: item #1 rev-{r}")))?;
            Some((rev, e["event_id"].as_str()?.to_string()))
        })
        .collect();
    assert_eq!(delivered, requests);
    // rev-2 is up: an approval naming rev-1 is refused, and the reply
    // names rev-2.
    rig.operator
        .send_thread_reply(&rig.room, &root, "approve rev-1")
        .await
        .unwrap();
    rig.agent_posts(|_, b| b.contains("not applied") && b.contains("rev-2"))
        .await;
    assert!(
        rig.install
            .snapshot()
            .unwrap()
            .plans
            .iter()
            .all(|p| p.approved_by.is_none())
    );
    // Odd case, trailing punctuation and a leading mention: still `approve`.
    rig.operator
        .send_thread_reply(&rig.room, &root, &format!("{}:  APPROVE.", rig.agent_id))
        .await
        .unwrap();
    let s = rig
        .install
        .wait_until("rev-2 is approved", Duration::from_secs(30), |s| {
            s.plans.iter().any(|p| p.approved_by.is_some())
        })
        .await;
    let approved: Vec<u32> = s
        .plans
        .iter()
        .filter(|p| p.approved_by.is_some())
        .map(|p| p.revision)
        .collect();
    assert_eq!(approved, [2]);
    assert_eq!(s.plans[1].approved_via.as_deref(), Some("matrix"));
    rig.stop_all().await;
}

#[tokio::test]
async fn an_encrypted_room_round_trips_with_a_real_client() {
    use matrix_sdk::config::SyncSettings;
    use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;

    let rig = Rig::start_in("", true, false).await;
    publish_alert(&rig.nats, "DiskFull", "nas01").await;
    // The thread root, as ciphertext.
    rig.operator
        .wait_for_message(
            &rig.room,
            |e| e["sender"] == rig.agent_id.as_str() && e["type"] == "m.room.encrypted",
            Duration::from_secs(60),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", rig.install.log(&["intake-matrix"])));

    // The operator's own client, encrypting: a second device of @op.
    let dir = tempfile::tempdir().unwrap();
    let op = matrix_sdk::Client::builder()
        .homeserver_url(rig.synapse.base_url())
        .sqlite_store(dir.path(), None)
        .build()
        .await
        .unwrap();
    op.matrix_auth()
        .login_username(rig.operator.user_id(), "op-password")
        .send()
        .await
        .unwrap();
    let quick = || SyncSettings::default().timeout(Duration::from_millis(500));
    op.sync_once(quick()).await.unwrap();
    let room_id = matrix_sdk::ruma::OwnedRoomId::try_from(rig.room.as_str()).unwrap();
    let room = op.get_room(&room_id).unwrap();
    assert!(room.latest_encryption_state().await.unwrap().is_encrypted());
    room.send(RoomMessageEventContent::text_plain("ops: status?"))
        .await
        .unwrap();

    // The agent decrypted it: the question is on item #1's log...
    rig.wait_said(1).await;
    assert_eq!(rig.said(), ["ops: status?"]);
    // ...and its encrypted answer decrypts on the operator's device.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let answer = loop {
        op.sync_once(quick()).await.unwrap();
        let messages = room
            .messages(matrix_sdk::room::MessagesOptions::backward())
            .await
            .unwrap();
        let found = messages.chunk.iter().find_map(|e| {
            let v: serde_json::Value = e.raw().deserialize_as().ok()?;
            let body = v["content"]["body"].as_str()?.to_string();
            (v["sender"] == rig.agent_id.as_str()
                && v["type"] == "m.room.message"
                && body.starts_with("Item **#1**"))
            .then_some(body)
        });
        if let Some(body) = found {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no decryptable answer"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(answer.contains("DiskFull"), "{answer}");
    // A file sent encrypted: the agent decrypts it to hash the plaintext,
    // and records it on the item being worked on.
    let secret = b"smartctl: /dev/sda PASSED\n".repeat(10);
    room.send_attachment(
        "smart.txt",
        // Inferred: the SDK's `mime::Mime`, without naming the crate.
        &"text/plain".parse().unwrap(),
        secret.clone(),
        matrix_sdk::attachment::AttachmentConfig::new(),
    )
    .await
    .unwrap();
    let s = rig
        .install
        .wait_until(
            "the encrypted attachment is on the item",
            Duration::from_secs(60),
            |s| {
                s.events.iter().any(
                    |e| matches!(&e.event, Event::Fact { data, .. } if !data["attachment"].is_null()),
                )
            },
        )
        .await;
    let attachment = s
        .events
        .iter()
        .find_map(|e| match &e.event {
            Event::Fact { data, .. } if !data["attachment"].is_null() => {
                Some(data["attachment"].clone())
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(attachment["name"], "smart.txt");
    assert_eq!(attachment["kind"], "m.file");
    assert_eq!(attachment["size"], secret.len() as u64, "{attachment}");
    assert_eq!(
        attachment["sha256"],
        sha256_hex(&secret).as_str(),
        "{attachment}"
    );
    assert!(
        attachment["url"]
            .as_str()
            .is_some_and(|u| u.starts_with("mxc://")),
        "{attachment}"
    );
    // On the server, both sides' messages are ciphertext.
    let on_server = rig.operator.messages(&rig.room).await.unwrap();
    // (The rig's own plain "status?" before the agent started is the one
    // cleartext message: sent over plain HTTP, which cannot encrypt.)
    assert!(
        !on_server.iter().any(|e| e["type"] == "m.room.message"
            && (e["sender"] == rig.agent_id.as_str() || e["content"]["body"] == "ops: status?")),
        "a message went unencrypted: {on_server:#?}"
    );
    assert!(
        on_server
            .iter()
            .filter(|e| e["type"] == "m.room.encrypted")
            .count()
            >= 3
    );
    rig.stop_all().await;
}

#[tokio::test]
async fn rate_limits_are_waited_out_and_messages_keep_their_order() {
    let rig = Rig::start_in("", false, true).await;
    // More thread roots than Synapse's burst allows (3, then 1 per 2 s).
    for i in 1..=7 {
        publish_alert(&rig.nats, &format!("Alert{i}"), "nas01").await;
    }
    rig.root(7).await;
    let numbers: Vec<u64> = from_agent(&rig.operator, &rig.room, &rig.agent_id)
        .await
        .into_iter()
        .filter(|e| e["content"]["m.relates_to"].is_null())
        .filter_map(|e| {
            let b = e["content"]["body"].as_str()?.to_string();
            let at = b.find("Work item **#")? + "Work item **#".len();
            b[at..].split("**").next()?.parse().ok()
        })
        .collect();
    assert_eq!(numbers, (1..=7).collect::<Vec<_>>());
    assert!(
        rig.install.log(&["intake-matrix"]).contains("rate-limited"),
        "the homeserver never rate-limited the agent: the test proves nothing"
    );
    rig.stop_all().await;
}

/// Something told the operator as the brain would publish it: in item
/// `item`'s thread when it names one, else in the room. A question, which
/// goes as `m.text`: a refusal notice's `m.notice` is the notice's own.
fn tell(id: &str, item: &str, markdown: &str) -> nisse_bus::proto::Tell {
    use nisse_bus::proto::{Envelope, Tell, TellKind};
    Tell {
        envelope: Some(Envelope {
            agent: "ops".into(),
            work_item_id: item.into(),
            message_id: id.into(),
            ..Default::default()
        }),
        markdown: markdown.into(),
        kind: TellKind::Question as i32,
        ..Default::default()
    }
}

/// Every dead-letter record in the ops stream, oldest first.
/// No message body among `posted` appears twice: nothing was posted twice.
fn assert_posted_once(posted: &[serde_json::Value]) {
    let mut bodies: Vec<&str> = posted
        .iter()
        .filter_map(|e| e["content"]["body"].as_str())
        .collect();
    let all = bodies.len();
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), all, "{posted:#?}");
}

async fn dead_letters(nats: &TestNats) -> Vec<nisse_bus::proto::DeadLetter> {
    super::gates::stream_kinds(nats)
        .await
        .into_iter()
        .filter_map(|m| match m {
            nisse_bus::AnyMessage::DeadLetter(d) => Some(d),
            _ => None,
        })
        .collect()
}

/// Waits until the ops stream holds `n` dead-letter records.
async fn wait_dead_letters(rig: &Rig, n: usize) -> Vec<nisse_bus::proto::DeadLetter> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let found = dead_letters(&rig.nats).await;
        if found.len() >= n {
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} dead letters, not {n}: {found:#?}\n{}",
            found.len(),
            rig.install.log(&["intake-matrix"])
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a dead letter of the Matrix service's consumer says: the sequence
/// of the message it set aside, and its cause, consumer and reason.
fn dead_letter_summary(
    d: &nisse_bus::proto::DeadLetter,
) -> (u64, nisse_bus::proto::DeadLetterCause, &str, &str) {
    (
        d.original_stream_sequence,
        d.cause(),
        &d.consumer,
        &d.original_subject,
    )
}

/// The agent's notices that a message could not be posted.
fn refusal_notices(posted: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    posted
        .iter()
        .filter(|e| {
            e["content"]["body"]
                .as_str()
                .is_some_and(|b| b.contains("could not be posted"))
        })
        .collect()
}

#[tokio::test]
async fn a_message_over_the_size_limit_is_dead_lettered_with_a_notice_and_the_next_one_goes_out() {
    use nisse_bus::proto::DeadLetterCause;

    let rig = Rig::start("").await;
    publish_alert(&rig.nats, "DiskFull", "nas01").await;
    let root = rig.root(1).await;
    let item = rig.install.snapshot().unwrap().items[0].id.clone();
    let bus = rig.nats.bus(&["ops"]).await.unwrap();
    // Over Synapse's 65 536-byte event limit: one in the item's thread,
    // one in the room, one that would open another item's thread; then a
    // small one in each thread.
    let big = "x".repeat(70_000);
    let mut opening = tell("test:too-large-root", "item-2", &big);
    opening.opens_conversation = true;
    let mut refused = Vec::new();
    for msg in [
        tell("test:too-large-in-thread", &item, &big),
        tell("test:too-large-in-room", "", &big),
        opening,
    ] {
        refused.push(bus.publish(msg).await.unwrap().sequence);
    }
    bus.publish(tell("test:after", &item, "after the refused ones"))
        .await
        .unwrap();
    bus.publish(tell("test:item-2", "item-2", "more on item 2"))
        .await
        .unwrap();
    let more = rig.agent_posts(|_, b| b == "more on item 2").await;

    // Each refused one is dead-lettered through the bus's own path, its
    // reason naming the Matrix error and the message.
    let dead = wait_dead_letters(&rig, 3).await;
    let summary: Vec<_> = dead.iter().map(dead_letter_summary).collect();
    let (consumer, subject) = ("matrix-tell", "nisse.ops.out.tell");
    let rejected = |seq| (seq, DeadLetterCause::Rejected, consumer, subject);
    assert_eq!(
        summary,
        refused.iter().copied().map(rejected).collect::<Vec<_>>()
    );
    let ids = [
        "test:too-large-in-thread",
        "test:too-large-in-room",
        "test:too-large-root",
    ];
    for (d, id) in dead.iter().zip(ids) {
        assert!(
            d.reason.contains("M_TOO_LARGE") && d.reason.contains(id),
            "{}",
            d.reason
        );
        // Tried again within the delivery, not through redeliveries.
        assert!(d.reason.contains("3 times"), "{}", d.reason);
    }

    // A notice took each one's place, in the item's thread, in the room and
    // as the other item's thread root, before the next messages; it says
    // why and how to read the message.
    let posted = from_agent(&rig.operator, &rig.room, &rig.agent_id).await;
    let notices = refusal_notices(&posted);
    assert_eq!(notices.len(), 3, "{posted:#?}");
    for (n, seq) in notices.iter().zip(&refused) {
        assert_eq!(n["content"]["msgtype"], "m.notice");
        let body = n["content"]["body"].as_str().unwrap();
        assert!(body.contains("`M_TOO_LARGE`"), "{body}");
        assert!(body.contains(&format!("--from-seq {seq} ")), "{body}");
    }
    let thread = |e: &serde_json::Value| e["content"]["m.relates_to"]["event_id"].clone();
    assert_eq!(thread(notices[0]), root.as_str());
    assert!(notices[1]["content"]["m.relates_to"].is_null());
    assert!(notices[2]["content"]["m.relates_to"].is_null());
    let after = rig.agent_posts(|_, b| b == "after the refused ones").await;
    assert_eq!(thread(&after), root.as_str());
    assert_eq!(thread(&more), notices[2]["event_id"]);
    let order: Vec<&str> = posted
        .iter()
        .filter_map(|e| e["event_id"].as_str())
        .collect();
    let at = |e: &serde_json::Value| order.iter().position(|id| e["event_id"] == *id);
    let positions: Vec<_> = [notices[0], notices[1], notices[2], &after, &more]
        .into_iter()
        .map(at)
        .collect();
    assert!(
        positions.is_sorted() && positions[0].is_some(),
        "{positions:?}"
    );
    assert!(
        !posted.iter().any(|e| e["content"]["body"]
            .as_str()
            .is_some_and(|b| b.len() > 60_000)),
        "a refused message was posted after all"
    );

    // The command the notice gives shows the refused message.
    let body = notices[1]["content"]["body"].as_str().unwrap();
    let command = body.split('`').nth(3).unwrap();
    assert_eq!(
        command,
        format!(
            "nisse replay --agent ops --from-seq {0} --to-seq {0}",
            refused[1]
        )
    );
    let mut args: Vec<&str> = command.split(' ').skip(1).collect();
    args.push("--json");
    let shown: serde_json::Value =
        serde_json::from_str(cli(&rig.install, &args).await.trim()).unwrap();
    assert_eq!(
        shown["message"]["envelope"]["message_id"],
        "test:too-large-in-room"
    );
    assert_eq!(
        shown["message"]["markdown"].as_str().map(str::len),
        Some(70_000)
    );

    // Nothing went twice.
    assert_posted_once(&posted);
    rig.stop_all().await;
}

/// While the agent may not post, each message is refused on its own: it is
/// dead-lettered, the notice is attempted (and refused, only logged), and
/// the next one is tried, so nothing waits behind a room the agent cannot
/// write to. Once the operator gives the right back, the next message
/// goes out and none of the refused ones turns up late, not even after a
/// restart.
#[tokio::test]
async fn while_the_agent_may_not_post_each_message_is_dead_lettered_and_posting_resumes_after() {
    use nisse_bus::proto::DeadLetterCause;

    let mut rig = Rig::start("").await;
    publish_alert(&rig.nats, "DiskFull", "nas01").await;
    let root = rig.root(1).await;
    let item = rig.install.snapshot().unwrap().items[0].id.clone();
    let bus = rig.nats.bus(&["ops"]).await.unwrap();

    // The operator takes the agent's right to post.
    let levels = rig
        .operator
        .state(&rig.room, "m.room.power_levels", "")
        .await
        .unwrap();
    let mut raised = levels.clone();
    raised["events"]["m.room.message"] = 50.into();
    rig.operator
        .set_state(&rig.room, "m.room.power_levels", "", &raised)
        .await
        .unwrap();
    let mut refused = Vec::new();
    for (id, item) in [
        ("test:forbidden-1", item.as_str()),
        ("test:forbidden-2", ""),
    ] {
        let seq = bus
            .publish(tell(id, item, &format!("said while forbidden ({id})")))
            .await
            .unwrap()
            .sequence;
        refused.push(seq);
    }
    let dead = wait_dead_letters(&rig, 2).await;
    let summary: Vec<_> = dead.iter().map(dead_letter_summary).collect();
    let (consumer, subject) = ("matrix-tell", "nisse.ops.out.tell");
    assert_eq!(
        summary,
        [
            (refused[0], DeadLetterCause::Rejected, consumer, subject),
            (refused[1], DeadLetterCause::Rejected, consumer, subject),
        ]
    );
    for (d, id) in dead.iter().zip(["test:forbidden-1", "test:forbidden-2"]) {
        assert!(
            d.reason.contains("M_FORBIDDEN") && d.reason.contains(id),
            "{}",
            d.reason
        );
    }
    let log = rig.install.log(&["intake-matrix"]);
    assert_eq!(
        log.matches("the notice that a message could not be posted was refused too")
            .count(),
        2,
        "{log}"
    );

    // The right given back: the next message goes out in the thread.
    rig.operator
        .set_state(&rig.room, "m.room.power_levels", "", &levels)
        .await
        .unwrap();
    bus.publish(tell("test:allowed", &item, "allowed again"))
        .await
        .unwrap();
    let allowed = rig.agent_posts(|_, b| b == "allowed again").await;
    assert_eq!(
        allowed["content"]["m.relates_to"]["event_id"],
        root.as_str()
    );

    // A restart redelivers nothing: the refused ones stay refused.
    stop(rig.matrix.as_mut().unwrap()).await;
    rig.matrix = Some(rig.install.serve(&["intake-matrix"]));
    bus.publish(tell("test:restarted", "", "after the restart"))
        .await
        .unwrap();
    rig.agent_posts(|_, b| b == "after the restart").await;
    let posted = from_agent(&rig.operator, &rig.room, &rig.agent_id).await;
    let bodies: Vec<&str> = posted
        .iter()
        .filter_map(|e| e["content"]["body"].as_str())
        .filter(|b| !b.contains("Work item **#1**"))
        .collect();
    assert_eq!(
        bodies,
        ["allowed again", "after the restart"],
        "{posted:#?}"
    );
    assert_eq!(dead_letters(&rig.nats).await.len(), 2);
    rig.stop_all().await;
}
