//! Vikunja's JSON, as its `/api/v1` and its webhook payloads write it
//! (`pkg/models/tasks.go`, `task_comments.go`, `pkg/user/user.go`),
//! holding only the fields this service reads, and how each becomes the
//! bus's contract types.
//!
//! Webhook payloads embed the API's own Task, TaskComment and User, so one
//! set of shapes serves both. Vikunja writes `null` for an empty list
//! (`assignees`, `labels`), so lists are read as optional. Times are
//! RFC 3339 (Go's `time.Time`); an unset date is Go's zero time, never
//! null. Ids are int64 everywhere.

use serde::{Deserialize, Deserializer};
use time::OffsetDateTime;

use nisse_proto::v1::{VikunjaComment, VikunjaTask};

/// A Vikunja account (`user.User`).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct User {
    #[serde(default)]
    pub id: i64,
    /// What everything names accounts by.
    #[serde(default)]
    pub username: String,
}

impl User {
    /// Whether this is `account` (usernames compared without regard to
    /// case, as Vikunja's login does).
    pub(crate) fn is(&self, account: &str) -> bool {
        !self.username.is_empty() && self.username.eq_ignore_ascii_case(account)
    }
}

/// A label (`models.Label`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Label {
    #[serde(default)]
    pub title: String,
}

/// A task (`models.Task`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Task {
    pub id: i64,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub done: bool,
    #[serde(default)]
    pub project_id: i64,
    #[serde(default)]
    pub index: i64,
    #[serde(default)]
    pub identifier: String,
    #[serde(default, deserialize_with = "nullable")]
    pub assignees: Vec<User>,
    #[serde(default, deserialize_with = "nullable")]
    pub labels: Vec<Label>,
    #[serde(default)]
    pub created_by: Option<User>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub created: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub updated: Option<OffsetDateTime>,
}

/// A comment on a task (`models.TaskComment`): its task is known from
/// where it was read, not from the comment.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Comment {
    pub id: i64,
    #[serde(default)]
    pub comment: String,
    #[serde(default)]
    pub author: Option<User>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub created: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub updated: Option<OffsetDateTime>,
}

/// Vikunja's error body: `{"code": 4002, "message": "…"}` (`code` absent
/// on the router's own errors).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ApiError {
    #[serde(default)]
    pub code: i64,
    #[serde(default)]
    pub message: String,
}

/// A list Vikunja may write as `null`.
fn nullable<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// `t` as RFC 3339 in UTC (`2026-08-01T10:00:00Z`), as ids and filters
/// write it; empty for none.
pub(crate) fn rfc3339(t: Option<OffsetDateTime>) -> String {
    t.and_then(|t| {
        t.to_offset(time::UtcOffset::UTC)
            .format(&time::format_description::well_known::Rfc3339)
            .ok()
    })
    .unwrap_or_default()
}

/// `t` as a protobuf timestamp.
pub(crate) fn timestamp(t: Option<OffsetDateTime>) -> Option<prost_types::Timestamp> {
    t.map(|t| prost_types::Timestamp {
        seconds: t.unix_timestamp(),
        nanos: i32::try_from(t.nanosecond()).unwrap_or(0),
    })
}

fn username(user: Option<&User>) -> String {
    user.map(|u| u.username.clone()).unwrap_or_default()
}

impl Task {
    /// Whether `account` created it.
    pub(crate) fn by(&self, account: &str) -> bool {
        self.created_by.as_ref().is_some_and(|u| u.is(account))
    }

    /// The contract's task, its link under `frontend` (where a browser
    /// opens Vikunja).
    pub(crate) fn to_proto(&self, frontend: &str) -> VikunjaTask {
        VikunjaTask {
            id: self.id,
            project_id: self.project_id,
            index: self.index,
            identifier: self.identifier.clone(),
            title: self.title.clone(),
            description: crate::markdown::to_text(&self.description),
            done: self.done,
            created_by: username(self.created_by.as_ref()),
            assignees: self.assignees.iter().map(|u| u.username.clone()).collect(),
            labels: self.labels.iter().map(|l| l.title.clone()).collect(),
            created: timestamp(self.created),
            updated: timestamp(self.updated),
            url: format!("{frontend}/tasks/{}", self.id),
        }
    }
}

impl Comment {
    /// Whether `account` wrote it.
    pub(crate) fn by(&self, account: &str) -> bool {
        self.author.as_ref().is_some_and(|u| u.is(account))
    }

    /// The contract's comment.
    pub(crate) fn to_proto(&self) -> VikunjaComment {
        VikunjaComment {
            id: self.id,
            author: username(self.author.as_ref()),
            comment: crate::markdown::to_text(&self.comment),
            created: timestamp(self.created),
            updated: timestamp(self.updated),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_task_as_vikunja_serializes_it() {
        // `pkg/webtests/task_collection_test.go`'s shape, trimmed.
        let task: Task = serde_json::from_str(
            r##"{"id":12,"title":"Backups on nas01","description":"<p>Check them.</p>",
            "done":false,"done_at":"0001-01-01T00:00:00Z","due_date":"0001-01-01T00:00:00Z",
            "reminders":null,"project_id":3,"repeat_after":0,"repeat_mode":0,"priority":0,
            "assignees":null,"labels":null,"hex_color":"","percent_done":0,
            "identifier":"#4","index":4,"related_tasks":{},"attachments":null,
            "cover_image_attachment_id":0,"is_favorite":false,
            "created":"2026-08-01T10:00:00+02:00","updated":"2026-08-01T10:05:00+02:00",
            "bucket_id":0,"position":0,"reactions":null,
            "created_by":{"id":2,"name":"","username":"alice","created":"2026-01-01T00:00:00Z","updated":"2026-01-01T00:00:00Z"}}"##,
        )
        .unwrap();
        assert!(task.assignees.is_empty() && task.labels.is_empty());
        assert!(task.by("Alice"));
        let p = task.to_proto("https://tasks.example.org");
        assert_eq!(p.url, "https://tasks.example.org/tasks/12");
        assert_eq!((p.project_id, p.index, p.identifier.as_str()), (3, 4, "#4"));
        assert_eq!(p.created_by, "alice");
        assert_eq!(p.updated.unwrap().seconds, 1_785_571_500);
        assert_eq!(rfc3339(task.updated), "2026-08-01T08:05:00Z");
    }
}
