//! The one backoff policy of the workspace: a first delay that doubles per
//! retry up to a cap, computed by `backon`'s exponential backoff.
//!
//! Every wait before trying something again goes through [`Backoff`]: the
//! nak delay of a failed message, a model call retried after a 5xx, a
//! consumer whose connection broke, the Matrix sync while the homeserver
//! is away, a state store that is busy. One policy, so a change to how
//! Nisse waits is made once, and one implementation (backon's), so there
//! is no hand-written doubling to get subtly wrong.

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};

/// A first delay, doubling per retry, never more than a cap. No jitter:
/// the waits are what the configuration says, which the tests rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
}

impl Backoff {
    /// Waits of `first`, then twice that, and so on up to `max`. A `max`
    /// below `first` caps even the first wait.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max }
    }

    /// The longest wait.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The wait before retry number `retry` (0 for the first retry).
    pub fn delay(&self, retry: u32) -> Duration {
        let mut wait = self.max;
        for (n, d) in self.delays().enumerate() {
            // Past the cap the waits no longer grow: no need to go on.
            if u32::try_from(n).is_ok_and(|n| n == retry) || d >= self.max {
                wait = d;
                break;
            }
        }
        wait
    }

    /// The waits one after another, without end: for a loop that retries
    /// until it succeeds.
    pub fn delays(&self) -> impl Iterator<Item = Duration> + Send + use<> {
        let max = self.max;
        ExponentialBuilder::new()
            .with_min_delay(self.first.min(max))
            .with_max_delay(max)
            .with_factor(2.0)
            .without_max_times()
            .build()
            // backon multiplies in 32-bit floating point; rounding keeps
            // the waits the exact multiples the configuration means.
            .map(move |d| rounded(d).min(max))
    }
}

/// `d` to the nearest millisecond, or microsecond below 100 ms.
fn rounded(d: Duration) -> Duration {
    let unit: u128 = if d >= Duration::from_millis(100) {
        1_000_000
    } else {
        1_000
    };
    let nanos = (d.as_nanos() + unit / 2) / unit * unit;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Backoff for a loop that must go on until it works (a sync with a
/// homeserver that is away, a record that must be written): it sleeps
/// through [`Backoff`]'s waits and logs once when the trouble starts and
/// once when it ends, not at every attempt.
pub struct Persist {
    what: &'static str,
    policy: Backoff,
    delays: Box<dyn Iterator<Item = Duration> + Send>,
    failing: bool,
}

impl std::fmt::Debug for Persist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persist")
            .field("what", &self.what)
            .field("policy", &self.policy)
            .field("failing", &self.failing)
            .finish_non_exhaustive()
    }
}

impl Persist {
    /// Retries of `what` ("reach the homeserver") by `policy`.
    pub fn new(what: &'static str, policy: Backoff) -> Self {
        Self {
            what,
            policy,
            delays: Box::new(policy.delays()),
            failing: false,
        }
    }

    /// An attempt failed because of `why`: logs it if it is the first in a
    /// row, then sleeps the next wait.
    pub async fn failed(&mut self, why: &str) {
        if !self.failing {
            tracing::warn!(
                "cannot {}: {why}; retrying with backoff until it works",
                self.what
            );
            self.failing = true;
        }
        let wait = self.delays.next().unwrap_or(self.policy.max());
        tokio::time::sleep(wait).await;
    }

    /// An attempt worked: logs the recovery if there was trouble, and
    /// starts the next trouble from the first wait again.
    pub fn succeeded(&mut self) {
        if self.failing {
            tracing::info!("can {} again", self.what);
            self.failing = false;
            self.delays = Box::new(self.policy.delays());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_from_the_first_and_stop_at_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(b.delay(0), Duration::from_millis(100));
        assert_eq!(b.delay(1), Duration::from_millis(200));
        assert_eq!(b.delay(2), Duration::from_millis(400));
        assert_eq!(b.delay(3), Duration::from_millis(800));
        assert_eq!(b.delay(4), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
        let first: Vec<Duration> = b.delays().take(6).collect();
        assert_eq!(
            first,
            [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        // A cap below the first wait caps it too.
        let b = Backoff::new(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(b.delay(0), Duration::from_secs(1));
    }

    #[test]
    fn odd_values_are_exact_multiples() {
        let b = Backoff::new(Duration::from_millis(250), Duration::from_secs(180));
        let waits: Vec<Duration> = b.delays().take(4).collect();
        assert_eq!(waits, [250, 500, 1000, 2000].map(Duration::from_millis));
        let b = Backoff::new(Duration::from_millis(3), Duration::from_secs(300));
        assert_eq!(b.delay(10), Duration::from_millis(3 * 1024));
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(3600));
        assert_eq!(b.delay(15), Duration::from_millis(100 * 32768));
    }
}
