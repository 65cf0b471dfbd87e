//! The operator and the agent in the agent's Matrix room, on a real
//! Synapse, each Nisse service in its own process: an alert's item gets a
//! thread, the operator's reply in it lands on the item's log, a question
//! gets the item's status and changes nothing, and a ✅ on the approval
//! request approves exactly the revision it showed; a stranger's ✅ and
//! words change nothing.

use std::time::Duration;

use nisse_core::Event;
use nisse_core::plans::PlanStatus;
use nisse_tests::TestNats;
use nisse_tests::synapse::{TestClient, TestSynapse};

use super::alerts::{Install, publish_alert, stop};
use super::gates::cli;

/// The user `nisse` runs as, as its CLI names it (`cli:<user>`).
fn local_user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .unwrap()
        .name
}

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

#[tokio::test]
async fn the_operator_talks_with_the_agent_in_an_items_thread_and_approves_with_a_reaction() {
    let nats = TestNats::start().await.unwrap();
    let synapse = TestSynapse::start().await.unwrap();
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
        .create_room("ops", &[&agent_user.user_id, &stranger_user.user_id], false)
        .await
        .unwrap();
    stranger.join(&room).await.unwrap();

    nats.bus(&["ops"])
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
         [matrix]\nhomeserver = \"{hs}\"\n\
         [matrix.agents.ops]\nuser-id = \"{agent}\"\npassword-file = {pw:?}\nroom = \"{room}\"\n",
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
    children.push(install.serve(&["intake-matrix"]));

    // An alert: its item's thread root appears in the room.
    publish_alert(&nats, "DiskFull", "nas01").await;
    let root = operator
        .wait_for_message(
            &room,
            |e| {
                e["sender"] == agent_user.user_id.as_str()
                    && e["content"]["body"]
                        .as_str()
                        .is_some_and(|b| b.contains("#1"))
            },
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", install.log(&["intake-matrix"])));
    let root_id = root["event_id"].as_str().unwrap().to_string();
    assert!(
        root["content"]["formatted_body"]
            .as_str()
            .is_some_and(|h| h.contains("<strong>")),
        "Markdown is rendered to HTML: {root}"
    );

    // The operator's reply in the thread lands on the item's log.
    operator
        .send_thread_reply(&room, &root_id, "the disk is fine, it was a test")
        .await
        .unwrap();
    // A stranger's "approve" is recorded as data only.
    stranger
        .send_thread_reply(&room, &root_id, "approve")
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
        .send_thread_reply(&room, &root_id, "should I approve?")
        .await
        .unwrap();
    operator
        .wait_for_message(
            &room,
            |e| {
                e["sender"] == agent_user.user_id.as_str()
                    && e["content"]["m.relates_to"]["event_id"] == root_id.as_str()
                    && e["content"]["body"]
                        .as_str()
                        .is_some_and(|b| b.starts_with("Item **#1**"))
            },
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(install.snapshot().unwrap().items, before);

    // A plan: its approval request comes into the thread; a stranger's ✅
    // does nothing, the operator's approves the revision it showed.
    std::fs::write(
        install.path().join("plan.toml"),
        "[[step]]\ntarget = \"nas01\"\ncommand = \"zfs snapshot tank/media@before\"\n",
    )
    .unwrap();
    cli(&install, &["plan", "propose", "1", "plan.toml"]).await;
    let request = operator
        .wait_for_message(
            &room,
            |e| {
                e["sender"] == agent_user.user_id.as_str()
                    && e["content"]["body"]
                        .as_str()
                        .is_some_and(|b| b.contains("approve rev-1"))
            },
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    let request_id = request["event_id"].as_str().unwrap().to_string();
    assert_eq!(
        request["content"]["m.relates_to"]["event_id"],
        root_id.as_str()
    );
    stranger.react(&room, &request_id, "✅").await.unwrap();
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
    operator.react(&room, &request_id, "✅").await.unwrap();
    let s = install
        .wait_until("rev-1 is approved", Duration::from_secs(30), |s| {
            s.plans.iter().any(|p| p.approved_by.is_some())
        })
        .await;
    let by = format!("operator:{}", op_user.user_id);
    assert_eq!(s.plans[0].approved_by.as_deref(), Some(by.as_str()));
    assert_eq!(s.plans[0].approved_via.as_deref(), Some("matrix"));
    // The approval is echoed in the thread.
    operator
        .wait_for_message(
            &room,
            |e| {
                e["sender"] == agent_user.user_id.as_str()
                    && e["content"]["body"].as_str().is_some_and(|b| {
                        b.contains("Approved rev-1") || b.contains("approved rev-1")
                    })
            },
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    // Nothing the agent posted went twice.
    let posted = from_agent(&operator, &room, &agent_user.user_id).await;
    let mut bodies: Vec<&str> = posted
        .iter()
        .filter_map(|e| e["content"]["body"].as_str())
        .collect();
    let all = bodies.len();
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), all, "{posted:#?}");

    for child in &mut children {
        stop(child).await;
    }
}
