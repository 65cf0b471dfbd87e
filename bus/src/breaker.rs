//! A circuit breaker per target (Oikos §8.5 had one that guarded only
//! dead code; this one sits on the live path, in front of every
//! connection): the executor keeps one per host, the mcp service one per
//! MCP server instance.
//!
//! After `failures` consecutive connection failures within `window`, the
//! target's circuit opens: requests to it fail at once, without a
//! connection attempt, for `cooldown`. Then one request is let through
//! (half-open): its success closes the circuit, its failure opens it
//! again. Only failures to reach the target count: a command that exits
//! non-zero, or a tool that reports an error, reached it fine.
//!
//! [`Circuits`] holds one agent's breakers, logs each change of state once
//! and writes it to a bucket ([`CircuitStore`]) for the operator to see.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{AgentName, Bus, Error, Result, now_ms};

/// Where a target's circuit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Circuit {
    /// Requests go through.
    Closed,
    /// Requests fail fast until the instant.
    Open(Instant),
    /// One trial request is under way.
    HalfOpen,
}

impl Circuit {
    /// The name shown to the operator.
    pub fn name(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open(_) => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

/// The settings.
#[derive(Debug, Clone, Copy)]
pub struct BreakerSettings {
    /// Consecutive failures that open the circuit.
    pub failures: u32,
    /// Failures further apart than this do not add up.
    pub window: Duration,
    /// How long an open circuit fails fast.
    pub cooldown: Duration,
}

/// One target's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    settings: BreakerSettings,
    state: Circuit,
    failures: u32,
    first_failure: Option<Instant>,
    last_error: String,
}

/// Whether a request may try the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Go ahead.
    Yes,
    /// The circuit is open: fail fast, with why and for how long.
    No {
        /// Time left until a trial is allowed.
        retry_in: Duration,
        /// The failure that opened it.
        last_error: String,
    },
}

impl Breaker {
    /// A closed breaker.
    pub fn new(settings: BreakerSettings) -> Self {
        Self {
            settings,
            state: Circuit::Closed,
            failures: 0,
            first_failure: None,
            last_error: String::new(),
        }
    }

    /// The current state.
    pub fn state(&self) -> Circuit {
        self.state
    }

    /// Consecutive failures counted.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The last failure's description.
    pub fn last_error(&self) -> &str {
        &self.last_error
    }

    /// Asks to try the target at `now`.
    pub fn admit(&mut self, now: Instant) -> Admit {
        match self.state {
            Circuit::Closed => Admit::Yes,
            Circuit::Open(until) if now >= until => {
                self.state = Circuit::HalfOpen;
                Admit::Yes
            }
            Circuit::Open(until) => Admit::No {
                retry_in: until - now,
                last_error: self.last_error.clone(),
            },
            // One trial at a time: the others wait for its outcome by
            // failing fast as if open.
            Circuit::HalfOpen => Admit::No {
                retry_in: Duration::ZERO,
                last_error: self.last_error.clone(),
            },
        }
    }

    /// The target was reached. Returns whether the state changed.
    pub fn success(&mut self) -> bool {
        let changed = self.state != Circuit::Closed;
        self.state = Circuit::Closed;
        self.failures = 0;
        self.first_failure = None;
        changed
    }

    /// The target could not be reached. Returns whether the state changed.
    pub fn failure(&mut self, now: Instant, error: &str) -> bool {
        self.last_error = error.to_string();
        if self
            .first_failure
            .is_none_or(|t| now.duration_since(t) > self.settings.window)
        {
            self.first_failure = Some(now);
            self.failures = 0;
        }
        self.failures += 1;
        let before = self.state;
        if self.state == Circuit::HalfOpen || self.failures >= self.settings.failures {
            self.state = Circuit::Open(now + self.settings.cooldown);
        }
        before.name() != self.state.name()
    }

    /// A trial that ended without saying anything about the target (the
    /// request was refused before connecting) gives the next request its
    /// turn.
    pub fn release_trial(&mut self) {
        if self.state == Circuit::HalfOpen {
            self.state = Circuit::Open(Instant::now());
        }
    }
}

/// The state of one target's circuit, as its service last wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CircuitState {
    /// The agent whose service keeps it.
    pub agent: String,
    /// What the circuit guards: a host (the executor's), or an MCP server
    /// instance (the mcp service's). The name is the executor's, kept so
    /// its records read back.
    pub host: String,
    /// `closed`, `open` or `half_open`; or, for an executor's host found
    /// without bash to run commands with, `no_bash` (not the breaker's:
    /// the host was reached).
    pub state: String,
    /// Consecutive failures counted.
    pub failures: u32,
    /// Until when (ms since the epoch) requests fail fast, when open.
    pub open_until_ms: u64,
    /// The last failure.
    pub last_error: String,
}

/// Where a service writes its circuits' states: a bucket, and a key token
/// after the agent's when the bucket holds other records too
/// (`<agent>.<token>.<target, hex>`; without one, `<agent>.<target, hex>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitStore {
    /// The bucket.
    pub bucket: &'static str,
    /// The key token between the agent and the target, if any.
    pub token: Option<&'static str>,
}

impl CircuitStore {
    /// The key prefix of `agent`'s circuits, ending in a dot.
    fn prefix(&self, agent: &AgentName) -> String {
        match self.token {
            Some(t) => format!("{agent}.{t}."),
            None => format!("{agent}."),
        }
    }

    /// The key of a target's circuit: target names may hold dots, so they
    /// are hex-encoded (readable back, unlike a hash).
    pub fn key(&self, agent: &AgentName, target: &str) -> String {
        let hex: String = target.bytes().map(|b| format!("{b:02x}")).collect();
        format!("{}{hex}", self.prefix(agent))
    }

    /// Records a target's circuit state (for `nisse streams` and status).
    pub async fn put(&self, bus: &Bus, agent: &AgentName, state: &CircuitState) -> Result<()> {
        let bytes = serde_json::to_vec(state).map_err(|e| Error::JetStream {
            action: "encode a circuit state".into(),
            reason: e.to_string(),
        })?;
        bus.kv_put(self.bucket, &self.key(agent, &state.host), bytes)
            .await
    }

    /// Every recorded circuit state of `agent`, by target.
    pub async fn list(&self, bus: &Bus, agent: &AgentName) -> Result<Vec<CircuitState>> {
        let mut out: Vec<CircuitState> =
            bus.kv_list_prefix(self.bucket, &self.prefix(agent)).await?;
        out.sort_by(|a, b| a.host.cmp(&b.host));
        Ok(out)
    }
}

/// One agent's circuits: a [`Breaker`] per target, and each change of
/// state logged once and written to the service's [`CircuitStore`].
pub struct Circuits {
    agent: AgentName,
    bus: Bus,
    settings: BreakerSettings,
    store: CircuitStore,
    breakers: Mutex<HashMap<String, Breaker>>,
}

impl std::fmt::Debug for Circuits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Circuits")
            .field("agent", &self.agent)
            .field("settings", &self.settings)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Circuits {
    /// No circuit open yet, for `agent`'s targets, written to `store`.
    pub fn new(agent: AgentName, bus: Bus, settings: BreakerSettings, store: CircuitStore) -> Self {
        Self {
            agent,
            bus,
            settings,
            store,
            breakers: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Breaker>> {
        match self.breakers.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Whether a connection to `target` may be tried now.
    pub fn admit(&self, target: &str) -> Admit {
        let mut breakers = self.lock();
        let b = breakers
            .entry(target.to_string())
            .or_insert_with(|| Breaker::new(self.settings));
        let before = b.state().name();
        let admit = b.admit(Instant::now());
        if before != b.state().name() {
            self.announce(target, b);
        }
        admit
    }

    /// A half-open trial admitted for `target` was not used after all.
    pub fn release_trial(&self, target: &str) {
        if let Some(b) = self.lock().get_mut(target) {
            b.release_trial();
        }
    }

    /// `target` was reached.
    pub fn success(&self, target: &str) {
        if let Some(b) = self.lock().get_mut(target)
            && b.success()
        {
            self.announce(target, b);
        }
    }

    /// `target` could not be reached, because of `error`.
    pub fn failure(&self, target: &str, error: &str) {
        let mut breakers = self.lock();
        let b = breakers
            .entry(target.to_string())
            .or_insert_with(|| Breaker::new(self.settings));
        if b.failure(Instant::now(), error) {
            self.announce(target, b);
        }
    }

    /// A circuit changed state: logged once, and written to the store.
    fn announce(&self, target: &str, b: &Breaker) {
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
            host: target.to_string(),
            state: b.state().name().to_string(),
            failures: b.failures(),
            open_until_ms,
            last_error: b.last_error().to_string(),
        };
        tracing::warn!(agent = %self.agent, circuit = %target, state = %state.state, failures = state.failures, "circuit {}", state.state);
        let (bus, agent, store) = (self.bus.clone(), self.agent.clone(), self.store);
        tokio::spawn(async move {
            if let Err(e) = store.put(&bus, &agent, &state).await {
                tracing::warn!(circuit = %state.host, "recording the circuit state: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            failures: 3,
            window: Duration::from_secs(60),
            cooldown: Duration::from_secs(30),
        }
    }

    #[test]
    fn opens_after_consecutive_failures_and_recovers_after_cooldown() {
        let t0 = Instant::now();
        let mut b = Breaker::new(settings());
        assert_eq!(b.admit(t0), Admit::Yes);
        assert!(!b.failure(t0, "refused"));
        assert!(!b.failure(t0, "refused"));
        assert!(b.failure(t0, "refused"));
        assert!(matches!(
            b.admit(t0 + Duration::from_secs(29)),
            Admit::No { .. }
        ));
        // Cool-down over: one trial.
        assert_eq!(b.admit(t0 + Duration::from_secs(30)), Admit::Yes);
        assert!(matches!(
            b.admit(t0 + Duration::from_secs(30)),
            Admit::No { .. }
        ));
        assert!(b.success());
        assert_eq!(b.state(), Circuit::Closed);
        assert_eq!(b.admit(t0 + Duration::from_secs(31)), Admit::Yes);
    }

    #[test]
    fn a_failed_trial_opens_again() {
        let t0 = Instant::now();
        let mut b = Breaker::new(settings());
        for _ in 0..3 {
            b.failure(t0, "x");
        }
        let later = t0 + Duration::from_secs(31);
        assert_eq!(b.admit(later), Admit::Yes);
        b.failure(later, "still down");
        assert!(matches!(b.state(), Circuit::Open(u) if u == later + Duration::from_secs(30)));
    }

    #[test]
    fn failures_outside_the_window_do_not_add_up() {
        let t0 = Instant::now();
        let mut b = Breaker::new(settings());
        b.failure(t0, "x");
        b.failure(t0, "x");
        b.failure(t0 + Duration::from_secs(61), "x");
        assert_eq!(b.state(), Circuit::Closed);
        assert_eq!(b.failures(), 1);
    }

    #[test]
    fn circuit_keys_are_readable_and_under_their_token() {
        let agent: AgentName = "ops".parse().unwrap();
        let executor = CircuitStore {
            bucket: "nisse_circuits",
            token: None,
        };
        assert_eq!(executor.key(&agent, "nas.lan"), "ops.6e61732e6c616e");
        let mcp = CircuitStore {
            bucket: "nisse_mcp",
            token: Some("circuit"),
        };
        assert_eq!(mcp.key(&agent, "hv-a"), "ops.circuit.68762d61");
    }

    #[test]
    fn a_success_resets_the_count() {
        let t0 = Instant::now();
        let mut b = Breaker::new(settings());
        b.failure(t0, "x");
        b.failure(t0, "x");
        b.success();
        b.failure(t0, "x");
        assert_eq!(b.state(), Circuit::Closed);
    }
}
