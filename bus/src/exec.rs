//! What the executor keeps on the bus: the host binding it checks, the
//! record that makes each request id run at most once, and circuit states
//! for the operator to see.
//!
//! The records live in NATS rather than in a file of the executor's so
//! that every executor instance of an agent sees the same ones: a request
//! redelivered to another instance after a crash finds the "started"
//! record there and is reported as outcome-unknown instead of run again.

use std::time::Duration;

use async_nats::jetstream::kv;
use prost::Message as _;
use serde::{Deserialize, Serialize};

use crate::proto::HostBinding;
use crate::{AgentName, Bus, Error, Result, SubjectKind};

/// The key-value bucket of execution records, keyed by agent and request.
pub const EXEC_BUCKET: &str = "nisse_exec";

/// The key-value bucket of circuit states, keyed by agent and host.
pub const CIRCUIT_BUCKET: &str = "nisse_circuits";

/// How long an execution record is kept. A request redelivered later than
/// this would run again; JetStream gives up redelivering long before.
pub const EXEC_RECORD_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Where a request id stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecPhase {
    /// An executor took it and may be running it.
    Started,
    /// Its result is stored; it is never run again.
    Finished,
}

/// The durable record of one request id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRecord {
    /// The request id (the key is a hash of it).
    pub request_id: String,
    /// Started or finished.
    pub phase: ExecPhase,
    /// Which executor instance took it.
    pub instance: String,
    /// The host it runs on.
    pub host: String,
    /// Milliseconds since the Unix epoch when the instance last said it is
    /// still running it. A started record whose heartbeat is older than the
    /// ack wait belongs to an executor that is gone.
    pub heartbeat_ms: u64,
    /// The encoded `ExecResult`, once finished.
    #[serde(default, with = "b64", skip_serializing_if = "Vec::is_empty")]
    pub result: Vec<u8>,
}

/// The state of one host's circuit, as the executor last wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CircuitState {
    /// The agent whose executor keeps it.
    pub agent: String,
    /// The host.
    pub host: String,
    /// `closed`, `open` or `half_open`.
    pub state: String,
    /// Consecutive failures counted.
    pub failures: u32,
    /// Until when (ms since the epoch) requests fail fast, when open.
    pub open_until_ms: u64,
    /// The last failure.
    pub last_error: String,
}

mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// The key of a request's record: the agent, then a hash of the request
/// id (request ids may hold characters keys may not).
fn record_key(agent: &AgentName, request_id: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(request_id.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{agent}.{hex}")
}

/// The key of a host's circuit: host names may hold dots, so they are
/// hex-encoded.
fn circuit_key(agent: &AgentName, host: &str) -> String {
    let hex: String = host.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{agent}.{hex}")
}

/// A stored record and the bucket revision it was read at.
pub type Versioned = (ExecRecord, u64);

impl Bus {
    /// The execution-record bucket's configuration.
    pub(crate) fn exec_bucket_config(&self) -> kv::Config {
        kv::Config {
            bucket: EXEC_BUCKET.to_string(),
            description: "execution records: each request id runs at most once".into(),
            history: 1,
            max_age: EXEC_RECORD_MAX_AGE,
            num_replicas: self.config().streams.replicas,
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        }
    }

    /// The circuit bucket's configuration: a state nobody refreshed for a
    /// day is stale.
    pub(crate) fn circuit_bucket_config(&self) -> kv::Config {
        kv::Config {
            bucket: CIRCUIT_BUCKET.to_string(),
            description: "circuit breakers of the executors, per agent and host".into(),
            history: 1,
            max_age: Duration::from_secs(24 * 3600),
            num_replicas: self.config().streams.replicas,
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        }
    }

    /// The hosts last bound to `work_item_id`, read from the stream (the
    /// last message on `nisse.<agent>.exec.bind.<id>`); `None` when none
    /// was ever bound.
    pub async fn host_binding(
        &self,
        agent: &AgentName,
        work_item_id: &str,
    ) -> Result<Option<HostBinding>> {
        if !crate::topology::is_token(work_item_id) {
            return Ok(None);
        }
        let subject = format!("{}.{work_item_id}", agent.subject(SubjectKind::ExecBind));
        // No stream info needed for a direct read: one round trip, not two.
        let stream = self
            .jetstream()
            .get_stream_no_info(agent.stream())
            .await
            .map_err(|e| Error::JetStream {
                action: format!("open the stream of {agent}"),
                reason: e.to_string(),
            })?;
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(raw) => HostBinding::decode(raw.payload.as_ref())
                .map(Some)
                .map_err(|e| Error::JetStream {
                    action: format!("read the binding on {subject}"),
                    reason: format!("not a HostBinding: {e}"),
                }),
            Err(e)
                if e.kind()
                    == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
            {
                Ok(None)
            }
            Err(e) => Err(Error::JetStream {
                action: format!("read the binding on {subject}"),
                reason: e.to_string(),
            }),
        }
    }

    /// The record of `request_id`, if any.
    pub async fn exec_record(
        &self,
        agent: &AgentName,
        request_id: &str,
    ) -> Result<Option<Versioned>> {
        self.read_versioned(
            EXEC_BUCKET,
            &record_key(agent, request_id),
            &format!("the execution record of {request_id}"),
        )
        .await
    }

    /// Writes `record`: created when `revision` is `None` (fails if one
    /// exists), else replacing exactly that revision. `Ok(None)` means
    /// someone else wrote first: read again.
    pub async fn write_exec_record(
        &self,
        agent: &AgentName,
        record: &ExecRecord,
        revision: Option<u64>,
    ) -> Result<Option<u64>> {
        self.write_versioned(
            EXEC_BUCKET,
            &record_key(agent, &record.request_id),
            record,
            revision,
            &format!("the execution record of {}", record.request_id),
        )
        .await
    }

    /// Records a host's circuit state (for `nisse streams` and status).
    pub async fn put_circuit(&self, agent: &AgentName, state: &CircuitState) -> Result<()> {
        let store = self.bucket(CIRCUIT_BUCKET).await?;
        let bytes = serde_json::to_vec(state).map_err(|e| Error::JetStream {
            action: "encode a circuit state".into(),
            reason: e.to_string(),
        })?;
        store
            .put(circuit_key(agent, &state.host), bytes.into())
            .await
            .map_err(|e| Error::JetStream {
                action: format!("write the circuit state of {}", state.host),
                reason: e.to_string(),
            })?;
        Ok(())
    }

    /// Every recorded circuit state of `agent`.
    pub async fn circuits(&self, agent: &AgentName) -> Result<Vec<CircuitState>> {
        let mut out: Vec<CircuitState> = self
            .list_json(CIRCUIT_BUCKET, agent, "circuit states")
            .await?;
        out.sort_by(|a, b| a.host.cmp(&b.host));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_valid_key_value_keys() {
        let agent: AgentName = "ops".parse().unwrap();
        let k = record_key(&agent, "0190:r1:x1:s1:run:a0");
        assert!(k.starts_with("ops."));
        assert!(
            k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        );
        assert_ne!(k, record_key(&agent, "0190:r1:x1:s1:run:a1"));
        assert_eq!(circuit_key(&agent, "nas.lan"), "ops.6e61732e6c616e");
    }

    #[test]
    fn a_record_round_trips_with_its_result() {
        let r = ExecRecord {
            request_id: "r".into(),
            phase: ExecPhase::Finished,
            instance: "i".into(),
            host: "h".into(),
            heartbeat_ms: 5,
            result: vec![0, 1, 2, 255],
        };
        let back: ExecRecord = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
