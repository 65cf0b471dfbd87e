//! The poll as the fallback: with Vikunja's webhooks lost, what they
//! carried still reaches the stream, from the cursor, once, with the ids
//! the webhooks would have given it.

use std::collections::BTreeMap;
use std::time::Duration;

use pretty_assertions::assert_eq;

use nisse_proto::v1::VikunjaSource;

use super::{
    ACCOUNT, OPERATOR, Secrets, Service, config, cursor, desk, events, eventually, id_of,
    nats_short_window, stored_count,
};

const POLL: Duration = Duration::from_secs(1);

#[tokio::test]
async fn with_webhooks_lost_the_poll_finds_tasks_assignments_and_comments_once() {
    // A window of a second: anything published again after it would be
    // stored again, so the counts below show what was published.
    let (_nats, bus) = nats_short_window().await;
    let desk = desk().await;
    desk.vikunja.set_webhooks_enabled(false);

    // A task made before anything listened: the first poll finds it.
    let early = desk
        .vikunja
        .create_task(
            desk.project,
            OPERATOR,
            "Early",
            "Made before the agent listened.",
        )
        .await
        .unwrap();
    let done = desk
        .vikunja
        .create_task(desk.project, OPERATOR, "Finished long ago", "")
        .await
        .unwrap();
    desk.vikunja.set_done(done, true, OPERATOR).await.unwrap();
    let secrets = Secrets::new(&desk.token);
    let service = Service::start(
        &bus,
        config(desk.vikunja.url(), &secrets, &[desk.project], POLL),
    )
    .await;
    desk.hook(&service.url);
    eventually(
        "the first poll's cursor",
        Duration::from_secs(20),
        || async { cursor(&bus, desk.project).await },
    )
    .await;

    let task = desk
        .vikunja
        .create_task(desk.project, OPERATOR, "Backups on nas01", "They failed.")
        .await
        .unwrap();
    desk.vikunja.assign(task, ACCOUNT, OPERATOR).await.unwrap();
    let comment = desk
        .vikunja
        .comment(task, OPERATOR, "<p>Start with the NFS mount.</p>")
        .await
        .unwrap();
    desk.vikunja
        .comment(task, ACCOUNT, "<p>Looking.</p>")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    desk.vikunja
        .edit_comment(task, comment, OPERATOR, "<p>Start with the SMB mount.</p>")
        .await
        .unwrap();
    assert!(
        desk.vikunja.deliveries().is_empty(),
        "every webhook was lost"
    );

    let edit = eventually(
        "the poll to find the edit",
        Duration::from_secs(30),
        || async {
            events(&bus).await.into_iter().find(|(_, e)| {
                e.event == "task.comment.edited"
                    && id_of(e).starts_with(&format!("vikunja:comment:{comment}:"))
            })
        },
    )
    .await;
    // Three more polls: nothing is published again.
    let count = stored_count(&bus).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        stored_count(&bus).await,
        count,
        "a quiet project publishes nothing"
    );

    let found: Vec<_> = events(&bus).await.into_iter().map(|(_, e)| e).collect();
    assert!(found.iter().all(|e| e.source == VikunjaSource::Poll as i32));
    let mut ids: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &found {
        *ids.entry(id_of(e)).or_default() += 1;
    }
    assert!(ids.values().all(|n| *n == 1), "each once: {ids:?}");

    let created: Vec<(i64, &str)> = found
        .iter()
        .filter(|e| e.event == "task.created")
        .map(|e| (e.task.as_ref().unwrap().id, e.doer.as_str()))
        .collect();
    assert_eq!(
        created,
        [(early, OPERATOR), (task, OPERATOR)],
        "the open tasks, each by its creator; the one done before is not work"
    );
    for id in [early, task] {
        assert!(ids.contains_key(format!("vikunja:task:{id}:created").as_str()));
    }
    let assigned: Vec<_> = found
        .iter()
        .filter(|e| e.event == "task.assignee.created")
        .collect();
    assert_eq!(assigned.len(), 1, "{assigned:?}");
    assert_eq!(assigned[0].assignee, ACCOUNT);
    assert!(id_of(assigned[0]).starts_with(&format!("vikunja:task:{task}:assignee:")));
    let comments: Vec<_> = found
        .iter()
        .filter(|e| e.event == "task.comment.created")
        .collect();
    assert_eq!(
        comments.len(),
        1,
        "the agent's own comment is not taken: {comments:?}"
    );
    assert_eq!(id_of(comments[0]), format!("vikunja:comment:{comment}"));
    assert_eq!(comments[0].doer, OPERATOR);
    let c = comments[0].comment.as_ref().unwrap();
    assert_eq!(
        (c.author.as_str(), c.comment.as_str()),
        (OPERATOR, "Start with the NFS mount.")
    );
    let (_, edit) = edit;
    assert_eq!(edit.doer, OPERATOR);
    assert_eq!(
        edit.comment.as_ref().unwrap().comment,
        "Start with the SMB mount."
    );
    let snapshot = found
        .iter()
        .rev()
        .find(|e| e.event == "task.updated")
        .expect("the task as it is now");
    assert_eq!(snapshot.doer, "", "the poll cannot say who changed it");
    assert_eq!(snapshot.task.as_ref().unwrap().assignees, [ACCOUNT]);
    service.stop().await;
}

#[tokio::test]
async fn a_change_a_webhook_brought_and_the_poll_found_is_stored_once() {
    let (_nats, bus) = nats_short_window().await;
    let desk = desk().await;
    let secrets = Secrets::new(&desk.token);
    let service = Service::start(
        &bus,
        config(desk.vikunja.url(), &secrets, &[desk.project], POLL),
    )
    .await;
    desk.hook(&service.url);
    eventually(
        "the first poll's cursor",
        Duration::from_secs(20),
        || async { cursor(&bus, desk.project).await },
    )
    .await;

    let task = desk
        .vikunja
        .create_task(desk.project, OPERATOR, "Certificates expire Friday", "")
        .await
        .unwrap();
    desk.vikunja.assign(task, ACCOUNT, OPERATOR).await.unwrap();
    let comment = desk
        .vikunja
        .comment(task, OPERATOR, "<p>Renew them all.</p>")
        .await
        .unwrap();
    desk.vikunja.flush_webhooks().await.unwrap();
    desk.all_answered(200);
    // Polls after the webhooks, and after JetStream's window.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let found: Vec<_> = events(&bus).await.into_iter().map(|(_, e)| e).collect();
    let mut ids: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for e in &found {
        ids.entry(id_of(e).to_string()).or_default().push(e.source);
    }
    assert!(
        ids.values().all(|s| s.len() == 1),
        "each change once: {ids:?}"
    );
    let webhook = VikunjaSource::Webhook as i32;
    for id in [
        format!("vikunja:task:{task}:created"),
        format!("vikunja:comment:{comment}"),
    ] {
        assert_eq!(ids.get(&id), Some(&vec![webhook]), "{id}: {ids:?}");
    }
    assert!(
        ids.iter().any(
            |(id, s)| id.starts_with(&format!("vikunja:task:{task}:assignee:")) && *s == [webhook]
        ),
        "{ids:?}"
    );
    service.stop().await;
}
