//! Vikunja tickets as work items' external records (seed Nisse O5), for
//! any agent whose intake-vikunja serves it.
//!
//! - A task created, or assigned, by an allowlisted operator
//!   (`vikunja:<username>`) opens a work item linked to it (one open item
//!   per task, fingerprint `vikunja:<task id>`), the task's words the
//!   operator's; the agent's duties start it as they start an item the
//!   operator opened from the CLI. Anyone else's tasks are not work.
//! - Comments on the task are `said` on its item, via `vikunja`: an
//!   operator's are instructions (talk wakes an item waiting on them),
//!   anyone else's data. `approve rev-N` and `deny rev-N [reason]` go
//!   through the same approval binding as Matrix and the CLI; on a ticket
//!   the revision must be named, so a bare `approve` or `deny` is refused
//!   with the reason, on the ticket.
//! - The agent writes back what the operator following the ticket needs:
//!   the item being worked on, waiting on them (and why), a plan revision up
//!   for approval (with the words that approve it there), every approval,
//!   denial or refused decision (whichever channel it came by), and at
//!   the end the task marked done with the outcome. Each is a Vikunja
//!   call whose request id is derived from the log event it tells, so a
//!   rebuild sends the same ones and intake-vikunja makes each once.

use serde::{Deserialize, Serialize};

use nisse_bus::proto::{self, VikunjaCallStatus, VikunjaEvent, VikunjaRequest, VikunjaResult};

use super::{BrainSettings, Duties};
use crate::conversation::{Command as C, Said, read};
use crate::log::{Actor, ActorKind, Event, LoggedEvent};
use crate::plans::{Decision, Origin};
use crate::store::{StoreError, Txn};
use crate::work::{NewItem, State, Transition, WorkItem};

/// The channel, in the allowlist (`vikunja:<username>`) and in `via`.
const CHANNEL: &str = "vikunja";
/// The duty-table record linking an item to its task.
const TICKET_RECORD: &str = "ticket.item.";
/// The prefix of every request id the ticket write-back sends.
const REQUEST_PREFIX: &str = "ticket:";

/// What an item knows of its ticket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ticket {
    pub task_id: i64,
    pub project_id: i64,
    /// What people call it (`#12`).
    pub identifier: String,
    pub url: String,
}

fn ticket_key(item_id: &str) -> String {
    format!("{TICKET_RECORD}{item_id}")
}

fn fingerprint(task_id: i64) -> String {
    format!("vikunja:{task_id}")
}

/// The ticket `item_id` is linked to, if any.
pub(crate) fn ticket_of(txn: &Txn<'_, '_>, item_id: &str) -> Result<Option<Ticket>, StoreError> {
    txn.duty_state(&ticket_key(item_id))?
        .map(|s| {
            serde_json::from_str(&s)
                .map_err(|e| StoreError::Corrupt(format!("the ticket record of {item_id}: {e}")))
        })
        .transpose()
}

/// Whether `request_id` is one of the ticket write-back's.
pub(super) fn claims(request_id: &str) -> bool {
    request_id.starts_with(REQUEST_PREFIX)
}

/// Applies one event from Vikunja.
pub(super) fn apply(
    settings: &BrainSettings,
    duties: &mut impl Duties,
    txn: &mut Txn<'_, '_>,
    event: &VikunjaEvent,
) -> Result<(), StoreError> {
    let Some(task) = &event.task else {
        return Ok(());
    };
    let operator = settings.is_operator(CHANNEL, &event.doer);
    let actor = Actor {
        kind: if operator {
            ActorKind::Operator
        } else {
            ActorKind::External
        },
        id: format!("{CHANNEL}:{}", event.doer),
    };
    let open = txn.open_item_by_fingerprint(&fingerprint(task.id))?;
    match (event.event.as_str(), open) {
        ("task.created" | "task.assignee.created", None) if operator && !task.done => {
            open_for_ticket(settings, duties, txn, event, task, &actor)
        }
        ("task.comment.created", Some(item)) => {
            let Some(comment) = &event.comment else {
                return Ok(());
            };
            comment_on(settings, txn, &item, comment, operator, &actor)
        }
        ("task.updated", Some(item)) if task.done => {
            txn.append(
                &item.id,
                &actor,
                &Event::Fact {
                    text: format!(
                        "{} marked the task {} done in Vikunja",
                        event.doer, task.identifier
                    ),
                    data: serde_json::json!({ "ticket_done_by": event.doer, "task": task.id }),
                },
            )?;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// An operator's task becomes a work item, linked to it.
fn open_for_ticket(
    settings: &BrainSettings,
    duties: &mut impl Duties,
    txn: &mut Txn<'_, '_>,
    event: &VikunjaEvent,
    task: &proto::VikunjaTask,
    by: &Actor,
) -> Result<(), StoreError> {
    let item = txn.open_item(
        NewItem {
            title: task.title.trim().to_string(),
            scope: String::new(),
            source: by.id.clone(),
            fingerprint: Some(fingerprint(task.id)),
            external_link: crate::markdown::link_target(&task.url),
            severity: None,
            priority: 1,
            id_seed: nisse_bus::Decode::envelope(&nisse_bus::AnyMessage::InVikunja(event.clone()))
                .message_id
                .clone(),
        },
        by,
    )?;
    let ticket = Ticket {
        task_id: task.id,
        project_id: task.project_id,
        identifier: task.identifier.clone(),
        url: task.url.clone(),
    };
    let json = serde_json::to_string(&ticket)
        .map_err(|e| StoreError::Corrupt(format!("the ticket record: {e}")))?;
    txn.set_duty_state(&ticket_key(&item.id), &json)?;
    // The request in the task's own words: the operator's when an operator
    // created it, data otherwise.
    let author = settings.is_operator(CHANNEL, &task.created_by);
    let said = txn.append(
        &item.id,
        &Actor {
            kind: if author {
                ActorKind::Operator
            } else {
                ActorKind::External
            },
            id: format!("{CHANNEL}:{}", task.created_by),
        },
        &Event::Said {
            via: CHANNEL.into(),
            text: format!("{}\n\n{}", task.title.trim(), task.description.trim()),
            operator: author,
            read_as: "ticket".into(),
        },
    )?;
    let queue = txn.queue()?;
    let ahead = match queue.iter().position(|i| i.id == item.id).unwrap_or(0) {
        0 => "nothing ahead".to_string(),
        n => format!("{n} ahead"),
    };
    let link = match crate::markdown::link_target(&task.url) {
        Some(url) => format!("[{}]({url})", crate::markdown::md_escape(&task.identifier)),
        None => crate::markdown::md_escape(&task.identifier),
    };
    txn.say(
        &settings.agent,
        &item,
        said,
        crate::say::Say::thread_root(format!(
            "🎫 Item **#{}**: “{}”, from Vikunja task {link} by {}; {ahead}.",
            item.number,
            crate::markdown::md_escape(&item.title),
            crate::markdown::md_escape(&event.doer),
        )),
    )?;
    duties.operator_opened(settings, txn, &item, &[])
}

/// A comment on an item's ticket.
fn comment_on(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    item: &WorkItem,
    comment: &proto::VikunjaComment,
    operator: bool,
    actor: &Actor,
) -> Result<(), StoreError> {
    let names: Vec<&str> = settings.names.iter().map(String::as_str).collect();
    let said = read(&comment.comment, &names);
    let read_as = match &said {
        Said::Command(_) => "command",
        Said::Question => "question",
        Said::Remember => "remember",
        Said::ForSomeoneElse(_) => "for-someone-else",
        Said::Talk => "talk",
    };
    txn.append(
        &item.id,
        actor,
        &Event::Said {
            via: CHANNEL.into(),
            text: comment.comment.clone(),
            operator,
            read_as: read_as.into(),
        },
    )?;
    let origin = Origin {
        actor,
        via: CHANNEL,
        allowed: operator,
    };
    let plans = settings.plans();
    match said {
        Said::Command(C::Approve(Some(rev))) => {
            txn.plan_decision(plans, item, origin, Decision::Approve(Some(rev)))?;
        }
        Said::Command(C::Deny(Some(rev), reason)) => {
            txn.plan_decision(plans, item, origin, Decision::Deny(Some(rev), reason))?;
        }
        // On a ticket the revision must be named: the comment may be read
        // long after another revision went up.
        Said::Command(C::Approve(None) | C::Deny(None, _)) => {
            let approve = matches!(said, Said::Command(C::Approve(None)));
            txn.append(
                &item.id,
                actor,
                &Event::DecisionRefused {
                    named: None,
                    by: actor.to_string(),
                    via: CHANNEL.into(),
                    approve,
                    reason:
                        "on a ticket the revision must be named, as approve rev-N or deny rev-N"
                            .into(),
                },
            )?;
        }
        Said::Talk if operator => {
            if item.state == State::WaitingOnOperator {
                txn.transition(
                    &item.id,
                    Transition::OperatorAnswered,
                    "the operator answered on the ticket",
                    actor,
                )?;
            }
            txn.loop_operator_said(item, &comment.comment)?;
        }
        // Questions, status and the rest are for the chat and the CLI.
        _ => {}
    }
    Ok(())
}

/// After every message: what happened to ticketed items in it, written
/// back to their tickets.
pub(super) fn write_back(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
) -> Result<(), StoreError> {
    let caused = txn.events_caused()?;
    for event in caused {
        let Some(ticket) = ticket_of(txn, &event.work_item_id)? else {
            continue;
        };
        let Some((text, done)) = tell(&event) else {
            continue;
        };
        let request_id = format!("{REQUEST_PREFIX}{}:{}", event.work_item_id, event.id);
        let call = if done {
            proto::vikunja_request::Call::SetDone(proto::VikunjaSetDone {
                task_id: ticket.task_id,
                done: true,
                note: text,
            })
        } else {
            proto::vikunja_request::Call::Comment(proto::VikunjaCommentCall {
                task_id: ticket.task_id,
                comment: text,
            })
        };
        let request = VikunjaRequest {
            envelope: Some(txn.agent_envelope(
                &settings.agent,
                &event.work_item_id,
                format!("vikunja:{request_id}"),
            )),
            request_id,
            call: Some(call),
        };
        txn.emit(&request)?;
    }
    Ok(())
}

/// What a ticket's followers are told of `event` (Markdown), and whether
/// it ends the task.
fn tell(event: &LoggedEvent) -> Option<(String, bool)> {
    let md = crate::markdown::md_escape;
    Some(match &event.event {
        Event::StateChanged { to, reason, .. } => match to {
            State::Active => ("🔧 The agent is working on it.".into(), false),
            State::WaitingOnOperator => (format!("⏳ Waiting on you: {}.", md(reason)), false),
            State::Blocked => (format!("⛔ Blocked: {}.", md(reason)), false),
            State::Closed => (format!("✅ Done: {}.", md(reason)), true),
            State::Ready => return None,
        },
        Event::ApprovalRequested { revision, .. } => (
            format!(
                "📋 Plan rev-{revision} is up for approval: comment `approve rev-{revision}` to run it, or `deny rev-{revision} <reason>`."
            ),
            false,
        ),
        Event::Approved {
            revision, by, via, ..
        } => (
            format!("👍 rev-{revision} approved by {} via {}.", md(by), md(via)),
            false,
        ),
        Event::Denied {
            revision,
            by,
            via,
            reason,
        } => (
            format!(
                "👎 rev-{revision} denied by {} via {}: {}.",
                md(by),
                md(via),
                md(reason)
            ),
            false,
        ),
        Event::DecisionRefused {
            by,
            via,
            reason,
            approve,
            ..
        } => (
            format!(
                "🚫 {} from {} via {} refused: {}.",
                if *approve { "An approval" } else { "A denial" },
                md(by),
                md(via),
                md(reason)
            ),
            false,
        ),
        _ => return None,
    })
}

/// intake-vikunja answered one of the write-back's calls: a failure is a
/// fact on the item (the ticket is its record, not its lifeline: the
/// work goes on).
pub(super) fn result(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    result: &VikunjaResult,
) -> Result<(), StoreError> {
    let status = VikunjaCallStatus::try_from(result.status).unwrap_or_default();
    if status == VikunjaCallStatus::Done {
        return Ok(());
    }
    let item_id =
        nisse_bus::Decode::envelope(&nisse_bus::AnyMessage::VikunjaResult(result.clone()))
            .work_item_id
            .clone();
    if txn.item(&item_id)?.is_none() {
        return Ok(());
    }
    txn.append(
        &item_id,
        &Actor::agent(&settings.agent),
        &Event::Fact {
            text: format!("Vikunja did not take the ticket's update: {}", result.reason),
            data: serde_json::json!({ "ticket_failed": result.request_id, "http_status": result.http_status }),
        },
    )?;
    Ok(())
}
