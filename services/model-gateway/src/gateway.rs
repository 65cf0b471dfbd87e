//! One model call, start to end: which model, whether the budget allows
//! it, the HTTP calls with their retries and fallbacks, what the reply is,
//! what it cost, and the capture of the whole exchange.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument as _;

use nisse_bus::proto::{
    Envelope, ModelError, ModelErrorKind, ModelExchange, ModelReply, ModelRequest, ModelResponse,
    Usage, model_response::Outcome,
};
use nisse_bus::secret::Secret;
use nisse_bus::service::Service;
use nisse_bus::{AgentName, Backoff, Bus};
use nisse_models::{ModelEntry, ModelsConfig, Role};

use crate::usage;
use crate::wire::{self, Failure, kind_name};
use crate::{Error, Result};

/// The service; its name is its durable consumer's.
pub const SERVICE: Service = Service {
    name: nisse_bus::ConsumerSpec::MODEL_GATEWAY.name,
    about: "the model gateway: model requests to the pinned model over an OpenAI-compatible endpoint, with retries, fallbacks, budgets and capture",
};

/// The model gateway as a library: the service runs it on `model.req`, the
/// classifier calls it in-process. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    config: ModelsConfig,
    bus: Bus,
    http: reqwest::Client,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("endpoint", &self.inner.config.endpoint)
            .field("roles", &self.inner.config.roles)
            .finish_non_exhaustive()
    }
}

/// How one HTTP call went.
enum Attempt {
    /// Final for this request: a reply, or a failure no retry or other
    /// model would fix (a malformed or truncated reply, a 4xx).
    Done(std::result::Result<ModelReply, Failure>, Option<Usage>),
    /// Worth trying again (429, 5xx, connection, timeout), after the
    /// server's `Retry-After` when it gave one.
    Retry(Failure, Option<Duration>),
}

/// What the HTTP calls of one request came to.
struct Called {
    model: String,
    result: std::result::Result<ModelReply, Failure>,
    usage: Option<Usage>,
    attempts: u32,
}

impl Gateway {
    /// A gateway calling the models of `config`, keeping budgets and
    /// captures on `bus`. `config` is taken as validated.
    pub fn new(config: ModelsConfig, bus: Bus) -> Result<Self> {
        // The per-call timeout is set on each request (it differs per
        // model); connecting gets its own bound so a dead host fails fast
        // enough to leave time for retries.
        let http = reqwest::Client::builder()
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| Error::Client(e.to_string()))?;
        Ok(Self {
            inner: Arc::new(Inner { config, bus, http }),
        })
    }

    /// The configuration it calls models by.
    pub fn config(&self) -> &ModelsConfig {
        &self.inner.config
    }

    /// The bus it keeps budgets and captures on.
    pub(crate) fn bus(&self) -> &Bus {
        &self.inner.bus
    }

    /// Whether a model is configured for `role` now.
    pub fn serves(&self, role: Role) -> bool {
        self.inner
            .config
            .roles
            .get(&role)
            .is_some_and(|m| self.inner.config.models.contains_key(m))
    }

    /// Answers `request` for `agent` on behalf of `caller` (`"brain"`,
    /// `"classifier"`): always a response, the model's reply or a
    /// `ModelError` saying what went wrong, and always captured on
    /// `model.capture`. When the bus cannot be reached to check the
    /// budget, no model is called and the answer is an `UPSTREAM` error.
    pub async fn complete(
        &self,
        agent: &AgentName,
        request: &ModelRequest,
        caller: &str,
    ) -> ModelResponse {
        match self.try_complete(agent, request, caller).await {
            Ok(response) => response,
            Err(e) => {
                let response = self.response(
                    request,
                    agent,
                    Called {
                        model: request.model.clone(),
                        result: Err(Failure::new(
                            ModelErrorKind::Upstream,
                            format!("the budget could not be checked, so no model was called: {e}"),
                        )),
                        usage: None,
                        attempts: 0,
                    },
                    Duration::ZERO,
                );
                self.capture(agent, request, &response, caller).await;
                response
            }
        }
    }

    /// [`Gateway::complete`], except that trouble with the bus before any
    /// model is called is an error, so a service can retry the message
    /// later instead of answering it with an error.
    pub async fn try_complete(
        &self,
        agent: &AgentName,
        request: &ModelRequest,
        caller: &str,
    ) -> Result<ModelResponse> {
        let span = tracing::info_span!(
            "model.call",
            %agent,
            request = %request.request_id,
            role = %request.role,
            caller,
            model = tracing::field::Empty,
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        async move {
            let began = Instant::now();
            let called = match self.admit(agent, request).await? {
                Err(refused) => Called {
                    model: refused.0,
                    result: Err(refused.1),
                    usage: None,
                    attempts: 0,
                },
                Ok(model) => {
                    let called = self.call(request, &model).await;
                    self.record_tokens(agent, request, called.usage.as_ref())
                        .await;
                    called
                }
            };
            let latency = began.elapsed();
            let response = self.response(request, agent, called, latency);
            let outcome = outcome_of(&response);
            let span = tracing::Span::current();
            span.record("model", response.model.as_str());
            span.record("attempts", response.attempts);
            span.record("outcome", outcome.as_str());
            match &response.outcome {
                Some(Outcome::Error(e)) => tracing::warn!(
                    request = %request.request_id,
                    role = %request.role,
                    model = %response.model,
                    attempts = response.attempts,
                    outcome = %outcome,
                    latency_ms = response.latency_ms,
                    "model call failed: {}",
                    e.message
                ),
                _ => tracing::info!(
                    request = %request.request_id,
                    role = %request.role,
                    model = %response.model,
                    attempts = response.attempts,
                    outcome = %outcome,
                    latency_ms = response.latency_ms,
                    "model call answered"
                ),
            }
            self.capture(agent, request, &response, caller).await;
            Ok(response)
        }
        .instrument(span)
        .await
    }

    /// The model to call, once the request is valid and the budget allows
    /// one more call (which it then counts). `Ok(Err((model, failure)))`
    /// refuses the request without any HTTP call.
    async fn admit(
        &self,
        agent: &AgentName,
        request: &ModelRequest,
    ) -> Result<std::result::Result<String, (String, Failure)>> {
        let config = &self.inner.config;
        let upstream = |m: String| Failure::new(ModelErrorKind::Upstream, m);
        let Some(role) = Role::parse(&request.role) else {
            return Ok(Err((
                request.model.clone(),
                upstream(format!(
                    "unknown role `{}` (roles: {})",
                    request.role,
                    Role::ALL.map(Role::as_str).join(", ")
                )),
            )));
        };
        // The pin first: a configuration change never moves a work item
        // that already started to another model (seed L9).
        let pinned = !request.model.is_empty();
        let model = if pinned {
            request.model.clone()
        } else {
            match config.roles.get(&role) {
                Some(m) => m.clone(),
                None => {
                    return Ok(Err((
                        String::new(),
                        upstream(format!(
                            "no model is configured for role `{role}` (models.roles.{role})"
                        )),
                    )));
                }
            }
        };
        let Some(entry) = config.model(&model) else {
            return Ok(Err((
                model.clone(),
                upstream(format!(
                    "model `{model}`{} is not configured under models.models",
                    if pinned {
                        ", pinned for this work item,"
                    } else {
                        ""
                    }
                )),
            )));
        };
        if request.request_id.is_empty() {
            return Ok(Err((
                model,
                upstream("the request has no request id".into()),
            )));
        }
        // A request that cannot be sent is refused before it costs budget.
        if let Err(f) = wire::request_body(request, upstream_name(&model, entry), &entry.profile) {
            return Ok(Err((model, f)));
        }
        let work_item = work_item_of(request);
        if work_item.is_empty() {
            return Ok(Ok(model));
        }
        let budget = config.budget(role);
        // Counted before the call, so concurrent calls of one item cannot
        // all pass the check and overspend together.
        let counted = usage::update(&self.inner.bus, agent, work_item, role.as_str(), |usage| {
            if usage.calls < budget.calls && usage.tokens() < budget.tokens {
                usage.calls += 1;
                return Ok(());
            }
            let cap = if usage.calls >= budget.calls {
                "calls"
            } else {
                "tokens"
            };
            Err(Failure::new(
                ModelErrorKind::BudgetExceeded,
                format!(
                    "the {role} budget of work item {work_item} is used up ({cap}): {} of {} calls (models.budgets.{role}.calls) and {} of {} tokens (models.budgets.{role}.tokens) spent",
                    usage.calls,
                    budget.calls,
                    usage.tokens(),
                    budget.tokens
                ),
            ))
        })
        .await?;
        Ok(counted.map(|()| model.clone()).map_err(|f| (model, f)))
    }

    /// The HTTP calls: `model` with retries, then its fallbacks in order.
    async fn call(&self, request: &ModelRequest, model: &str) -> Called {
        let config = &self.inner.config;
        let fallbacks = config
            .model(model)
            .map(|e| e.fallbacks.clone())
            .unwrap_or_default();
        let mut attempts = 0u32;
        let mut last = Failure::new(
            ModelErrorKind::Upstream,
            format!("model `{model}` was never tried"),
        );
        let mut last_model = model.to_string();
        for name in std::iter::once(model.to_string()).chain(fallbacks) {
            last_model.clone_from(&name);
            let Some(entry) = config.model(&name) else {
                last = Failure::new(
                    ModelErrorKind::Upstream,
                    format!("fallback `{name}` is not configured under models.models"),
                );
                continue;
            };
            let body =
                match wire::request_body(request, upstream_name(&name, entry), &entry.profile) {
                    Ok(b) => b.to_string(),
                    Err(f) => {
                        return Called {
                            model: name,
                            result: Err(f),
                            usage: None,
                            attempts,
                        };
                    }
                };
            let endpoint = if entry.endpoint.is_empty() {
                &config.endpoint
            } else {
                &entry.endpoint
            };
            let url = format!("{}/chat/completions", endpoint.trim_end_matches('/'));
            let key_file = entry.api_key_file.as_ref().or(config.api_key_file.as_ref());
            let key = match key_file {
                None => None,
                Some(path) => match read_key(path) {
                    Ok(k) => Some(k),
                    Err(f) => {
                        // Another model may have a key of its own.
                        tracing::warn!(model = %name, "{}", f.message);
                        last = f;
                        continue;
                    }
                },
            };
            let timeout = entry.timeout.unwrap_or(config.timeout);
            for retry in 0..=config.retries {
                attempts += 1;
                match self.attempt(&url, key.as_deref(), &body, timeout).await {
                    Attempt::Done(result, usage) => {
                        return Called {
                            model: name,
                            result,
                            usage,
                            attempts,
                        };
                    }
                    Attempt::Retry(failure, retry_after) => {
                        let more = retry < config.retries;
                        tracing::warn!(
                            request = %request.request_id,
                            model = %name,
                            attempt = attempts,
                            "model call failed{}: {}",
                            if more { ", retrying" } else { "" },
                            failure.message
                        );
                        last = failure;
                        if more {
                            tokio::time::sleep(backoff(config, retry, retry_after)).await;
                        }
                    }
                }
            }
        }
        Called {
            model: last_model,
            result: Err(last),
            usage: None,
            attempts,
        }
    }

    /// One HTTP call.
    async fn attempt(
        &self,
        url: &str,
        key: Option<&str>,
        body: &str,
        timeout: Duration,
    ) -> Attempt {
        let mut builder = self
            .inner
            .http
            .post(url)
            .timeout(timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        if let Some(key) = key {
            builder = builder.bearer_auth(key);
        }
        let timed_out = || {
            Failure::new(
                ModelErrorKind::Timeout,
                format!("no complete answer from {url} within {timeout:?}"),
            )
        };
        let response = match builder.send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return Attempt::Retry(timed_out(), None),
            Err(e) => {
                return Attempt::Retry(
                    Failure::new(
                        ModelErrorKind::Upstream,
                        format!("calling {url}: {}", chain(&e)),
                    ),
                    None,
                );
            }
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let cap = self.inner.config.max_response;
        let bytes = match read_body(response, cap.as_u64()).await {
            Ok(b) => b,
            // Never retried: the same endpoint would most likely answer
            // the same way, and a model that talks past the cap has spent
            // its tokens already. Only the cap's worth was held in memory.
            Err(BodyError::TooLarge) => {
                let (kind, what) = if status.is_success() {
                    (ModelErrorKind::Malformed, "the reply".to_string())
                } else {
                    (
                        ModelErrorKind::Upstream,
                        format!("the HTTP {} answer", status.as_u16()),
                    )
                };
                return Attempt::Done(
                    Err(Failure::new(
                        kind,
                        format!(
                            "{what} from {url} is larger than the cap of {cap} (models.max-response); it was not read further"
                        ),
                    )),
                    None,
                );
            }
            Err(BodyError::Read(e)) if e.is_timeout() => return Attempt::Retry(timed_out(), None),
            // A reply that starts and then breaks off is not a dropped
            // connection to retry blindly: what came may have been acted
            // on upstream (tokens spent), and a partial body must never
            // pass for a short reply.
            Err(BodyError::Read(e)) if status.is_success() => {
                return Attempt::Done(
                    Err(Failure::new(
                        ModelErrorKind::Malformed,
                        format!("the reply from {url} was cut off: {}", chain(&e)),
                    )),
                    None,
                );
            }
            // An error status whose body broke off: the status says enough.
            Err(BodyError::Read(_)) => Vec::new(),
        };
        let code = status.as_u16();
        if status.is_success() {
            let (result, usage) = wire::parse_reply(&bytes);
            return Attempt::Done(result, usage);
        }
        let message = wire::error_message(&bytes);
        if code == 429 || code == 408 || status.is_server_error() {
            if status.is_server_error() && wire::context_too_long(&message) {
                return Attempt::Done(Err(wire::http_failure(code, &message)), None);
            }
            return Attempt::Retry(
                Failure::new(ModelErrorKind::Upstream, format!("HTTP {code}: {message}")),
                retry_after,
            );
        }
        Attempt::Done(Err(wire::http_failure(code, &message)), None)
    }

    /// Adds what a call reported to its item's usage. Best effort: the
    /// reply is already there, and failing it for bookkeeping would only
    /// make the brain call again.
    async fn record_tokens(
        &self,
        agent: &AgentName,
        request: &ModelRequest,
        usage: Option<&Usage>,
    ) {
        let work_item = work_item_of(request);
        let Some(usage) = usage.filter(|_| !work_item.is_empty()) else {
            return;
        };
        if usage.prompt_tokens == 0 && usage.completion_tokens == 0 {
            return;
        }
        let added = usage::update(
            &self.inner.bus,
            agent,
            work_item,
            &request.role,
            |spent| -> Result<(), ()> {
                spent.prompt_tokens = spent.prompt_tokens.saturating_add(usage.prompt_tokens);
                spent.completion_tokens = spent
                    .completion_tokens
                    .saturating_add(usage.completion_tokens);
                Ok(())
            },
        )
        .await;
        if let Err(e) = added {
            tracing::warn!(request = %request.request_id, "tokens not counted: {e}");
        }
    }

    /// The response to `request`: the request's agent and work item, the
    /// gateway as actor, an id derived from the request id (a redelivered
    /// request republishes the same id and JetStream drops it).
    fn response(
        &self,
        request: &ModelRequest,
        agent: &AgentName,
        called: Called,
        latency: Duration,
    ) -> ModelResponse {
        ModelResponse {
            envelope: Some(envelope(
                agent,
                request,
                format!("resp:{}", request.request_id),
            )),
            request_id: request.request_id.clone(),
            outcome: Some(match called.result {
                Ok(reply) => Outcome::Reply(reply),
                Err(f) => Outcome::Error(ModelError {
                    kind: f.kind as i32,
                    message: f.message,
                }),
            }),
            model: called.model,
            usage: called.usage,
            latency_ms: u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
            attempts: called.attempts,
        }
    }

    /// Publishes the exchange on `model.capture` (seed L9's evaluation
    /// capture). A capture that cannot be stored is logged, never a reason
    /// to withhold the answer.
    async fn capture(
        &self,
        agent: &AgentName,
        request: &ModelRequest,
        response: &ModelResponse,
        caller: &str,
    ) {
        if request.request_id.is_empty() {
            // Its id would collide with every other such capture.
            return;
        }
        let exchange = ModelExchange {
            envelope: Some(envelope(
                agent,
                request,
                format!("capture:{}", request.request_id),
            )),
            request_id: request.request_id.clone(),
            role: request.role.clone(),
            request: Some(request.clone()),
            response: Some(response.clone()),
            outcome: outcome_of(response),
            caller: caller.to_string(),
        };
        if let Err(e) = self.inner.bus.publish(exchange).await {
            tracing::warn!(request = %request.request_id, "the model call was not captured: {e}");
        }
    }
}

/// `"ok"`, or the error kind in snake case (`"timeout"`), as a capture's
/// `outcome` says it.
pub fn outcome_of(response: &ModelResponse) -> String {
    match &response.outcome {
        Some(Outcome::Reply(_)) => "ok".into(),
        Some(Outcome::Error(e)) => kind_name(ModelErrorKind::try_from(e.kind).unwrap_or_default()),
        None => "unspecified".into(),
    }
}

fn envelope(agent: &AgentName, request: &ModelRequest, message_id: String) -> Envelope {
    Envelope {
        // The stream's agent: its answer goes back where the request was.
        agent: agent.to_string(),
        ..SERVICE.reply_to(request.envelope.as_ref(), message_id)
    }
}

fn work_item_of(request: &ModelRequest) -> &str {
    request
        .envelope
        .as_ref()
        .map_or("", |e| e.work_item_id.as_str())
}

fn upstream_name<'a>(name: &'a str, entry: &'a ModelEntry) -> &'a str {
    if entry.upstream.is_empty() {
        name
    } else {
        &entry.upstream
    }
}

/// The wait before retry number `retry` (0-based): the server's
/// `Retry-After` when it gave one, else the backoff from
/// `retry-backoff`; never more than `retry-backoff-max`.
fn backoff(config: &ModelsConfig, retry: u32, retry_after: Option<Duration>) -> Duration {
    let policy = Backoff::new(config.retry_backoff, config.retry_backoff_max);
    retry_after
        .unwrap_or_else(|| policy.delay(retry))
        .min(policy.max())
}

/// Why an answer's body could not be had whole.
enum BodyError {
    /// It is longer than the cap (declared so, or found so while reading).
    TooLarge,
    /// The connection failed or timed out while reading it.
    Read(reqwest::Error),
}

/// Reads an answer's body, holding at most `cap` bytes: a declared length
/// over the cap is refused before anything is read, and an undeclared one
/// is read chunk by chunk until it ends or passes the cap. The per-call
/// timeout bounds how long a slow one takes.
async fn read_body(mut response: reqwest::Response, cap: u64) -> Result<Vec<u8>, BodyError> {
    let declared = response.content_length();
    if declared.is_some_and(|n| n > cap) {
        return Err(BodyError::TooLarge);
    }
    let limit = usize::try_from(cap).unwrap_or(usize::MAX);
    let mut body = Vec::with_capacity(
        declared
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0)
            .min(limit),
    );
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Read)? {
        if body.len().saturating_add(chunk.len()) > limit {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The bearer token, read at each call so a rotated key takes effect at
/// once.
fn read_key(path: &Path) -> std::result::Result<String, Failure> {
    Secret::File(path.to_path_buf())
        .read_text()
        .map_err(|e| Failure::new(ModelErrorKind::Upstream, format!("the API key file: {e}")))
}

/// An error with its causes, which is where reqwest says what happened
/// ("connection refused").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_honours_retry_after_and_is_capped() {
        let config = ModelsConfig {
            retry_backoff: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(1),
            ..Default::default()
        };
        assert_eq!(backoff(&config, 0, None), Duration::from_millis(100));
        assert_eq!(backoff(&config, 2, None), Duration::from_millis(400));
        assert_eq!(backoff(&config, 9, None), Duration::from_secs(1));
        assert_eq!(
            backoff(&config, 0, Some(Duration::from_millis(300))),
            Duration::from_millis(300)
        );
        assert_eq!(
            backoff(&config, 0, Some(Duration::from_secs(120))),
            Duration::from_secs(1)
        );
    }
}
