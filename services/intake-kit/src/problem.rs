//! RFC 9457 problem details (`application/problem+json`): every error a
//! webhook receiver answers is one of these, so the service's log of a
//! failed delivery shows what exactly was wrong.
//!
//! Shared because the Gitea and Vikunja receivers answer with the same
//! document, the same `Retry-After` on every 503 and the same challenge
//! on a 401; which kinds of problem there are, their type URIs and the
//! header named in the challenge are each service's ([`ProblemKind`]).

use std::fmt::Debug;

use axum::http::header::{ALLOW, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The media type of a problem document.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Seconds a client should wait before retrying after a 503.
pub const RETRY_AFTER_SECS: &str = "5";

/// A service's kinds of problem, each with a stable type URI, title and
/// status, and the few kinds the shared receiver code answers with.
pub trait ProblemKind: Debug + Clone + Copy + PartialEq + Eq + Send + Sync + 'static {
    /// Where the service's problem type URIs live
    /// (`https://nisse.invalid/problems/gitea/`). `.invalid` never
    /// resolves: the URIs are stable identifiers, not pages.
    const TYPE_BASE: &'static str;
    /// What a 401 challenges for: no HTTP scheme fits a signed body, so
    /// it names the header the service signs with.
    const CHALLENGE: &'static str;
    /// No signature, or not the webhook secret's (answered with the
    /// challenge).
    const BAD_SIGNATURE: Self;
    /// The route exists for another method.
    const METHOD_NOT_ALLOWED: Self;
    /// The body is not declared as JSON.
    const UNSUPPORTED_MEDIA_TYPE: Self;
    /// The body is larger than `max-body`.
    const PAYLOAD_TOO_LARGE: Self;
    /// The body is not JSON of the event's shape (or not readable).
    const INVALID_JSON: Self;
    /// The client took too long to send its body.
    const REQUEST_TIMEOUT: Self;
    /// Not connected to NATS.
    const NOT_READY: Self;

    /// Its type URI's last segment, title and status.
    fn parts(self) -> (&'static str, &'static str, StatusCode);
}

/// A problem response: what went wrong, as a problem document with the
/// right status and headers.
#[derive(Debug, Clone)]
pub struct Problem<K: ProblemKind> {
    kind: K,
    detail: String,
    headers: Vec<(HeaderName, HeaderValue)>,
}

#[derive(Serialize)]
struct Document<'a> {
    #[serde(rename = "type")]
    type_uri: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

impl<K: ProblemKind> Problem<K> {
    /// A problem of `kind` with `detail` saying what exactly is wrong.
    pub fn new(kind: K, detail: impl Into<String>) -> Self {
        let mut headers = Vec::new();
        // Every 503 is transient: say so, so well-behaved clients retry.
        if kind.parts().2 == StatusCode::SERVICE_UNAVAILABLE {
            headers.push((RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS)));
        }
        if kind == K::BAD_SIGNATURE {
            headers.push((WWW_AUTHENTICATE, HeaderValue::from_static(K::CHALLENGE)));
        }
        Self {
            kind,
            detail: detail.into(),
            headers,
        }
    }

    /// A 405 naming the allowed method.
    pub fn method_not_allowed(allow: &'static str) -> Self {
        let mut p = Self::new(
            K::METHOD_NOT_ALLOWED,
            format!("this resource only answers {allow}"),
        );
        p.headers.push((ALLOW, HeaderValue::from_static(allow)));
        p
    }

    /// Its kind.
    pub fn kind(&self) -> K {
        self.kind
    }

    /// What exactly is wrong.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// Its HTTP status.
    pub fn status(&self) -> StatusCode {
        self.kind.parts().2
    }
}

impl<K: ProblemKind> IntoResponse for Problem<K> {
    fn into_response(self) -> Response {
        let (slug, title, status) = self.kind.parts();
        let doc = Document {
            type_uri: format!("{}{slug}", K::TYPE_BASE),
            title,
            status: status.as_u16(),
            detail: &self.detail,
        };
        // Serializing four strings and a number cannot fail; the fallback
        // keeps the status right even so.
        let body = serde_json::to_vec(&doc).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        response
    }
}
