//! RFC 9457 problem details (`application/problem+json`): every error the
//! webhook receiver answers is one of these, so Gitea's delivery log (the
//! webhook's "Recent deliveries") shows what exactly was wrong.

use axum::http::StatusCode;
use nisse_intake_kit::problem::{self, ProblemKind};

/// What a 401 challenges for: no HTTP scheme fits a signed body, so it
/// names the header Gitea signs with.
const CHALLENGE: &str = "HMAC-SHA256 header=\"X-Gitea-Signature\"";

/// The kinds of problem, each with a stable type URI, title and status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// No signature, or not the webhook secret's.
    BadSignature,
    /// The body is not declared as JSON.
    UnsupportedMediaType,
    /// The body is larger than `max-body`.
    PayloadTooLarge,
    /// A message would be larger than the NATS server accepts.
    MessageTooLarge,
    /// A header Gitea always sends is missing.
    MissingHeader,
    /// The body is not JSON of the event's shape.
    InvalidJson,
    /// The delivery id was taken already.
    AlreadyReceived,
    /// A repository this agent is not configured for.
    RepositoryNotServed,
    /// The client took too long to send its body.
    RequestTimeout,
    /// JetStream did not store every event (or the delivery record); retry.
    NotStored,
    /// Not connected to NATS.
    NotReady,
    /// The webhook secret file cannot be read now.
    SecretUnavailable,
    /// What the event needs read from Gitea's API could not be read.
    GiteaUnavailable,
    /// No such route.
    NotFound,
    /// The route exists for another method.
    MethodNotAllowed,
}

impl ProblemKind for Kind {
    const TYPE_BASE: &'static str = "https://nisse.invalid/problems/gitea/";
    const CHALLENGE: &'static str = CHALLENGE;
    const BAD_SIGNATURE: Self = Self::BadSignature;
    const METHOD_NOT_ALLOWED: Self = Self::MethodNotAllowed;
    const UNSUPPORTED_MEDIA_TYPE: Self = Self::UnsupportedMediaType;
    const PAYLOAD_TOO_LARGE: Self = Self::PayloadTooLarge;
    const INVALID_JSON: Self = Self::InvalidJson;
    const REQUEST_TIMEOUT: Self = Self::RequestTimeout;
    const NOT_READY: Self = Self::NotReady;

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
                "An event is larger than the bus accepts as one message",
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            Self::MissingHeader => (
                "missing-header",
                "A header Gitea sends with every delivery is missing",
                StatusCode::BAD_REQUEST,
            ),
            Self::InvalidJson => (
                "invalid-json",
                "The body is not a valid Gitea webhook payload",
                StatusCode::BAD_REQUEST,
            ),
            Self::AlreadyReceived => (
                "already-received",
                "This delivery was received already",
                StatusCode::CONFLICT,
            ),
            Self::RepositoryNotServed => (
                "repository-not-served",
                "The repository is not one this agent serves",
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
            Self::GiteaUnavailable => (
                "gitea-unavailable",
                "What the event needs could not be read from Gitea",
                StatusCode::BAD_GATEWAY,
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

/// A problem response: the document, status and headers are the shared
/// kit's (the Vikunja and Gitea receivers answer alike), the kinds
/// Gitea's.
pub(crate) type Problem = problem::Problem<Kind>;

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header::{CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
    use axum::response::IntoResponse as _;
    use nisse_intake_kit::problem::{PROBLEM_JSON, RETRY_AFTER_SECS};

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
            Problem::new(Kind::AlreadyReceived, "x").status(),
            StatusCode::CONFLICT
        );
        assert_eq!(
            Problem::new(Kind::RepositoryNotServed, "x").status(),
            StatusCode::FORBIDDEN
        );
    }
}
