//! One agent's circuits: the bus's [`Circuits`] (a breaker per target,
//! shared with the mcp service), one per host, their states written to the
//! circuit bucket for `nisse streams`; and, in the same records, the hosts
//! found without bash ([`NoBash`]).

use std::collections::HashMap;
use std::sync::Mutex;

pub(crate) use nisse_bus::breaker::Circuits;
use nisse_bus::breaker::{CircuitState, CircuitStore};
use nisse_bus::topology::CIRCUIT_BUCKET;
use nisse_bus::{AgentName, Bus};

/// Where the executor's circuits are recorded: `nisse_circuits`, under
/// `<agent>.<host, hex>`.
pub(crate) const STORE: CircuitStore = CircuitStore {
    bucket: CIRCUIT_BUCKET,
    token: None,
};

/// The state a host's record shows while the host has no bash to run
/// commands with (beside the breaker's `closed`, `open`, `half_open`).
pub const NO_BASH: &str = "no_bash";

/// The hosts found without bash, recorded in the host's circuit record
/// as [`NO_BASH`] so that `nisse streams` shows it.
///
/// A missing bash is not a connection failure: the host was reached, so
/// the breaker does not count it (it would open and close again on its
/// own, saying nothing true). It lasts until someone installs bash, so
/// it is recorded until a command runs there again, which clears it: each
/// command still tries (nothing runs without bash, so trying costs one
/// channel), and the first that runs is the sign it was fixed. The
/// bucket's age limit drops a record no command refreshed for a day.
pub(crate) struct NoBash {
    agent: AgentName,
    bus: Bus,
    /// Per host, whether its record says [`NO_BASH`], once known: learnt
    /// from the record at the host's first command that runs, so that one
    /// written before a restart, or by another instance, is cleared too.
    recorded: Mutex<HashMap<String, bool>>,
}

impl NoBash {
    /// Nothing known yet of `agent`'s hosts.
    pub(crate) fn new(agent: AgentName, bus: Bus) -> Self {
        Self {
            agent,
            bus,
            recorded: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
        match self.recorded.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// `host` did not start bash, for `reason`: recorded (again, which
    /// keeps the record from ageing out while commands are refused).
    pub(crate) async fn missing(&self, host: &str, reason: &str) {
        if self.lock().insert(host.to_string(), true) != Some(true) {
            tracing::error!(agent = %self.agent, %host, "the host has no bash: {reason}");
        }
        self.put(host, NO_BASH, reason).await;
    }

    /// A command ran on `host` under bash: a record saying it had none is
    /// cleared (the host's circuit shows closed: it was just reached).
    /// Only the host's first such command here reads the record.
    pub(crate) async fn found(&self, host: &str) {
        let known = self.lock().get(host).copied();
        let recorded = match known {
            Some(recorded) => recorded,
            None => {
                let key = STORE.key(&self.agent, host);
                match self.bus.kv_read::<CircuitState>(STORE.bucket, &key).await {
                    Ok(record) => record.is_some_and(|(r, _)| r.state == NO_BASH),
                    Err(e) => {
                        // Asked again at the next command.
                        tracing::warn!(agent = %self.agent, %host, "reading the host's state: {e}");
                        return;
                    }
                }
            }
        };
        if recorded {
            tracing::info!(agent = %self.agent, %host, "the host has bash again");
            self.put(host, "closed", "").await;
        }
        self.lock().insert(host.to_string(), false);
    }

    async fn put(&self, host: &str, state: &str, reason: &str) {
        let record = CircuitState {
            agent: self.agent.to_string(),
            host: host.to_string(),
            state: state.to_string(),
            failures: 0,
            open_until_ms: 0,
            last_error: reason.to_string(),
        };
        if let Err(e) = STORE.put(&self.bus, &self.agent, &record).await {
            tracing::warn!(agent = %self.agent, %host, "recording the host's state: {e}");
        }
    }
}
