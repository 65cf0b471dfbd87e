//! The webhook receiver as Vikunja's deliveries reach it: signatures,
//! replays and tampering, what is skipped, ignored or refused, and
//! acknowledging only what JetStream stored.

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::json;

use nisse_proto::v1::{ActorKind, VikunjaSource};

use super::{
    ACCOUNT, OPERATOR, SECRET, Secrets, Service, assert_problem, config, desk, events, eventually,
    hook_headers, id_of, nats, nats_short_window, post, stored_count,
};

#[tokio::test]
async fn a_signed_delivery_is_stored_once_and_replays_tampering_and_forgeries_store_nothing() {
    // A duplicate window of a second: a replay after it is kept out by
    // the event's record, not by JetStream.
    let (_nats, bus) = nats_short_window().await;
    let desk = desk().await;
    let secrets = Secrets::new(&desk.token);
    let service = Service::start(
        &bus,
        config(
            desk.vikunja.url(),
            &secrets,
            &[desk.project],
            Duration::ZERO,
        ),
    )
    .await;
    for path in ["/healthz", "/readyz"] {
        let r = reqwest::get(format!("{}{path}", service.base))
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    desk.hook(&service.url);

    let task = desk
        .vikunja
        .create_task(
            desk.project,
            OPERATOR,
            "Backups on nas01",
            "<p>They failed last night.</p>",
        )
        .await
        .unwrap();
    desk.vikunja.flush_webhooks().await.unwrap();
    desk.all_answered(200);

    let stored = events(&bus).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    let (m, e) = &stored[0];
    let id = format!("vikunja:task:{task}:created");
    assert_eq!(m.subject, "nisse.ops.in.vikunja");
    assert_eq!(m.header("Nats-Msg-Id"), Some(id.as_str()));
    assert_eq!(id_of(e), id);
    let actor = e.envelope.as_ref().unwrap().actor.as_ref().unwrap();
    assert_eq!(actor.kind, ActorKind::External as i32);
    assert_eq!(actor.id, "vikunja:alice");
    assert_eq!(e.source, VikunjaSource::Webhook as i32);
    assert_eq!(e.event, "task.created");
    assert_eq!((e.project_id, e.doer.as_str()), (desk.project, OPERATOR));
    let t = e.task.as_ref().unwrap();
    assert_eq!(t.id, task);
    assert_eq!(t.title, "Backups on nas01");
    // As people read it: the intake turns Vikunja's HTML into text.
    assert_eq!(t.description, "They failed last night.");
    assert_eq!(t.created_by, OPERATOR);
    assert!(!t.done);
    assert_eq!(t.url, format!("{}/tasks/{task}", desk.vikunja.url()));
    assert!(t.created.is_some() && t.updated.is_some());

    // The same delivery sent again, as it was (a retry whose answer was
    // lost, or someone replaying it) and after JetStream's window: answered
    // 200, so Vikunja stops retrying, and stored nothing again.
    let delivery = desk.vikunja.deliveries().remove(0);
    let headers: Vec<(&str, &str)> = delivery
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = desk
        .vikunja
        .send_raw(&service.url, &headers, delivery.body.as_bytes())
        .await
        .unwrap();
    assert_eq!(status, 200);
    let own: Vec<(String, String)> = delivery.headers.clone();
    let (status, again) = post(&service.url, &own, delivery.body.as_bytes()).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        (again["stored"].as_u64(), again["duplicate"].as_bool()),
        (Some(0), Some(true))
    );
    assert_eq!(stored_count(&bus).await, 1);

    // Signed, then changed on the way.
    let tampered = delivery
        .body
        .replace("Backups on nas01", "Backups on nas02");
    assert_ne!(tampered, delivery.body);
    let refused = post(&service.url, &own, tampered.as_bytes()).await;
    assert_problem(&refused, 401, "not the HMAC-SHA256 of this body");
    assert_eq!(
        refused.1["type"],
        "https://nisse.invalid/problems/vikunja/bad-signature"
    );
    // Signed with another secret, not signed, signed with something else.
    let body = tampered.as_bytes();
    assert_problem(
        &post(&service.url, &hook_headers(body, Some("guessed")), body).await,
        401,
        "webhook's secret",
    );
    assert_problem(
        &post(&service.url, &hook_headers(body, None), body).await,
        401,
        "no X-Vikunja-Signature",
    );
    let mut prefixed = hook_headers(body, None);
    prefixed.push((
        "X-Vikunja-Signature".into(),
        format!(
            "sha256={}",
            nisse_intake_vikunja::sign(SECRET.as_bytes(), body)
        ),
    ));
    assert_problem(
        &post(&service.url, &prefixed, body).await,
        401,
        "64 hex digits",
    );
    assert_eq!(stored_count(&bus).await, 1, "nothing refused is stored");

    // The secret is read at each request: a rotated one applies at once.
    std::fs::write(&secrets.secret, "rotated\n").unwrap();
    let signed = hook_headers(body, Some(SECRET));
    assert_problem(
        &post(&service.url, &signed, body).await,
        401,
        "webhook's secret",
    );
    std::fs::write(&secrets.secret, format!("{SECRET}\n")).unwrap();
    // Signed properly, the changed body is a delivery like any other: the
    // same task's creation, which is stored already.
    let (status, answer) = post(&service.url, &signed, body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["duplicate"], true);
    assert_eq!(stored_count(&bus).await, 1);
    service.stop().await;
}

#[tokio::test]
async fn the_agents_own_events_are_skipped_other_projects_refused_and_bad_payloads_named() {
    let (_nats, bus) = nats().await;
    let desk = desk().await;
    let secrets = Secrets::new(&desk.token);
    let service = Service::start(
        &bus,
        config(
            desk.vikunja.url(),
            &secrets,
            &[desk.project],
            Duration::ZERO,
        ),
    )
    .await;
    desk.hook(&service.url);
    let elsewhere = desk.vikunja.add_project(OPERATOR, "Elsewhere").unwrap();
    desk.vikunja.add_webhook(
        elsewhere,
        &service.url,
        SECRET,
        &nisse_intake_vikunja::EVENTS,
    );

    // The agent's own task and comment come back: answered, not taken.
    let own = desk
        .vikunja
        .create_task(desk.project, ACCOUNT, "Opened by the agent", "")
        .await
        .unwrap();
    desk.vikunja
        .comment(own, ACCOUNT, "<p>Picked up.</p>")
        .await
        .unwrap();
    desk.vikunja.flush_webhooks().await.unwrap();
    desk.all_answered(200);
    assert_eq!(
        stored_count(&bus).await,
        0,
        "the agent's own events are not taken"
    );

    // A task in a project this agent does not serve: refused, 403 at
    // every attempt Vikunja makes.
    desk.vikunja
        .create_task(elsewhere, OPERATOR, "Not ours", "")
        .await
        .unwrap();
    desk.vikunja.flush_webhooks().await.unwrap();
    let refused: Vec<_> = desk
        .vikunja
        .deliveries()
        .into_iter()
        .filter(|d| d.status != Some(200))
        .collect();
    assert!(!refused.is_empty());
    assert!(refused.iter().all(|d| d.status == Some(403)), "{refused:?}");
    let (status, answer) = post(
        &service.url,
        &refused[0]
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>(),
        refused[0].body.as_bytes(),
    )
    .await;
    assert_problem(
        &(status, answer),
        403,
        &format!("project {elsewhere}, which is not among the projects agent ops serves"),
    );

    // An event this service does not take.
    let body = serde_json::to_vec(&json!({
        "event_name": "project.updated",
        "time": "2026-08-01T10:00:00.5+02:00",
        "data": {"project": {"id": desk.project}, "doer": {"id": 2, "username": OPERATOR}},
    }))
    .unwrap();
    let (status, answer) = post(&service.url, &hook_headers(&body, Some(SECRET)), &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["ignored"], true);
    assert_eq!(answer["event"], "project.updated");

    // A payload that is not what Vikunja sends: the field is named.
    let body = serde_json::to_vec(&json!({
        "event_name": "task.created",
        "time": "2026-08-01T10:00:00Z",
        "data": {"task": {"id": "seven", "project_id": desk.project}},
    }))
    .unwrap();
    assert_problem(
        &post(&service.url, &hook_headers(&body, Some(SECRET)), &body).await,
        400,
        "data.task.id",
    );
    let body = serde_json::to_vec(&json!({
        "event_name": "task.comment.created",
        "data": {"task": {"id": 7, "project_id": desk.project}},
    }))
    .unwrap();
    assert_problem(
        &post(&service.url, &hook_headers(&body, Some(SECRET)), &body).await,
        400,
        "data.comment",
    );
    let mut form = hook_headers(&body, Some(SECRET));
    form[0].1 = "application/x-www-form-urlencoded".into();
    assert_problem(
        &post(&service.url, &form, &body).await,
        415,
        "application/json",
    );
    assert_eq!(stored_count(&bus).await, 0, "nothing of these is stored");
    service.stop().await;
}

#[tokio::test]
async fn a_delivery_not_stored_is_answered_5xx_and_taken_when_it_comes_again() {
    let (mut nats, bus) = nats().await;
    let desk = desk().await;
    let secrets = Secrets::new(&desk.token);
    let service = Service::start(
        &bus,
        config(
            desk.vikunja.url(),
            &secrets,
            &[desk.project],
            Duration::ZERO,
        ),
    )
    .await;
    desk.hook(&service.url);

    // NATS is away: the event cannot be stored, and is not recorded
    // either. Vikunja tries again, and gives up.
    nats.kill().await.unwrap();
    let task = desk
        .vikunja
        .create_task(desk.project, OPERATOR, "Disk full on db01", "")
        .await
        .unwrap();
    desk.vikunja.flush_webhooks().await.unwrap();
    let attempts = desk.vikunja.deliveries();
    assert!(attempts.len() > 1, "Vikunja retried: {attempts:?}");
    assert!(attempts.iter().all(|d| !d.succeeded()), "{attempts:?}");
    assert_eq!(attempts[0].status, Some(503), "{:?}", attempts[0]);
    let not_ready = reqwest::get(format!("{}/readyz", service.base))
        .await
        .unwrap();
    assert_eq!(not_ready.status(), 503);

    nats.restart().await.unwrap();
    eventually(
        "the receiver to reconnect",
        Duration::from_secs(30),
        || async {
            let r = reqwest::get(format!("{}/readyz", service.base))
                .await
                .ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
    // Sent again (Vikunja has no redelivery of its own; the poll would
    // find it too): taken now, once.
    let last = attempts.last().unwrap();
    let headers: Vec<(String, String)> = last.headers.clone();
    let (status, answer) = post(&service.url, &headers, last.body.as_bytes()).await;
    assert_eq!(status, 200, "the delivery is taken now: {answer}");
    assert_eq!(answer["stored"], 1);
    let (status, again) = post(&service.url, &headers, last.body.as_bytes()).await;
    assert_eq!(
        (status, again["stored"].as_u64()),
        (200, Some(0)),
        "{again}"
    );
    let stored = events(&bus).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(id_of(&stored[0].1), format!("vikunja:task:{task}:created"));
    service.stop().await;
}

#[tokio::test]
async fn assignments_comments_and_edits_each_carry_the_id_of_what_they_are() {
    let (_nats, bus) = nats().await;
    let desk = desk().await;
    let secrets = Secrets::new(&desk.token);
    let service = Service::start(
        &bus,
        config(
            desk.vikunja.url(),
            &secrets,
            &[desk.project],
            Duration::ZERO,
        ),
    )
    .await;
    desk.hook(&service.url);

    let task = desk
        .vikunja
        .create_task(desk.project, OPERATOR, "Rotate the TLS certificate", "")
        .await
        .unwrap();
    desk.vikunja.assign(task, ACCOUNT, OPERATOR).await.unwrap();
    let comment = desk
        .vikunja
        .comment(task, OPERATOR, "<p>approve rev-1</p>")
        .await
        .unwrap();
    // An edit in a later second: Vikunja keeps whole seconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    desk.vikunja
        .edit_comment(task, comment, OPERATOR, "<p>approve rev-2</p>")
        .await
        .unwrap();
    desk.vikunja.flush_webhooks().await.unwrap();
    desk.all_answered(200);

    let stored: Vec<_> = events(&bus).await.into_iter().map(|(_, e)| e).collect();
    let names: Vec<&str> = stored.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        names,
        [
            "task.created",
            "task.assignee.created",
            "task.updated",
            "task.comment.created",
            "task.comment.edited"
        ]
    );
    let assigned = &stored[1];
    assert!(
        id_of(assigned).starts_with(&format!("vikunja:task:{task}:assignee:")),
        "{}",
        id_of(assigned)
    );
    assert_eq!(
        (assigned.assignee.as_str(), assigned.doer.as_str()),
        (ACCOUNT, OPERATOR)
    );
    assert_eq!(assigned.task.as_ref().unwrap().assignees, [ACCOUNT]);
    let updated = &stored[2];
    let at = desk.vikunja.task(task).unwrap();
    assert!(
        id_of(updated).starts_with(&format!("vikunja:task:{task}:updated:")),
        "{}",
        id_of(updated)
    );
    assert!(at.updated >= at.created);
    let made = &stored[3];
    assert_eq!(id_of(made), format!("vikunja:comment:{comment}"));
    let c = made.comment.as_ref().unwrap();
    assert_eq!(
        (c.id, c.author.as_str(), c.comment.as_str()),
        (comment, OPERATOR, "approve rev-1")
    );
    let edited = &stored[4];
    assert!(
        id_of(edited).starts_with(&format!("vikunja:comment:{comment}:")),
        "{}",
        id_of(edited)
    );
    assert_eq!(edited.comment.as_ref().unwrap().comment, "approve rev-2");
    service.stop().await;
}
