//! Vikunja tickets as work items' records, on the second brain: which
//! tasks become work, comments as an approval source that must name the
//! revision, and what the operator is told naming the ticket, so
//! intake-vikunja posts it there.

use pretty_assertions::assert_eq;

use nisse_bus::AnyMessage;
use nisse_bus::proto::{
    self, Tell, TellKind, VikunjaCallStatus, VikunjaComment, VikunjaEvent, VikunjaResult,
    VikunjaTask,
};
use nisse_core::plans::PlanStatus;
use nisse_core::{Event, State};

use super::harness::{AGENT, Gates, Harness, at, settings};

/// A task of project 7, by `by`.
fn task(id: i64, by: &str) -> VikunjaTask {
    VikunjaTask {
        id,
        project_id: 7,
        index: id,
        identifier: format!("#{id}"),
        title: "Backups on nas01 failed".into(),
        description: "The nightly job did not run.".into(),
        created_by: by.into(),
        url: format!("https://tasks.example/tasks/{id}"),
        ..Default::default()
    }
}

fn vikunja(
    h: &mut Harness,
    minute: i64,
    event: &str,
    doer: &str,
    task: VikunjaTask,
    comment: Option<(i64, &str)>,
) {
    let id = format!(
        "vikunja:{event}:{}:{}",
        task.id,
        comment.map_or(0, |(c, _)| c)
    );
    let msg = VikunjaEvent {
        envelope: Some(h.envelope(
            at(minute),
            "",
            proto::ActorKind::External,
            "intake-vikunja",
            id,
        )),
        source: proto::VikunjaSource::Webhook as i32,
        event: event.into(),
        project_id: task.project_id,
        doer: doer.into(),
        task: Some(task),
        comment: comment.map(|(id, text)| VikunjaComment {
            id,
            author: doer.into(),
            comment: text.into(),
            ..Default::default()
        }),
        assignee: String::new(),
    };
    h.apply(at(minute), AnyMessage::InVikunja(msg));
}

/// What task `task`'s ticket is told: the Tells that name it among
/// their records, for every channel or for Vikunja's.
fn told(h: &Harness, task: i64) -> Vec<Tell> {
    h.outbound()
        .into_iter()
        .filter(|t| {
            t.records
                .iter()
                .any(|r| r.channel == "vikunja" && r.id == task.to_string())
                && (t.only.is_empty() || t.only.iter().any(|c| c == "vikunja"))
        })
        .collect()
}

/// The ticket's comments: what it is told, as Markdown.
fn comments(h: &Harness) -> Vec<String> {
    told(h, 4).into_iter().map(|t| t.markdown).collect()
}

fn ticket_brain() -> Harness {
    let mut s = settings();
    s.operators.push("vikunja:alice".into());
    Harness::desk(s)
}

#[test]
fn an_operators_task_is_work_whose_comments_approve_only_a_named_revision_and_everything_is_echoed()
{
    let mut h = ticket_brain();
    // Someone else's task is not work.
    vikunja(
        &mut h,
        0,
        "task.created",
        "mallory",
        task(3, "mallory"),
        None,
    );
    assert!(h.items().is_empty());
    // An operator's is, linked to its task, its words theirs.
    vikunja(&mut h, 1, "task.created", "alice", task(4, "alice"), None);
    let items = h.items();
    assert_eq!(items.len(), 1);
    let item = items[0].clone();
    assert_eq!(item.source, "vikunja:alice");
    assert_eq!(
        item.external_link.as_deref(),
        Some("https://tasks.example/tasks/4")
    );
    // The item's opening, told once for the room and the ticket: the
    // ticket hears that it was picked up.
    let opened: Vec<Tell> = told(&h, 4)
        .into_iter()
        .filter(|m| m.opens_conversation)
        .collect();
    assert_eq!(opened.len(), 1, "{:#?}", h.outbound());
    assert!(
        opened[0]
            .markdown
            .contains("from Vikunja task [#4](https://tasks.example/tasks/4) by alice"),
        "{opened:#?}"
    );
    assert!(opened[0].only.is_empty(), "every channel is told");
    // The same event again (a retried webhook) opens nothing more.
    vikunja(&mut h, 1, "task.created", "alice", task(4, "alice"), None);
    assert_eq!(h.items().len(), 1);

    let mut g = Gates::around(h);
    g.propose(2, &[("host1", "systemctl restart backup.service")]);
    g.classify(3);
    let request: Vec<Tell> = told(&g.h, 4)
        .into_iter()
        .filter(|t| t.kind == TellKind::ApprovalRequest as i32)
        .collect();
    assert_eq!(request.len(), 1, "{:#?}", g.h.outbound());
    assert_eq!(request[0].plan_revision, 1);
    assert!(
        request[0].markdown.contains("`approve rev-1`")
            && request[0]
                .markdown
                .contains("systemctl restart backup.service"),
        "the exact steps and the words that approve them: {}",
        request[0].markdown
    );
    // A stranger's approval and the operator's bare one are refused, and
    // told on the ticket.
    vikunja(
        &mut g.h,
        4,
        "task.comment.created",
        "mallory",
        task(4, "alice"),
        Some((10, "approve rev-1")),
    );
    vikunja(
        &mut g.h,
        5,
        "task.comment.created",
        "alice",
        task(4, "alice"),
        Some((11, "approve")),
    );
    let plan = |g: &Gates| g.h.store.plans(&item.id).unwrap().pop().unwrap();
    assert_eq!(plan(&g).status, PlanStatus::Up);
    // Both are recorded with the reason; the operator is told why theirs
    // did not count, and the stranger's word is data, not answered.
    let refused = g.h.logged(&item.id, |e| match e {
        Event::DecisionRefused { by, reason, .. } => Some((by.clone(), reason.clone())),
        _ => None,
    });
    assert_eq!(refused.len(), 2, "{refused:#?}");
    assert_eq!(refused[0].0, "external:vikunja:mallory");
    assert!(
        refused[1]
            .1
            .contains("on a ticket the revision must be named"),
        "{refused:#?}"
    );
    let refusals = comments(&g.h);
    assert!(
        refusals.iter().any(|c| c
            == "ℹ️ That approval was not applied: on a ticket the revision must be named, as approve rev-N or deny rev-N."),
        "{refusals:#?}"
    );
    assert!(
        !refusals.iter().any(|c| c.contains("mallory")),
        "{refusals:#?}"
    );
    // The operator's named approval binds rev-1, and is echoed on the
    // ticket and in the Matrix thread.
    vikunja(
        &mut g.h,
        6,
        "task.comment.created",
        "alice",
        task(4, "alice"),
        Some((12, "approve rev-1")),
    );
    let p = plan(&g);
    assert_eq!(p.approved_by.as_deref(), Some("operator:vikunja:alice"));
    assert_eq!(p.approved_via.as_deref(), Some("vikunja"));
    // One Tell, for the room and the ticket alike.
    let echo: Vec<Tell> = told(&g.h, 4)
        .into_iter()
        .filter(|t| t.markdown.starts_with("✅ Approved rev-1"))
        .collect();
    assert_eq!(echo.len(), 1, "{:#?}", g.h.outbound());
    assert!(
        echo[0].markdown.contains("operator:vikunja:alice") && echo[0].only.is_empty(),
        "{echo:#?}"
    );
    let said = g.h.logged(&item.id, |e| match e {
        Event::Said {
            text,
            operator,
            via,
            ..
        } if via == "vikunja" => Some((text, operator)),
        _ => None,
    });
    assert_eq!(said.len(), 4, "{said:#?}");
    assert_eq!(said[1], ("approve rev-1".to_string(), false));

    // Abandoned: the ticket is told the result, which closes it.
    g.command(
        7,
        super::harness::OP,
        proto::operator_command::Command::Abandon(proto::Abandon {
            note: "the job ran after all".into(),
        }),
    );
    assert_eq!(g.h.items()[0].state, State::Closed);
    let results: Vec<Tell> = told(&g.h, 4)
        .into_iter()
        .filter(|t| t.kind == TellKind::Result as i32)
        .collect();
    assert_eq!(results.len(), 1, "{results:#?}");
    assert!(
        results[0].markdown.contains("the job ran after all"),
        "{results:#?}"
    );

    // A rebuild tells the same under the same ids.
    let replay = g.h.replay(nisse_core::AgentBrain::new(
        {
            let mut s = settings();
            s.operators.push("vikunja:alice".into());
            s
        },
        super::harness::Desk,
    ));
    let ids = |h: &Harness| {
        h.outbound()
            .into_iter()
            .map(|t| t.envelope.unwrap_or_default().message_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&replay), ids(&g.h));
    let _ = AGENT;
}

#[test]
fn an_approval_on_the_ticket_for_a_revision_no_longer_up_is_refused_naming_the_one_up() {
    let mut h = ticket_brain();
    vikunja(&mut h, 1, "task.created", "alice", task(4, "alice"), None);
    let item = h.items()[0].id.clone();
    let mut g = Gates::around(h);
    g.propose(2, &[("host1", "systemctl restart backup.service")]);
    g.classify(3);
    g.propose(4, &[("host1", "systemctl restart backup.timer")]);
    g.classify(5);
    vikunja(
        &mut g.h,
        6,
        "task.comment.created",
        "alice",
        task(4, "alice"),
        Some((20, "approve rev-1")),
    );
    let plans = g.h.store.plans(&item).unwrap();
    assert!(plans.iter().all(|p| p.approved_by.is_none()), "{plans:#?}");
    let refused = comments(&g.h)
        .into_iter()
        .find(|c| c.contains("was not applied"))
        .expect("the refusal is told on the ticket");
    assert!(refused.contains("rev-2"), "{refused}");
}

#[test]
fn a_task_whose_item_closed_opens_a_new_item_when_assigned_again_and_its_comments_go_there() {
    let mut h = ticket_brain();
    vikunja(&mut h, 1, "task.created", "alice", task(4, "alice"), None);
    let mut g = Gates::around(h);
    g.command(
        2,
        super::harness::OP,
        proto::operator_command::Command::Abandon(proto::Abandon {
            note: "not now".into(),
        }),
    );
    let first = g.h.items().remove(0);
    assert_eq!(first.state, State::Closed);
    // A comment on the task of a closed item is nobody's.
    vikunja(
        &mut g.h,
        3,
        "task.comment.created",
        "alice",
        task(4, "alice"),
        Some((30, "still there?")),
    );
    // Assigned again (reopened in Vikunja): work again, a new item that
    // takes the task over.
    vikunja(
        &mut g.h,
        4,
        "task.assignee.created",
        "alice",
        task(4, "alice"),
        None,
    );
    let items = g.h.items();
    assert_eq!(items.len(), 2, "{items:#?}");
    let second = items[1].clone();
    assert!(second.state.is_open());
    vikunja(
        &mut g.h,
        5,
        "task.comment.created",
        "alice",
        task(4, "alice"),
        Some((31, "it is back")),
    );
    let said = |id: &str| {
        g.h.logged(id, |e| match e {
            Event::Said { via, text, .. } if via == "vikunja" => Some(text),
            _ => None,
        })
    };
    assert_eq!(said(&first.id).len(), 1, "only the task's own words");
    assert_eq!(
        said(&second.id).last().map(String::as_str),
        Some("it is back")
    );
}

#[test]
fn a_post_on_the_ticket_that_vikunja_refused_is_a_fact_and_the_item_goes_on() {
    let mut h = ticket_brain();
    vikunja(&mut h, 1, "task.created", "alice", task(4, "alice"), None);
    let item = h.items().remove(0);
    assert_eq!(item.state, State::Active);
    let opening = told(&h, 4).remove(0);
    let env = opening.envelope.unwrap_or_default();
    // intake-vikunja answers for what it posts under `tell:<message id>`.
    let answer = VikunjaResult {
        envelope: Some(h.envelope(
            at(2),
            &item.id,
            proto::ActorKind::Service,
            "intake-vikunja",
            format!("vikunja-result:{}", env.message_id),
        )),
        request_id: format!("tell:{}", env.message_id),
        status: VikunjaCallStatus::Failed as i32,
        reason: "Vikunja answered 403: Forbidden".into(),
        http_status: 403,
        ..Default::default()
    };
    h.apply(at(2), AnyMessage::VikunjaResult(answer));
    let now = h.items().remove(0);
    assert_eq!(
        now.state,
        State::Active,
        "the item does not wait on a ticket"
    );
    let facts = h.logged(&item.id, |e| match e {
        Event::Fact { text, .. } if text.contains("Vikunja did not take the ticket's update") => {
            Some(text)
        }
        _ => None,
    });
    assert_eq!(facts.len(), 1, "{facts:#?}");
    assert!(facts[0].contains("403"), "{facts:#?}");
}
