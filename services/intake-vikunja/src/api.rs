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
//! fails for good, or [`ATTEMPTS`] attempts failed transiently, all
//! within `call-timeout`: attempts, and the waits between them, never run
//! past it. The waits are [`RETRY`]'s backoff, or longer when Vikunja (or
//! a proxy in front of it) answers 429 or 503 with `Retry-After` (seconds,
//! or an HTTP date read against Vikunja's own `Date`); a wait that would
//! end past the timeout is not waited, and the call fails naming the
//! status and the wait asked for. The retry loop is the `backon` crate's,
//! over the workspace's one backoff ([`nisse_bus::Backoff`]).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use backon::Retryable as _;
use reqwest::header::{AUTHORIZATION, DATE, HeaderValue, LOCATION, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use time::OffsetDateTime;
use tokio::time::Instant;

use nisse_bus::Backoff;
use nisse_bus::secret::{Secret, SecretError};

use crate::shapes::{self, Comment, Task};

/// Items asked for per page: Vikunja's default (and default most) is 50
/// (`service.maxitemsperpage`).
const PAGE: usize = 50;

/// Pages read of one listing at most: a listing past this is refused
/// rather than read without end.
const MAX_PAGES: usize = 200;

/// Largest answer read from Vikunja.
const MAX_ANSWER: usize = 32 * 1024 * 1024;

/// Attempts of one call at most when it fails transiently (Vikunja
/// unreachable, 5xx, 429), with [`RETRY`]'s waits (or `Retry-After`)
/// between them, all within `call-timeout`.
pub(crate) const ATTEMPTS: u32 = 4;

/// Waits between attempts when Vikunja asks for none (or for less):
/// 0.5 s, 1 s, 2 s...
pub(crate) const RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(8));

/// Why a call did not give an answer.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ApiError {
    /// The token file cannot be read now (being rotated, removed).
    #[error("the agent's Vikunja token cannot be read: {0}")]
    Token(SecretError),
    /// The token is not something an HTTP header can carry.
    #[error("the agent's Vikunja token ({0}) holds characters an HTTP header cannot carry")]
    BadToken(String),
    /// No answer: connection refused, reset, timed out.
    #[error("Vikunja could not be reached for {what}: {reason}")]
    Unreachable {
        /// The method and path.
        what: String,
        /// What failed.
        reason: String,
        /// Whether the request may have reached Vikunja (it was sent, or
        /// may have been, before the failure): a write then may have been
        /// made, and is looked for before it is made again.
        sent: bool,
    },
    /// Vikunja answered with an error status.
    #[error("Vikunja answered {status} to {what}: {message}")]
    Status {
        /// The method and path.
        what: String,
        /// The HTTP status.
        status: u16,
        /// Vikunja's `message` (with its `code`), or what it said instead.
        message: String,
        /// How long it asked to be left alone (`Retry-After`, read on a
        /// 429 or a 503 only).
        retry_after: Option<Duration>,
    },
    /// A transient failure that retrying did not get past: the last
    /// failure, and why no further attempt was made.
    #[error("{last}; {why}")]
    GaveUp {
        /// The last attempt's failure.
        last: Box<ApiError>,
        /// Why it was not tried again: the attempts spent, or a wait
        /// (`Retry-After`) ending past `call-timeout`.
        why: String,
    },
    /// Vikunja answered something that is not what its API describes.
    #[error("Vikunja's answer to {what} is not what its API describes: {reason}")]
    Decode {
        /// The method and path.
        what: String,
        /// What is wrong, naming the field.
        reason: String,
    },
}

impl ApiError {
    /// Whether trying again later may work: Vikunja unreachable or
    /// overloaded, the token file missing for a moment.
    pub(crate) fn transient(&self) -> bool {
        match self {
            Self::Token(_) | Self::Unreachable { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 429 || *status == 408,
            // Retried already.
            Self::GaveUp { .. } => false,
            Self::BadToken(_) | Self::Decode { .. } => false,
        }
    }

    /// Whether Vikunja certainly did nothing of the request: it was never
    /// sent (the token unreadable, the connection refused), or it was
    /// refused unread (429). Anything else that failed after sending (no
    /// answer, a reset, a 5xx, even a 503 from a proxy that may have
    /// passed it on) leaves a write's outcome unknown.
    pub(crate) fn not_carried_out(&self) -> bool {
        match self {
            Self::Token(_) | Self::BadToken(_) => true,
            Self::Unreachable { sent, .. } => !sent,
            Self::Status { status, .. } => *status == 429,
            Self::GaveUp { last, .. } => last.not_carried_out(),
            Self::Decode { .. } => false,
        }
    }

    /// Vikunja's HTTP status, when it answered.
    pub(crate) fn http_status(&self) -> u32 {
        match self {
            Self::Status { status, .. } => u32::from(*status),
            Self::GaveUp { last, .. } => last.http_status(),
            _ => 0,
        }
    }

    /// The wait Vikunja asked for (`Retry-After`), if it asked.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            Self::GaveUp { last, .. } => last.retry_after(),
            _ => None,
        }
    }
}

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

/// Which attempt of an operation [`Vikunja::retrying`] is making.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// 0 for the first.
    pub number: u32,
    /// Whether an earlier attempt may have been carried out by Vikunja
    /// (it failed after its request may have reached Vikunja, not by a
    /// refusal such as a 429): a write then looks for what it made before
    /// making it again.
    pub uncertain: bool,
}

impl Attempt {
    /// The attempt after one that failed with `e`.
    fn after(self, e: &ApiError) -> Self {
        Self {
            number: self.number + 1,
            uncertain: self.uncertain || !e.not_carried_out(),
        }
    }
}

/// How far [`Vikunja::retrying`] got: the attempt to make next, and why
/// it stopped trying, once it did. Shared by backon's callbacks; a mutex,
/// not a cell, so the call stays `Send`.
#[derive(Debug, Default)]
struct Progress {
    next: Attempt,
    stop: Option<Stop>,
}

impl Progress {
    fn with<R>(shared: &Mutex<Self>, f: impl FnOnce(&mut Self) -> R) -> R {
        f(&mut shared.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Why [`Vikunja::retrying`] stopped trying before the operation worked.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// [`ATTEMPTS`] attempts were made.
    Attempts,
    /// The wait before the next attempt would end past the timeout.
    OutOfTime { wait: Duration, left: Duration },
}

/// A duration as the reasons write it, to the millisecond.
fn words(d: Duration) -> String {
    let ms = Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    humantime::format_duration(ms).to_string()
}

/// Vikunja's `Date` header (RFC 9110's IMF-fixdate, a form of RFC 2822).
fn date_of(headers: &reqwest::header::HeaderMap) -> Option<OffsetDateTime> {
    let text = headers.get(DATE)?.to_str().ok()?;
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc2822).ok()
}

/// How long a `Retry-After` asks to wait: delay-seconds, or an HTTP date
/// (IMF-fixdate) counted from Vikunja's `date` when it sent one (its
/// clock, not this machine's), else from now. A date already past asks
/// for no wait; a value that is neither asks for nothing.
fn retry_after(
    headers: &reqwest::header::HeaderMap,
    date: Option<OffsetDateTime>,
) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than a u64 holds is a wait past any timeout.
        return Some(Duration::from_secs(text.parse().unwrap_or(u64::MAX)));
    }
    let at = OffsetDateTime::parse(text, &time::format_description::well_known::Rfc2822).ok()?;
    let from = date.unwrap_or_else(OffsetDateTime::now_utc);
    Some(Duration::try_from(at - from).unwrap_or(Duration::ZERO))
}

impl Vikunja {
    /// A client of the Vikunja at `url` (its base URL), reading the token
    /// from `token_file` at each request, each request within `timeout`.
    pub(crate) fn new(
        url: &str,
        token_file: std::path::PathBuf,
        timeout: Duration,
    ) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("nisse-intake-vikunja/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot make the HTTP client: {e}"))?;
        Ok(Self {
            http,
            api: format!("{}/api/v1", url.trim_end_matches('/')),
            token: Secret::File(token_file),
            timeout,
        })
    }

    /// Runs `op` until it works, fails for good, or [`ATTEMPTS`] attempts
    /// failed transiently, the attempts and the waits between them within
    /// `call-timeout` (see the module's account). `op` is told which
    /// attempt it is, and whether an earlier one may have been carried
    /// out, so a write looks for what it made before making it again.
    /// `what` names the operation in logs and reasons.
    pub(crate) async fn retrying<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, ApiError>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let budget = self.timeout;
        let deadline = Instant::now() + budget;
        let progress = Mutex::new(Progress::default());
        let progress = &progress;
        let attempt = || {
            let left = deadline.saturating_duration_since(Instant::now());
            let call = op(Progress::with(progress, |p| p.next));
            async move {
                match tokio::time::timeout(left, call).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(ApiError::Unreachable {
                        what: what.to_string(),
                        reason: format!(
                            "no answer within the call's {} (vikunja.call-timeout)",
                            words(budget)
                        ),
                        sent: true,
                    }),
                }
            }
        };
        // backon's own waits end with the attempts; a wait Vikunja asks
        // for is taken when longer, and none is taken that ends past the
        // deadline.
        let waits: Vec<Duration> = RETRY
            .delays()
            .take(usize::try_from(ATTEMPTS.saturating_sub(1)).unwrap_or(0))
            .collect();
        let outcome = attempt
            .retry(waits.into_iter())
            .when(ApiError::transient)
            .adjust(|e, backoff| {
                let Some(backoff) = backoff else {
                    Progress::with(progress, |p| p.stop = Some(Stop::Attempts));
                    return None;
                };
                let wait = e.retry_after().map_or(backoff, |asked| asked.max(backoff));
                let left = deadline.saturating_duration_since(Instant::now());
                if wait >= left {
                    Progress::with(progress, |p| p.stop = Some(Stop::OutOfTime { wait, left }));
                    return None;
                }
                Some(wait)
            })
            .notify(|e, wait| {
                let now = Progress::with(progress, |p| {
                    let now = p.next;
                    p.next = now.after(e);
                    now
                });
                tracing::warn!(
                    attempt = now.number + 1,
                    "{what}: {e}; trying again in {}",
                    words(wait)
                );
            })
            .await;
        outcome.map_err(|last| {
            let (stop, next) = Progress::with(progress, |p| (p.stop, p.next));
            let Some(stop) = stop else {
                return last;
            };
            let attempts = next.number + 1;
            let asked = match last.retry_after() {
                Some(asked) => format!("it asked to wait {} (Retry-After)", words(asked)),
                None => "it gave no Retry-After".to_string(),
            };
            let why = match stop {
                Stop::Attempts => format!(
                    "{asked}; given up after {attempts} attempts within the call's {} (vikunja.call-timeout)",
                    words(budget)
                ),
                Stop::OutOfTime { wait, left } => format!(
                    "{asked}; the wait of {} ends past the call's {} (vikunja.call-timeout, {} left): given up after {attempts} attempt{}",
                    words(wait),
                    words(budget),
                    words(left),
                    if attempts == 1 { "" } else { "s" }
                ),
            };
            ApiError::GaveUp {
                last: Box::new(last),
                why,
            }
        })
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
        let what = format!("{method} /api/v1/{path}");
        let mut url = reqwest::Url::parse(&format!("{}/{path}", self.api)).map_err(|e| {
            ApiError::Unreachable {
                what: what.clone(),
                reason: format!("not a URL: {e}"),
                sent: false,
            }
        })?;
        if !query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in query {
                pairs.append_pair(k, v);
            }
        }
        // Read now, not cached: a rotated token takes effect at once.
        let token = self.token.read_text().map_err(ApiError::Token)?;
        let mut auth = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| ApiError::BadToken(self.token.to_string()))?;
        auth.set_sensitive(true);
        let mut request = self
            .http
            .request(method, url)
            .header(AUTHORIZATION, auth)
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(self.timeout);
        if let Some(body) = body {
            // `json` sets `Content-Type: application/json`, which Vikunja's
            // binder needs (any other is a 415).
            request = request.json(body);
        }
        let unreachable = |e: reqwest::Error| ApiError::Unreachable {
            what: what.clone(),
            // A refused connection carried nothing; anything later may
            // have.
            sent: !e.is_connect(),
            reason: e.without_url().to_string(),
        };
        let mut response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let date = date_of(response.headers());
        let pages = response
            .headers()
            .get("x-pagination-total-pages")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let retry_after = matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        )
        .then(|| retry_after(response.headers(), date))
        .flatten();
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            if bytes.len() + chunk.len() > MAX_ANSWER {
                return Err(ApiError::Decode {
                    what,
                    reason: format!("the answer is larger than {} MiB", MAX_ANSWER >> 20),
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        if status.is_redirection() {
            return Err(ApiError::Status {
                what,
                status: status.as_u16(),
                message: format!(
                    "a redirect to {}; set vikunja.url to where Vikunja is served",
                    location.as_deref().unwrap_or("nowhere")
                ),
                retry_after: None,
            });
        }
        if !status.is_success() {
            return Err(ApiError::Status {
                what,
                status: status.as_u16(),
                message: error_message(status, &bytes),
                retry_after,
            });
        }
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
fn error_message(status: StatusCode, body: &[u8]) -> String {
    if let Ok(e) = serde_json::from_slice::<shapes::ApiError>(body)
        && !e.message.trim().is_empty()
    {
        return if e.code == 0 {
            e.message
        } else {
            format!("{} (code {})", e.message, e.code)
        };
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return status
            .canonical_reason()
            .unwrap_or("no reason given")
            .to_string();
    }
    let mut cut: String = text.chars().take(300).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

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
