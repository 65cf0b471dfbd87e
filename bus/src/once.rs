//! At most once per request id: the engine the executor and the mcp
//! service share for requests whose effect cannot be looked up afterwards
//! (a command run over SSH, a tool called on an MCP server), so a request
//! is either done once or reported as of unknown outcome, never done
//! again blindly (seed Nisse L8).
//!
//! Each request id has a durable record in a key-value bucket, so every
//! process of the service sees the same one:
//!
//! 1. **Read the record.** A finished request is answered from it again
//!    (the same message id, so JetStream drops the answer if the first is
//!    still in its duplicate window). A request started by this very
//!    process waits for that run. One started by another process whose
//!    heartbeat is fresh is retried later; one whose heartbeat has
//!    lapsed belonged to a process that is gone mid-request, and is
//!    answered as of unknown outcome ([`Work::interrupted`]) and recorded
//!    finished with that answer.
//! 2. **The walls** ([`Work::walls`]), each a refusal recorded as the
//!    request's final answer before it is published.
//! 3. **Started** is recorded (created only if no record exists, so of
//!    two processes racing for an id one wins), then the request is
//!    carried out ([`Work::perform`]) with the record's heartbeat kept
//!    and the message's progress acks sent meanwhile.
//! 4. **Finished** is recorded with the answer, retried while the bus is
//!    away (the effect happened: its answer must not be lost), then the
//!    answer is published and the message acked by the caller.
//!
//! What a request is, its walls and how it is carried out are each
//! service's; the ordering above is written once, here.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use prost::Message as _;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::Instrument as _;

use crate::{AgentName, Backoff, Bus, Contract, Decode, Delivery, Persist, Result, Unhandled};
use crate::{Versioned, key_hash};

/// Waits between tries to record an answer while the bus is away.
const RECORD_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

/// Milliseconds since the Unix epoch, now: the clock records and circuits
/// are stamped with.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Where a request id stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// A process took it and may be carrying it out: it is never started
    /// again.
    Started,
    /// Its answer is stored; it is given again, nothing is done.
    #[serde(alias = "done")]
    Finished,
}

/// The durable record of one request id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The request id (the key holds a hash of it).
    pub request_id: String,
    /// Started or finished.
    pub phase: Phase,
    /// Which process of the service took it. Stored as `instance`, the
    /// name the executor's records had before the engine was shared, so
    /// records written then still read.
    #[serde(rename = "instance")]
    pub process: String,
    /// What it acts on, for the operator and the outcome-unknown answer:
    /// a host, or an MCP instance and tool.
    #[serde(default, alias = "host")]
    pub target: String,
    /// Milliseconds since the Unix epoch when it was started (0 for a
    /// request refused before anything started).
    #[serde(default)]
    pub started_ms: u64,
    /// Milliseconds since the Unix epoch when the process last said it is
    /// still carrying it out. A started record whose heartbeat is older
    /// than half the ack wait belongs to a process that is gone.
    pub heartbeat_ms: u64,
    /// The encoded answer, once finished.
    #[serde(default, with = "b64", skip_serializing_if = "Vec::is_empty")]
    pub result: Vec<u8>,
}

/// Bytes as standard base64 in a JSON record.
pub mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize as _, Deserializer, Serializer};

    /// Writes `v` as a base64 string.
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    /// Reads a base64 string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// Where a service keeps its records: a bucket, and the key token between
/// the agent and the request id's hash, if any (`<agent>.<token>.<hash>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    /// The bucket.
    pub bucket: &'static str,
    /// The key token after the agent, if any.
    pub token: Option<&'static str>,
}

impl Ledger {
    /// The key of `request_id`'s record: request ids hold characters keys
    /// may not, so always their hash.
    pub fn key(&self, agent: &AgentName, request_id: &str) -> String {
        match self.token {
            Some(t) => format!("{agent}.{t}.{}", key_hash(request_id)),
            None => format!("{agent}.{}", key_hash(request_id)),
        }
    }

    /// The record of `request_id`, if any, with its revision.
    pub async fn read(
        &self,
        bus: &Bus,
        agent: &AgentName,
        request_id: &str,
    ) -> Result<Option<Versioned<Record>>> {
        bus.kv_read(self.bucket, &self.key(agent, request_id)).await
    }

    /// Writes `record`: created when `revision` is `None` (only if none
    /// exists), else replacing exactly that revision. `Ok(None)` means
    /// someone else wrote first: read again.
    pub async fn write(
        &self,
        bus: &Bus,
        agent: &AgentName,
        record: &Record,
        revision: Option<u64>,
    ) -> Result<Option<u64>> {
        bus.kv_write(
            self.bucket,
            &self.key(agent, &record.request_id),
            record,
            revision,
        )
        .await
    }
}

/// What the walls decided about a request.
#[derive(Debug)]
pub enum Gate<P, A> {
    /// Answer with this; nothing is done.
    Answer(Box<A>),
    /// Carry out this.
    Proceed(P),
}

/// A kind of request a service carries out at most once per request id.
pub trait Work: Send + Sync {
    /// The request, as delivered.
    type Request: Decode + Sync;
    /// The answer published for it.
    type Answer: Contract;
    /// What the walls hand over to [`Work::perform`].
    type Prepared: Send;

    /// The request's id: the idempotency key (empty: nothing to key a
    /// record on, nor to answer to; the request is dropped).
    fn request_id(request: &Self::Request) -> &str;

    /// What the request acts on, kept in its record.
    fn target(request: &Self::Request) -> String;

    /// The walls, in order, before anything is done. An error retries the
    /// message (a store that could not be read); a refusal is an answer.
    fn walls(
        &self,
        request: &Self::Request,
    ) -> impl Future<Output = std::result::Result<Gate<Self::Prepared, Self::Answer>, Unhandled>> + Send;

    /// Carries out a request the walls let through. Every outcome, a
    /// failure too, is an answer.
    fn perform(
        &self,
        request: &Self::Request,
        prepared: Self::Prepared,
    ) -> impl Future<Output = Self::Answer> + Send;

    /// The answer to a request a process that is gone had started: its
    /// outcome is unknown, and it is not done again.
    fn interrupted(&self, request: &Self::Request, record: &Record) -> Self::Answer;

    /// The started record could not be written after the walls let the
    /// request through (the bus is away, or another process took it):
    /// undo what the walls reserved, such as a circuit's trial.
    fn not_started(&self, request: &Self::Request);
}

/// One agent's records of one service, and the requests this process is
/// carrying out.
pub struct Once {
    bus: Bus,
    agent: AgentName,
    ledger: Ledger,
    /// Who carries the requests out, in logs and answers ("the executor").
    who: &'static str,
    /// This process, in the records it starts.
    process: String,
    /// Request ids being carried out in this process, each with a signal
    /// for when it is done (a duplicate delivery waits for it instead of
    /// being redelivered).
    running: Mutex<HashMap<String, watch::Receiver<bool>>>,
}

impl std::fmt::Debug for Once {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Once")
            .field("agent", &self.agent)
            .field("ledger", &self.ledger)
            .field("process", &self.process)
            .finish_non_exhaustive()
    }
}

impl Once {
    /// `agent`'s requests, recorded in `ledger` by `process` (a name
    /// unique to this process, such as the service and a UUID), carried
    /// out by `who`.
    pub fn new(
        bus: Bus,
        agent: AgentName,
        ledger: Ledger,
        who: &'static str,
        process: String,
    ) -> Self {
        Self {
            bus,
            agent,
            ledger,
            who,
            process,
            running: Mutex::new(HashMap::new()),
        }
    }

    /// Answers one delivery: `Ok` once its answer is published.
    pub async fn answer<W: Work>(
        &self,
        work: &W,
        delivery: &Delivery<W::Request>,
    ) -> std::result::Result<(), Unhandled> {
        let request = delivery.message();
        let rid = W::request_id(request);
        if rid.is_empty() {
            tracing::warn!(parent: delivery.span(), "a request to {} without a request id; dropped", self.who);
            return Ok(());
        }
        let mut spins = 0u32;
        loop {
            match self.read(rid).await? {
                Some((record, _)) if record.phase == Phase::Finished => {
                    tracing::info!(parent: delivery.span(), request = %rid, "answered before: the recorded answer is given again");
                    return self.publish_stored::<W::Answer>(&record).await;
                }
                Some((record, revision)) => {
                    if record.process == self.process {
                        // Started by this very process, which is alive:
                        // wait for that run, then answer from its record.
                        let waiting = self.lock_running().get(rid).cloned();
                        match waiting {
                            Some(done) => wait_for(delivery, done).await,
                            // Between its record and its entry in the
                            // map: a moment, never for long.
                            None if spins < 100 => {
                                spins += 1;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            None => {
                                return Err(Unhandled::retry_after(
                                    format!("{rid} is started here but not running"),
                                    delivery.ack_wait(),
                                ));
                            }
                        }
                        continue;
                    }
                    let age = now_ms().saturating_sub(record.heartbeat_ms);
                    if u128::from(age) < delivery.ack_wait().as_millis() / 2 {
                        return Err(Unhandled::retry_after(
                            format!("{rid} is being carried out by {}", record.process),
                            delivery.ack_wait(),
                        ));
                    }
                    // Started by a process that is gone, mid-request.
                    let answer = work.interrupted(request, &record);
                    let finished = Record {
                        phase: Phase::Finished,
                        result: answer.encode_to_vec(),
                        heartbeat_ms: now_ms(),
                        ..record
                    };
                    if self.write(&finished, Some(revision)).await?.is_some() {
                        tracing::warn!(parent: delivery.span(), request = %rid, "outcome unknown: started by a process of {} that is gone", self.who);
                        return self.publish(answer).await;
                    }
                    // Settled by someone else in between: read again.
                    continue;
                }
                None => {}
            }

            // This process claims the id, so two deliveries of it here
            // never both carry it out; another process is kept out by the
            // record.
            let claim = {
                let mut running = self.lock_running();
                match running.get(rid) {
                    Some(done) => Err(done.clone()),
                    None => {
                        let (tx, rx) = watch::channel(false);
                        running.insert(rid.to_string(), rx);
                        Ok(tx)
                    }
                }
            };
            let done_tx = match claim {
                Ok(tx) => tx,
                Err(done) => {
                    wait_for(delivery, done).await;
                    continue;
                }
            };
            let outcome = self
                .claimed(work, delivery)
                .instrument(delivery.span().clone())
                .await;
            self.lock_running().remove(rid);
            let _ = done_tx.send(true);
            match outcome {
                Ok(true) => return Ok(()),
                // Another process recorded it first: answer from its record.
                Ok(false) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Walls, then the work, for a request id this process has claimed.
    /// `Ok(false)` when another process recorded the id first.
    async fn claimed<W: Work>(
        &self,
        work: &W,
        delivery: &Delivery<W::Request>,
    ) -> std::result::Result<bool, Unhandled> {
        let request = delivery.message();
        let rid = W::request_id(request);
        let prepared = match work.walls(request).await? {
            Gate::Answer(answer) => {
                // Refused before anything was done: that is its answer.
                let record = Record {
                    request_id: rid.to_string(),
                    phase: Phase::Finished,
                    process: self.process.clone(),
                    target: W::target(request),
                    started_ms: 0,
                    heartbeat_ms: now_ms(),
                    result: answer.encode_to_vec(),
                };
                return match self.write(&record, None).await? {
                    Some(_) => self.publish(*answer).await.map(|()| true),
                    None => Ok(false),
                };
            }
            Gate::Proceed(p) => p,
        };

        // Started, durably, before anything is done.
        let started = Record {
            request_id: rid.to_string(),
            phase: Phase::Started,
            process: self.process.clone(),
            target: W::target(request),
            started_ms: now_ms(),
            heartbeat_ms: now_ms(),
            result: Vec::new(),
        };
        let revision = match self.write(&started, None).await {
            Ok(Some(r)) => r,
            other => {
                work.not_started(request);
                return other.map(|_| false);
            }
        };
        let answer = delivery
            .keep_alive(self.perform(
                work,
                request,
                prepared,
                started,
                revision,
                delivery.ack_wait(),
            ))
            .await;
        self.publish(answer).await.map(|()| true)
    }

    /// Carries out a prepared request, keeping the record's heartbeat;
    /// records its answer as finished.
    async fn perform<W: Work>(
        &self,
        work: &W,
        request: &W::Request,
        prepared: W::Prepared,
        mut record: Record,
        mut revision: u64,
        ack_wait: Duration,
    ) -> W::Answer {
        let doing = work.perform(request, prepared);
        tokio::pin!(doing);
        let mut heartbeat = tokio::time::interval((ack_wait / 3).max(Duration::from_millis(100)));
        heartbeat.tick().await;
        let answer = loop {
            tokio::select! {
                answer = &mut doing => break answer,
                _ = heartbeat.tick() => {
                    record.heartbeat_ms = now_ms();
                    match self.ledger.write(&self.bus, &self.agent, &record, Some(revision)).await {
                        Ok(Some(r)) => revision = r,
                        Ok(None) => tracing::warn!(request = %record.request_id, "the request's record changed while it was carried out"),
                        Err(e) => tracing::warn!(request = %record.request_id, "heartbeat: {e}"),
                    }
                }
            }
        };
        self.record_finished(record, revision, answer).await
    }

    /// Stores the answer as the request's final one, retrying while the
    /// bus is away (the effect happened: its answer must not be lost). If
    /// the record was settled by someone else meanwhile, theirs stands.
    async fn record_finished<A: Contract>(
        &self,
        record: Record,
        mut revision: u64,
        answer: A,
    ) -> A {
        let finished = Record {
            phase: Phase::Finished,
            heartbeat_ms: now_ms(),
            result: answer.encode_to_vec(),
            ..record
        };
        let ledger = &self.ledger;
        let (bus, agent) = (&self.bus, &self.agent);
        let mut trouble = Persist::new("record a request's answer", RECORD_BACKOFF);
        loop {
            let why = match ledger.write(bus, agent, &finished, Some(revision)).await {
                Ok(Some(_)) => return answer,
                Ok(None) => match ledger.read(bus, agent, &finished.request_id).await {
                    Ok(Some((stored, _))) if stored.phase == Phase::Finished => {
                        tracing::warn!(request = %finished.request_id, "the request was settled elsewhere while it was carried out; that answer stands");
                        return A::decode(stored.result.as_slice()).unwrap_or(answer);
                    }
                    Ok(Some((_, r))) => {
                        revision = r;
                        continue;
                    }
                    // The record expired or was removed: write it anew.
                    Ok(None) => match ledger.write(bus, agent, &finished, None).await {
                        Ok(Some(_)) => return answer,
                        Ok(None) => "another process wrote it first".to_string(),
                        Err(e) => e.to_string(),
                    },
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            trouble.failed(&why).await;
        }
    }

    async fn read(&self, rid: &str) -> std::result::Result<Option<Versioned<Record>>, Unhandled> {
        self.ledger
            .read(&self.bus, &self.agent, rid)
            .await
            .map_err(|e| Unhandled::retry(format!("reading the record of {rid}: {e}")))
    }

    async fn write(
        &self,
        record: &Record,
        revision: Option<u64>,
    ) -> std::result::Result<Option<u64>, Unhandled> {
        self.ledger
            .write(&self.bus, &self.agent, record, revision)
            .await
            .map_err(|e| Unhandled::retry(format!("recording {}: {e}", record.request_id)))
    }

    async fn publish<A: Contract>(&self, answer: A) -> std::result::Result<(), Unhandled> {
        self.bus
            .publish(answer)
            .await
            .map(|_| ())
            .map_err(|e| Unhandled::retry(format!("publishing the answer: {e}")))
    }

    /// Publishes a stored answer again.
    async fn publish_stored<A: Contract>(
        &self,
        record: &Record,
    ) -> std::result::Result<(), Unhandled> {
        let answer = A::decode(record.result.as_slice()).map_err(|e| {
            Unhandled::retry(format!(
                "the stored answer of {} does not decode: {e}",
                record.request_id
            ))
        })?;
        self.publish(answer).await
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Receiver<bool>>> {
        match self.running.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// Waits, acking progress, until the run `done` signals has finished.
async fn wait_for<T: Decode>(delivery: &Delivery<T>, mut done: watch::Receiver<bool>) {
    let _ = delivery
        .keep_alive(async move { done.wait_for(|d| *d).await.map(|_| ()) })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hash_the_request_id_under_the_agent_and_token() {
        let agent: AgentName = "ops".parse().unwrap();
        let exec = Ledger {
            bucket: "b",
            token: None,
        };
        let mcp = Ledger {
            bucket: "b",
            token: Some("call"),
        };
        let k = exec.key(&agent, "0190:r1:x1:s1:run:a0");
        assert_eq!(k, format!("ops.{}", key_hash("0190:r1:x1:s1:run:a0")));
        assert!(mcp.key(&agent, "r").starts_with("ops.call."));
        assert_ne!(k, exec.key(&agent, "0190:r1:x1:s1:run:a1"));
        assert!(
            k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        );
    }

    #[test]
    fn a_record_round_trips_with_its_answer() {
        let r = Record {
            request_id: "r".into(),
            phase: Phase::Finished,
            process: "p".into(),
            target: "nas01".into(),
            started_ms: 4,
            heartbeat_ms: 5,
            result: vec![0, 1, 2, 255],
        };
        let back: Record = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn records_the_executor_wrote_before_the_engine_was_shared_still_read() {
        // A command started by an executor of the release before, found
        // after an upgrade: it must still read as started by that process.
        let old = r#"{"request_id":"r","phase":"started","instance":"executor-1","host":"nas01","heartbeat_ms":7}"#;
        let r: Record = serde_json::from_str(old).unwrap();
        assert_eq!(r.phase, Phase::Started);
        assert_eq!(r.process, "executor-1");
        assert_eq!(r.target, "nas01");
        let done = r#"{"request_id":"r","phase":"finished","instance":"e","host":"h","heartbeat_ms":7,"result":"AAE="}"#;
        let r: Record = serde_json::from_str(done).unwrap();
        assert_eq!((r.phase, r.result), (Phase::Finished, vec![0, 1]));
    }
}
