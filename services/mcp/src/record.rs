//! The mcp service's durable records, in the `nisse_mcp` bucket under the
//! agent's own keys: the one that makes each request id called at most
//! once (`<agent>.call.<request id>`), and each instance's circuit state
//! for the operator to see (`<agent>.circuit.<instance, hex>`).
//!
//! They live in the bus rather than in a file of the service's so that
//! every instance of the service sees the same ones: a call redelivered to
//! another process after a crash finds the "started" record there and is
//! answered OUTCOME_UNKNOWN instead of made again.

use serde::{Deserialize, Serialize};

use nisse_bus::breaker::{CircuitState, CircuitStore};
use nisse_bus::topology::MCP_BUCKET;
use nisse_bus::{AgentName, Bus, Result, Versioned, kv_key};

/// Where the circuits of the instances are recorded.
pub(crate) const CIRCUITS: CircuitStore = CircuitStore {
    bucket: MCP_BUCKET,
    token: Some("circuit"),
};

/// Where a request id stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallPhase {
    /// The server is being called (or was, before a crash): it is never
    /// called again for this id.
    Started,
    /// Answered; the answer is given again, nothing is called.
    Done,
}

/// The durable record of one request id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The request id.
    pub request_id: String,
    /// Started or done.
    pub phase: CallPhase,
    /// Which process of the service took it.
    pub process: String,
    /// The MCP instance called.
    pub instance: String,
    /// The tool called.
    pub tool: String,
    /// Milliseconds since the Unix epoch when the call was started.
    pub started_ms: u64,
    /// Milliseconds since the Unix epoch when the process last said it is
    /// still waiting for the call. A started record whose heartbeat is
    /// older than half the ack wait belongs to a process that is gone.
    pub heartbeat_ms: u64,
    /// The encoded `McpResult`, once done.
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

/// The key of a request's record.
fn call_key(agent: &AgentName, request_id: &str) -> String {
    kv_key(agent, &["call", request_id])
}

/// The record of `request_id`, if any, with its revision.
pub async fn read(
    bus: &Bus,
    agent: &AgentName,
    request_id: &str,
) -> Result<Option<Versioned<CallRecord>>> {
    bus.kv_read(MCP_BUCKET, &call_key(agent, request_id)).await
}

/// Writes `record`: created when `revision` is `None` (fails if one
/// exists), else replacing exactly that revision. `Ok(None)` means
/// someone else wrote first: read again.
pub async fn write(
    bus: &Bus,
    agent: &AgentName,
    record: &CallRecord,
    revision: Option<u64>,
) -> Result<Option<u64>> {
    bus.kv_write(
        MCP_BUCKET,
        &call_key(agent, &record.request_id),
        record,
        revision,
    )
    .await
}

/// Every recorded circuit state of `agent`'s instances, by instance.
pub async fn circuits(bus: &Bus, agent: &AgentName) -> Result<Vec<CircuitState>> {
    CIRCUITS.list(bus, agent).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_and_circuits_have_keys_of_their_own() {
        let agent: AgentName = "ops".parse().unwrap();
        let k = call_key(&agent, "0190:r1:mcp:a0");
        assert!(k.starts_with("ops.call."), "{k}");
        assert_ne!(k, call_key(&agent, "0190:r1:mcp:a1"));
        assert!(
            CIRCUITS
                .key(&agent, "hv-site-a-ro")
                .starts_with("ops.circuit.")
        );
    }

    #[test]
    fn a_record_round_trips_with_its_result() {
        let r = CallRecord {
            request_id: "r".into(),
            phase: CallPhase::Done,
            process: "p".into(),
            instance: "hv-site-a-ro".into(),
            tool: "list_vms".into(),
            started_ms: 4,
            heartbeat_ms: 5,
            result: vec![0, 1, 2, 255],
        };
        let back: CallRecord = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
