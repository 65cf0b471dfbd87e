//! The agent's API calls, as the brain sends them and Vikunja sees them.

use std::time::Duration;

use pretty_assertions::assert_eq;

use nisse_intake_vikunja::marker;
use nisse_intake_vikunja::records::{CallRecord, CallState, write_call};
use nisse_proto::v1::vikunja_request::Call;
use nisse_proto::v1::{
    VikunjaCallStatus, VikunjaCommentCall, VikunjaCreateTask, VikunjaReadTask, VikunjaSetDone,
};

use nisse_tests::vikunja::Permission;

use super::{ACCOUNT, OPERATOR, Secrets, Service, answer, config, desk, nats, request, results};

fn comment(task_id: i64, text: &str) -> Call {
    Call::Comment(VikunjaCommentCall {
        task_id,
        comment: text.into(),
    })
}

/// The comments on `task` that carry `request_id`'s marker.
fn marked(desk: &super::Desk, task: i64, request_id: &str) -> usize {
    desk.vikunja
        .comments(task)
        .iter()
        .filter(|c| c.comment.contains(&marker(request_id)))
        .count()
}

/// How many requests of `method` on `path` the stand-in answered.
fn made(desk: &super::Desk, method: &str, path: &str) -> usize {
    desk.vikunja
        .requests()
        .iter()
        .filter(|r| r.method == method && r.path == path)
        .count()
}

#[tokio::test]
async fn a_comment_is_made_once_however_often_its_request_comes() {
    let (_nats, bus) = nats().await;
    let desk = desk().await;
    let task = desk
        .vikunja
        .create_task(desk.project, OPERATOR, "Backups on nas01", "")
        .await
        .unwrap();
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
    let path = format!("/api/v1/tasks/{task}/comments");

    request(
        &bus,
        "c-ack",
        0,
        comment(task, "Picked up: **first** in the queue."),
    )
    .await;
    let done = answer(&bus, "c-ack").await;
    assert_eq!(
        done.status,
        VikunjaCallStatus::Done as i32,
        "{}",
        done.reason
    );
    assert!(!done.adopted);
    let c = done.comment.as_ref().unwrap();
    assert_eq!(c.author, ACCOUNT);
    assert_eq!(
        desk.vikunja
            .comments(task)
            .last()
            .map(|c| c.comment.clone()),
        Some(format!(
            "<p>Picked up: <strong>first</strong> in the queue.</p>\n{}",
            marker("c-ack")
        )),
        "Markdown rendered to the HTML Vikunja keeps, the marker after it"
    );
    assert_eq!(
        c.comment, "Picked up: first in the queue.",
        "the answer has the comment as people read it"
    );
    let env = done.envelope.as_ref().unwrap();
    assert_eq!(env.message_id, "vikunja-result:c-ack");
    assert_eq!(env.work_item_id, "item-1");
    assert_eq!(marked(&desk, task, "c-ack"), 1);

    // The brain retries the same request (a new message, the same request
    // id): answered from the record, nothing made again.
    let before = made(&desk, "PUT", &path);
    request(
        &bus,
        "c-ack",
        1,
        comment(task, "Picked up: **first** in the queue."),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(made(&desk, "PUT", &path), before);
    assert_eq!(marked(&desk, task, "c-ack"), 1);
    assert_eq!(
        results(&bus)
            .await
            .iter()
            .filter(|r| r.request_id == "c-ack")
            .count(),
        1,
        "the answer again has the same id, so it is stored once"
    );

    // A crash after the comment was made and before it was answered: the
    // record says started, and Vikunja has the comment.
    service.stop().await;
    let agent = nisse_tests::agent("ops");
    let started = CallRecord {
        request_id: "c-crash".into(),
        state: CallState::Started,
        started_ms: 1,
        result: Vec::new(),
    };
    write_call(&bus, &agent, &started, None)
        .await
        .unwrap()
        .unwrap();
    desk.api(
        reqwest::Method::PUT,
        &format!("/tasks/{task}/comments"),
        serde_json::json!({ "comment": format!("<p>Restating it.</p>\n{}", marker("c-crash")) }),
    )
    .await;
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
    request(&bus, "c-crash", 0, comment(task, "Restating it.")).await;
    let reconciled = answer(&bus, "c-crash").await;
    assert_eq!(
        reconciled.status,
        VikunjaCallStatus::Done as i32,
        "{}",
        reconciled.reason
    );
    assert!(
        reconciled.adopted,
        "the comment made before the crash is adopted"
    );
    assert_eq!(marked(&desk, task, "c-crash"), 1, "and not made again");

    // Vikunja made the comment and the answer was lost on the way (a
    // proxy that gave up): the retry finds it, and makes no second one.
    desk.vikunja.lose_answers("PUT", &path, 502, 1);
    request(&bus, "c-lost", 0, comment(task, "Still on it.")).await;
    let lost = answer(&bus, "c-lost").await;
    assert_eq!(
        lost.status,
        VikunjaCallStatus::Done as i32,
        "{}",
        lost.reason
    );
    assert!(lost.adopted);
    assert_eq!(marked(&desk, task, "c-lost"), 1);

    // A task in a project this agent does not serve: refused, nothing
    // written.
    let elsewhere = desk.vikunja.add_project(OPERATOR, "Elsewhere").unwrap();
    desk.vikunja
        .share_project(elsewhere, ACCOUNT, Permission::Write)
        .await
        .unwrap();
    let foreign = desk
        .vikunja
        .create_task(elsewhere, OPERATOR, "Not ours", "")
        .await
        .unwrap();
    request(&bus, "c-foreign", 0, comment(foreign, "hello?")).await;
    let refused = answer(&bus, "c-foreign").await;
    assert_eq!(
        refused.status,
        VikunjaCallStatus::Refused as i32,
        "{}",
        refused.reason
    );
    assert!(
        refused.reason.contains(&format!("project {elsewhere}")),
        "{}",
        refused.reason
    );
    assert_eq!(desk.vikunja.comments(foreign).len(), 0);

    // A request that makes no sense: refused before Vikunja is asked.
    let asked = desk.vikunja.requests().len();
    request(&bus, "c-empty", 0, comment(task, "  ")).await;
    let empty = answer(&bus, "c-empty").await;
    assert_eq!(empty.status, VikunjaCallStatus::Refused as i32);
    assert!(empty.reason.contains("empty"), "{}", empty.reason);
    assert_eq!(desk.vikunja.requests().len(), asked);

    // Vikunja's refusal is a failure with its status and message.
    request(&bus, "c-missing", 0, comment(9999, "hello?")).await;
    let failed = answer(&bus, "c-missing").await;
    assert_eq!(failed.status, VikunjaCallStatus::Failed as i32);
    assert_eq!(failed.http_status, 404);
    assert!(failed.reason.contains("4002"), "{}", failed.reason);
    service.stop().await;
}

#[tokio::test]
async fn set_done_comments_the_note_then_marks_the_whole_task_once() {
    let (_nats, bus) = nats().await;
    let desk = desk().await;
    let task = desk
        .vikunja
        .create_task(
            desk.project,
            OPERATOR,
            "Backups on nas01",
            "<p>Nightly job failed.</p>",
        )
        .await
        .unwrap();
    desk.vikunja.assign(task, ACCOUNT, OPERATOR).await.unwrap();
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
    let path = format!("/api/v1/tasks/{task}");

    let set = |done: bool, note: &str| {
        Call::SetDone(VikunjaSetDone {
            task_id: task,
            done,
            note: note.into(),
        })
    };
    request(&bus, "d-1", 0, set(true, "Done: the job runs again.")).await;
    let answered = answer(&bus, "d-1").await;
    assert_eq!(
        answered.status,
        VikunjaCallStatus::Done as i32,
        "{}",
        answered.reason
    );
    let t = answered.task.as_ref().unwrap();
    assert!(t.done);
    assert_eq!(
        t.assignees,
        [ACCOUNT],
        "Vikunja's update replaces: the assignees were sent back"
    );
    assert_eq!(t.description, "Nightly job failed.");
    assert!(
        answered
            .comment
            .as_ref()
            .unwrap()
            .comment
            .contains("Done: the job runs again.")
    );
    let now = desk.vikunja.task(task).unwrap();
    assert!(now.done);
    assert_eq!(now.assignees, [ACCOUNT]);
    assert_eq!(now.description, "<p>Nightly job failed.</p>");
    assert_eq!(made(&desk, "POST", &path), 1);
    // The note was commented before the task was marked.
    let requests = desk.vikunja.requests();
    let put = requests
        .iter()
        .position(|r| r.method == "PUT" && r.path == format!("{path}/comments"))
        .unwrap();
    let post = requests
        .iter()
        .position(|r| r.method == "POST" && r.path == path)
        .unwrap();
    assert!(put < post);

    // Asked again for the state it is in: nothing written.
    request(&bus, "d-2", 0, set(true, "")).await;
    let again = answer(&bus, "d-2").await;
    assert_eq!(
        again.status,
        VikunjaCallStatus::Done as i32,
        "{}",
        again.reason
    );
    assert_eq!(made(&desk, "POST", &path), 1);

    // Reopened, the answer lost on the way: the retry reads the task,
    // finds it reopened, and writes nothing more.
    desk.vikunja.lose_answers("POST", &path, 504, 1);
    request(&bus, "d-3", 0, set(false, "")).await;
    let reopened = answer(&bus, "d-3").await;
    assert_eq!(
        reopened.status,
        VikunjaCallStatus::Done as i32,
        "{}",
        reopened.reason
    );
    assert!(!reopened.task.as_ref().unwrap().done);
    assert_eq!(made(&desk, "POST", &path), 2);
    assert!(!desk.vikunja.task(task).unwrap().done);

    // Turned away once with a Retry-After: tried again after the wait.
    desk.vikunja.refuse_next("POST", &path, 429, Some(1), 1);
    request(&bus, "d-4", 0, set(true, "")).await;
    let waited = answer(&bus, "d-4").await;
    assert_eq!(
        waited.status,
        VikunjaCallStatus::Done as i32,
        "{}",
        waited.reason
    );
    assert!(desk.vikunja.task(task).unwrap().done);

    // Turned away past the call's timeout: FAILED, naming the status and
    // the wait asked for.
    desk.vikunja.refuse_next("GET", &path, 503, Some(30), 10);
    request(
        &bus,
        "d-5",
        0,
        Call::ReadTask(VikunjaReadTask { task_id: task }),
    )
    .await;
    let failed = answer(&bus, "d-5").await;
    assert_eq!(failed.status, VikunjaCallStatus::Failed as i32);
    assert_eq!(failed.http_status, 503);
    assert!(failed.reason.contains("Retry-After"), "{}", failed.reason);
    service.stop().await;
}

#[tokio::test]
async fn read_and_create_tasks_once_per_request_id_in_served_projects_only() {
    let (_nats, bus) = nats().await;
    let desk = desk().await;
    let task = desk
        .vikunja
        .create_task(desk.project, OPERATOR, "Rotate the TLS certificate", "")
        .await
        .unwrap();
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

    request(
        &bus,
        "r-1",
        0,
        Call::ReadTask(VikunjaReadTask { task_id: task }),
    )
    .await;
    let read = answer(&bus, "r-1").await;
    assert_eq!(
        read.status,
        VikunjaCallStatus::Done as i32,
        "{}",
        read.reason
    );
    let t = read.task.as_ref().unwrap();
    assert_eq!(
        (t.id, t.title.as_str()),
        (task, "Rotate the TLS certificate")
    );
    assert_eq!(t.url, format!("{}/tasks/{task}", desk.vikunja.url()));

    let create = |project_id, title: &str| {
        Call::CreateTask(VikunjaCreateTask {
            project_id,
            title: title.into(),
            description: "Found by the **disk** duty.".into(),
        })
    };
    // Made, and the answer lost: the retry finds it by its marker.
    let path = format!("/api/v1/projects/{}/tasks", desk.project);
    desk.vikunja.lose_answers("PUT", &path, 502, 1);
    request(
        &bus,
        "t-1",
        0,
        create(desk.project, "Disk 91% full on db01"),
    )
    .await;
    let opened = answer(&bus, "t-1").await;
    assert_eq!(
        opened.status,
        VikunjaCallStatus::Done as i32,
        "{}",
        opened.reason
    );
    assert!(opened.adopted);
    let made = opened.task.as_ref().unwrap();
    assert_eq!(made.created_by, ACCOUNT);
    assert_eq!(made.description, "Found by the disk duty.");
    assert_eq!(
        desk.vikunja.task(made.id).map(|t| t.description),
        Some(format!(
            "<p>Found by the <strong>disk</strong> duty.</p>\n{}",
            marker("t-1")
        ))
    );
    let ours: Vec<_> = desk
        .vikunja
        .tasks(desk.project)
        .into_iter()
        .filter(|t| t.description.contains(&marker("t-1")))
        .collect();
    assert_eq!(ours.len(), 1, "one task, however the answer went");

    // Asked again: the same answer, nothing made.
    request(
        &bus,
        "t-1",
        1,
        create(desk.project, "Disk 91% full on db01"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        desk.vikunja
            .tasks(desk.project)
            .iter()
            .filter(|t| t.description.contains(&marker("t-1")))
            .count(),
        1
    );

    // A project not served, a title of two lines: refused, Vikunja not
    // asked.
    let asked = desk.vikunja.requests().len();
    request(&bus, "t-2", 0, create(desk.project + 100, "Elsewhere")).await;
    let refused = answer(&bus, "t-2").await;
    assert_eq!(refused.status, VikunjaCallStatus::Refused as i32);
    assert!(
        refused.reason.contains("vikunja.projects"),
        "{}",
        refused.reason
    );
    request(&bus, "t-3", 0, create(desk.project, "Disk full\non db01")).await;
    let refused = answer(&bus, "t-3").await;
    assert_eq!(refused.status, VikunjaCallStatus::Refused as i32);
    assert!(refused.reason.contains("one line"), "{}", refused.reason);
    assert_eq!(desk.vikunja.requests().len(), asked);
    service.stop().await;
}
