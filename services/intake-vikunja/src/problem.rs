//! RFC 9457 problem details (`application/problem+json`): every error the
//! webhook receiver answers is one of these, so Vikunja's log of a failed
//! delivery shows what exactly was wrong.

use axum::http::header::{ALLOW, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The media type of a problem document.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// Where problem type URIs live. `.invalid` never resolves: the URIs are
/// stable identifiers, not pages.
const TYPE_BASE: &str = "https://nisse.invalid/problems/vikunja/";

/// Seconds a client should wait before retrying after a 503.
const RETRY_AFTER_SECS: &str = "5";

/// What a 401 challenges for: no HTTP scheme fits a signed body, so it
/// names the header Vikunja signs with.
const CHALLENGE: &str = "HMAC-SHA256 header=\"X-Vikunja-Signature\"";

/// The kinds of problem, each with a stable type URI, title and status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// No signature, or not the webhook secret's.
    BadSignature,
    /// The body is not declared as JSON.
    UnsupportedMediaType,
    /// The body is larger than `max-body`.
    PayloadTooLarge,
    /// The event would be larger than the NATS server accepts.
    MessageTooLarge,
    /// The body is not JSON of the event's shape.
    InvalidJson,
    /// A task in a project this agent is not configured for.
    ProjectNotServed,
    /// The client took too long to send its body.
    RequestTimeout,
    /// JetStream did not store the event (or its record); retry.
    NotStored,
    /// Not connected to NATS.
    NotReady,
    /// The webhook secret file cannot be read now.
    SecretUnavailable,
    /// No such route.
    NotFound,
    /// The route exists for another method.
    MethodNotAllowed,
}

impl Kind {
    fn parts(self) -> (&'static str, &'static str, StatusCode) {
        match self {
            Self::BadSignature => (
                "bad-signature",
                "The delivery is not signed with the webhook's secret",
                StatusCode::UNAUTHORIZED,
            ),
            Self::UnsupportedMediaType => (
                "unsupported-media-type",
                "The body must be JSON",
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            Self::PayloadTooLarge => (
                "payload-too-large",
                "The request body is too large",
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            Self::MessageTooLarge => (
                "message-too-large",
                "The event is larger than the bus accepts as one message",
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            Self::InvalidJson => (
                "invalid-json",
                "The body is not a valid Vikunja webhook payload",
                StatusCode::BAD_REQUEST,
            ),
            Self::ProjectNotServed => (
                "project-not-served",
                "The project is not one this agent serves",
                StatusCode::FORBIDDEN,
            ),
            Self::RequestTimeout => (
                "request-timeout",
                "The request body took too long",
                StatusCode::REQUEST_TIMEOUT,
            ),
            Self::NotStored => (
                "not-stored",
                "The delivery could not be stored; retry",
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            Self::NotReady => (
                "not-ready",
                "Not connected to NATS",
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            Self::SecretUnavailable => (
                "secret-unavailable",
                "The signature cannot be checked now",
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            Self::NotFound => ("not-found", "No such resource", StatusCode::NOT_FOUND),
            Self::MethodNotAllowed => (
                "method-not-allowed",
                "Method not allowed",
                StatusCode::METHOD_NOT_ALLOWED,
            ),
        }
    }
}

/// A problem response: what went wrong, as a problem document with the
/// right status and headers.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    kind: Kind,
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

impl Problem {
    /// A problem of `kind` with `detail` saying what exactly is wrong.
    pub(crate) fn new(kind: Kind, detail: impl Into<String>) -> Self {
        let mut headers = Vec::new();
        // Every 503 is transient: say so, so well-behaved clients retry.
        if matches!(
            kind,
            Kind::NotStored | Kind::NotReady | Kind::SecretUnavailable
        ) {
            headers.push((RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS)));
        }
        if kind == Kind::BadSignature {
            headers.push((WWW_AUTHENTICATE, HeaderValue::from_static(CHALLENGE)));
        }
        Self {
            kind,
            detail: detail.into(),
            headers,
        }
    }

    /// A 405 naming the allowed method.
    pub(crate) fn method_not_allowed(allow: &'static str) -> Self {
        let mut p = Self::new(
            Kind::MethodNotAllowed,
            format!("this resource only answers {allow}"),
        );
        p.headers.push((ALLOW, HeaderValue::from_static(allow)));
        p
    }

    /// Its kind.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// What exactly is wrong.
    pub(crate) fn detail(&self) -> &str {
        &self.detail
    }

    /// Its HTTP status.
    pub(crate) fn status(&self) -> StatusCode {
        self.kind.parts().2
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let (slug, title, status) = self.kind.parts();
        let doc = Document {
            type_uri: format!("{TYPE_BASE}{slug}"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_document_with_the_right_status_and_headers() {
        let r = Problem::new(Kind::BadSignature, "wrong").into_response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(r.headers()[WWW_AUTHENTICATE], CHALLENGE);
        let r = Problem::new(Kind::NotStored, "down").into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], RETRY_AFTER_SECS);
        assert_eq!(
            Problem::new(Kind::ProjectNotServed, "x").status(),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            Problem::new(Kind::InvalidJson, "x").status(),
            StatusCode::BAD_REQUEST
        );
    }
}
