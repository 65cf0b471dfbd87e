//! The Synapse harness itself: users are registered, a room carries text,
//! a thread reply and a reaction in order with their relations, a restart
//! keeps everything, a wrong token is refused, the low message rate
//! limit can be provoked, an event over the size limit is refused, and a
//! member's right to post can be taken away and given back.

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::Value;

use nisse_tests::synapse::{LIMITED_MESSAGE_BURST, MatrixError, TestClient, TestSynapse, TestUser};

/// The `m.room.message` and `m.reaction` events of a room, oldest first.
async fn timeline(client: &TestClient, room_id: &str) -> Vec<Value> {
    client
        .messages(room_id)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| matches!(e["type"].as_str(), Some("m.room.message" | "m.reaction")))
        .collect()
}

/// An operator and an agent in a room the operator created.
async fn room(synapse: &TestSynapse) -> (TestClient, TestClient, String) {
    let operator = synapse
        .register("operator", "operator-pw", true)
        .await
        .unwrap();
    let agent = synapse.register("agent", "agent-pw", false).await.unwrap();
    let operator = synapse.client(&operator);
    let agent = synapse.client(&agent);
    let room_id = operator
        .create_room("ops", &[agent.user_id()], false)
        .await
        .unwrap();
    assert_eq!(agent.join(&room_id).await.unwrap(), room_id);
    (operator, agent, room_id)
}

#[tokio::test]
async fn synapse_room_carries_text_thread_and_reaction_in_order() {
    let synapse = TestSynapse::start().await.unwrap();
    assert_eq!(synapse.server_name(), "localhost");
    assert!(synapse.base_url().starts_with("http://127.0.0.1:"));
    assert!(synapse.dir().join("homeserver.db").is_file());

    let operator = synapse
        .register("operator", "operator-pw", true)
        .await
        .unwrap();
    assert_eq!(operator.user_id, "@operator:localhost");
    assert_eq!(operator.password, "operator-pw");
    assert!(!operator.access_token.is_empty());
    assert!(!operator.device_id.is_empty());
    let agent = synapse.register("agent", "agent-pw", false).await.unwrap();
    assert_eq!(agent.user_id, synapse.user_id("agent"));

    let operator = synapse.client(&operator);
    let agent = synapse.client(&agent);
    assert_eq!(operator.whoami().await.unwrap(), "@operator:localhost");
    assert_eq!(agent.whoami().await.unwrap(), "@agent:localhost");

    let room_id = operator
        .create_room("ops", &[agent.user_id()], true)
        .await
        .unwrap();
    assert!(room_id.starts_with('!'), "{room_id}");
    assert_eq!(agent.join(&room_id).await.unwrap(), room_id);

    let root = operator
        .send_text(&room_id, "is the NAS healthy?")
        .await
        .unwrap();
    let reply = operator
        .send_thread_reply(&room_id, &root, "check the pool too")
        .await
        .unwrap();
    let reaction = operator.react(&room_id, &root, "👍").await.unwrap();
    let answer = agent.send_text(&room_id, "on it").await.unwrap();

    // The agent sees the room's whole history, state included.
    let all = agent.messages(&room_id).await.unwrap();
    assert_eq!(all[0]["type"], "m.room.create", "{all:#?}");
    assert!(
        all.iter().any(|e| e["type"] == "m.room.encryption"
            && e["content"]["algorithm"] == "m.megolm.v1.aes-sha2"),
        "{all:#?}"
    );
    assert!(
        all.iter().any(|e| e["type"] == "m.room.member"
            && e["state_key"] == "@agent:localhost"
            && e["content"]["membership"] == "join"),
        "{all:#?}"
    );

    let events = timeline(&agent, &room_id).await;
    let ids: Vec<&str> = events
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [&root, &reply, &reaction, &answer]);

    assert_eq!(events[0]["sender"], "@operator:localhost");
    assert_eq!(events[0]["content"]["body"], "is the NAS healthy?");
    assert_eq!(events[0]["content"]["msgtype"], "m.text");

    let thread = &events[1]["content"]["m.relates_to"];
    assert_eq!(thread["rel_type"], "m.thread");
    assert_eq!(thread["event_id"], root.as_str());
    assert_eq!(thread["is_falling_back"], true);
    assert_eq!(thread["m.in_reply_to"]["event_id"], root.as_str());
    assert_eq!(events[1]["content"]["body"], "check the pool too");

    assert_eq!(events[2]["type"], "m.reaction");
    let annotation = &events[2]["content"]["m.relates_to"];
    assert_eq!(annotation["rel_type"], "m.annotation");
    assert_eq!(annotation["event_id"], root.as_str());
    assert_eq!(annotation["key"], "👍");

    assert_eq!(events[3]["sender"], "@agent:localhost");
    assert_eq!(events[3]["content"]["body"], "on it");

    let found = operator
        .wait_for_message(
            &room_id,
            |e| e["sender"] == "@agent:localhost" && e["content"]["body"] == "on it",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(found["event_id"], answer.as_str());
    let missing = operator
        .wait_for_message(
            &room_id,
            |e| e["content"]["body"] == "never sent",
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
    assert!(format!("{missing:#}").contains("on it"), "{missing:#}");
}

#[tokio::test]
async fn synapse_restart_keeps_rooms_and_messages() {
    let mut synapse = TestSynapse::start().await.unwrap();
    let (operator, agent, room_id) = room(&synapse).await;
    let first = operator
        .send_text(&room_id, "before the restart")
        .await
        .unwrap();
    let port = synapse.port();
    let pid = synapse.pid();

    synapse.stop().await.unwrap();
    assert_eq!(synapse.pid(), None);
    let refused = operator
        .send_text(&room_id, "while stopped")
        .await
        .unwrap_err();
    assert!(
        refused.downcast_ref::<MatrixError>().is_none(),
        "a stopped server cannot answer: {refused:#}"
    );
    synapse.stop().await.unwrap();

    synapse.restart().await.unwrap();
    assert_eq!(synapse.port(), port);
    assert_ne!(synapse.pid(), pid);

    // The same tokens still work: users, devices, the room and its
    // messages are in the database.
    let events = timeline(&agent, &room_id).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["event_id"], first.as_str());
    assert_eq!(events[0]["content"]["body"], "before the restart");

    let second = agent
        .send_text(&room_id, "after the restart")
        .await
        .unwrap();
    let events = timeline(&operator, &room_id).await;
    let ids: Vec<&str> = events
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [&first, &second]);
}

#[tokio::test]
async fn synapse_refuses_a_wrong_token() {
    let synapse = TestSynapse::start().await.unwrap();
    let (operator, _agent, room_id) = room(&synapse).await;
    let intruder = synapse
        .register("intruder", "intruder-pw", false)
        .await
        .unwrap();
    let forged = TestUser {
        access_token: format!("{}x", intruder.access_token),
        ..intruder.clone()
    };
    let forged = TestClient::new(synapse.base_url(), &forged);

    for error in [
        forged.whoami().await.unwrap_err(),
        forged.send_text(&room_id, "let me in").await.unwrap_err(),
        forged.messages(&room_id).await.unwrap_err(),
    ] {
        let refusal = error
            .downcast_ref::<MatrixError>()
            .unwrap_or_else(|| panic!("not a refusal: {error:#}"));
        assert_eq!(refusal.status, 401, "{refusal}");
        assert_eq!(refusal.errcode, "M_UNKNOWN_TOKEN", "{refusal}");
    }

    // The right token works but is not in the room.
    let intruder = synapse.client(&intruder);
    assert_eq!(intruder.whoami().await.unwrap(), "@intruder:localhost");
    let error = intruder.send_text(&room_id, "let me in").await.unwrap_err();
    let refusal = error.downcast_ref::<MatrixError>().unwrap();
    assert_eq!(refusal.status, 403, "{refusal}");
    assert_eq!(refusal.errcode, "M_FORBIDDEN", "{refusal}");
    assert_eq!(timeline(&operator, &room_id).await, Vec::<Value>::new());
}

#[tokio::test]
async fn synapse_registration_needs_the_shared_secret() {
    let synapse = TestSynapse::start().await.unwrap();
    // Open registration is off.
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{}/_matrix/client/v3/register", synapse.base_url()))
        .json(&serde_json::json!({ "username": "walk-in", "password": "pw" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403, "{}", synapse.log_tail());

    let error = synapse.register("operator", "pw", false).await;
    assert!(error.is_ok(), "{error:?}");
    // A taken name is refused.
    let error = synapse.register("operator", "pw", false).await.unwrap_err();
    let refusal = error.downcast_ref::<MatrixError>().unwrap();
    assert_eq!(refusal.errcode, "M_USER_IN_USE", "{refusal}");
}

#[tokio::test]
async fn synapse_low_message_rate_limit_can_be_hit() {
    let synapse = TestSynapse::start_with_rate_limits().await.unwrap();
    let (operator, _agent, room_id) = room(&synapse).await;
    let mut refusal = None;
    for i in 0..(LIMITED_MESSAGE_BURST * 4) {
        match operator.send_text(&room_id, &format!("message {i}")).await {
            Ok(_) => {}
            Err(error) => {
                refusal = Some(error.downcast::<MatrixError>().unwrap());
                break;
            }
        }
    }
    let refusal = refusal.expect("no message was rate limited");
    assert_eq!(refusal.status, 429, "{refusal}");
    assert_eq!(refusal.errcode, "M_LIMIT_EXCEEDED", "{refusal}");
    assert!(refusal.retry_after_ms.is_some_and(|ms| ms > 0), "{refusal}");
}

/// What the Matrix service's tests rely on when they have a message
/// refused for good: Synapse's answer to an event over its 65 536-byte
/// limit.
#[tokio::test]
async fn synapse_refuses_an_event_over_its_size_limit() {
    let synapse = TestSynapse::start().await.unwrap();
    let (operator, agent, room_id) = room(&synapse).await;
    let error = agent
        .send_text(&room_id, &"x".repeat(70_000))
        .await
        .unwrap_err();
    let refusal = error.downcast_ref::<MatrixError>().unwrap();
    assert_eq!(refusal.status, 413, "{refusal}");
    assert_eq!(refusal.errcode, "M_TOO_LARGE", "{refusal}");
    // Just under the limit goes through.
    agent
        .send_text(&room_id, &"x".repeat(60_000))
        .await
        .unwrap();
    assert_eq!(timeline(&operator, &room_id).await.len(), 1);
}

#[tokio::test]
async fn synapse_power_levels_take_a_members_right_to_post_and_give_it_back() {
    let synapse = TestSynapse::start().await.unwrap();
    let (operator, agent, room_id) = room(&synapse).await;
    let levels = operator
        .state(&room_id, "m.room.power_levels", "")
        .await
        .unwrap();
    // An invited member has the default level, 0, and may post; the
    // creator (in room version 12 above every level without being
    // listed) may change the levels.
    assert_eq!(levels["users"][agent.user_id()], Value::Null, "{levels}");
    assert_eq!(levels["users_default"], 0, "{levels}");
    assert_eq!(levels["events_default"], 0, "{levels}");
    let mut raised = levels.clone();
    raised["events"]["m.room.message"] = 50.into();
    operator
        .set_state(&room_id, "m.room.power_levels", "", &raised)
        .await
        .unwrap();
    assert_eq!(
        agent
            .state(&room_id, "m.room.power_levels", "")
            .await
            .unwrap(),
        raised
    );

    let error = agent.send_text(&room_id, "may I?").await.unwrap_err();
    let refusal = error.downcast_ref::<MatrixError>().unwrap();
    assert_eq!(refusal.status, 403, "{refusal}");
    assert_eq!(refusal.errcode, "M_FORBIDDEN", "{refusal}");

    operator
        .set_state(&room_id, "m.room.power_levels", "", &levels)
        .await
        .unwrap();
    agent.send_text(&room_id, "thank you").await.unwrap();
    let bodies: Vec<Value> = timeline(&operator, &room_id)
        .await
        .iter()
        .map(|e| e["content"]["body"].clone())
        .collect();
    assert_eq!(bodies, ["thank you"]);
}
