//! The Vikunja API client: the calls this service makes, under
//! `<url>/api/v1`, as Vikunja's API (`pkg/routes/routes.go`, its swagger
//! description) has them, with the agent's token read from its file at
//! every request.
//!
//! The token is sent as `Authorization: Bearer <t>`, marked sensitive so
//! no debug output of a request shows it, and never logged: errors name
//! the method and path, which hold no secret. Redirects are not followed
//! (a POST turned into a GET, or the token sent to another host, are
//! worse than an error naming where Vikunja points).
//!
//! **Retries.** [`Vikunja::retrying`] runs one operation (a read, or a
//! write with the search that keeps it at most once) until it works,
//! fails for good, or [`http::ATTEMPTS`] attempts failed transiently, all
//! within `call-timeout`: attempts, and the waits between them, never run
//! past it. The waits are [`http::RETRY`]'s backoff, or longer when Vikunja (or
//! a proxy in front of it) answers 429 or 503 with `Retry-After` (seconds,
//! or an HTTP date read against Vikunja's own `Date`); a wait that would
//! end past the timeout is not waited, and the call fails naming the
//! status and the wait asked for. The retry loop is the `backon` crate's,
//! over the workspace's one backoff ([`nisse_bus::Backoff`]).

use std::time::Duration;

use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use time::OffsetDateTime;

use nisse_bus::secret::Secret;
use nisse_intake_kit::http::{self, Service};

use crate::shapes::{self, Comment, Task};

/// Items asked for per page: Vikunja's default (and default most) is 50
/// (`service.maxitemsperpage`).
const PAGE: usize = 50;

/// Pages read of one listing at most: a listing past this is refused
/// rather than read without end.
const MAX_PAGES: usize = 200;

/// Vikunja as the shared API machinery ([`nisse_intake_kit::http`]) names
/// it: the retry loop and the errors are the Gitea intake's too, and only
/// the name, the config section and the error body are Vikunja's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VikunjaApi;

impl Service for VikunjaApi {
    const NAME: &'static str = "Vikunja";
    const SECTION: &'static str = "vikunja";

    fn message(body: &[u8]) -> Option<String> {
        let e = serde_json::from_slice::<shapes::ApiError>(body).ok()?;
        if e.message.trim().is_empty() {
            return None;
        }
        Some(if e.code == 0 {
            e.message
        } else {
            format!("{} (code {})", e.message, e.code)
        })
    }
}

/// Why a call to Vikunja did not give an answer.
pub(crate) type ApiError = http::ApiError<VikunjaApi>;

/// An answer and when Vikunja says it gave it (its `Date` header), which
/// is the clock its filters compare with.
#[derive(Debug)]
pub(crate) struct Answer<T> {
    pub value: T,
    pub date: Option<OffsetDateTime>,
    /// A listing's `x-pagination-total-pages`.
    pub pages: Option<usize>,
}

/// A client of one Vikunja instance, as the agent's account.
#[derive(Debug, Clone)]
pub(crate) struct Vikunja {
    http: reqwest::Client,
    /// `<url>/api/v1`, without a trailing slash.
    api: String,
    token: Secret,
    timeout: Duration,
}

pub(crate) use nisse_intake_kit::http::Attempt;

impl Vikunja {
    /// A client of the Vikunja at `url` (its base URL), reading the token
    /// from `token_file` at each request, each request within `timeout`.
    pub(crate) fn new(
        url: &str,
        token_file: std::path::PathBuf,
        timeout: Duration,
    ) -> Result<Self, String> {
        let http = http::client(
            timeout,
            concat!("nisse-intake-vikunja/", env!("CARGO_PKG_VERSION")),
        )?;
        Ok(Self {
            http,
            api: format!("{}/api/v1", url.trim_end_matches('/')),
            token: Secret::File(token_file),
            timeout,
        })
    }

    /// Runs `op` until it works, fails for good, or [`http::ATTEMPTS`] attempts
    /// failed transiently, within `vikunja.call-timeout` ([`http::retrying`],
    /// the module's account). `what` names the operation in logs and
    /// reasons.
    pub(crate) async fn retrying<T, F, Fut>(&self, what: &str, op: F) -> Result<T, ApiError>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        http::retrying(self.timeout, what, op).await
    }

    /// One request: `method` on `path` (under `/api/v1`) with `query` and
    /// a JSON `body`, its answer read as `T`.
    async fn request<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&B>,
    ) -> Result<Answer<T>, ApiError> {
        let (what, mut request) = http::prepare::<VikunjaApi>(
            &self.http,
            &self.api,
            method,
            path,
            query,
            &self.token,
            "Bearer",
            self.timeout,
        )?;
        if let Some(body) = body {
            // `json` sets `Content-Type: application/json`, which Vikunja's
            // binder needs (any other is a 415).
            request = request.json(body);
        }
        let answer = http::send::<VikunjaApi>(request, &what).await?;
        let pages = answer
            .headers
            .get("x-pagination-total-pages")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let date = answer.date;
        let bytes = answer.bytes;
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(|e| ApiError::Decode {
            what,
            reason: e.to_string(),
        })?;
        Ok(Answer { value, date, pages })
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Answer<T>, ApiError> {
        self.request::<T, ()>(Method::GET, path, query, None).await
    }

    /// Every item of a paginated listing (`page`, `per_page`), page by
    /// page until `x-pagination-total-pages` is reached or, without that
    /// header, until a page comes back empty (an instance may cap
    /// `per_page` below what was asked, so a short page alone does not
    /// mean the last). The date is the first page's.
    async fn list<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Answer<Vec<T>>, ApiError> {
        let mut all = Vec::new();
        let mut date = None;
        for page in 1..=MAX_PAGES {
            let mut q = query.to_vec();
            q.push(("page", page.to_string()));
            q.push(("per_page", PAGE.to_string()));
            let answer: Answer<Vec<T>> = self.get(path, &q).await?;
            date = date.or(answer.date);
            let n = answer.value.len();
            all.extend(answer.value);
            let last = match answer.pages {
                Some(pages) => page >= pages || n == 0,
                None => n == 0,
            };
            if last {
                return Ok(Answer {
                    value: all,
                    date,
                    pages: answer.pages,
                });
            }
        }
        Err(ApiError::Decode {
            what: format!("GET /api/v1/{path}"),
            reason: format!("more than {MAX_PAGES} pages of {PAGE}"),
        })
    }

    /// A task as it is now, as Vikunja's JSON (every field: an update
    /// sends the whole task back) and read.
    pub(crate) async fn task(&self, id: i64) -> Result<(serde_json::Value, Task), ApiError> {
        let path = format!("tasks/{id}");
        let raw: serde_json::Value = self.get(&path, &[]).await?.value;
        let task = read_task(&raw, &format!("GET /api/v1/{path}"))?;
        Ok((raw, task))
    }

    /// Replaces task `id` with `task` (Vikunja's update is a replace, not
    /// a patch: every field not sent is cleared, so `task` is the whole
    /// task as read, changed).
    pub(crate) async fn update_task(
        &self,
        id: i64,
        task: &serde_json::Value,
    ) -> Result<Task, ApiError> {
        Ok(self
            .request(Method::POST, &format!("tasks/{id}"), &[], Some(task))
            .await?
            .value)
    }

    /// Opens a task titled `title` with `description` (HTML) in
    /// `project`, as the token's account.
    pub(crate) async fn create_task(
        &self,
        project: i64,
        title: &str,
        description: &str,
    ) -> Result<Task, ApiError> {
        let new = serde_json::json!({ "title": title, "description": description });
        Ok(self
            .request(
                Method::PUT,
                &format!("projects/{project}/tasks"),
                &[],
                Some(&new),
            )
            .await?
            .value)
    }

    /// Every task of `project` that `filter` (Vikunja's filter syntax)
    /// admits, by id (an order a change during the read does not move).
    pub(crate) async fn tasks(
        &self,
        project: i64,
        filter: &str,
    ) -> Result<Answer<Vec<Task>>, ApiError> {
        self.list(
            &format!("projects/{project}/tasks"),
            &[
                ("filter", filter.to_string()),
                ("sort_by", "id".to_string()),
                ("order_by", "asc".to_string()),
            ],
        )
        .await
    }

    /// Every comment on task `task`, oldest first.
    pub(crate) async fn comments(&self, task: i64) -> Result<Vec<Comment>, ApiError> {
        let mut comments: Vec<Comment> = self
            .list(&format!("tasks/{task}/comments"), &[])
            .await?
            .value;
        comments.sort_by_key(|c| (c.created, c.id));
        Ok(comments)
    }

    /// Comments `html` on task `task`.
    pub(crate) async fn create_comment(&self, task: i64, html: &str) -> Result<Comment, ApiError> {
        let body = serde_json::json!({ "comment": html });
        Ok(self
            .request(
                Method::PUT,
                &format!("tasks/{task}/comments"),
                &[],
                Some(&body),
            )
            .await?
            .value)
    }
}

/// `raw` (a task's JSON from `what`) read as a task, naming the field
/// that is wrong.
fn read_task(raw: &serde_json::Value, what: &str) -> Result<Task, ApiError> {
    serde_path_to_error::deserialize(raw).map_err(|e| ApiError::Decode {
        what: what.to_string(),
        reason: e.to_string(),
    })
}

/// What an error answer says: Vikunja's `message` (and its `code`), else
/// the start of the body, else the status's reason.
#[cfg(test)]
fn error_message(status: reqwest::StatusCode, body: &[u8]) -> String {
    http::error_message::<VikunjaApi>(status, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nisse_intake_kit::http::{date_of, retry_after};
    use reqwest::StatusCode;
    use reqwest::header::{DATE, HeaderValue, RETRY_AFTER};

    #[test]
    fn error_messages_are_vikunjas_own() {
        assert_eq!(
            error_message(
                StatusCode::NOT_FOUND,
                br#"{"code":4002,"message":"This task does not exist"}"#
            ),
            "This task does not exist (code 4002)"
        );
        assert_eq!(
            error_message(StatusCode::NOT_FOUND, br#"{"message":"Not Found"}"#),
            "Not Found"
        );
        assert_eq!(error_message(StatusCode::BAD_GATEWAY, b"  "), "Bad Gateway");
        assert_eq!(error_message(StatusCode::NOT_FOUND, b"nope"), "nope");
    }

    #[test]
    fn which_failures_are_worth_another_try_and_which_may_have_been_made() {
        let status = |s| ApiError::Status {
            what: "PUT x".into(),
            status: s,
            message: String::new(),
            retry_after: None,
        };
        assert!(status(500).transient() && status(503).transient() && status(429).transient());
        assert!(!status(404).transient() && !status(412).transient());
        assert!(status(429).not_carried_out());
        for s in [500, 502, 503, 504] {
            assert!(!status(s).not_carried_out(), "{s}");
        }
        let unreachable = |sent| ApiError::Unreachable {
            what: "x".into(),
            reason: "r".into(),
            sent,
        };
        assert!(unreachable(false).not_carried_out());
        assert!(!unreachable(true).not_carried_out());
        let gave_up = ApiError::GaveUp {
            last: Box::new(status(503)),
            why: "w".into(),
        };
        assert!(!gave_up.transient(), "retried already");
        assert_eq!(gave_up.http_status(), 503);
        // Once unsure, always: a later 429 does not undo an earlier reset.
        let unsure = Attempt::default()
            .after(&unreachable(true))
            .after(&status(429));
        assert_eq!(
            unsure,
            Attempt {
                number: 2,
                uncertain: true
            }
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates_on_vikunjas_clock() {
        let headers = |v: &'static str| {
            let mut h = reqwest::header::HeaderMap::new();
            h.insert(RETRY_AFTER, HeaderValue::from_static(v));
            h
        };
        let date = OffsetDateTime::from_unix_timestamp(1_714_550_405).ok();
        assert_eq!(
            retry_after(&headers("120"), date),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            retry_after(&headers("Wed, 01 May 2024 08:00:15 GMT"), date),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after(&headers("Wed, 01 May 2024 08:00:00 GMT"), date),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers("soon"), date), None);
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(
            DATE,
            HeaderValue::from_static("Wed, 01 May 2024 08:00:05 GMT"),
        );
        assert_eq!(date_of(&h).unwrap().unix_timestamp(), 1_714_550_405);
    }
}
