//! What changes the stand-in's state, whether an API request or a test's
//! control asked for it: each change is checked as Vikunja checks it (in
//! its order: existence, permission, then the model's own rules), made
//! whole, and announced with the events Vikunja dispatches for it, in
//! its order.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use tokio::sync::oneshot;

use super::json::{self as shapes, Expand};
use super::{CommentRec, LabelRec, Permission, ReminderRec, Shared, State, TaskRec, hooks, now};

/// An error as Vikunja's API answers it: a domain error
/// `{"code", "message"}` (`web.HTTPError`), a validation error with
/// `invalid_fields`, or a framework (echo) error `{"message"}` alone.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: Option<i64>,
    pub(crate) message: String,
    pub(crate) invalid_fields: Option<Vec<String>>,
}

impl ApiError {
    /// A domain error.
    pub(crate) fn new(status: StatusCode, code: i64, message: impl Into<String>) -> Self {
        Self {
            status,
            code: Some(code),
            message: message.into(),
            invalid_fields: None,
        }
    }

    /// A framework error: no `code`.
    pub(crate) fn echo(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            code: None,
            message: message.into(),
            invalid_fields: None,
        }
    }

    /// 412 `ErrCodeInvalidData` naming the fields (`InvalidFieldError`).
    pub(crate) fn invalid_fields(message: impl Into<String>, fields: Vec<String>) -> Self {
        Self {
            status: StatusCode::PRECONDITION_FAILED,
            code: Some(2002),
            message: message.into(),
            invalid_fields: Some(fields),
        }
    }

    /// 400 `ErrInvalidModel`: a body that does not bind.
    pub(crate) fn invalid_model(detail: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            2004,
            format!("Invalid model provided: {detail}"),
        )
    }

    /// 400 for something Vikunja has that the stand-in does not model,
    /// so no client mistakes an ignored request for a result.
    pub(crate) fn not_implemented(what: impl std::fmt::Display) -> Self {
        Self::echo(
            StatusCode::BAD_REQUEST,
            format!("the Vikunja stand-in does not implement {what}"),
        )
    }

    /// 401 code 11, for every missing, unknown or insufficient token.
    pub(crate) fn token() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            11,
            "missing, malformed, expired or otherwise invalid token provided",
        )
    }

    pub(crate) fn task_missing() -> Self {
        Self::new(StatusCode::NOT_FOUND, 4002, "This task does not exist")
    }

    pub(crate) fn project_missing() -> Self {
        Self::new(StatusCode::NOT_FOUND, 3001, "This project does not exist.")
    }

    pub(crate) fn comment_missing() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            4015,
            "This task comment does not exist",
        )
    }

    pub(crate) fn user_missing() -> Self {
        Self::new(StatusCode::NOT_FOUND, 1005, "The user does not exist.")
    }

    /// The handlers' `ErrGenericForbidden` for a failed write check.
    pub(crate) fn forbidden() -> Self {
        Self::new(StatusCode::FORBIDDEN, 0, "Forbidden")
    }

    /// The handlers' `ErrGenericForbidden` for a failed read check.
    pub(crate) fn forbidden_read() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            0,
            "You don't have the permission to see this",
        )
    }

    /// The models' `ErrGenericForbidden`.
    pub(crate) fn not_allowed() -> Self {
        Self::new(StatusCode::FORBIDDEN, 1, "You're not allowed to do this.")
    }

    pub(crate) fn no_project_access() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            7003,
            "This user does not have access to the project.",
        )
    }

    fn already_assigned() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            4021,
            "This user is already assigned to that task.",
        )
    }

    fn title_empty() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            4001,
            "You must provide at least a task title.",
        )
    }

    /// The body Vikunja writes for it.
    pub(crate) fn body(&self) -> Value {
        let mut body = Map::new();
        if let Some(code) = self.code {
            body.insert("code".into(), code.into());
        }
        body.insert("message".into(), self.message.clone().into());
        if let Some(fields) = &self.invalid_fields {
            body.insert("invalid_fields".into(), json!(fields));
        }
        Value::Object(body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.status, &self.body())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.status.as_u16())?;
        if let Some(code) = self.code {
            write!(f, " code {code}")?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(fields) = &self.invalid_fields {
            write!(f, " ({})", fields.join("; "))?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

/// A JSON body as echo writes one: `application/json`, Go's encoding,
/// a trailing newline (`json.Encoder`).
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        format!("{}\n", shapes::go_json(body)),
    )
        .into_response()
}

/// The webhooks a change queued; awaiting it waits until each was
/// attempted once.
#[must_use = "a control waits for its webhooks; an API handler lets them go"]
pub(crate) struct Sent(Vec<oneshot::Receiver<()>>);

impl Sent {
    pub(crate) async fn delivered(self) {
        for wait in self.0 {
            // A stopped worker means the stand-in is going away.
            let _ = wait.await;
        }
    }
}

/// An event a change dispatched, its payload built once the change is
/// whole (Vikunja dispatches on commit and its listener reloads the task,
/// doer and assignee, so every payload shows the state after the change).
struct Pending {
    name: &'static str,
    project: i64,
    doer: i64,
    task: Option<i64>,
    comment: Option<i64>,
    assignee: Option<i64>,
    user: Option<i64>,
}

impl Pending {
    fn task(name: &'static str, project: i64, doer: i64, task: i64) -> Self {
        Self {
            name,
            project,
            doer,
            task: Some(task),
            comment: None,
            assignee: None,
            user: None,
        }
    }
}

/// Builds and queues a delivery of each event to each webhook of its
/// project that takes it (by webhook id, as `WebhookListener` finds
/// them), unless webhooks are disabled.
fn emit(shared: &Shared, state: &State, events: Vec<Pending>) -> Sent {
    let mut waits = Vec::new();
    if !state.hooks_enabled {
        return Sent(waits);
    }
    for event in events {
        let mut hooks: Vec<&super::HookRec> = state
            .hooks
            .iter()
            .filter(|h| h.project_id == event.project && h.events.iter().any(|e| e == event.name))
            .collect();
        if hooks.is_empty() {
            continue;
        }
        hooks.sort_by_key(|h| h.id);
        let mut data = Map::new();
        data.insert("doer".into(), shapes::user_by_id(state, event.doer));
        if let Some(t) = event.task.and_then(|id| state.task(id)) {
            data.insert(
                "task".into(),
                shapes::task(state, t, event.doer, Expand::default()),
            );
        }
        if let Some(c) = event
            .comment
            .and_then(|id| state.comments.iter().find(|c| c.id == id))
        {
            data.insert("comment".into(), shapes::comment(state, c));
        }
        if let Some(a) = event.assignee {
            data.insert("assignee".into(), shapes::user_by_id(state, a));
        }
        if let Some(u) = event.user {
            data.insert("user".into(), shapes::user_by_id(state, u));
        }
        if let Some(p) = state.project(event.project) {
            data.insert("project".into(), shapes::project(state, p, None));
        }
        // One time for all webhooks of the event, as the listener takes
        // `time.Now()` once before it fans out.
        let envelope = json!({
            "event_name": event.name,
            "time": shapes::time_nano(OffsetDateTime::now_utc()),
            "data": Value::Object(data),
        });
        let body = shapes::go_json(&envelope);
        for hook in hooks {
            waits.push(shared.hooks.send(hooks::Outgoing {
                webhook_id: hook.id,
                event: event.name.to_string(),
                body: body.clone(),
            }));
        }
    }
    Sent(waits)
}

/// A reminder as a request gives it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReminderIn {
    pub(crate) reminder: Option<OffsetDateTime>,
    pub(crate) relative_period: i64,
    pub(crate) relative_to: String,
}

/// The fields of a task a create or an update writes (`repeat_*`,
/// `bucket_id` and `cover_image_attachment_id` are refused non-zero
/// before this).
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskFields {
    pub(crate) title: String,
    pub(crate) description: String,
    pub(crate) done: bool,
    pub(crate) due_date: Option<OffsetDateTime>,
    pub(crate) start_date: Option<OffsetDateTime>,
    pub(crate) end_date: Option<OffsetDateTime>,
    pub(crate) priority: i64,
    pub(crate) hex_color: String,
    pub(crate) percent_done: f64,
    /// 0 keeps the task where it is (update only).
    pub(crate) project_id: i64,
    /// User ids, the full set.
    pub(crate) assignees: Vec<i64>,
    pub(crate) reminders: Vec<ReminderIn>,
    pub(crate) is_favorite: bool,
}

impl TaskFields {
    /// What the frontend sends back when it saves task `t` as `viewer`
    /// sees it: every field as it is.
    pub(crate) fn of(t: &TaskRec, viewer: i64) -> Self {
        Self {
            title: t.title.clone(),
            description: t.description.clone(),
            done: t.done,
            due_date: t.due_date,
            start_date: t.start_date,
            end_date: t.end_date,
            priority: t.priority,
            hex_color: t.hex_color.clone(),
            percent_done: t.percent_done,
            project_id: t.project_id,
            assignees: t.assignees.clone(),
            reminders: t
                .reminders
                .iter()
                .map(|r| ReminderIn {
                    reminder: r.reminder,
                    relative_period: r.relative_period,
                    relative_to: r.relative_to.clone(),
                })
                .collect(),
            is_favorite: t.favorites.contains(&viewer),
        }
    }
}

/// `utils.NormalizeHex`: no leading `#`.
fn normalize_hex(hex: &str) -> String {
    hex.trim_start_matches('#').to_string()
}

/// The reminders as `updateReminders` stores them: a relative one's
/// date worked out from the date it is relative to (unset if that is),
/// one per second (the last wins), sorted by date.
fn reminders(
    given: &[ReminderIn],
    due: Option<OffsetDateTime>,
    start: Option<OffsetDateTime>,
    end: Option<OffsetDateTime>,
) -> Result<Vec<ReminderRec>, ApiError> {
    let mut out: Vec<ReminderRec> = Vec::new();
    for r in given {
        let base = match r.relative_to.as_str() {
            "" => {
                if r.relative_period != 0 {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        4022,
                        "Please provide what the reminder date is relative to",
                    ));
                }
                None
            }
            "due_date" => Some(due),
            "start_date" => Some(start),
            "end_date" => Some(end),
            other => {
                return Err(ApiError::not_implemented(format!(
                    "reminders relative to {other:?} (Vikunja has due_date, start_date, end_date)"
                )));
            }
        };
        let reminder = match base {
            None => r.reminder,
            Some(date) => date.map(|d| d + time::Duration::seconds(r.relative_period)),
        };
        let second = reminder.map(OffsetDateTime::unix_timestamp);
        out.retain(|o| o.reminder.map(OffsetDateTime::unix_timestamp) != second);
        out.push(ReminderRec {
            reminder,
            relative_period: r.relative_period,
            relative_to: r.relative_to.clone(),
        });
    }
    out.sort_by_key(|r| r.reminder);
    Ok(out)
}

/// The assignees in `wanted` that `task` does not have yet, checked as
/// `addNewAssigneeByID` checks each (the user exists, can read the
/// project, is not assigned already: a duplicate in `wanted` counts as
/// already assigned).
fn new_assignees(
    state: &State,
    current: &[i64],
    wanted: &[i64],
    project: i64,
) -> Result<Vec<i64>, ApiError> {
    let mut added: Vec<i64> = Vec::new();
    for id in wanted {
        if current.contains(id) {
            continue;
        }
        if state.user(*id).is_none() {
            return Err(ApiError::user_missing());
        }
        if state.permission(*id, project).is_none() {
            return Err(ApiError::no_project_access());
        }
        if added.contains(id) {
            return Err(ApiError::already_assigned());
        }
        added.push(*id);
    }
    Ok(added)
}

/// Creates a task in `project` as `caller` (`PUT /projects/{id}/tasks`);
/// returns its id. Events: per assignee `task.assignee.created` and
/// `task.updated` (made inside the creation), then `task.created`.
pub(crate) fn create_task(
    shared: &Shared,
    caller: i64,
    project: i64,
    fields: TaskFields,
) -> Result<(i64, Sent), ApiError> {
    let mut state = shared.lock();
    if state.project(project).is_none() {
        return Err(ApiError::project_missing());
    }
    if !state.can_write(caller, project) {
        return Err(ApiError::forbidden());
    }
    if fields.title.is_empty() {
        return Err(ApiError::title_empty());
    }
    let added = new_assignees(&state, &[], &fields.assignees, project)?;
    let reminders = reminders(
        &fields.reminders,
        fields.due_date,
        fields.start_date,
        fields.end_date,
    )?;
    let index = state.next_index(project);
    state.next.task += 1;
    let id = state.next.task;
    let at = now();
    state.tasks.push(TaskRec {
        id,
        project_id: project,
        index,
        title: fields.title,
        description: fields.description,
        done: fields.done,
        // createTasks never sets done_at: a task made done has none.
        done_at: None,
        due_date: fields.due_date,
        start_date: fields.start_date,
        end_date: fields.end_date,
        priority: fields.priority,
        percent_done: fields.percent_done,
        hex_color: normalize_hex(&fields.hex_color),
        reminders,
        assignees: added.clone(),
        labels: Vec::new(),
        favorites: if fields.is_favorite {
            vec![caller]
        } else {
            Vec::new()
        },
        created_by: caller,
        created: at,
        updated: at,
    });
    let mut events = Vec::new();
    for a in added {
        events.push(Pending {
            assignee: Some(a),
            ..Pending::task("task.assignee.created", project, caller, id)
        });
        events.push(Pending::task("task.updated", project, caller, id));
    }
    events.push(Pending::task("task.created", project, caller, id));
    let sent = emit(shared, &state, events);
    Ok((id, sent))
}

/// Replaces task `id` with `fields` as `caller` (`POST /tasks/{id}`,
/// `updateSingleTask`): the assignees become exactly `fields.assignees`
/// (the new ones each firing `task.assignee.created` and `task.updated`,
/// removed ones nothing), zero values clear, an empty title keeps the
/// old one, `project_id` 0 keeps the project and another moves the task
/// there with a new index; then `task.updated`.
pub(crate) fn update_task(
    shared: &Shared,
    caller: i64,
    id: i64,
    fields: TaskFields,
) -> Result<Sent, ApiError> {
    let mut state = shared.lock();
    let (old_project, old_assignees, old_done) = match state.task(id) {
        Some(t) => (t.project_id, t.assignees.clone(), t.done),
        None => return Err(ApiError::task_missing()),
    };
    let project = if fields.project_id == 0 {
        old_project
    } else {
        fields.project_id
    };
    if project != old_project {
        if state.project(project).is_none() {
            return Err(ApiError::project_missing());
        }
        if !state.can_write(caller, project) {
            return Err(ApiError::not_allowed());
        }
    }
    if !state.can_write(caller, old_project) {
        return Err(ApiError::forbidden());
    }
    // updateTaskAssignees checks against the task's current project.
    let added = new_assignees(&state, &old_assignees, &fields.assignees, old_project)?;
    let reminders = reminders(
        &fields.reminders,
        fields.due_date,
        fields.start_date,
        fields.end_date,
    )?;
    let new_index = (project != old_project).then(|| state.next_index(project));
    let at = now();
    let Some(t) = state.task_mut(id) else {
        return Err(ApiError::task_missing());
    };
    let mut assignees: Vec<i64> = t
        .assignees
        .iter()
        .copied()
        .filter(|a| fields.assignees.contains(a))
        .collect();
    assignees.extend(added.iter().copied());
    t.assignees = assignees;
    if !fields.title.is_empty() {
        t.title = fields.title;
    }
    t.description = fields.description;
    if !old_done && fields.done {
        t.done_at = Some(at);
    }
    if old_done && !fields.done {
        t.done_at = None;
    }
    t.done = fields.done;
    t.due_date = fields.due_date;
    t.start_date = fields.start_date;
    t.end_date = fields.end_date;
    t.priority = fields.priority;
    t.hex_color = normalize_hex(&fields.hex_color);
    t.percent_done = fields.percent_done;
    t.reminders = reminders;
    if let Some(index) = new_index {
        t.project_id = project;
        t.index = index;
    }
    t.favorites.retain(|u| *u != caller);
    if fields.is_favorite {
        t.favorites.push(caller);
    }
    t.updated = at;
    let mut events = Vec::new();
    for a in added {
        events.push(Pending {
            assignee: Some(a),
            ..Pending::task("task.assignee.created", project, caller, id)
        });
        events.push(Pending::task("task.updated", project, caller, id));
    }
    events.push(Pending::task("task.updated", project, caller, id));
    Ok(emit(shared, &state, events))
}

/// Assigns user `user` to task `task` as `caller`
/// (`PUT /tasks/{id}/assignees`); `task.assignee.created`, then
/// `task.updated`. The task's `updated` moves
/// (`HandleTaskUpdateLastUpdated`).
pub(crate) fn add_assignee(
    shared: &Shared,
    caller: i64,
    task: i64,
    user: i64,
) -> Result<Sent, ApiError> {
    let mut state = shared.lock();
    let Some((project, current)) = state
        .task(task)
        .map(|t| (t.project_id, t.assignees.clone()))
    else {
        return Err(ApiError::task_missing());
    };
    if !state.can_write(caller, project) {
        return Err(ApiError::forbidden());
    }
    if state.user(user).is_none() {
        return Err(ApiError::user_missing());
    }
    if state.permission(user, project).is_none() {
        return Err(ApiError::no_project_access());
    }
    if current.contains(&user) {
        return Err(ApiError::already_assigned());
    }
    let at = now();
    if let Some(t) = state.task_mut(task) {
        t.assignees.push(user);
        t.updated = at;
    }
    let events = vec![
        Pending {
            assignee: Some(user),
            ..Pending::task("task.assignee.created", project, caller, task)
        },
        Pending::task("task.updated", project, caller, task),
    ];
    Ok(emit(shared, &state, events))
}

/// Unassigns `user` from `task` as `caller`
/// (`DELETE /tasks/{id}/assignees/{user}`); `task.assignee.deleted`,
/// then `task.updated`. Vikunja answers success whether or not the user
/// was assigned.
pub(crate) fn remove_assignee(
    shared: &Shared,
    caller: i64,
    task: i64,
    user: i64,
) -> Result<Sent, ApiError> {
    let mut state = shared.lock();
    let Some(project) = state.task(task).map(|t| t.project_id) else {
        return Err(ApiError::task_missing());
    };
    if !state.can_write(caller, project) {
        return Err(ApiError::forbidden());
    }
    let at = now();
    if let Some(t) = state.task_mut(task) {
        t.assignees.retain(|a| *a != user);
        t.updated = at;
    }
    let events = vec![
        Pending {
            assignee: Some(user),
            ..Pending::task("task.assignee.deleted", project, caller, task)
        },
        Pending::task("task.updated", project, caller, task),
    ];
    Ok(emit(shared, &state, events))
}

/// Checks a comment's text as the validator checks `valid:"dbtext,required"`
/// (SQLite's 1 MiB limit).
pub(crate) fn check_comment_text(text: &str) -> Result<(), ApiError> {
    if text.is_empty() {
        return Err(ApiError::invalid_fields(
            "Invalid Data",
            vec!["comment: non zero value required".into()],
        ));
    }
    if text.len() > 1_048_576 {
        return Err(ApiError::invalid_fields(
            "Invalid Data",
            vec![format!("comment: {text} does not validate as dbtext")],
        ));
    }
    Ok(())
}

/// Comments `text` on `task` as `caller` (`PUT /tasks/{id}/comments`,
/// which needs write access); `task.comment.created`, the task's
/// `updated` moving. Returns the comment's id.
pub(crate) fn add_comment(
    shared: &Shared,
    caller: i64,
    task: i64,
    text: &str,
) -> Result<(i64, Sent), ApiError> {
    check_comment_text(text)?;
    let mut state = shared.lock();
    let Some(project) = state.task(task).map(|t| t.project_id) else {
        return Err(ApiError::task_missing());
    };
    if !state.can_write(caller, project) {
        return Err(ApiError::forbidden());
    }
    state.next.comment += 1;
    let id = state.next.comment;
    let at = now();
    state.comments.push(CommentRec {
        id,
        task_id: task,
        author_id: caller,
        comment: text.to_string(),
        created: at,
        updated: at,
    });
    if let Some(t) = state.task_mut(task) {
        t.updated = at;
    }
    let events = vec![Pending {
        comment: Some(id),
        ..Pending::task("task.comment.created", project, caller, task)
    }];
    let sent = emit(shared, &state, events);
    Ok((id, sent))
}

/// Edits comment `comment` on `task` to say `text`, as `caller`, who
/// must be its author and able to write the task
/// (`canUserModifyTaskComment`); `task.comment.edited`, the comment's and
/// the task's `updated` moving.
pub(crate) fn edit_comment(
    shared: &Shared,
    caller: i64,
    task: i64,
    comment: i64,
    text: &str,
) -> Result<Sent, ApiError> {
    check_comment_text(text)?;
    let mut state = shared.lock();
    let Some(project) = state.task(task).map(|t| t.project_id) else {
        return Err(ApiError::task_missing());
    };
    if !state.can_write(caller, project) {
        return Err(ApiError::forbidden());
    }
    let Some(author) = state
        .comments
        .iter()
        .find(|c| c.id == comment && c.task_id == task)
        .map(|c| c.author_id)
    else {
        return Err(ApiError::comment_missing());
    };
    if author != caller {
        return Err(ApiError::forbidden());
    }
    let at = now();
    if let Some(c) = state.comments.iter_mut().find(|c| c.id == comment) {
        c.comment = text.to_string();
        c.updated = at;
    }
    if let Some(t) = state.task_mut(task) {
        t.updated = at;
    }
    let events = vec![Pending {
        comment: Some(comment),
        ..Pending::task("task.comment.edited", project, caller, task)
    }];
    Ok(emit(shared, &state, events))
}

/// Puts the label titled `title` (made by `caller` if no label has that
/// title yet) on `task`, as `caller` (`PUT /tasks/{id}/labels`);
/// `task.updated`. Refused if the task has it already (400 8001).
pub(crate) fn add_label(
    shared: &Shared,
    caller: i64,
    task: i64,
    title: &str,
) -> Result<Sent, ApiError> {
    let mut state = shared.lock();
    let Some(project) = state.task(task).map(|t| t.project_id) else {
        return Err(ApiError::task_missing());
    };
    if !state.can_write(caller, project) {
        return Err(ApiError::forbidden());
    }
    let label = match state.labels.iter().find(|l| l.title == title) {
        Some(l) => l.id,
        None => {
            state.next.label += 1;
            let id = state.next.label;
            state.labels.push(LabelRec {
                id,
                title: title.to_string(),
                created_by: caller,
                created: now(),
            });
            id
        }
    };
    let at = now();
    let Some(t) = state.task_mut(task) else {
        return Err(ApiError::task_missing());
    };
    if t.labels.contains(&label) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            8001,
            "This label already exists on the task.",
        ));
    }
    t.labels.push(label);
    t.updated = at;
    let events = vec![Pending::task("task.updated", project, caller, task)];
    Ok(emit(shared, &state, events))
}

/// Shares `project` with `user` as `permission`, by its owner;
/// `project.shared.user`. Sharing again changes the permission.
pub(crate) fn share_project(
    shared: &Shared,
    project: i64,
    user: i64,
    permission: Permission,
) -> Result<Sent, ApiError> {
    let mut state = shared.lock();
    let Some(owner) = state.project(project).map(|p| p.owner_id) else {
        return Err(ApiError::project_missing());
    };
    if state.user(user).is_none() {
        return Err(ApiError::user_missing());
    }
    let at = now();
    if let Some(p) = state.projects.iter_mut().find(|p| p.id == project) {
        p.shares.retain(|(u, _)| *u != user);
        p.shares.push((user, permission));
        p.updated = at;
    }
    let events = vec![Pending {
        name: "project.shared.user",
        project,
        doer: owner,
        task: None,
        comment: None,
        assignee: None,
        user: Some(user),
    }];
    Ok(emit(shared, &state, events))
}
