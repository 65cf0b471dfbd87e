//! The webhook receiver: a delivery from its signature to JetStream's ack
//! and the event's record.
//!
//! In order: the content type, the body (bounded by `max-body`), the
//! signature over the raw body (nothing is parsed before it holds), the
//! event name (one not taken is answered 200 `ignored`), the payload (its
//! JSON path named when wrong), the project (one not served is refused
//! 403: the delivery is understood, and this agent may not take it), the
//! doer (the agent's own account: answered 200 `skipped`, nothing
//! stored), the event's record (stored before: answered 200 `duplicate`,
//! nothing stored again), the event's size, the publish, and only then
//! the record. The answer is 200 only once JetStream stored the event;
//! anything that kept it from being stored is a 5xx, which Vikunja tries
//! again (any status above 399 is a failure to it).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use nisse_bus::secret::Secret;
use nisse_bus::{AgentName, Bus};
use nisse_proto::v1::{VikunjaEvent, VikunjaSource};

use nisse_intake_kit::receiver::{self, json};

use crate::Config;
use crate::events::{self, Stored, envelope};
use crate::hook;
use crate::problem::{Kind, Problem};
use crate::signature::{self, Refused};

/// The webhook's path: what the Vikunja webhook's "Target URL" ends in.
pub const WEBHOOK_PATH: &str = "/api/v1/vikunja/hook";

/// The header Vikunja signs deliveries in.
const SIGNATURE: &str = "x-vikunja-signature";

/// What every request shares.
pub(crate) struct Shared {
    pub bus: Bus,
    pub agent: AgentName,
    pub config: Arc<Config>,
    pub secret: Secret,
    /// Where a browser opens Vikunja, for the tasks' links.
    pub frontend: String,
}

/// The receiver, its socket open.
pub(crate) struct Receiver {
    listener: TcpListener,
    local_addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Receiver {
    /// Opens the socket of `shared.config.listen` (port 0 picks a free
    /// one).
    pub(crate) async fn bind(shared: Arc<Shared>) -> anyhow::Result<Self> {
        let addr = shared.config.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (vikunja.listen): {e}"))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (vikunja.listen): {e}"))?;
        Ok(Self {
            listener,
            local_addr,
            shared,
        })
    }

    /// The URL to give Vikunja as the webhook's target.
    pub(crate) fn webhook_url(&self) -> String {
        format!("http://{}{WEBHOOK_PATH}", self.local_addr)
    }

    /// Serves until `shutdown`, then finishes the requests in flight.
    pub(crate) async fn serve(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let addr = self.local_addr;
        tracing::info!(%addr, webhook = %self.webhook_url(), agent = %self.shared.agent, "intake-vikunja listening");
        axum::serve(self.listener, router(self.shared))
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .map_err(|e| anyhow::anyhow!("serving HTTP on {addr}: {e}"))?;
        tracing::info!(%addr, "intake-vikunja's webhook receiver stopped");
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
            get(receiver::healthz).fallback(|| async { Problem::method_not_allowed("GET, HEAD") }),
        )
        .route(
            "/readyz",
            get(readyz).fallback(|| async { Problem::method_not_allowed("GET, HEAD") }),
        )
        .fallback(|request: Request| async move {
            Problem::new(
                Kind::NotFound,
                format!(
                    "no resource at `{}`; Vikunja's webhook is `POST {WEBHOOK_PATH}`",
                    request.uri().path()
                ),
            )
        })
        .with_state(shared)
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    let state = shared.bus.client().connection_state();
    receiver::readiness::<Kind>(state == async_nats::connection::State::Connected, state)
}

async fn webhook(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let span = tracing::info_span!(
        "intake_vikunja.webhook",
        event = tracing::field::Empty,
        message_id = tracing::field::Empty,
    );
    async move {
        let started = Instant::now();
        match handle(&shared, request).await {
            Ok(response) => response,
            Err(problem) => {
                tracing::warn!(
                    status = problem.status().as_u16(),
                    problem = ?problem.kind(),
                    detail = problem.detail(),
                    elapsed_ms = started.elapsed().as_millis(),
                    "webhook delivery refused"
                );
                problem.into_response()
            }
        }
    }
    .instrument(span)
    .await
}

async fn handle(shared: &Shared, request: Request) -> Result<Response, Problem> {
    let (parts, body) = request.into_parts();
    receiver::check_content_type(&parts.headers, "Vikunja")?;
    let body = receiver::read_body(body, &parts.headers, shared.config.max_body, "vikunja").await?;
    check_signature(shared, &parts.headers, &body)?;

    let name = hook::event_name(&body)?;
    let span = tracing::Span::current();
    span.record("event", name.as_str());
    let Some(event) = hook::classify(&name) else {
        tracing::debug!(event = %name, "event not taken");
        return Ok(json(
            StatusCode::OK,
            &serde_json::json!({ "ignored": true, "event": name }),
        ));
    };
    let parsed = hook::parse(event, &body)?;
    let project = parsed.task.project_id;
    if !shared.config.served(project) {
        return Err(Problem::new(
            Kind::ProjectNotServed,
            format!(
                "task {} is in project {project}, which is not among the projects agent {} serves (vikunja.projects: {}); nothing was stored",
                parsed.task.id,
                shared.agent,
                shared.config.projects_listed()
            ),
        ));
    }
    let message_id = parsed.message_id();
    span.record("message_id", message_id.as_str());
    if parsed.doer.is(&shared.config.account) {
        // The agent's own comment or change, coming back: it knows.
        tracing::debug!(event, %message_id, "the agent's own event; not taken");
        return Ok(json(
            StatusCode::OK,
            &serde_json::json!({ "skipped": "the agent's own", "event": event, "message_id": message_id }),
        ));
    }
    let doer = parsed.doer.username.clone();
    let e = VikunjaEvent {
        envelope: Some(envelope(&shared.agent, &doer, message_id.clone())),
        source: VikunjaSource::Webhook as i32,
        event: event.to_string(),
        project_id: project,
        doer,
        task: Some(parsed.task.to_proto(&shared.frontend)),
        comment: parsed.comment.as_ref().map(|c| c.to_proto()),
        assignee: parsed
            .assignee
            .as_ref()
            .map(|a| a.username.clone())
            .unwrap_or_default(),
    };
    // Not connected, nothing can be stored: said at once, rather than
    // after Vikunja's wait for an answer runs out.
    let state = shared.bus.client().connection_state();
    if state != async_nats::connection::State::Connected {
        return Err(Problem::new(
            Kind::NotStored,
            format!(
                "the NATS connection is {state}; nothing was stored, and sending it again is safe"
            ),
        ));
    }
    if let Some((len, max)) = events::too_large(&shared.bus, &e) {
        return Err(Problem::new(
            Kind::MessageTooLarge,
            format!(
                "the event is a message of {len} bytes, and the NATS server accepts at most {max} (max_payload, less room for headers); nothing was stored"
            ),
        ));
    }
    let stored = events::store(&shared.bus, &shared.agent, e)
        .await
        .map_err(|e| Problem::new(Kind::NotStored, format!("{e}; sending it again is safe")))?;
    let (stored, duplicate) = match stored {
        Stored::Now { duplicate } => (!duplicate, duplicate),
        Stored::Before => (false, true),
    };
    if stored {
        tracing::info!(event, %message_id, project, task = parsed.task.id, "delivery stored");
    } else {
        tracing::info!(event, %message_id, "delivery stored before; not stored again");
    }
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({
            "event": event,
            "message_id": message_id,
            "stored": usize::from(stored),
            "duplicate": duplicate,
        }),
    ))
}

fn check_signature(shared: &Shared, headers: &HeaderMap, body: &[u8]) -> Result<(), Problem> {
    let signature = headers
        .get(SIGNATURE)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty());
    let Some(signature) = signature else {
        return Err(Problem::new(
            Kind::BadSignature,
            "the delivery carries no X-Vikunja-Signature: give the project's webhook the secret in vikunja.webhook-secret-file",
        ));
    };
    let secret = shared.secret.read().map_err(|e| {
        tracing::error!("the webhook secret cannot be read: {e}");
        Problem::new(
            Kind::SecretUnavailable,
            "the receiver cannot read its webhook secret right now; retry later",
        )
    })?;
    signature::verify(secret.expose(), body, signature).map_err(|refused| {
        Problem::new(
            Kind::BadSignature,
            match refused {
                Refused::Malformed => {
                    "X-Vikunja-Signature is not a hex HMAC-SHA256 (64 hex digits)"
                }
                Refused::Wrong => {
                    "X-Vikunja-Signature is not the HMAC-SHA256 of this body with the webhook's secret"
                }
            },
        )
    })
}
