//! The service as `nisse up` runs it: on a server with the generated
//! authorization, as its own identity, with only its permissions.

use std::time::Duration;

use pretty_assertions::assert_eq;

use nisse_bus::Role;
use nisse_bus::auth::Identity;
use nisse_proto::v1::vikunja_request::Call;
use nisse_proto::v1::{VikunjaCallStatus, VikunjaCommentCall};
use nisse_tests::TestNats;

use super::{
    OPERATOR, Secrets, Service, answer, config, cursor, desk, events, eventually, id_of, request,
};

#[tokio::test]
async fn as_its_own_identity_it_takes_deliveries_polls_and_answers_calls() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let admin = nats.bus(&["ops"]).await.unwrap();
    admin.ensure_topology().await.unwrap();
    let ops = nisse_tests::agent("ops");
    let own = nats
        .bus_as(&Identity::service(Role::IntakeVikunja, &ops), &["ops"])
        .await
        .unwrap();
    let brain = nats
        .bus_as(&Identity::service(Role::Brain, &ops), &["ops"])
        .await
        .unwrap();

    let desk = desk().await;
    let secrets = Secrets::new(&desk.token);
    let service = Service::start(
        &own,
        config(
            desk.vikunja.url(),
            &secrets,
            &[desk.project],
            Duration::from_secs(1),
        ),
    )
    .await;
    desk.hook(&service.url);
    let task = desk
        .vikunja
        .create_task(desk.project, OPERATOR, "Backups on nas01", "")
        .await
        .unwrap();
    desk.vikunja.flush_webhooks().await.unwrap();
    desk.all_answered(200);
    // The poll's cursor and the events' records are its own to write.
    eventually("the poll's cursor", Duration::from_secs(20), || async {
        cursor(&admin, desk.project).await
    })
    .await;
    let stored = events(&admin).await;
    assert!(
        stored
            .iter()
            .any(|(_, e)| id_of(e) == format!("vikunja:task:{task}:created")),
        "{stored:?}"
    );

    request(
        &brain,
        "walls-ack",
        0,
        Call::Comment(VikunjaCommentCall {
            task_id: task,
            comment: "On it.".into(),
        }),
    )
    .await;
    let done = answer(&admin, "walls-ack").await;
    assert_eq!(
        done.status,
        VikunjaCallStatus::Done as i32,
        "{}",
        done.reason
    );
    // Only the intake may say what happened in Vikunja.
    let forged = nisse_proto::v1::VikunjaEvent {
        envelope: Some(nisse_proto::v1::Envelope {
            agent: "ops".into(),
            message_id: "forged".into(),
            ..Default::default()
        }),
        event: "task.created".into(),
        ..Default::default()
    };
    let published = tokio::time::timeout(Duration::from_secs(15), brain.publish(forged)).await;
    assert!(
        !matches!(published, Ok(Ok(_))),
        "the brain cannot forge Vikunja's events: {published:?}"
    );
    assert!(
        events(&admin)
            .await
            .iter()
            .all(|(_, e)| id_of(e) != "forged"),
        "nothing forged is stored"
    );
    service.stop().await;
}
