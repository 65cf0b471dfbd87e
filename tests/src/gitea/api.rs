//! The REST API the stand-in serves, under `/api/v1`, each route as
//! Gitea's API description has it (status codes included):
//!
//! | route | answers |
//! | --- | --- |
//! | `GET /version` | 200 ServerVersion (no token needed) |
//! | `GET /user` | 200 the token's User |
//! | `GET /repos/{owner}/{repo}` | 200 Repository |
//! | `GET /repos/{owner}/{repo}/branches/{branch}` | 200 Branch, as the caller sees it ([`super::Protection`]); 404 no such branch |
//! | `GET /repos/{owner}/{repo}/commits/{ref}/status` | 200 CombinedStatus of the branch's tip or the commit: the latest status of each context (`page`, `limit`; `X-Total-Count`), `state` failure if any is error or failure, success if all are success (or warning, skipped), else pending; without any statuses Gitea's empty one (`state` and `sha` empty, `statuses` null) |
//! | `GET /repos/{owner}/{repo}/issues` | 200 IssueList: `state` (open, closed, all; open by default), `type` (issues, pulls), `labels`, `since`, `before`, `created_by`, `assigned_by`, `page`, `limit`; newest first; `X-Total-Count`, `Link` |
//! | `POST /repos/{owner}/{repo}/issues` | 201 Issue: CreateIssueOption `title` (required: missing or blank is 422 `[Title]: Required`), `body`, `assignees` and the deprecated `assignee` (logins, matched without regard to case; one no user has is 422 `Assignee does not exist: [name: user does not exist [uid: 0, name: <login>]]` and nothing is made), `labels` (ids; those the repository lacks are dropped, as Gitea drops them), `closed`; `ref`, `milestone` and `due_date` are 422 (not implemented). Webhooks in Gitea's order: `issue_assign` `assigned` per assignee (made inside the issue's creation), `issues` `opened`, `issue_label` `label_updated` when labelled, `issues` `closed` when `closed` |
//! | `GET /repos/{owner}/{repo}/issues/comments` | 200 CommentList of the whole repository: `since`, `before`, `page`, `limit`; oldest first |
//! | `PATCH /repos/{owner}/{repo}/issues/comments/{id}` | 200 Comment: `body`; the comment's `updated_at` moves |
//! | `GET /repos/{owner}/{repo}/issues/{index}` | 200 Issue (pull requests too) |
//! | `PATCH /repos/{owner}/{repo}/issues/{index}` | 201 Issue: `title`, `body`, `state`; closing with open dependencies is 412 |
//! | `GET /repos/{owner}/{repo}/issues/{index}/comments` | 200 CommentList: `since`, `before`; oldest first |
//! | `POST /repos/{owner}/{repo}/issues/{index}/comments` | 201 Comment |
//! | `GET /repos/{owner}/{repo}/issues/{index}/dependencies` | 200 IssueList: the issues blocking it |
//! | `GET /repos/{owner}/{repo}/issues/{index}/timeline` | 200 TimelineList: `since`, `before`, `page`, `limit` |
//! | `GET /repos/{owner}/{repo}/pulls` | 200 PullRequestList: `state`, `sort` (oldest, recentupdate, leastupdate; newest first without it), `page`, `limit` |
//! | `POST /repos/{owner}/{repo}/pulls` | 201 PullRequest; 404 missing branch, 409 one already open for the branches, 422 nothing to merge |
//! | `GET /repos/{owner}/{repo}/pulls/{index}` | 200 PullRequest |
//! | `PATCH /repos/{owner}/{repo}/pulls/{index}` | 201 PullRequest: `title`, `body`, `state` |
//! | `GET /repos/{owner}/{repo}/pulls/{index}/files` | 200 ChangedFileList (`git diff` from the merge base to the head) |
//! | `GET /repos/{owner}/{repo}/pulls/{index}/merge` | 204 merged, 404 not |
//! | `POST /repos/{owner}/{repo}/pulls/{index}/merge` | 200 (no body) merged as the caller, with its webhooks: MergePullRequestOption `Do` (`merge` only; any other style Gitea has is 422 naming it, none is 422 `[Do]: Required`), `MergeTitleField`, `MergeMessageField`, `head_commit_id`, `force_merge` (the owner's, past approvals and checks); Gitea's refusals in its order: 405 `` (merged already), 404 closed, 405 `User not allowed to merge PR`, `Work in progress PRs cannot be merged`, `Please try again later` (conflicts), `Not all required status checks successful`, `Does not have enough approvals` (non-stale official approvals, [`super::Protection`]), then 409 `head out of date`; `delete_branch_after_merge`, `merge_when_checks_succeed`, `MergeCommitID` and keys Gitea would ignore are 422 |
//! | `GET /repos/{owner}/{repo}/pulls/{index}/reviews` | 200 PullReviewList (`stale` once the head moved past a review's `commit_id`; `official` for each reviewer's latest verdict) |
//! | `POST /repos/{owner}/{repo}/pulls/{index}/reviews` | 200 PullReview: `event` (APPROVED, REQUEST_CHANGES, COMMENT), `body`, `comments` (`path`, `body`, `new_position`, `old_position`) |
//! | `GET /repos/{owner}/{repo}/pulls/{index}/reviews/{id}` | 200 PullReview |
//! | `GET /repos/{owner}/{repo}/pulls/{index}/reviews/{id}/comments` | 200 PullReviewCommentList |
//! | `POST /repos/{owner}/{repo}/statuses/{sha}` | 201 CommitStatus: CreateStatusOption `state` (pending, success, error, failure, warning, skipped; anything else 422), `target_url`, `description`, `context`; a commit the repository lacks is Gitea's 500 |
//!
//! Anything else is 404 with Gitea's error body; a body that is not the
//! JSON object a route takes is 422. A request a test told the stand-in
//! to refuse ([`super::GiteaStandIn::refuse_next`]) is answered with that
//! status and `Retry-After` before anything else, unserved; one whose
//! answer it was told to lose ([`super::GiteaStandIn::lose_answers`]) is
//! served and then answered with the status; one it was told to hold
//! ([`super::GiteaStandIn::hang_next`]) is never answered.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::ops::{self, ApiError, MergeForm, NewCodeComment, NewIssue, NewStatus, json_response};
use super::{
    ApiRequest, EventKind, GITEA_VERSION, RetryAfter, ReviewState, Shared, TokenUse, git,
    json as shapes,
};

/// Gitea's `[api] DEFAULT_PAGING_NUM` and `MAX_RESPONSE_ITEMS`.
const DEFAULT_LIMIT: usize = 30;
const MAX_LIMIT: usize = 50;

/// The stand-in's routes, behind the authentication and request log.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    const REPO: &str = "/api/v1/repos/{owner}/{repo}";
    let r = |tail: &str| format!("{REPO}{tail}");
    Router::new()
        .route("/api/v1/version", get(version))
        .route("/api/v1/user", get(current_user))
        .route(REPO, get(get_repo))
        .route(&r("/branches/{*branch}"), get(get_branch))
        .route(&r("/commits/{ref}/status"), get(combined_status))
        .route(&r("/issues"), get(list_issues).post(create_issue))
        .route(&r("/issues/comments"), get(list_repo_comments))
        .route(&r("/issues/comments/{id}"), patch(edit_comment))
        .route(&r("/issues/{index}"), get(get_issue).patch(edit_issue))
        .route(
            &r("/issues/{index}/comments"),
            get(list_comments).post(create_comment),
        )
        .route(&r("/issues/{index}/dependencies"), get(list_dependencies))
        .route(&r("/issues/{index}/timeline"), get(timeline))
        .route(&r("/pulls"), get(list_pulls).post(create_pull))
        .route(&r("/pulls/{index}"), get(get_pull).patch(edit_pull))
        .route(&r("/pulls/{index}/files"), get(pull_files))
        .route(&r("/pulls/{index}/merge"), get(is_merged).post(merge_pull))
        .route(
            &r("/pulls/{index}/reviews"),
            get(list_reviews).post(create_review),
        )
        .route(&r("/pulls/{index}/reviews/{id}"), get(get_review))
        .route(
            &r("/pulls/{index}/reviews/{id}/comments"),
            get(review_comments),
        )
        .route(&r("/statuses/{sha}"), post(create_status))
        .fallback(|| async { ApiError::not_found("no such API route") })
        .layer(middleware::from_fn_with_state(shared.clone(), authenticate))
        .with_state(shared)
}

/// The user a request is made as (set by [`authenticate`]).
#[derive(Clone)]
struct Caller(String);

/// A handler's error, waiting in the response for [`authenticate`] to
/// write Gitea's body with the stand-in's URL.
#[derive(Clone)]
struct PendingError(Arc<std::sync::Mutex<Option<ApiError>>>);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = self.status.into_response();
        response
            .extensions_mut()
            .insert(PendingError(Arc::new(std::sync::Mutex::new(Some(self)))));
        response
    }
}

/// Checks the token (Gitea's `Authorization: token <t>`, or `Bearer`),
/// refusing a wrong one always and a missing one except for `/version`,
/// runs the route, writes error bodies and logs the request.
async fn authenticate(
    State(shared): State<Arc<Shared>>,
    mut request: Request,
    next: Next,
) -> Response {
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    let token = match request.headers().get("authorization") {
        None => TokenUse::Missing,
        Some(value) => {
            let value = value.to_str().unwrap_or_default().trim();
            let presented = value.split_once(' ').and_then(|(scheme, token)| {
                (scheme.eq_ignore_ascii_case("token") || scheme.eq_ignore_ascii_case("bearer"))
                    .then(|| token.trim())
            });
            let state = shared.lock();
            presented
                .and_then(|t| state.users.iter().find(|u| u.token.as_deref() == Some(t)))
                .map_or(TokenUse::Wrong, |u| TokenUse::Valid(u.login.clone()))
        }
    };
    // Held for good: the client sees no answer, as when it is killed
    // mid-call (served first or not).
    let hang = shared.lock().hang(&method, &path);
    if let Some(hang) = hang {
        if hang.served
            && let TokenUse::Valid(login) = &token
        {
            request.extensions_mut().insert(Caller(login.clone()));
            drop(next.run(request).await);
        }
        hang.arrived.notify_one();
        return std::future::pending().await;
    }
    let refused = shared.lock().refusal(&method, &path);
    let (refused, served) = match refused {
        Some((status, retry_after, served)) => (Some((status, retry_after)), served),
        None => (None, false),
    };
    let mut response = match (&token, refused) {
        (_, Some((status, retry_after))) if !served => refusal(&shared, status, retry_after),
        (TokenUse::Wrong, _) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid username, password or token",
        )
        .into_response(),
        (TokenUse::Missing, _) if path != "/api/v1/version" => {
            ApiError::new(StatusCode::UNAUTHORIZED, "token is required").into_response()
        }
        (TokenUse::Missing, _) => next.run(request).await,
        (TokenUse::Valid(login), _) => {
            request.extensions_mut().insert(Caller(login.clone()));
            next.run(request).await
        }
    };
    // Served, and its answer lost on the way back.
    if let Some((status, retry_after)) = refused.filter(|_| served) {
        response = refusal(&shared, status, retry_after);
    }
    let pending = response
        .extensions_mut()
        .remove::<PendingError>()
        .and_then(|p| p.0.lock().ok().and_then(|mut e| e.take()));
    if let Some(error) = pending {
        response = error.into_response_with(&shared.base_url);
    }
    shared.lock().requests.push(ApiRequest {
        method,
        path,
        query,
        status: response.status().as_u16(),
        token,
    });
    response
}

/// The answer to a request [`super::GiteaStandIn::refuse_next`] refuses:
/// its status, Gitea's error document and the `Retry-After` asked for.
fn refusal(shared: &Shared, status: u16, retry_after: RetryAfter) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = ApiError::new(
        status,
        format!(
            "{}: the stand-in was told to refuse this request",
            status.canonical_reason().unwrap_or("refused")
        ),
    )
    .into_response_with(&shared.base_url);
    if let Some(v) = retry_after
        .value()
        .and_then(|v| HeaderValue::from_str(&v).ok())
    {
        response.headers_mut().insert(RETRY_AFTER, v);
    }
    response
}

type Reply = Result<Response, ApiError>;
type Params = HashMap<String, String>;

fn caller(request_caller: Option<axum::Extension<Caller>>) -> Result<String, ApiError> {
    request_caller
        .map(|c| c.0.0)
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "token is required"))
}

fn query(raw: Option<String>) -> HashMap<String, String> {
    form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

/// A query filter Gitea has that the stand-in does not implement is
/// refused, so no client mistakes an ignored filter for a result.
fn refuse(params: &Params, unsupported: &[&str]) -> Result<(), ApiError> {
    match unsupported.iter().find(|p| params.contains_key(**p)) {
        Some(p) => Err(ApiError::unprocessable(format!(
            "the Gitea stand-in does not implement the `{p}` parameter"
        ))),
        None => Ok(()),
    }
}

/// `page` (1-based, 1 by default) and `limit` (30 by default, at most
/// 50), as Gitea corrects them.
fn paging(params: &Params) -> (usize, usize) {
    let number = |name: &str| {
        params
            .get(name)
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let page = number("page").max(1) as usize;
    let limit = match number("limit") {
        l if l <= 0 => DEFAULT_LIMIT,
        l => (l as usize).min(MAX_LIMIT),
    };
    (page, limit)
}

/// An RFC 3339 time parameter; an unparsable one is 422, as Gitea's.
fn time_param(params: &Params, name: &str) -> Result<Option<OffsetDateTime>, ApiError> {
    match params.get(name).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => OffsetDateTime::parse(v, &Rfc3339)
            .map(Some)
            .map_err(|e| ApiError::unprocessable(format!("parsing time {name}={v:?}: {e}"))),
    }
}

fn in_window(
    t: OffsetDateTime,
    since: Option<OffsetDateTime>,
    before: Option<OffsetDateTime>,
) -> bool {
    since.is_none_or(|s| t >= s) && before.is_none_or(|b| t <= b)
}

/// A page of `items` as a JSON list with Gitea's `X-Total-Count` and
/// `Link` (next, last, first, prev) headers.
fn page_of(shared: &Shared, uri: &Uri, items: Vec<Value>, page: usize, limit: usize) -> Response {
    let total = items.len();
    let body: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * limit)
        .take(limit)
        .collect();
    let mut response = json_response(StatusCode::OK, &Value::Array(body));
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&total.to_string()) {
        headers.insert("x-total-count", v);
    }
    let pages = total.div_ceil(limit).max(1);
    let link = |to: usize, rel: &str| {
        let mut pairs: Vec<(String, String)> = query(uri.query().map(str::to_string))
            .into_iter()
            .filter(|(k, _)| k != "page")
            .collect();
        pairs.push(("page".into(), to.to_string()));
        pairs.sort();
        let encoded = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish();
        format!(
            "<{}{}?{encoded}>; rel=\"{rel}\"",
            shared.base_url,
            uri.path()
        )
    };
    let mut links = Vec::new();
    if page < pages {
        links.push(link(page + 1, "next"));
    }
    if page != pages {
        links.push(link(pages, "last"));
    }
    if page != 1 {
        links.push(link(1, "first"));
    }
    if page > 1 {
        links.push(link(page - 1, "prev"));
    }
    if !links.is_empty()
        && let Ok(v) = HeaderValue::from_str(&links.join(","))
    {
        headers.insert("link", v);
    }
    headers.insert(
        "access-control-expose-headers",
        HeaderValue::from_static("X-Total-Count, Link"),
    );
    response
}

fn ok(status: StatusCode, body: Value) -> Reply {
    Ok(json_response(status, &body))
}

/// The repository in the path, or 404.
fn repo_id(shared: &Shared, p: &Params) -> Result<i64, ApiError> {
    let (owner, name) = (p["owner"].as_str(), p["repo"].as_str());
    shared
        .lock()
        .repo_by_name(owner, name)
        .map(|r| r.id)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "repository does not exist [owner_name: {owner}, name: {name}]"
            ))
        })
}

/// The repository and the issue number in the path, the issue existing
/// (a pull request when `pull`), or 404.
fn issue_ref(shared: &Shared, p: &Params, pull: bool) -> Result<(i64, i64), ApiError> {
    let repo = repo_id(shared, p)?;
    let index = p["index"].parse::<i64>().unwrap_or(0);
    let state = shared.lock();
    match state.issue(repo, index) {
        Some(i) if !pull || i.pull.is_some() => Ok((repo, index)),
        _ => Err(ApiError::not_found(format!(
            "{} does not exist [repo_id: {repo}, index: {index}]",
            if pull { "pull request" } else { "issue" }
        ))),
    }
}

/// The request body as a JSON object, or 422.
fn object(body: &Bytes) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ApiError::unprocessable(format!(
            "[]: DeserializationError: expected a JSON object, got {other}"
        ))),
        Err(e) => Err(ApiError::unprocessable(format!(
            "[]: DeserializationError: {e}"
        ))),
    }
}

/// Field `name` of a body: a string, absent, or 422.
fn string_field<'a>(body: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ApiError::unprocessable(format!(
            "[{name}]: DeserializationError: expected a string, got {other}"
        ))),
    }
}

/// Fields Gitea takes that the stand-in does not implement, refused when
/// set to anything but their empty value.
fn refuse_fields(body: &Map<String, Value>, unsupported: &[&str]) -> Result<(), ApiError> {
    let set = |v: &Value| match v {
        Value::Null | Value::Bool(false) => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Number(n) => n.as_f64() != Some(0.0),
        _ => true,
    };
    match unsupported.iter().find(|f| body.get(**f).is_some_and(set)) {
        Some(f) => Err(ApiError::unprocessable(format!(
            "the Gitea stand-in does not implement the `{f}` field"
        ))),
        None => Ok(()),
    }
}

async fn version() -> Reply {
    ok(StatusCode::OK, json!({ "version": GITEA_VERSION }))
}

async fn current_user(State(s): State<Arc<Shared>>, c: Option<axum::Extension<Caller>>) -> Reply {
    let login = caller(c)?;
    let state = s.lock();
    ok(StatusCode::OK, shapes::user(&s, &state, &login))
}

async fn get_repo(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
) -> Reply {
    let login = caller(c)?;
    let repo = repo_id(&s, &p)?;
    let state = s.lock();
    let Some(r) = state.repo(repo) else {
        return Err(ApiError::not_found("repository"));
    };
    ok(StatusCode::OK, shapes::repo(&s, &state, r, &login))
}

async fn get_branch(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
) -> Reply {
    let login = caller(c)?;
    let repo = repo_id(&s, &p)?;
    let name = p["branch"].trim_start_matches('/').to_string();
    let path = s
        .lock()
        .repo(repo)
        .map(|r| r.path.clone())
        .ok_or_else(|| ApiError::not_found("repository"))?;
    let sha = git::branch_sha(&path, &name)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?
        .ok_or_else(|| ApiError::not_found(format!("branch does not exist [name: {name}]")))?;
    let commit = git::commit_info(&path, &sha)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
    let state = s.lock();
    let r = state
        .repo(repo)
        .ok_or_else(|| ApiError::not_found("repository"))?;
    ok(
        StatusCode::OK,
        shapes::branch(&s, r, &name, &commit, &login),
    )
}

async fn list_issues(
    State(s): State<Arc<Shared>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    uri: Uri,
) -> Reply {
    let params = query(raw);
    refuse(&params, &["q", "milestones", "mentioned_by"])?;
    let (page, limit) = paging(&params);
    let (since, before) = (
        time_param(&params, "since")?,
        time_param(&params, "before")?,
    );
    let closed = match params.get("state").map(String::as_str) {
        Some("closed") => Some(true),
        Some("all") => None,
        _ => Some(false),
    };
    let pulls = match params.get("type").map(String::as_str) {
        Some("issues") => Some(false),
        Some("pulls") => Some(true),
        _ => None,
    };
    let repo = repo_id(&s, &p)?;
    let state = s.lock();
    let labels: Vec<String> = params
        .get("labels")
        .map(|l| {
            l.split(',')
                .map(str::trim)
                .filter(|name| {
                    // Gitea discards labels the repository does not have.
                    state
                        .repo(repo)
                        .is_some_and(|r| r.labels.iter().any(|x| x.name == *name))
                })
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let mut found: Vec<_> = state
        .issues
        .iter()
        .filter(|i| i.repo == repo)
        .filter(|i| closed.is_none_or(|c| i.closed_at.is_some() == c))
        .filter(|i| pulls.is_none_or(|pr| i.pull.is_some() == pr))
        .filter(|i| labels.is_empty() || i.labels.iter().any(|l| labels.contains(l)))
        .filter(|i| params.get("created_by").is_none_or(|u| &i.user == u))
        .filter(|i| {
            params
                .get("assigned_by")
                .is_none_or(|u| i.assignees.contains(u))
        })
        .filter(|i| in_window(i.updated, since, before))
        .collect();
    found.sort_by_key(|i| std::cmp::Reverse((i.created, i.id)));
    let items = found.iter().map(|i| shapes::issue(&s, &state, i)).collect();
    Ok(page_of(&s, &uri, items, page, limit))
}

/// Field `name` of a body: a list of strings, absent (empty), or 422.
fn string_list(body: &Map<String, Value>, name: &str) -> Result<Vec<String>, ApiError> {
    let wrong = |other: &Value| {
        ApiError::unprocessable(format!(
            "[{name}]: DeserializationError: expected a list of strings, got {other}"
        ))
    };
    match body.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| wrong(v)))
            .collect(),
        Some(other) => Err(wrong(other)),
    }
}

/// Field `name` of a body: a list of ids, absent (empty), or 422.
fn id_list(body: &Map<String, Value>, name: &str) -> Result<Vec<i64>, ApiError> {
    let wrong = |other: &Value| {
        ApiError::unprocessable(format!(
            "[{name}]: DeserializationError: expected a list of integers, got {other}"
        ))
    };
    match body.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_i64().ok_or_else(|| wrong(v)))
            .collect(),
        Some(other) => Err(wrong(other)),
    }
}

/// Field `name` of a body: a boolean, absent (false), or 422.
fn bool_field(body: &Map<String, Value>, name: &str) -> Result<bool, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::unprocessable(format!(
            "[{name}]: DeserializationError: expected a boolean, got {other}"
        ))),
    }
}

async fn create_issue(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    body: Bytes,
) -> Reply {
    let login = caller(c)?;
    let repo = repo_id(&s, &p)?;
    let body = object(&body)?;
    refuse_fields(&body, &["ref", "milestone", "due_date"])?;
    let new = NewIssue {
        title: string_field(&body, "title")?.unwrap_or_default(),
        body: string_field(&body, "body")?.unwrap_or_default(),
        assignee: string_field(&body, "assignee")?.unwrap_or_default(),
        assignees: string_list(&body, "assignees")?,
        labels: id_list(&body, "labels")?,
        closed: bool_field(&body, "closed")?,
    };
    let (number, _sent) = ops::create_issue(&s, repo, &login, &new).await?;
    let state = s.lock();
    let issue = state
        .issue(repo, number)
        .map(|i| shapes::issue(&s, &state, i));
    ok(StatusCode::CREATED, issue.unwrap_or_default())
}

async fn list_repo_comments(
    State(s): State<Arc<Shared>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    uri: Uri,
) -> Reply {
    let params = query(raw);
    let (page, limit) = paging(&params);
    let (since, before) = (
        time_param(&params, "since")?,
        time_param(&params, "before")?,
    );
    let repo = repo_id(&s, &p)?;
    let state = s.lock();
    let items = state
        .events
        .iter()
        .filter(|e| e.repo == repo && matches!(e.kind, EventKind::Comment { .. }))
        .filter(|e| in_window(e.updated, since, before))
        .map(|e| shapes::comment(&s, &state, e))
        .collect();
    Ok(page_of(&s, &uri, items, page, limit))
}

async fn edit_comment(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    body: Bytes,
) -> Reply {
    let login = caller(c)?;
    let repo = repo_id(&s, &p)?;
    let id = p["id"].parse::<i64>().unwrap_or(0);
    let body = object(&body)?;
    let text = string_field(&body, "body")?.unwrap_or_default();
    let (_, _sent) = ops::edit_comment(&s, repo, id, &login, text).await?;
    let state = s.lock();
    let comment = state
        .events
        .iter()
        .find(|e| e.id == id)
        .map(|e| shapes::comment(&s, &state, e));
    ok(StatusCode::OK, comment.unwrap_or_default())
}

async fn get_issue(State(s): State<Arc<Shared>>, Path(p): Path<Params>) -> Reply {
    let (repo, number) = issue_ref(&s, &p, false)?;
    let state = s.lock();
    let issue = state
        .issue(repo, number)
        .map(|i| shapes::issue(&s, &state, i));
    ok(StatusCode::OK, issue.unwrap_or_default())
}

async fn edit_issue(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    body: Bytes,
) -> Reply {
    let login = caller(c)?;
    let (repo, number) = issue_ref(&s, &p, false)?;
    let body = object(&body)?;
    refuse_fields(
        &body,
        &[
            "ref",
            "assignee",
            "assignees",
            "milestone",
            "due_date",
            "unset_due_date",
        ],
    )?;
    let title = string_field(&body, "title")?.filter(|t| !t.is_empty());
    let text = string_field(&body, "body")?;
    let state_change = string_field(&body, "state")?;
    let _sent = ops::edit(&s, repo, number, &login, title, text).await?;
    if let Some(wanted) = state_change {
        // Gitea reads any state but "closed" as open.
        let _sent = ops::set_state(&s, repo, number, &login, wanted == "closed", "").await?;
    }
    let state = s.lock();
    let issue = state
        .issue(repo, number)
        .map(|i| shapes::issue(&s, &state, i));
    ok(StatusCode::CREATED, issue.unwrap_or_default())
}

async fn list_comments(
    State(s): State<Arc<Shared>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let params = query(raw);
    let (since, before) = (
        time_param(&params, "since")?,
        time_param(&params, "before")?,
    );
    let (repo, number) = issue_ref(&s, &p, false)?;
    let state = s.lock();
    let items: Vec<Value> = state
        .events
        .iter()
        .filter(|e| e.repo == repo && e.number == number)
        .filter(|e| matches!(e.kind, EventKind::Comment { .. }))
        .filter(|e| in_window(e.updated, since, before))
        .map(|e| shapes::comment(&s, &state, e))
        .collect();
    ok(StatusCode::OK, Value::Array(items))
}

async fn create_comment(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    body: Bytes,
) -> Reply {
    let login = caller(c)?;
    let (repo, number) = issue_ref(&s, &p, false)?;
    let body = object(&body)?;
    let text = string_field(&body, "body")?.unwrap_or_default();
    let (id, _sent) = ops::comment(&s, repo, number, &login, text).await?;
    let state = s.lock();
    let comment = state
        .events
        .iter()
        .find(|e| e.id == id)
        .map(|e| shapes::comment(&s, &state, e));
    ok(StatusCode::CREATED, comment.unwrap_or_default())
}

async fn list_dependencies(
    State(s): State<Arc<Shared>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    uri: Uri,
) -> Reply {
    let (page, limit) = paging(&query(raw));
    let (repo, number) = issue_ref(&s, &p, false)?;
    let state = s.lock();
    let blockers = state
        .issue(repo, number)
        .map(|i| i.blocked_by.clone())
        .unwrap_or_default();
    let items = blockers
        .iter()
        .filter_map(|n| state.issue(repo, *n))
        .map(|i| shapes::issue(&s, &state, i))
        .collect();
    Ok(page_of(&s, &uri, items, page, limit))
}

async fn timeline(
    State(s): State<Arc<Shared>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    uri: Uri,
) -> Reply {
    let params = query(raw);
    let (page, limit) = paging(&params);
    let (since, before) = (
        time_param(&params, "since")?,
        time_param(&params, "before")?,
    );
    let (repo, number) = issue_ref(&s, &p, false)?;
    let state = s.lock();
    let items = state
        .events
        .iter()
        .filter(|e| e.repo == repo && e.number == number)
        .filter(|e| in_window(e.updated, since, before))
        .map(|e| shapes::timeline(&s, &state, e))
        .collect();
    Ok(page_of(&s, &uri, items, page, limit))
}

/// A pull request's JSON with its branches read from git.
async fn pull_json(s: &Shared, repo: i64, number: i64) -> Result<Value, ApiError> {
    let git = ops::pull_git(s, repo, number).await?;
    let state = s.lock();
    Ok(state
        .issue(repo, number)
        .map(|i| shapes::pull(s, &state, i, &git))
        .unwrap_or_default())
}

async fn list_pulls(
    State(s): State<Arc<Shared>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    uri: Uri,
) -> Reply {
    let params = query(raw);
    refuse(&params, &["milestone", "labels", "poster"])?;
    let (page, limit) = paging(&params);
    // Gitea's sorts that the stand-in keeps times for; its default is
    // newest first.
    let sort = params.get("sort").map_or("", String::as_str);
    if !matches!(sort, "" | "oldest" | "recentupdate" | "leastupdate") {
        return Err(ApiError::unprocessable(format!(
            "the Gitea stand-in does not implement sort={sort} (it has oldest, recentupdate and leastupdate)"
        )));
    }
    let closed = match params.get("state").map(String::as_str) {
        Some("closed") => Some(true),
        Some("all") => None,
        _ => Some(false),
    };
    let repo = repo_id(&s, &p)?;
    let numbers: Vec<i64> = {
        let state = s.lock();
        let mut found: Vec<_> = state
            .issues
            .iter()
            .filter(|i| i.repo == repo && i.pull.is_some())
            .filter(|i| closed.is_none_or(|c| i.closed_at.is_some() == c))
            .collect();
        match sort {
            "oldest" => found.sort_by_key(|i| (i.created, i.id)),
            "recentupdate" => found.sort_by_key(|i| std::cmp::Reverse((i.updated, i.id))),
            "leastupdate" => found.sort_by_key(|i| (i.updated, i.id)),
            _ => found.sort_by_key(|i| std::cmp::Reverse((i.created, i.id))),
        }
        found.iter().map(|i| i.number).collect()
    };
    let mut items = Vec::new();
    for number in numbers {
        items.push(pull_json(&s, repo, number).await?);
    }
    Ok(page_of(&s, &uri, items, page, limit))
}

async fn create_pull(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    body: Bytes,
) -> Reply {
    let login = caller(c)?;
    let repo = repo_id(&s, &p)?;
    let body = object(&body)?;
    refuse_fields(
        &body,
        &[
            "assignee",
            "assignees",
            "milestone",
            "labels",
            "due_date",
            "reviewers",
            "team_reviewers",
        ],
    )?;
    let required = |name: &str, label: &str| -> Result<String, ApiError> {
        string_field(&body, name)?
            .filter(|v| !v.trim().is_empty())
            .map(str::to_string)
            .ok_or_else(|| ApiError::unprocessable(format!("[{label}]: Required")))
    };
    let (head, base, title) = (
        required("head", "Head")?,
        required("base", "Base")?,
        required("title", "Title")?,
    );
    let text = string_field(&body, "body")?.unwrap_or_default();
    // `owner:branch` names a branch of a fork; the stand-in has no forks,
    // so only the repository's own owner is accepted there.
    let head = match head.split_once(':') {
        Some((owner, branch)) if owner.eq_ignore_ascii_case(&p["owner"]) => branch.to_string(),
        Some((owner, _)) => {
            return Err(ApiError::not_found(format!(
                "repository does not exist [owner_name: {owner}, name: {}]",
                p["repo"]
            )));
        }
        None => head,
    };
    let (number, _sent) = ops::create_pull(&s, repo, &login, &head, &base, &title, text).await?;
    ok(StatusCode::CREATED, pull_json(&s, repo, number).await?)
}

async fn get_pull(State(s): State<Arc<Shared>>, Path(p): Path<Params>) -> Reply {
    let (repo, number) = issue_ref(&s, &p, true)?;
    ok(StatusCode::OK, pull_json(&s, repo, number).await?)
}

async fn edit_pull(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    body: Bytes,
) -> Reply {
    let login = caller(c)?;
    let (repo, number) = issue_ref(&s, &p, true)?;
    let body = object(&body)?;
    refuse_fields(
        &body,
        &[
            "assignee",
            "assignees",
            "milestone",
            "labels",
            "due_date",
            "unset_due_date",
            "allow_maintainer_edit",
        ],
    )?;
    if let Some(base) = string_field(&body, "base")?.filter(|b| !b.is_empty()) {
        let current = s
            .lock()
            .issue(repo, number)
            .and_then(|i| i.pull.as_ref().map(|p| p.base.clone()));
        if current.as_deref() != Some(base) {
            return Err(ApiError::unprocessable(
                "the Gitea stand-in does not implement changing a pull request's base",
            ));
        }
    }
    let title = string_field(&body, "title")?.filter(|t| !t.is_empty());
    let text = string_field(&body, "body")?;
    let _sent = ops::edit(&s, repo, number, &login, title, text).await?;
    if let Some(wanted) = string_field(&body, "state")? {
        let _sent = ops::set_state(&s, repo, number, &login, wanted == "closed", "").await?;
    }
    ok(StatusCode::CREATED, pull_json(&s, repo, number).await?)
}

async fn pull_files(
    State(s): State<Arc<Shared>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    uri: Uri,
) -> Reply {
    let (page, limit) = paging(&query(raw));
    let (repo, number) = issue_ref(&s, &p, true)?;
    let git = ops::pull_git(&s, repo, number).await?;
    let state = s.lock();
    let Some(r) = state.repo(repo) else {
        return Err(ApiError::not_found("repository"));
    };
    let items = git
        .files
        .iter()
        .map(|f| shapes::changed_file(&s, r, &git.head_sha, f))
        .collect();
    Ok(page_of(&s, &uri, items, page, limit))
}

async fn is_merged(State(s): State<Arc<Shared>>, Path(p): Path<Params>) -> Reply {
    let (repo, number) = issue_ref(&s, &p, true)?;
    let merged = s
        .lock()
        .issue(repo, number)
        .is_some_and(|i| i.pull.as_ref().is_some_and(|p| p.merged.is_some()));
    if merged {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found(format!(
            "pull request #{number} has not been merged"
        )))
    }
}

async fn list_reviews(
    State(s): State<Arc<Shared>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
    uri: Uri,
) -> Reply {
    let (page, limit) = paging(&query(raw));
    let (repo, number) = issue_ref(&s, &p, true)?;
    let head = ops::pull_git(&s, repo, number).await?.head_sha;
    let state = s.lock();
    let items = state
        .reviews
        .iter()
        .filter(|r| r.repo == repo && r.number == number)
        .map(|r| shapes::review(&s, &state, r, &head))
        .collect();
    Ok(page_of(&s, &uri, items, page, limit))
}

/// The review in the path, of the pull request in the path, or 404.
fn review_ref(s: &Shared, p: &Params) -> Result<(i64, i64, i64), ApiError> {
    let (repo, number) = issue_ref(s, p, true)?;
    let id = p["id"].parse::<i64>().unwrap_or(0);
    let state = s.lock();
    if state
        .reviews
        .iter()
        .any(|r| r.id == id && r.repo == repo && r.number == number)
    {
        Ok((repo, number, id))
    } else {
        Err(ApiError::not_found(format!(
            "review does not exist [id: {id}]"
        )))
    }
}

async fn get_review(State(s): State<Arc<Shared>>, Path(p): Path<Params>) -> Reply {
    let (repo, number, id) = review_ref(&s, &p)?;
    let head = ops::pull_git(&s, repo, number).await?.head_sha;
    let state = s.lock();
    let review = state
        .reviews
        .iter()
        .find(|r| r.id == id)
        .map(|r| shapes::review(&s, &state, r, &head));
    ok(StatusCode::OK, review.unwrap_or_default())
}

async fn review_comments(State(s): State<Arc<Shared>>, Path(p): Path<Params>) -> Reply {
    let (_, _, id) = review_ref(&s, &p)?;
    let state = s.lock();
    let items: Vec<Value> = state
        .events
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::Code { review, .. } if *review == id))
        .map(|e| shapes::review_comment(&s, &state, e))
        .collect();
    ok(StatusCode::OK, Value::Array(items))
}

async fn create_review(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    body: Bytes,
) -> Reply {
    let login = caller(c)?;
    let (repo, number) = issue_ref(&s, &p, true)?;
    let body = object(&body)?;
    let verdict = match string_field(&body, "event")?.unwrap_or_default() {
        "APPROVED" => ReviewState::Approved,
        "REQUEST_CHANGES" => ReviewState::RequestChanges,
        "COMMENT" => ReviewState::Comment,
        "" | "PENDING" => {
            return Err(ApiError::unprocessable(
                "the Gitea stand-in does not implement pending reviews: give event APPROVED, REQUEST_CHANGES or COMMENT",
            ));
        }
        other => {
            return Err(ApiError::unprocessable(format!(
                "Unknown review event: {other}"
            )));
        }
    };
    let text = string_field(&body, "body")?.unwrap_or_default().to_string();
    let mut comments = Vec::new();
    match body.get("comments") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for c in list {
                let Value::Object(c) = c else {
                    return Err(ApiError::unprocessable(
                        "[comments]: each comment is a JSON object",
                    ));
                };
                let line = |name: &str| c.get(name).and_then(Value::as_i64).unwrap_or(0);
                // As Gitea: an old-file line wins, stored negative.
                let (new, old) = (line("new_position"), line("old_position"));
                comments.push(NewCodeComment {
                    path: string_field(c, "path")?.unwrap_or_default().to_string(),
                    line: if old > 0 { -old } else { new },
                    body: string_field(c, "body")?.unwrap_or_default().to_string(),
                });
            }
        }
        Some(other) => {
            return Err(ApiError::unprocessable(format!(
                "[comments]: DeserializationError: expected a list, got {other}"
            )));
        }
    }
    let (id, _sent) = ops::review(&s, repo, number, &login, verdict, &text, comments).await?;
    let head = ops::pull_git(&s, repo, number).await?.head_sha;
    let state = s.lock();
    let review = state
        .reviews
        .iter()
        .find(|r| r.id == id)
        .map(|r| shapes::review(&s, &state, r, &head));
    ok(StatusCode::OK, review.unwrap_or_default())
}

/// The fields of Gitea's MergePullRequestOption as Gitea {GITEA_VERSION}
/// names them in JSON (Go reads a key into the field it names without
/// regard to case).
const MERGE_FIELDS: [&str; 8] = [
    "Do",
    "MergeTitleField",
    "MergeMessageField",
    "MergeCommitID",
    "head_commit_id",
    "force_merge",
    "merge_when_checks_succeed",
    "delete_branch_after_merge",
];

/// A merge's body read as Gitea binds MergePullRequestOption, refusing
/// what the stand-in does not implement and what Gitea would silently
/// drop (a key that names no field, such as a later version's
/// `merge_title_field`).
fn merge_form(body: &Map<String, Value>) -> Result<MergeForm, ApiError> {
    let mut fields: HashMap<&str, &Value> = HashMap::new();
    for (key, value) in body {
        let Some(field) = MERGE_FIELDS.iter().find(|f| f.eq_ignore_ascii_case(key)) else {
            return Err(ApiError::unprocessable(format!(
                "Gitea {GITEA_VERSION} would ignore `{key}` in a merge (its fields are {}): the Gitea stand-in refuses it",
                MERGE_FIELDS.join(", ")
            )));
        };
        fields.insert(field, value);
    }
    let text = |name: &str| -> Result<String, ApiError> {
        match fields.get(name) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(ApiError::unprocessable(format!(
                "[{name}]: DeserializationError: expected a string, got {other}"
            ))),
        }
    };
    let flag = |name: &str| -> Result<bool, ApiError> {
        match fields.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(ApiError::unprocessable(format!(
                "[{name}]: DeserializationError: expected a boolean, got {other}"
            ))),
        }
    };
    match text("Do")?.as_str() {
        "" => return Err(ApiError::unprocessable("[Do]: Required")),
        "merge" => {}
        style
        @ ("rebase" | "rebase-merge" | "squash" | "fast-forward-only" | "manually-merged") => {
            return Err(ApiError::unprocessable(format!(
                "the Gitea stand-in does not implement the merge style Do={style}: it merges with Do=merge only"
            )));
        }
        _ => return Err(ApiError::unprocessable("[Do]: In")),
    }
    for (name, why) in [
        ("delete_branch_after_merge", "it never deletes branches"),
        ("merge_when_checks_succeed", "it does not schedule merges"),
    ] {
        if flag(name)? {
            return Err(ApiError::unprocessable(format!(
                "the Gitea stand-in does not implement `{name}`: {why}"
            )));
        }
    }
    if !text("MergeCommitID")?.is_empty() {
        return Err(ApiError::unprocessable(
            "the Gitea stand-in does not implement `MergeCommitID` (it is for Do=manually-merged)",
        ));
    }
    Ok(MergeForm {
        title: text("MergeTitleField")?,
        message: text("MergeMessageField")?,
        head_commit_id: text("head_commit_id")?,
        force: flag("force_merge")?,
    })
}

async fn merge_pull(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    body: Bytes,
) -> Reply {
    let login = caller(c)?;
    repo_id(&s, &p)?;
    // Gitea binds the body before it looks for the pull request.
    let form = merge_form(&object(&body)?)?;
    let (repo, number) = issue_ref(&s, &p, true)?;
    let _sent = ops::merge_as(&s, repo, number, &login, &form).await?;
    // Gitea answers a merge with its status alone.
    Ok(StatusCode::OK.into_response())
}

async fn create_status(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    body: Bytes,
) -> Reply {
    let login = caller(c)?;
    let repo = repo_id(&s, &p)?;
    let body = object(&body)?;
    let status = NewStatus {
        state: string_field(&body, "state")?.unwrap_or_default(),
        context: string_field(&body, "context")?.unwrap_or_default(),
        description: string_field(&body, "description")?.unwrap_or_default(),
        target_url: string_field(&body, "target_url")?.unwrap_or_default(),
    };
    let (sha, index) = ops::create_status(&s, repo, &login, &p["sha"], &status).await?;
    let state = s.lock();
    let r = state
        .repo(repo)
        .ok_or_else(|| ApiError::not_found("repository"))?;
    let made = state
        .statuses
        .iter()
        .find(|x| x.repo == repo && x.sha == sha && x.index == index)
        .map(|x| shapes::commit_status(&s, &state, r, x));
    ok(StatusCode::CREATED, made.unwrap_or_default())
}

async fn combined_status(
    State(s): State<Arc<Shared>>,
    c: Option<axum::Extension<Caller>>,
    Path(p): Path<Params>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let login = caller(c)?;
    let (page, limit) = paging(&query(raw));
    let repo = repo_id(&s, &p)?;
    let reference = p["ref"].clone();
    let path = s
        .lock()
        .repo(repo)
        .map(|r| r.path.clone())
        .ok_or_else(|| ApiError::not_found("repository"))?;
    // As Gitea's ResolveRefOrSha: a branch's tip, else a commit id made
    // whole, else the reference as given (which has no statuses).
    let sha = match git::branch_sha(&path, &reference).await? {
        Some(sha) => sha,
        None => git::commit_sha(&path, &reference)
            .await?
            .unwrap_or(reference),
    };
    let state = s.lock();
    let r = state
        .repo(repo)
        .ok_or_else(|| ApiError::not_found("repository"))?;
    let mut latest = state.latest_statuses(repo, &sha);
    let total = latest.len();
    // Gitea pages the contexts by their latest status, newest first, and
    // lists a page in the order the statuses were made.
    latest.sort_by_key(|x| std::cmp::Reverse(x.index));
    let mut shown: Vec<_> = latest
        .into_iter()
        .skip((page - 1) * limit)
        .take(limit)
        .collect();
    shown.sort_by_key(|x| x.index);
    let body = shapes::combined_status(&s, &state, r, &sha, &shown, &login);
    let mut response = json_response(StatusCode::OK, &body);
    if !shown.is_empty()
        && let Ok(v) = HeaderValue::from_str(&total.to_string())
    {
        response.headers_mut().insert("x-total-count", v);
    }
    Ok(response)
}
