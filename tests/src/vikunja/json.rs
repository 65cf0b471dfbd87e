//! Vikunja's JSON shapes, field for field as its models marshal them
//! (`pkg/models/tasks.go`, `task_comments.go`, `project.go`,
//! `webhooks.go`, `label.go`, `pkg/user/user.go`), and Go's way of
//! writing JSON.
//!
//! Keys come out sorted (serde_json's map), where Go writes a struct's in
//! field order; webhook bodies are sorted in Vikunja too, as their data
//! passes through a `map[string]interface{}`.

use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{CommentRec, HookRec, LabelRec, Permission, ProjectRec, State, TaskRec, UserRec};

/// Go's zero `time.Time`, which Vikunja writes for every unset date.
pub(crate) const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// `t` as Vikunja writes a stored time: RFC 3339, whole seconds, UTC
/// (`service.timezone` defaults to GMT).
pub(crate) fn time(t: OffsetDateTime) -> Value {
    let t = t.to_offset(time::UtcOffset::UTC);
    let t = t.replace_nanosecond(0).unwrap_or(t);
    Value::String(
        t.format(&Rfc3339)
            .unwrap_or_else(|e| unreachable!("every stored time formats as RFC 3339: {e}")),
    )
}

/// An optional date, unset as Go's zero time.
pub(crate) fn opt_time(t: Option<OffsetDateTime>) -> Value {
    t.map_or_else(|| Value::String(ZERO_TIME.into()), time)
}

/// `t` with its nanoseconds, as Go's `time.RFC3339Nano` writes it (the
/// webhook envelope's `time`).
pub(crate) fn time_nano(t: OffsetDateTime) -> String {
    t.to_offset(time::UtcOffset::UTC)
        .format(&Rfc3339)
        .unwrap_or_else(|e| unreachable!("now formats as RFC 3339: {e}"))
}

/// A float as Go's encoder writes it: integral values without a
/// fraction (`0`, not `0.0`).
pub(crate) fn float(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        Value::from(f as i64)
    } else {
        serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
    }
}

/// `value` as Go's `json.Marshal` writes it: compact, with `<`, `>`, `&`
/// and the line and paragraph separators escaped (they can only occur
/// inside strings, so replacing them keeps the JSON equal).
pub(crate) fn go_json(value: &Value) -> String {
    let text = value.to_string();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// A `user.User` as other users see it: no email (`omitempty`, and
/// `GetUserByID` never loads it).
pub(crate) fn user(u: &UserRec) -> Value {
    json!({
        "id": u.id,
        "name": u.name,
        "username": u.username,
        "created": time(u.created),
        "updated": time(u.updated),
    })
}

/// User `id`, or `null` if there is none.
pub(crate) fn user_by_id(state: &State, id: i64) -> Value {
    state.user(id).map_or(Value::Null, user)
}

/// `GET /user`: the user and its settings (`UserWithSettings`), as a
/// local user with Vikunja's default settings.
pub(crate) fn user_with_settings(u: &UserRec) -> Value {
    let mut v = user(u);
    if let Value::Object(map) = &mut v {
        map.insert(
            "settings".into(),
            json!({
                "name": u.name,
                "email_reminders_enabled": true,
                "discoverable_by_name": false,
                "discoverable_by_email": false,
                "overdue_tasks_reminders_enabled": true,
                "overdue_tasks_reminders_time": "09:00",
                "default_project_id": 0,
                "week_start": 0,
                "language": "",
                "timezone": "",
                "frontend_settings": null,
                "extra_settings_links": null,
            }),
        );
        map.insert("deletion_scheduled_at".into(), ZERO_TIME.into());
        map.insert("is_local_user".into(), true.into());
        map.insert("auth_provider".into(), "local".into());
        map.insert("is_admin".into(), false.into());
    }
    v
}

/// A `Label`.
pub(crate) fn label(state: &State, l: &LabelRec) -> Value {
    json!({
        "id": l.id,
        "title": l.title,
        "description": "",
        "hex_color": "",
        "created_by": user_by_id(state, l.created_by),
        "created": time(l.created),
        "updated": time(l.created),
    })
}

/// What a task read may add (`expand`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Expand {
    /// `comments`: the first 50 comments.
    pub(crate) comments: bool,
    /// `comment_count`.
    pub(crate) comment_count: bool,
}

/// A `Task` as `viewer` reads it (`is_favorite` is theirs).
pub(crate) fn task(state: &State, t: &TaskRec, viewer: i64, expand: Expand) -> Value {
    let assignees: Vec<Value> = t
        .assignees
        .iter()
        .filter_map(|id| state.user(*id).map(user))
        .collect();
    let labels: Vec<Value> = t
        .labels
        .iter()
        .filter_map(|id| state.labels.iter().find(|l| l.id == *id))
        .map(|l| label(state, l))
        .collect();
    // Nil slices marshal as null: no assignees, labels, reminders,
    // attachments or reactions are `null`, not `[]`.
    let or_null = |v: Vec<Value>| {
        if v.is_empty() {
            Value::Null
        } else {
            Value::Array(v)
        }
    };
    let mut reminders: Vec<&super::ReminderRec> = t.reminders.iter().collect();
    reminders.sort_by_key(|r| r.reminder);
    let reminders: Vec<Value> = reminders
        .into_iter()
        .map(|r| {
            json!({
                "reminder": opt_time(r.reminder),
                "relative_period": r.relative_period,
                "relative_to": r.relative_to,
            })
        })
        .collect();
    let mut v = json!({
        "id": t.id,
        "title": t.title,
        "description": t.description,
        "done": t.done,
        "done_at": opt_time(t.done_at),
        "due_date": opt_time(t.due_date),
        "reminders": or_null(reminders),
        "project_id": t.project_id,
        "repeat_after": 0,
        "repeat_mode": 0,
        "priority": t.priority,
        "start_date": opt_time(t.start_date),
        "end_date": opt_time(t.end_date),
        "assignees": or_null(assignees),
        "labels": or_null(labels),
        "hex_color": t.hex_color,
        "percent_done": float(t.percent_done),
        "identifier": state.identifier(t),
        "index": t.index,
        "related_tasks": {},
        "attachments": null,
        "cover_image_attachment_id": 0,
        "is_favorite": t.favorites.contains(&viewer),
        "created": time(t.created),
        "updated": time(t.updated),
        "bucket_id": 0,
        "position": 0,
        "reactions": null,
        "created_by": user_by_id(state, t.created_by),
    });
    if let Value::Object(map) = &mut v {
        if expand.comments {
            let comments: Vec<Value> = state
                .comments
                .iter()
                .filter(|c| c.task_id == t.id)
                .take(super::MAX_ITEMS_PER_PAGE)
                .map(|c| comment(state, c))
                .collect();
            // Only set when the task has comments (`omitempty`).
            if !comments.is_empty() {
                map.insert("comments".into(), Value::Array(comments));
            }
        }
        if expand.comment_count {
            let count = state.comments.iter().filter(|c| c.task_id == t.id).count();
            map.insert("comment_count".into(), count.into());
        }
    }
    v
}

/// A `TaskComment`: its author under `author`, no task id.
pub(crate) fn comment(state: &State, c: &CommentRec) -> Value {
    json!({
        "id": c.id,
        "comment": c.comment,
        "author": user_by_id(state, c.author_id),
        "reactions": null,
        "created": time(c.created),
        "updated": time(c.updated),
    })
}

/// A `Project`, with `max_permission` the reader's (0 where Vikunja
/// does not work it out, as in webhook payloads).
pub(crate) fn project(state: &State, p: &ProjectRec, max_permission: Option<Permission>) -> Value {
    json!({
        "id": p.id,
        "title": p.title,
        "description": p.description,
        "identifier": p.identifier,
        "hex_color": "",
        "parent_project_id": 0,
        "owner": user_by_id(state, p.owner_id),
        "is_archived": false,
        "background_information": null,
        "background_blur_hash": "",
        "is_favorite": false,
        // calculateDefaultPosition: id * 2^16 until someone moves it.
        "position": p.id * 65536,
        "views": [],
        "max_permission": max_permission.map_or(0, Permission::number),
        "created": time(p.created),
        "updated": time(p.updated),
    })
}

/// A `Webhook`, its secret and basic-auth credentials masked as Vikunja
/// masks them (write-only).
pub(crate) fn webhook(state: &State, h: &HookRec) -> Value {
    json!({
        "id": h.id,
        "target_url": h.target_url,
        "events": h.events,
        "project_id": h.project_id,
        "user_id": 0,
        "secret": "",
        "basic_auth_user": "",
        "basic_auth_password": "",
        "created_by": user_by_id(state, h.created_by),
        "created": time(h.created),
        "updated": time(h.created),
    })
}

/// `GET /info`, with Vikunja's defaults.
pub(crate) fn info(base_url: &str) -> Value {
    json!({
        "version": super::VIKUNJA_VERSION,
        "frontend_url": format!("{base_url}/"),
        "motd": "",
        "link_sharing_enabled": true,
        "max_file_size": "20MB",
        "max_items_per_page": super::MAX_ITEMS_PER_PAGE,
        "available_migrators": ["vikunja-file", "ticktick", "wekan", "csv", "planka"],
        "task_attachments_enabled": true,
        "enabled_background_providers": ["upload"],
        "totp_enabled": true,
        "legal": {"imprint_url": "", "privacy_policy_url": ""},
        "caldav_enabled": true,
        "auth": {
            "local": {"enabled": true, "registration_enabled": true},
            "ldap": {"enabled": false},
            "openid_connect": {"enabled": false, "providers": null},
        },
        "email_reminders_enabled": false,
        "user_deletion_enabled": true,
        "task_comments_enabled": true,
        "demo_mode_enabled": false,
        "webhooks_enabled": true,
        "public_teams_enabled": false,
        "allow_icon_changes": true,
        "enabled_pro_features": [],
        "concurrent_writes": false,
    })
}
