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
//! - What the agent tells the operator about a ticketed item (every
//!   [`crate::say::Say`]: the item taken up, questions, a plan revision
//!   up for approval with the words that approve it, every approval,
//!   denial or refused decision whichever channel it came by, the
//!   result) names the ticket among the item's records, and
//!   intake-vikunja posts it there as a comment; the result closes the
//!   task. intake-vikunja answers each under the request id
//!   `tell:<message id>`, so it makes each once and a failure is a fact
//!   here.
//! - An agent may open a task for an item itself ([`Txn::open_ticket`]:
//!   the ops agent does for a finding's item, when configured). Once
//!   intake-vikunja has made it, the item is linked to it as an
//!   operator's task's item is, the ticket is told where the item stands
//!   (a plan up for approval, a question), and from then on it is told
//!   everything like any other.

use serde::{Deserialize, Serialize};

use nisse_bus::proto::{self, VikunjaCallStatus, VikunjaEvent, VikunjaRequest, VikunjaResult};

use super::{BrainSettings, Duties};
use crate::conversation::{Command as C, Said, read};
use crate::log::{Actor, ActorKind, Event};
use crate::plans::{Decision, Origin};
use crate::store::{StoreError, Txn};
use crate::work::{NewItem, State, Transition, WorkItem};

/// The channel, in the allowlist (`vikunja:<username>`) and in `via`.
const CHANNEL: &str = "vikunja";
/// The duty-table record linking an item to its task.
const TICKET_RECORD: &str = "ticket.item.";
/// The duty-table record linking a task to its item: how Vikunja's
/// events about the task find the item, whoever opened the task.
const TASK_RECORD: &str = "ticket.task.";
/// The prefix of the request ids the brain sends intake-vikunja.
const REQUEST_PREFIX: &str = "ticket:";
/// The prefix of the request ids intake-vikunja answers a [`proto::Tell`]
/// it posted under (`tell:<message id>`).
const TELL_PREFIX: &str = "tell:";
/// The end of the request id of the task an agent opens for an item
/// (`ticket:<item>:open`).
const OPEN_SUFFIX: &str = ":open";

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

fn task_key(task_id: i64) -> String {
    format!("{TASK_RECORD}{task_id}")
}

fn fingerprint(task_id: i64) -> String {
    format!("vikunja:{task_id}")
}

/// What a task's record holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct TaskLink {
    item_id: String,
}

/// Links `item_id` to `ticket`, both ways: the item's record (what the
/// write-back tells) and the task's (what Vikunja's events about the task
/// find). The one place either is written.
pub(crate) fn link(
    txn: &mut Txn<'_, '_>,
    item_id: &str,
    ticket: &Ticket,
) -> Result<(), StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(format!("the ticket record: {e}"));
    let json = serde_json::to_string(ticket).map_err(corrupt)?;
    txn.set_duty_state(&ticket_key(item_id), &json)?;
    let json = serde_json::to_string(&TaskLink {
        item_id: item_id.to_string(),
    })
    .map_err(corrupt)?;
    txn.set_duty_state(&task_key(ticket.task_id), &json)
}

/// The open item linked to task `task_id`, if any: at most one, since a
/// task is linked to one item at a time (an item opened for it later, once
/// the last one closed, takes the link over).
fn linked_item(txn: &Txn<'_, '_>, task_id: i64) -> Result<Option<WorkItem>, StoreError> {
    let Some(json) = txn.duty_state(&task_key(task_id))? else {
        return Ok(None);
    };
    let link: TaskLink = serde_json::from_str(&json)
        .map_err(|e| StoreError::Corrupt(format!("the record of task {task_id}: {e}")))?;
    Ok(txn.item(&link.item_id)?.filter(|i| i.state.is_open()))
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

/// The item's records on other channels, for what it is told
/// ([`Txn::say`]): its ticket, if it has one.
pub(crate) fn records(
    txn: &Txn<'_, '_>,
    item_id: &str,
) -> Result<Vec<proto::ChannelRef>, StoreError> {
    Ok(ticket_of(txn, item_id)?
        .map(|t| proto::ChannelRef {
            channel: CHANNEL.into(),
            id: t.task_id.to_string(),
        })
        .into_iter()
        .collect())
}

/// Whether `request_id` is one of the brain's calls to intake-vikunja or
/// a ticket's post of what the operator was told.
pub(super) fn claims(request_id: &str) -> bool {
    request_id.starts_with(REQUEST_PREFIX) || request_id.starts_with(TELL_PREFIX)
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
    // By the task's record, not the fingerprint: a task the agent opened
    // for a finding's item is that item's, whose fingerprint is the
    // finding's.
    let open = linked_item(txn, task.id)?;
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
    link(txn, &item.id, &ticket)?;
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
    let ahead = txn.ahead_of(&item.id)?;
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
    txn.append(
        &item.id,
        actor,
        &Event::Said {
            via: CHANNEL.into(),
            text: comment.comment.clone(),
            operator,
            read_as: said.read_as().into(),
        },
    )?;
    let origin = Origin {
        actor,
        via: CHANNEL,
        allowed: operator,
    };
    let plans = settings.plans();
    match said {
        Said::Command(C::Approve(Some(rev), confirm)) => {
            txn.plan_decision(plans, item, origin, Decision::Approve(Some(rev), confirm))?;
        }
        Said::Command(C::Deny(Some(rev), reason)) => {
            txn.plan_decision(plans, item, origin, Decision::Deny(Some(rev), reason))?;
        }
        // On a ticket the revision must be named: the comment may be read
        // long after another revision went up.
        Said::Command(C::Approve(None, _) | C::Deny(None, _)) => {
            let approve = matches!(said, Said::Command(C::Approve(None, _)));
            let reason = "on a ticket the revision must be named, as approve rev-N or deny rev-N";
            let event = txn.append(
                &item.id,
                actor,
                &Event::DecisionRefused {
                    named: None,
                    by: actor.to_string(),
                    via: CHANNEL.into(),
                    approve,
                    reason: reason.into(),
                },
            )?;
            // Told as any refused decision is (a stranger's bare word is
            // data, not answered: `operator` is checked first).
            if operator {
                txn.say(
                    &settings.agent,
                    item,
                    event,
                    crate::say::Say::fact(format!(
                        "ℹ️ That {} was not applied: {reason}.",
                        if approve { "approval" } else { "denial" },
                    )),
                )?;
            }
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

impl Txn<'_, '_> {
    /// Asks intake-vikunja to open a task for `item` in Vikunja project
    /// `project_id`, titled as the item, `description` (Markdown, rendered
    /// by the agent's code, everything from outside escaped) its text: the
    /// item's record, for an item that has none (the ops agent's for a
    /// finding, when configured). The request id is the item's
    /// (`ticket:<item>:open`), so a rebuild asks the same and the intake
    /// makes one task. Once it is made the item is linked to it (the
    /// shared brain reads the answer); an item that has a ticket already
    /// asks nothing.
    pub fn open_ticket(
        &mut self,
        agent: &str,
        item: &WorkItem,
        project_id: i64,
        description: String,
    ) -> Result<(), StoreError> {
        if ticket_of(self, &item.id)?.is_some() {
            return Ok(());
        }
        let request_id = format!("{REQUEST_PREFIX}{}{OPEN_SUFFIX}", item.id);
        let request = VikunjaRequest {
            envelope: Some(self.agent_envelope(agent, &item.id, format!("vikunja:{request_id}"))),
            request_id,
            call: Some(proto::vikunja_request::Call::CreateTask(
                proto::VikunjaCreateTask {
                    project_id,
                    title: item.title.clone(),
                    description,
                },
            )),
        };
        self.emit(&request)
    }
}

/// intake-vikunja answered a ticket's post of what the operator was told,
/// or the task opened for an item ([`Txn::open_ticket`]). A failure is a fact on the
/// item (the ticket is its record, not its lifeline: the work goes on,
/// and nothing is asked again).
pub(super) fn result(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    result: &VikunjaResult,
) -> Result<(), StoreError> {
    if let Some(item_id) = result
        .request_id
        .strip_prefix(REQUEST_PREFIX)
        .and_then(|rest| rest.strip_suffix(OPEN_SUFFIX))
    {
        return opened(settings, txn, item_id, result);
    }
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

/// The answer to the task opened for `item_id`: made (or found made for
/// the same request), the item is linked to it and the ticket is told
/// what it missed; not made, a fact.
fn opened(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    item_id: &str,
    result: &VikunjaResult,
) -> Result<(), StoreError> {
    let Some(item) = txn.item(item_id)? else {
        return Ok(());
    };
    // Told again (a redelivery, or the intake finding the task it made):
    // the item has its ticket.
    if ticket_of(txn, item_id)?.is_some() {
        return Ok(());
    }
    let me = Actor::agent(&settings.agent);
    let status = VikunjaCallStatus::try_from(result.status).unwrap_or_default();
    let task = result.task.as_ref().filter(|t| t.id > 0);
    let (VikunjaCallStatus::Done, Some(task)) = (status, task) else {
        let said = status
            .as_str_name()
            .trim_start_matches("VIKUNJA_CALL_STATUS_")
            .to_ascii_lowercase();
        let why = match (status, result.reason.trim()) {
            (VikunjaCallStatus::Done, _) => "intake-vikunja named no task it made".to_string(),
            (_, "") => format!("intake-vikunja answered {said}"),
            (_, reason) => format!("{said}: {reason}"),
        };
        txn.append(
            item_id,
            &me,
            &Event::Fact {
                text: format!(
                    "Vikunja did not open a task for it: {why}; the work goes on without one"
                ),
                data: serde_json::json!({
                    "ticket_not_opened": result.request_id,
                    "status": said,
                    "http_status": result.http_status,
                }),
            },
        )?;
        return Ok(());
    };
    let ticket = Ticket {
        task_id: task.id,
        project_id: task.project_id,
        identifier: if task.identifier.is_empty() {
            format!("#{}", task.index)
        } else {
            task.identifier.clone()
        },
        url: task.url.clone(),
    };
    let fact = txn.append(
        item_id,
        &me,
        &Event::Fact {
            text: format!("opened Vikunja task {} for it", ticket.identifier),
            data: serde_json::json!({
                "ticket_opened": task.id,
                "project": task.project_id,
                "url": task.url,
                "adopted": result.adopted,
            }),
        },
    )?;
    let md = crate::markdown::md_escape;
    let named = match crate::markdown::link_target(&ticket.url) {
        Some(url) => format!("[{}]({url})", md(&ticket.identifier)),
        None => md(&ticket.identifier),
    };
    // Told before the link, so the room hears of the task and the task
    // does not hear of itself.
    txn.say(
        &settings.agent,
        &item,
        fact,
        crate::say::Say::fact(format!(
            "🎫 Item **#{}** has its Vikunja task, {named}: what happens to it is told there too.",
            item.number
        )),
    )?;
    link(txn, item_id, &ticket)?;
    catch_up(settings, txn, &item, &ticket)
}

/// Tells a ticket linked to `item` after it opened where the item stands,
/// as the item's other channels were told when it happened: the plan
/// revision up for approval (its request as it was put up, so it can be
/// approved there), else the question it waits on, else, closed, its
/// result. Only the ticket is told (the rest heard it then), under an id
/// derived from the event told, so a rebuild tells the same once.
fn catch_up(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    item: &WorkItem,
    ticket: &Ticket,
) -> Result<(), StoreError> {
    let item = txn.item(&item.id)?.unwrap_or_else(|| item.clone());
    let up = txn
        .current_plan(&item.id)?
        .filter(|p| p.status == crate::plans::PlanStatus::Up)
        .map(|p| p.revision);
    let events = txn.events(&item.id)?;
    let told = events.iter().rev().find_map(|e| match &e.event {
        Event::ApprovalRequested { revision, text, .. } if Some(*revision) == up => {
            Some((e.id, crate::say::Say::approval(text.clone(), *revision)))
        }
        Event::StateChanged { to, reason, .. }
            if up.is_none() && *to == item.state && !item.state.is_open() =>
        {
            Some((
                e.id,
                crate::say::Say::result(format!(
                    "✅ Item **#{}** is closed: {}.",
                    item.number,
                    crate::markdown::md_escape(reason)
                )),
            ))
        }
        Event::StateChanged { to, reason, .. }
            if up.is_none() && *to == item.state && item.state == State::WaitingOnOperator =>
        {
            Some((
                e.id,
                crate::say::Say::question(format!(
                    "⏳ Item **#{}** waits on you: {}.",
                    item.number,
                    crate::markdown::md_escape(reason)
                )),
            ))
        }
        _ => None,
    });
    let Some((event, say)) = told else {
        return Ok(());
    };
    let record = proto::ChannelRef {
        channel: CHANNEL.into(),
        id: ticket.task_id.to_string(),
    };
    txn.tell(
        &settings.agent,
        &item,
        format!("out:{}:{event}:{CHANNEL}", item.id),
        say,
        vec![record],
        vec![CHANNEL.into()],
    )
}

/// A write-back call intake-vikunja did not answer in time: the ticket is
/// the item's record, not its lifeline, so the item does not wait on the
/// operator for it. The log says so; a late answer is kept, and the
/// operator's `retry` applies it (or sends the call again, which the
/// intake makes at most once).
pub(super) fn request_expired(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    overdue: &crate::requests::Overdue,
) -> Result<(), StoreError> {
    if txn.item(&overdue.work_item_id)?.is_none() {
        return Ok(());
    }
    txn.append(
        &overdue.work_item_id,
        &Actor::agent(&settings.agent),
        &Event::Fact {
            text: format!(
                "{}: the ticket may miss this update, and the work goes on (`retry` applies a late answer)",
                overdue.describe()
            ),
            data: serde_json::json!({ "ticket_unanswered": overdue.request_id }),
        },
    )?;
    Ok(())
}
