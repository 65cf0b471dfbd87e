//! Why the homeserver did not take a message, and whether sending it again
//! can help.
//!
//! An outage, the homeserver's own trouble and a rate limit pass: the
//! message waits and goes out in order. A refusal of the message itself (an
//! event over the size limit, a power level the agent lacks, content the
//! server will not parse) gets the same answer however often it is sent,
//! and would hold every message behind it; after `matrix.refused-attempts`
//! it is dead-lettered and a notice says so ([`notice`]).

use std::time::Duration;

use matrix_sdk::ruma::api::error::{ErrorBody, ErrorKind, RetryAfter};
use serde::{Deserialize, Serialize};

/// The longest homeserver message kept in a dead-letter reason: its words
/// explain the code, a page of them would not.
const MESSAGE_MAX: usize = 200;

/// What a failed send means for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SendFailure {
    /// Rate-limited (`M_LIMIT_EXCEEDED`): sent again after exactly this
    /// wait, the server's, and never counted as a refusal.
    RateLimited(Duration),
    /// Not this message's fault: the network, the homeserver's own trouble
    /// (5xx), a request timeout, the agent's login (401), a reply that is
    /// not the Matrix API's. Retried with backoff for as long as it lasts,
    /// as for an outage, since every message would fail the same way.
    Transient(String),
    /// The homeserver answered that it will not take this message (any
    /// other 4xx: `M_TOO_LARGE`, `M_FORBIDDEN`, `M_BAD_JSON`, ...): the
    /// same request gets the same answer.
    Refused(Refusal),
}

/// A homeserver's refusal of one message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Refusal {
    /// The HTTP status.
    pub status: u16,
    /// The Matrix error code (`M_TOO_LARGE`); empty when the answer
    /// carried none (a proxy's page, say).
    pub code: String,
    /// The homeserver's explanation, shortened.
    pub message: String,
}

impl Refusal {
    /// What the operator is told the refusal was: the Matrix error code,
    /// else the HTTP status.
    pub fn name(&self) -> String {
        named(self.status, &self.code)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&described(self.status, &self.code, &self.message))
    }
}

/// A Matrix error `code`, else the HTTP `status`.
fn named(status: u16, code: &str) -> String {
    if code.is_empty() {
        format!("HTTP {status}")
    } else {
        code.to_string()
    }
}

/// `M_TOO_LARGE (HTTP 413: event too large)`, `HTTP 502`.
fn described(status: u16, code: &str, message: &str) -> String {
    let mut out = named(status, code);
    let mut details = Vec::new();
    if !code.is_empty() {
        details.push(format!("HTTP {status}"));
    }
    if !message.is_empty() {
        details.push(message.to_string());
    }
    if !details.is_empty() {
        out.push_str(&format!(" ({})", details.join(": ")));
    }
    out
}

/// What the homeserver's answer to a send says about the message.
pub(crate) fn classify(e: &matrix_sdk::Error) -> SendFailure {
    let Some(api) = e.as_client_api_error() else {
        // No Matrix answer: the network, a body that did not parse, or the
        // client's own state (the crypto store, say).
        return SendFailure::Transient(e.to_string());
    };
    let (code, message) = match &api.body {
        ErrorBody::Standard(body) => {
            if let ErrorKind::LimitExceeded(limit) = &body.kind {
                return SendFailure::RateLimited(match &limit.retry_after {
                    Some(RetryAfter::Delay(d)) => *d,
                    // A date or nothing: a second, then ask again.
                    _ => Duration::from_secs(1),
                });
            }
            (body.kind.errcode().to_string(), body.message.clone())
        }
        _ => (String::new(), String::new()),
    };
    answer(api.status_code.as_u16(), &code, &message)
}

/// The disposition of an HTTP `status` with Matrix error `code` (empty:
/// none) and `message`.
fn answer(status: u16, code: &str, message: &str) -> SendFailure {
    let not_the_message = !(400..500).contains(&status)
        // The login, not the message: every message would be refused
        // until the operator gives the agent a working token.
        || status == 401
        || matches!(code, "M_UNKNOWN_TOKEN" | "M_MISSING_TOKEN")
        // Timed out or throttled on the way: try again.
        || status == 408
        || status == 429;
    if not_the_message {
        return SendFailure::Transient(described(status, code, message));
    }
    let mut message = message.to_string();
    if message.len() > MESSAGE_MAX {
        let cut = (0..=MESSAGE_MAX)
            .rev()
            .find(|i| message.is_char_boundary(*i))
            .unwrap_or(0);
        message.truncate(cut);
        message.push('…');
    }
    SendFailure::Refused(Refusal {
        status,
        code: code.to_string(),
        message,
    })
}

/// The dead-letter reason for message `message_id`, refused `attempts`
/// times.
pub(crate) fn reason(message_id: &str, refusal: &Refusal, attempts: u32) -> String {
    let times = if attempts == 1 { "time" } else { "times" };
    format!(
        "the homeserver refused Matrix message {message_id} for good, {attempts} {times}: {refusal}"
    )
}

/// The notice posted where a refused message would have gone: that a
/// message could not be posted, the homeserver's code, and the command
/// that shows it (the refused message's own place in `agent`'s stream,
/// sequence `seq`). Markdown, a few hundred bytes whatever was refused.
pub(crate) fn notice(agent: &str, message_id: &str, seq: u64, refusal: &Refusal) -> String {
    // Both reach the room inside code spans: nothing in them may end one.
    let code = plain(&refusal.name());
    let id = plain(message_id);
    format!(
        "**A message could not be posted**: the homeserver refused it (`{code}`). \
         It is kept as a dead letter; `nisse replay --agent {agent} --from-seq {seq} --to-seq {seq}` \
         shows it (message `{id}`)."
    )
}

/// `s` without backticks and line breaks, at most 120 characters.
fn plain(s: &str) -> String {
    s.chars()
        .filter(|c| *c != '`' && !c.is_control())
        .take(120)
        .collect()
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::api::EndpointError as _;
    use matrix_sdk::ruma::exports::http;

    use super::*;

    /// The error the SDK gives for a homeserver answering `status` with
    /// `body`, built the way the SDK builds it from a response.
    fn answered(status: u16, body: &str) -> matrix_sdk::Error {
        let response = http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(body.as_bytes().to_vec())
            .unwrap();
        let api = matrix_sdk::ruma::api::error::Error::from_http_response(response);
        let http: matrix_sdk::HttpError =
            matrix_sdk::ruma::api::error::FromHttpResponseError::Server(api).into();
        http.into()
    }

    fn refused(status: u16, code: &str, message: &str) -> SendFailure {
        SendFailure::Refused(Refusal {
            status,
            code: code.into(),
            message: message.into(),
        })
    }

    #[test]
    fn refusals_of_the_message_itself_are_refused_for_good() {
        let cases = [
            (413, "M_TOO_LARGE", "event too large"),
            (
                403,
                "M_FORBIDDEN",
                "You don't have permission to post that to the room.",
            ),
            (400, "M_BAD_JSON", "Content not JSON."),
            (400, "M_NOT_JSON", "Content not JSON."),
            (400, "M_UNKNOWN", "Invalid event"),
            (404, "M_NOT_FOUND", "Unknown room"),
            (400, "M_INVALID_PARAM", "body must be a string"),
            // A code the SDK does not know is still the server's answer.
            (400, "ORG.EXAMPLE.NOPE", "no"),
        ];
        for (status, code, message) in cases {
            let body = serde_json::json!({ "errcode": code, "error": message }).to_string();
            assert_eq!(
                classify(&answered(status, &body)),
                refused(status, code, message),
                "{status} {code}"
            );
        }
    }

    #[test]
    fn a_refusal_without_a_matrix_body_is_named_by_its_status() {
        // A reverse proxy's own page for a body over its limit.
        let e = answered(
            413,
            "<html><body>413 Request Entity Too Large</body></html>",
        );
        assert_eq!(classify(&e), refused(413, "", ""));
        let SendFailure::Refused(r) = classify(&e) else {
            unreachable!()
        };
        assert_eq!(
            (r.name(), r.to_string()),
            ("HTTP 413".into(), "HTTP 413".into())
        );
        let text = notice("ops", "out:1", 9, &r);
        assert!(text.contains("refused it (`HTTP 413`)"), "{text}");
        let e = answered(400, r#"{"unexpected": true}"#);
        assert_eq!(classify(&e), refused(400, "", ""));
    }

    #[test]
    fn rate_limits_are_waited_out_for_as_long_as_the_server_asks() {
        let e = answered(
            429,
            r#"{"errcode": "M_LIMIT_EXCEEDED", "error": "Too Many Requests", "retry_after_ms": 1500}"#,
        );
        assert_eq!(
            classify(&e),
            SendFailure::RateLimited(Duration::from_millis(1500))
        );
        let e = answered(
            429,
            r#"{"errcode": "M_LIMIT_EXCEEDED", "error": "slow down"}"#,
        );
        assert_eq!(
            classify(&e),
            SendFailure::RateLimited(Duration::from_secs(1))
        );
    }

    #[test]
    fn outages_server_trouble_and_the_login_are_retried() {
        let transient = [
            (
                500,
                r#"{"errcode": "M_UNKNOWN", "error": "Internal server error"}"#,
            ),
            (502, "<html>Bad Gateway</html>"),
            (503, ""),
            (504, r#"{"errcode": "M_UNKNOWN", "error": "timeout"}"#),
            (
                401,
                r#"{"errcode": "M_UNKNOWN_TOKEN", "error": "Invalid access token"}"#,
            ),
            (
                401,
                r#"{"errcode": "M_MISSING_TOKEN", "error": "Missing access token"}"#,
            ),
            (
                408,
                r#"{"errcode": "M_UNKNOWN", "error": "Request timed out"}"#,
            ),
            // Throttled by something that does not speak Matrix.
            (429, "Too Many Requests"),
        ];
        for (status, body) in transient {
            let got = classify(&answered(status, body));
            assert!(
                matches!(&got, SendFailure::Transient(why) if why.contains(&format!("HTTP {status}"))),
                "{status} {body}: {got:?}"
            );
        }
        assert_eq!(
            classify(&answered(
                401,
                r#"{"errcode": "M_UNKNOWN_TOKEN", "error": "Invalid access token"}"#
            )),
            SendFailure::Transient("M_UNKNOWN_TOKEN (HTTP 401: Invalid access token)".into())
        );
        assert_eq!(
            classify(&answered(503, "")),
            SendFailure::Transient("HTTP 503".into())
        );
        // No answer at all (the connection, the client's own state).
        let e = matrix_sdk::Error::InsufficientData;
        assert!(matches!(classify(&e), SendFailure::Transient(_)));
        let reqwest = matrix_sdk::reqwest::Response::from(
            http::Response::builder().status(502).body("").unwrap(),
        )
        .error_for_status()
        .unwrap_err();
        let e: matrix_sdk::Error = reqwest.into();
        assert!(matches!(classify(&e), SendFailure::Transient(_)));
    }

    #[test]
    fn a_long_homeserver_message_is_shortened_on_a_character_boundary() {
        let long = "é".repeat(300);
        let SendFailure::Refused(r) = answer(400, "M_UNKNOWN", &long) else {
            panic!("not refused");
        };
        assert!(
            r.message.len() <= MESSAGE_MAX + '…'.len_utf8(),
            "{}",
            r.message
        );
        assert!(r.message.ends_with('…'));
    }

    #[test]
    fn the_reason_names_the_code_and_the_message() {
        let r = Refusal {
            status: 413,
            code: "M_TOO_LARGE".into(),
            message: "event too large".into(),
        };
        assert_eq!(
            reason("out:matrix:7", &r, 3),
            "the homeserver refused Matrix message out:matrix:7 for good, 3 times: M_TOO_LARGE (HTTP 413: event too large)"
        );
    }

    #[test]
    fn the_notice_says_why_and_how_to_read_the_message_and_stays_small() {
        let r = Refusal {
            status: 403,
            code: "M_FORBIDDEN".into(),
            message: "x".repeat(MESSAGE_MAX),
        };
        let text = notice("ops", "out:matrix:7", 42, &r);
        assert_eq!(
            text,
            "**A message could not be posted**: the homeserver refused it (`M_FORBIDDEN`). \
             It is kept as a dead letter; `nisse replay --agent ops --from-seq 42 --to-seq 42` \
             shows it (message `out:matrix:7`)."
        );
        // What the homeserver or the message id say cannot break out of
        // the code spans or make the notice large.
        let r = Refusal {
            code: "M_`X`\nY".repeat(100),
            ..r
        };
        let text = notice("ops", &"`id`\n".repeat(1000), 42, &r);
        assert_eq!(text.matches('`').count(), 6, "{text}");
        assert!(!text.contains('\n'), "{text}");
        assert!(text.len() < 600, "{} bytes", text.len());
    }
}
