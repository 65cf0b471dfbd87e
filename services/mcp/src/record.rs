//! The mcp service's durable records, in the `nisse_mcp` bucket under the
//! agent's own keys: the one that makes each request id called at most
//! once (`<agent>.call.<request id hash>`, kept by the bus's
//! [`nisse_bus::once`] engine, as the executor's are), and each
//! instance's circuit state for the operator to see
//! (`<agent>.circuit.<instance, hex>`).
//!
//! They live in the bus rather than in a file of the service's so that
//! every instance of the service sees the same ones: a call redelivered to
//! another process after a crash finds the "started" record there and is
//! answered OUTCOME_UNKNOWN instead of made again.

use nisse_bus::breaker::{CircuitState, CircuitStore};
use nisse_bus::once::Ledger;
use nisse_bus::topology::MCP_BUCKET;
use nisse_bus::{AgentName, Bus, Result};

/// Where the calls are recorded.
pub(crate) const LEDGER: Ledger = Ledger {
    bucket: MCP_BUCKET,
    token: Some("call"),
};

/// Where the circuits of the instances are recorded.
pub(crate) const CIRCUITS: CircuitStore = CircuitStore {
    bucket: MCP_BUCKET,
    token: Some("circuit"),
};

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
        let k = LEDGER.key(&agent, "0190:r1:mcp:a0");
        assert!(k.starts_with("ops.call."), "{k}");
        assert!(
            CIRCUITS
                .key(&agent, "hv-site-a-ro")
                .starts_with("ops.circuit.")
        );
    }
}
