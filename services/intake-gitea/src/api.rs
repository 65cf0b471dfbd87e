//! The Gitea API client: the calls this service makes, as Gitea's API
//! description (`templates/swagger/v1_json.tmpl`) has them, with the
//! agent's token read from its file at every request.
//!
//! The token is sent as `Authorization: token <t>`, marked sensitive so
//! no debug output of a request shows it, and never logged: errors name
//! the method and path, which hold no secret. Redirects are not followed
//! (a POST turned into a GET, or the token sent to another host, are
//! worse than an error naming where Gitea points).
//!
//! **Retries.** [`Gitea::retrying`] runs one operation (a read, or a
//! write with the search that keeps it at most once) until it works,
//! fails for good, or [`ATTEMPTS`] attempts failed transiently, all within
//! `call-timeout`: attempts, and the waits between them, never run past
//! it. The waits are [`RETRY`]'s backoff, or longer when Gitea (or a proxy
//! in front of it) answers 429 or 503 with `Retry-After` (seconds, or an
//! HTTP date read against Gitea's own `Date`); a wait that would end past
//! the timeout is not waited, and the call fails naming the status and
//! the wait asked for. The retry loop is the `backon` crate's, over the
//! workspace's one backoff ([`nisse_bus::Backoff`]).

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

use crate::shapes::{
    self, CombinedStatus, Comment, Issue, PullRequest, PullReview, PullReviewComment,
};

/// Items asked for per page; Gitea's default `MAX_RESPONSE_ITEMS` is 50.
const PAGE: usize = 50;

/// Pages read of one listing at most: a listing past this is refused
/// rather than read without end.
const MAX_PAGES: usize = 200;

/// Largest answer read from Gitea.
const MAX_ANSWER: usize = 32 * 1024 * 1024;

/// Attempts of one call at most when it fails transiently (Gitea
/// unreachable, 5xx, 429), with [`RETRY`]'s waits (or Gitea's
/// `Retry-After`) between them, all within `call-timeout`.
pub(crate) const ATTEMPTS: u32 = 4;

/// Waits between attempts when Gitea asks for none (or for less): 0.5 s,
/// 1 s, 2 s...
pub(crate) const RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(8));

/// Why a call did not give an answer.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ApiError {
    /// The token file cannot be read now (being rotated, removed).
    #[error("the agent's Gitea token cannot be read: {0}")]
    Token(SecretError),
    /// The token is not something an HTTP header can carry.
    #[error("the agent's Gitea token ({0}) holds characters an HTTP header cannot carry")]
    BadToken(String),
    /// No answer: connection refused, reset, timed out.
    #[error("Gitea could not be reached for {what}: {reason}")]
    Unreachable {
        /// The method and path.
        what: String,
        /// What failed.
        reason: String,
        /// Whether the request may have reached Gitea (it was sent, or
        /// may have been, before the failure): a write then may have been
        /// made, and is looked for before it is made again.
        sent: bool,
    },
    /// Gitea answered with an error status.
    #[error("Gitea answered {status} to {what}: {message}")]
    Status {
        /// The method and path.
        what: String,
        /// The HTTP status.
        status: u16,
        /// Gitea's `message`, or what it said instead.
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
        /// (Gitea's `Retry-After`) ending past `call-timeout`.
        why: String,
    },
    /// What the call is about is not in Gitea (found by reading, not
    /// answered as an error status).
    #[error("{0}")]
    Missing(String),
    /// Gitea answered something that is not what its API describes.
    #[error("Gitea's answer to {what} is not what its API describes: {reason}")]
    Decode {
        /// The method and path.
        what: String,
        /// What is wrong, naming the field.
        reason: String,
    },
}

impl ApiError {
    /// Whether trying again later may work: Gitea unreachable or
    /// overloaded, the token file missing for a moment.
    pub(crate) fn transient(&self) -> bool {
        match self {
            Self::Token(_) | Self::Unreachable { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 429 || *status == 408,
            // Retried already.
            Self::GaveUp { .. } => false,
            Self::BadToken(_) | Self::Missing(_) | Self::Decode { .. } => false,
        }
    }

    /// Whether Gitea certainly did nothing of the request: it was never
    /// sent (the token unreadable, the connection refused), or Gitea
    /// refused it unread (429, Too Many Requests). Anything else that
    /// failed after sending (no answer, a reset, a 5xx, even a 503 from a
    /// proxy that may have passed it on) leaves a write's outcome
    /// unknown.
    pub(crate) fn not_carried_out(&self) -> bool {
        match self {
            Self::Token(_) | Self::BadToken(_) => true,
            Self::Unreachable { sent, .. } => !sent,
            Self::Status { status, .. } => *status == 429,
            Self::GaveUp { last, .. } => last.not_carried_out(),
            Self::Missing(_) | Self::Decode { .. } => false,
        }
    }

    /// Gitea's HTTP status, when it answered.
    pub(crate) fn http_status(&self) -> u32 {
        match self {
            Self::Status { status, .. } => u32::from(*status),
            Self::GaveUp { last, .. } => last.http_status(),
            _ => 0,
        }
    }

    /// The wait Gitea asked for (`Retry-After`), if it asked.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            Self::GaveUp { last, .. } => last.retry_after(),
            _ => None,
        }
    }

    /// Whether Gitea answered `status`.
    pub(crate) fn is_status(&self, status: u16) -> bool {
        matches!(self, Self::Status { status: s, .. } if *s == status)
    }
}

/// An answer and when Gitea says it gave it (its `Date` header), which is
/// the clock its `since` filters compare with.
#[derive(Debug)]
pub(crate) struct Answer<T> {
    pub value: T,
    pub date: Option<OffsetDateTime>,
    /// A listing's `X-Total-Count`: how many items all its pages hold.
    pub total: Option<usize>,
}

/// A client of one Gitea instance, as the agent's account.
#[derive(Debug, Clone)]
pub(crate) struct Gitea {
    http: reqwest::Client,
    /// `<url>/api/v1`, without a trailing slash.
    api: String,
    token: Secret,
    timeout: Duration,
}

/// Which attempt of an operation [`Gitea::retrying`] is making.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// 0 for the first.
    pub number: u32,
    /// Whether an earlier attempt may have been carried out by Gitea (it
    /// failed after its request may have reached Gitea, not by a refusal
    /// such as a 429): a write then looks for what it made before making
    /// it again.
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

/// How far [`Gitea::retrying`] got: the attempt to make next, and why it
/// stopped trying, once it did. Shared by backon's callbacks; a mutex,
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

/// Why [`Gitea::retrying`] stopped trying before the operation worked.
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

/// Gitea's `Date` header (RFC 9110's IMF-fixdate, a form of RFC 2822).
fn date_of(headers: &reqwest::header::HeaderMap) -> Option<OffsetDateTime> {
    let text = headers.get(DATE)?.to_str().ok()?;
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc2822).ok()
}

/// How long a `Retry-After` asks to wait: delay-seconds, or an HTTP date
/// (IMF-fixdate) counted from Gitea's `date` when it sent one (its clock,
/// not this machine's), else from now. A date already past asks for no
/// wait; a value that is neither asks for nothing.
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

impl Gitea {
    /// A client of the Gitea at `url` (its base URL), reading the token
    /// from `token_file` at each request, each request within `timeout`.
    pub(crate) fn new(
        url: &str,
        token_file: std::path::PathBuf,
        timeout: Duration,
    ) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("nisse-intake-gitea/", env!("CARGO_PKG_VERSION")))
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
    /// attempt it is, and whether an earlier one may have been carried out,
    /// so a write looks for what it made before making it again. `what`
    /// names the operation in logs and reasons.
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
                            "no answer within the call's {} (gitea.call-timeout)",
                            words(budget)
                        ),
                        sent: true,
                    }),
                }
            }
        };
        // backon's own waits end with the attempts; a wait Gitea asks for
        // is taken when longer, and none is taken that ends past the
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
                    "{asked}; given up after {attempts} attempts within the call's {} (gitea.call-timeout)",
                    words(budget)
                ),
                Stop::OutOfTime { wait, left } => format!(
                    "{asked}; the wait of {} ends past the call's {} (gitea.call-timeout, {} left): given up after {attempts} attempt{}",
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
        let mut auth = HeaderValue::from_str(&format!("token {token}"))
            .map_err(|_| ApiError::BadToken(self.token.to_string()))?;
        auth.set_sensitive(true);
        let mut request = self
            .http
            .request(method, url)
            .header(AUTHORIZATION, auth)
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(self.timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let unreachable = |e: reqwest::Error| ApiError::Unreachable {
            what: what.clone(),
            // A refused connection carried nothing; anything later may
            // have.
            sent: !e.is_connect(),
            // Without the URL: it is in `what`, and reqwest's text of
            // a timeout is clearer without it.
            reason: e.without_url().to_string(),
        };
        let mut response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let date = date_of(response.headers());
        let total = response
            .headers()
            .get("x-total-count")
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
                    "a redirect to {}; set gitea.url to where Gitea is served",
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
        // Some answers are a status alone (a merge's 200): read as null.
        if bytes.iter().all(u8::is_ascii_whitespace) {
            bytes = b"null".to_vec();
        }
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(|e| ApiError::Decode {
            what,
            reason: e.to_string(),
        })?;
        Ok(Answer { value, date, total })
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Answer<T>, ApiError> {
        self.request::<T, ()>(Method::GET, path, query, None).await
    }

    /// Every item of a paginated listing (`page`, `limit`), page by page
    /// until it holds `X-Total-Count` items, or, without that header,
    /// until a page comes back empty: Gitea caps `limit` at its
    /// `MAX_RESPONSE_ITEMS`, which an instance may set below what was
    /// asked, so a short page alone does not mean the last. The date is
    /// the first page's.
    async fn list<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Answer<Vec<T>>, ApiError> {
        self.list_until(path, query, |_| false).await
    }

    /// [`Gitea::list`], stopping after the first page holding an item
    /// `past` says is past what is wanted (a listing sorted newest first
    /// reaching what is older than a cursor). The items are every page's
    /// read, that one's included.
    async fn list_until<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
        past: impl Fn(&T) -> bool,
    ) -> Result<Answer<Vec<T>>, ApiError> {
        let mut all = Vec::new();
        let mut date = None;
        for page in 1..=MAX_PAGES {
            let mut q = query.to_vec();
            q.push(("page", page.to_string()));
            q.push(("limit", PAGE.to_string()));
            let answer: Answer<Vec<T>> = self.get(path, &q).await?;
            date = date.or(answer.date);
            let n = answer.value.len();
            let reached = answer.value.iter().any(&past);
            all.extend(answer.value);
            let last = reached
                || match answer.total {
                    Some(total) => all.len() >= total || n == 0,
                    None => n == 0,
                };
            if last {
                return Ok(Answer {
                    value: all,
                    date,
                    total: answer.total,
                });
            }
        }
        Err(ApiError::Decode {
            what: format!("GET /api/v1/{path}"),
            reason: format!("more than {MAX_PAGES} pages of {PAGE}"),
        })
    }

    /// An issue (or pull request) as it is now.
    pub(crate) async fn issue(&self, repo: &str, number: u64) -> Result<Issue, ApiError> {
        Ok(self
            .get(&format!("repos/{repo}/issues/{number}"), &[])
            .await?
            .value)
    }

    /// The issues `number` depends on (Gitea's "blocked by").
    pub(crate) async fn dependencies(
        &self,
        repo: &str,
        number: u64,
    ) -> Result<Vec<Issue>, ApiError> {
        Ok(self
            .list(&format!("repos/{repo}/issues/{number}/dependencies"), &[])
            .await?
            .value)
    }

    /// `branch` of `repo` as the token's account sees it (its protection
    /// and what the account may do).
    pub(crate) async fn branch(
        &self,
        repo: &str,
        branch: &str,
    ) -> Result<shapes::BranchInfo, ApiError> {
        Ok(self
            .get(
                &format!("repos/{repo}/branches/{}", path_segment(branch)),
                &[],
            )
            .await?
            .value)
    }

    /// A pull request as it is now.
    pub(crate) async fn pull(&self, repo: &str, number: u64) -> Result<PullRequest, ApiError> {
        Ok(self
            .get(&format!("repos/{repo}/pulls/{number}"), &[])
            .await?
            .value)
    }

    /// Every pull request (open, closed, merged) updated at or after
    /// `since`, most recently updated first: Gitea's listing has no
    /// `since`, so it is read by `sort=recentupdate` until a page reaches
    /// one updated before.
    pub(crate) async fn pulls_updated(
        &self,
        repo: &str,
        since: OffsetDateTime,
    ) -> Result<Vec<PullRequest>, ApiError> {
        let old = |p: &PullRequest| p.updated_at.is_some_and(|u| u < since);
        let mut pulls = self
            .list_until(
                &format!("repos/{repo}/pulls"),
                &[
                    ("state", "all".to_string()),
                    ("sort", "recentupdate".to_string()),
                ],
                old,
            )
            .await?
            .value;
        pulls.retain(|p| !old(p));
        Ok(pulls)
    }

    /// Issue (or pull request) `number`'s timeline from `since` on.
    pub(crate) async fn timeline_since(
        &self,
        repo: &str,
        number: u64,
        since: OffsetDateTime,
    ) -> Result<Vec<shapes::TimelineEntry>, ApiError> {
        Ok(self
            .list(
                &format!("repos/{repo}/issues/{number}/timeline"),
                &[("since", shapes::rfc3339(Some(since)))],
            )
            .await?
            .value)
    }

    /// The open pull requests.
    pub(crate) async fn open_pulls(&self, repo: &str) -> Result<Vec<PullRequest>, ApiError> {
        Ok(self
            .list(
                &format!("repos/{repo}/pulls"),
                &[("state", "open".to_string())],
            )
            .await?
            .value)
    }

    /// Issues (not pull requests) in `state` (`open`, `all`) updated at or
    /// after `since` (all of them without it).
    pub(crate) async fn issues(
        &self,
        repo: &str,
        state: &str,
        since: Option<OffsetDateTime>,
    ) -> Result<Answer<Vec<Issue>>, ApiError> {
        let mut q = vec![("state", state.to_string()), ("type", "issues".to_string())];
        if since.is_some() {
            q.push(("since", shapes::rfc3339(since)));
        }
        self.list(&format!("repos/{repo}/issues"), &q).await
    }

    /// Every issue (not pull request), open or closed, that `account`
    /// opened, newest first.
    pub(crate) async fn issues_by(
        &self,
        repo: &str,
        account: &str,
    ) -> Result<Vec<Issue>, ApiError> {
        Ok(self
            .list(
                &format!("repos/{repo}/issues"),
                &[
                    ("state", "all".to_string()),
                    ("type", "issues".to_string()),
                    ("created_by", account.to_string()),
                ],
            )
            .await?
            .value)
    }

    /// Opens an issue titled `title` with `body`, assigned to
    /// `assignees` (logins), as the token's account.
    pub(crate) async fn create_issue(
        &self,
        repo: &str,
        title: &str,
        body: &str,
        assignees: &[String],
    ) -> Result<Issue, ApiError> {
        let new = serde_json::json!({ "title": title, "body": body, "assignees": assignees });
        Ok(self
            .request(
                Method::POST,
                &format!("repos/{repo}/issues"),
                &[],
                Some(&new),
            )
            .await?
            .value)
    }

    /// Comments on every issue and pull request of `repo` updated at or
    /// after `since`.
    pub(crate) async fn comments(
        &self,
        repo: &str,
        since: OffsetDateTime,
    ) -> Result<Answer<Vec<Comment>>, ApiError> {
        self.list(
            &format!("repos/{repo}/issues/comments"),
            &[("since", shapes::rfc3339(Some(since)))],
        )
        .await
    }

    /// Every comment on issue `number` (this endpoint is not paginated).
    pub(crate) async fn issue_comments(
        &self,
        repo: &str,
        number: u64,
    ) -> Result<Vec<Comment>, ApiError> {
        Ok(self
            .get(&format!("repos/{repo}/issues/{number}/comments"), &[])
            .await?
            .value)
    }

    /// Issue `number`'s timeline.
    pub(crate) async fn timeline(
        &self,
        repo: &str,
        number: u64,
    ) -> Result<Vec<shapes::TimelineEntry>, ApiError> {
        Ok(self
            .list(&format!("repos/{repo}/issues/{number}/timeline"), &[])
            .await?
            .value)
    }

    /// The reviews of pull request `number`.
    pub(crate) async fn reviews(
        &self,
        repo: &str,
        number: u64,
    ) -> Result<Vec<PullReview>, ApiError> {
        Ok(self
            .list(&format!("repos/{repo}/pulls/{number}/reviews"), &[])
            .await?
            .value)
    }

    /// The inline comments of review `review` (not paginated).
    pub(crate) async fn review_comments(
        &self,
        repo: &str,
        number: u64,
        review: i64,
    ) -> Result<Vec<PullReviewComment>, ApiError> {
        Ok(self
            .get(
                &format!("repos/{repo}/pulls/{number}/reviews/{review}/comments"),
                &[],
            )
            .await?
            .value)
    }

    /// The combined status of commit `sha`: the latest status of each of
    /// its contexts, every page of them (Gitea pages them as a listing),
    /// and their combined state. One page's state is Gitea's own; over
    /// several pages, whose every page Gitea combined alone, they are
    /// combined as Gitea combines them.
    pub(crate) async fn combined_status(
        &self,
        repo: &str,
        sha: &str,
    ) -> Result<CombinedStatus, ApiError> {
        let path = format!("repos/{repo}/commits/{}/status", path_segment(sha));
        let mut all = CombinedStatus::default();
        for page in 1..=MAX_PAGES {
            let q = [("page", page.to_string()), ("limit", PAGE.to_string())];
            let answer: Answer<CombinedStatus> = self.get(&path, &q).await?;
            let n = answer.value.statuses.len();
            if page == 1 {
                all.state = answer.value.state;
            }
            all.statuses.extend(answer.value.statuses);
            // As a listing: without `X-Total-Count`, until a page is empty.
            let last = n == 0
                || answer
                    .total
                    .is_some_and(|total| all.statuses.len() >= total);
            if last {
                if page > 1 {
                    all.state =
                        shapes::combined_state(all.statuses.iter().map(|s| s.status.as_str()));
                }
                return Ok(all);
            }
        }
        Err(ApiError::Decode {
            what: format!("GET /api/v1/{path}"),
            reason: format!("more than {MAX_PAGES} pages of {PAGE}"),
        })
    }

    /// Merges pull request `number` with a merge commit (`Do: merge`)
    /// titled `title` with `message`, only while its head is `head_sha`
    /// (Gitea answers 409 when it moved). Gitea answers a merge with its
    /// status alone; it refuses (405) one its branch protection does not
    /// allow yet: approvals or status checks missing.
    pub(crate) async fn merge_pull(
        &self,
        repo: &str,
        number: u64,
        head_sha: &str,
        title: &str,
        message: &str,
    ) -> Result<(), ApiError> {
        // The field names of Gitea's MergePullRequestOption, which Go reads
        // without regard to case (later versions also take snake_case).
        let merge = serde_json::json!({
            "Do": "merge",
            "MergeTitleField": title,
            "MergeMessageField": message,
            "head_commit_id": head_sha,
        });
        self.request::<serde::de::IgnoredAny, _>(
            Method::POST,
            &format!("repos/{repo}/pulls/{number}/merge"),
            &[],
            Some(&merge),
        )
        .await
        .map(drop)
    }

    /// Comments `body` on issue or pull request `number`.
    pub(crate) async fn create_comment(
        &self,
        repo: &str,
        number: u64,
        body: &str,
    ) -> Result<Comment, ApiError> {
        let body = serde_json::json!({ "body": body });
        Ok(self
            .request(
                Method::POST,
                &format!("repos/{repo}/issues/{number}/comments"),
                &[],
                Some(&body),
            )
            .await?
            .value)
    }

    /// Opens a pull request of `head` into `base`.
    pub(crate) async fn create_pull(
        &self,
        repo: &str,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<PullRequest, ApiError> {
        let body = serde_json::json!({ "head": head, "base": base, "title": title, "body": body });
        Ok(self
            .request(
                Method::POST,
                &format!("repos/{repo}/pulls"),
                &[],
                Some(&body),
            )
            .await?
            .value)
    }

    /// Sets pull request `number`'s title and body (and base, when given).
    pub(crate) async fn edit_pull(
        &self,
        repo: &str,
        number: u64,
        title: &str,
        body: &str,
        base: Option<&str>,
    ) -> Result<PullRequest, ApiError> {
        let mut edit = serde_json::json!({ "title": title, "body": body });
        if let Some(base) = base {
            edit["base"] = serde_json::Value::from(base);
        }
        Ok(self
            .request(
                Method::PATCH,
                &format!("repos/{repo}/pulls/{number}"),
                &[],
                Some(&edit),
            )
            .await?
            .value)
    }

    /// A review of pull request `number` with event COMMENT holding one
    /// inline comment: at `line` of the new version, or at `old_line` of
    /// the old one when `line` is 0.
    pub(crate) async fn create_review_comment(
        &self,
        repo: &str,
        number: u64,
        path: &str,
        line: i64,
        old_line: i64,
        body: &str,
    ) -> Result<PullReview, ApiError> {
        let (new_position, old_position) = if line > 0 { (line, 0) } else { (0, old_line) };
        let review = serde_json::json!({
            "event": "COMMENT",
            "body": "",
            "comments": [{
                "path": path,
                "body": body,
                "new_position": new_position,
                "old_position": old_position,
            }],
        });
        Ok(self
            .request(
                Method::POST,
                &format!("repos/{repo}/pulls/{number}/reviews"),
                &[],
                Some(&review),
            )
            .await?
            .value)
    }

    /// Closes issue `number`.
    pub(crate) async fn close_issue(&self, repo: &str, number: u64) -> Result<Issue, ApiError> {
        let edit = serde_json::json!({ "state": "closed" });
        Ok(self
            .request(
                Method::PATCH,
                &format!("repos/{repo}/issues/{number}"),
                &[],
                Some(&edit),
            )
            .await?
            .value)
    }
}

/// What an error answer says: Gitea's `message`, else the start of the
/// body, else the status's reason.
fn error_message(status: StatusCode, body: &[u8]) -> String {
    if let Ok(e) = serde_json::from_slice::<shapes::ApiError>(body)
        && !e.message.trim().is_empty()
    {
        return e.message;
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

/// `name` (a branch, which may hold `/`) for a URL path: every byte but
/// the unreserved ones and `/` percent-encoded, so a `#` or `%` in a
/// branch name stays part of the name.
fn path_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitea_dates_read() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(
            DATE,
            HeaderValue::from_static("Wed, 01 May 2024 08:00:05 GMT"),
        );
        let d = date_of(&h).unwrap();
        assert_eq!(d.unix_timestamp(), 1_714_550_405);
    }

    #[test]
    fn error_messages_are_giteas_own() {
        assert_eq!(
            error_message(
                StatusCode::UNPROCESSABLE_ENTITY,
                br#"{"message":"issue is locked","url":"x"}"#
            ),
            "issue is locked"
        );
        assert_eq!(error_message(StatusCode::BAD_GATEWAY, b"  "), "Bad Gateway");
        assert_eq!(error_message(StatusCode::NOT_FOUND, b"nope"), "nope");
    }

    #[test]
    fn which_failures_are_worth_another_try() {
        let status = |s| ApiError::Status {
            what: "GET x".into(),
            status: s,
            message: String::new(),
            retry_after: None,
        };
        assert!(status(500).transient());
        assert!(status(503).transient());
        assert!(status(429).transient());
        assert!(!status(404).transient());
        assert!(!status(422).transient());
        let unreachable = |sent| ApiError::Unreachable {
            what: "x".into(),
            reason: "refused".into(),
            sent,
        };
        assert!(unreachable(true).transient());
        assert_eq!(status(404).http_status(), 404);
        let gave_up = ApiError::GaveUp {
            last: Box::new(status(503)),
            why: "w".into(),
        };
        assert!(!gave_up.transient(), "retried already");
        assert_eq!(gave_up.http_status(), 503);
    }

    #[test]
    fn only_what_never_reached_gitea_or_was_refused_unread_is_safe_to_make_again() {
        let status = |s| ApiError::Status {
            what: "POST x".into(),
            status: s,
            message: String::new(),
            retry_after: None,
        };
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
        let first = Attempt::default();
        assert_eq!(
            first.after(&status(429)),
            Attempt {
                number: 1,
                uncertain: false
            }
        );
        // Once unsure, always: a later 429 does not undo an earlier reset.
        let unsure = first.after(&unreachable(true)).after(&status(429));
        assert_eq!(
            unsure,
            Attempt {
                number: 2,
                uncertain: true
            }
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates_on_giteas_clock() {
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
        assert_eq!(retry_after(&headers(" 0 "), date), Some(Duration::ZERO));
        // Gitea's Date is 08:00:05: ten seconds on its clock, whatever
        // this machine's says.
        assert_eq!(
            retry_after(&headers("Wed, 01 May 2024 08:00:15 GMT"), date),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after(&headers("Wed, 01 May 2024 08:00:00 GMT"), date),
            Some(Duration::ZERO),
            "a date past asks for no wait"
        );
        assert_eq!(
            retry_after(&headers("99999999999999999999999"), date),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(retry_after(&headers("soon"), date), None);
        assert_eq!(retry_after(&headers("-5"), date), None);
        assert_eq!(retry_after(&reqwest::header::HeaderMap::new(), date), None);
    }
}
