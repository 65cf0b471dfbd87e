//! `nisse up` and `nisse serve`: run services against a NATS server, the
//! embedded one by default.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use nix::fcntl::{Flock, FlockArg};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use nisse_bus::embedded::{EmbeddedOptions, EmbeddedServer};
use nisse_bus::{Bus, TopologyReport};

use crate::config::Config;
use crate::endpoints::Endpoints;
use crate::services::{self, ServiceContext};

/// Runs everything in one process until SIGINT or SIGTERM.
pub async fn up(mut cfg: Config) -> anyhow::Result<()> {
    let data_dir = cfg.data_dir.clone();
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    let _lock = lock_data_dir(&data_dir)?;
    let mut signals = Signals::new()?;

    let embedded = match &cfg.bus.url {
        Some(url) => {
            tracing::info!(%url, "using the configured NATS server");
            None
        }
        None => {
            let nats_dir = data_dir.join("nats");
            let server = EmbeddedServer::start(EmbeddedOptions {
                program: cfg.embedded.program.clone(),
                store_dir: nats_dir.join("jetstream"),
                run_dir: nats_dir.clone(),
                host: cfg.embedded.host.clone(),
                port: Some(cfg.embedded.port),
                ready_timeout: cfg.embedded.ready_timeout,
                extra_args: Vec::new(),
            })
            .await?;
            tracing::info!(url = server.url(), store = %nats_dir.display(), "embedded NATS server ready");
            cfg.bus.url = Some(server.url().to_string());
            Some(server)
        }
    };

    // From here on the embedded server must be stopped whatever happens.
    let outcome = run_services(&cfg, embedded.is_some(), &mut signals).await;
    Endpoints::remove(&data_dir);
    if let Some(server) = embedded {
        server.stop(Duration::from_secs(5)).await?;
        tracing::info!("embedded NATS server stopped");
    }
    outcome
}

/// Runs the named services against the configured (or `nisse up`'s) server
/// until SIGINT or SIGTERM.
pub async fn serve(cfg: Config, names: &[String]) -> anyhow::Result<()> {
    let entries = services::find(names)?;
    let mut signals = Signals::new()?;
    let bus = crate::inspect::connect(&cfg, "nisse-serve").await?;
    let ctx = ServiceContext {
        config: Arc::new(cfg.clone()),
        bus: bus.clone(),
        agents: bus.agents().to_vec(),
        shutdown: CancellationToken::new(),
    };
    let mut running = services::start(&entries, &ctx);
    let failure = tokio::select! {
        () = signals.recv() => None,
        f = running.failure() => Some(f),
    };
    running.stop(cfg.shutdown_grace).await;
    bus.flush().await?;
    match failure {
        Some((name, e)) => Err(e.context(format!("service {name} failed"))),
        None => Ok(()),
    }
}

async fn run_services(cfg: &Config, embedded: bool, signals: &mut Signals) -> anyhow::Result<()> {
    let agents = cfg.agent_names()?;
    let bus = Bus::connect(&cfg.bus, agents.clone(), "nisse-up").await?;
    let report = bus.ensure_topology().await?;
    log_topology(&report);

    let ctx = ServiceContext {
        config: Arc::new(cfg.clone()),
        bus: bus.clone(),
        agents: agents.clone(),
        shutdown: CancellationToken::new(),
    };
    let mut running = services::start(
        services::SERVICES.iter().collect::<Vec<_>>().as_slice(),
        &ctx,
    );

    let endpoints = Endpoints {
        nats_url: bus.url().to_string(),
        nats_embedded: embedded,
        pid: std::process::id(),
        agents: agents.iter().map(ToString::to_string).collect(),
        services: running.names.clone(),
        listeners: Default::default(),
        started_at: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
    };
    endpoints.write(&cfg.data_dir)?;
    print_ready(&endpoints, &report, &cfg.data_dir);

    let failure = tokio::select! {
        () = signals.recv() => None,
        f = running.failure() => Some(f),
    };
    tracing::info!("shutting down");
    running.stop(cfg.shutdown_grace).await;
    bus.flush().await?;
    match failure {
        Some((name, e)) => Err(e.context(format!("service {name} failed"))),
        None => Ok(()),
    }
}

fn log_topology(report: &TopologyReport) {
    for s in &report.streams {
        tracing::info!(stream = %s.stream, change = ?s.change, consumers = ?s.consumers, "stream ready");
    }
}

fn print_ready(endpoints: &Endpoints, report: &TopologyReport, data_dir: &Path) {
    println!("nisse is up (pid {})", endpoints.pid);
    println!(
        "  NATS:      {}{}",
        endpoints.nats_url,
        if endpoints.nats_embedded {
            " (embedded)"
        } else {
            ""
        }
    );
    for s in &report.streams {
        let consumers: Vec<&str> = s.consumers.iter().map(|(n, _)| n.as_str()).collect();
        println!(
            "  stream:    {} (consumers: {})",
            s.stream,
            consumers.join(", ")
        );
    }
    if endpoints.services.is_empty() {
        println!("  services:  none in this build yet");
    } else {
        println!("  services:  {}", endpoints.services.join(", "));
    }
    for (name, addr) in &endpoints.listeners {
        println!("  {name}: {addr}");
    }
    println!("  data:      {}", data_dir.display());
    println!(
        "  endpoints: {} (other commands use it with --data-dir)",
        Endpoints::path(data_dir).display()
    );
    println!("Stop with Ctrl-C (a second Ctrl-C exits at once).");
}

/// One `nisse up` per data directory: two embedded servers on one store
/// would corrupt it.
fn lock_data_dir(dir: &Path) -> anyhow::Result<Flock<File>> {
    let path = dir.join("nisse.lock");
    let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        anyhow::anyhow!(
            "another `nisse up` is already running with data directory {} ({e})",
            dir.display()
        )
    })
}

/// SIGINT and SIGTERM. The first asks for a graceful stop; a second one
/// exits at once (the embedded server dies with the process).
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
        tracing::info!("stop requested; finishing in-flight work (signal again to exit at once)");
        let mut int = signal(SignalKind::interrupt());
        let mut term = signal(SignalKind::terminate());
        tokio::spawn(async move {
            if let (Ok(int), Ok(term)) = (int.as_mut(), term.as_mut()) {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                eprintln!("second stop signal: exiting now");
                std::process::exit(130);
            }
        });
    }
}
