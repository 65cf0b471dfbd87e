//! The webhook receiver: a delivery from its signature to JetStream's
//! acks and the delivery's record.
//!
//! In order: the content type, the body (bounded by `max-body`), the
//! signature over the raw body (nothing is parsed before it holds), the
//! delivery id, the event (one not taken is answered 200 `ignored`), the
//! delivery's record (one taken already is refused 409), the payload
//! (its JSON path named when wrong), the repository (one not served is
//! refused 403: the delivery is understood, and this agent may not take
//! it), what the event needs read from the API, the events' sizes, the
//! publishes, and only then the record. Nothing is stored unless all of
//! it holds; the answer is 200 only once JetStream stored every event
//! and the record is written.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
use nisse_proto::v1::{GiteaEvent, GiteaSource};

use nisse_intake_kit::receiver::{self, json};

use crate::Config;
use crate::api::Gitea;
use crate::events::{
    self, StateChange, comment_edit_id, comment_id, envelope, review_id, timeline_id,
};
use crate::hook::{self, Need};
use crate::problem::{Kind, Problem};
use crate::records::{self, DeliveryRecord};
use crate::signature::{self, Refused};

/// The webhook's path: what the Gitea webhook's "Target URL" ends in.
pub const WEBHOOK_PATH: &str = "/api/v1/gitea/hook";

/// Longest wait for JetStream to store a delivery's events.
pub(crate) const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a delivery id may be (Gitea's are UUIDs).
const MAX_DELIVERY_ID: usize = 128;

/// What every request shares.
pub(crate) struct Shared {
    pub bus: Bus,
    pub agent: AgentName,
    pub config: Arc<Config>,
    pub secret: Secret,
    pub gitea: Gitea,
}

/// The receiver, its socket open.
pub(crate) struct Receiver {
    listener: TcpListener,
    local_addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Receiver {
    /// Opens the socket of `shared.config.listen` (port 0 picks a free one).
    pub(crate) async fn bind(shared: Arc<Shared>) -> anyhow::Result<Self> {
        let addr = shared.config.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (gitea.listen): {e}"))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (gitea.listen): {e}"))?;
        Ok(Self {
            listener,
            local_addr,
            shared,
        })
    }

    /// The URL to give Gitea as the webhook's target.
    pub(crate) fn webhook_url(&self) -> String {
        format!("http://{}{WEBHOOK_PATH}", self.local_addr)
    }

    /// Serves until `shutdown`, then finishes the requests in flight.
    pub(crate) async fn serve(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let addr = self.local_addr;
        tracing::info!(%addr, webhook = %self.webhook_url(), agent = %self.shared.agent, "intake-gitea listening");
        axum::serve(self.listener, router(self.shared))
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .map_err(|e| anyhow::anyhow!("serving HTTP on {addr}: {e}"))?;
        tracing::info!(%addr, "intake-gitea's webhook receiver stopped");
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
                    "no resource at `{}`; Gitea's webhook is `POST {WEBHOOK_PATH}`",
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
        "intake_gitea.webhook",
        delivery = tracing::field::Empty,
        event = tracing::field::Empty,
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

/// A header's value as text, if it is there and is text.
fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

async fn handle(shared: &Shared, request: Request) -> Result<Response, Problem> {
    let (parts, body) = request.into_parts();
    receiver::check_content_type(&parts.headers, "Gitea")?;
    let body = receiver::read_body(body, &parts.headers, shared.config.max_body, "gitea").await?;
    check_signature(shared, &parts.headers, &body)?;

    let delivery = header(&parts.headers, "x-gitea-delivery").ok_or_else(|| {
        Problem::new(
            Kind::MissingHeader,
            "the delivery has no X-Gitea-Delivery header (Gitea sends one with every delivery)",
        )
    })?;
    if delivery.len() > MAX_DELIVERY_ID || delivery.chars().any(|c| c.is_control()) {
        return Err(Problem::new(
            Kind::MissingHeader,
            format!(
                "X-Gitea-Delivery is not a delivery id (Gitea's are UUIDs; at most {MAX_DELIVERY_ID} printable characters)"
            ),
        ));
    }
    let event_type = header(&parts.headers, "x-gitea-event-type");
    let event = header(&parts.headers, "x-gitea-event");
    let span = tracing::Span::current();
    span.record("delivery", delivery);
    let name = event_type.or(event).ok_or_else(|| {
        Problem::new(
            Kind::MissingHeader,
            "the delivery has neither X-Gitea-Event-Type nor X-Gitea-Event",
        )
    })?;
    span.record("event", name);
    let Some(kinded) = hook::classify(event_type, event) else {
        tracing::debug!(delivery, event = name, "event not taken");
        return Ok(json(
            StatusCode::OK,
            &serde_json::json!({ "ignored": true, "event": name, "delivery": delivery }),
        ));
    };

    let taken = records::delivery_taken(&shared.bus, &shared.agent, delivery)
        .await
        .map_err(|e| {
            Problem::new(
                Kind::NotStored,
                format!(
                    "cannot check whether delivery {delivery} was taken: {e}; nothing was stored"
                ),
            )
        })?;
    if taken {
        return Err(already(delivery));
    }

    let parsed = hook::parse(kinded, &body)?;
    let Some(repo) = shared.config.served(&parsed.repository) else {
        return Err(Problem::new(
            Kind::RepositoryNotServed,
            format!(
                "`{}` is not among the repositories agent {} serves (gitea.repositories); nothing was stored",
                parsed.repository, shared.agent
            ),
        ));
    };
    let repo = repo.to_string();
    let messages = complete(shared, &repo, delivery, kinded.event, parsed).await?;
    if let Some((i, len, max)) = events::too_large(&shared.bus, &messages) {
        return Err(Problem::new(
            Kind::MessageTooLarge,
            format!(
                "event {i} of this delivery is a message of {len} bytes, and the NATS server accepts at most {max} (max_payload, less room for headers); nothing was stored"
            ),
        ));
    }
    let total = messages.len();
    let duplicates = events::publish_all(&shared.bus, messages, PUBLISH_TIMEOUT)
        .await
        .map_err(|e| {
            Problem::new(
                Kind::NotStored,
                format!("not all {total} events of delivery {delivery} were stored: {e}; redelivering it is safe"),
            )
        })?;
    // Only now: a delivery whose events were not all stored must be taken
    // when Gitea sends it again.
    let record = DeliveryRecord {
        delivery_id: delivery.to_string(),
        event: name.to_string(),
        messages: total,
        taken_ms: records::now_ms(),
    };
    let took = records::take_delivery(&shared.bus, &shared.agent, &record)
        .await
        .map_err(|e| {
            Problem::new(
                Kind::NotStored,
                format!("the events of delivery {delivery} are stored, but its record is not: {e}; redelivering it is safe"),
            )
        })?;
    if !took {
        // Another request with the same delivery id got there first; its
        // events are the same ones.
        return Err(already(delivery));
    }
    tracing::info!(delivery, event = name, repository = %repo, messages = total, duplicates, "delivery stored");
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({
            "delivery": delivery,
            "event": kinded.event,
            "stored": total,
            "duplicates": duplicates,
        }),
    ))
}

fn already(delivery: &str) -> Problem {
    Problem::new(
        Kind::AlreadyReceived,
        format!("delivery {delivery} was received already; nothing was stored again"),
    )
}

/// The delivery's events: the one it is, completed with what the API
/// says (an assignment's assignee, the timeline entry of a pull request's
/// close, merge or reopen and the review a review's delivery announces,
/// whose ids the poll gives them too, and a review's inline comments,
/// each its own event).
async fn complete(
    shared: &Shared,
    repo: &str,
    delivery: &str,
    event: &'static str,
    parsed: hook::Parsed,
) -> Result<Vec<GiteaEvent>, Problem> {
    let unavailable = |what: &str, e: crate::api::ApiError| {
        Problem::new(
            Kind::GiteaUnavailable,
            format!("{what}: {e}; nothing was stored (the poll will find it, or redeliver it)"),
        )
    };
    let mut message_id = format!("gitea:{delivery}");
    if event == "issue_comment"
        && let Some(c) = &parsed.comment
    {
        match (parsed.action.as_str(), parsed.comment_updated) {
            ("created", _) => message_id = comment_id(c.id),
            ("edited", Some(at)) => message_id = comment_edit_id(c.id, at),
            _ => {}
        }
    }
    let merged = parsed.pull.as_ref().is_some_and(|p| p.merged);
    if event == "pull_request"
        && let Some(change) = StateChange::announced(&parsed.action, merged)
    {
        let entry = shared
            .gitea
            .retrying("reading a pull request's timeline", |_| {
                events::announced_change(
                    &shared.gitea,
                    repo,
                    parsed.number,
                    change,
                    &parsed.sender,
                    parsed.pull_updated,
                )
            })
            .await
            .map_err(|e| unavailable("reading which change of the pull request this was", e))?;
        if let Some(entry) = entry {
            message_id = timeline_id(entry.id);
        }
    }
    let mut comment = parsed.comment.clone();
    let mut inline = Vec::new();
    if parsed.need == Need::ReviewComments {
        let content = parsed.comment.as_ref().map_or("", |c| c.body.as_str());
        let (review, comments) = shared
            .gitea
            .retrying("reading a review and its comments", |_| async {
                let reviews = shared.gitea.reviews(repo, parsed.number).await?;
                let review = events::announced_review(
                    &reviews,
                    event,
                    &parsed.sender,
                    content,
                    parsed.pull_updated,
                )
                .cloned();
                let comments = events::comments_of(
                    &shared.gitea,
                    repo,
                    parsed.number,
                    &reviews,
                    Some(&parsed.sender),
                )
                .await?;
                Ok((review, comments))
            })
            .await
            .map_err(|e| unavailable("reading the review and its inline comments", e))?;
        if let Some(review) = review {
            message_id = review_id(review.id);
            comment = review.to_comment(parsed.number).or(comment);
        }
        inline = comments;
    }
    let mut assignee = String::new();
    if let Need::Assignee { removed } = parsed.need {
        let entry = shared
            .gitea
            .retrying("reading an issue's timeline", |_| {
                events::latest_assignment(
                    &shared.gitea,
                    repo,
                    parsed.number,
                    Some(&parsed.sender),
                    None,
                    removed,
                )
            })
            .await
            .map_err(|e| unavailable("reading whom the assignment was of", e))?;
        if let Some(entry) = entry {
            assignee = entry.assignee.map(|u| u.login).unwrap_or_default();
            message_id = timeline_id(entry.id);
        }
    }
    let main = GiteaEvent {
        envelope: Some(envelope(&shared.agent, &parsed.sender, message_id)),
        source: GiteaSource::Webhook as i32,
        delivery_id: delivery.to_string(),
        event: event.to_string(),
        action: parsed.action.clone(),
        repository: repo.to_string(),
        sender: parsed.sender.clone(),
        issue: parsed.issue.clone(),
        comment,
        pull: parsed.pull.clone(),
        assignee,
    };
    let mut out: Vec<GiteaEvent> = inline
        .iter()
        .map(|c| events::inline_comment_event(&shared.agent, &main, c, parsed.number))
        .collect();
    out.insert(0, main);
    Ok(out)
}

fn check_signature(shared: &Shared, headers: &HeaderMap, body: &[u8]) -> Result<(), Problem> {
    let Some(signature) = header(headers, "x-gitea-signature") else {
        return Err(Problem::new(
            Kind::BadSignature,
            "the delivery carries no X-Gitea-Signature: give the Gitea webhook the secret in gitea.webhook-secret-file",
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
                    "X-Gitea-Signature is not a hex HMAC-SHA256 (64 hex digits)"
                }
                Refused::Wrong => {
                    "X-Gitea-Signature is not the HMAC-SHA256 of this body with the webhook's secret"
                }
            },
        )
    })
}
