//! The Gitea API client: the calls this service makes, as Gitea's API
//! description (`templates/swagger/v1_json.tmpl`) has them, with the
//! agent's token read from its file at every request.
//!
//! The token is sent as `Authorization: token <t>`, marked sensitive so
//! no debug output of a request shows it, and never logged: errors name
//! the method and path, which hold no secret. Redirects are not followed
//! (a POST turned into a GET, or the token sent to another host, are
//! worse than an error naming where Gitea points).

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, DATE, HeaderValue, LOCATION};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use time::OffsetDateTime;

use nisse_bus::Backoff;
use nisse_bus::secret::{Secret, SecretError};

use crate::shapes::{self, Comment, Issue, PullRequest, PullReview, PullReviewComment};

/// Items asked for per page; Gitea's default `MAX_RESPONSE_ITEMS` is 50.
const PAGE: usize = 50;

/// Pages read of one listing at most: a listing past this is refused
/// rather than read without end.
const MAX_PAGES: usize = 200;

/// Largest answer read from Gitea.
const MAX_ANSWER: usize = 32 * 1024 * 1024;

/// Attempts of one call when it fails transiently (Gitea unreachable,
/// 5xx, 429), with [`RETRY`]'s waits between them.
pub(crate) const ATTEMPTS: u32 = 4;

/// Waits between attempts: 0.5 s, 1 s, 2 s...
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
            Self::BadToken(_) | Self::Missing(_) | Self::Decode { .. } => false,
        }
    }

    /// Gitea's HTTP status, when it answered.
    pub(crate) fn http_status(&self) -> u32 {
        match self {
            Self::Status { status, .. } => u32::from(*status),
            _ => 0,
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

/// Runs `op` until it succeeds, fails for good, or [`ATTEMPTS`] attempts
/// failed transiently; `op` is told which attempt it is (0 first), so a
/// call that may have reached Gitea looks for what it made before making
/// it again.
pub(crate) async fn retrying<T, F, Fut>(what: &str, mut op: F) -> Result<T, ApiError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, ApiError>>,
{
    let mut waits = RETRY.delays();
    let mut attempt = 0;
    loop {
        match op(attempt).await {
            Ok(v) => return Ok(v),
            Err(e) if e.transient() && attempt + 1 < ATTEMPTS => {
                let wait = waits.next().unwrap_or(RETRY.max());
                tracing::warn!(
                    attempt = attempt + 1,
                    "{what}: {e}; trying again in {}",
                    humantime::format_duration(wait)
                );
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Gitea's `Date` header (RFC 9110's IMF-fixdate, a form of RFC 2822).
fn date_of(headers: &reqwest::header::HeaderMap) -> Option<OffsetDateTime> {
    let text = headers.get(DATE)?.to_str().ok()?;
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc2822).ok()
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
            });
        }
        if !status.is_success() {
            return Err(ApiError::Status {
                what,
                status: status.as_u16(),
                message: error_message(status, &bytes),
            });
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
        let mut all = Vec::new();
        let mut date = None;
        for page in 1..=MAX_PAGES {
            let mut q = query.to_vec();
            q.push(("page", page.to_string()));
            q.push(("limit", PAGE.to_string()));
            let answer: Answer<Vec<T>> = self.get(path, &q).await?;
            date = date.or(answer.date);
            let n = answer.value.len();
            all.extend(answer.value);
            let last = match answer.total {
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

    /// A pull request as it is now.
    pub(crate) async fn pull(&self, repo: &str, number: u64) -> Result<PullRequest, ApiError> {
        Ok(self
            .get(&format!("repos/{repo}/pulls/{number}"), &[])
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
        };
        assert!(status(500).transient());
        assert!(status(503).transient());
        assert!(status(429).transient());
        assert!(!status(404).transient());
        assert!(!status(422).transient());
        assert!(
            ApiError::Unreachable {
                what: "x".into(),
                reason: "refused".into()
            }
            .transient()
        );
        assert_eq!(status(404).http_status(), 404);
    }
}
