//! The executor's durable records: the one that makes each request id run
//! at most once (the bus's [`nisse_bus::once`] engine keeps it), and each
//! host's circuit state for the operator to see (kept by the bus's shared
//! circuits, read and written here under the executor's store).
//!
//! They live in the bus's key-value buckets rather than in a file of the
//! executor's so that every executor instance of an agent sees the same
//! ones: a request redelivered to another instance after a crash finds
//! the "started" record there and is reported as outcome-unknown instead
//! of run again.

pub use nisse_bus::breaker::CircuitState;
use nisse_bus::once::Ledger;
use nisse_bus::topology::EXEC_BUCKET;
use nisse_bus::{AgentName, Bus, Result};

/// Where the request records are: `nisse_exec`, under
/// `<agent>.<request id hash>`.
pub(crate) const LEDGER: Ledger = Ledger {
    bucket: EXEC_BUCKET,
    token: None,
};

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
    fn circuits_are_keyed_by_host() {
        let agent: AgentName = "ops".parse().unwrap();
        assert_eq!(
            crate::circuits::STORE.key(&agent, "nas.lan"),
            "ops.6e61732e6c616e"
        );
    }
}
