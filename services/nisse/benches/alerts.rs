//! `cargo bench -p nisse --bench alerts`: Alertmanager alerts from the
//! webhook POST to the committed work-item event, end to end in one process,
//! with raw JetStream publish+consume of the same messages measured in the
//! same run as the ceiling.
//!
//! One fresh `nats-server -js` is started in a temporary directory. One
//! `Bus` for agent `ops` (topology ensured) is shared, as in `nisse up`, by
//! intake-alerts (bound on a free loopback port, no auth) and the ops brain
//! (`reactor::run`, its store in the temporary directory), both on this
//! process's multi-thread tokio runtime. A reqwest client posts
//! Alertmanager v4 webhook payloads; every alert has its own labels and
//! fingerprint, so each one opens a new work item (the heavier path: a new
//! item, its log events and an operator message through the outbox, which
//! the brain publishes and then applies again when it comes back on its
//! stream).
//!
//! An alert counts as committed when the brain's `committed` watch reports
//! an applied sequence at or past the message that carried it: an observer
//! thread wakes on every report, reads the new `finding` events from the
//! store over a read-only SQLite connection (their `causation_id` is the
//! alert's dedup id, `alert:<fingerprint>:firing:<startsAt>`) and stamps
//! those alerts committed at the moment it woke.
//!
//! Cases, per round:
//! - sustained: N alerts posted as fast as 8 connections can, 10 alerts per
//!   request; alerts/s from the first POST to the commit of the last alert;
//! - the ceiling: raw `async-nats` publishes N messages of an
//!   `AlertReceived`'s size (a window of 256 outstanding publish acks, the
//!   intake's per-request concurrency) to a stream `RAW` with the same
//!   configuration as `AGENT_OPS`, while a durable pull consumer with the
//!   brain consumer's configuration receives and acks each; messages/s
//!   from the first publish to the last ack. The sustained case and the
//!   ceiling alternate which goes first;
//! - fixed rate: one alert per request at 100 and at 1,000 alerts/s,
//!   open-loop (sent on schedule, never waiting for earlier requests), with
//!   the latency of each alert from just before its POST to its commit and
//!   to its HTTP 200.
//!
//! Without `--bench` (as under `cargo test --benches`) it runs a small smoke
//! version of the same cases and prints no verdict.
//!
//! Environment: `NISSE_BENCH_ALERTS_ROUNDS` (default 3),
//! `NISSE_BENCH_ALERTS_COUNT` (sustained alerts per round, default 20000),
//! `NISSE_BENCH_ALERTS_SECONDS` (per fixed rate and round, default 10),
//! `NISSE_BENCH_VERBOSE` (print every round).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use bytes::Bytes;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[path = "../../../bus/benches/support/cpu.rs"]
mod cpu;
#[path = "../../../bus/benches/support/stats.rs"]
mod stats;
use cpu::{Cpu, cpu_now};
use stats::{median, ms, percentile};
#[path = "../../../bus/benches/support/env.rs"]
mod env;
use env::env_or;
#[path = "support/raw.rs"]
mod raw;
use raw::Raw;

use nisse_bus::auth::{AuthPlan, Credentials, Identity, server_authorization};
use nisse_bus::embedded::{EmbeddedOptions, EmbeddedServer};
use nisse_bus::{AgentName, Bus, BusConfig, ConsumerSpec, Role, SubjectKind};
use nisse_core::Store;
use nisse_core::reactor::ReactorError;

/// The agent the alerts go to.
const AGENT: &str = "ops";
/// Concurrent connections of the sustained case.
const CONNECTIONS: usize = 8;
/// Alerts per request in the sustained case.
const ALERTS_PER_REQUEST: usize = 10;
/// The fixed rates, alerts per second.
const RATES: [u32; 2] = [100, 1000];
/// Latency target at 100 alerts/s, in ms.
const P99_TARGET_MS: f64 = 20.0;
/// Throughput target, as a share of the raw ceiling.
const RATIO_TARGET: f64 = 0.5;
/// Longest any one case may take before the bench gives up.
const CASE_TIMEOUT: Duration = Duration::from_secs(300);

/// What to run.
struct Settings {
    full: bool,
    rounds: usize,
    alerts: usize,
    seconds: f64,
    warmup: usize,
    verbose: bool,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let full = std::env::args().any(|a| a == "--bench");
        let rounds: usize = env_or("NISSE_BENCH_ALERTS_ROUNDS", if full { 3 } else { 1 })?;
        let alerts: usize = env_or("NISSE_BENCH_ALERTS_COUNT", if full { 20_000 } else { 40 })?;
        let seconds: f64 = env_or("NISSE_BENCH_ALERTS_SECONDS", if full { 10.0 } else { 0.2 })?;
        ensure!(
            rounds >= 1 && alerts >= 1 && seconds > 0.0,
            "NISSE_BENCH_ALERTS_ROUNDS, _COUNT and _SECONDS must be positive"
        );
        Ok(Self {
            full,
            rounds,
            alerts,
            seconds,
            warmup: if full { 1_000 } else { 20 },
            verbose: std::env::var_os("NISSE_BENCH_VERBOSE").is_some(),
        })
    }

    /// Alerts at one fixed rate in one round.
    fn at_rate(&self, rate: u32) -> usize {
        ((f64::from(rate) * self.seconds).round() as usize).max(1)
    }

    /// Every alert the run posts.
    fn total_alerts(&self) -> usize {
        let per_round = self.alerts + RATES.iter().map(|r| self.at_rate(*r)).sum::<usize>();
        self.warmup + self.rounds * per_round
    }
}

fn main() -> Result<()> {
    let settings = Settings::from_env()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(run(settings))
}

/// Whether the bus requires the credentials `nisse up` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    /// The generated authorization: the intake and the brain connect as
    /// their own identities, each with only its permissions, as `nisse up`
    /// runs them.
    On,
    /// A server without authentication, one shared connection.
    Off,
}

async fn run(settings: Settings) -> Result<()> {
    let modes: Vec<Auth> = match std::env::var("NISSE_BENCH_ALERTS_AUTH").as_deref() {
        Ok("on") => vec![Auth::On],
        Ok("off") => vec![Auth::Off],
        Ok("both") | Err(_) if settings.full => vec![Auth::On, Auth::Off],
        Ok("both") | Err(_) => vec![Auth::On],
        Ok(other) => bail!("NISSE_BENCH_ALERTS_AUTH is `{other}`: use on, off or both"),
    };
    let mut summaries = Vec::new();
    for auth in modes {
        println!("\n== authorization {auth:?}");
        let dir = tempfile::tempdir().context("temporary directory")?;
        let mut options = EmbeddedOptions::in_dir(&dir.path().join("nats"));
        let credentials = Credentials::in_data_dir(&dir.path().join("data"));
        if auth == Auth::On {
            options.authorization = Some(server_authorization(
                &AuthPlan {
                    agents: vec![AGENT.parse()?],
                    ..Default::default()
                },
                &credentials,
            )?);
        }
        let server = EmbeddedServer::start(options).await?;
        let started = Instant::now();
        let outcome = measure(
            &settings,
            server.url(),
            server.pid(),
            dir.path(),
            (auth == Auth::On).then_some(&credentials),
        )
        .await;
        if settings.full {
            println!(
                "measuring took {:.0} s",
                started.elapsed().as_secs_f64().ceil()
            );
        }
        server.stop(Duration::from_secs(10)).await?;
        summaries.push((auth, outcome?));
    }
    if let [(_, on), (_, off)] = summaries.as_slice() {
        println!();
        println!("Authorization on vs off, each against its own raw ceiling in the same run:");
        println!();
        println!("| Metric | on | off | on/off |");
        println!("|---|---:|---:|---:|");
        for (name, a, b) in [
            ("sustained alerts/s", on.alerts, off.alerts),
            ("share of the raw ceiling", on.ratio, off.ratio),
            (
                "CPU per alert, bench process (µs)",
                on.cpu_client,
                off.cpu_client,
            ),
            (
                "CPU per alert, nats-server (µs)",
                on.cpu_server,
                off.cpu_server,
            ),
            ("p99 to commit at 100/s (ms)", on.p99_slow, off.p99_slow),
        ] {
            println!("| {name} | {a:.3} | {b:.3} | {:.3} |", a / b);
        }
    }
    Ok(())
}

/// One measurement's headline figures, for comparing the two modes.
struct Summary {
    alerts: f64,
    ratio: f64,
    cpu_client: f64,
    cpu_server: f64,
    p99_slow: f64,
}

// ---------------------------------------------------------------------------
// Stamps: when each alert was posted, answered and committed.

/// Per alert number, nanoseconds since `origin` plus one (0: not yet) at
/// which it was posted, answered 200, and seen committed.
struct Tracker {
    origin: Instant,
    sent: Vec<AtomicU64>,
    answered: Vec<AtomicU64>,
    committed: Vec<AtomicU64>,
}

impl Tracker {
    fn new(capacity: usize) -> Self {
        let slots = || (0..capacity).map(|_| AtomicU64::new(0)).collect();
        Self {
            origin: Instant::now(),
            sent: slots(),
            answered: slots(),
            committed: slots(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    fn set(slots: &[AtomicU64], n: u64, at: u64) {
        if let Some(slot) = usize::try_from(n).ok().and_then(|i| slots.get(i)) {
            slot.store(at, Ordering::Relaxed);
        }
    }

    fn get(slots: &[AtomicU64], n: u64) -> u64 {
        usize::try_from(n)
            .ok()
            .and_then(|i| slots.get(i))
            .map_or(0, |s| s.load(Ordering::Relaxed))
    }
}

/// The alert number a finding's causation id names, from the fingerprint
/// the bench gave it (`alert:<16 hex digits>:firing:<startsAt>`).
fn alert_number(causation_id: &str) -> Option<u64> {
    let hex = causation_id.strip_prefix("alert:")?.get(..16)?;
    u64::from_str_radix(hex, 16).ok()
}

/// What the observer saw and what it cost.
#[derive(Default)]
struct Observed {
    /// Wake-ups on a new applied sequence.
    wakeups: u64,
    /// Findings of bench alerts seen committed.
    findings: u64,
    /// Findings for an alert already seen committed (must stay 0).
    doubles: u64,
    /// Findings not from a bench alert (must stay 0).
    strangers: u64,
    /// CPU time of the observer thread.
    cpu_ns: u64,
    /// Time it spent reading the store.
    reading: Duration,
}

/// The observer thread: on every applied sequence the brain reports, reads
/// the `finding` events committed up to it and stamps their alerts as
/// committed at the moment it woke. Publishes the count of committed alerts
/// and of its wake-ups on `progress`. Ends, after a last read, when the
/// brain stops.
fn observe(
    runtime: tokio::runtime::Handle,
    mut applied: watch::Receiver<u64>,
    db: PathBuf,
    tracker: Arc<Tracker>,
    progress: watch::Sender<(u64, u64)>,
) -> Result<Observed> {
    let cpu_start = thread_cpu_ns();
    let mut seen = Observed::default();
    let mut conn: Option<rusqlite::Connection> = None;
    let mut last_id: i64 = 0;
    loop {
        let alive = runtime.block_on(applied.changed()).is_ok();
        let at = tracker.now();
        let upto = i64::try_from(*applied.borrow_and_update()).unwrap_or(i64::MAX);
        seen.wakeups += 1;
        let reading = Instant::now();
        if conn.is_none() && db.is_file() {
            // Checks it is the ops store of this build's schema first.
            Store::open_read_only(&db, AGENT)?;
            let c = rusqlite::Connection::open_with_flags(
                &db,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            c.busy_timeout(Duration::from_secs(5))?;
            conn = Some(c);
        }
        if let Some(c) = &conn {
            // Events are appended in stream order, so those up to `upto`
            // are a prefix of the ids after `last_id`.
            let mut stmt = c.prepare_cached(
                "SELECT id, kind, causation_id FROM events WHERE id > ?1 AND stream_sequence <= ?2 ORDER BY id",
            )?;
            let mut rows = stmt.query(rusqlite::params![last_id, upto])?;
            while let Some(row) = rows.next()? {
                last_id = row.get(0)?;
                if row.get_ref(1)?.as_str()? != "finding" {
                    continue;
                }
                match alert_number(row.get_ref(2)?.as_str()?) {
                    Some(n) if Tracker::get(&tracker.committed, n) == 0 => {
                        Tracker::set(&tracker.committed, n, at);
                        seen.findings += 1;
                    }
                    Some(_) => seen.doubles += 1,
                    None => seen.strangers += 1,
                }
            }
        }
        seen.reading += reading.elapsed();
        progress.send_replace((seen.findings, seen.wakeups));
        if !alive {
            break;
        }
    }
    seen.cpu_ns = thread_cpu_ns().saturating_sub(cpu_start);
    Ok(seen)
}

// ---------------------------------------------------------------------------
// CPU time (`Cpu`, `cpu_now`: shared with the bus bench).

/// CPU time of the calling thread so far; 0 where unavailable.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// The set-up.

/// Everything the cases need.
struct Bench {
    tracker: Arc<Tracker>,
    /// Alerts seen committed, and observer wake-ups, so far.
    progress: watch::Receiver<(u64, u64)>,
    /// The brain's applied sequence.
    applied: watch::Receiver<u64>,
    bus: Bus,
    agent: AgentName,
    http: reqwest::Client,
    webhook: String,
    starts_at: String,
    /// The next unused alert number.
    next: u64,
    server_pid: Option<u32>,
    /// The admin's seed when the server requires credentials: the raw
    /// ceiling connects with it.
    admin_seed: Option<String>,
}

async fn measure(
    settings: &Settings,
    url: &str,
    server_pid: Option<u32>,
    dir: &std::path::Path,
    credentials: Option<&Credentials>,
) -> Result<Summary> {
    let cfg = BusConfig {
        url: Some(url.to_string()),
        ..Default::default()
    };
    let agent: AgentName = AGENT.parse()?;
    // With authorization, each part as its own identity on its own
    // connection (as `nisse up` runs them); without, one shared one.
    let connect = |identity: Identity| {
        let (cfg, agent) = (cfg.clone(), agent.clone());
        async move {
            match credentials {
                Some(c) => Bus::connect_as(&cfg, vec![agent], &identity, c).await,
                None => Bus::connect(&cfg, vec![agent], "bench-nisse").await,
            }
        }
    };
    let bus = connect(Identity::Admin).await?;
    bus.ensure_topology().await?;
    let (brain_bus, intake_bus) = match credentials {
        Some(_) => (
            connect(Identity::service(Role::Brain, &agent)).await?,
            connect(Identity::service(Role::IntakeAlerts, &agent)).await?,
        ),
        None => (bus.clone(), bus.clone()),
    };

    let shutdown = CancellationToken::new();
    let db = Store::path_in(&dir.join("data"), AGENT);
    let (committed, applied) = watch::channel(0u64);
    let brain: JoinHandle<Result<(), ReactorError>> = tokio::spawn(nisse_core::reactor::run(
        brain_bus,
        agent.clone(),
        db.clone(),
        nisse_ops::OpsBrain::new(AGENT, nisse_ops::Config::default()),
        nisse_bus::signing::SigningKey::ephemeral(),
        shutdown.clone(),
        committed,
    ));
    let mut intake_cfg = nisse_intake_alerts::Config {
        listen: "127.0.0.1:0".parse()?,
        agent: AGENT.into(),
        ..Default::default()
    };
    intake_cfg.auth.allow_unauthenticated = true;
    let bound = nisse_intake_alerts::bind(&intake_cfg, intake_bus, &dir.join("data")).await?;
    let webhook = bound.webhook_url();
    let intake = tokio::spawn(bound.serve(shutdown.clone()));

    let tracker = Arc::new(Tracker::new(settings.total_alerts()));
    let cpu_start = cpu_now(server_pid);
    let (progress_tx, progress) = watch::channel((0u64, 0u64));
    let observer = {
        let (runtime, applied, tracker) = (
            tokio::runtime::Handle::current(),
            applied.clone(),
            tracker.clone(),
        );
        std::thread::Builder::new()
            .name("commit-observer".into())
            .spawn(move || observe(runtime, applied, db, tracker, progress_tx))
            .context("starting the observer thread")?
    };

    let starts_at = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .context("formatting startsAt")?;
    let mut bench = Bench {
        tracker,
        progress,
        applied,
        bus,
        agent,
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .context("HTTP client")?,
        webhook,
        starts_at,
        next: 0,
        server_pid,
        admin_seed: credentials
            .map(|c| std::fs::read_to_string(c.seed_file(&Identity::Admin)))
            .transpose()
            .context("reading the admin's seed")?
            .map(|seed| seed.trim().to_string()),
    };

    let outcome = cases(settings, &mut bench).await;
    let cpu_all = cpu_now(server_pid).since(cpu_start);

    shutdown.cancel();
    let stopped = async {
        intake.await.context("the intake task panicked")??;
        brain.await.context("the brain task panicked")??;
        anyhow::Ok(())
    };
    let stopped = tokio::time::timeout(Duration::from_secs(30), stopped)
        .await
        .map_err(|_| anyhow!("the intake and brain did not stop within 30 s"))
        .and_then(|r| r);
    let observed = tokio::task::spawn_blocking(move || observer.join())
        .await
        .context("joining the observer")?
        .map_err(|_| anyhow!("the observer thread panicked"))?;
    // Root causes first: a brain or an observer that stopped also makes the
    // cases fail, with a less telling error.
    stopped.context("the intake or the brain failed")?;
    let observed = observed.context("the commit observer failed")?;
    let mut report = outcome?;
    report.cpu_all = cpu_all;
    ensure!(
        observed.doubles == 0 && observed.strangers == 0,
        "the store holds {} repeated and {} unknown findings",
        observed.doubles,
        observed.strangers
    );
    let store = Store::open_read_only(&Store::path_in(&dir.join("data"), AGENT), AGENT)?;
    let unapplied = store.unapplied()?;
    ensure!(
        unapplied.is_empty(),
        "the brain could not apply {} messages, the first: {:?}",
        unapplied.len(),
        unapplied.first()
    );
    ensure!(
        observed.findings == bench.next,
        "{} alerts posted but {} committed",
        bench.next,
        observed.findings
    );
    report.print(settings, &observed);
    Ok(report.summary())
}

/// Runs every case and gathers the figures.
async fn cases(settings: &Settings, bench: &mut Bench) -> Result<Report> {
    if !settings.full {
        println!("smoke run (no --bench): checks that every case works; its figures mean nothing");
    }
    println!(
        "alerts: {} round(s): sustained {} alerts ({CONNECTIONS} connections x {ALERTS_PER_REQUEST} alerts per request) vs the raw JetStream ceiling, then {} s at each of {:?} alerts/s",
        settings.rounds, settings.alerts, settings.seconds, RATES
    );

    // Warm-up: connections, the brain's consumer, the store, server caches.
    let warm = sustained(bench, settings.warmup).await?;
    settle(bench).await?;
    let mut raw = Raw::new(
        bench.bus.url(),
        bench.admin_seed.as_deref(),
        bench.bus.config().request_timeout,
        &bench.agent,
    )
    .await?;
    ceiling(bench, &mut raw, settings.warmup).await?;
    println!(
        "one AlertReceived as stored: {} bytes, with a {}-byte Nats-Msg-Id",
        raw.payload.len(),
        raw.id_len
    );
    if settings.verbose {
        println!("  warm-up: {:.0} alerts/s", warm.rate);
    }

    let mut report = Report {
        payload: raw.payload.len(),
        ..Report::default()
    };
    let cpu_start = cpu_now(bench.server_pid);
    let run_start = Instant::now();
    for round in 0..settings.rounds {
        let raw_first = round % 2 == 1;
        let (nisse, ceiling) = if raw_first {
            let c = ceiling(bench, &mut raw, settings.alerts).await?;
            let n = sustained(bench, settings.alerts).await?;
            settle(bench).await?;
            (n, c)
        } else {
            let n = sustained(bench, settings.alerts).await?;
            settle(bench).await?;
            let c = ceiling(bench, &mut raw, settings.alerts).await?;
            (n, c)
        };
        if settings.verbose {
            println!(
                "  round {round}: sustained {:>6.0} alerts/s (HTTP {:>6.0}/s, {} wake-ups), raw ceiling {:>6.0} msg/s, ratio {:.3}{}",
                nisse.rate,
                nisse.http_rate,
                nisse.wakeups,
                ceiling.rate,
                nisse.rate / ceiling.rate,
                if raw_first { " (raw first)" } else { "" }
            );
        }
        report.sustained.push(nisse);
        report.ceiling.push(ceiling);

        let rates: Vec<(usize, u32)> = if round % 2 == 0 {
            RATES.iter().copied().enumerate().collect()
        } else {
            RATES.iter().copied().enumerate().rev().collect()
        };
        for (i, rate) in rates {
            let run = fixed_rate(bench, rate, settings.at_rate(rate)).await?;
            settle(bench).await?;
            if settings.verbose {
                println!(
                    "  round {round}: {rate:>4}/s: commit p50 {:.2} p99 {:.2} max {:.2} ms; 200 p50 {:.2} p99 {:.2} ms; send lag max {:.2} ms",
                    ms(percentile(&run.to_commit, 0.50)),
                    ms(percentile(&run.to_commit, 0.99)),
                    ms(percentile(&run.to_commit, 1.0)),
                    ms(percentile(&run.to_answer, 0.50)),
                    ms(percentile(&run.to_answer, 0.99)),
                    ms(run.lag_max),
                );
            }
            report.fixed[i].absorb(rate, run);
        }
    }
    report.cpu = cpu_now(bench.server_pid).since(cpu_start);
    report.elapsed = run_start.elapsed();
    Ok(report)
}

/// Posts one request and stamps its alerts sent and answered.
async fn post(
    client: &reqwest::Client,
    url: &str,
    tracker: &Tracker,
    numbers: &[u64],
    body: Bytes,
) -> Result<()> {
    let sent = tracker.now();
    for &n in numbers {
        Tracker::set(&tracker.sent, n, sent);
    }
    let response = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .context("POST to the webhook")?;
    let status = response.status();
    let text = response.bytes().await.context("reading the answer")?;
    let answered = tracker.now();
    ensure!(
        status == reqwest::StatusCode::OK,
        "the webhook answered {status}: {}",
        String::from_utf8_lossy(&text)
    );
    let answer: serde_json::Value = serde_json::from_slice(&text)?;
    ensure!(
        answer["accepted"] == numbers.len() && answer["duplicates"] == 0,
        "the webhook answered {answer} for {} new alerts",
        numbers.len()
    );
    for &n in numbers {
        Tracker::set(&tracker.answered, n, answered);
    }
    Ok(())
}

/// An Alertmanager v4 webhook body carrying alerts `numbers`, each with its
/// own labels (so its own work item) and fingerprint.
fn webhook_body(numbers: &[u64], starts_at: &str) -> Result<Bytes> {
    let alerts: Vec<serde_json::Value> = numbers
        .iter()
        .map(|n| {
            serde_json::json!({
                "status": "firing",
                "labels": { "alertname": "Bench", "instance": format!("host{n}") },
                "annotations": {},
                "startsAt": starts_at,
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": format!("{n:016x}"),
            })
        })
        .collect();
    let body = serde_json::json!({
        "version": "4",
        "groupKey": "{}:{alertname=\"Bench\"}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "bench",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://am",
        "alerts": alerts,
    });
    Ok(serde_json::to_vec(&body)?.into())
}

/// Takes the next `n` alert numbers.
fn numbers(bench: &mut Bench, n: usize) -> Vec<u64> {
    let first = bench.next;
    bench.next += n as u64;
    (first..bench.next).collect()
}

/// Waits for every sender to finish, within [`CASE_TIMEOUT`].
async fn all_answered(senders: &mut tokio::task::JoinSet<Result<()>>, what: &str) -> Result<()> {
    let sending = async {
        while let Some(done) = senders.join_next().await {
            done.context("a sender panicked")??;
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(CASE_TIMEOUT, sending)
        .await
        .map_err(|_| anyhow!("{what} took longer than {CASE_TIMEOUT:?}"))?
}

/// Waits until `target` alerts in all have been seen committed.
async fn committed(bench: &Bench, target: u64) -> Result<()> {
    let mut progress = bench.progress.clone();
    let waited = tokio::time::timeout(CASE_TIMEOUT, async {
        progress.wait_for(|c| c.0 >= target).await.map(|_| ())
    })
    .await;
    match waited {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(anyhow!(
            "the commit observer stopped: the brain stopped or reading its store failed"
        )),
        Err(_) => Err(anyhow!(
            "only {} of {target} alerts committed after {CASE_TIMEOUT:?}",
            bench.progress.borrow().0
        )),
    }
}

/// Waits until the brain is idle: every input in its stream applied and
/// acked, and its outputs published (the stream stopped growing), so the
/// next case starts clean.
async fn settle(bench: &Bench) -> Result<()> {
    let deadline = Instant::now() + CASE_TIMEOUT;
    let mut stream = bench
        .bus
        .jetstream()
        .get_stream(bench.agent.stream())
        .await?;
    let mut before = 0;
    let alerts = bench.agent.subject(SubjectKind::InAlert);
    loop {
        let last = stream.info().await?.state.last_sequence;
        let info = stream.consumer_info(ConsumerSpec::BRAIN.name).await?;
        // The brain's inputs here are the alerts: the last one is where it
        // stands when it has applied everything.
        let last_input = bench
            .bus
            .last_on_subject(&bench.agent, &alerts)
            .await?
            .map_or(0, |m| m.sequence);
        let quiet = std::mem::replace(&mut before, last) == last;
        if info.num_pending == 0
            && info.num_ack_pending == 0
            && *bench.applied.borrow() == last_input
            && quiet
        {
            ensure!(
                info.num_redelivered == 0,
                "the brain's consumer redelivered {} messages",
                info.num_redelivered
            );
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the brain did not settle: {} pending, {} unacked, applied {} of {last}",
            info.num_pending,
            info.num_ack_pending,
            *bench.applied.borrow()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------
// The cases.

/// One sustained or ceiling run.
#[derive(Clone, Copy, Default)]
struct Throughput {
    /// Alerts (or messages) per second, first POST (publish) to last commit
    /// (ack).
    rate: f64,
    /// Alerts per second, first POST to last HTTP 200 (sustained only).
    http_rate: f64,
    /// CPU µs per alert of the bench process and of the server.
    cpu_client: f64,
    cpu_server: f64,
    /// Observer wake-ups during the case (sustained only).
    wakeups: u64,
}

/// Posts `n` alerts through `CONNECTIONS` connections, `ALERTS_PER_REQUEST`
/// per request, as fast as they are answered.
async fn sustained(bench: &mut Bench, n: usize) -> Result<Throughput> {
    let numbers = numbers(bench, n);
    let requests: Vec<(Vec<u64>, Bytes)> = numbers
        .chunks(ALERTS_PER_REQUEST)
        .map(|c| Ok((c.to_vec(), webhook_body(c, &bench.starts_at)?)))
        .collect::<Result<_>>()?;
    let requests = Arc::new(requests);
    let taken = Arc::new(AtomicUsize::new(0));
    let wakeups_before = wakeups(bench);
    let cpu_before = cpu_now(bench.server_pid);
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..CONNECTIONS {
        let (requests, taken, tracker, client, url) = (
            requests.clone(),
            taken.clone(),
            bench.tracker.clone(),
            bench.http.clone(),
            bench.webhook.clone(),
        );
        senders.spawn(async move {
            while let Some((numbers, body)) = requests.get(taken.fetch_add(1, Ordering::Relaxed)) {
                post(&client, &url, &tracker, numbers, body.clone()).await?;
            }
            anyhow::Ok(())
        });
    }
    all_answered(&mut senders, &format!("posting {n} alerts")).await?;
    committed(bench, bench.next).await?;
    let cpu = cpu_now(bench.server_pid).since(cpu_before);
    let t = &bench.tracker;
    let first = numbers
        .iter()
        .map(|&a| Tracker::get(&t.sent, a))
        .min()
        .unwrap_or(0);
    let last_commit = numbers
        .iter()
        .map(|&a| Tracker::get(&t.committed, a))
        .max()
        .unwrap_or(0);
    let last_answer = numbers
        .iter()
        .map(|&a| Tracker::get(&t.answered, a))
        .max()
        .unwrap_or(0);
    let per_second = |end: u64| n as f64 / (end.saturating_sub(first).max(1) as f64 / 1e9);
    Ok(Throughput {
        rate: per_second(last_commit),
        http_rate: per_second(last_answer),
        cpu_client: cpu.client_ns as f64 / 1e3 / n as f64,
        cpu_server: cpu.server_ns as f64 / 1e3 / n as f64,
        wakeups: wakeups(bench).saturating_sub(wakeups_before),
    })
}

/// Observer wake-ups so far: at most one per commit, fewer when commits
/// come faster than it wakes.
fn wakeups(bench: &Bench) -> u64 {
    bench.progress.borrow().1
}

/// One fixed-rate run: latencies of every alert.
#[derive(Default)]
struct FixedRun {
    to_commit: Vec<Duration>,
    to_answer: Vec<Duration>,
    lag_max: Duration,
    achieved: f64,
}

/// Posts `n` alerts, one per request, `rate` per second on schedule, each
/// request on its own task so none waits for an earlier one.
async fn fixed_rate(bench: &mut Bench, rate: u32, n: usize) -> Result<FixedRun> {
    let numbers = numbers(bench, n);
    let bodies: Vec<Bytes> = numbers
        .iter()
        .map(|a| webhook_body(std::slice::from_ref(a), &bench.starts_at))
        .collect::<Result<_>>()?;
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = tokio::time::Instant::now() + Duration::from_millis(5);
    let mut senders = tokio::task::JoinSet::new();
    let mut lag_max = Duration::ZERO;
    for (i, (&a, body)) in numbers.iter().zip(bodies).enumerate() {
        let due = start + interval.saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
        tokio::time::sleep_until(due).await;
        lag_max = lag_max.max(tokio::time::Instant::now().saturating_duration_since(due));
        let (tracker, client, url) = (
            bench.tracker.clone(),
            bench.http.clone(),
            bench.webhook.clone(),
        );
        senders.spawn(async move { post(&client, &url, &tracker, &[a], body).await });
        while let Some(done) = senders.try_join_next() {
            done.context("a sender panicked")??;
        }
    }
    all_answered(&mut senders, &format!("answers to {n} alerts")).await?;
    committed(bench, bench.next).await?;
    let t = &bench.tracker;
    let since = |slots: &[AtomicU64], a: u64| {
        Duration::from_nanos(Tracker::get(slots, a).saturating_sub(Tracker::get(&t.sent, a)))
    };
    let first = numbers.first().map_or(0, |&a| Tracker::get(&t.sent, a));
    let last = numbers.last().map_or(0, |&a| Tracker::get(&t.sent, a));
    Ok(FixedRun {
        to_commit: numbers.iter().map(|&a| since(&t.committed, a)).collect(),
        to_answer: numbers.iter().map(|&a| since(&t.answered, a)).collect(),
        lag_max,
        achieved: (n.saturating_sub(1)) as f64 / (last.saturating_sub(first).max(1) as f64 / 1e9),
    })
}

/// The ceiling, as the report reads it.
async fn ceiling(bench: &Bench, raw: &mut Raw, n: usize) -> Result<Throughput> {
    let run = raw.ceiling(n, bench.server_pid).await?;
    Ok(Throughput {
        rate: run.rate,
        cpu_client: run.cpu_client,
        cpu_server: run.cpu_server,
        ..Throughput::default()
    })
}

// ---------------------------------------------------------------------------
// The report.

/// Every latency at one fixed rate, over all rounds.
#[derive(Default)]
struct Fixed {
    rate: u32,
    to_commit: Vec<Duration>,
    to_answer: Vec<Duration>,
    lag_max: Duration,
    achieved: Vec<f64>,
    /// Each round's p99 to commit.
    round_p99: Vec<Duration>,
}

impl Fixed {
    fn absorb(&mut self, rate: u32, run: FixedRun) {
        self.rate = rate;
        self.round_p99.push(percentile(&run.to_commit, 0.99));
        self.to_commit.extend(run.to_commit);
        self.to_answer.extend(run.to_answer);
        self.lag_max = self.lag_max.max(run.lag_max);
        self.achieved.push(run.achieved);
    }
}

#[derive(Default)]
struct Report {
    payload: usize,
    sustained: Vec<Throughput>,
    ceiling: Vec<Throughput>,
    fixed: [Fixed; 2],
    /// CPU during the rounds.
    cpu: Cpu,
    /// CPU from the observer's start to the end.
    cpu_all: Cpu,
    elapsed: Duration,
}

impl Report {
    fn summary(&self) -> Summary {
        let med =
            |v: &[Throughput], get: fn(&Throughput) -> f64| median(v.iter().map(get).collect());
        let alerts = med(&self.sustained, |t| t.rate);
        Summary {
            alerts,
            ratio: alerts / med(&self.ceiling, |t| t.rate),
            cpu_client: med(&self.sustained, |t| t.cpu_client),
            cpu_server: med(&self.sustained, |t| t.cpu_server),
            p99_slow: ms(percentile(&self.fixed[0].to_commit, 0.99)),
        }
    }

    fn print(&self, settings: &Settings, observed: &Observed) {
        let med =
            |v: &[Throughput], get: fn(&Throughput) -> f64| median(v.iter().map(get).collect());
        let nisse = med(&self.sustained, |t| t.rate);
        let raw = med(&self.ceiling, |t| t.rate);
        let ratios: Vec<f64> = self
            .sustained
            .iter()
            .zip(&self.ceiling)
            .map(|(n, r)| n.rate / r.rate)
            .collect();
        let ratio = nisse / raw;
        println!();
        println!(
            "Sustained throughput, median over {} round(s) of {} alerts ({} bytes per AlertReceived):",
            self.sustained.len(),
            settings.alerts,
            self.payload
        );
        println!();
        println!("| Metric | nisse (webhook to commit) | raw JetStream ceiling | nisse/raw |");
        println!("|---|---:|---:|---:|");
        println!(
            "| alerts/s (msg/s for raw) | {:.0} | {raw:.0} | {ratio:.3} |",
            nisse
        );
        println!(
            "| alerts/s to the last HTTP 200 | {:.0} | | |",
            med(&self.sustained, |t| t.http_rate)
        );
        println!(
            "| CPU per alert, bench process (µs) | {:.0} | {:.1} | |",
            med(&self.sustained, |t| t.cpu_client),
            med(&self.ceiling, |t| t.cpu_client)
        );
        println!(
            "| CPU per alert, nats-server (µs) | {:.0} | {:.1} | |",
            med(&self.sustained, |t| t.cpu_server),
            med(&self.ceiling, |t| t.cpu_server)
        );
        let rounds: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
        println!();
        println!("per-round ratios nisse/raw: {}", rounds.join(", "));

        println!();
        println!(
            "Fixed rate, one alert per request, open loop, {} s per rate and round; latency from just before the POST, percentiles over every alert of every round (ms):",
            settings.seconds
        );
        println!();
        println!(
            "| Rate (alerts/s) | Alerts | to commit p50 | p90 | p99 | max | to HTTP 200 p50 | p90 | p99 | max | rate sent | worst send lag |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for f in &self.fixed {
            println!(
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.2} |",
                f.rate,
                f.to_commit.len(),
                ms(percentile(&f.to_commit, 0.50)),
                ms(percentile(&f.to_commit, 0.90)),
                ms(percentile(&f.to_commit, 0.99)),
                ms(percentile(&f.to_commit, 1.0)),
                ms(percentile(&f.to_answer, 0.50)),
                ms(percentile(&f.to_answer, 0.90)),
                ms(percentile(&f.to_answer, 0.99)),
                ms(percentile(&f.to_answer, 1.0)),
                median(f.achieved.clone()),
                ms(f.lag_max),
            );
        }
        println!();
        for f in &self.fixed {
            let rounds: Vec<String> = f
                .round_p99
                .iter()
                .map(|d| format!("{:.2}", ms(*d)))
                .collect();
            println!(
                "p99 to commit at {} alerts/s, round by round (ms): {}",
                f.rate,
                rounds.join(", ")
            );
        }

        println!();
        let client_cpu = self.cpu_all.client_ns.max(1) as f64;
        println!(
            "observer: {} wake-ups, {:.0} ms CPU in all ({:.1} µs per wake-up, {:.2}% of the bench process's CPU), {:.1} µs reading per wake-up",
            observed.wakeups,
            observed.cpu_ns as f64 / 1e6,
            observed.cpu_ns as f64 / 1e3 / observed.wakeups.max(1) as f64,
            observed.cpu_ns as f64 / client_cpu * 100.0,
            observed.reading.as_secs_f64() * 1e6 / observed.wakeups.max(1) as f64,
        );
        println!(
            "rounds took {:.1} s; CPU during them: bench process {:.1} s, nats-server {:.1} s",
            self.elapsed.as_secs_f64(),
            self.cpu.client_ns as f64 / 1e9,
            self.cpu.server_ns as f64 / 1e9
        );
        if !settings.full {
            return;
        }

        println!();
        let ratio_ok = ratio >= RATIO_TARGET;
        println!(
            "sustained: {nisse:.0} alerts/s is {ratio:.3} of the raw JetStream ceiling of {raw:.0} msg/s (target at least {RATIO_TARGET:.2}): {}",
            if ratio_ok { "met" } else { "NOT met" }
        );
        let slow = &self.fixed[0];
        let p99 = ms(percentile(&slow.to_commit, 0.99));
        let p99_ok = p99 < P99_TARGET_MS;
        println!(
            "latency at {} alerts/s: p99 webhook POST to commit {p99:.2} ms (target under {P99_TARGET_MS} ms): {}",
            slow.rate,
            if p99_ok { "met" } else { "NOT met" }
        );
        println!(
            "targets: {}",
            if ratio_ok && p99_ok { "met" } else { "NOT met" }
        );
    }
}
