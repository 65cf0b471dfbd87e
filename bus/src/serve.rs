//! The service skeleton: the one loop that takes a service's messages.
//!
//! [`serve`] binds the service's durable consumer on each agent stream it
//! serves, reports ready, and then, per agent, takes each delivery, hands
//! it to the service's [`Handler`] with at most `in_flight` handled at
//! once, keeps it alive with progress acks while it is handled (a model
//! call or a command may outlast the ack wait), settles it by the
//! handler's outcome ([`Delivery::settle`]: ack, retry with backoff, or
//! dead-letter), and on shutdown stops taking messages and lets the ones
//! in hand finish. A service writes only its handler.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, oneshot};
use tracing::Instrument as _;

use crate::backoff::{Backoff, Persist};
use crate::service::Context;
use crate::{AgentName, ConsumerSpec, Decode, Delivery, Result, Unhandled};

/// What a service does with one message.
pub trait Handler<T>: Send + Sync + 'static {
    /// Handles `delivery` from `agent`'s stream. `Ok` acks it; an error
    /// says whether to retry it or dead-letter it. It may be called again
    /// for the same message (after a crash, or a retry), so it must be
    /// idempotent on the message id.
    fn handle(
        &self,
        agent: &AgentName,
        delivery: &Delivery<T>,
    ) -> impl Future<Output = Result<(), Unhandled>> + Send;
}

/// How a service takes its messages.
#[derive(Debug, Clone, Copy)]
pub struct Intake {
    /// Its durable consumer on every agent stream.
    pub consumer: ConsumerSpec,
    /// Deliveries of one agent handled at once. With 1 they are handled
    /// one after another in stream order; with more, each waits for a free
    /// slot while kept alive, so nothing taken is redelivered meanwhile.
    pub in_flight: usize,
}

/// Waits after a consumer-level failure (the connection, a missed
/// heartbeat): short, since the client reconnects by itself.
const CONSUMER_BACKOFF: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(2));

/// Serves `handlers` (one per agent) on `intake` until `ctx.shutdown`,
/// reporting `ctx.ready` once every consumer is bound. Returns when every
/// message taken has been settled (or the process is stopped under it,
/// and it is redelivered).
pub async fn serve<C, T, H>(
    ctx: &Context<C>,
    intake: Intake,
    handlers: Vec<(AgentName, Arc<H>)>,
) -> Result<()>
where
    T: Decode + Send + Sync + 'static,
    H: Handler<T>,
{
    let mut bound = Vec::with_capacity(handlers.len());
    for (agent, handler) in handlers {
        let consumer = ctx.bus.consumer::<T>(&agent, intake.consumer).await?;
        bound.push((agent, handler, consumer));
    }
    ctx.ready.ready();
    let mut agents = tokio::task::JoinSet::new();
    for (agent, handler, mut consumer) in bound {
        let shutdown = ctx.shutdown.clone();
        let name = intake.consumer.name;
        let slots = Arc::new(Semaphore::new(intake.in_flight.max(1)));
        let in_order = intake.in_flight <= 1;
        agents.spawn(async move {
            let mut running = tokio::task::JoinSet::new();
            let mut trouble = Persist::new("take messages from the consumer", CONSUMER_BACKOFF);
            // One after another: each waits for the one before it to be
            // settled, kept alive meanwhile (the client fetches ahead, and
            // a message waiting behind a long one must not outlive its ack
            // wait and come back, or be dead-lettered though handled).
            let mut previous: Option<oneshot::Receiver<()>> = None;
            while let Some(next) = consumer.next(&shutdown).await {
                let delivery = match next {
                    Ok(d) => d,
                    Err(e) => {
                        let why = e.to_string();
                        tracing::warn!(%agent, consumer = name, "{why}");
                        tokio::select! {
                            () = shutdown.cancelled() => break,
                            () = trouble.failed(&why) => {}
                        }
                        continue;
                    }
                };
                trouble.succeeded();
                let turn = if in_order {
                    let (done, next_waits) = oneshot::channel();
                    Turn::After(previous.replace(next_waits), done)
                } else {
                    Turn::Slot(slots.clone())
                };
                let (agent, handler, shutdown) = (agent.clone(), handler.clone(), shutdown.clone());
                running.spawn(async move {
                    handle(&agent, handler.as_ref(), &delivery, turn, &shutdown).await;
                });
                // Reap finished ones as we go.
                while running.try_join_next().is_some() {}
            }
            while running.join_next().await.is_some() {}
        });
    }
    while agents.join_next().await.is_some() {}
    Ok(())
}

/// When a delivery may be handled.
enum Turn {
    /// When a slot is free (deliveries handled concurrently).
    Slot(Arc<Semaphore>),
    /// When the delivery before it was settled (`None`: it is the first);
    /// then it says so on its own sender.
    After(Option<oneshot::Receiver<()>>, oneshot::Sender<()>),
}

/// Handles one delivery once it is its turn, kept alive throughout (also
/// while it waits), and settles it.
async fn handle<T: Decode, H: Handler<T>>(
    agent: &AgentName,
    handler: &H,
    delivery: &Delivery<T>,
    turn: Turn,
    shutdown: &tokio_util::sync::CancellationToken,
) {
    let (slots, previous, done) = match turn {
        Turn::Slot(slots) => (Some(slots), None, None),
        Turn::After(previous, done) => (None, previous, Some(done)),
    };
    // Inside the delivery's span: what the handler logs names the message,
    // and what it publishes carries the sender's trace.
    let outcome = delivery
        .keep_alive(async {
            let stopping = || Unhandled::retry_after("the service is stopping", Duration::ZERO);
            let _slot = match &slots {
                None => None,
                Some(slots) => tokio::select! {
                    slot = slots.acquire() => Some(slot.map_err(Unhandled::retry)?),
                    // Not started: handed back at once for another instance.
                    () = shutdown.cancelled() => return Err(stopping()),
                },
            };
            if let Some(previous) = previous {
                tokio::select! {
                    // A stop while it waited wins over its turn coming:
                    // nothing is started after the stop.
                    biased;
                    () = shutdown.cancelled() => return Err(stopping()),
                    // Settled, or its task is gone: either way it is done.
                    _ = previous => {}
                }
            }
            handler
                .handle(agent, delivery)
                .instrument(delivery.span().clone())
                .await
        })
        .await;
    if let Err(e) = &outcome {
        tracing::warn!(parent: delivery.span(), %agent, "not handled: {e}");
    }
    if let Err(e) = delivery.settle(outcome).await {
        tracing::warn!(parent: delivery.span(), %agent, "settling the message: {e}");
    }
    if let Some(done) = done {
        let _ = done.send(());
    }
}
