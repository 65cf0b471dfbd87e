//! The gateway as a service: each agent's `model-gateway` consumer,
//! `model.req` → `model.resp`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use nisse_bus::proto::ModelRequest;
use nisse_bus::{AgentName, Bus, ConsumerSpec, Delivery, Disposition, HandlerError};
use nisse_models::ModelsConfig;

use crate::{Gateway, Result};

/// Who asks through `model.req`: the agents' brains.
const CALLER: &str = "brain";

/// Why a request was not answered.
#[derive(Debug, thiserror::Error)]
enum Unanswered {
    /// The bus (budget bucket, publishing) or a shutdown got in the way:
    /// redelivered, after the given delay or the consumer's backoff.
    #[error("{0}")]
    Later(String, Option<Duration>),
    /// The request can never be answered (it has no request id, so its
    /// answer would have no id either): dead-lettered.
    #[error("{0}")]
    Never(String),
}

impl HandlerError for Unanswered {
    fn disposition(&self) -> Disposition {
        match self {
            Self::Later(_, delay) => Disposition::Retry(*delay),
            Self::Never(_) => Disposition::DeadLetter,
        }
    }
}

/// Serves `agents` until `shutdown`: one task per agent on its
/// `model-gateway` consumer (several processes may share it), answering up
/// to `max-in-flight` requests of each agent at once. Every request taken
/// is kept alive on the server while it waits for a slot or its model, so
/// a slow model does not get it redelivered. `ready` is called once every
/// consumer is bound. Requests still running at shutdown finish (or are
/// abandoned un-acked by the process's grace period, and redelivered).
pub async fn run(
    bus: Bus,
    agents: Vec<AgentName>,
    config: Arc<ModelsConfig>,
    shutdown: CancellationToken,
    ready: impl FnOnce(),
) -> Result<()> {
    let gateway = Gateway::new(ModelsConfig::clone(&config), bus.clone())?;
    let mut consumers = Vec::new();
    for agent in &agents {
        consumers.push((
            agent.clone(),
            bus.consumer::<ModelRequest>(agent, ConsumerSpec::MODEL_GATEWAY)
                .await?,
        ));
    }
    ready();
    let mut tasks = tokio::task::JoinSet::new();
    for (agent, mut consumer) in consumers {
        let gateway = gateway.clone();
        let shutdown = shutdown.clone();
        let slots = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
        tasks.spawn(async move {
            let mut running = tokio::task::JoinSet::new();
            while let Some(next) = consumer.next(&shutdown).await {
                let delivery = match next {
                    Ok(d) => d,
                    Err(e) => {
                        tracing::warn!(%agent, "model-gateway consumer: {e}");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                };
                let gateway = gateway.clone();
                let slots = slots.clone();
                let shutdown = shutdown.clone();
                let agent = agent.clone();
                running.spawn(async move {
                    let outcome = delivery
                        .keep_alive(answer(&gateway, &agent, &delivery, &slots, &shutdown))
                        .await;
                    if let Err(e) = &outcome {
                        tracing::warn!(
                            parent: delivery.span(),
                            request = %delivery.message().request_id,
                            "model request not answered: {e}"
                        );
                    }
                    if let Err(e) = delivery.settle(outcome).await {
                        tracing::warn!(%agent, "settling a model request: {e}");
                    }
                });
                while running.try_join_next().is_some() {}
            }
            while running.join_next().await.is_some() {}
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Answers one delivery: waits for a slot, calls the model, publishes the
/// response. The ack (by the caller) comes only after the response is
/// stored, so a crash in between redelivers the request.
async fn answer(
    gateway: &Gateway,
    agent: &AgentName,
    delivery: &Delivery<ModelRequest>,
    slots: &Semaphore,
    shutdown: &CancellationToken,
) -> std::result::Result<(), Unanswered> {
    let request = delivery.message();
    if request.request_id.is_empty() {
        return Err(Unanswered::Never(
            "a model request without a request id".into(),
        ));
    }
    let _slot = tokio::select! {
        slot = slots.acquire() => slot.map_err(|e| Unanswered::Later(e.to_string(), None))?,
        // Not started: handed back at once for another instance.
        () = shutdown.cancelled() => {
            return Err(Unanswered::Later("shutting down".into(), Some(Duration::ZERO)));
        }
    };
    let response = gateway
        .try_complete(agent, request, CALLER)
        .await
        .map_err(|e| Unanswered::Later(e.to_string(), None))?;
    gateway
        .bus()
        .publish(response)
        .await
        .map_err(|e| Unanswered::Later(format!("publishing the response: {e}"), None))?;
    Ok(())
}
