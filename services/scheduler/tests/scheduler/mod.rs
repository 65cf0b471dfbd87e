//! The scheduler on a NATS server with the authorization `nisse up`
//! generates, each instance on a connection of its own as the scheduler's
//! identity, read back from the agent's stream: one message per instant
//! however many instances run, one catch-up message per clock and duty
//! after a stop or an outage of the bus, and a bad schedule refused.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pretty_assertions::assert_eq;
use prost::Message as _;

use nisse_bus::auth::Identity;
use nisse_bus::proto::{Actor, ActorKind, DutyDue, Envelope};
use nisse_bus::{AnyMessage, Bus, Role};
use nisse_scheduler::scheduler::{self, Config, Schedule};
use nisse_tests::{InProcess, TestNats, ops};

/// How long a stopped scheduler may take to finish.
const STOP_GRACE: Duration = Duration::from_secs(5);

const SECOND: Duration = Duration::from_secs(1);

/// A server with the agent `ops`'s topology.
struct Rig {
    nats: TestNats,
    /// The admin's connection, to read the stream back.
    admin: Bus,
}

/// One published Tick or DutyDue, as read back.
#[derive(Debug, Clone, PartialEq)]
struct Due {
    due_ms: u64,
    missed: u64,
    late_ms: u64,
    interval_ms: u64,
    message_id: String,
    /// When the server stored it.
    stored_ms: u64,
}

impl Rig {
    async fn start() -> Self {
        let nats = TestNats::secured(&["ops"]).await.unwrap();
        let admin = nats.bus(&["ops"]).await.unwrap();
        admin.ensure_topology().await.unwrap();
        Self { nats, admin }
    }

    /// A connection of its own as the scheduler of `ops`.
    async fn scheduler_bus(&self) -> Bus {
        self.nats
            .bus_as(&Identity::service(Role::Scheduler, &ops()), &["ops"])
            .await
            .unwrap()
    }

    /// A scheduler instance, started once it reported ready (caught up).
    async fn scheduler(&self, config: &Config) -> InProcess {
        InProcess::service(
            &self.scheduler_bus().await,
            config.clone(),
            &self.nats.data_dir().unwrap(),
            scheduler::run,
        )
        .await
        .unwrap()
    }

    /// Everything the stream holds, by clock (`tick`) or duty name, in
    /// stream order; checks each message's subject and id on the way.
    async fn published(&self) -> BTreeMap<String, Vec<Due>> {
        let mut reader = self.admin.read_range(&ops(), 1, None).await.unwrap();
        let mut by_clock: BTreeMap<String, Vec<Due>> = BTreeMap::new();
        while let Some(stored) = reader.next().await {
            let stored = stored.unwrap();
            let header_id = stored.header("Nats-Msg-Id").unwrap().to_string();
            let stored_ms =
                u64::try_from(stored.stored_at.unix_timestamp_nanos() / 1_000_000).unwrap();
            let (clock, due) = match stored.decode().unwrap() {
                AnyMessage::Tick(t) => {
                    assert_eq!(stored.subject, "nisse.ops.in.tick");
                    let envelope = t.envelope.unwrap();
                    let due = Due {
                        due_ms: ms(t.due.as_ref().unwrap()),
                        missed: t.missed,
                        late_ms: t.late_ms,
                        interval_ms: t.interval_ms,
                        message_id: envelope.message_id,
                        stored_ms,
                    };
                    assert_eq!(due.message_id, format!("tick:ops:{}", due.due_ms));
                    ("tick".to_string(), due)
                }
                AnyMessage::DutyDue(d) => {
                    assert_eq!(stored.subject, format!("nisse.ops.in.duty.duty-{}", d.duty));
                    let envelope = d.envelope.unwrap();
                    assert_eq!(envelope.work_item_id, format!("duty-{}", d.duty));
                    let due = Due {
                        due_ms: ms(d.due.as_ref().unwrap()),
                        missed: d.missed,
                        late_ms: d.late_ms,
                        interval_ms: d.interval_ms,
                        message_id: envelope.message_id,
                        stored_ms,
                    };
                    assert_eq!(due.message_id, format!("due:ops:{}:{}", d.duty, due.due_ms));
                    (d.duty, due)
                }
                other => panic!("the scheduler published a {:?}", other.kind()),
            };
            assert_eq!(header_id, due.message_id);
            by_clock.entry(clock).or_default().push(due);
        }
        by_clock
    }
}

/// A clock ticking every `tick` and `duties`, each due every `interval`,
/// for `ops`.
fn config(tick: Duration, duties: &[&str], interval: Duration) -> Config {
    Config {
        tick,
        duties: BTreeMap::from([(
            ops(),
            duties
                .iter()
                .map(|name| Schedule {
                    name: (*name).to_string(),
                    interval,
                })
                .collect(),
        )]),
    }
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

fn ms(ts: &prost_types::Timestamp) -> u64 {
    u64::try_from(ts.seconds).unwrap() * 1000 + u64::try_from(ts.nanos).unwrap() / 1_000_000
}

/// Asserts that `dues` are one per instant of `interval_ms`, none skipped.
fn assert_consecutive(clock: &str, dues: &[Due], interval_ms: u64) {
    for pair in dues.windows(2) {
        assert_eq!(
            pair[1].due_ms - pair[0].due_ms,
            interval_ms,
            "{clock}: instants follow each other: {pair:#?}"
        );
        assert_eq!(pair[1].missed, 0, "{clock}: {:#?}", pair[1]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_publish_one_message_per_instant() {
    let rig = Rig::start().await;
    let config = config(SECOND, &["disk", "backup", "certs"], SECOND);
    let a = rig.scheduler(&config).await;
    let b = rig.scheduler(&config).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    // One alone goes on where both were, with nothing skipped.
    a.stop(STOP_GRACE).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    b.stop(STOP_GRACE).await.unwrap();

    let published = rig.published().await;
    assert_eq!(
        published.keys().collect::<Vec<_>>(),
        ["backup", "certs", "disk", "tick"]
    );
    for (clock, dues) in &published {
        assert!(dues.len() >= 30, "{clock}: {} messages in 32 s", dues.len());
        // A stream nothing was ever published on starts with no catch-up.
        assert_eq!(dues[0].missed, 0, "{clock}: {:#?}", dues[0]);
        assert_consecutive(clock, dues, 1000);
        for due in dues {
            assert_eq!(due.interval_ms, 1000);
            assert_eq!(due.due_ms % 1000, 0, "{clock}: whole seconds: {due:#?}");
            // Published at its instant, not before; stored after that.
            assert!(
                due.stored_ms + 1 >= due.due_ms + due.late_ms,
                "{clock}: {due:#?}"
            );
        }
    }

    // The whole message, as the brain gets it.
    let last = published["disk"].last().unwrap();
    let stored = rig
        .admin
        .last_on_subject(&ops(), "nisse.ops.in.duty.duty-disk")
        .await
        .unwrap()
        .unwrap();
    let got = DutyDue::decode(&stored.payload[..]).unwrap();
    let got_envelope = got.envelope.clone().unwrap();
    assert_eq!(
        got,
        DutyDue {
            envelope: Some(Envelope {
                agent: "ops".into(),
                work_item_id: "duty-disk".into(),
                actor: Some(Actor {
                    kind: ActorKind::Service as i32,
                    id: "scheduler".into(),
                }),
                causation_id: String::new(),
                trace: got_envelope.trace.clone(),
                created_at: got_envelope.created_at,
                message_id: format!("due:ops:disk:{}", last.due_ms),
            }),
            duty: "disk".into(),
            due: got.due,
            interval_ms: 1000,
            missed: 0,
            late_ms: last.late_ms,
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_scheduler_catches_up_with_one_message_per_duty() {
    let rig = Rig::start().await;
    let config = config(SECOND, &["disk", "backup", "certs"], SECOND);
    let first = rig.scheduler(&config).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    first.stop(STOP_GRACE).await.unwrap();
    let before = rig.published().await;
    let last: BTreeMap<String, u64> = before
        .iter()
        .map(|(clock, dues)| (clock.clone(), dues.last().unwrap().due_ms))
        .collect();
    assert_eq!(last.len(), 4, "{before:#?}");

    // Down for at least 21 instants of every clock, and back in the middle
    // of a second, so the catch-up message is about half a second late.
    let restart_at = last.values().max().unwrap() + 21_500;
    tokio::time::sleep(Duration::from_millis(restart_at.saturating_sub(now_ms()))).await;
    let started = now_ms();
    let second = rig.scheduler(&config).await;
    let ready = now_ms();
    tokio::time::sleep(Duration::from_millis(3200)).await;
    second.stop(STOP_GRACE).await.unwrap();

    let after = rig.published().await;
    assert_eq!(after.len(), 4);
    for (clock, dues) in &after {
        let last = last[clock];
        let new: Vec<Due> = dues.iter().filter(|d| d.due_ms > last).cloned().collect();
        let catch_up = &new[0];
        // For the latest instant when it came back, as ready said.
        assert!(
            catch_up.due_ms >= started - started % 1000 && catch_up.due_ms <= ready - ready % 1000,
            "{clock}: restarted at {started}, ready at {ready}: {catch_up:#?}"
        );
        // Standing for every instant it was down, counted exactly.
        assert_eq!(
            catch_up.missed,
            (catch_up.due_ms - last) / 1000 - 1,
            "{clock}: {catch_up:#?}"
        );
        assert!(catch_up.missed >= 20, "{clock}: {catch_up:#?}");
        // As late as it was: after the restart, no later than ready.
        assert!(catch_up.late_ms > 0, "{clock}: {catch_up:#?}");
        assert!(
            catch_up.due_ms + catch_up.late_ms >= started
                && catch_up.due_ms + catch_up.late_ms <= ready,
            "{clock}: restarted at {started}, ready at {ready}: {catch_up:#?}"
        );
        // Then one message per instant again, and no other catch-up.
        assert!(new.len() >= 3, "{clock}: {new:#?}");
        assert_consecutive(clock, &new, 1000);
        assert_eq!(
            dues.iter().filter(|d| d.missed > 0).count(),
            1,
            "{clock}: {dues:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_bus_was_away_one_message_stands_for_the_missed_instants() {
    let mut rig = Rig::start().await;
    let interval = Duration::from_millis(200);
    let config = config(interval, &["disk"], interval);
    let scheduler = rig.scheduler(&config).await;
    tokio::time::sleep(SECOND).await;
    rig.nats.kill().await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    rig.nats.restart().await.unwrap();

    // Once both clocks have caught up (the connections reconnect on
    // their own), a little more.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let caught_up = match tokio::time::timeout(SECOND, rig.published()).await {
            Ok(published) => {
                published.len() == 2
                    && published
                        .values()
                        .all(|dues| dues.iter().any(|d| d.missed > 0))
            }
            Err(_) => false,
        };
        if caught_up {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no catch-up within 20 s of the server's restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(SECOND).await;
    scheduler.stop(STOP_GRACE).await.unwrap();

    for (clock, dues) in &rig.published().await {
        // Each message counts exactly the instants between it and the one
        // before it on the stream.
        for pair in dues.windows(2) {
            assert!(pair[1].due_ms > pair[0].due_ms, "{clock}: {pair:#?}");
            assert_eq!(
                pair[1].missed,
                (pair[1].due_ms - pair[0].due_ms) / 200 - 1,
                "{clock}: {pair:#?}"
            );
        }
        // One message for the whole outage (3 s: 15 instants), never one
        // per missed instant.
        let catch_ups: Vec<&Due> = dues.iter().filter(|d| d.missed > 0).collect();
        assert_eq!(catch_ups.len(), 1, "{clock}: {dues:#?}");
        assert!(catch_ups[0].missed >= 10, "{clock}: {:#?}", catch_ups[0]);
        assert!(catch_ups[0].late_ms < 1000, "{clock}: {:#?}", catch_ups[0]);
    }
}

#[tokio::test]
async fn a_bad_schedule_is_refused_naming_it() {
    let rig = Rig::start().await;
    let bus = rig.scheduler_bus().await;
    let cases = [
        (
            config(SECOND, &["Disk Check"], SECOND),
            "duty `Disk Check` of agent `ops`: not a valid duty name",
        ),
        (
            config(SECOND, &["disk"], Duration::ZERO),
            "duty `disk` of agent `ops`: interval 0s is too short: at least 100ms",
        ),
        (
            config(Duration::from_millis(50), &[], SECOND),
            "scheduler tick: interval 50ms is too short: at least 100ms",
        ),
    ];
    for (config, expected) in cases {
        let started =
            InProcess::service(&bus, config, &rig.nats.data_dir().unwrap(), scheduler::run).await;
        let Err(e) = started else {
            panic!("started with a bad schedule, expected `{expected}`");
        };
        assert!(format!("{e:#}").contains(expected), "{e:#}");
    }
    // Refused before anything was published.
    let bounds = rig.admin.stream_bounds(&ops()).await.unwrap();
    assert_eq!(bounds.messages, 0);
}
