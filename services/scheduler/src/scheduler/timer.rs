//! One clock or duty schedule of one agent: when it is due, what the
//! stream already has, and publishing one message for the latest due
//! instant.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::connection::State as Connection;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use nisse_bus::proto::{Actor, ActorKind, DutyDue, Envelope, Tick};
use nisse_bus::topology::duty_item;
use nisse_bus::{AgentName, Backoff, Bus, Persist, Published, SubjectKind};

/// How a timer retries while the bus is away: soon at first, and never
/// more than 2 s apart, so it publishes at most that late once the bus is
/// back. A retry while disconnected costs nothing but a look at the
/// connection's state.
const RETRY: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));

/// The longest a timer sleeps before it looks at the wall clock again.
/// Sleeps run on the monotonic clock, which stands still while the
/// machine is suspended and does not follow the wall clock when it is
/// set: a timer that slept a day in one go could wake long after its due
/// instant.
const LONGEST_SLEEP: Duration = Duration::from_secs(60);

/// What a timer stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Clock {
    /// The agent's clock: `Tick` on `in.tick`.
    Tick,
    /// A duty: `DutyDue` on `in.duty.duty-<name>`.
    Duty(String),
}

impl fmt::Display for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tick => f.write_str("tick"),
            Self::Duty(name) => write!(f, "duty {name}"),
        }
    }
}

/// One agent's clock or one of its duties, and its retries.
pub(super) struct Timer {
    state: State,
    /// Apart from the rest: it is not `Sync`, and the rest is borrowed
    /// across awaits.
    persist: Persist,
}

/// What a timer knows.
struct State {
    agent: AgentName,
    clock: Clock,
    interval_ms: u64,
    /// The subject its messages are published on.
    subject: String,
    /// The latest due instant known to be on the stream, in ms since the
    /// epoch (`None`: none ever was, as far as the stream says).
    last: Option<u64>,
    /// `last` must be read from the stream before the next publish: at
    /// start, and after a failed attempt (another instance may have
    /// published meanwhile, or a publish whose ack was lost may have been
    /// stored after all).
    stale: bool,
}

impl Timer {
    /// A timer for `clock` of `agent`, due every `interval_ms`.
    pub(super) fn new(agent: AgentName, clock: Clock, interval_ms: u64) -> Self {
        let subject = match &clock {
            Clock::Tick => agent.subject(SubjectKind::Tick),
            Clock::Duty(name) => format!(
                "{}.{}",
                agent.subject(SubjectKind::DutyDue),
                duty_item(name)
            ),
        };
        Self {
            state: State {
                agent,
                clock,
                interval_ms,
                subject,
                last: None,
                stale: true,
            },
            persist: Persist::new("publish the agent's ticks and due duties", RETRY),
        }
    }

    /// Publishes messages at each due instant until `shutdown`, catching
    /// up with one message when it fell behind.
    pub(super) async fn run(mut self, bus: Bus, shutdown: CancellationToken) {
        loop {
            let now = now_ms();
            let next = self
                .state
                .last
                .map_or(now, |l| next_due(l, self.state.interval_ms));
            let wait = Duration::from_millis(next.saturating_sub(now)).min(LONGEST_SLEEP);
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            if !self.bring_up_to_date(&bus, &shutdown).await {
                return;
            }
        }
    }

    /// Makes sure the stream holds this timer's latest due instant,
    /// retrying with backoff until it does. `false` when `shutdown` came
    /// first.
    pub(super) async fn bring_up_to_date(
        &mut self,
        bus: &Bus,
        shutdown: &CancellationToken,
    ) -> bool {
        loop {
            let attempt = tokio::select! {
                biased;
                () = shutdown.cancelled() => return false,
                attempt = self.state.attempt(bus) => attempt,
            };
            match attempt {
                Ok(()) => {
                    self.persist.succeeded();
                    return true;
                }
                Err(e) => {
                    self.state.stale = true;
                    let why = e.to_string();
                    tokio::select! {
                        biased;
                        () = shutdown.cancelled() => return false,
                        () = self.persist.failed(&why) => {}
                    }
                }
            }
        }
    }
}

impl State {
    /// One try at publishing the latest due instant, unless the stream has
    /// it already. The instants between the last one published and it are
    /// not published: the message says how many it stands for.
    async fn attempt(&mut self, bus: &Bus) -> nisse_bus::Result<()> {
        // A request while disconnected would wait out its whole timeout,
        // and a publish would sit in the client's buffer and be stored
        // whenever the connection is back, saying it is less late than it
        // is.
        if bus.client().connection_state() != Connection::Connected {
            return Err(nisse_bus::Error::Publish {
                subject: self.subject.clone(),
                reason: "not connected to NATS".into(),
            });
        }
        let iv = self.interval_ms;
        let latest = latest_due(now_ms(), iv);
        // Behind (the process was suspended, or slow) is when two
        // instances could disagree on what was skipped: the stream says.
        let behind = self.last.is_some_and(|l| skipped(l, latest, iv) > 0);
        if self.stale || behind {
            let on_stream = self.last_on_stream(bus).await?;
            self.last = self.last.max(on_stream);
            self.stale = false;
        }
        if self.last.is_some_and(|l| l >= latest) {
            return Ok(());
        }
        let missed = self.last.map_or(0, |l| skipped(l, latest, iv));
        let (late_ms, published) = self.publish(bus, latest, missed).await?;
        self.last = Some(latest);
        if published.duplicate {
            // Another instance was first: its message, with its count,
            // is the one on the stream.
            tracing::debug!(agent = %self.agent, clock = %self.clock, due = %rfc3339(latest), "published by another instance already");
        } else if missed > 0 {
            tracing::info!(
                agent = %self.agent,
                clock = %self.clock,
                due = %rfc3339(latest),
                missed,
                late_ms,
                "the scheduler caught up: one message stands for {} due instants, the latest {} late",
                missed + 1,
                humantime::format_duration(Duration::from_millis(late_ms)),
            );
        } else {
            tracing::debug!(agent = %self.agent, clock = %self.clock, due = %rfc3339(latest), late_ms, "published");
        }
        Ok(())
    }

    /// The due instant of the last message on this timer's subject.
    async fn last_on_stream(&self, bus: &Bus) -> nisse_bus::Result<Option<u64>> {
        let Some(stored) = bus.last_on_subject(&self.agent, &self.subject).await? else {
            return Ok(None);
        };
        let due = match &self.clock {
            Clock::Tick => Tick::decode(&stored.payload[..]).map(|m| m.due),
            Clock::Duty(_) => DutyDue::decode(&stored.payload[..]).map(|m| m.due),
        };
        // Only the scheduler publishes here, so this is not expected; the
        // schedule then starts again as if it never ran, which loses
        // nothing but the count of what was skipped.
        match due.map(|d| d.as_ref().and_then(ms_of)) {
            Ok(Some(due)) => Ok(Some(due)),
            Ok(None) => {
                tracing::warn!(subject = %self.subject, sequence = stored.sequence, "the last message on the subject has no due instant; starting the schedule afresh");
                Ok(None)
            }
            Err(e) => {
                tracing::warn!(subject = %self.subject, sequence = stored.sequence, "the last message on the subject cannot be decoded ({e}); starting the schedule afresh");
                Ok(None)
            }
        }
    }

    /// Publishes the message for `due`; returns how late it was, and what
    /// JetStream said.
    async fn publish(
        &self,
        bus: &Bus,
        due: u64,
        missed: u64,
    ) -> nisse_bus::Result<(u64, Published)> {
        let late_ms = now_ms().saturating_sub(due);
        let agent = self.agent.as_str();
        let (message_id, work_item_id) = match &self.clock {
            Clock::Tick => (format!("tick:{agent}:{due}"), String::new()),
            Clock::Duty(name) => (format!("due:{agent}:{name}:{due}"), duty_item(name)),
        };
        // No request causes these: the envelope is built here, not from
        // one (`Service::reply_to`).
        let envelope = Some(Envelope {
            agent: agent.to_string(),
            work_item_id,
            actor: Some(Actor {
                kind: ActorKind::Service as i32,
                id: super::SERVICE.name.to_string(),
            }),
            message_id,
            ..Envelope::default()
        });
        let due = Some(timestamp(due));
        let interval_ms = self.interval_ms;
        let published = match &self.clock {
            Clock::Tick => {
                bus.publish(Tick {
                    envelope,
                    due,
                    interval_ms,
                    missed,
                    late_ms,
                })
                .await?
            }
            Clock::Duty(name) => {
                bus.publish(DutyDue {
                    envelope,
                    duty: name.clone(),
                    due,
                    interval_ms,
                    missed,
                    late_ms,
                })
                .await?
            }
        };
        Ok((late_ms, published))
    }
}

/// Now by the wall clock, in ms since the Unix epoch. This is where the
/// wall clock enters Nisse: everything else learns the time from the
/// instants in the messages published with it.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The latest due instant at or before `now`.
fn latest_due(now: u64, interval: u64) -> u64 {
    now - now % interval
}

/// The first due instant after `instant`.
fn next_due(instant: u64, interval: u64) -> u64 {
    latest_due(instant, interval).saturating_add(interval)
}

/// How many due instants lie strictly between `last` and `latest` (which
/// is one). `last` need not be one: the interval may have changed since.
fn skipped(last: u64, latest: u64, interval: u64) -> u64 {
    if latest <= last {
        0
    } else {
        (latest - last - 1) / interval
    }
}

/// An instant in ms since the epoch as a protobuf timestamp.
fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from(ms % 1000 * 1_000_000).unwrap_or(0),
    }
}

/// A protobuf timestamp in ms since the epoch; `None` before the epoch.
fn ms_of(ts: &prost_types::Timestamp) -> Option<u64> {
    let seconds = u64::try_from(ts.seconds).ok()?;
    let millis = u64::try_from(ts.nanos / 1_000_000).ok()?;
    seconds.checked_mul(1000)?.checked_add(millis)
}

/// An instant for logs.
fn rfc3339(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{ms} ms after the epoch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_instants_are_multiples_of_the_interval() {
        assert_eq!(latest_due(12_345, 1000), 12_000);
        assert_eq!(latest_due(12_000, 1000), 12_000);
        assert_eq!(next_due(12_000, 1000), 13_000);
        assert_eq!(next_due(12_999, 1000), 13_000);
        // An instant of another interval (the configuration changed).
        assert_eq!(next_due(12_500, 5000), 15_000);
        assert_eq!(next_due(u64::MAX - 1, 1000), u64::MAX);
    }

    #[test]
    fn skipped_counts_the_instants_in_between() {
        assert_eq!(skipped(12_000, 13_000, 1000), 0);
        assert_eq!(skipped(12_000, 12_000, 1000), 0);
        assert_eq!(skipped(13_000, 12_000, 1000), 0);
        assert_eq!(skipped(12_000, 33_000, 1000), 20);
        // Off the interval's grid: 10 000 is skipped, 20 000 is published.
        assert_eq!(skipped(5_000, 20_000, 10_000), 1);
        assert_eq!(skipped(9_999, 20_000, 10_000), 1);
        assert_eq!(skipped(10_000, 20_000, 10_000), 0);
    }

    #[test]
    fn timestamps_round_trip_in_milliseconds() {
        let ms = 1_767_225_600_123;
        let ts = timestamp(ms);
        assert_eq!((ts.seconds, ts.nanos), (1_767_225_600, 123_000_000));
        assert_eq!(ms_of(&ts), Some(ms));
        assert_eq!(
            ms_of(&prost_types::Timestamp {
                seconds: -1,
                nanos: 0
            }),
            None
        );
        assert_eq!(rfc3339(ms), "2026-01-01T00:00:00.123Z");
    }

    #[test]
    fn a_duty_publishes_on_its_item_subject() {
        let agent: AgentName = "ops".parse().unwrap();
        let t = Timer::new(agent.clone(), Clock::Duty("disk".into()), 1000);
        assert_eq!(t.state.subject, "nisse.ops.in.duty.duty-disk");
        let t = Timer::new(agent, Clock::Tick, 1000);
        assert_eq!(t.state.subject, "nisse.ops.in.tick");
    }
}
