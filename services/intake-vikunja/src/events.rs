//! What the webhook receiver and the poll both make of Vikunja: the
//! `VikunjaEvent`s, their ids, and storing each once.
//!
//! **Ids say what a message is**, so the same change seen twice (a
//! delivery retried or replayed, a webhook and the poll) is stored once:
//!
//! | event | id |
//! | --- | --- |
//! | `task.created` | `vikunja:task:<task id>:created` |
//! | `task.updated` | `vikunja:task:<task id>:updated:<task.updated>` |
//! | `task.assignee.created` | `vikunja:task:<task id>:assignee:<user id>` |
//! | `task.comment.created` | `vikunja:comment:<comment id>` |
//! | `task.comment.edited` | `vikunja:comment:<comment id>:<comment.updated>` |
//!
//! Times are RFC 3339 in UTC, as Vikunja keeps them (whole seconds).
//! Vikunja sends no delivery id and its envelope's `time` is when the
//! payload was built (a retry before v2.3 builds a new one), so neither is
//! in an id: the ids are the ones Vikunja's own objects give (what the
//! spec of its webhooks recommends), and the poll finds the same ones. An
//! assignment is one per task and assignee: assigned again after being
//! unassigned, the task's `task.updated` says so, the assignment's id is
//! the first one's.
//!
//! **Stored once**: JetStream drops a repeated id within its duplicate
//! window; beyond it, the event's record in the bucket
//! ([`crate::records::EventRecord`], written after the ack) refuses it.

use std::time::Duration;

use prost::Message as _;
use time::OffsetDateTime;

use nisse_bus::{AgentName, Bus};
use nisse_proto::v1::{Actor, ActorKind, Envelope, VikunjaEvent, VikunjaSource};

use crate::records::{self, EventRecord};
use crate::shapes::rfc3339;

/// A task was made (`TaskCreatedEvent`).
pub(crate) const TASK_CREATED: &str = "task.created";
/// A task was changed: its fields, its done state, and also its
/// assignees, labels and place on a board (`TaskUpdatedEvent`).
pub(crate) const TASK_UPDATED: &str = "task.updated";
/// Someone was assigned to a task (`TaskAssigneeCreatedEvent`).
pub(crate) const TASK_ASSIGNEE_CREATED: &str = "task.assignee.created";
/// A comment was made (`TaskCommentCreatedEvent`).
pub(crate) const TASK_COMMENT_CREATED: &str = "task.comment.created";
/// A comment was changed (`TaskCommentUpdatedEvent`).
pub(crate) const TASK_COMMENT_EDITED: &str = "task.comment.edited";

/// The events this service takes: what the project's webhook should send.
pub const EVENTS: [&str; 5] = [
    TASK_CREATED,
    TASK_UPDATED,
    TASK_ASSIGNEE_CREATED,
    TASK_COMMENT_CREATED,
    TASK_COMMENT_EDITED,
];

/// Room kept for the headers a message is published with (its dedup id,
/// its type, the trace) beside its payload.
const HEADER_ROOM: usize = 1024;

/// Longest wait for JetStream to store an event.
pub(crate) const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// The id of a task's creation.
pub(crate) fn created_id(task: i64) -> String {
    format!("vikunja:task:{task}:created")
}

/// The id of a change of a task: the task and the time Vikunja says it
/// changed.
pub(crate) fn updated_id(task: i64, updated: OffsetDateTime) -> String {
    format!("vikunja:task:{task}:updated:{}", rfc3339(Some(updated)))
}

/// The id of user `user`'s assignment to a task.
pub(crate) fn assignee_id(task: i64, user: i64) -> String {
    format!("vikunja:task:{task}:assignee:{user}")
}

/// The id of a comment.
pub(crate) fn comment_id(comment: i64) -> String {
    format!("vikunja:comment:{comment}")
}

/// The id of an edit of a comment: the comment and the time of the edit,
/// so each distinct edit has one id and the first version keeps
/// [`comment_id`].
pub(crate) fn comment_edit_id(comment: i64, updated: OffsetDateTime) -> String {
    format!("vikunja:comment:{comment}:{}", rfc3339(Some(updated)))
}

/// The envelope of an event on `agent`'s stream, caused by Vikunja
/// account `doer` (whose words are data until the brain has checked who
/// they are).
pub(crate) fn envelope(agent: &AgentName, doer: &str, message_id: String) -> Envelope {
    Envelope {
        agent: agent.to_string(),
        actor: Some(Actor {
            kind: ActorKind::External as i32,
            // What the poll found has no one it can name: Vikunja's.
            id: if doer.is_empty() {
                "vikunja".to_string()
            } else {
                format!("vikunja:{doer}")
            },
        }),
        message_id,
        ..Envelope::default()
    }
}

/// The message id of `event`.
pub(crate) fn id_of(event: &VikunjaEvent) -> &str {
    event
        .envelope
        .as_ref()
        .map_or("", |e| e.message_id.as_str())
}

/// The encoded size of `event` and the most the NATS server accepts, when
/// it would refuse it as too large (its `max_payload`).
pub(crate) fn too_large(bus: &Bus, event: &VikunjaEvent) -> Option<(usize, usize)> {
    let max = bus.client().server_info().max_payload;
    if max == 0 {
        // Not connected yet: the publish says so.
        return None;
    }
    let len = event.encoded_len();
    (len + HEADER_ROOM > max).then(|| (len, max - HEADER_ROOM.min(max)))
}

/// What storing an event came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// Published now; `duplicate` when JetStream had it already (within
    /// its window), as good as stored.
    Now { duplicate: bool },
    /// Its record says it was stored before: not published again.
    Before,
}

/// Stores `event` once: nothing when its record says it was stored
/// before, else published (waiting for JetStream's ack) and then
/// recorded. An error says what failed; nothing is recorded then, so the
/// event is taken when it comes again.
pub(crate) async fn store(
    bus: &Bus,
    agent: &AgentName,
    event: VikunjaEvent,
) -> Result<Stored, String> {
    let message_id = id_of(&event).to_string();
    if records::event_taken(bus, agent, &message_id)
        .await
        .map_err(|e| format!("cannot read whether {message_id} was stored: {e}"))?
    {
        return Ok(Stored::Before);
    }
    let record = EventRecord {
        message_id: message_id.clone(),
        event: event.event.clone(),
        source: match VikunjaSource::try_from(event.source) {
            Ok(VikunjaSource::Webhook) => "webhook",
            Ok(VikunjaSource::Poll) => "poll",
            _ => "",
        }
        .to_string(),
        taken_ms: records::now_ms(),
    };
    let published = match tokio::time::timeout(PUBLISH_TIMEOUT, bus.publish(event)).await {
        Ok(Ok(published)) => published,
        Ok(Err(e)) => return Err(format!("{message_id} was not stored: {e}")),
        Err(_) => {
            return Err(format!(
                "JetStream did not store {message_id} within {}",
                humantime::format_duration(PUBLISH_TIMEOUT)
            ));
        }
    };
    // Only now: an event that was not stored must be taken when it comes
    // again. Written already means the other way (or a second delivery at
    // once) got there first, with the same event.
    records::take_event(bus, agent, &record)
        .await
        .map_err(|e| format!("{message_id} is stored, but its record is not: {e}"))?;
    Ok(Stored::Now {
        duplicate: published.duplicate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_the_objects_and_their_times_in_utc() {
        let at = OffsetDateTime::parse(
            "2026-08-01T10:05:00+02:00",
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        assert_eq!(created_id(12), "vikunja:task:12:created");
        assert_eq!(
            updated_id(12, at),
            "vikunja:task:12:updated:2026-08-01T08:05:00Z"
        );
        assert_eq!(assignee_id(12, 5), "vikunja:task:12:assignee:5");
        assert_eq!(comment_id(40), "vikunja:comment:40");
        assert_eq!(
            comment_edit_id(40, at),
            "vikunja:comment:40:2026-08-01T08:05:00Z"
        );
        let agent: AgentName = "ops".parse().unwrap();
        let e = envelope(&agent, "", created_id(1));
        assert_eq!(e.actor.unwrap().id, "vikunja");
        let e = envelope(&agent, "alice", created_id(1));
        assert_eq!(e.actor.unwrap().id, "vikunja:alice");
    }
}
