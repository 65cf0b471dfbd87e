//! A webhook delivery, from Vikunja's payload to the event the stream
//! carries.
//!
//! Vikunja's envelope is `{"event_name", "time", "data"}`
//! (`WebhookPayload`, `pkg/models/listeners.go`); `data` is the event's
//! struct (`pkg/models/events.go`), enriched: `task` reloaded as the doer
//! sees it, `doer` (and `assignee`) reloaded as full users, `project`
//! added (from v1.0). The event's project is the task's `project_id`,
//! which every version carries (a parent project's webhook also fires for
//! its sub-projects, whose tasks name the sub-project).

use serde::Deserialize;
use serde::de::DeserializeOwned;
use time::OffsetDateTime;

use crate::events::{
    self, TASK_ASSIGNEE_CREATED, TASK_COMMENT_CREATED, TASK_COMMENT_EDITED, TASK_CREATED,
    TASK_UPDATED,
};
use crate::problem::{Kind, Problem};
use crate::shapes::{Comment, Task, User};

/// The event named `name`, if this service takes it.
pub(crate) fn classify(name: &str) -> Option<&'static str> {
    events::EVENTS.into_iter().find(|e| *e == name)
}

/// A delivery's payload, read.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    /// Vikunja's event name.
    pub event: &'static str,
    /// The task, as the doer saw it when the payload was built.
    pub task: Task,
    /// Who did it (empty when Vikunja names no one).
    pub doer: User,
    /// The comment, for comment events.
    pub comment: Option<Comment>,
    /// Who was assigned, for `task.assignee.created`.
    pub assignee: Option<User>,
}

#[derive(Deserialize)]
struct Head {
    event_name: String,
}

#[derive(Deserialize)]
struct Payload {
    data: Data,
}

#[derive(Deserialize)]
struct Data {
    task: Task,
    #[serde(default)]
    doer: Option<User>,
    #[serde(default)]
    comment: Option<Comment>,
    #[serde(default)]
    assignee: Option<User>,
}

fn read<T: DeserializeOwned>(body: &[u8], event: &str) -> Result<T, Problem> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            String::new()
        } else {
            format!("{path}: ")
        };
        Problem::new(
            Kind::InvalidJson,
            format!(
                "{at}{} (a `{event}` payload as Vikunja sends it)",
                e.into_inner()
            ),
        )
    })
}

/// The event a delivery names (`event_name`), naming what is wrong when
/// the body is not Vikunja's envelope.
pub(crate) fn event_name(body: &[u8]) -> Result<String, Problem> {
    Ok(read::<Head>(body, "webhook")?.event_name)
}

fn missing(field: &str, event: &str) -> Problem {
    Problem::new(
        Kind::InvalidJson,
        format!("{field}: missing (a `{event}` payload as Vikunja sends it carries it)"),
    )
}

/// Reads the payload of a delivery of `event`, naming the JSON path of
/// what is wrong.
pub(crate) fn parse(event: &'static str, body: &[u8]) -> Result<Parsed, Problem> {
    let data = read::<Payload>(body, event)?.data;
    let parsed = Parsed {
        event,
        doer: data.doer.unwrap_or_default(),
        task: data.task,
        comment: data.comment,
        assignee: data.assignee,
    };
    match event {
        TASK_UPDATED if parsed.task.updated.is_none() => {
            return Err(missing("data.task.updated", event));
        }
        TASK_ASSIGNEE_CREATED if parsed.assignee.is_none() => {
            return Err(missing("data.assignee", event));
        }
        TASK_COMMENT_CREATED | TASK_COMMENT_EDITED if parsed.comment.is_none() => {
            return Err(missing("data.comment", event));
        }
        TASK_COMMENT_EDITED if parsed.comment.as_ref().is_some_and(|c| c.updated.is_none()) => {
            return Err(missing("data.comment.updated", event));
        }
        _ => {}
    }
    Ok(parsed)
}

impl Parsed {
    /// The id of what the delivery says happened (see `crate::events`),
    /// which is also how it is kept once.
    pub(crate) fn message_id(&self) -> String {
        let task = self.task.id;
        let at = |t: Option<OffsetDateTime>| t.unwrap_or(OffsetDateTime::UNIX_EPOCH);
        match self.event {
            TASK_CREATED => events::created_id(task),
            TASK_ASSIGNEE_CREATED => {
                events::assignee_id(task, self.assignee.as_ref().map_or(0, |a| a.id))
            }
            TASK_COMMENT_CREATED => events::comment_id(self.comment.as_ref().map_or(0, |c| c.id)),
            TASK_COMMENT_EDITED => {
                let c = self.comment.as_ref();
                events::comment_edit_id(c.map_or(0, |c| c.id), at(c.and_then(|c| c.updated)))
            }
            _ => events::updated_id(task, at(self.task.updated)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(event: &str, data: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "event_name": event,
            "time": "2026-08-01T10:05:00.924194436+02:00",
            "data": data,
        }))
        .unwrap()
    }

    fn task() -> serde_json::Value {
        serde_json::json!({"id": 12, "title": "Backups", "project_id": 3,
            "created": "2026-08-01T10:00:00Z", "updated": "2026-08-01T10:05:00Z",
            "assignees": null, "labels": null})
    }

    #[test]
    fn only_the_task_events_taken_are_classified() {
        assert_eq!(classify("task.comment.edited"), Some(TASK_COMMENT_EDITED));
        assert_eq!(classify("task.comment.updated"), None);
        assert_eq!(classify("project.updated"), None);
        assert_eq!(classify("task.deleted"), None);
    }

    #[test]
    fn ids_come_from_the_objects_never_the_envelopes_time() {
        let user = serde_json::json!({"id": 5, "username": "alice"});
        let p = parse(
            TASK_ASSIGNEE_CREATED,
            &body(
                "task.assignee.created",
                serde_json::json!({"task": task(), "assignee": {"id": 9, "username": "nisse"}, "doer": user}),
            ),
        )
        .unwrap();
        assert_eq!(p.message_id(), "vikunja:task:12:assignee:9");
        assert_eq!(p.doer.username, "alice");
        let p = parse(
            TASK_UPDATED,
            &body("task.updated", serde_json::json!({"task": task()})),
        )
        .unwrap();
        assert_eq!(
            p.message_id(),
            "vikunja:task:12:updated:2026-08-01T10:05:00Z"
        );
        assert!(p.doer.username.is_empty());
    }

    #[test]
    fn bad_payloads_name_the_field() {
        let p = event_name(b"{\"data\":{}}").unwrap_err();
        assert!(p.detail().contains("event_name"), "{}", p.detail());
        let mut t = task();
        t["id"] = serde_json::json!("twelve");
        let p = parse(
            TASK_CREATED,
            &body("task.created", serde_json::json!({"task": t})),
        )
        .unwrap_err();
        assert_eq!(p.kind(), Kind::InvalidJson);
        assert!(p.detail().starts_with("data.task.id: "), "{}", p.detail());
        let p = parse(
            TASK_COMMENT_CREATED,
            &body("task.comment.created", serde_json::json!({"task": task()})),
        )
        .unwrap_err();
        assert!(
            p.detail().starts_with("data.comment: missing"),
            "{}",
            p.detail()
        );
        let p = parse(TASK_CREATED, b"not json").unwrap_err();
        assert!(
            p.detail().contains("`task.created` payload"),
            "{}",
            p.detail()
        );
    }
}
