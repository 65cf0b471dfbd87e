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
//! fails for good, or [`http::ATTEMPTS`] attempts failed transiently, all within
//! `call-timeout`: attempts, and the waits between them, never run past
//! it. The waits are [`http::RETRY`]'s backoff, or longer when Gitea (or a proxy
//! in front of it) answers 429 or 503 with `Retry-After` (seconds, or an
//! HTTP date read against Gitea's own `Date`); a wait that would end past
//! the timeout is not waited, and the call fails naming the status and
//! the wait asked for. The retry loop is the `backon` crate's, over the
//! workspace's one backoff ([`nisse_bus::Backoff`]).

use std::time::Duration;

use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use time::OffsetDateTime;

use nisse_bus::secret::Secret;
use nisse_intake_kit::http::{self, Service};

use crate::shapes::{
    self, CombinedStatus, Comment, Issue, PullRequest, PullReview, PullReviewComment,
};

/// Items asked for per page; Gitea's default `MAX_RESPONSE_ITEMS` is 50.
const PAGE: usize = 50;

/// Pages read of one listing at most: a listing past this is refused
/// rather than read without end.
const MAX_PAGES: usize = 200;

/// Gitea as the shared API machinery ([`nisse_intake_kit::http`]) names
/// it: the retry loop and the errors are the Vikunja intake's too, and only
/// the name, the config section and the error body are Gitea's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GiteaApi;

impl Service for GiteaApi {
    const NAME: &'static str = "Gitea";
    const SECTION: &'static str = "gitea";

    fn message(body: &[u8]) -> Option<String> {
        serde_json::from_slice::<shapes::ApiError>(body)
            .ok()
            .map(|e| e.message)
            .filter(|m| !m.trim().is_empty())
    }
}

/// Why a call to Gitea did not give an answer.
pub(crate) type ApiError = http::ApiError<GiteaApi>;

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

pub(crate) use nisse_intake_kit::http::Attempt;

impl Gitea {
    /// A client of the Gitea at `url` (its base URL), reading the token
    /// from `token_file` at each request, each request within `timeout`.
    pub(crate) fn new(
        url: &str,
        token_file: std::path::PathBuf,
        timeout: Duration,
    ) -> Result<Self, String> {
        let http = http::client(
            timeout,
            concat!("nisse-intake-gitea/", env!("CARGO_PKG_VERSION")),
        )?;
        Ok(Self {
            http,
            api: format!("{}/api/v1", url.trim_end_matches('/')),
            token: Secret::File(token_file),
            timeout,
        })
    }

    /// Runs `op` until it works, fails for good, or [`http::ATTEMPTS`] attempts
    /// failed transiently, within `gitea.call-timeout` ([`http::retrying`],
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
        let (what, mut request) = http::prepare::<GiteaApi>(
            &self.http,
            &self.api,
            method,
            path,
            query,
            &self.token,
            "token",
            self.timeout,
        )?;
        if let Some(body) = body {
            request = request.json(body);
        }
        let answer = http::send::<GiteaApi>(request, &what).await?;
        let total = answer
            .headers
            .get("x-total-count")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let date = answer.date;
        let mut bytes = answer.bytes;
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
#[cfg(test)]
fn error_message(status: reqwest::StatusCode, body: &[u8]) -> String {
    http::error_message::<GiteaApi>(status, body)
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
    use nisse_intake_kit::http::{date_of, retry_after};
    use reqwest::StatusCode;
    use reqwest::header::{DATE, HeaderValue, RETRY_AFTER};

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
