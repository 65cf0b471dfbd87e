//! The executor's durable records: the one that makes each request id run
//! at most once, and each host's circuit state for the operator to see
//! (kept by the bus's shared circuits, read and written here under the
//! executor's store).
//!
//! They live in the bus's key-value buckets rather than in a file of the
//! executor's so that every executor instance of an agent sees the same
//! ones: a request redelivered to another instance after a crash finds
//! the "started" record there and is reported as outcome-unknown instead
//! of run again.

use serde::{Deserialize, Serialize};

pub use nisse_bus::breaker::CircuitState;
use nisse_bus::topology::EXEC_BUCKET;
use nisse_bus::{AgentName, Bus, Result, Versioned, key_hash};

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
    format!("{agent}.{}", key_hash(request_id))
}

/// The record of `request_id`, if any, with its revision.
pub async fn read(
    bus: &Bus,
    agent: &AgentName,
    request_id: &str,
) -> Result<Option<Versioned<ExecRecord>>> {
    bus.kv_read(EXEC_BUCKET, &record_key(agent, request_id))
        .await
}

/// Writes `record`: created when `revision` is `None` (fails if one
/// exists), else replacing exactly that revision. `Ok(None)` means
/// someone else wrote first: read again.
pub async fn write(
    bus: &Bus,
    agent: &AgentName,
    record: &ExecRecord,
    revision: Option<u64>,
) -> Result<Option<u64>> {
    bus.kv_write(
        EXEC_BUCKET,
        &record_key(agent, &record.request_id),
        record,
        revision,
    )
    .await
}

/// Records a host's circuit state (for `nisse streams` and status).
pub async fn put_circuit(bus: &Bus, agent: &AgentName, state: &CircuitState) -> Result<()> {
    crate::circuits::STORE.put(bus, agent, state).await
}

/// Every recorded circuit state of `agent`, by host.
pub async fn circuits(bus: &Bus, agent: &AgentName) -> Result<Vec<CircuitState>> {
    crate::circuits::STORE.list(bus, agent).await
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
        assert_eq!(
            crate::circuits::STORE.key(&agent, "nas.lan"),
            "ops.6e61732e6c616e"
        );
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
