//! The REST API the stand-in serves, under `/api/v1`, each route as
//! Vikunja's generic handlers and models answer it (create is `PUT` and
//! answers 201, update is `POST` and answers 200). The token permission
//! each needs (group.permission, as `GET /routes` names them) is in
//! brackets.
//!
//! | route | answers |
//! | --- | --- |
//! | `GET /info` | 200 the instance's info (no token needed) |
//! | `GET /user` | 200 the token's user with its settings [other.user] |
//! | `GET /projects/{id}` | 200 Project, `x-max-permission`; 404 3001; 403 code 0 [projects.read_one] |
//! | `GET /projects/{id}/tasks` | 200 Task[]: `filter`, `filter_include_nulls`, `filter_timezone` (UTC only), `sort_by`, `order_by` ([`super::filter`]), `expand` (`comments`, `comment_count`, `buckets`, `reactions`), `page` (0 for all), `per_page` (at most 50); `x-pagination-total-pages`, `x-pagination-result-count`; 404 3001, 403 7003 [tasks.read_all] |
//! | `PUT /projects/{id}/tasks` | 201 Task, `task.created` (after `task.assignee.created` and `task.updated` per assignee given); 400 4001 without a title; 403 code 0 without write access [tasks.create] |
//! | `GET /tasks/{id}` | 200 Task, `x-max-permission`: `expand` as above; 404 4002; 403 code 0 [tasks.read_one] |
//! | `POST /tasks/{id}` | 200 Task: Vikunja's replace (see [`super::ops`]), `task.updated`; 403 code 0 [tasks.update] |
//! | `GET /tasks/{id}/comments` | 200 TaskComment[] oldest first (`order_by=desc` newest): `s`, `page`, `per_page` [tasks_comments.read_all] |
//! | `PUT /tasks/{id}/comments` | 201 TaskComment, `task.comment.created`; 412 without text [tasks_comments.create] |
//! | `GET /tasks/{id}/comments/{cid}` | 200 TaskComment; 404 4015 [tasks_comments.read_one] |
//! | `POST /tasks/{id}/comments/{cid}` | 200 TaskComment, `task.comment.edited` (its author only, else 403) [tasks_comments.update] |
//! | `GET /tasks/{id}/assignees` | 200 User[]: `s`, `page`, `per_page` [tasks_assignees.read_all] |
//! | `PUT /tasks/{id}/assignees` | 201 `{"user_id", "created"}`, `task.assignee.created` then `task.updated`; 400 4021 assigned already, 403 7003 no access, 404 1005 no such user [tasks_assignees.create] |
//! | `DELETE /tasks/{id}/assignees/{uid}` | 200, `task.assignee.deleted` then `task.updated` [tasks_assignees.delete] |
//! | `GET /projects/{id}/webhooks` | 200 Webhook[] (secrets masked) [projects_webhooks.read_all] |
//! | `PUT /projects/{id}/webhooks` | 201 Webhook: `target_url`, `events`, `secret`, `basic_auth_user`, `basic_auth_password`; 412 naming a bad one [projects_webhooks.create] |
//! | `DELETE /projects/{id}/webhooks/{wid}` | 200 [projects_webhooks.delete] |
//! | `GET /webhooks/events` | 200 the event names, sorted [webhooks.events] |
//!
//! Any other route is 404 `{"message":"Not Found"}` (405 for another
//! method on a route served), and a query parameter a route does not
//! implement is 400 naming it. A body must be JSON
//! (`Content-Type: application/json`, else 415); one that does not bind
//! is 400 2004; unknown fields are ignored, as Vikunja ignores them.
//! Create and update answer the task or comment as a read would show it
//! (Vikunja echoes the merged request body, the same for a client that
//! sends the whole object back).
//!
//! A request a test told the stand-in to refuse
//! ([`super::VikunjaStandIn::refuse_next`]) is answered with that status
//! before anything else, unserved; one whose answer it was told to lose
//! ([`super::VikunjaStandIn::lose_answers`]) is served, then answered
//! with the status.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::filter::{Filter, Sort};
use super::json::{self as shapes, Expand};
use super::ops::{self, ApiError, ReminderIn, TaskFields, json_response};
use super::{ApiRequest, MAX_ITEMS_PER_PAGE, Permission, Shared, WEBHOOK_EVENTS, now};

/// Every route served (method, path as axum matches it), for the token
/// permissions they need.
const ROUTES: [(&str, &str); 18] = [
    ("GET", "/api/v1/user"),
    ("GET", "/api/v1/projects/{project}"),
    ("GET", "/api/v1/projects/{project}/tasks"),
    ("PUT", "/api/v1/projects/{project}/tasks"),
    ("GET", "/api/v1/projects/{project}/webhooks"),
    ("PUT", "/api/v1/projects/{project}/webhooks"),
    ("DELETE", "/api/v1/projects/{project}/webhooks/{webhook}"),
    ("GET", "/api/v1/webhooks/events"),
    ("GET", "/api/v1/tasks/{task}"),
    ("POST", "/api/v1/tasks/{task}"),
    ("GET", "/api/v1/tasks/{task}/comments"),
    ("PUT", "/api/v1/tasks/{task}/comments"),
    ("GET", "/api/v1/tasks/{task}/comments/{comment}"),
    ("POST", "/api/v1/tasks/{task}/comments/{comment}"),
    ("GET", "/api/v1/tasks/{task}/assignees"),
    ("PUT", "/api/v1/tasks/{task}/assignees"),
    ("DELETE", "/api/v1/tasks/{task}/assignees/{user}"),
    ("GET", "/api/v1/info"),
];

/// The one route that needs no token (`unauthenticatedAPIPaths`).
const INFO: &str = "/api/v1/info";

/// The stand-in's routes, behind the authentication and request log.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(INFO, get(info))
        .route("/api/v1/user", get(current_user))
        .route("/api/v1/projects/{project}", get(get_project))
        .route(
            "/api/v1/projects/{project}/tasks",
            get(list_tasks).put(create_task),
        )
        .route(
            "/api/v1/projects/{project}/webhooks",
            get(list_webhooks).put(create_webhook),
        )
        .route(
            "/api/v1/projects/{project}/webhooks/{webhook}",
            delete(delete_webhook),
        )
        .route("/api/v1/webhooks/events", get(webhook_events))
        .route("/api/v1/tasks/{task}", get(get_task).post(update_task))
        .route(
            "/api/v1/tasks/{task}/comments",
            get(list_comments).put(create_comment),
        )
        .route(
            "/api/v1/tasks/{task}/comments/{comment}",
            get(get_comment).post(edit_comment),
        )
        .route(
            "/api/v1/tasks/{task}/assignees",
            get(list_assignees).put(add_assignee),
        )
        .route(
            "/api/v1/tasks/{task}/assignees/{user}",
            delete(remove_assignee),
        )
        .fallback(|| async { ApiError::echo(StatusCode::NOT_FOUND, "Not Found") })
        .method_not_allowed_fallback(|| async {
            ApiError::echo(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
        })
        .layer(middleware::from_fn_with_state(shared.clone(), authenticate))
        .with_state(shared)
}

/// The token permission (group, permission) a route needs, derived as
/// `CollectRoutesForAPITokenUsage` derives it from the route's path and
/// method.
fn route_permission(method: &str, template: &str) -> Option<(String, String)> {
    /// The groups whose routes are plain CRUD (`isStandardCRUDRoute`),
    /// those the stand-in serves among them.
    const CRUD: [&str; 6] = [
        "projects",
        "tasks",
        "webhooks",
        "projects_webhooks",
        "tasks_assignees",
        "tasks_comments",
    ];
    let rest = template.strip_prefix("/api/v1/")?;
    let segments: Vec<&str> = rest.split('/').collect();
    let ends_with_param = segments.last().is_some_and(|s| s.starts_with('{'));
    let parts: Vec<&str> = segments
        .iter()
        .copied()
        .filter(|s| !s.starts_with('{'))
        .collect();
    let mut group = parts.join("_");
    if group == "projects_tasks" {
        group = "tasks".into();
    }
    let crud = CRUD.contains(&group.as_str()) || (parts.len() == 1 && CRUD.contains(&parts[0]));
    if !crud {
        return Some(if parts.len() == 1 {
            ("other".into(), group)
        } else {
            (parts[0].to_string(), parts[1..].join("_"))
        });
    }
    let permission = match method {
        "GET" if ends_with_param => "read_one",
        "GET" => "read_all",
        "PUT" => "create",
        "POST" => "update",
        "DELETE" => "delete",
        _ => return None,
    };
    Some((group, permission.to_string()))
}

/// The route `method` `path` is served by, as [`ROUTES`] writes it.
fn template_of(method: &str, path: &str) -> Option<&'static str> {
    let segments: Vec<&str> = path.split('/').collect();
    ROUTES
        .iter()
        .filter(|(m, _)| *m == method)
        .map(|(_, template)| *template)
        .find(|template| {
            let pattern: Vec<&str> = template.split('/').collect();
            pattern.len() == segments.len()
                && pattern
                    .iter()
                    .zip(&segments)
                    .all(|(p, s)| p == s || (p.starts_with('{') && !s.is_empty()))
        })
}

/// Every (group, permission) a scoped token may be given here.
pub(crate) fn token_permissions() -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = ROUTES
        .iter()
        .filter(|(_, path)| *path != INFO)
        .filter_map(|(method, path)| route_permission(method, path))
        .collect();
    all.sort();
    all.dedup();
    all
}

/// The user a request is made as (set by [`authenticate`]).
#[derive(Clone, Copy)]
struct Caller(i64);

/// How much of a request body the stand-in reads.
const BODY_LIMIT: usize = 16 << 20;

/// Applies the faults a test asked for, checks the token (`Bearer`,
/// for every route under `/api/v1` but `/info`, with the route's
/// permission for a scoped token), runs the route and logs the request.
async fn authenticate(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    let template = template_of(&method, &path);
    let (mut parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .unwrap_or_default();
    let presented: Vec<String> = parts
        .headers
        .get_all("authorization")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.strip_prefix("Bearer "))
        .map(str::to_string)
        .collect();
    let (user, allowed) = {
        let state = shared.lock();
        match presented
            .iter()
            .find_map(|t| state.tokens.iter().find(|r| &r.token == t))
        {
            None => (None, false),
            Some(token) => {
                let allowed = match (&token.permissions, &template) {
                    (None, _) => true,
                    (Some(granted), Some(template)) => route_permission(&method, template)
                        .is_some_and(|(group, perm)| {
                            granted.get(&group).is_some_and(|p| p.contains(&perm))
                        }),
                    // A route that is not served is no route a token
                    // may use.
                    (Some(_), None) => false,
                };
                let user = state
                    .user(token.user_id)
                    .map(|u| (u.id, u.username.clone()));
                (user, allowed)
            }
        }
    };
    let fault = shared.lock().fault(&method, &path);
    let needs_token = path.starts_with("/api/v1/") && path != INFO;
    let mut response = match (fault, &user) {
        (Some((status, retry_after, false)), _) => refusal(status, retry_after),
        (_, None) if needs_token => ApiError::token().into_response(),
        (_, Some(_)) if needs_token && !allowed => ApiError::token().into_response(),
        (_, user) => {
            if let Some((id, _)) = user {
                parts.extensions.insert(Caller(*id));
            }
            next.run(Request::from_parts(parts, Body::from(bytes.clone())))
                .await
        }
    };
    if let Some((status, retry_after, true)) = fault {
        response = refusal(status, retry_after);
    }
    shared.lock().requests.push(ApiRequest {
        method,
        path,
        query,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        user: user.map(|(_, name)| name),
        status: response.status().as_u16(),
    });
    response
}

/// The answer to a request a test had refused or its answer lost.
fn refusal(status: u16, retry_after: Option<u64>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = ApiError::echo(
        status,
        format!(
            "{}: the Vikunja stand-in was told to refuse this request",
            status.canonical_reason().unwrap_or("refused")
        ),
    )
    .into_response();
    if let Some(v) = retry_after.and_then(|s| HeaderValue::from_str(&s.to_string()).ok()) {
        response
            .headers_mut()
            .insert(axum::http::header::RETRY_AFTER, v);
    }
    response
}

type Reply = Result<Response, ApiError>;
type Params = HashMap<String, String>;

fn caller(c: Option<axum::Extension<Caller>>) -> Result<i64, ApiError> {
    c.map(|c| c.0.0).ok_or_else(ApiError::token)
}

/// A numeric path parameter; anything else does not bind (400 2004).
fn id(p: &Params, name: &str) -> Result<i64, ApiError> {
    let raw = p.get(name).map(String::as_str).unwrap_or_default();
    raw.parse().map_err(|_| {
        ApiError::invalid_model(format!(
            "code=400, message=path parameter {name}={raw:?} is not a number"
        ))
    })
}

/// The query string's pairs, repeated names kept (`sort_by`, `expand`).
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(raw: Option<String>) -> Self {
        Self(
            form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
                .into_owned()
                .collect(),
        )
    }

    /// The first value of `name` (echo's `QueryParam`), empty as absent.
    fn first(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Refuses any parameter but `allowed`, naming it.
    fn only(&self, allowed: &[&str]) -> Result<(), ApiError> {
        match self.0.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
            Some((k, _)) => Err(ApiError::not_implemented(format!(
                "the query parameter `{k}` on this route"
            ))),
            None => Ok(()),
        }
    }
}

/// `page` and `per_page` as `ReadAllWeb` reads them.
#[derive(Clone, Copy)]
struct Paging {
    /// 0 returns everything (`getLimitFromPageIndex`).
    page: usize,
    per_page: usize,
}

fn paging(q: &Query) -> Result<Paging, ApiError> {
    let page: i32 = q
        .first("page")
        .unwrap_or("1")
        .parse()
        .map_err(|_| ApiError::echo(StatusCode::BAD_REQUEST, "Bad page requested."))?;
    if page < 0 {
        return Err(ApiError::echo(
            StatusCode::BAD_REQUEST,
            "Page number cannot be negative.",
        ));
    }
    let mut per_page: i32 = match q.first("per_page") {
        None => 0,
        Some(v) => v.parse().map_err(|_| {
            ApiError::echo(StatusCode::BAD_REQUEST, "Bad per page amount requested.")
        })?,
    };
    if per_page == 0 {
        per_page = MAX_ITEMS_PER_PAGE as i32;
    }
    if per_page < 1 {
        return Err(ApiError::echo(
            StatusCode::BAD_REQUEST,
            "Per page amount cannot be negative.",
        ));
    }
    Ok(Paging {
        page: page as usize,
        per_page: (per_page as usize).min(MAX_ITEMS_PER_PAGE),
    })
}

/// A page of `items` with Vikunja's pagination headers: the number of
/// pages (0 when this page is empty) and of items on this page.
fn page_of(items: Vec<Value>, paging: Paging) -> Response {
    let total = items.len();
    let page: Vec<Value> = if paging.page == 0 {
        items
    } else {
        items
            .into_iter()
            .skip((paging.page - 1) * paging.per_page)
            .take(paging.per_page)
            .collect()
    };
    let count = page.len();
    let pages = if count == 0 {
        0
    } else {
        total.div_ceil(paging.per_page)
    };
    let mut response = json_response(StatusCode::OK, &Value::Array(page));
    let headers = response.headers_mut();
    for (name, value) in [
        ("x-pagination-total-pages", pages),
        ("x-pagination-result-count", count),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
            headers.insert(name, v);
        }
    }
    headers.insert(
        "access-control-expose-headers",
        HeaderValue::from_static("x-pagination-total-pages, x-pagination-result-count"),
    );
    response
}

/// A read of one object, with `x-max-permission`.
fn read_one(body: &Value, permission: Permission) -> Response {
    let mut response = json_response(StatusCode::OK, body);
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&permission.number().to_string()) {
        headers.insert("x-max-permission", v);
    }
    headers.insert(
        "access-control-expose-headers",
        HeaderValue::from_static("x-max-permission"),
    );
    response
}

/// The request body bound as a JSON object, the way echo binds one: an
/// empty body binds nothing, a body that is not JSON is 415, JSON that
/// is not an object is 400 2004.
fn object(headers: &HeaderMap, body: &Bytes) -> Result<Map<String, Value>, ApiError> {
    if body.is_empty() {
        return Ok(Map::new());
    }
    let json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json {
        return Err(ApiError::echo(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported Media Type",
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ApiError::invalid_model(format!(
            "code=400, message=Unmarshal type error: expected=object, got={}",
            json_type(&other)
        ))),
        Err(e) => Err(ApiError::invalid_model(format!(
            "code=400, message=Syntax error: {e}"
        ))),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_error(field: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid_model(format!(
        "code=400, message=Unmarshal type error: expected={expected}, got={}, field={field}",
        json_type(got)
    ))
}

/// Typed reads of a bound body's fields, `null` and absent as Go's zero
/// value.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn string(&self, name: &str) -> Result<String, ApiError> {
        match self.get(name) {
            None => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(type_error(name, "string", other)),
        }
    }

    fn bool(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(type_error(name, "bool", other)),
        }
    }

    fn int(&self, name: &str) -> Result<i64, ApiError> {
        match self.get(name) {
            None => Ok(0),
            Some(v) => v.as_i64().ok_or_else(|| type_error(name, "int64", v)),
        }
    }

    fn float(&self, name: &str) -> Result<f64, ApiError> {
        match self.get(name) {
            None => Ok(0.0),
            Some(v) => v.as_f64().ok_or_else(|| type_error(name, "float64", v)),
        }
    }

    /// A `time.Time`: RFC 3339, Go's zero time as unset.
    fn time(&self, name: &str) -> Result<Option<OffsetDateTime>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => {
                let t = OffsetDateTime::parse(s, &Rfc3339).map_err(|e| {
                    ApiError::invalid_model(format!(
                        "code=400, message=parsing time {s:?} as RFC 3339 for field {name}: {e}"
                    ))
                })?;
                // Vikunja's database keeps whole seconds.
                let t = t.to_offset(time::UtcOffset::UTC);
                let t = t.replace_nanosecond(0).unwrap_or(t);
                Ok((t.year() > 1).then_some(t))
            }
            Some(other) => Err(type_error(name, "time.Time", other)),
        }
    }

    fn array(&self, name: &str) -> Result<Vec<&Map<String, Value>>, ApiError> {
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .filter(|v| !v.is_null())
                .map(|v| v.as_object().ok_or_else(|| type_error(name, "object", v)))
                .collect(),
            Some(other) => Err(type_error(name, "array", other)),
        }
    }
}

/// A task body (`models.Task`) as a create or update binds it, checked
/// as the validator checks it, with what the stand-in does not model
/// refused.
fn task_fields(body: &Map<String, Value>) -> Result<TaskFields, ApiError> {
    let f = Fields(body);
    let hex_color = f.string("hex_color")?;
    let mut assignees = Vec::new();
    for a in f.array("assignees")? {
        assignees.push(Fields(a).int("id")?);
    }
    let mut reminders = Vec::new();
    for r in f.array("reminders")? {
        let r = Fields(r);
        reminders.push(ReminderIn {
            reminder: r.time("reminder")?,
            relative_period: r.int("relative_period")?,
            relative_to: r.string("relative_to")?,
        });
    }
    let fields = TaskFields {
        title: f.string("title")?,
        description: f.string("description")?,
        done: f.bool("done")?,
        due_date: f.time("due_date")?,
        start_date: f.time("start_date")?,
        end_date: f.time("end_date")?,
        priority: f.int("priority")?,
        hex_color,
        percent_done: f.float("percent_done")?,
        project_id: f.int("project_id")?,
        assignees,
        reminders,
        is_favorite: f.bool("is_favorite")?,
    };
    let unmodelled = [
        ("repeat_after", "repeating tasks"),
        ("repeat_mode", "repeating tasks"),
        ("bucket_id", "kanban buckets"),
        ("cover_image_attachment_id", "attachments"),
    ];
    let mut counts = Vec::new();
    for (name, _) in unmodelled {
        counts.push(f.int(name)?);
    }
    if fields.hex_color.chars().count() > 7 {
        return Err(ApiError::invalid_fields(
            "Invalid Data",
            vec![format!(
                "hex_color: {} does not validate as runelength(0|7)",
                fields.hex_color
            )],
        ));
    }
    for ((name, what), value) in unmodelled.iter().zip(counts) {
        if value != 0 {
            return Err(ApiError::not_implemented(format!(
                "{what} (`{name}`: {value})"
            )));
        }
    }
    Ok(fields)
}

/// `expand` values: `comments` and `comment_count` add to the task;
/// `buckets` and `reactions` add nothing here (no kanban views, no
/// reactions); the others are refused.
fn expand(q: &Query) -> Result<Expand, ApiError> {
    let mut e = Expand::default();
    for value in q.all("expand") {
        match value.as_str() {
            "comments" => e.comments = true,
            "comment_count" => e.comment_count = true,
            "buckets" | "reactions" => {}
            "subtasks" | "time_entries_count" | "is_unread" => {
                return Err(ApiError::not_implemented(format!("expand={value}")));
            }
            _ => {
                return Err(ApiError::invalid_fields(
                    "Expand must be one of the following values: subtasks, buckets, reactions, comments, comment_count, time_entries_count, is_unread",
                    vec!["expand".into()],
                ));
            }
        }
    }
    Ok(e)
}

/// Vikunja's case-insensitive `LIKE %s%`, as SQLite does it for ASCII.
fn ilike(haystack: &str, needle: &str) -> bool {
    haystack
        .to_ascii_lowercase()
        .contains(&needle.to_ascii_lowercase())
}

async fn info(State(shared): State<Arc<Shared>>, RawQuery(raw): RawQuery) -> Reply {
    Query::parse(raw).only(&[])?;
    Ok(json_response(
        StatusCode::OK,
        &shapes::info(&shared.base_url),
    ))
}

async fn current_user(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let me = caller(c)?;
    Query::parse(raw).only(&[])?;
    let state = shared.lock();
    let user = state.user(me).ok_or_else(ApiError::user_missing)?;
    Ok(json_response(
        StatusCode::OK,
        &shapes::user_with_settings(user),
    ))
}

async fn get_project(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let me = caller(c)?;
    Query::parse(raw).only(&[])?;
    let project = id(&p, "project")?;
    let state = shared.lock();
    let rec = state
        .project(project)
        .ok_or_else(ApiError::project_missing)?;
    let permission = state
        .permission(me, project)
        .ok_or_else(ApiError::forbidden_read)?;
    Ok(read_one(
        &shapes::project(&state, rec, Some(permission)),
        permission,
    ))
}

async fn list_tasks(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let me = caller(c)?;
    let q = Query::parse(raw);
    q.only(&[
        "page",
        "per_page",
        "filter",
        "filter_include_nulls",
        "filter_timezone",
        "sort_by",
        "order_by",
        "expand",
    ])?;
    let include_nulls = match q.first("filter_include_nulls") {
        None | Some("false" | "0" | "f" | "F" | "FALSE" | "False") => false,
        Some("true" | "1" | "t" | "T" | "TRUE" | "True") => true,
        Some(other) => {
            return Err(ApiError::invalid_model(format!(
                "code=400, message=filter_include_nulls={other:?} is not a bool"
            )));
        }
    };
    if let Some(zone) = q.first("filter_timezone")
        && !matches!(zone, "UTC" | "GMT" | "Etc/UTC" | "Etc/GMT")
    {
        return Err(ApiError::not_implemented(format!(
            "filter_timezone={zone} (dates are compared in UTC)"
        )));
    }
    let expand = expand(&q)?;
    let paging = paging(&q)?;
    let project = id(&p, "project")?;
    let state = shared.lock();
    if state.project(project).is_none() {
        return Err(ApiError::project_missing());
    }
    if state.permission(me, project).is_none() {
        return Err(ApiError::no_project_access());
    }
    let sort = Sort::parse(&q.all("sort_by"), &q.all("order_by"))?;
    let filter = Filter::parse(
        q.first("filter").unwrap_or_default(),
        include_nulls,
        OffsetDateTime::now_utc(),
    )?;
    let mut tasks: Vec<&super::TaskRec> = state
        .tasks
        .iter()
        .filter(|t| t.project_id == project)
        .filter(|t| filter.as_ref().is_none_or(|f| f.matches(t)))
        .collect();
    tasks.sort_by(|a, b| sort.compare(a, b));
    let items = tasks
        .into_iter()
        .map(|t| shapes::task(&state, t, me, expand))
        .collect();
    Ok(page_of(items, paging))
}

async fn create_task(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let me = caller(c)?;
    Query::parse(raw).only(&[])?;
    let project = id(&p, "project")?;
    let fields = task_fields(&object(&headers, &body)?)?;
    let (task, _sent) = ops::create_task(&shared, me, project, fields)?;
    let state = shared.lock();
    let t = state.task(task).ok_or_else(ApiError::task_missing)?;
    Ok(json_response(
        StatusCode::CREATED,
        &shapes::task(&state, t, me, Expand::default()),
    ))
}

async fn get_task(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let me = caller(c)?;
    let q = Query::parse(raw);
    q.only(&["expand"])?;
    let expand = expand(&q)?;
    let task = id(&p, "task")?;
    let state = shared.lock();
    let t = state.task(task).ok_or_else(ApiError::task_missing)?;
    let permission = state
        .permission(me, t.project_id)
        .ok_or_else(ApiError::forbidden_read)?;
    Ok(read_one(&shapes::task(&state, t, me, expand), permission))
}

async fn update_task(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let me = caller(c)?;
    Query::parse(raw).only(&[])?;
    let task = id(&p, "task")?;
    let fields = task_fields(&object(&headers, &body)?)?;
    let _sent = ops::update_task(&shared, me, task, fields)?;
    let state = shared.lock();
    let t = state.task(task).ok_or_else(ApiError::task_missing)?;
    Ok(json_response(
        StatusCode::OK,
        &shapes::task(&state, t, me, Expand::default()),
    ))
}

/// The task in the path, existing and readable by `me`; a missing one is
/// 404 4002, an unreadable one the models' 403 code 1.
fn readable_task(state: &super::State, me: i64, task: i64) -> Result<i64, ApiError> {
    let project = state
        .task(task)
        .map(|t| t.project_id)
        .ok_or_else(ApiError::task_missing)?;
    if state.permission(me, project).is_none() {
        return Err(ApiError::not_allowed());
    }
    Ok(project)
}

async fn list_comments(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let me = caller(c)?;
    let q = Query::parse(raw);
    q.only(&["page", "per_page", "s", "order_by"])?;
    let paging = paging(&q)?;
    let task = id(&p, "task")?;
    let state = shared.lock();
    readable_task(&state, me, task)?;
    let search = q.first("s").unwrap_or_default().to_string();
    let mut comments: Vec<&super::CommentRec> = state
        .comments
        .iter()
        .filter(|c| c.task_id == task && ilike(&c.comment, &search))
        .collect();
    comments.sort_by_key(|c| (c.created, c.id));
    if q.first("order_by") == Some("desc") {
        comments.reverse();
    }
    let items = comments
        .into_iter()
        .map(|c| shapes::comment(&state, c))
        .collect();
    Ok(page_of(items, paging))
}

/// The `comment` field of a comment body.
fn comment_text(headers: &HeaderMap, body: &Bytes) -> Result<String, ApiError> {
    let body = object(headers, body)?;
    let text = Fields(&body).string("comment")?;
    ops::check_comment_text(&text)?;
    Ok(text)
}

async fn create_comment(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let me = caller(c)?;
    Query::parse(raw).only(&[])?;
    let task = id(&p, "task")?;
    let text = comment_text(&headers, &body)?;
    let (comment, _sent) = ops::add_comment(&shared, me, task, &text)?;
    let state = shared.lock();
    let c = state
        .comments
        .iter()
        .find(|c| c.id == comment)
        .ok_or_else(ApiError::comment_missing)?;
    Ok(json_response(
        StatusCode::CREATED,
        &shapes::comment(&state, c),
    ))
}

async fn get_comment(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let me = caller(c)?;
    Query::parse(raw).only(&[])?;
    let task = id(&p, "task")?;
    let comment = id(&p, "comment")?;
    let state = shared.lock();
    let project = state
        .task(task)
        .map(|t| t.project_id)
        .ok_or_else(ApiError::task_missing)?;
    let permission = state
        .permission(me, project)
        .ok_or_else(ApiError::forbidden_read)?;
    let c = state
        .comments
        .iter()
        .find(|c| c.id == comment && c.task_id == task)
        .ok_or_else(ApiError::comment_missing)?;
    Ok(read_one(&shapes::comment(&state, c), permission))
}

async fn edit_comment(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let me = caller(c)?;
    Query::parse(raw).only(&[])?;
    let task = id(&p, "task")?;
    let comment = id(&p, "comment")?;
    let text = comment_text(&headers, &body)?;
    let _sent = ops::edit_comment(&shared, me, task, comment, &text)?;
    let state = shared.lock();
    let c = state
        .comments
        .iter()
        .find(|c| c.id == comment)
        .ok_or_else(ApiError::comment_missing)?;
    Ok(json_response(StatusCode::OK, &shapes::comment(&state, c)))
}

async fn list_assignees(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let me = caller(c)?;
    let q = Query::parse(raw);
    q.only(&["page", "per_page", "s"])?;
    let paging = paging(&q)?;
    let task = id(&p, "task")?;
    let state = shared.lock();
    readable_task(&state, me, task)?;
    let search = q.first("s").unwrap_or_default().to_string();
    let items = state
        .task(task)
        .map(|t| t.assignees.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|id| state.user(id))
        .filter(|u| ilike(&u.username, &search))
        .map(shapes::user)
        .collect();
    Ok(page_of(items, paging))
}

async fn add_assignee(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let me = caller(c)?;
    Query::parse(raw).only(&[])?;
    let task = id(&p, "task")?;
    let body = object(&headers, &body)?;
    let user = Fields(&body).int("user_id")?;
    let _sent = ops::add_assignee(&shared, me, task, user)?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"user_id": user, "created": shapes::time(now())}),
    ))
}

async fn remove_assignee(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let me = caller(c)?;
    Query::parse(raw).only(&[])?;
    let task = id(&p, "task")?;
    let user = id(&p, "user")?;
    let _sent = ops::remove_assignee(&shared, me, task, user)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"message": "Successfully deleted."}),
    ))
}

async fn list_webhooks(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let me = caller(c)?;
    let q = Query::parse(raw);
    q.only(&["page", "per_page"])?;
    let paging = paging(&q)?;
    let project = id(&p, "project")?;
    let state = shared.lock();
    if state.project(project).is_none() {
        return Err(ApiError::project_missing());
    }
    if state.permission(me, project).is_none() {
        return Err(ApiError::not_allowed());
    }
    let items = state
        .hooks
        .iter()
        .filter(|h| h.project_id == project)
        .map(|h| shapes::webhook(&state, h))
        .collect();
    Ok(page_of(items, paging))
}

async fn create_webhook(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let me = caller(c)?;
    Query::parse(raw).only(&[])?;
    let project = id(&p, "project")?;
    let body = object(&headers, &body)?;
    let f = Fields(&body);
    let target_url = f.string("target_url")?;
    let events: Vec<String> = match f.get("events") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|e| {
                e.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| type_error("events", "string", e))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(type_error("events", "array", other)),
    };
    let secret = f.string("secret")?;
    let basic_user = f.string("basic_auth_user")?;
    let basic_password = f.string("basic_auth_password")?;
    let mut missing = Vec::new();
    if target_url.is_empty() {
        missing.push("target_url: non zero value required".to_string());
    }
    if events.is_empty() {
        missing.push("events: non zero value required".to_string());
    }
    if !missing.is_empty() {
        return Err(ApiError::invalid_fields("Invalid Data", missing));
    }
    let mut state = shared.lock();
    if state.project(project).is_none() {
        return Err(ApiError::project_missing());
    }
    if !state.can_write(me, project) {
        return Err(ApiError::forbidden());
    }
    if !target_url.starts_with("http") {
        return Err(ApiError::invalid_fields(
            "Invalid Data",
            vec!["target_url".into()],
        ));
    }
    if events.iter().any(|e| !WEBHOOK_EVENTS.contains(&e.as_str())) {
        return Err(ApiError::invalid_fields(
            "Invalid Data",
            vec!["events".into()],
        ));
    }
    state.next.hook += 1;
    let hook = state.next.hook;
    state.hooks.push(super::HookRec {
        id: hook,
        project_id: project,
        target_url,
        events,
        secret,
        basic_auth: (!basic_user.is_empty() && !basic_password.is_empty())
            .then_some((basic_user, basic_password)),
        created_by: me,
        created: now(),
    });
    let rec = state
        .hooks
        .last()
        .ok_or_else(|| ApiError::echo(StatusCode::INTERNAL_SERVER_ERROR, "webhook vanished"))?;
    Ok(json_response(
        StatusCode::CREATED,
        &shapes::webhook(&state, rec),
    ))
}

async fn delete_webhook(
    State(shared): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let me = caller(c)?;
    Query::parse(raw).only(&[])?;
    let hook = id(&p, "webhook")?;
    let mut state = shared.lock();
    // canDoWebhook: a webhook that does not exist is simply not allowed,
    // one that does needs write access to its own project.
    let project = state
        .hooks
        .iter()
        .find(|h| h.id == hook)
        .map(|h| h.project_id)
        .ok_or_else(ApiError::forbidden)?;
    if !state.can_write(me, project) {
        return Err(ApiError::forbidden());
    }
    state.hooks.retain(|h| h.id != hook);
    Ok(json_response(
        StatusCode::OK,
        &json!({"message": "Successfully deleted."}),
    ))
}

async fn webhook_events(c: Option<axum::Extension<Caller>>, RawQuery(raw): RawQuery) -> Reply {
    caller(c)?;
    Query::parse(raw).only(&[])?;
    Ok(json_response(StatusCode::OK, &json!(WEBHOOK_EVENTS)))
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn token_permissions_are_named_as_vikunja_names_them() {
        let cases = [
            ("GET", "/api/v1/user", ("other", "user")),
            (
                "GET",
                "/api/v1/projects/{project}",
                ("projects", "read_one"),
            ),
            (
                "GET",
                "/api/v1/projects/{project}/tasks",
                ("tasks", "read_all"),
            ),
            (
                "PUT",
                "/api/v1/projects/{project}/tasks",
                ("tasks", "create"),
            ),
            ("GET", "/api/v1/tasks/{task}", ("tasks", "read_one")),
            ("POST", "/api/v1/tasks/{task}", ("tasks", "update")),
            (
                "GET",
                "/api/v1/tasks/{task}/comments",
                ("tasks_comments", "read_all"),
            ),
            (
                "POST",
                "/api/v1/tasks/{task}/comments/{comment}",
                ("tasks_comments", "update"),
            ),
            (
                "PUT",
                "/api/v1/tasks/{task}/assignees",
                ("tasks_assignees", "create"),
            ),
            (
                "DELETE",
                "/api/v1/projects/{project}/webhooks/{webhook}",
                ("projects_webhooks", "delete"),
            ),
            ("GET", "/api/v1/webhooks/events", ("webhooks", "events")),
        ];
        for (method, path, (group, perm)) in cases {
            assert_eq!(
                route_permission(method, path),
                Some((group.to_string(), perm.to_string())),
                "{method} {path}"
            );
        }
    }
}
