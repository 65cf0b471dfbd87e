//! One agent's circuits: the bus's [`Circuits`] (a breaker per target,
//! shared with the mcp service), one per host, their states written to the
//! circuit bucket for `nisse streams`.

use nisse_bus::breaker::CircuitStore;
pub(crate) use nisse_bus::breaker::Circuits;
use nisse_bus::topology::CIRCUIT_BUCKET;

/// Where the executor's circuits are recorded: `nisse_circuits`, under
/// `<agent>.<host, hex>`.
pub(crate) const STORE: CircuitStore = CircuitStore {
    bucket: CIRCUIT_BUCKET,
    token: None,
};
