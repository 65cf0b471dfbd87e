//! Typed consuming from a durable pull consumer.
//!
//! [`Consumer::next`] yields only messages that decoded and validated; the
//! rest are dead-lettered on the way (recorded on `nisse.<agent>.deadletter`
//! with the reason and original bytes, then terminated), so poison never
//! reaches a handler, never crashes a service and is never redelivered
//! forever. The caller handles a [`Delivery`] and then settles it with the
//! outcome: ack, retry after a delay, or dead-letter, as the error says.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures::{FutureExt as _, StreamExt as _};
use tokio_util::sync::CancellationToken;

use nisse_proto::v1::{Actor, ActorKind, DeadLetter, DeadLetterCause, Envelope};

use crate::topology::MIN_PROGRESS_INTERVAL;
use crate::trace::adopt_parent;
use crate::{AgentName, Bus, ConsumerSpec, Decode, Error, Rejection, Result, SubjectKind};

/// What to do with a message whose handling failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Try again later (a server away, a timeout): nak with this delay, or
    /// with the consumer's backoff when `None`. On the last allowed
    /// delivery the message is dead-lettered instead.
    Retry(Option<Duration>),
    /// It can never succeed (invalid content the decoder could not see):
    /// dead-letter it now.
    DeadLetter,
}

/// Why a handler did not handle a delivery now, and what to do with it:
/// the one error type every service's handler returns, so every message
/// is settled by the same rules ([`Delivery::settle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhandled {
    reason: String,
    disposition: Disposition,
}

impl Unhandled {
    /// Worth trying again after the consumer's backoff: the bus, a server
    /// or a file was not there this time.
    pub fn retry(reason: impl fmt::Display) -> Self {
        Self {
            reason: reason.to_string(),
            disposition: Disposition::Retry(None),
        }
    }

    /// Worth trying again after exactly `delay` (zero: hand it back at
    /// once, e.g. to another instance while this one stops).
    pub fn retry_after(reason: impl fmt::Display, delay: Duration) -> Self {
        Self {
            reason: reason.to_string(),
            disposition: Disposition::Retry(Some(delay)),
        }
    }

    /// Can never be handled, however often it is tried: dead-lettered now
    /// with `reason`.
    pub fn dead_letter(reason: impl fmt::Display) -> Self {
        Self {
            reason: reason.to_string(),
            disposition: Disposition::DeadLetter,
        }
    }

    /// Whether to retry the message or dead-letter it.
    pub fn disposition(&self) -> Disposition {
        self.disposition
    }
}

impl fmt::Display for Unhandled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Unhandled {}

/// The bus failing under a handler (a publish not acknowledged, a bucket
/// not reachable) is worth a retry: the client reconnects by itself.
impl From<Error> for Unhandled {
    fn from(e: Error) -> Self {
        Self::retry(e)
    }
}

/// How a delivery was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Acknowledged: done.
    Acked,
    /// Nak'd: the server redelivers it after this delay.
    Retrying(Duration),
    /// Recorded on the dead-letter subject and terminated.
    DeadLettered,
}

/// A durable consumer of one agent's stream, yielding `T`s.
pub struct Consumer<T> {
    shared: Arc<Shared>,
    spec: ConsumerSpec,
    messages: jetstream::consumer::pull::Stream,
    _decodes: PhantomData<fn() -> T>,
}

/// What every delivery of a consumer needs to settle itself; shared, so a
/// delivery costs a reference count rather than copies.
struct Shared {
    bus: Bus,
    agent: AgentName,
    consumer: &'static str,
    /// The server's ack wait for this consumer. It, not this process's
    /// configuration, decides when a message is redelivered, so progress
    /// acks are timed by it.
    ack_wait: Duration,
    /// Deliveries a handler gets (the server allows one more, which is
    /// only ever dead-lettered).
    max_deliver: u64,
    /// Whether the server takes an ack for every earlier message too (its
    /// `AckAll` policy, the brain's), as the server has it: a consumer
    /// made by an older version still acks each.
    acks_all: bool,
}

impl<T> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("agent", &self.shared.agent)
            .field("consumer", &self.spec.name)
            .finish_non_exhaustive()
    }
}

/// How long one pull request stays open at the server, and how often the
/// server says it is still there while nothing comes: a pull request left
/// on a server that died, or on a consumer whose leader moved in a
/// cluster, is noticed by the missing heartbeats within seconds and made
/// again, instead of after the client's defaults (30 s and 15 s), during
/// which the service took nothing.
const PULL_EXPIRES: Duration = Duration::from_secs(10);
const PULL_HEARTBEAT: Duration = Duration::from_secs(2);

impl Bus {
    /// Binds to a service's durable consumer on an agent's stream. The
    /// consumer must exist (`ensure_topology` creates it); every process that
    /// binds the same one shares its messages.
    pub async fn consumer<T: Decode>(
        &self,
        agent: &AgentName,
        spec: ConsumerSpec,
    ) -> Result<Consumer<T>> {
        if !T::accepts(spec.filter) {
            return Err(Error::Config(format!(
                "consumer `{}` takes {} but its handler decodes something else",
                spec.name,
                spec.filter_subject(agent)
            )));
        }
        let stream_name = agent.stream();
        let err = |e: &dyn fmt::Display| Error::Consume {
            stream: stream_name.clone(),
            consumer: spec.name.to_string(),
            reason: format!("{e} (has the topology been ensured? `nisse up` does it)"),
        };
        let stream = self
            .jetstream()
            .get_stream(&stream_name)
            .await
            .map_err(|e| err(&e))?;
        let consumer: jetstream::consumer::PullConsumer =
            stream.get_consumer(spec.name).await.map_err(|e| err(&e))?;
        let info = consumer.cached_info();
        let ack_wait = info.config.ack_wait;
        let acks_all = info.config.ack_policy == jetstream::consumer::AckPolicy::All;
        // -1 (or 0): unlimited, for a consumer made by other hands.
        let max_deliver = u64::try_from(info.config.max_deliver)
            .ok()
            .filter(|n| *n > 0)
            .map_or(u64::MAX, |n| n.saturating_sub(1).max(1));
        let batch = spec.pull_batch(&self.config().consumers);
        let messages = consumer
            .stream()
            .max_messages_per_batch(batch)
            .expires(PULL_EXPIRES)
            .heartbeat(PULL_HEARTBEAT)
            .messages()
            .await
            .map_err(|e| err(&e))?;
        Ok(Consumer {
            shared: Arc::new(Shared {
                bus: self.clone(),
                agent: agent.clone(),
                consumer: spec.name,
                ack_wait,
                max_deliver,
                acks_all,
            }),
            spec,
            messages,
            _decodes: PhantomData,
        })
    }
}

impl<T: Decode> Consumer<T> {
    /// The next message that decoded and validated, or `None` once
    /// `shutdown` is cancelled. Messages that cannot be processed are
    /// dead-lettered on the way. An `Err` is a consumer-level failure (the
    /// connection, the consumer deleted); the client recovers from the
    /// transient ones itself, so a caller logs it and calls again.
    pub async fn next(&mut self, shutdown: &CancellationToken) -> Option<Result<Delivery<T>>> {
        loop {
            let raw = tokio::select! {
                biased;
                // Messages the client fetched ahead but never yielded stay
                // un-acked and return to the consumer after the ack wait.
                // Nak'ing them here would hand them straight back to this
                // instance's still-open pull request.
                () = shutdown.cancelled() => return None,
                item = self.messages.next() => item?,
            };
            if let Some(out) = self.take(raw).await {
                return Some(out);
            }
        }
    }

    /// The next message only if the client already holds one, without
    /// waiting for the server. A brain uses it to gather what has arrived
    /// into one group commit; `None` means nothing is buffered right now.
    pub async fn next_ready(&mut self) -> Option<Result<Delivery<T>>> {
        loop {
            // Polling the stream once is cancel-safe: a message is either
            // taken whole or left in the buffer. Unconstrained: tokio's
            // cooperative budget (128 operations a task turn) would say
            // "not ready" with messages buffered, and cut every batch a
            // caller gathers with this at about 128 however many wait.
            let raw = tokio::task::unconstrained(self.messages.next()).now_or_never()??;
            if let Some(out) = self.take(raw).await {
                return Some(out);
            }
        }
    }

    /// One item of the pull stream: a delivery, a consumer-level error, or
    /// `None` when it was dead-lettered on the way.
    async fn take<E: fmt::Display>(
        &self,
        raw: std::result::Result<jetstream::Message, E>,
    ) -> Option<Result<Delivery<T>>> {
        match raw {
            Ok(raw) => self.admit(raw).await.transpose(),
            Err(e) => Some(Err(Error::Consume {
                stream: self.shared.agent.stream(),
                consumer: self.spec.name.to_string(),
                reason: e.to_string(),
            })),
        }
    }

    /// Turns a raw message into a delivery, or dead-letters it.
    async fn admit(&self, raw: jetstream::Message) -> Result<Option<Delivery<T>>> {
        let (stream_sequence, consumer_sequence, delivered) = match raw.info() {
            Ok(info) => (
                info.stream_sequence,
                info.consumer_sequence,
                u64::try_from(info.delivered).unwrap_or(0),
            ),
            Err(e) => {
                // Not a JetStream message at all; nothing to ack.
                tracing::warn!(subject = %raw.subject, "ignoring a message without JetStream metadata: {e}");
                return Ok(None);
            }
        };
        let ctx = Ctx {
            shared: self.shared.clone(),
            stream_sequence,
            consumer_sequence,
            delivered,
        };
        let agent = &self.shared.agent;
        let max_deliver = self.shared.max_deliver;
        let rejection = if delivered > max_deliver {
            Some(Rejection {
                cause: DeadLetterCause::MaxDeliveries,
                reason: format!(
                    "delivered {} times without an outcome: the handler crashed or outran the ack wait each time",
                    delivered - 1
                ),
            })
        } else {
            None
        };
        let kind = SubjectKind::of(agent, &raw.subject);
        let decoded = match (rejection, kind) {
            (Some(r), _) => Err(r),
            (None, None) => Err(Rejection {
                cause: DeadLetterCause::UnknownSubject,
                reason: format!(
                    "`{}` is not a subject of a known kind for agent {agent}",
                    raw.subject
                ),
            }),
            (None, Some(kind)) => T::decode(kind, &raw.payload).and_then(|m| {
                let named = &m.envelope().agent;
                if named == agent.as_str() {
                    Ok((kind, m))
                } else {
                    Err(Rejection {
                        cause: DeadLetterCause::Invalid,
                        reason: format!(
                            "envelope.agent is `{named}` but the message is in {agent}'s stream"
                        ),
                    })
                }
            }),
        };
        match decoded {
            Ok((kind, message)) => {
                let env = message.envelope();
                let span = tracing::info_span!(
                    "bus.delivery",
                    agent = %agent,
                    consumer = self.spec.name,
                    subject = %raw.subject,
                    seq = stream_sequence,
                    delivered,
                    message_id = %env.message_id,
                    work_item = %env.work_item_id,
                );
                adopt_parent(&span, raw.headers.as_ref());
                Ok(Some(Delivery {
                    message,
                    kind,
                    span,
                    raw,
                    ctx,
                }))
            }
            Err(rejection) => {
                // Boxed: the rare path should not grow every `next` future.
                Box::pin(ctx.dead_letter(&raw, rejection.cause, &rejection.reason)).await?;
                Ok(None)
            }
        }
    }
}

/// What a delivery needs to settle itself, apart from the raw message.
struct Ctx {
    shared: Arc<Shared>,
    stream_sequence: u64,
    consumer_sequence: u64,
    delivered: u64,
}

impl Ctx {
    fn ack_err(&self, kind: &'static str, e: &dyn fmt::Display) -> Error {
        Error::Ack {
            kind,
            sequence: self.stream_sequence,
            reason: e.to_string(),
        }
    }

    /// Records the message on the dead-letter subject, then terminates it.
    /// If the record cannot be stored the message is nak'd instead, so it is
    /// never dropped without a trace.
    async fn dead_letter(
        &self,
        raw: &jetstream::Message,
        cause: DeadLetterCause,
        reason: &str,
    ) -> Result<()> {
        tracing::warn!(
            agent = %self.shared.agent,
            consumer = self.shared.consumer,
            subject = %raw.subject,
            seq = self.stream_sequence,
            ?cause,
            "dead-lettering: {reason}"
        );
        let original_headers: HashMap<String, String> = raw
            .headers
            .iter()
            .flat_map(|h| h.iter())
            .map(|(k, v)| {
                let joined: Vec<&str> = v.iter().map(|x| x.as_str()).collect();
                (k.to_string(), joined.join(", "))
            })
            .collect();
        let record = DeadLetter {
            envelope: Some(Envelope {
                agent: self.shared.agent.to_string(),
                actor: Some(Actor {
                    kind: ActorKind::Service as i32,
                    id: format!("consumer:{}", self.shared.consumer),
                }),
                causation_id: original_headers
                    .get("Nats-Msg-Id")
                    .cloned()
                    .unwrap_or_default(),
                // One record per consumer and message, however often this
                // runs (a crash between publish and term repeats it).
                message_id: format!(
                    "deadletter:{}:{}",
                    self.shared.consumer, self.stream_sequence
                ),
                ..Default::default()
            }),
            original_subject: raw.subject.to_string(),
            original_stream_sequence: self.stream_sequence,
            consumer: self.shared.consumer.to_string(),
            cause: cause as i32,
            reason: reason.to_string(),
            deliveries: self.delivered,
            original_payload: raw.payload.to_vec(),
            original_headers,
            dead_lettered_at: Some(std::time::SystemTime::now().into()),
        };
        match self.shared.bus.publish(record).await {
            Ok(_) => raw
                .ack_with(AckKind::Term)
                .await
                .map_err(|e| self.ack_err("term", &e)),
            Err(e) => {
                let delay = self.shared.bus.config().consumers.retry_backoff;
                let _ = raw.ack_with(AckKind::Nak(Some(delay))).await;
                Err(e)
            }
        }
    }

    /// The nak delay after this delivery failed: the consumer's backoff,
    /// one step further with every delivery.
    fn backoff(&self) -> Duration {
        let retries = u32::try_from(self.delivered.saturating_sub(1)).unwrap_or(u32::MAX);
        self.shared.bus.config().consumers.backoff().delay(retries)
    }
}

/// One message handed to a consumer: decoded, validated, and still to be
/// settled. Dropping it unsettled leaves it to be redelivered after the ack
/// wait, which is what a crash does too.
pub struct Delivery<T> {
    message: T,
    kind: SubjectKind,
    span: tracing::Span,
    raw: jetstream::Message,
    ctx: Ctx,
}

impl<T> fmt::Debug for Delivery<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("subject", &self.raw.subject)
            .field("stream_sequence", &self.ctx.stream_sequence)
            .field("delivered", &self.ctx.delivered)
            .finish_non_exhaustive()
    }
}

impl<T: Decode> Delivery<T> {
    /// The decoded message.
    pub fn message(&self) -> &T {
        &self.message
    }

    /// Its envelope.
    pub fn envelope(&self) -> &Envelope {
        self.message.envelope()
    }

    /// The decoded message, and the delivery without it to acknowledge it
    /// by later: for a consumer that hands messages on (a brain applying a
    /// batch on another thread) and acks them once that is durable, without
    /// copying them.
    pub fn into_parts(self) -> (T, Delivery<()>) {
        let Self {
            message,
            kind,
            span,
            raw,
            ctx,
        } = self;
        (
            message,
            Delivery {
                message: (),
                kind,
                span,
                raw,
                ctx,
            },
        )
    }
}

impl<T> Delivery<T> {
    /// Its subject kind.
    pub fn kind(&self) -> SubjectKind {
        self.kind
    }

    /// Its subject.
    pub fn subject(&self) -> &str {
        &self.raw.subject
    }

    /// Its sequence in the agent's stream: what a brain records as applied.
    pub fn stream_sequence(&self) -> u64 {
        self.ctx.stream_sequence
    }

    /// Its place among every delivery this consumer has made, redeliveries
    /// included. One more than the previous delivery's means nothing was
    /// delivered in between that this process did not see.
    pub fn consumer_sequence(&self) -> u64 {
        self.ctx.consumer_sequence
    }

    /// How many times it has been delivered to this consumer, this time
    /// included.
    pub fn delivered(&self) -> u64 {
        self.ctx.delivered
    }

    /// The span to handle it in; its parent is the publisher's trace.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Acknowledges it: done, never to be delivered again. Call only once its
    /// effect is durable.
    pub async fn ack(&self) -> Result<()> {
        self.raw
            .ack()
            .await
            .map_err(|e| self.ctx.ack_err("ack", &e))
    }

    /// Acknowledges every delivery of `batch`, all handled and their
    /// effects durable. On a consumer that acks in order (`AckAll`, the
    /// brain's) one ack, for the delivery furthest in the stream, settles
    /// them all, so the caller must have handled every message before it
    /// in the stream, not only those in `batch`; elsewhere one ack each.
    /// Returns the failures, with the stream sequence each was for.
    pub async fn ack_batch(batch: &[Self]) -> Vec<(u64, Error)> {
        let in_order = batch.first().is_some_and(|d| d.ctx.shared.acks_all);
        let mut failed = Vec::new();
        if in_order {
            if let Some(last) = batch.iter().max_by_key(|d| d.ctx.stream_sequence)
                && let Err(e) = last.ack().await
            {
                failed.push((last.ctx.stream_sequence, e));
            }
            return failed;
        }
        for d in batch {
            if let Err(e) = d.ack().await {
                failed.push((d.ctx.stream_sequence, e));
            }
        }
        failed
    }

    /// Acknowledges it and waits for the server to confirm, for effects that
    /// must not be repeated even if the ack were lost.
    pub async fn ack_confirmed(&self) -> Result<()> {
        self.raw
            .double_ack()
            .await
            .map_err(|e| self.ctx.ack_err("ack", &e))
    }

    /// Asks for redelivery after `delay` (at once when `None`).
    pub async fn nak(&self, delay: Option<Duration>) -> Result<()> {
        self.raw
            .ack_with(AckKind::Nak(delay))
            .await
            .map_err(|e| self.ctx.ack_err("nak", &e))
    }

    /// The consumer's ack wait, as the server has it: how long this
    /// message may go without an ack or a progress ack before it is
    /// redelivered.
    pub fn ack_wait(&self) -> Duration {
        self.ctx.shared.ack_wait
    }

    /// Tells the server work is still going on, resetting the ack wait.
    pub async fn progress(&self) -> Result<()> {
        self.raw
            .ack_with(AckKind::Progress)
            .await
            .map_err(|e| self.ctx.ack_err("progress", &e))
    }

    /// Runs `work` (the handling of this message) while sending progress
    /// acks every third of the ack wait, so a long command or model call is
    /// not redelivered to another instance while it is still running.
    pub async fn keep_alive<F: Future>(&self, work: F) -> F::Output {
        let every = (self.ctx.shared.ack_wait / 3).max(MIN_PROGRESS_INTERVAL);
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                _ = ticks.tick() => {
                    if let Err(e) = self.progress().await {
                        tracing::warn!("progress ack failed: {e}");
                    }
                }
            }
        }
    }

    /// Settles it by the handler's outcome: ack on success; on failure, nak
    /// with backoff if the error is retryable and deliveries remain, else
    /// dead-letter with the error as the reason.
    pub async fn settle(&self, outcome: std::result::Result<(), Unhandled>) -> Result<Settled> {
        let err = match outcome {
            Ok(()) => {
                self.ack().await?;
                return Ok(Settled::Acked);
            }
            Err(err) => err,
        };
        let last = self.ctx.delivered >= self.ctx.shared.max_deliver;
        match err.disposition() {
            Disposition::Retry(_) if last => {
                self.ctx
                    .dead_letter(
                        &self.raw,
                        DeadLetterCause::MaxDeliveries,
                        &format!(
                            "failed on all {} deliveries; last error: {err}",
                            self.ctx.delivered
                        ),
                    )
                    .await?;
                Ok(Settled::DeadLettered)
            }
            Disposition::Retry(delay) => {
                let delay = delay.unwrap_or_else(|| self.ctx.backoff());
                tracing::info!(parent: &self.span, ?delay, "retrying after error: {err}");
                self.nak(Some(delay)).await?;
                Ok(Settled::Retrying(delay))
            }
            Disposition::DeadLetter => {
                self.ctx
                    .dead_letter(&self.raw, DeadLetterCause::Rejected, &err.to_string())
                    .await?;
                Ok(Settled::DeadLettered)
            }
        }
    }
}
