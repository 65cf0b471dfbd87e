//! `cargo bench -p nisse --bench cluster`: what replication costs, and how
//! long a standby brain takes to take over, measured on the `nisse` binary
//! as users run it (its logging on, each in its own process).
//!
//! Cases:
//! - **alerts on one server against a 3-node cluster**: `nisse up` (its
//!   embedded server) and `nisse up --cluster 3` (every stream and bucket
//!   with three replicas), each fed the same burst of distinct alerts by
//!   this process (10 per post, 8 posts in flight); alerts/s from the
//!   first post to the brain's store holding every item. The two
//!   alternate which goes first, round by round, and the figure is the
//!   cluster's rate as a share of the single server's from the same round.
//! - **takeover**: one `nats-server`, two `nisse serve brain` processes
//!   with stores of their own (one active, one standing by), a short lease
//!   (`bus.lease-ttl`); the active one is SIGKILLed and the time is taken
//!   until the standby's store holds every item (it takes the lease once
//!   the killed one's lapses, then catches up with the stream), twenty
//!   times, the killed one started again as the next standby. Reported as
//!   p50 and p99 next to the lease's time to live, which bounds it from
//!   below.
//!
//! Without `--bench` (as under `cargo test --benches`) it runs a small
//! smoke version and prints no verdict.
//!
//! Environment: `NISSE_BENCH_CLUSTER_ROUNDS` (default 3),
//! `NISSE_BENCH_CLUSTER_ALERTS` (per round, default 2000),
//! `NISSE_BENCH_TAKEOVERS` (default 20), `NISSE_BENCH_LEASE_TTL` (seconds,
//! default 3).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tokio::process::{Child, Command};

#[path = "../../../bus/benches/support/stats.rs"]
mod stats;
use stats::{median, ms, percentile};
#[path = "../../../bus/benches/support/env.rs"]
mod env;
use env::env_or;

use nisse_core::Store;

const NISSE: &str = env!("CARGO_BIN_EXE_nisse");

/// A free loopback port.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `nisse` in `dir`, with none of the caller's `NISSE_*` and info logging
/// (to a file: it is part of what is measured).
fn nisse(dir: &Path, log: &Path) -> Result<Command> {
    let mut cmd = Command::new(NISSE);
    cmd.current_dir(dir).env("NISSE_LOG", "info");
    for (k, _) in std::env::vars() {
        if k.starts_with("NISSE_") && k != "NISSE_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .kill_on_drop(true);
    Ok(cmd)
}

/// `count` distinct alerts from `first`, one Alertmanager post.
fn alerts(first: usize, count: usize, tag: &str) -> serde_json::Value {
    let alerts: Vec<serde_json::Value> = (first..first + count)
        .map(|n| {
            serde_json::json!({
                "status": "firing",
                "labels": { "alertname": format!("Bench{tag}"), "instance": format!("host{n}") },
                "annotations": {},
                "startsAt": "2026-12-01T10:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": format!("{tag}{n:012x}"),
            })
        })
        .collect();
    serde_json::json!({
        "version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "status": "firing",
        "receiver": "nisse", "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://am", "alerts": alerts,
    })
}

/// Posts `count` alerts (10 a post, 8 posts in flight), each post sent
/// again until stored, as Alertmanager does.
async fn post_all(url: &str, token: &str, count: usize, tag: &str) -> Result<()> {
    let client = reqwest::Client::new();
    let mut posts = (0..count.div_ceil(10)).map(|p| {
        let client = client.clone();
        let body = alerts(p * 10, 10.min(count - p * 10), tag);
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match client.post(url).bearer_auth(token).json(&body).send().await {
                    Ok(r) if r.status().is_success() => return Ok(()),
                    other if Instant::now() > deadline => {
                        bail!("a post was never stored: {other:?}")
                    }
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
    });
    let mut running = FuturesUnordered::new();
    for post in posts.by_ref().take(8) {
        running.push(post);
    }
    while let Some(done) = running.next().await {
        done?;
        if let Some(post) = posts.next() {
            running.push(post);
        }
    }
    Ok(())
}

/// Waits until the ops store under `data` holds `items` items.
async fn wait_items(data: &Path, items: usize, within: Duration) -> Result<()> {
    let path = Store::path_in(data, "ops");
    let deadline = Instant::now() + within;
    loop {
        if let Ok(n) = Store::open_read_only(&path, "ops")
            .and_then(|s| s.items(None))
            .map(|i| i.len())
            && n >= items
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the brain never applied {items} items"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One `nisse up` (with `--cluster 3` when `cluster`) fed `count` alerts:
/// alerts/s from the first post to every item applied.
async fn up_rate(cluster: bool, count: usize) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let port = free_port()?;
    std::fs::write(
        dir.path().join("nisse.toml"),
        format!("[intake-alerts]\nlisten = \"127.0.0.1:{port}\"\n"),
    )?;
    let mut cmd = nisse(dir.path(), &dir.path().join("up.log"))?;
    cmd.arg("up").arg("--data-dir").arg(&data);
    if cluster {
        cmd.args(["--cluster", "3"]);
    }
    let mut up = cmd.spawn()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !data.join("endpoints.json").exists() {
        ensure!(up.try_wait()?.is_none(), "nisse up exited");
        ensure!(Instant::now() < deadline, "nisse up never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let token = std::fs::read_to_string(data.join("credentials/alertmanager-webhook.token"))?;
    let url = format!("http://127.0.0.1:{port}/api/v1/alerts");
    let began = Instant::now();
    post_all(&url, token.trim(), count, if cluster { "c" } else { "s" }).await?;
    wait_items(&data, count, Duration::from_secs(300)).await?;
    let rate = count as f64 / began.elapsed().as_secs_f64();
    stop(&mut up).await;
    Ok(rate)
}

async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
}

/// A brain of its own: a data directory holding the server's credentials.
struct Standby {
    dir: PathBuf,
    child: Option<Child>,
}

/// Takeovers: the time from SIGKILL of the active brain to the standby's
/// store holding every item, `kills` times.
async fn takeovers(kills: usize, items: usize, ttl: u64) -> Result<Vec<Duration>> {
    let root = tempfile::tempdir()?;
    let nats_dir = root.path().join("nats");
    let server = nisse_bus::embedded::EmbeddedServer::start(
        nisse_bus::embedded::EmbeddedOptions::in_dir(&nats_dir),
    )
    .await?;
    let url = server.url().to_string();
    let port = free_port()?;
    let config = |dir: &Path| -> Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("nisse.toml"),
            format!(
                "data-dir = {:?}\n[bus]\nurl = \"{url}\"\nlease-ttl = \"{ttl}s\"\n[intake-alerts]\nlisten = \"127.0.0.1:{port}\"\n[intake-alerts.auth]\nbearer-token = \"bench\"\n",
                dir.join("data").display().to_string()
            ),
        )?;
        Ok(())
    };
    let init_dir = root.path().join("init");
    config(&init_dir)?;
    let out = nisse(&init_dir, &init_dir.join("init.log"))?
        .args(["bus", "init"])
        .status()
        .await?;
    ensure!(out.success(), "nisse bus init failed");
    let mut intake = nisse(&init_dir, &init_dir.join("intake.log"))?
        .args(["serve", "intake-alerts"])
        .spawn()?;
    let mut brains = [0, 1].map(|n| Standby {
        dir: root.path().join(format!("brain-{n}")),
        child: None,
    });
    for b in &mut brains {
        config(&b.dir)?;
        b.child = Some(
            nisse(&b.dir, &b.dir.join("brain.log"))?
                .args(["serve", "brain"])
                .spawn()?,
        );
        // The first takes the lease; the second stands by.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let url = format!("http://127.0.0.1:{port}/api/v1/alerts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while reqwest::get(url.replace("/api/v1/alerts", "/readyz"))
        .await
        .map_or(true, |r| !r.status().is_success())
    {
        ensure!(Instant::now() < deadline, "intake never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    post_all(&url, "bench", items, "t").await?;
    wait_items(&brains[0].dir.join("data"), items, Duration::from_secs(120)).await?;
    let mut took = Vec::new();
    let mut active = 0;
    for _ in 0..kills {
        let standby = 1 - active;
        // The standby has caught up (from its last takeover) or waits.
        let mut child = brains[active].child.take().context("the active brain")?;
        let _ = child.start_kill();
        let _ = child.wait().await;
        let killed = Instant::now();
        wait_items(
            &brains[standby].dir.join("data"),
            items,
            Duration::from_secs(120),
        )
        .await?;
        took.push(killed.elapsed());
        // The killed one's store is dropped: it comes back as a standby
        // with a store of its own to fill, as a new machine would.
        let dir = brains[active].dir.clone();
        let _ = std::fs::remove_dir_all(dir.join("data/agents"));
        brains[active].child = Some(
            nisse(&dir, &dir.join("brain.log"))?
                .args(["serve", "brain"])
                .spawn()?,
        );
        active = standby;
        // Let the new standby start and stand by.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for b in &mut brains {
        if let Some(c) = b.child.as_mut() {
            stop(c).await;
        }
    }
    stop(&mut intake).await;
    server.stop(Duration::from_secs(5)).await?;
    Ok(took)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds: usize = env_or("NISSE_BENCH_CLUSTER_ROUNDS", if full { 3 } else { 1 })?;
    let count: usize = env_or("NISSE_BENCH_CLUSTER_ALERTS", if full { 2000 } else { 50 })?;
    let kills: usize = env_or("NISSE_BENCH_TAKEOVERS", if full { 20 } else { 2 })?;
    let ttl: u64 = env_or("NISSE_BENCH_LEASE_TTL", 3)?;

    let mut ratios = Vec::new();
    for round in 0..rounds {
        // Alternate which goes first.
        let (single, cluster) = if round % 2 == 0 {
            let s = up_rate(false, count).await?;
            (s, up_rate(true, count).await?)
        } else {
            let c = up_rate(true, count).await?;
            (up_rate(false, count).await?, c)
        };
        println!(
            "round {round}: one server {single:.0} alerts/s, 3-node cluster (R3) {cluster:.0} alerts/s, cluster/single {:.2}",
            cluster / single
        );
        ratios.push(cluster / single);
    }
    let took = takeovers(kills, count.min(500), ttl).await?;
    if full {
        println!(
            "alerts end to end, 3-node cluster with three replicas against one server: median ratio {:.2} over {rounds} rounds of {count} alerts",
            median(ratios)
        );
        println!(
            "standby takeover (lease ttl {ttl} s), kill to every item applied: p50 {:.0} ms, p99 {:.0} ms, over {} kills",
            ms(percentile(&took, 0.5)),
            ms(percentile(&took, 0.99)),
            took.len()
        );
    }
    Ok(())
}
