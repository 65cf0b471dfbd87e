//! The brain as an event-sourced reactor (design §4): a deterministic
//! function of its agent's stream, `(state, message) → (state', outputs)`.
//!
//! [`run`] consumes the brain's inputs (`nisse.<agent>.in.>`) on its
//! durable consumer; its own outputs are under `out.`, so it never reads
//! them back. Messages that have arrived are applied together in one
//! transaction (a group commit) with the applied sequence; then, on a
//! task of its own while the next batch is applied, the write-ahead log is
//! fsynced (once for every batch committed since the last fsync), the
//! outputs the batch queued in the outbox are published with their
//! deterministic ids, and only then is the batch acked (one ack, for its
//! last message: the consumer acks in order). A crash
//! anywhere in that order loses nothing and applies nothing twice:
//! un-acked messages come back and are recognised by their sequence (a
//! power failure can take back commits not yet fsynced, whose messages
//! were not acked and whose outputs were not sent: they are applied
//! again, to the same outputs); unpublished outputs are still in the
//! outbox. An output leaves the
//! outbox once JetStream acknowledged it; after a crash, the outbox is
//! compared with what the stream holds before anything is published again.
//!
//! The store's applied sequence, not the consumer's ack floor, is the
//! position. After a crash the server may hand out new messages before it
//! redelivers older un-acked ones. Deliveries whose consumer sequences
//! follow one another without a gap, each a first delivery, are the
//! inputs in stream order; any other delivery ahead of the position (the
//! first after a start, one after a delivery this process never saw, a
//! redelivery, the first delivery after a redelivery) is preceded by
//! reading the gap straight from the stream,
//! so the brain always applies its inputs in stream order. [`rebuild`] is
//! the same application over the stream read from its start into an empty
//! store.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use nisse_bus::{
    AgentName, AnyMessage, Backoff, Bus, ConsumerSpec, Decode as _, Delivery, Direction, Persist,
};

use nisse_bus::signing::SigningKey;

use crate::store::{Applied, Outgoing, Store, StoreError, Timing, Txn, WalSync};

/// The brains as a service: each served agent's brain on its stream.
pub const SERVICE: nisse_bus::service::Service = nisse_bus::service::Service {
    name: ConsumerSpec::BRAIN.name,
    about: "the agents' brains: each agent's stream becomes its work items and log",
};

/// An agent's brain: what each message of its stream does to its state.
pub trait Brain: Send + 'static {
    /// Applies one message. It must be a function of the message and the
    /// store only — time comes from [`Txn::at`], ids from the message — so
    /// that a rebuild from the stream reaches the same state. Messages it
    /// has nothing to do with are simply ignored.
    fn apply(&mut self, txn: &mut Txn<'_, '_>, message: &AnyMessage) -> Result<(), StoreError>;

    /// A message [`Brain::apply`] failed on, whose effects were rolled back
    /// and which is recorded as unapplied with `reason`: what the brain
    /// says about it (the CLI waits for an answer to its command). Nothing
    /// by default.
    fn refused(
        &mut self,
        _txn: &mut Txn<'_, '_>,
        _message: &AnyMessage,
        _reason: &str,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// The brain's timing (switch grace, request deadlines), set on its
    /// store before anything is applied, live and in a rebuild alike.
    fn timing(&self) -> Timing {
        Timing::default()
    }
}

/// Tells the brain's own stream that it started (`in.started`), before it
/// takes anything: applying that resumes its waiting points (a pending
/// question is asked again). Its id is the store's and the applied
/// position's, so a brain that restarts without having applied anything
/// in between says it once.
async fn announce_start(
    bus: &Bus,
    agent: &AgentName,
    store_id: String,
    applied: u64,
) -> Result<(), ReactorError> {
    let started = nisse_bus::proto::BrainStarted {
        envelope: Some(nisse_bus::proto::Envelope {
            agent: agent.to_string(),
            actor: Some(nisse_bus::proto::Actor {
                kind: nisse_bus::proto::ActorKind::Agent as i32,
                id: agent.to_string(),
            }),
            message_id: format!("started:{store_id}:{applied}"),
            ..Default::default()
        }),
        store_id,
        applied_sequence: applied,
    };
    bus.publish(started).await?;
    Ok(())
}

/// Why a brain stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReactorError {
    /// The state store refused to open or failed for good.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The bus failed in a way the brain cannot wait out.
    #[error(transparent)]
    Bus(#[from] nisse_bus::Error),
    /// A blocking store task died.
    #[error("the state store task failed: {0}")]
    Task(String),
    /// `rebuild` was pointed at a store that already holds state.
    #[error("{0}")]
    NotEmpty(String),
    /// The stream no longer holds what the brain applied: it went back in
    /// time. Starting would skip new messages; the state must be rebuilt
    /// from the stream as it is (or the matching stream restored).
    #[error(
        "the {agent} brain will not start: its stream went back in time ({what}). The JetStream store was restored from an older copy or lost messages it had acknowledged (a power failure with a server that does not fsync every message); new messages would reuse sequences this brain takes for applied and be skipped. Rebuild its state from the stream as it is now: `nisse replay --agent {agent} --rebuild <empty dir>`, then put `<empty dir>/agents/{agent}/state.sqlite3` in place of {} (keep the old file); or restore the JetStream store that belongs with this state",
        .store.display()
    )]
    StreamWentBack {
        /// The agent.
        agent: String,
        /// What was found.
        what: String,
        /// The brain's state store.
        store: std::path::PathBuf,
    },
}

/// The most messages applied in one transaction: what one pull of the
/// brain's consumer brings (its consumer may hold four such batches
/// un-acked, so the next batch arrives while one is made durable).
const MAX_BATCH: usize = (nisse_bus::BRAIN_MAX_ACK_PENDING / 4) as usize;

/// One message of the stream, as the brain takes it.
#[allow(
    clippy::large_enum_variant,
    reason = "almost every item is an input; boxing would allocate per message"
)]
enum Item {
    /// An input (`in.>`): applied, at its place, with its id and time.
    Input {
        sequence: u64,
        subject: String,
        message_id: String,
        at: OffsetDateTime,
        message: AnyMessage,
    },
    /// Addressed to the brain but unreadable (no known kind, not its
    /// type): the position moves past it, nothing is applied.
    Unreadable { sequence: u64 },
    /// Not an input (the brain's own outputs, what services publish
    /// aside), read back from the stream: an output of the brain's leaves
    /// the outbox; the position does not move.
    Other { message_id: String },
}

impl Item {
    fn new(sequence: u64, subject: String, message: AnyMessage) -> Self {
        let env = message.envelope();
        if message.kind().direction() != Direction::In {
            return Self::Other {
                message_id: env.message_id.clone(),
            };
        }
        // The envelope's time, which travels in the stored payload: a live
        // brain and a rebuild see the same one.
        let at = env
            .created_at
            .as_ref()
            .and_then(|t| {
                OffsetDateTime::from_unix_timestamp_nanos(
                    i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos),
                )
                .ok()
            })
            .unwrap_or(OffsetDateTime::UNIX_EPOCH);
        Self::Input {
            sequence,
            subject,
            message_id: env.message_id.clone(),
            at,
            message,
        }
    }
}

/// Applies `items` in one transaction and commits it. Returns the new
/// applied sequence and the messages the batch emitted.
///
/// The messages go into the transaction without a savepoint each, the
/// cheaper way; when one fails, that attempt is rolled back and the batch
/// applied again with a savepoint per message, which records the failed
/// one as unapplied and goes on.
fn apply_batch<B: Brain>(
    store: &mut Store,
    brain: &mut B,
    items: &[Item],
) -> Result<(u64, Vec<Outgoing>), StoreError> {
    let began = std::time::Instant::now();
    let (applied, emitted, committing) = match apply_items(store, brain, items, false) {
        Err(StoreError::NeedsSavepoints { sequence, reason }) => {
            tracing::debug!(
                seq = sequence,
                "a message failed in a batch without savepoints; applying the batch again with them: {reason}"
            );
            apply_items(store, brain, items, true)?
        }
        other => other?,
    };
    // Where a batch's time goes (applying its messages, then the
    // commit), for finding what limits a brain's rate; debug, so it costs
    // a level check otherwise.
    tracing::debug!(
        messages = items.len(),
        outputs = emitted.len(),
        apply_us = u64::try_from((began.elapsed() - committing).as_micros()).unwrap_or(u64::MAX),
        commit_us = u64::try_from(committing.as_micros()).unwrap_or(u64::MAX),
        "batch committed"
    );
    Ok((applied, emitted))
}

/// One attempt of [`apply_batch`], with or without a savepoint per
/// message; also returns how long its commit took.
fn apply_items<B: Brain>(
    store: &mut Store,
    brain: &mut B,
    items: &[Item],
    savepoints: bool,
) -> Result<(u64, Vec<Outgoing>, std::time::Duration), StoreError> {
    let mut batch = if savepoints {
        store.batch()?
    } else {
        store.batch_without_savepoints()?
    };
    for item in items {
        match item {
            Item::Input {
                sequence,
                subject,
                message_id,
                at,
                message,
            } => {
                let outcome = batch.apply(*sequence, subject, message_id, *at, |txn| {
                    brain.apply(txn, message)
                })?;
                if let Applied::Refused(reason) = outcome {
                    tracing::error!(
                        seq = sequence,
                        %message_id,
                        "the brain could not apply a message (recorded as unapplied): {reason}"
                    );
                    batch.after_refusal(*sequence, subject, message_id, *at, |txn| {
                        brain.refused(txn, message, &reason)
                    })?;
                }
            }
            Item::Unreadable { sequence } => batch.skip(*sequence),
            Item::Other { message_id } => batch.stored(message_id)?,
        }
    }
    let applied = batch.applied();
    let committing = std::time::Instant::now();
    let emitted = batch.commit()?;
    Ok((applied, emitted, committing.elapsed()))
}

/// Runs blocking store work off the async threads, handing the store and
/// brain back afterwards.
async fn blocking<B: Brain, T: Send + 'static>(
    store: Store,
    brain: B,
    f: impl FnOnce(&mut Store, &mut B) -> T + Send + 'static,
) -> Result<(Store, B, T), ReactorError> {
    tokio::task::spawn_blocking(move || {
        let (mut store, mut brain) = (store, brain);
        let out = f(&mut store, &mut brain);
        (store, brain, out)
    })
    .await
    .map_err(|e| ReactorError::Task(e.to_string()))
}

/// Publishes `outgoing` in order: every message is handed to the
/// connection first, then the acks are awaited, so a batch's outputs cost
/// one round trip and keep their order in the stream. Returns the ids
/// JetStream confirmed; from the first failure on, the rest stay in the
/// outbox for the next try.
async fn publish_in_order(bus: &Bus, outgoing: Vec<Outgoing>) -> Vec<String> {
    let mut pending = Vec::with_capacity(outgoing.len());
    for out in outgoing {
        let decoded = AnyMessage::kind_of_type(&out.type_name)
            .ok_or_else(|| format!("unknown type `{}`", out.type_name))
            .and_then(|kind| AnyMessage::decode(kind, &out.payload).map_err(|r| r.reason));
        let message = match decoded {
            Ok(m) => m,
            Err(reason) => {
                // Written by this build's brain, so this is a bug; keep it
                // in the outbox for a later build rather than drop it.
                tracing::error!(message_id = %out.message_id, "an output cannot be sent ({reason}); it stays in the outbox");
                continue;
            }
        };
        match message.send(bus).await {
            Ok(p) => pending.push((out.message_id, p)),
            Err(e) => {
                tracing::warn!(message_id = %out.message_id, "could not publish an output yet (kept in the outbox): {e}");
                break;
            }
        }
    }
    let mut confirmed = Vec::with_capacity(pending.len());
    for (id, p) in pending {
        match p.acked().await {
            Ok(_) => confirmed.push(id),
            Err(e) => {
                tracing::warn!(message_id = %id, "an output was not confirmed (kept in the outbox): {e}");
                break;
            }
        }
    }
    confirmed
}

/// Outputs JetStream has acknowledged that may still be in the outbox
/// (the store drops them on the next retry tick, reported through
/// `confirmed`).
struct InFlight {
    ids: std::collections::HashSet<String>,
    confirmed: tokio::sync::mpsc::UnboundedSender<Vec<String>>,
}

impl InFlight {
    fn add(&mut self, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        self.ids.extend(ids.iter().cloned());
        // The brain's loop is gone only at the end, when nothing matters.
        let _ = self.confirmed.send(ids);
    }

    /// Publishes what the outbox holds beyond what is acknowledged already:
    /// outputs of an earlier run, or whose publish failed.
    async fn retry(&mut self, bus: &Bus, waiting: Vec<Outgoing>) {
        let ids: std::collections::HashSet<&str> =
            waiting.iter().map(|o| o.message_id.as_str()).collect();
        self.ids.retain(|id| ids.contains(id.as_str()));
        let unsent: Vec<Outgoing> = waiting
            .into_iter()
            .filter(|o| !self.ids.contains(&o.message_id))
            .collect();
        if !unsent.is_empty() {
            let sent = publish_in_order(bus, unsent).await;
            self.add(sent);
        }
    }
}

/// Work for the publisher task, in the order the brain committed it.
enum Publish {
    /// A committed batch: publish its outputs, then ack its messages.
    Batch {
        outgoing: Vec<Outgoing>,
        deliveries: Vec<Delivery<()>>,
        /// The applied sequence after it.
        applied: u64,
    },
    /// The outbox as it stood: publish what is not acknowledged already.
    Retry(Vec<Outgoing>),
}

/// Makes committed batches durable, then publishes their outputs and acks
/// their messages, on its own task, so the brain applies the next batch
/// meanwhile. One task, one queue: the outputs reach the stream in commit
/// order. The ids JetStream acknowledged come back on `acknowledged`, for
/// the store to drop from the outbox.
struct Publisher {
    queue: tokio::sync::mpsc::Sender<Publish>,
    /// `None` once [`Publisher::send`] found it stopped and took its error.
    task: Option<tokio::task::JoinHandle<Result<(), ReactorError>>>,
}

impl Publisher {
    /// Starts the task. Nothing a commit caused leaves the process before
    /// `wal` made it durable: every wake-up first syncs every batch
    /// committed so far (one fsync however many batches queued meanwhile,
    /// so the fsyncs group as the load grows), then sets `committed` to
    /// the applied sequence now durable.
    fn spawn(
        bus: Bus,
        agent: AgentName,
        wal: Arc<WalSync>,
        committed: tokio::sync::watch::Sender<u64>,
    ) -> (Self, tokio::sync::mpsc::UnboundedReceiver<Vec<String>>) {
        // A short queue: a brain far ahead of its publishing waits for it.
        let (queue, mut rx) = tokio::sync::mpsc::channel::<Publish>(4);
        let (confirmed, acknowledged) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut in_flight = InFlight {
                ids: Default::default(),
                confirmed,
            };
            let mut works = Vec::new();
            while let Some(work) = rx.recv().await {
                works.push(work);
                while let Ok(more) = rx.try_recv() {
                    works.push(more);
                }
                let wal = wal.clone();
                tokio::task::spawn_blocking(move || wal.sync())
                    .await
                    .map_err(|e| ReactorError::Task(e.to_string()))??;
                let durable = works
                    .iter()
                    .filter_map(|w| match w {
                        Publish::Batch { applied, .. } => Some(*applied),
                        Publish::Retry(_) => None,
                    })
                    .max();
                if let Some(applied) = durable {
                    committed.send_replace(applied);
                }
                for work in works.drain(..) {
                    match work {
                        Publish::Batch {
                            outgoing,
                            deliveries,
                            ..
                        } => {
                            if !outgoing.is_empty() {
                                let sent = publish_in_order(&bus, outgoing).await;
                                in_flight.add(sent);
                            }
                            // One ack for the whole batch: the brain
                            // has applied every input up to its last.
                            for (seq, e) in Delivery::ack_batch(&deliveries).await {
                                // Committed: a redelivery is recognised as
                                // such.
                                tracing::warn!(%agent, seq, "ack failed: {e}");
                            }
                        }
                        Publish::Retry(waiting) => in_flight.retry(&bus, waiting).await,
                    }
                }
            }
            Ok(())
        });
        (
            Self {
                queue,
                task: Some(task),
            },
            acknowledged,
        )
    }

    /// Queues `work`; when the task has stopped (its fsync failed), why.
    async fn send(&mut self, work: Publish) -> Result<(), ReactorError> {
        if self.queue.send(work).await.is_ok() {
            return Ok(());
        }
        Err(Self::ended(self.task.take()).await)
    }

    /// Publishes and acks everything queued, then ends the task.
    async fn finish(self) -> Result<(), ReactorError> {
        drop(self.queue);
        match self.task {
            Some(task) => task.await.map_err(|e| ReactorError::Task(e.to_string()))?,
            None => Ok(()),
        }
    }

    /// Why the task ended.
    async fn ended(
        task: Option<tokio::task::JoinHandle<Result<(), ReactorError>>>,
    ) -> ReactorError {
        match task {
            Some(task) => match task.await {
                Ok(Err(e)) => e,
                Ok(Ok(())) => ReactorError::Task("the publisher task ended".into()),
                Err(e) => ReactorError::Task(e.to_string()),
            },
            None => ReactorError::Task("the publisher task ended".into()),
        }
    }
}

/// Every acknowledged id reported so far.
fn drain(acknowledged: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<String>>) -> Vec<String> {
    let mut ids = Vec::new();
    while let Ok(more) = acknowledged.try_recv() {
        ids.extend(more);
    }
    ids
}

/// Drops from the outbox whatever a crash left there although the stream
/// holds it: a batch's outputs are stored after the message that caused
/// them, so the stream is read from the oldest such cause on. Without
/// this, a restart later than the duplicate window would store them twice.
async fn reconcile_outbox(
    bus: &Bus,
    agent: &AgentName,
    store: &mut Store,
) -> Result<(), ReactorError> {
    let Some(oldest) = store.oldest_unsent_cause()? else {
        return Ok(());
    };
    let waiting: std::collections::HashSet<String> =
        store.outbox()?.into_iter().map(|o| o.message_id).collect();
    let mut stored = Vec::new();
    let mut reader = bus.read_range(agent, oldest + 1, None).await?;
    while let Some(message) = reader.next().await {
        let message = message?;
        if let Some(id) = message.header("Nats-Msg-Id")
            && waiting.contains(id)
        {
            stored.push(id.to_string());
        }
    }
    if !stored.is_empty() {
        tracing::info!(%agent, outputs = stored.len(), "outputs of the last run were stored before it stopped; they are not sent again");
    }
    store.forget_sent(&stored)?;
    Ok(())
}

/// Refuses to start a brain whose stream went back in time: its last
/// sequence is below the store's applied one, or the message at the
/// applied sequence is not the one the brain applied there (a JetStream
/// store restored from an older copy, or acknowledged messages lost on a
/// power failure). Otherwise new messages would reuse sequences the brain
/// takes for applied, and be skipped as redeliveries.
async fn check_position(
    bus: &Bus,
    agent: &AgentName,
    (applied, applied_id): (u64, String),
    store: std::path::PathBuf,
) -> Result<(), ReactorError> {
    if applied == 0 {
        return Ok(());
    }
    let bounds = bus.stream_bounds(agent).await?;
    let went_back = |what: String| ReactorError::StreamWentBack {
        agent: agent.to_string(),
        what,
        store: store.clone(),
    };
    if bounds.last < applied {
        return Err(went_back(format!(
            "its last sequence is {}, but the brain has applied up to {applied}",
            bounds.last
        )));
    }
    if applied_id.is_empty() || applied < bounds.first {
        // Nothing to compare: a message the brain could not read, or
        // history aged out past the position.
        return Ok(());
    }
    match bus.message_id_at(agent, applied).await? {
        Some(id) if id != applied_id => Err(went_back(format!(
            "sequence {applied} holds `{id}`, but the brain applied `{applied_id}` there"
        ))),
        _ => Ok(()),
    }
}

/// Runs `brain` on `agent`'s stream with the store at `store_path` until
/// `shutdown`; the batch in hand is finished first. `committed` is set to
/// the applied sequence once a commit is durable (for status and for
/// measuring end-to-end latency); nobody needs to be listening.
pub async fn run<B: Brain>(
    bus: Bus,
    agent: AgentName,
    store_path: std::path::PathBuf,
    brain: B,
    signer: SigningKey,
    shutdown: CancellationToken,
    committed: tokio::sync::watch::Sender<u64>,
) -> Result<(), ReactorError> {
    let agent_name = agent.to_string();
    let path = store_path.clone();
    let mut store = tokio::task::spawn_blocking(move || Store::open(&path, &agent_name))
        .await
        .map_err(|e| ReactorError::Task(e.to_string()))??;
    store.set_signer(signer);
    store.set_timing(brain.timing());
    let wal = store.defer_fsync()?;
    let mut brain = brain;
    check_position(
        &bus,
        &agent,
        store.applied_position()?,
        store.path().to_path_buf(),
    )
    .await?;
    let mut applied = store.applied_sequence()?;
    committed.send_replace(applied);
    tracing::info!(%agent, store = %store_path.display(), applied, "brain starting");
    // One brain per agent: a second one stands by here until this one's
    // lease lapses, instead of splitting the stream with it.
    let holder = store.holder_id()?;
    let Some(mut lease) = bus
        .acquire_lease(&nisse_bus::kv_key(&agent, &["brain"]), &holder, &shutdown)
        .await?
    else {
        return Ok(());
    };
    let mut renew = tokio::time::interval_at(
        tokio::time::Instant::now() + lease.renew_every(),
        lease.renew_every(),
    );
    reconcile_outbox(&bus, &agent, &mut store).await?;
    let mut status = StatusReporter::new(bus.clone(), agent.clone(), holder);
    (store, brain, _) = catch_up(&bus, &agent, store, brain, &mut lease, &mut status).await?;
    applied = store.applied_sequence()?;
    let sync = wal.clone();
    tokio::task::spawn_blocking(move || sync.sync())
        .await
        .map_err(|e| ReactorError::Task(e.to_string()))??;
    committed.send_replace(applied);
    announce_start(&bus, &agent, store.store_id()?, store.applied_sequence()?).await?;
    let checkpoints = spawn_checkpointer(store.checkpoint_elsewhere()?, shutdown.clone());
    let mut consumer = bus
        .consumer::<AnyMessage>(&agent, ConsumerSpec::BRAIN)
        .await?;
    let mut durable = committed.subscribe();
    let (mut publisher, mut acknowledged) =
        Publisher::spawn(bus.clone(), agent.clone(), wal, committed);
    // The applied sequence before the last commit: the next batch is
    // gathered only once that much is durable (see below).
    let mut before_last = applied;
    // What the outbox holds now (an earlier run's outputs, those the
    // catch-up made) goes out first, so that outputs keep their commit
    // order: an execution request must never reach the stream before the
    // host binding an earlier message made.
    publisher.send(Publish::Retry(store.outbox()?)).await?;
    // Outputs not yet acknowledged (failed publishes) are retried every
    // second, and acknowledged ones no batch has dropped yet leave the
    // outbox.
    let mut retry =
        tokio::time::interval_at(tokio::time::Instant::now() + RETRY_EVERY, RETRY_EVERY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut trouble = Persist::new("take the brain's messages", CONSUMER_BACKOFF);
    // The consumer sequence of the last delivery seen; `None` until the
    // first, before which this process cannot know what was delivered.
    let mut last_delivery: Option<u64> = None;

    loop {
        let first = tokio::select! {
            biased;
            _ = renew.tick() => {
                if !lease.renew().await? {
                    // The server did not answer: again soon, not at the
                    // next third of the lease's time.
                    renew.reset_after(LEASE_RETRY);
                }
                let last = bus.stream_bounds(&agent).await.ok().map(|b| b.last);
                status
                    .report(StatusReporter::position(&store), last, false)
                    .await;
                continue;
            }
            _ = retry.tick() => {
                let sent = drain(&mut acknowledged);
                let (s, b, out) = blocking(store, brain, move |store, _| {
                    store.forget_sent(&sent).and_then(|()| store.outbox())
                })
                .await?;
                (store, brain) = (s, b);
                publisher.send(Publish::Retry(out?)).await?;
                continue;
            }
            d = consumer.next(&shutdown) => d,
        };
        let Some(first) = first else { break };
        let mut deliveries: Vec<Delivery<AnyMessage>> = Vec::new();
        match first {
            Ok(d) => {
                trouble.succeeded();
                deliveries.push(d);
            }
            Err(e) => {
                let why = e.to_string();
                tracing::warn!(%agent, "brain consumer: {why}");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = trouble.failed(&why) => {}
                }
                continue;
            }
        }
        // At most one commit waits for its fsync while the next batch is
        // gathered and applied. These waits only shape batches: they give
        // up after FSYNC_WAIT (a publisher held up publishing must not
        // hold up the lease's renewal), and a publisher that stopped drops
        // the sender, its error surfacing at the next send.
        until_durable(&mut durable, before_last).await;
        gather_ready(&agent, &mut consumer, &mut deliveries).await;
        // Only a full batch (a backlog) goes ahead while the last commit's
        // fsync runs; a smaller one waits for it and takes what arrived
        // meanwhile. Going ahead with small batches made many small
        // commits under moderate load, each writing every page it touched
        // (7% more CPU an alert at one alert a post); under heavy load
        // batches are full and applying overlaps the fsync.
        if deliveries.len() < MAX_BATCH && *durable.borrow() < applied {
            until_durable(&mut durable, applied).await;
            gather_ready(&agent, &mut consumer, &mut deliveries).await;
        }

        // In stream order, already-applied ones left out. A delivery that
        // follows the previous one without a gap, delivered the first
        // time, is the next input; before any other that is ahead, the
        // gap is read from the stream itself.
        let mut items = Vec::with_capacity(deliveries.len());
        let mut next = applied + 1;
        // The messages go to the batch; the rest of each delivery stays,
        // to ack it by.
        let mut handles: Vec<Delivery<()>> = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            let seq = d.stream_sequence();
            // Consecutive first deliveries have nothing undelivered
            // between them (the server hands out new messages in stream
            // order). A redelivery breaks the chain: the first delivery
            // after it may jump over inputs still waiting to be
            // redelivered (an earlier run's, un-acked), which would then
            // come back below the position and be taken for applied.
            let first = d.delivered() == 1;
            let follows = first && last_delivery.is_some_and(|c| d.consumer_sequence() == c + 1);
            last_delivery = first.then(|| d.consumer_sequence());
            if seq < next {
                handles.push(d.into_parts().1);
                continue;
            }
            if seq > next && !follows {
                read_gap(&bus, &agent, next, seq - 1, &mut items).await?;
            }
            let subject = d.subject().to_string();
            let (message, handle) = d.into_parts();
            items.push(Item::new(seq, subject, message));
            handles.push(handle);
            next = seq + 1;
        }
        let deliveries = handles;

        let mut outgoing = Vec::new();
        if !items.is_empty() {
            // Outputs JetStream acknowledged since the last commit leave
            // the outbox in this one: no transaction of their own while
            // messages keep coming (the retry tick does it when idle).
            items.extend(
                drain(&mut acknowledged)
                    .into_iter()
                    .map(|message_id| Item::Other { message_id }),
            );
            let mut attempt = 0u32;
            loop {
                let batch = std::mem::take(&mut items);
                let (s, b, (out, batch, busy)) = blocking(store, brain, move |store, brain| {
                    let out = apply_batch(store, brain, &batch);
                    let busy = out.is_ok().then(|| store.busy_items());
                    (out, batch, busy)
                })
                .await?;
                (store, brain, items) = (s, b, batch);
                match out {
                    Ok((seq, emitted)) => {
                        before_last = applied;
                        applied = seq;
                        outgoing = emitted;
                        if let Some(Ok(busy)) = busy {
                            status.after_batch(applied, busy).await;
                        }
                        break;
                    }
                    Err(e) if e.is_transient() => {
                        let delay = STORE_BACKOFF.delay(attempt);
                        attempt += 1;
                        tracing::warn!(%agent, attempt, ?delay, "state store busy or failing; retrying the batch: {e}");
                        for d in &deliveries {
                            let _ = d.progress().await;
                        }
                        // Not renewed now: the next tick tries again.
                        let _ = lease.renew().await?;
                        tokio::time::sleep(delay).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // Committed: its outputs go out and its messages are acked on the
        // publisher's task while the next batch is applied.
        publisher
            .send(Publish::Batch {
                outgoing,
                deliveries,
                applied,
            })
            .await?;
    }
    // Whatever is still unpublished (an earlier run's outputs not yet
    // retried) goes out before the brain lets go, rather than waiting for
    // its next start.
    publisher.send(Publish::Retry(store.outbox()?)).await?;
    tracing::info!(%agent, applied, "brain stopped");
    // What was committed is published and acked before the lease goes,
    // and what JetStream acknowledged leaves the outbox.
    let finished = publisher.finish().await;
    let sent = drain(&mut acknowledged);
    if let Err(e) = store.forget_sent(&sent) {
        // They are compared with the stream at the next start.
        tracing::warn!(%agent, "could not drop published outputs from the outbox: {e}");
    }
    drop(store);
    let _ = checkpoints.await;
    lease.release().await;
    // The last batches not made durable (a failed fsync) were neither
    // published nor acked: the stream gives them again.
    finished
}

/// Waits until `durable` (the applied sequence made durable) reaches
/// `seq`, for at most [`FSYNC_WAIT`].
async fn until_durable(durable: &mut tokio::sync::watch::Receiver<u64>, seq: u64) {
    let _ = tokio::time::timeout(FSYNC_WAIT, durable.wait_for(|d| *d >= seq)).await;
}

/// Adds the deliveries that have already arrived to `deliveries`, up to
/// [`MAX_BATCH`], without waiting for more.
async fn gather_ready(
    agent: &AgentName,
    consumer: &mut nisse_bus::Consumer<AnyMessage>,
    deliveries: &mut Vec<Delivery<AnyMessage>>,
) {
    while deliveries.len() < MAX_BATCH {
        match consumer.next_ready().await {
            Some(Ok(d)) => deliveries.push(d),
            Some(Err(e)) => {
                tracing::warn!(%agent, "brain consumer: {e}");
                break;
            }
            None => break,
        }
    }
}

/// Waits after a consumer-level failure: short, since the client
/// reconnects by itself.
const CONSUMER_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));

/// Waits before retrying a batch the state store could not commit.
const STORE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));

/// How soon a lease renewal the server did not answer is tried again.
const LEASE_RETRY: Duration = Duration::from_millis(500);

/// The longest the brain waits for an fsync before it gathers a batch
/// anyway (an fsync takes milliseconds; the wait only shapes batches).
const FSYNC_WAIT: Duration = Duration::from_millis(500);

/// How often unconfirmed outputs are retried.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// Checkpoints the WAL every second from its own connection until
/// `shutdown`.
fn spawn_checkpointer(
    checkpointer: crate::Checkpointer,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut checkpointer = Some(checkpointer);
        let mut every = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = every.tick() => {}
            }
            let Some(c) = checkpointer.take() else { break };
            match tokio::task::spawn_blocking(move || {
                let out = c.checkpoint();
                (c, out)
            })
            .await
            {
                Ok((c, out)) => {
                    if let Err(e) = out {
                        tracing::warn!("WAL checkpoint failed (retried in a second): {e}");
                    }
                    checkpointer = Some(c);
                }
                Err(e) => {
                    tracing::error!("the WAL checkpoint task failed: {e}");
                    break;
                }
            }
        }
    })
}

/// Reads sequences `from..=to` from the stream into `items`: the inputs
/// a delivery is ahead of, and the brain's own outputs in between (which
/// leave the outbox). Inputs that do not decode are passed over: the
/// consumer dead-letters those when they are delivered, and a rebuild
/// skips them the same way.
async fn read_gap(
    bus: &Bus,
    agent: &AgentName,
    from: u64,
    to: u64,
    items: &mut Vec<Item>,
) -> Result<(), ReactorError> {
    tracing::debug!(%agent, from, to, "reading a gap ahead of the brain's position from the stream");
    let mut reader = bus.read_range(agent, from, Some(to)).await?;
    while let Some(stored) = reader.next().await {
        items.push(stored_item(agent, &stored?));
    }
    Ok(())
}

/// The next batch of at most [`MAX_BATCH`] stored messages from
/// `reader`, as the brain takes them; empty at the end of the range.
async fn next_batch(
    agent: &AgentName,
    reader: &mut nisse_bus::RangeReader,
) -> Result<Vec<Item>, ReactorError> {
    let mut items = Vec::with_capacity(MAX_BATCH);
    while items.len() < MAX_BATCH {
        match reader.next().await {
            Some(stored) => items.push(stored_item(agent, &stored?)),
            None => break,
        }
    }
    Ok(items)
}

/// Applies everything the stream holds past the store's position, before
/// the brain takes anything from its consumer. The consumer hands out
/// only what no brain acknowledged yet, so without this a standby that
/// takes the lease with a store of its own would sit behind its stream
/// until the next new message arrived. The batches apply exactly as a
/// rebuild's; outputs are not published as they are made: those the
/// stream already holds (its previous holder's) leave the outbox as they
/// are read back, and the rest go out with the outbox's next retry.
/// Returns the applied sequence.
async fn catch_up<B: Brain>(
    bus: &Bus,
    agent: &AgentName,
    mut store: Store,
    mut brain: B,
    lease: &mut nisse_bus::Lease,
    status: &mut StatusReporter,
) -> Result<(Store, B, u64), ReactorError> {
    let from = store.applied_sequence()? + 1;
    let last = bus.stream_bounds(agent).await?.last;
    if from > last {
        return Ok((store, brain, from - 1));
    }
    let began = std::time::Instant::now();
    tracing::info!(%agent, from, last, behind = last + 1 - from, "catching up with the stream before taking new messages");
    status
        .report(StatusReporter::position(&store), Some(last), true)
        .await;
    let (s, b, applied) = apply_range(
        bus,
        agent,
        from,
        Some(last),
        store,
        brain,
        Some(Keep {
            lease,
            status,
            last,
        }),
    )
    .await?;
    (store, brain) = (s, b);
    status
        .report(StatusReporter::position(&store), Some(last), false)
        .await;
    tracing::info!(%agent, applied, last, took_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX), "caught up with the stream");
    Ok((store, brain, applied))
}

/// Writes the brain's status beside its lease ([`nisse_bus::BrainStatus`]):
/// when asked at each renewal and during a catch-up, and after a batch
/// only when the items in the middle of a step changed.
struct StatusReporter {
    bus: Bus,
    agent: AgentName,
    last: nisse_bus::BrainStatus,
}

impl StatusReporter {
    fn new(bus: Bus, agent: AgentName, holder: String) -> Self {
        Self {
            bus,
            agent,
            last: nisse_bus::BrainStatus {
                holder,
                ..Default::default()
            },
        }
    }

    /// Where `store` stands: its applied sequence and the items in the
    /// middle of a step. Read apart from [`StatusReporter::report`], so
    /// that no borrow of the store is held while the write is awaited.
    fn position(store: &Store) -> Option<(u64, Vec<String>)> {
        match store
            .busy_items()
            .and_then(|busy| Ok((store.applied_sequence()?, busy)))
        {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!("reading where the brain stands: {e}");
                None
            }
        }
    }

    /// Says where the brain stands (`position`, from
    /// [`StatusReporter::position`]): `stream_last` when just read, else
    /// the last known; `catching_up` while a catch-up runs.
    async fn report(
        &mut self,
        position: Option<(u64, Vec<String>)>,
        stream_last: Option<u64>,
        catching_up: bool,
    ) {
        if let Some((applied, busy)) = position {
            self.write(applied, busy, stream_last, catching_up).await;
        }
    }

    /// After a committed batch: written only when the busy items changed
    /// (what `nisse idle --wait` waits on).
    async fn after_batch(&mut self, applied: u64, busy: Vec<String>) {
        if busy != self.last.busy {
            self.write(applied, busy, None, false).await;
        } else {
            self.last.applied = applied;
        }
    }

    async fn write(
        &mut self,
        applied: u64,
        busy: Vec<String>,
        stream_last: Option<u64>,
        catching_up: bool,
    ) {
        let status = nisse_bus::BrainStatus {
            holder: self.last.holder.clone(),
            applied,
            stream_last: stream_last.unwrap_or(self.last.stream_last).max(applied),
            catching_up,
            busy,
            at_ms: nisse_bus::now_ms(),
        };
        if let Err(e) = self.bus.put_brain_status(&self.agent, &status).await {
            tracing::warn!(agent = %self.agent, "writing the brain's status: {e}");
        }
        self.last = status;
    }
}

fn stored_item(agent: &AgentName, stored: &nisse_bus::StoredMessage) -> Item {
    match stored.decode() {
        Ok(message) => Item::new(stored.sequence, stored.subject.clone(), message),
        Err(_) if stored.subject.starts_with(&format!("nisse.{agent}.in.")) => Item::Unreadable {
            sequence: stored.sequence,
        },
        Err(_) => Item::Other {
            message_id: stored.header("Nats-Msg-Id").unwrap_or_default().to_string(),
        },
    }
}

/// Rebuilds `agent`'s brain state from its whole stream into a new, empty
/// store at `store_path`, applying every message exactly as the live brain
/// does. Publishes nothing: the outputs are already in the stream. Returns
/// the last applied sequence.
pub async fn rebuild<B: Brain>(
    bus: &Bus,
    agent: &AgentName,
    store_path: &std::path::Path,
    brain: B,
) -> Result<u64, ReactorError> {
    let agent_name = agent.to_string();
    let path = store_path.to_path_buf();
    let store = tokio::task::spawn_blocking(move || Store::open(&path, &agent_name))
        .await
        .map_err(|e| ReactorError::Task(e.to_string()))??;
    if store.applied_sequence()? != 0 || !store.items(None)?.is_empty() {
        return Err(ReactorError::NotEmpty(format!(
            "{} already holds state; rebuild into an empty directory",
            store_path.display()
        )));
    }
    let mut store = store;
    store.set_timing(brain.timing());
    // Made from the stream and published nowhere: a power failure halfway
    // means running it again. Closing the store at the end writes it out.
    store.without_fsync()?;
    let (_, _, applied) = apply_range(bus, agent, 1, None, store, brain, None).await?;
    Ok(applied)
}

/// What a brain holding its lease keeps up while it applies a range: the
/// lease renewed, its status said, the stream's last sequence known.
struct Keep<'a> {
    lease: &'a mut nisse_bus::Lease,
    status: &'a mut StatusReporter,
    last: u64,
}

/// Applies the stream from `from` to `to` (its end, when `None`) in
/// batches, exactly as the live brain applies deliveries, publishing
/// nothing; with `keep`, renewing the lease and saying where it stands
/// between batches (a catch-up; a rebuild has no lease). Returns the
/// applied sequence.
async fn apply_range<B: Brain>(
    bus: &Bus,
    agent: &AgentName,
    from: u64,
    to: Option<u64>,
    mut store: Store,
    mut brain: B,
    mut keep: Option<Keep<'_>>,
) -> Result<(Store, B, u64), ReactorError> {
    let mut reader = bus.read_range(agent, from, to).await?;
    let mut applied = from.saturating_sub(1);
    let mut renew_at = keep
        .as_ref()
        .map(|k| tokio::time::Instant::now() + k.lease.renew_every());
    loop {
        let items = next_batch(agent, &mut reader).await?;
        if items.is_empty() {
            break;
        }
        let (s, b, out) = blocking(store, brain, move |store, brain| {
            apply_batch(store, brain, &items)
        })
        .await?;
        (store, brain) = (s, b);
        applied = out?.0.max(applied);
        if let (Some(k), Some(at)) = (keep.as_mut(), renew_at.as_mut()) {
            k.status
                .report(StatusReporter::position(&store), Some(k.last), true)
                .await;
            if tokio::time::Instant::now() >= *at {
                *at = tokio::time::Instant::now()
                    + if k.lease.renew().await? {
                        k.lease.renew_every()
                    } else {
                        LEASE_RETRY
                    };
            }
        }
    }
    Ok((store, brain, applied))
}

/// What a follower applied in one batch: the stream messages, for a live
/// view of the stream, and the store after them, to read what changed.
#[derive(Debug)]
pub struct Followed<'a> {
    /// The messages, in stream order.
    pub messages: &'a [nisse_bus::StoredMessage],
    /// The follower's store, committed through the last of them.
    pub store: &'a Store,
}

/// Keeps a read model of `agent`'s brain in the store at `store_path`
/// (made when missing): applies the stream from where that store stands,
/// then each message as it is stored, exactly as the live brain and a
/// rebuild do, publishing nothing and holding no lease, and calls `seen`
/// after each batch commits. The brain stays the system of record; this
/// is what a view beside it (the control service) reads, from any
/// machine that reaches the bus, with no access to the brain's own store.
///
/// Runs until the bus fails, which is an error for the caller to retry:
/// the store keeps its position, so a new call goes on from there. A
/// store ahead of its stream (the stream restored from an older copy) is
/// [`ReactorError::StreamWentBack`]: a read model is thrown away and made
/// again from the stream.
pub async fn follow<B: Brain>(
    bus: &Bus,
    agent: &AgentName,
    store_path: &std::path::Path,
    brain: B,
    mut seen: impl FnMut(Followed<'_>) + Send,
) -> Result<(), ReactorError> {
    use futures::FutureExt as _;
    let agent_name = agent.to_string();
    let path = store_path.to_path_buf();
    let mut store = tokio::task::spawn_blocking(move || Store::open(&path, &agent_name))
        .await
        .map_err(|e| ReactorError::Task(e.to_string()))??;
    store.set_timing(brain.timing());
    // A read model: its commits need no fsync of their own. After a power
    // failure it goes on from the position it kept, which never runs ahead
    // of what it applied.
    store.without_fsync()?;
    let from = store.applied_sequence()? + 1;
    let last = bus.stream_bounds(agent).await?.last;
    if from > last + 1 {
        return Err(ReactorError::StreamWentBack {
            agent: agent.to_string(),
            what: format!(
                "the read model applied through sequence {}, the stream ends at {last}",
                from - 1
            ),
            store: store_path.to_path_buf(),
        });
    }
    let mut reader = bus.follow(agent, from).await?;
    let mut brain = brain;
    loop {
        // Wait for one message, then take what else is already here: a
        // batch is what arrived together, never a wait for more.
        let Some(first) = reader.next().await else {
            return Err(ReactorError::Bus(nisse_bus::Error::Read {
                stream: agent.stream(),
                reason: "the stream reader ended".into(),
            }));
        };
        let mut messages = vec![first?];
        while messages.len() < MAX_BATCH {
            // Unconstrained, as the brain's consumer is: tokio's budget
            // would end the batch at about 128 with more arrived.
            match tokio::task::unconstrained(reader.next()).now_or_never() {
                Some(Some(next)) => messages.push(next?),
                _ => break,
            }
        }
        let items: Vec<Item> = messages.iter().map(|m| stored_item(agent, m)).collect();
        let (s, b, out) = blocking(store, brain, move |store, brain| {
            apply_batch(store, brain, &items)
        })
        .await?;
        (store, brain) = (s, b);
        out?;
        seen(Followed {
            messages: &messages,
            store: &store,
        });
    }
}
