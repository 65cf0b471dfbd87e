//! RFC 9457 problem details (`application/problem+json`): every error this
//! service answers is one of these, so Alertmanager's log and an operator's
//! `curl` show what exactly was wrong.

use axum::http::header::{ALLOW, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The media type of a problem document.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// Where problem type URIs live. `.invalid` can never resolve: the URIs are
/// stable identifiers, not pages.
const TYPE_BASE: &str = "https://nisse.invalid/problems/";

/// Seconds a client should wait before retrying after a 503. Alertmanager
/// uses its own backoff regardless; this is for other clients.
const RETRY_AFTER_SECS: &str = "5";

/// The kinds of problem, each with a stable type URI, title and status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// No or wrong credentials.
    Unauthorized,
    /// The body is not declared as JSON.
    UnsupportedMediaType,
    /// The body is larger than `max-body`.
    PayloadTooLarge,
    /// More alerts than `max-alerts`.
    TooManyAlerts,
    /// Alerts that would take more than `max-expanded` as messages.
    ExpansionTooLarge,
    /// An alert whose message is larger than the NATS server accepts.
    MessageTooLarge,
    /// The body is not JSON of the webhook's shape.
    InvalidJson,
    /// A webhook payload version this service does not read.
    UnsupportedVersion,
    /// Well-formed JSON whose content is not acceptable.
    InvalidPayload,
    /// The client took too long to send its body.
    RequestTimeout,
    /// JetStream did not store every alert; retry.
    NotStored,
    /// Not connected to NATS.
    NotReady,
    /// The receiver's own credentials (a secret file) cannot be read now.
    CredentialsUnavailable,
    /// A bug: the request could not be handled at all.
    Internal,
    /// No such route.
    NotFound,
    /// The route exists for another method.
    MethodNotAllowed,
}

impl Kind {
    fn parts(self) -> (&'static str, &'static str, StatusCode) {
        match self {
            Self::Unauthorized => (
                "unauthorized",
                "Authentication required",
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
            Self::TooManyAlerts => (
                "too-many-alerts",
                "The request carries too many alerts",
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            Self::ExpansionTooLarge => (
                "expansion-too-large",
                "The alerts would take too much memory as messages",
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            Self::MessageTooLarge => (
                "message-too-large",
                "An alert is larger than the bus accepts as one message",
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            Self::InvalidJson => (
                "invalid-json",
                "The body is not a valid Alertmanager webhook payload",
                StatusCode::BAD_REQUEST,
            ),
            Self::UnsupportedVersion => (
                "unsupported-version",
                "Unsupported webhook payload version",
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            Self::InvalidPayload => (
                "invalid-payload",
                "The webhook payload is not acceptable",
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            Self::RequestTimeout => (
                "request-timeout",
                "The request body took too long",
                StatusCode::REQUEST_TIMEOUT,
            ),
            Self::NotStored => (
                "not-stored",
                "The alerts could not be stored; retry",
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            Self::NotReady => (
                "not-ready",
                "Not connected to NATS",
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            Self::CredentialsUnavailable => (
                "credentials-unavailable",
                "Credentials cannot be checked now",
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            Self::Internal => (
                "internal",
                "Internal error",
                StatusCode::INTERNAL_SERVER_ERROR,
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
            Kind::NotStored | Kind::NotReady | Kind::CredentialsUnavailable
        ) {
            headers.push((RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS)));
        }
        Self {
            kind,
            detail: detail.into(),
            headers,
        }
    }

    /// A 401 with the challenge of the configured scheme.
    pub(crate) fn unauthorized(detail: impl Into<String>, challenge: &'static str) -> Self {
        let mut p = Self::new(Kind::Unauthorized, detail);
        p.headers
            .push((WWW_AUTHENTICATE, HeaderValue::from_static(challenge)));
        p
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
    fn renders_an_rfc_9457_document_with_headers() {
        let response = Problem::new(Kind::NotStored, "publish failed").into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(response.headers()[RETRY_AFTER], RETRY_AFTER_SECS);

        let response = Problem::unauthorized("no credentials", "Bearer realm=\"nisse\"");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let response = response.into_response();
        assert_eq!(
            response.headers()[WWW_AUTHENTICATE],
            "Bearer realm=\"nisse\""
        );
    }

    #[test]
    fn document_has_the_four_members() {
        let p = Problem::new(Kind::InvalidJson, "alerts[1].startsAt: bad");
        let (slug, title, status) = p.kind().parts();
        let doc = Document {
            type_uri: format!("{TYPE_BASE}{slug}"),
            title,
            status: status.as_u16(),
            detail: p.detail(),
        };
        let v = serde_json::to_value(&doc).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "type": "https://nisse.invalid/problems/invalid-json",
                "title": "The body is not a valid Alertmanager webhook payload",
                "status": 400,
                "detail": "alerts[1].startsAt: bad",
            })
        );
    }
}
