//! The webhook receivers' plain HTTP: the body read within its limit and
//! time, its media type checked, JSON answers, health and readiness.
//!
//! Shared because the Gitea and Vikunja receivers take a delivery the
//! same way up to its signature; what comes after (which events, which
//! records) is each service's own.

use std::fmt::Display;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytesize::ByteSize;
use futures::StreamExt as _;

use crate::problem::{Problem, ProblemKind};

/// Longest a client may take to send its body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Refuses a body not declared as JSON; `service` names who sends it in
/// the detail (`Gitea`).
pub fn check_content_type<K: ProblemKind>(
    headers: &HeaderMap,
    service: &str,
) -> Result<(), Problem<K>> {
    let value = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let essence = value
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    match essence.as_deref() {
        Some("application/json") => Ok(()),
        _ => Err(Problem::new(
            K::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Content-Type is {}; {service}'s webhooks send application/json",
                value.map_or_else(|| "missing".to_string(), |v| format!("`{v}`"))
            ),
        )),
    }
}

/// Reads the body up to `max_body` (the service's `<section>.max-body`),
/// refusing a declared length over it before reading anything, within
/// [`BODY_TIMEOUT`].
pub async fn read_body<K: ProblemKind>(
    body: Body,
    headers: &HeaderMap,
    max_body: ByteSize,
    section: &str,
) -> Result<Vec<u8>, Problem<K>> {
    let limit = usize::try_from(max_body.as_u64()).unwrap_or(usize::MAX);
    let too_large = || {
        Problem::new(
            K::PAYLOAD_TOO_LARGE,
            format!("the body is larger than the limit of {max_body} ({section}.max-body)"),
        )
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body.as_u64()) {
        return Err(too_large());
    }
    let read = async {
        let mut buf = Vec::with_capacity(
            declared
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(0)
                .min(limit),
        );
        let mut chunks = body.into_data_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| {
                Problem::new(K::INVALID_JSON, format!("the body could not be read: {e}"))
            })?;
            if buf.len().saturating_add(chunk.len()) > limit {
                return Err(too_large());
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf)
    };
    tokio::time::timeout(BODY_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| {
            Err(Problem::new(
                K::REQUEST_TIMEOUT,
                format!(
                    "the body was not received within {}s",
                    BODY_TIMEOUT.as_secs()
                ),
            ))
        })
}

/// `value` as a JSON answer with `status`.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response {
    let mut response = (status, value.to_string()).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `/healthz`: the process answers.
pub async fn healthz() -> Response {
    json(StatusCode::OK, &serde_json::json!({ "status": "ok" }))
}

/// `/readyz`'s answer: ready while connected to NATS, else a 503 naming
/// the connection's `state`.
pub fn readiness<K: ProblemKind>(connected: bool, state: impl Display) -> Response {
    if connected {
        json(StatusCode::OK, &serde_json::json!({ "status": "ready" }))
    } else {
        Problem::<K>::new(
            K::NOT_READY,
            format!(
                "the NATS connection is {state}; deliveries cannot be stored until it reconnects"
            ),
        )
        .into_response()
    }
}
