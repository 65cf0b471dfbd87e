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

use nisse_bus::auth::{Credentials, Identity};
use nisse_bus::embedded::{EmbeddedOptions, EmbeddedServer};
use nisse_bus::{Bus, TopologyReport};

use crate::config::Config;
use crate::endpoints::Endpoints;
use crate::services::{self, Shared};

/// Runs everything in one process until SIGINT or SIGTERM; with
/// `cluster`, on that many embedded NATS servers clustered together
/// (for local trials of replicated streams).
pub async fn up(mut cfg: Config, cluster: Option<usize>) -> anyhow::Result<()> {
    let data_dir = cfg.data_dir.clone();
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    let _lock = lock_data_dir(&data_dir)?;
    let mut signals = Signals::new()?;

    // Credentials for every service of every agent, every operator and
    // the admin, made on the first start and kept; the permissions are
    // written again each time from the configuration.
    let authorization = nisse_bus::auth::server_authorization(
        &cfg.auth_plan()?,
        &Credentials::in_data_dir(&data_dir),
    )?;
    give_operators_their_credentials(&cfg)?;
    // The bearer token `nisse mcp serve --listen` requires, made once
    // beside the bus credentials and kept, so its clients keep working.
    let mcp_token = crate::mcp_serve::ensure_token(&data_dir)?;
    let mut embedded = match &cfg.bus.url {
        Some(url) => {
            anyhow::ensure!(
                cluster.is_none(),
                "--cluster starts embedded servers, but a NATS server is configured ({url}); leave out bus.url and NISSE_NATS_URL, or run the cluster yourself"
            );
            tracing::info!(%url, "using the configured NATS server");
            Vec::new()
        }
        None => {
            let nats_dir = data_dir.join("nats");
            let options = EmbeddedOptions {
                program: cfg.embedded.program.clone(),
                store_dir: nats_dir.join("jetstream"),
                run_dir: nats_dir.clone(),
                host: cfg.embedded.host.clone(),
                port: Some(cfg.embedded.port),
                ready_timeout: cfg.embedded.ready_timeout,
                extra_args: Vec::new(),
                authorization: Some(authorization),
                sync: cfg.embedded.sync_interval.parse()?,
                cluster: None,
            };
            let servers = match cluster {
                Some(n) => {
                    // The cluster is known: one replica per server, up to
                    // three, unless configured (its servers may not all
                    // have told each other's addresses yet).
                    cfg.bus.streams.replicas =
                        nisse_bus::Replicas::Count(cfg.bus.streams.replicas.on(n));
                    EmbeddedServer::start_cluster(&options, &nats_dir, n).await?
                }
                None => vec![EmbeddedServer::start(options).await?],
            };
            let url = EmbeddedServer::cluster_url(&servers);
            tracing::info!(%url, servers = servers.len(), store = %nats_dir.display(), "embedded NATS ready");
            cfg.bus.url = Some(url);
            servers
        }
    };

    // From here on the embedded servers must be stopped whatever happens.
    let outcome = run_services(&cfg, &mut embedded, &mut signals, &mcp_token).await;
    Endpoints::remove(&data_dir);
    for server in embedded {
        server.stop(Duration::from_secs(5)).await?;
    }
    tracing::info!("embedded NATS stopped");
    outcome
}

/// Runs the named services against the configured (or `nisse up`'s) server
/// until SIGINT or SIGTERM; with `health`, answers `/healthz` and
/// `/readyz` there.
pub async fn serve(
    mut cfg: Config,
    names: &[String],
    health: Option<std::net::SocketAddr>,
) -> anyhow::Result<()> {
    let entries = services::find(names)?;
    let mut signals = Signals::new()?;
    cfg.bus.url = Some(crate::inspect::server_url(&cfg)?);
    let shared = Shared {
        agents: cfg.agent_names()?,
        config: Arc::new(cfg.clone()),
        shutdown: CancellationToken::new(),
        readiness: Default::default(),
    };
    let mut running = services::start(&entries, &shared);
    let health = health.map(|addr| {
        tokio::spawn(crate::health::listen(
            addr,
            shared.readiness.clone(),
            running.ready_keys.clone(),
            shared.shutdown.clone(),
        ))
    });
    let health_failed = async {
        match health {
            Some(task) => match task.await {
                Ok(Err(e)) => e,
                Ok(Ok(())) => std::future::pending().await,
                Err(e) => anyhow::anyhow!("the health listener panicked: {e}"),
            },
            None => std::future::pending().await,
        }
    };
    let failure = tokio::select! {
        () = signals.recv() => None,
        f = running.failure() => Some(f),
        e = health_failed => Some(("health".to_string(), e)),
    };
    running.stop(cfg.shutdown_grace).await;
    match failure {
        Some((name, e)) => Err(e.context(format!("service {name} failed"))),
        None => Ok(()),
    }
}

/// A crashed embedded server is restarted at most this often within
/// [`RESTART_WINDOW`]; beyond that something is wrong that restarting will
/// not fix (a full disk, a corrupt store), and `nisse up` exits.
const MAX_RESTARTS: usize = 3;
const RESTART_WINDOW: Duration = Duration::from_secs(60);

async fn run_services(
    cfg: &Config,
    embedded: &mut Vec<EmbeddedServer>,
    signals: &mut Signals,
    mcp_token: &Path,
) -> anyhow::Result<()> {
    let agents = cfg.agent_names()?;
    let credentials = Credentials::in_data_dir(&cfg.data_dir);
    if embedded.is_empty() {
        warn_if_open(cfg, &agents).await;
    }
    // The admin identity makes the topology; no service ever holds it.
    let bus = Bus::connect_as(&cfg.bus, agents.clone(), &Identity::Admin, &credentials).await?;
    let report = bus.ensure_topology().await?;
    log_topology(&report);

    let shared = Shared {
        config: Arc::new(cfg.clone()),
        agents: agents.clone(),
        shutdown: CancellationToken::new(),
        readiness: Default::default(),
    };
    let mut running = services::start(&services::Chosen::all(), &shared);
    // endpoints.json names only addresses that answer: wait for every
    // service (or the first to fail, or a stop signal).
    let keys = running.ready_keys.clone();
    let listeners = tokio::select! {
        l = shared.readiness.wait_for(&keys) => l,
        (name, e) = running.failure() => {
            running.stop(cfg.shutdown_grace).await;
            return Err(e.context(format!("service {name} failed to start")));
        }
        () = signals.recv() => {
            running.stop(cfg.shutdown_grace).await;
            return Ok(());
        }
    };

    let endpoints = Endpoints {
        nats_url: bus.url().to_string(),
        nats_embedded: !embedded.is_empty(),
        pid: std::process::id(),
        agents: agents.iter().map(ToString::to_string).collect(),
        services: running.names.clone(),
        listeners,
        started_at: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
    };
    endpoints.write(&cfg.data_dir)?;
    print_ready(
        &endpoints,
        &report,
        &cfg.data_dir,
        &cfg.vault.root(&cfg.data_dir),
        mcp_token,
    );

    let mut restarts: Vec<tokio::time::Instant> = Vec::new();
    let outcome = loop {
        tokio::select! {
            () = signals.recv() => break Ok(()),
            (name, e) = running.failure() => break Err(e.context(format!("service {name} failed"))),
            (how, node) = server_exit(embedded) => {
                let now = tokio::time::Instant::now();
                restarts.retain(|t| now.duration_since(*t) < RESTART_WINDOW);
                if restarts.len() >= MAX_RESTARTS {
                    break Err(anyhow::anyhow!(
                        "the embedded NATS server keeps exiting ({} times within {:?}); last: {how}",
                        restarts.len() + 1,
                        RESTART_WINDOW
                    ));
                }
                restarts.push(now);
                tracing::error!(node, "an embedded NATS server exited ({how}); restarting it on the same port and store");
                if let Err(e) = embedded[node].restart().await {
                    // Without the server there is nothing to run against.
                    embedded.remove(node);
                    break Err(anyhow::Error::from(e).context("restarting an embedded NATS server"));
                }
                tracing::info!(node, "embedded NATS server restarted; clients reconnect on their own");
            }
        }
    };
    tracing::info!("shutting down");
    running.stop(cfg.shutdown_grace).await;
    // Bounded: after a failed restart there is no server to flush to.
    if tokio::time::timeout(Duration::from_secs(2), bus.flush())
        .await
        .is_err()
    {
        tracing::warn!("could not flush to NATS at shutdown");
    }
    outcome
}

/// Warns when a server the operator runs lets anyone in: then every wall
/// on the bus is down, whatever credentials the services use.
async fn warn_if_open(cfg: &Config, agents: &[nisse_bus::AgentName]) {
    if cfg.bus.has_credentials() {
        return;
    }
    if Bus::connect(&cfg.bus, agents.to_vec(), "nisse-probe")
        .await
        .is_ok()
    {
        tracing::warn!(
            url = cfg.bus.url.as_deref().unwrap_or_default(),
            "the NATS server accepts connections without credentials: any local process can publish operator commands and execution requests. Give it the authorization block `nisse nats-config` prints"
        );
    }
}

/// Run as root, `nisse up` hands each CLI operator's seed file to the
/// local user of that name, so they can use it and nobody else can.
fn give_operators_their_credentials(cfg: &Config) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    use std::os::unix::fs::PermissionsExt as _;
    let credentials = Credentials::in_data_dir(&cfg.data_dir);
    // Traversable, not listable: each operator reaches their own file.
    for dir in [
        credentials.operators_dir(),
        credentials.operators_dir().join(".."),
    ] {
        if !dir.exists() {
            continue;
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .with_context(|| format!("opening {} for the operators", dir.display()))?;
    }
    for operator in cfg.auth_plan()?.operators.keys() {
        let Ok(Some(user)) = nix::unistd::User::from_name(operator.as_str()) else {
            continue;
        };
        if user.uid.is_root() {
            continue;
        }
        let seed = credentials.seed_file(&Identity::Operator(operator.clone()));
        nix::unistd::chown(&seed, Some(user.uid), Some(user.gid))
            .with_context(|| format!("handing {} to {}", seed.display(), user.name))?;
    }
    Ok(())
}

/// Resolves when an embedded server exits, with how and which; never
/// when there is none.
async fn server_exit(embedded: &mut [EmbeddedServer]) -> (String, usize) {
    if embedded.is_empty() {
        return std::future::pending().await;
    }
    let exits = embedded.iter_mut().map(|s| Box::pin(s.exited()));
    let (how, node, _) = futures::future::select_all(exits).await;
    (how, node)
}

/// `nisse bus init`: the topology made on the configured server (or
/// `nisse up`'s) as the admin identity, and what was done printed.
pub async fn bus_init(cfg: &Config, json: bool) -> anyhow::Result<()> {
    let bus = crate::inspect::connect_as(cfg, &Identity::Admin)
        .await
        .context("connecting as the admin identity")?;
    let report = bus.ensure_topology().await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let word = |c: nisse_bus::TopologyChange| match c {
        nisse_bus::TopologyChange::Created => "created",
        nisse_bus::TopologyChange::Updated => "updated",
        nisse_bus::TopologyChange::Unchanged => "unchanged",
    };
    println!(
        "on {} ({} server{}, {} replica{} each):",
        bus.url(),
        report.servers,
        if report.servers == 1 { "" } else { "s" },
        report.replicas,
        if report.replicas == 1 { "" } else { "s" }
    );
    for s in &report.streams {
        println!("  stream {:<28} {}", s.stream, word(s.change));
        for (consumer, change) in &s.consumers {
            println!("    consumer {:<24} {}", consumer, word(*change));
        }
    }
    for (bucket, change) in &report.buckets {
        println!("  bucket {:<28} {}", bucket, word(*change));
    }
    Ok(())
}

fn log_topology(report: &TopologyReport) {
    for s in &report.streams {
        tracing::info!(stream = %s.stream, change = ?s.change, consumers = ?s.consumers, "stream ready");
    }
    for (bucket, change) in &report.buckets {
        tracing::info!(%bucket, ?change, "key-value bucket ready");
    }
}

fn print_ready(
    endpoints: &Endpoints,
    report: &TopologyReport,
    data_dir: &Path,
    vault: &Path,
    mcp_token: &Path,
) {
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
    println!(
        "  replicas:  {} (on {} server{})",
        report.replicas,
        report.servers,
        if report.servers == 1 { "" } else { "s" }
    );
    for s in &report.streams {
        let consumers: Vec<&str> = s.consumers.iter().map(|(n, _)| n.as_str()).collect();
        println!(
            "  stream:    {} (consumers: {})",
            s.stream,
            consumers.join(", ")
        );
    }
    println!("  services:  {}", endpoints.services.join(", "));
    for (name, addr) in &endpoints.listeners {
        println!("  {name}: {addr}");
    }
    println!("  data:      {}", data_dir.display());
    // The folder to open in Obsidian.
    println!("  vault:     {}", vault.display());
    println!(
        "  endpoints: {} (other commands use it with --data-dir)",
        Endpoints::path(data_dir).display()
    );
    println!(
        "  MCP:       `nisse mcp serve` (stdio), or `--listen ADDR` for HTTP with the bearer token in {}",
        mcp_token.display()
    );
    // The webhook requires the token in this file (generated on the first
    // start unless credentials are configured); Alertmanager reads it at
    // each notification, so the snippet is all it needs.
    let listener = |name: &str| endpoints.listeners.get(name);
    if let (Some(url), Some(token_file)) = (
        listener(nisse_intake_alerts::LISTENER),
        listener(nisse_intake_alerts::TOKEN_FILE_LISTENER),
    ) {
        println!(
            "Alertmanager: add this receiver to alertmanager.yml (Alertmanager's user must be able to read the token file; it is mode 0600, so copy it or run both as one user):"
        );
        println!("  receivers:");
        println!("    - name: nisse");
        println!("      webhook_configs:");
        println!("        - url: {url}");
        println!("          send_resolved: true");
        println!("          http_config:");
        println!("            authorization:");
        println!("              type: Bearer");
        println!("              credentials_file: {token_file}");
    }
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
