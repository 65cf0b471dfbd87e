//! A circuit breaker per target host (Oikos §8.5 had one that guarded only
//! dead code; this one sits on the live path, in front of every
//! connection).
//!
//! After `failures` consecutive connection failures within `window`, the
//! host's circuit opens: requests to it fail at once, without a connection
//! attempt, for `cooldown`. Then one request is let through (half-open):
//! its success closes the circuit, its failure opens it again. Only
//! failures to reach the host count: a command that exits non-zero reached
//! it fine.

use std::time::{Duration, Instant};

/// Where a host's circuit stands.
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

/// One host's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    settings: BreakerSettings,
    state: Circuit,
    failures: u32,
    first_failure: Option<Instant>,
    last_error: String,
}

/// Whether a request may try the host.
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

    /// Asks to try the host at `now`.
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

    /// The host was reached. Returns whether the state changed.
    pub fn success(&mut self) -> bool {
        let changed = self.state != Circuit::Closed;
        self.state = Circuit::Closed;
        self.failures = 0;
        self.first_failure = None;
        changed
    }

    /// The host could not be reached. Returns whether the state changed.
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

    /// A trial that ended without saying anything about the host (the
    /// request was refused before connecting) gives the next request its
    /// turn.
    pub fn release_trial(&mut self) {
        if self.state == Circuit::HalfOpen {
            self.state = Circuit::Open(Instant::now());
        }
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
