//! The intakes' API calls: why a call failed ([`ApiError`]), and running
//! one operation until it works, fails for good, or [`ATTEMPTS`] attempts
//! failed transiently, all within the call's timeout ([`retrying`]).
//!
//! Shared because Gitea and Vikunja are called the same way: the same
//! transient failures, the same rule for when a write may have been made
//! (so it is looked for before it is made again), the same `Retry-After`
//! (seconds, or an HTTP date read against the service's own `Date`), the
//! same waits. What differs is the service's name in the errors and the
//! shape of its error body, given by a [`Service`]. The retry loop is the
//! `backon` crate's, over the workspace's one backoff
//! ([`nisse_bus::Backoff`]).

use std::convert::Infallible;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use backon::Retryable as _;
use reqwest::StatusCode;
use reqwest::header::{DATE, HeaderMap, LOCATION, RETRY_AFTER};
use time::OffsetDateTime;
use tokio::time::Instant;

use nisse_bus::Backoff;
use nisse_bus::secret::SecretError;

/// Largest answer read from the service.
pub const MAX_ANSWER: usize = 32 * 1024 * 1024;

/// Attempts of one call at most when it fails transiently (the service
/// unreachable, 5xx, 429), with [`RETRY`]'s waits (or `Retry-After`)
/// between them, all within the call's timeout.
pub const ATTEMPTS: u32 = 4;

/// Waits between attempts when the service asks for none (or for less):
/// 0.5 s, 1 s, 2 s...
pub const RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(8));

/// What differs between the services called: the name errors give it,
/// the config section its settings are under, and its error body.
pub trait Service: Debug + Clone + Copy + Send + Sync + 'static {
    /// The service as errors name it (`Gitea`).
    const NAME: &'static str;
    /// Its config section (`gitea`), as reasons name `call-timeout`.
    const SECTION: &'static str;
    /// The message its error `body` carries, when it is the service's
    /// own error shape and says something.
    fn message(body: &[u8]) -> Option<String>;
}

/// Why a call to `S` did not give an answer.
#[derive(Debug, Clone)]
pub enum ApiError<S: Service> {
    /// The token file cannot be read now (being rotated, removed).
    Token(SecretError),
    /// The token is not something an HTTP header can carry.
    BadToken(String),
    /// No answer: connection refused, reset, timed out.
    Unreachable {
        /// The method and path.
        what: String,
        /// What failed.
        reason: String,
        /// Whether the request may have reached the service (it was
        /// sent, or may have been, before the failure): a write then may
        /// have been made, and is looked for before it is made again.
        sent: bool,
    },
    /// The service answered with an error status.
    Status {
        /// The method and path.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The service's own message, or what it said instead.
        message: String,
        /// How long it asked to be left alone (`Retry-After`, read on a
        /// 429 or a 503 only).
        retry_after: Option<Duration>,
    },
    /// A transient failure that retrying did not get past: the last
    /// failure, and why no further attempt was made.
    GaveUp {
        /// The last attempt's failure.
        last: Box<ApiError<S>>,
        /// Why it was not tried again: the attempts spent, or a wait
        /// (`Retry-After`) ending past `call-timeout`.
        why: String,
    },
    /// What the call is about is not in the service (found by reading,
    /// not answered as an error status).
    Missing(String),
    /// The service answered something that is not what its API
    /// describes.
    Decode {
        /// The method and path.
        what: String,
        /// What is wrong, naming the field.
        reason: String,
    },
    /// Never made: it only carries `S`.
    #[doc(hidden)]
    Never(Infallible, PhantomData<S>),
}

impl<S: Service> std::fmt::Display for ApiError<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = S::NAME;
        match self {
            Self::Token(e) => write!(f, "the agent's {name} token cannot be read: {e}"),
            Self::BadToken(t) => write!(
                f,
                "the agent's {name} token ({t}) holds characters an HTTP header cannot carry"
            ),
            Self::Unreachable { what, reason, .. } => {
                write!(f, "{name} could not be reached for {what}: {reason}")
            }
            Self::Status {
                what,
                status,
                message,
                ..
            } => write!(f, "{name} answered {status} to {what}: {message}"),
            Self::GaveUp { last, why } => write!(f, "{last}; {why}"),
            Self::Missing(m) => f.write_str(m),
            Self::Decode { what, reason } => write!(
                f,
                "{name}'s answer to {what} is not what its API describes: {reason}"
            ),
            Self::Never(never, _) => match *never {},
        }
    }
}

impl<S: Service> std::error::Error for ApiError<S> {}

impl<S: Service> ApiError<S> {
    /// Whether trying again later may work: the service unreachable or
    /// overloaded, the token file missing for a moment.
    pub fn transient(&self) -> bool {
        match self {
            Self::Token(_) | Self::Unreachable { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 429 || *status == 408,
            // Retried already.
            Self::GaveUp { .. } => false,
            Self::BadToken(_) | Self::Missing(_) | Self::Decode { .. } | Self::Never(..) => false,
        }
    }

    /// Whether the service certainly did nothing of the request: it was
    /// never sent (the token unreadable, the connection refused), or it
    /// was refused unread (429, Too Many Requests). Anything else that
    /// failed after sending (no answer, a reset, a 5xx, even a 503 from a
    /// proxy that may have passed it on) leaves a write's outcome
    /// unknown.
    pub fn not_carried_out(&self) -> bool {
        match self {
            Self::Token(_) | Self::BadToken(_) => true,
            Self::Unreachable { sent, .. } => !sent,
            Self::Status { status, .. } => *status == 429,
            Self::GaveUp { last, .. } => last.not_carried_out(),
            Self::Missing(_) | Self::Decode { .. } | Self::Never(..) => false,
        }
    }

    /// The service's HTTP status, when it answered.
    pub fn http_status(&self) -> u32 {
        match self {
            Self::Status { status, .. } => u32::from(*status),
            Self::GaveUp { last, .. } => last.http_status(),
            _ => 0,
        }
    }

    /// The wait the service asked for (`Retry-After`), if it asked.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            Self::GaveUp { last, .. } => last.retry_after(),
            _ => None,
        }
    }

    /// Whether the service answered `status`.
    pub fn is_status(&self, status: u16) -> bool {
        matches!(self, Self::Status { status: s, .. } if *s == status)
    }
}

/// Which attempt of an operation [`retrying`] is making.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attempt {
    /// 0 for the first.
    pub number: u32,
    /// Whether an earlier attempt may have been carried out by the
    /// service (it failed after its request may have reached it, not by a
    /// refusal such as a 429): a write then looks for what it made before
    /// making it again.
    pub uncertain: bool,
}

impl Attempt {
    /// The attempt after one that failed with `e`.
    pub fn after<S: Service>(self, e: &ApiError<S>) -> Self {
        Self {
            number: self.number + 1,
            uncertain: self.uncertain || !e.not_carried_out(),
        }
    }
}

/// How far [`retrying`] got: the attempt to make next, and why it stopped
/// trying, once it did. Shared by backon's callbacks; a mutex, not a
/// cell, so the call stays `Send`.
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

/// Why [`retrying`] stopped trying before the operation worked.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// [`ATTEMPTS`] attempts were made.
    Attempts,
    /// The wait before the next attempt would end past the timeout.
    OutOfTime { wait: Duration, left: Duration },
}

/// A duration as the reasons write it, to the millisecond.
pub fn words(d: Duration) -> String {
    let ms = Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    humantime::format_duration(ms).to_string()
}

/// The service's `Date` header (RFC 9110's IMF-fixdate, a form of RFC
/// 2822): its clock, which its own filters compare with.
pub fn date_of(headers: &HeaderMap) -> Option<OffsetDateTime> {
    let text = headers.get(DATE)?.to_str().ok()?;
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc2822).ok()
}

/// How long a `Retry-After` asks to wait: delay-seconds, or an HTTP date
/// (IMF-fixdate) counted from the service's `date` when it sent one (its
/// clock, not this machine's), else from now. A date already past asks
/// for no wait; a value that is neither asks for nothing.
pub fn retry_after(headers: &HeaderMap, date: Option<OffsetDateTime>) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than a u64 holds is a wait past any timeout.
        return Some(Duration::from_secs(text.parse().unwrap_or(u64::MAX)));
    }
    let at = OffsetDateTime::parse(text, &time::format_description::well_known::Rfc2822).ok()?;
    let from = date.unwrap_or_else(OffsetDateTime::now_utc);
    Some(Duration::try_from(at - from).unwrap_or(Duration::ZERO))
}

/// What an error answer says: the service's own message
/// ([`Service::message`]), else the body's text (cut short), else the
/// status's reason.
pub fn error_message<S: Service>(status: StatusCode, body: &[u8]) -> String {
    if let Some(message) = S::message(body) {
        return message;
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

/// Runs `op` until it works, fails for good, or [`ATTEMPTS`] attempts
/// failed transiently, the attempts and the waits between them within
/// `budget` (the service's `call-timeout`). `op` is told which attempt it
/// is, and whether an earlier one may have been carried out, so a write
/// looks for what it made before making it again. `what` names the
/// operation in logs and reasons.
pub async fn retrying<S, T, F, Fut>(
    budget: Duration,
    what: &str,
    mut op: F,
) -> Result<T, ApiError<S>>
where
    S: Service,
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, ApiError<S>>>,
{
    let section = S::SECTION;
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
                        "no answer within the call's {} ({section}.call-timeout)",
                        words(budget)
                    ),
                    sent: true,
                }),
            }
        }
    };
    // backon's own waits end with the attempts; a wait the service asks
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
                "{asked}; given up after {attempts} attempts within the call's {} ({section}.call-timeout)",
                words(budget)
            ),
            Stop::OutOfTime { wait, left } => format!(
                "{asked}; the wait of {} ends past the call's {} ({section}.call-timeout, {} left): given up after {attempts} attempt{}",
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

/// A successful answer, read whole: its body, its `Date`, and its
/// headers (for the service's own, such as a listing's page count).
#[derive(Debug)]
pub struct Received {
    /// The body, at most [`MAX_ANSWER`] bytes.
    pub bytes: Vec<u8>,
    /// The service's `Date` ([`date_of`]).
    pub date: Option<OffsetDateTime>,
    /// Every header of the answer.
    pub headers: HeaderMap,
}

/// Sends `request` (`what`: its method and path) and reads its answer
/// whole, at most [`MAX_ANSWER`] bytes: a redirect, or an error status
/// with the service's message and `Retry-After` (on a 429 or a 503), is
/// an [`ApiError::Status`]; no answer is [`ApiError::Unreachable`],
/// saying whether the request may have been sent.
pub async fn send<S: Service>(
    request: reqwest::RequestBuilder,
    what: &str,
) -> Result<Received, ApiError<S>> {
    let unreachable = |e: reqwest::Error| ApiError::Unreachable {
        what: what.to_string(),
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
    let headers = response.headers().clone();
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
        if bytes.len() + chunk.len() > MAX_ANSWER {
            return Err(ApiError::Decode {
                what: what.to_string(),
                reason: format!("the answer is larger than {} MiB", MAX_ANSWER >> 20),
            });
        }
        bytes.extend_from_slice(&chunk);
    }
    if status.is_redirection() {
        return Err(ApiError::Status {
            what: what.to_string(),
            status: status.as_u16(),
            message: format!(
                "a redirect to {}; set {}.url to where {} is served",
                location.as_deref().unwrap_or("nowhere"),
                S::SECTION,
                S::NAME
            ),
            retry_after: None,
        });
    }
    if !status.is_success() {
        return Err(ApiError::Status {
            what: what.to_string(),
            status: status.as_u16(),
            message: error_message::<S>(status, &bytes),
            retry_after,
        });
    }
    Ok(Received {
        bytes,
        date,
        headers,
    })
}

/// The HTTP client an intake calls its service with: connections within
/// `timeout` (at most 10 s), no redirects followed (one is reported as
/// a misconfigured URL), `user_agent` naming the intake.
pub fn client(timeout: Duration, user_agent: &str) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(user_agent)
        .build()
        .map_err(|e| format!("cannot make the HTTP client: {e}"))
}

/// A request for `method` on `path` under `api` (`<url>/api/v1`) with
/// `query`, as the agent: its token read from `token` now (a rotated
/// token takes effect at once) and sent as `Authorization: <scheme>
/// <token>`, marked sensitive, within `timeout`. With it, `what` the
/// errors name it by.
#[allow(clippy::too_many_arguments)]
pub fn prepare<S: Service>(
    http: &reqwest::Client,
    api: &str,
    method: reqwest::Method,
    path: &str,
    query: &[(&str, String)],
    token: &nisse_bus::secret::Secret,
    scheme: &str,
    timeout: Duration,
) -> Result<(String, reqwest::RequestBuilder), ApiError<S>> {
    let what = format!("{method} /api/v1/{path}");
    let mut url =
        reqwest::Url::parse(&format!("{api}/{path}")).map_err(|e| ApiError::Unreachable {
            what: what.clone(),
            reason: format!("not a URL: {e}"),
            sent: false,
        })?;
    if !query.is_empty() {
        let mut pairs = url.query_pairs_mut();
        for (k, v) in query {
            pairs.append_pair(k, v);
        }
    }
    let text = token.read_text().map_err(ApiError::Token)?;
    let mut auth = reqwest::header::HeaderValue::from_str(&format!("{scheme} {text}"))
        .map_err(|_| ApiError::BadToken(token.to_string()))?;
    auth.set_sensitive(true);
    let request = http
        .request(method, url)
        .header(reqwest::header::AUTHORIZATION, auth)
        .header(reqwest::header::ACCEPT, "application/json")
        .timeout(timeout);
    Ok((what, request))
}
