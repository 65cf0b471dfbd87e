//! `cargo bench -p nisse --bench duties`: 1,000 duties due every second on
//! one agent, run by the release `nisse` binary as users run it, with raw
//! JetStream publishes of the same messages measured on the same server in
//! the same run as the baseline.
//!
//! One `nats-server -js` is started in a temporary directory with the
//! authorization `nisse up` generates (every process connects as its own
//! identity, with only its permissions), the topology is ensured with the
//! default settings, and a `nisse.toml` is written with `[scheduler] tick =
//! "1s"`, no starter duties, and N (default 1,000) `[[ops.duty]]` TCP
//! checks at 1 s, each to one of 8 loopback listeners of this process that
//! accept and drop every connection, so each check is real and cheap.
//! Then `nisse serve brain`, `nisse serve prober` and `nisse serve
//! scheduler` run as three processes, each logging JSON at info to its own
//! file, as a supervisor would run them.
//!
//! Per round, after a warm-up, a window (default 30 s) is measured:
//! - the DutyDue messages stored in it (from the stream), and the CPU of
//!   every process (Linux's per-thread schedstat, as the other benches), so
//!   the scheduler's CPU per due message and each process's share of the
//!   machine (CPU seconds / (window × cores));
//! - the brain's applied inputs per second (its store's applied sequence,
//!   read-only, against the stream's `in.*` messages) and its lag at the
//!   end (its consumer's pending and unacked messages);
//! - for each DutyDue of the window, the time from its due instant (in the
//!   message) to the ProbeRequest it caused being stored (stream
//!   timestamps, matched by the request's causation id), split into due →
//!   DutyDue stored (the scheduler) and DutyDue → ProbeRequest stored (the
//!   brain).
//!
//! After the window the scheduler is stopped, the brain and prober are
//! left to drain, then stopped. The baseline is raw `async-nats`: as many
//! messages as the window's due messages, each the size of a stored
//! DutyDue with its headers, published with up to 256 acks outstanding to
//! a stream configured as the agent's, on the same server, with no `nisse`
//! process running. Rounds alternate whether it comes before or after the
//! `nisse` window; the first round measures `nisse` first, since the
//! baseline's payload is a stored DutyDue.
//!
//! Without `--bench` (as under `cargo test --benches`) it runs one small
//! round (20 duties, a 2 s window) that checks every part works; its
//! figures mean nothing.
//!
//! Environment: `NISSE_BENCH_DUTIES_COUNT` (duties, default 1000),
//! `NISSE_BENCH_DUTIES_SECONDS` (window per round, default 30),
//! `NISSE_BENCH_DUTIES_WARMUP` (seconds, default 10),
//! `NISSE_BENCH_DUTIES_ROUNDS` (default 3), `NISSE_BENCH_NATS_SERVER` (the
//! `nats-server` to run, default the one on `PATH`), `NISSE_BENCH_VERBOSE`
//! (every second of every window).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

#[path = "../../../bus/benches/support/cpu.rs"]
mod cpu;
#[path = "../../../bus/benches/support/stats.rs"]
mod stats;
use cpu::cpu_now;
use stats::{median, ms, percentile};
#[path = "../../../bus/benches/support/env.rs"]
mod env;
#[path = "support/serve.rs"]
mod serve;
use env::env_or;
use serve::{Proc, log_tail};

use nisse_bus::auth::{Credentials, Identity, server_authorization};
use nisse_bus::embedded::{EmbeddedOptions, EmbeddedServer, SyncInterval};
use nisse_bus::{AgentName, AnyMessage, Bus, BusConfig, ConsumerSpec, StoredMessage, SubjectKind};
use nisse_core::Store;

/// The agent the duties belong to.
const AGENT: &str = "ops";
/// The baseline's stream; its subjects start with a word as long as
/// `nisse`, so they are as long as the DutyDue subjects.
const RAW_STREAM: &str = "RAW_DUTIES";
const RAW_PREFIX: &str = "bench";
/// Outstanding publish acks of the baseline's publisher.
const PUBLISH_WINDOW: usize = 256;
/// Loopback listeners the checks connect to: spread over several ports so
/// 1,000 connections a second never run short of source ports.
const LISTENERS: usize = 8;
/// Longest the brain and prober may take to drain after the scheduler
/// stops before the round goes on without them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest a `nisse serve` may take to stop on SIGTERM.
/// How often the window looks at the stream and the brain's store.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// The services, in the order they are started.
const SERVICES: [&str; 3] = ["brain", "prober", "scheduler"];

/// What to run.
struct Settings {
    full: bool,
    duties: usize,
    seconds: f64,
    warmup: f64,
    rounds: usize,
    verbose: bool,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let full = std::env::args().any(|a| a == "--bench");
        let duties: usize = env_or("NISSE_BENCH_DUTIES_COUNT", if full { 1000 } else { 20 })?;
        let seconds: f64 = env_or("NISSE_BENCH_DUTIES_SECONDS", if full { 30.0 } else { 2.0 })?;
        let warmup: f64 = env_or("NISSE_BENCH_DUTIES_WARMUP", if full { 10.0 } else { 1.0 })?;
        let rounds: usize = env_or("NISSE_BENCH_DUTIES_ROUNDS", if full { 3 } else { 1 })?;
        ensure!(
            duties >= 1 && seconds >= 1.0 && warmup >= 0.0 && rounds >= 1,
            "NISSE_BENCH_DUTIES_COUNT and _ROUNDS must be at least 1, _SECONDS at least 1 and _WARMUP not negative"
        );
        ensure!(
            duties <= 99_999,
            "NISSE_BENCH_DUTIES_COUNT is at most 99999 (duty names are d00000 to d99999)"
        );
        Ok(Self {
            full,
            duties,
            seconds,
            warmup,
            rounds,
            verbose: std::env::var_os("NISSE_BENCH_VERBOSE").is_some(),
        })
    }

    /// The duties' names: as long as each other, so every DutyDue has the
    /// same size.
    fn names(&self) -> Vec<String> {
        (0..self.duties).map(|i| format!("d{i:05}")).collect()
    }
}

fn main() -> Result<()> {
    let settings = Settings::from_env()?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?
        .block_on(run(settings))
}

async fn run(settings: Settings) -> Result<()> {
    let dir = tempfile::tempdir().context("temporary directory")?;
    let data = dir.path().join("data");
    let credentials = Credentials::in_data_dir(&data);
    let mut options = EmbeddedOptions::in_dir(&dir.path().join("nats"));
    if let Some(program) = std::env::var_os("NISSE_BENCH_NATS_SERVER") {
        options.program = program.into();
    }
    // What `nisse up` runs (`embedded.sync-interval = "always"`); a server
    // older than 2.10 keeps its own interval and the summary says so.
    options.sync = SyncInterval::Always;
    options.authorization = Some(server_authorization(
        &nisse_tests::local_plan(&[AGENT], &[])?,
        &credentials,
    )?);
    let server = EmbeddedServer::start(options)
        .await
        .context("the bench needs `nats-server` (Debian package `nats-server`, in /usr/sbin)")?;
    let synced =
        std::fs::read_to_string(dir.path().join("nats").join("run").join("nats-server.conf"))
            .unwrap_or_default()
            .contains("sync_interval: always");
    let outcome = measure(&settings, &server, dir.path(), &data, &credentials, synced).await;
    server.stop(Duration::from_secs(10)).await?;
    outcome
}

// ---------------------------------------------------------------------------
// The install and its processes.

/// Writes the install's `nisse.toml`: the bus, the data directory whose
/// credentials the server accepts, a 1 s clock and one TCP duty at 1 s
/// per name, spread over the listeners' ports.
fn write_config(
    install: &Path,
    data: &Path,
    url: &str,
    names: &[String],
    ports: &[u16],
) -> Result<()> {
    let mut text = format!(
        "data-dir = {data:?}\n\
         [bus]\nurl = {url:?}\n\
         [scheduler]\ntick = \"1s\"\n\
         [ops]\nstarter-duties = false\n"
    );
    for (i, name) in names.iter().enumerate() {
        let port = ports[i % ports.len()];
        text.push_str(&format!(
            "[[ops.duty]]\nname = {name:?}\nkind = \"tcp\"\nhost = \"127.0.0.1\"\nport = {port}\ninterval = \"1s\"\n"
        ));
    }
    std::fs::write(install.join("nisse.toml"), text).context("writing nisse.toml")
}

/// Loopback listeners that accept every connection and drop it; counts
/// the connections.
async fn listeners(accepted: Arc<AtomicU64>) -> Result<Vec<u16>> {
    let mut ports = Vec::new();
    for _ in 0..LISTENERS {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        ports.push(listener.local_addr()?.port());
        let accepted = accepted.clone();
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        drop(stream);
                        accepted.fetch_add(1, Ordering::Relaxed);
                    }
                    // Out of descriptors, for instance: the check fails
                    // and says so; the listener goes on.
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        });
    }
    Ok(ports)
}

// ---------------------------------------------------------------------------
// Measuring.

/// Everything a round needs.
struct Bench<'a> {
    settings: &'a Settings,
    bus: Bus,
    agent: AgentName,
    install: PathBuf,
    db: PathBuf,
    nats_pid: Option<u32>,
    accepted: Arc<AtomicU64>,
    admin_seed: String,
    names: Vec<String>,
}

async fn measure(
    settings: &Settings,
    server: &EmbeddedServer,
    dir: &Path,
    data: &Path,
    credentials: &Credentials,
    synced: bool,
) -> Result<()> {
    let agent: AgentName = AGENT.parse()?;
    let cfg = BusConfig {
        url: Some(server.url().to_string()),
        ..BusConfig::default()
    };
    let bus = Bus::connect_as(&cfg, vec![agent.clone()], &Identity::Admin, credentials).await?;
    bus.ensure_topology().await?;
    let accepted = Arc::new(AtomicU64::new(0));
    let ports = listeners(accepted.clone()).await?;
    let install = dir.join("install");
    std::fs::create_dir_all(&install)?;
    let names = settings.names();
    write_config(&install, data, server.url(), &names, &ports)?;
    let admin_seed = std::fs::read_to_string(credentials.seed_file(&Identity::Admin))
        .context("reading the admin's seed")?
        .trim()
        .to_string();
    let bench = Bench {
        settings,
        bus,
        agent,
        install,
        db: Store::path_in(data, AGENT),
        nats_pid: server.pid(),
        accepted,
        admin_seed,
        names,
    };

    if !settings.full {
        println!("smoke run (no --bench): checks that every part works; its figures mean nothing");
    }
    println!(
        "duties: {} round(s): {} TCP duties at 1 s, tick 1 s, {} s warm-up and a {} s window per round; nats-server fsync: {}",
        settings.rounds,
        settings.duties,
        settings.warmup,
        settings.seconds,
        if synced {
            "always"
        } else {
            "its own interval (this server cannot sync always; 2.10+ can)"
        }
    );

    let mut rounds = Vec::new();
    let mut baselines = Vec::new();
    let mut raw: Option<Raw> = None;
    let expected = (settings.duties as f64 * settings.seconds).round() as usize;
    for round in 0..settings.rounds {
        // The first round goes first: the baseline copies a stored DutyDue.
        let raw_first = round % 2 == 1;
        if raw_first && let Some(raw) = raw.as_mut() {
            baselines.push(baseline(&bench, raw, expected).await?);
        }
        let measured = nisse_round(&bench, round).await?;
        if raw.is_none() {
            raw = Some(raw_side(&bench, &measured.sample).await?);
        }
        if !raw_first && let Some(raw) = raw.as_mut() {
            baselines.push(baseline(&bench, raw, expected).await?);
        }
        let base = baselines.last().copied().unwrap_or_default();
        println!(
            "  round {round}: {} due in {:.1} s ({:.0}/s), brain applied {:.0} inputs/s, lag at the end {}, due → request p99 {:.1} ms; raw {:.0} msg/s{}",
            measured.due,
            measured.window,
            measured.due as f64 / measured.window,
            measured.applied as f64 / measured.window,
            measured.lag_end,
            ms(percentile(&measured.to_request, 0.99)),
            base.rate,
            if raw_first { " (raw first)" } else { "" }
        );
        rounds.push(measured);
    }
    let stored_as = raw.as_ref().map_or_else(String::new, |r| {
        let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
        format!(
            "{} bytes, a {}-byte Nats-Msg-Id and {}",
            r.payload.len(),
            r.id_len,
            names.join(", ")
        )
    });
    report(settings, &rounds, &baselines, &stored_as);
    Ok(())
}

/// One round's measurements.
struct Round {
    /// The window's length, s.
    window: f64,
    /// DutyDue messages stored in the window.
    due: u64,
    /// Of them, ones standing for more than one instant (`missed` > 0).
    due_missed: u64,
    /// Seconds (due instants) of the window with fewer DutyDue than duties.
    short_instants: u64,
    /// Brain inputs (`in.*`) stored in the window, and applied in it.
    inputs: u64,
    applied: u64,
    /// Every message stored in the window, and the probe requests and
    /// results among them.
    stored: u64,
    requests: u64,
    results: u64,
    unhealthy: u64,
    /// The brain's consumer's pending + unacked messages at the end.
    lag_end: u64,
    /// The most inputs stored but not yet applied at a look (every
    /// [`SAMPLE_EVERY`]).
    lag_max: u64,
    /// From each window DutyDue's due instant: to the DutyDue stored, to
    /// its ProbeRequest stored; and DutyDue stored to ProbeRequest stored.
    to_due_stored: Vec<Duration>,
    to_request: Vec<Duration>,
    brain_part: Vec<Duration>,
    /// Window DutyDue messages that caused no ProbeRequest (by the end of
    /// the drain).
    no_request: u64,
    /// CPU ns in the window: scheduler, brain, prober, nats-server, this
    /// process (the listeners), and the machine's busy share.
    cpu: [u64; 3],
    nats_cpu: u64,
    bench_cpu: u64,
    machine_busy: f64,
    /// Log bytes and lines each service wrote in the window.
    log_bytes: [u64; 3],
    log_lines: [u64; 3],
    /// WARN and ERROR lines each service logged in the whole round, and
    /// the first few of them.
    warnings: [u64; 3],
    warning_samples: Vec<String>,
    /// Connections the listeners accepted in the window.
    accepted: u64,
    /// Seconds from stopping the scheduler to the brain and prober idle
    /// (`None`: they did not drain within DRAIN_TIMEOUT).
    drain: Option<f64>,
    /// A DutyDue as stored, for the baseline.
    sample: Option<StoredMessage>,
}

async fn nisse_round(bench: &Bench<'_>, round: usize) -> Result<Round> {
    let settings = bench.settings;
    let agent = &bench.agent;
    let start_seq = bench.bus.stream_bounds(agent).await?.last;
    let mut procs = Vec::new();
    for service in SERVICES {
        procs.push(Proc::spawn(&bench.install, service, round)?);
    }

    // Running: a probe result stored since the start, then the warm-up.
    let results_subject = agent.subject(SubjectKind::ProbeResult);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for p in &mut procs {
            p.check_alive()?;
        }
        let last = bench
            .bus
            .last_on_subject(agent, &results_subject)
            .await?
            .map_or(0, |m| m.sequence);
        if last > start_seq {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no probe result within 60 s of starting the services; scheduler log:\n{}",
            log_tail(&procs[2].log)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let warm_until = Instant::now() + Duration::from_secs_f64(settings.warmup);
    while Instant::now() < warm_until {
        for p in &mut procs {
            p.check_alive()?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let store = Store::open_read_only(&bench.db, AGENT).context("opening the brain's store")?;
    let inputs_prefix = ConsumerSpec::BRAIN
        .filter_subject(agent)
        .trim_end_matches('>')
        .to_string();

    // The window.
    let cpu_of =
        |procs: &[Proc]| -> [u64; 3] { [0, 1, 2].map(|i| cpu_now(Some(procs[i].pid)).server_ns) };
    let logs_of = |procs: &[Proc]| -> [u64; 3] { [0, 1, 2].map(|i| procs[i].log_len()) };
    let cpu0 = cpu_of(&procs);
    let host0 = cpu_now(bench.nats_pid);
    let machine0 = machine_ticks()?;
    let logs0 = logs_of(&procs);
    let accepted0 = bench.accepted.load(Ordering::Relaxed);
    let s0 = bench.bus.stream_bounds(agent).await?.last;
    let a0 = store.applied_sequence()?;
    let t0 = Instant::now();
    let wall0 = now_ns();
    // A look every 100 ms: each second's due instant is a burst, and a
    // look once a second would always fall in the same part of it.
    let mut samples = Vec::new();
    let end = t0 + Duration::from_secs_f64(settings.seconds);
    let mut looks = 0u64;
    loop {
        looks += 1;
        let next = (t0 + SAMPLE_EVERY.saturating_mul(looks as u32)).min(end);
        tokio::time::sleep_until(next.into()).await;
        if looks.is_multiple_of(10) {
            for p in &mut procs {
                p.check_alive()?;
            }
        }
        if Instant::now() >= end {
            break;
        }
        let last = bench.bus.stream_bounds(agent).await?.last;
        samples.push((t0.elapsed(), last, store.applied_sequence()?));
    }
    for p in &mut procs {
        p.check_alive()?;
    }
    let s1 = bench.bus.stream_bounds(agent).await?.last;
    let a1 = store.applied_sequence()?;
    let window = t0.elapsed().as_secs_f64();
    let wall1 = now_ns();
    let cpu1 = cpu_of(&procs);
    let host1 = cpu_now(bench.nats_pid);
    let machine1 = machine_ticks()?;
    let logs1 = logs_of(&procs);
    let accepted = bench.accepted.load(Ordering::Relaxed) - accepted0;
    let stream = bench.bus.jetstream().get_stream(agent.stream()).await?;
    let brain = stream.consumer_info(ConsumerSpec::BRAIN.name).await?;
    let lag_end = brain.num_pending + brain.num_ack_pending as u64;

    // Stop the clock, let the brain and the prober finish what it caused.
    let mut procs = procs.into_iter();
    let (Some(brain_proc), Some(prober), Some(scheduler)) =
        (procs.next(), procs.next(), procs.next())
    else {
        bail!("three services were started");
    };
    let logs = [
        brain_proc.log.clone(),
        prober.log.clone(),
        scheduler.log.clone(),
    ];
    scheduler.stop(false).await?;
    let stopped = Instant::now();
    let drain = drained(bench)
        .await?
        .then(|| stopped.elapsed().as_secs_f64());
    brain_proc.stop(false).await?;
    prober.stop(false).await?;

    let seen = read_stream(bench, s0.min(a0) + 1, s0, s1, a0, a1, &inputs_prefix).await?;
    let lag_max = samples
        .iter()
        .map(|&(_, last, applied)| seen.inputs_between(applied, last))
        .max()
        .unwrap_or(0);
    if settings.verbose {
        let mut before = (Duration::ZERO, s0, a0);
        for &(at, last, applied) in samples.iter().skip(9).step_by(10) {
            let dt = (at - before.0).as_secs_f64();
            println!(
                "    {:>5.1} s: {:>6.0} stored/s, {:>6.0} inputs applied/s, {} inputs behind",
                at.as_secs_f64(),
                (last - before.1) as f64 / dt,
                seen.inputs_between(before.2, applied) as f64 / dt,
                seen.inputs_between(applied, last)
            );
            before = (at, last, applied);
        }
    }

    // Latency of every DutyDue of the window; instants by due second.
    let mut to_due_stored = Vec::new();
    let mut to_request = Vec::new();
    let mut brain_part = Vec::new();
    let mut no_request = 0;
    let mut per_instant: HashMap<i128, u64> = HashMap::new();
    for due in seen
        .dues
        .iter()
        .filter(|d| d.sequence > s0 && d.sequence <= s1)
    {
        to_due_stored.push(span(due.due_ns, due.stored_ns));
        *per_instant.entry(due.due_ns).or_default() += 1;
        match seen.requests.get(&due.message_id) {
            Some(&requested) => {
                to_request.push(span(due.due_ns, requested));
                brain_part.push(span(due.stored_ns, requested));
            }
            None => no_request += 1,
        }
    }
    // Only instants wholly inside the window: the first and last may be
    // cut by its edges.
    let short_instants = per_instant
        .iter()
        .filter(|&(&due, &n)| {
            due > wall0 + 1_000_000_000
                && due + 2_000_000_000 < wall1
                && n < bench.names.len() as u64
        })
        .count() as u64;

    let (warnings, warning_samples) = warnings(&logs);
    let busy = machine1.since(machine0);
    let host = host1.since(host0);
    Ok(Round {
        window,
        due: seen.window_dues,
        due_missed: seen.window_missed,
        short_instants,
        inputs: seen.inputs_between(s0, s1),
        applied: seen.inputs_between(a0, a1),
        stored: s1 - s0,
        requests: seen.window_requests,
        results: seen.window_results,
        unhealthy: seen.window_unhealthy,
        lag_end,
        lag_max,
        to_due_stored,
        to_request,
        brain_part,
        no_request,
        cpu: [0, 1, 2].map(|i| cpu1[i].saturating_sub(cpu0[i])),
        nats_cpu: host.server_ns,
        bench_cpu: host.client_ns,
        machine_busy: busy.busy as f64 / busy.total.max(1) as f64,
        log_bytes: [0, 1, 2].map(|i| logs1[i].saturating_sub(logs0[i])),
        log_lines: [0, 1, 2].map(|i| lines_between(&logs[i], logs0[i], logs1[i])),
        warnings,
        warning_samples,
        accepted,
        drain,
        sample: seen.sample,
    })
}

/// Waits until the brain and the prober have nothing pending or unacked
/// and the stream has stopped growing; `false` if that took longer than
/// [`DRAIN_TIMEOUT`].
async fn drained(bench: &Bench<'_>) -> Result<bool> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let mut stream = bench
        .bus
        .jetstream()
        .get_stream(bench.agent.stream())
        .await?;
    let mut before = 0;
    loop {
        let last = stream.info().await?.state.last_sequence;
        let mut idle = std::mem::replace(&mut before, last) == last;
        for name in [ConsumerSpec::BRAIN.name, ConsumerSpec::PROBER.name] {
            let info = stream.consumer_info(name).await?;
            idle &= info.num_pending == 0 && info.num_ack_pending == 0;
        }
        if idle {
            return Ok(true);
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A DutyDue as stored.
struct Due {
    sequence: u64,
    message_id: String,
    due_ns: i128,
    stored_ns: i128,
}

/// What the stream holds from a round.
#[derive(Default)]
struct Seen {
    dues: Vec<Due>,
    /// Each ProbeRequest's store time, by its causation id.
    requests: HashMap<String, i128>,
    /// Sequences of the brain's inputs (`in.*`), ascending.
    inputs: Vec<u64>,
    window_dues: u64,
    window_missed: u64,
    window_requests: u64,
    window_results: u64,
    window_unhealthy: u64,
    sample: Option<StoredMessage>,
}

impl Seen {
    /// Inputs with a sequence in `(after, upto]`.
    fn inputs_between(&self, after: u64, upto: u64) -> u64 {
        let lo = self.inputs.partition_point(|&s| s <= after);
        let hi = self.inputs.partition_point(|&s| s <= upto);
        hi.saturating_sub(lo) as u64
    }
}

/// Reads the stream from `from` to its end: every DutyDue, every
/// ProbeRequest's cause and store time, the inputs' sequences, and the
/// counts of the window `(s0, s1]`.
async fn read_stream(
    bench: &Bench<'_>,
    from: u64,
    s0: u64,
    s1: u64,
    a0: u64,
    a1: u64,
    inputs_prefix: &str,
) -> Result<Seen> {
    let mut seen = Seen::default();
    let mut reader = bench.bus.read_range(&bench.agent, from, None).await?;
    let mut unreadable = 0u64;
    while let Some(msg) = reader.next().await {
        let msg = msg?;
        let seq = msg.sequence;
        let in_window = seq > s0 && seq <= s1;
        if msg.subject.starts_with(inputs_prefix) {
            seen.inputs.push(seq);
        }
        let stored_ns = msg.stored_at.unix_timestamp_nanos();
        match msg.decode() {
            Ok(AnyMessage::DutyDue(d)) => {
                let due_ns = d.due.as_ref().map_or(0, |t| {
                    i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos)
                });
                if in_window {
                    seen.window_dues += 1;
                    seen.window_missed += u64::from(d.missed > 0);
                }
                seen.dues.push(Due {
                    sequence: seq,
                    message_id: d.envelope.map(|e| e.message_id).unwrap_or_default(),
                    due_ns,
                    stored_ns,
                });
                if seen.sample.is_none() {
                    seen.sample = Some(msg);
                }
            }
            Ok(AnyMessage::ProbeReq(r)) => {
                seen.window_requests += u64::from(in_window);
                let cause = r.envelope.map(|e| e.causation_id).unwrap_or_default();
                seen.requests.entry(cause).or_insert(stored_ns);
            }
            Ok(AnyMessage::ProbeResult(r)) => {
                if in_window {
                    seen.window_results += 1;
                    seen.window_unhealthy += u64::from(!r.healthy);
                }
            }
            Ok(_) => {}
            Err(_) => unreadable += 1,
        }
    }
    ensure!(
        unreadable == 0,
        "{unreadable} messages of the stream could not be decoded"
    );
    ensure!(
        seen.inputs.windows(2).all(|w| w[0] < w[1]),
        "the stream was read out of order"
    );
    ensure!(
        a1 >= a0,
        "the brain's applied sequence went back from {a0} to {a1}"
    );
    Ok(seen)
}

/// From `from_ns` to `to_ns`, 0 if the clock says it went back.
fn span(from_ns: i128, to_ns: i128) -> Duration {
    Duration::from_nanos(u64::try_from(to_ns - from_ns).unwrap_or(0))
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// Lines written to `path` between byte offsets `from` and `to`.
fn lines_between(path: &Path, from: u64, to: u64) -> u64 {
    let Ok(bytes) = std::fs::read(path) else {
        return 0;
    };
    let (from, to) = (from as usize, (to as usize).min(bytes.len()));
    bytes
        .get(from..to)
        .map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count() as u64)
}

/// WARN and ERROR lines of each log, and the first few of them.
fn warnings(logs: &[PathBuf; 3]) -> ([u64; 3], Vec<String>) {
    let mut counts = [0; 3];
    let mut samples = Vec::new();
    for (i, path) in logs.iter().enumerate() {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines() {
            if line.contains("\"level\":\"WARN\"") || line.contains("\"level\":\"ERROR\"") {
                counts[i] += 1;
                if samples.len() < 5 {
                    let cut: String = line.chars().take(400).collect();
                    samples.push(format!("{}: {cut}", SERVICES[i]));
                }
            }
        }
    }
    (counts, samples)
}

/// The machine's CPU time from `/proc/stat`, in clock ticks.
#[derive(Clone, Copy)]
struct Machine {
    busy: u64,
    total: u64,
}

impl Machine {
    fn since(self, earlier: Machine) -> Machine {
        Machine {
            busy: self.busy.saturating_sub(earlier.busy),
            total: self.total.saturating_sub(earlier.total),
        }
    }
}

fn machine_ticks() -> Result<Machine> {
    let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = text
        .lines()
        .next()
        .filter(|l| l.starts_with("cpu "))
        .context("/proc/stat has no `cpu` line")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("/proc/stat's `cpu` line")?;
    // user nice system idle iowait irq softirq steal (guest time is
    // already counted in user).
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Ok(Machine {
        busy: total.saturating_sub(idle),
        total,
    })
}

// ---------------------------------------------------------------------------
// The baseline.

/// The baseline's side: its own connection, stream and message.
struct Raw {
    client: async_nats::Client,
    js: jetstream::Context,
    payload: Bytes,
    /// The stored DutyDue's headers but its id.
    headers: Vec<(String, String)>,
    /// One subject per duty, as long as the duties' subjects.
    subjects: Vec<String>,
    id_len: usize,
    next: u64,
}

/// Connects as the admin (as `Bus::connect_as` does), creates the stream
/// with the agent stream's configuration, and takes `sample`, a stored
/// DutyDue, as the message.
async fn raw_side(bench: &Bench<'_>, sample: &Option<StoredMessage>) -> Result<Raw> {
    let sample = sample
        .as_ref()
        .context("the first round stored no DutyDue to copy")?;
    let cfg = bench.bus.config();
    let client = async_nats::ConnectOptions::new()
        .name("bench-raw")
        .connection_timeout(cfg.connect_timeout)
        .request_timeout(Some(cfg.request_timeout))
        .max_reconnects(None)
        .nkey(bench.admin_seed.clone())
        .custom_inbox_prefix(Identity::Admin.inbox_prefix())
        .connect(bench.bus.url())
        .await?;
    let js = jetstream::ContextBuilder::new()
        .timeout(cfg.request_timeout)
        .build(client.clone());
    let mut agent_stream = js.get_stream(bench.agent.stream()).await?;
    let mut stream_cfg = agent_stream.info().await?.config.clone();
    stream_cfg.name = RAW_STREAM.into();
    stream_cfg.subjects = vec![format!("{RAW_PREFIX}.>")];
    stream_cfg.description = Some("the duties bench's raw JetStream baseline".into());
    js.create_stream(stream_cfg)
        .await
        .map_err(|e| anyhow!("creating stream {RAW_STREAM}: {e}"))?;
    let id = sample
        .header("Nats-Msg-Id")
        .context("the stored DutyDue has no Nats-Msg-Id")?;
    let due_subject = bench.agent.subject(SubjectKind::DutyDue);
    let subjects = bench
        .names
        .iter()
        .map(|n| {
            let subject = format!("{due_subject}.duty-{n}");
            let rest = subject.split_once('.').map_or("", |(_, rest)| rest);
            format!("{RAW_PREFIX}.{rest}")
        })
        .collect();
    ensure!(
        sample
            .subject
            .split_once('.')
            .is_some_and(|(first, _)| first.len() == RAW_PREFIX.len()),
        "the baseline's subjects are not as long as {}",
        sample.subject
    );
    Ok(Raw {
        client,
        js,
        payload: sample.payload.clone(),
        headers: sample
            .headers
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("Nats-Msg-Id"))
            .cloned()
            .collect(),
        subjects,
        id_len: id.len(),
        next: 0,
    })
}

/// One baseline run.
#[derive(Clone, Copy, Default)]
struct Baseline {
    /// Messages per second, first publish to last ack.
    rate: f64,
    /// CPU ns per message of this process and of the server.
    client_ns: f64,
    server_ns: f64,
}

/// Publishes `n` messages with up to [`PUBLISH_WINDOW`] acks outstanding,
/// round-robin over the duties' subjects.
async fn baseline(bench: &Bench<'_>, raw: &mut Raw, n: usize) -> Result<Baseline> {
    let width = raw.id_len.saturating_sub(4);
    let messages: Vec<(async_nats::Subject, String)> = (raw.next..raw.next + n as u64)
        .map(|i| {
            let subject = &raw.subjects[i as usize % raw.subjects.len()];
            (subject.as_str().into(), format!("raw:{i:0width$}"))
        })
        .collect();
    raw.next += n as u64;
    let cpu_before = cpu_now(bench.nats_pid);
    let start = Instant::now();
    let publishing = async {
        let mut inflight: FuturesUnordered<
            <jetstream::context::PublishAckFuture as IntoFuture>::IntoFuture,
        > = FuturesUnordered::new();
        for (subject, id) in messages {
            if inflight.len() >= PUBLISH_WINDOW
                && let Some(ack) = inflight.next().await
            {
                ensure!(!ack?.duplicate, "a raw publish was a duplicate");
            }
            let mut publish = PublishMessage::build()
                .payload(raw.payload.clone())
                .message_id(id);
            for (k, v) in &raw.headers {
                publish = publish.header(k.as_str(), v.as_str());
            }
            let ack = raw.js.send_publish(subject, publish).await?;
            inflight.push(ack.into_future());
        }
        while let Some(ack) = inflight.next().await {
            ensure!(!ack?.duplicate, "a raw publish was a duplicate");
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(300), publishing)
        .await
        .map_err(|_| anyhow!("publishing {n} raw messages took longer than 300 s"))??;
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_now(bench.nats_pid).since(cpu_before);
    raw.client.flush().await?;
    Ok(Baseline {
        rate: n as f64 / elapsed,
        client_ns: cpu.client_ns as f64 / n as f64,
        server_ns: cpu.server_ns as f64 / n as f64,
    })
}

// ---------------------------------------------------------------------------
// The report.

fn report(settings: &Settings, rounds: &[Round], baselines: &[Baseline], stored_as: &str) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let med = |get: &dyn Fn(&Round) -> f64| median(rounds.iter().map(get).collect());
    let base_rate = median(baselines.iter().map(|b| b.rate).collect());
    let base_client = median(baselines.iter().map(|b| b.client_ns).collect());
    let base_server = median(baselines.iter().map(|b| b.server_ns).collect());
    let due_rate = med(&|r| r.due as f64 / r.window);
    let per_due = |ns: u64, r: &Round| ns as f64 / 1e3 / r.due.max(1) as f64;
    let sched_us = med(&|r| per_due(r.cpu[2], r));
    let share = |ns: u64, r: &Round| ns as f64 / 1e9 / (r.window * cores) * 100.0;
    let required = settings.duties as f64;

    println!();
    println!(
        "{} duties at 1 s on one agent, median over {} round(s) of {} s; {} cores; one DutyDue as stored: {stored_as}",
        settings.duties,
        rounds.len(),
        settings.seconds,
        cores
    );
    println!();
    println!("| Metric | nisse | raw JetStream baseline | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| due messages/s (msg/s for raw) | {due_rate:.0} | {base_rate:.0} | {:.3} |",
        due_rate / base_rate
    );
    println!(
        "| required {required:.0} due/s as a share of raw | | | {:.3} |",
        required / base_rate
    );
    println!(
        "| all messages stored/s (due, requests, results, ticks) | {:.0} | | {:.3} |",
        med(&|r| r.stored as f64 / r.window),
        med(&|r| r.stored as f64 / r.window) / base_rate
    );
    println!(
        "| CPU per due message, scheduler vs raw client (µs) | {sched_us:.1} | {:.1} | {:.2} |",
        base_client / 1e3,
        sched_us / (base_client / 1e3)
    );
    let nats_per_due = med(&|r| per_due(r.nats_cpu, r));
    println!(
        "| CPU per due message, nats-server (µs; nisse: all traffic) | {nats_per_due:.1} | {:.1} | {:.2} |",
        base_server / 1e3,
        nats_per_due / (base_server / 1e3)
    );
    let nats_per_stored = med(&|r| r.nats_cpu as f64 / 1e3 / r.stored.max(1) as f64);
    println!(
        "| CPU per stored message, nats-server (µs) | {nats_per_stored:.1} | {:.1} | {:.2} |",
        base_server / 1e3,
        nats_per_stored / (base_server / 1e3)
    );
    println!(
        "| brain inputs applied/s (needed: stored/s) | {:.0} ({:.0}) | | |",
        med(&|r| r.applied as f64 / r.window),
        med(&|r| r.inputs as f64 / r.window)
    );
    println!(
        "| CPU per due message, brain / prober (µs) | {:.1} / {:.1} | | |",
        med(&|r| per_due(r.cpu[0], r)),
        med(&|r| per_due(r.cpu[1], r))
    );

    println!();
    println!("Share of the machine ({cores} cores) over the window, median of rounds:");
    println!();
    println!("| Process | CPU share | log bytes per due | log lines/s |");
    println!("|---|---:|---:|---:|");
    for (i, name) in SERVICES.iter().enumerate() {
        println!(
            "| nisse serve {name} | {:.1}% | {:.0} | {:.0} |",
            med(&|r| share(r.cpu[i], r)),
            med(&|r| r.log_bytes[i] as f64 / r.due.max(1) as f64),
            med(&|r| r.log_lines[i] as f64 / r.window)
        );
    }
    println!(
        "| nats-server | {:.1}% | | |",
        med(&|r| share(r.nats_cpu, r))
    );
    println!(
        "| the three services and nats-server | {:.1}% | | |",
        med(&|r| share(r.cpu.iter().sum::<u64>() + r.nats_cpu, r))
    );
    println!(
        "| bench process (listeners, a look every 100 ms) | {:.1}% | | |",
        med(&|r| share(r.bench_cpu, r))
    );
    println!(
        "| whole machine busy (/proc/stat) | {:.1}% | | |",
        med(&|r| r.machine_busy * 100.0)
    );

    let pooled = [
        (
            "to the ProbeRequest stored",
            pool(rounds, |r| &r.to_request),
        ),
        (
            "to the DutyDue stored (scheduler)",
            pool(rounds, |r| &r.to_due_stored),
        ),
        (
            "DutyDue stored to ProbeRequest stored (brain)",
            pool(rounds, |r| &r.brain_part),
        ),
    ];
    println!();
    println!(
        "Latency of every due message of every window, from its due instant (ms; all {} due at the same instant each second):",
        settings.duties
    );
    println!();
    println!("| From due instant | n | p50 | p90 | p99 | max |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, v) in &pooled {
        println!(
            "| {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            v.len(),
            ms(percentile(v, 0.50)),
            ms(percentile(v, 0.90)),
            ms(percentile(v, 0.99)),
            ms(percentile(v, 1.0)),
        );
    }
    let round_p99: Vec<String> = rounds
        .iter()
        .map(|r| format!("{:.1}", ms(percentile(&r.to_request, 0.99))))
        .collect();
    println!();
    println!(
        "p99 due → ProbeRequest stored, round by round (ms): {}",
        round_p99.join(", ")
    );

    println!();
    println!("Per round:");
    println!();
    println!(
        "| Round | due | missed>0 | short instants | no request | requests | results | unhealthy | accepted | applied/s | lag max | lag at end | drain (s) | raw msg/s | warnings |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, r) in rounds.iter().enumerate() {
        println!(
            "| {i} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {:.0} | {} |",
            r.due,
            r.due_missed,
            r.short_instants,
            r.no_request,
            r.requests,
            r.results,
            r.unhealthy,
            r.accepted,
            r.applied as f64 / r.window,
            r.lag_max,
            r.lag_end,
            r.drain
                .map_or_else(|| "not drained".into(), |d| format!("{d:.1}")),
            baselines.get(i).map_or(f64::NAN, |b| b.rate),
            r.warnings.iter().sum::<u64>(),
        );
    }
    for r in rounds {
        for w in &r.warning_samples {
            println!("  warning: {w}");
        }
    }
    if !settings.full {
        return;
    }

    println!();
    let keeps_up = rounds.iter().all(|r| {
        r.lag_end < settings.duties as u64 * 2
            && r.no_request == 0
            && r.due_missed == 0
            && r.short_instants == 0
            && r.drain.is_some()
    });
    println!(
        "verdict: {due_rate:.0} due/s needs {:.3} of the raw publish rate; the scheduler spends {:.2}× the raw client's CPU per message; p99 due → request {:.1} ms; the brain {}",
        required / base_rate,
        sched_us / (base_client / 1e3),
        ms(percentile(&pooled[0].1, 0.99)),
        if keeps_up {
            "keeps up (less than a second of inputs behind at the end, every due instant published once and requested)"
        } else {
            "does NOT keep up, or instants were skipped (see the per-round table)"
        }
    );
}

/// Every sample of every round.
fn pool(rounds: &[Round], get: fn(&Round) -> &Vec<Duration>) -> Vec<Duration> {
    rounds.iter().flat_map(|r| get(r).iter().copied()).collect()
}
