//! The HTTP side: binding, routes, and a webhook request from credentials
//! to JetStream acks.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytesize::ByteSize;
use futures::{StreamExt as _, TryStreamExt as _};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use nisse_bus::{AgentName, Bus};
use nisse_proto::v1::AlertReceived;

use crate::auth::{Credentials, Denied};
use crate::payload;
use crate::problem::{Kind, Problem};
use crate::{Config, Error};

/// The webhook's path.
const WEBHOOK_PATH: &str = "/api/v1/alerts";

/// Publishes of one request in flight at once. Each waits for its ack, so
/// this is what makes a 10,000-alert request take a fraction of a second
/// instead of 10,000 round trips; it is bounded so one request cannot flood
/// the client's outgoing buffer.
const PUBLISH_CONCURRENCY: usize = 256;

/// Longest a client may take to send its body. A client that trickles one
/// byte at a time would otherwise hold a connection, and a graceful
/// shutdown, open forever.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// What every request handler shares.
struct Shared {
    bus: Bus,
    agent: String,
    credentials: Credentials,
    max_body: ByteSize,
    max_body_bytes: usize,
    limits: payload::Limits,
    publish_timeout: Duration,
}

/// A receiver whose socket is open and configuration checked, ready to
/// [`serve`](Bound::serve).
pub struct Bound {
    listener: TcpListener,
    local_addr: SocketAddr,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("local_addr", &self.local_addr)
            .field("agent", &self.shared.agent)
            .finish_non_exhaustive()
    }
}

/// Checks the configuration, reads secret files (making the bearer token
/// under `data_dir` when no credentials are configured) and opens the
/// listening socket (port 0 picks a free one). Refuses unauthenticated
/// posts on a non-loopback address, and an agent the bus does not serve.
pub async fn bind(cfg: &Config, bus: Bus, data_dir: &Path) -> Result<Bound, Error> {
    // Checked first and on its own: it is the one refusal that protects the
    // stream rather than the service, so it gets its own plain message.
    if !cfg.listen.ip().is_loopback() && cfg.auth.allow_unauthenticated {
        return Err(Error::NoCredentials { addr: cfg.listen });
    }
    let problems = cfg.validate("intake-alerts");
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(|(k, p)| format!("{k}: {p}")).collect();
        return Err(Error::Invalid(list.join("; ")));
    }
    let agent: AgentName = cfg
        .agent
        .parse()
        .map_err(|e: nisse_bus::Error| Error::Invalid(format!("intake-alerts.agent: {e}")))?;
    if !bus.agents().contains(&agent) {
        let served: Vec<&str> = bus.agents().iter().map(AgentName::as_str).collect();
        return Err(Error::AgentNotServed {
            agent: cfg.agent.clone(),
            served: served.join(", "),
        });
    }
    let credentials = Credentials::load(&cfg.auth, data_dir)?;
    let max_body_bytes = usize::try_from(cfg.max_body.as_u64())
        .map_err(|_| Error::Invalid("intake-alerts.max-body: too large".into()))?;
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| Error::Bind {
            addr: cfg.listen,
            source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| Error::Bind {
        addr: cfg.listen,
        source,
    })?;
    Ok(Bound {
        listener,
        local_addr,
        shared: Arc::new(Shared {
            bus,
            agent: cfg.agent.clone(),
            credentials,
            max_body: cfg.max_body,
            max_body_bytes,
            limits: payload::Limits {
                max_alerts: cfg.max_alerts,
                max_expanded: cfg.max_expanded,
            },
            publish_timeout: cfg.publish_timeout,
        }),
    })
}

impl Bound {
    /// The address actually bound (the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The file the bearer token is read from at each request, when it is
    /// read from one: the generated token, or `auth.bearer-token-file`.
    pub fn token_file(&self) -> Option<&Path> {
        self.shared.credentials.token_file()
    }

    /// The URL to give Alertmanager as the webhook's `url`, e.g.
    /// `http://127.0.0.1:9095/api/v1/alerts`.
    pub fn webhook_url(&self) -> String {
        format!("http://{}{WEBHOOK_PATH}", self.local_addr)
    }

    /// Serves until `shutdown` is cancelled, then stops accepting
    /// connections and finishes the requests in flight (each is bounded by
    /// the body timeout and `publish-timeout`) before returning.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), Error> {
        let addr = self.local_addr;
        tracing::info!(%addr, webhook = %self.webhook_url(), agent = %self.shared.agent, "intake-alerts listening");
        axum::serve(self.listener, router(self.shared))
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .map_err(|source| Error::Serve { addr, source })?;
        tracing::info!(%addr, "intake-alerts stopped");
        Ok(())
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            WEBHOOK_PATH,
            post(webhook).fallback(|| async { Problem::method_not_allowed("POST") }),
        )
        .route(
            "/healthz",
            get(healthz).fallback(|| async { Problem::method_not_allowed("GET, HEAD") }),
        )
        .route(
            "/readyz",
            get(readyz).fallback(|| async { Problem::method_not_allowed("GET, HEAD") }),
        )
        .fallback(|request: Request| async move {
            Problem::new(
                Kind::NotFound,
                format!(
                    "no resource at `{}`; Alertmanager's webhook is `POST {WEBHOOK_PATH}`",
                    request.uri().path()
                ),
            )
        })
        .with_state(shared)
}

/// The process serves.
async fn healthz() -> Response {
    json(StatusCode::OK, &serde_json::json!({ "status": "ok" }))
}

/// Connected to NATS, so a webhook request can be stored now.
async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    let state = shared.bus.client().connection_state();
    if state == async_nats::connection::State::Connected {
        json(StatusCode::OK, &serde_json::json!({ "status": "ready" }))
    } else {
        Problem::new(
            Kind::NotReady,
            format!("the NATS connection is {state}; alerts cannot be stored until it reconnects"),
        )
        .into_response()
    }
}

/// Alertmanager's webhook.
async fn webhook(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let span = tracing::info_span!(
        "intake_alerts.webhook",
        receiver = tracing::field::Empty,
        group_key = tracing::field::Empty,
        alerts = tracing::field::Empty,
    );
    async move {
        let started = Instant::now();
        match handle(&shared, request, started).await {
            Ok(response) => response,
            Err(problem) => {
                tracing::warn!(
                    status = problem.status().as_u16(),
                    problem = ?problem.kind(),
                    detail = problem.detail(),
                    elapsed_ms = started.elapsed().as_millis(),
                    "webhook request refused"
                );
                problem.into_response()
            }
        }
    }
    .instrument(span)
    .await
}

async fn handle(shared: &Shared, request: Request, started: Instant) -> Result<Response, Problem> {
    let (parts, body) = request.into_parts();
    // Credentials before the body: an unauthenticated caller gets nothing
    // read, parsed or buffered.
    authenticate(&shared.credentials, &parts.headers)?;
    check_content_type(&parts.headers)?;
    let body = read_body(body, &parts.headers, shared).await?;
    // Parsing up to `max-body` of JSON is CPU work that would stall every
    // other task on this runtime thread (other services share the process);
    // it runs on the blocking pool instead.
    let (agent, limits) = (shared.agent.clone(), shared.limits);
    let accepted = tokio::task::spawn_blocking(move || payload::parse(&body, &agent, limits))
        .await
        .map_err(|e| {
            Problem::new(
                Kind::Internal,
                format!("parsing the request failed unexpectedly: {e}"),
            )
        })??;

    let span = tracing::Span::current();
    span.record("receiver", accepted.receiver.as_str());
    span.record("group_key", accepted.group_key.as_str());
    span.record("alerts", accepted.messages.len());

    let total = accepted.messages.len();
    fits_the_bus(shared, &accepted.messages)?;
    let duplicates = publish_all(shared, accepted.messages).await?;
    tracing::info!(
        receiver = %accepted.receiver,
        group_key = %accepted.group_key,
        alerts = total,
        duplicates,
        elapsed_ms = started.elapsed().as_millis(),
        "alerts stored"
    );
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "accepted": total, "duplicates": duplicates }),
    ))
}

fn authenticate(credentials: &Credentials, headers: &HeaderMap) -> Result<(), Problem> {
    let Err(denied) = credentials.check(headers) else {
        return Ok(());
    };
    let (scheme, example) = match credentials {
        Credentials::Basic(_) => ("basic", "Authorization: Basic <base64 of user:password>"),
        _ => ("bearer", "Authorization: Bearer <token>"),
    };
    let detail = match denied {
        Denied::Missing => format!("this receiver requires {scheme} credentials (`{example}`)"),
        Denied::Wrong => format!("the {scheme} credentials are not valid"),
        Denied::Unavailable(why) => {
            tracing::error!("the webhook's credentials cannot be read: {why}");
            return Err(Problem::new(
                Kind::CredentialsUnavailable,
                "the receiver cannot read its own credentials right now; retry later",
            ));
        }
    };
    let challenge = credentials.challenge().unwrap_or("Bearer realm=\"nisse\"");
    Err(Problem::unauthorized(detail, challenge))
}

/// The body must be declared as JSON (Alertmanager sends
/// `application/json`); a form post or plain text is a wrong client.
fn check_content_type(headers: &HeaderMap) -> Result<(), Problem> {
    let value = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let essence = value
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    match essence.as_deref() {
        Some("application/json") => Ok(()),
        Some(e) if e.starts_with("application/") && e.ends_with("+json") => Ok(()),
        _ => Err(Problem::new(
            Kind::UnsupportedMediaType,
            format!(
                "Content-Type is {}; the webhook takes `application/json`",
                value.map_or_else(|| "missing".to_string(), |v| format!("`{v}`"))
            ),
        )),
    }
}

/// Reads the body up to the configured limit, refusing a declared length
/// over it before reading anything.
async fn read_body(body: Body, headers: &HeaderMap, shared: &Shared) -> Result<Vec<u8>, Problem> {
    let limit = shared.max_body_bytes;
    let too_large = || {
        Problem::new(
            Kind::PayloadTooLarge,
            format!(
                "the body is larger than the limit of {} (intake-alerts.max-body)",
                shared.max_body
            ),
        )
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > shared.max_body.as_u64()) {
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
                Problem::new(
                    Kind::InvalidJson,
                    format!("the body could not be read: {e}"),
                )
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
                Kind::RequestTimeout,
                format!(
                    "the body was not received within {}s",
                    BODY_TIMEOUT.as_secs()
                ),
            ))
        })
}

/// Room kept for the headers a message is published with (its dedup id,
/// its type, the trace) beside its payload.
const HEADER_ROOM: usize = 1024;

/// Refuses a request with an alert whose message the NATS server would
/// refuse (its `max_payload`, 1 MiB by default): publishing it could never
/// succeed, and a 503 would have Alertmanager retry it forever.
fn fits_the_bus(shared: &Shared, messages: &[AlertReceived]) -> Result<(), Problem> {
    use prost::Message as _;
    let max = shared.bus.client().server_info().max_payload;
    if max == 0 {
        // Not connected yet: the publish says so.
        return Ok(());
    }
    match messages
        .iter()
        .enumerate()
        .find(|(_, m)| m.encoded_len() + HEADER_ROOM > max)
    {
        None => Ok(()),
        Some((i, m)) => Err(Problem::new(
            Kind::MessageTooLarge,
            format!(
                "alerts[{i}]: with the group's labels it is a message of {} bytes, and the NATS server accepts at most {max} (max_payload, less {HEADER_ROOM} for headers); nothing was stored. Send fewer or shorter labels and annotations, or raise the server's max_payload",
                m.encoded_len()
            ),
        )),
    }
}

/// Publishes every message and waits for all their acks, within the
/// publish timeout. Returns how many JetStream had already stored (a
/// duplicate ack is as good as a store: the alert is in the stream).
async fn publish_all(shared: &Shared, messages: Vec<AlertReceived>) -> Result<usize, Problem> {
    let total = messages.len();
    let bus = &shared.bus;
    let publishing = futures::stream::iter(messages)
        .map(|m| bus.publish(m))
        .buffer_unordered(PUBLISH_CONCURRENCY)
        .try_fold(0usize, |duplicates, published| async move {
            Ok(duplicates + usize::from(published.duplicate))
        });
    // On the first failure or the timeout the remaining publishes are
    // dropped; whatever was stored stays, and the sender's retry carries
    // the same ids, so it stores only what is missing.
    match tokio::time::timeout(shared.publish_timeout, publishing).await {
        Ok(Ok(duplicates)) => Ok(duplicates),
        Ok(Err(e)) => Err(Problem::new(
            Kind::NotStored,
            format!(
                "not all {total} alerts were stored: {e}; retrying is safe, stored alerts are deduplicated"
            ),
        )),
        Err(_) => Err(Problem::new(
            Kind::NotStored,
            format!(
                "JetStream did not store all {total} alerts within {} (intake-alerts.publish-timeout); retrying is safe, stored alerts are deduplicated",
                humantime::format_duration(shared.publish_timeout)
            ),
        )),
    }
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response {
    let mut response = (status, value.to_string()).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(content_type: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(c) = content_type {
            h.insert(CONTENT_TYPE, HeaderValue::from_str(c).unwrap());
        }
        h
    }

    #[test]
    fn content_type_must_be_json() {
        assert!(check_content_type(&headers(Some("application/json"))).is_ok());
        assert!(check_content_type(&headers(Some("Application/JSON; charset=utf-8"))).is_ok());
        assert!(check_content_type(&headers(Some("application/vnd.x+json"))).is_ok());
        for bad in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            None,
        ] {
            let p = check_content_type(&headers(bad)).unwrap_err();
            assert_eq!(p.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
            assert!(p.detail().contains("application/json"), "{}", p.detail());
        }
    }
}
