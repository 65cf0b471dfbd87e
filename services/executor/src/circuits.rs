//! One agent's circuits: a [`Breaker`] per host, and each change of state
//! logged once and written to the circuit bucket for `nisse streams`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use nisse_bus::{AgentName, Bus};

use crate::breaker::{Admit, Breaker, BreakerSettings, Circuit};
use crate::record::{self, CircuitState};
use crate::run::now_ms;

/// The circuits of one agent's hosts.
pub(crate) struct Circuits {
    agent: AgentName,
    bus: Bus,
    settings: BreakerSettings,
    breakers: Mutex<HashMap<String, Breaker>>,
}

impl Circuits {
    pub(crate) fn new(agent: AgentName, bus: Bus, settings: BreakerSettings) -> Self {
        Self {
            agent,
            bus,
            settings,
            breakers: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Breaker>> {
        match self.breakers.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Whether a connection to `host` may be tried now.
    pub(crate) fn admit(&self, host: &str) -> Admit {
        let mut breakers = self.lock();
        let b = breakers
            .entry(host.to_string())
            .or_insert_with(|| Breaker::new(self.settings));
        let before = b.state().name();
        let admit = b.admit(Instant::now());
        if before != b.state().name() {
            self.announce(host, b);
        }
        admit
    }

    /// A half-open trial admitted for `host` was not used after all.
    pub(crate) fn release_trial(&self, host: &str) {
        if let Some(b) = self.lock().get_mut(host) {
            b.release_trial();
        }
    }

    /// `host` was reached.
    pub(crate) fn success(&self, host: &str) {
        if let Some(b) = self.lock().get_mut(host)
            && b.success()
        {
            self.announce(host, b);
        }
    }

    /// `host` could not be reached, because of `error`.
    pub(crate) fn failure(&self, host: &str, error: &str) {
        let mut breakers = self.lock();
        let b = breakers
            .entry(host.to_string())
            .or_insert_with(|| Breaker::new(self.settings));
        if b.failure(Instant::now(), error) {
            self.announce(host, b);
        }
    }

    /// A circuit changed state: logged once, and written to the circuit
    /// bucket for `nisse streams`.
    fn announce(&self, host: &str, b: &Breaker) {
        let open_until_ms = match b.state() {
            Circuit::Open(until) => {
                now_ms()
                    + u64::try_from(until.saturating_duration_since(Instant::now()).as_millis())
                        .unwrap_or(0)
            }
            _ => 0,
        };
        let state = CircuitState {
            agent: self.agent.to_string(),
            host: host.to_string(),
            state: b.state().name().to_string(),
            failures: b.failures(),
            open_until_ms,
            last_error: b.last_error().to_string(),
        };
        tracing::warn!(agent = %self.agent, %host, state = %state.state, failures = state.failures, "circuit {}", state.state);
        let bus = self.bus.clone();
        let agent = self.agent.clone();
        tokio::spawn(async move {
            if let Err(e) = record::put_circuit(&bus, &agent, &state).await {
                tracing::warn!(host = %state.host, "recording the circuit state: {e}");
            }
        });
    }
}
