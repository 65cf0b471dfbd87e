//! A `nats-server` child process with JetStream, for the embedded default
//! (`nisse up` without a configured server) and for tests, which each start
//! their own on a free port with a temporary store.
//!
//! The server is Debian's (or any) `nats-server` binary found on `PATH`; its
//! address is read from the ports file it writes, so asking for a random port
//! (`-p -1`) has no race between choosing a port and binding it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::{Error, Result};

/// How to start the server.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// The `nats-server` executable; found on `PATH` when just a name.
    pub program: PathBuf,
    /// Where JetStream keeps its data; created if missing.
    pub store_dir: PathBuf,
    /// Where the server writes its log and ports file; created if missing.
    pub run_dir: PathBuf,
    /// The address to listen on. Loopback by default: the embedded server
    /// has no authentication of its own yet.
    pub host: String,
    /// The preferred port. When it is taken (another NATS already on 4222),
    /// a free one is used instead. `None`: always a free one.
    pub port: Option<u16>,
    /// How long to wait for the server to accept JetStream requests.
    pub ready_timeout: Duration,
    /// More `nats-server` arguments (e.g. `--user`/`--pass` to require
    /// authentication).
    pub extra_args: Vec<String>,
    /// The `authorization` block of the server's configuration (see
    /// `crate::auth::server_authorization`); `None`: no authentication.
    pub authorization: Option<String>,
    /// How often JetStream fsyncs what it stored.
    pub sync: SyncInterval,
    /// This server as one node of a cluster; `None`: a single server.
    pub cluster: Option<ClusterNode>,
}

/// One server of a cluster of embedded servers ([`EmbeddedServer::start_cluster`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The cluster's name, the same on every node.
    pub name: String,
    /// This server's name, unique in the cluster (JetStream's replicas
    /// are placed by it).
    pub server_name: String,
    /// The port this server takes routes from the others on.
    pub route_port: u16,
    /// Every node's route URL (`nats-route://host:port`), its own among
    /// them.
    pub routes: Vec<String>,
}

/// How often the server's JetStream store is synced to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncInterval {
    /// After every message: nothing the server acknowledged is lost on a
    /// power failure. Needs nats-server 2.10 or later; an older server
    /// runs with its own interval, with a warning.
    Always,
    /// At this interval (the server's default is two minutes).
    Every(Duration),
    /// The server's own default.
    ServerDefault,
}

impl std::str::FromStr for SyncInterval {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "always" => Ok(Self::Always),
            "default" => Ok(Self::ServerDefault),
            other => humantime::parse_duration(other)
                .ok()
                .filter(|d| !d.is_zero())
                .map(Self::Every)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "`{other}` is not a sync interval: `always`, `default` or a duration such as `1s`"
                    ))
                }),
        }
    }
}

/// A `nats-server` version, as `--version` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServerVersion(pub u32, pub u32, pub u32);

impl std::fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

impl ServerVersion {
    /// The first version with `sync_interval` (2.10).
    const SYNC_INTERVAL: Self = Self(2, 10, 0);

    /// Reads it from `nats-server: v2.9.10`.
    fn parse(text: &str) -> Option<Self> {
        let v = text.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
        let mut parts = v.split(['.', '-', '+']).map(|p| p.parse::<u32>().ok());
        Some(Self(
            parts.next()??,
            parts.next()??,
            parts.next().flatten().unwrap_or(0),
        ))
    }
}

impl EmbeddedOptions {
    /// Options for a server keeping everything under `dir`, on a free
    /// loopback port.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            program: PathBuf::from("nats-server"),
            store_dir: dir.join("jetstream"),
            run_dir: dir.join("run"),
            host: "127.0.0.1".into(),
            port: None,
            ready_timeout: Duration::from_secs(20),
            extra_args: Vec::new(),
            authorization: None,
            sync: SyncInterval::ServerDefault,
            cluster: None,
        }
    }
}

/// A running `nats-server` child. Dropping it kills the server; call
/// [`EmbeddedServer::stop`] for a graceful stop.
#[derive(Debug)]
pub struct EmbeddedServer {
    child: Child,
    url: String,
    port: u16,
    options: EmbeddedOptions,
}

/// Where to get `nats-server` when it is missing.
pub const INSTALL_HINT: &str = "install it with `sudo apt-get install nats-server` (Debian/Ubuntu) or `scripts/install-nats-server`, or point NISSE_NATS_URL at a running server";

impl EmbeddedServer {
    /// Starts the server and waits until JetStream answers.
    pub async fn start(options: EmbeddedOptions) -> Result<Self> {
        let port = match options.port {
            Some(p) if port_is_free(&options.host, p) => Some(p),
            Some(p) => {
                tracing::info!(
                    port = p,
                    "port taken; the embedded NATS server will use a free one"
                );
                None
            }
            None => None,
        };
        match Self::spawn(&options, port).await {
            // Someone took the port between the check and the bind.
            Err(Error::Embedded(reason))
                if port.is_some() && reason.contains("address already in use") =>
            {
                Self::spawn(&options, None).await
            }
            other => other,
        }
    }

    async fn spawn(options: &EmbeddedOptions, port: Option<u16>) -> Result<Self> {
        let fail = |what: &str, e: &dyn std::fmt::Display| Error::Embedded(format!("{what}: {e}"));
        for dir in [&options.store_dir, &options.run_dir] {
            std::fs::create_dir_all(dir)
                .map_err(|e| fail(&format!("create {}", dir.display()), &e))?;
        }
        let log = options.run_dir.join("nats-server.log");
        // Stale ports files from an earlier run would point at a dead server.
        clear_ports_files(&options.run_dir);
        let port_arg = port.map_or_else(|| "-1".to_string(), |p| p.to_string());
        let program = resolve_program(&options.program);
        let conf = options.run_dir.join("nats-server.conf");
        write_config(&conf, options, &program).await?;
        let mut cmd = Command::new(&program);
        cmd.arg("-c")
            .arg(&conf)
            .arg("-js")
            .arg("-a")
            .arg(&options.host)
            .arg("-p")
            .arg(&port_arg)
            .arg("-sd")
            .arg(&options.store_dir)
            .arg("--ports_file_dir")
            .arg(&options.run_dir)
            .arg("-l")
            .arg(&log)
            .args(&options.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        die_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::Embedded(format!(
                    "`{}` was not found on PATH; {INSTALL_HINT}",
                    options.program.display()
                ))
            } else {
                fail(&format!("start {}", options.program.display()), &e)
            }
        })?;
        let mut server = Self {
            child,
            url: String::new(),
            port: 0,
            options: options.clone(),
        };
        server.wait_ready(&log).await?;
        Ok(server)
    }

    async fn wait_ready(&mut self, log: &Path) -> Result<()> {
        let deadline = Instant::now() + self.options.ready_timeout;
        let pid = self.child.id().unwrap_or_default();
        let ports_file = self.options.run_dir.join(format!(
            "{}_{pid}.ports",
            self.options
                .program
                .file_name()
                .map_or("nats-server".into(), |n| n.to_string_lossy())
        ));
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .map_err(|e| Error::Embedded(e.to_string()))?
            {
                let tail = log_tail(log);
                return Err(Error::Embedded(format!(
                    "nats-server exited ({status}) before it was ready: {tail}"
                )));
            }
            if self.url.is_empty()
                && let Some(url) = read_client_url(&ports_file)
            {
                self.port = url
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                self.url = url;
            }
            if !self.url.is_empty() && jetstream_answers(&self.url).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("nats-server to start (log: {})", log.display()),
                    after: self.options.ready_timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The client URL, e.g. `nats://127.0.0.1:41234`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Stops the server gracefully (SIGTERM lets JetStream flush its
    /// store), killing it if it has not exited within `grace`.
    pub async fn stop(mut self, grace: Duration) -> Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            if tokio::time::timeout(grace, self.child.wait()).await.is_ok() {
                return Ok(());
            }
            tracing::warn!("nats-server did not stop within {grace:?}; killing it");
        }
        self.child
            .kill()
            .await
            .map_err(|e| Error::Embedded(format!("kill nats-server: {e}")))
    }

    /// Kills the server at once (SIGKILL), as a crash would, and waits for it
    /// to be gone. For fault tests.
    pub async fn kill(&mut self) -> Result<()> {
        self.child
            .kill()
            .await
            .map_err(|e| Error::Embedded(format!("kill nats-server: {e}")))
    }

    /// Resolves when the server process exits, with how it exited and the
    /// last lines of its log. Cancel-safe: dropping the future leaves the
    /// server running.
    pub async fn exited(&mut self) -> String {
        let status = match self.child.wait().await {
            Ok(status) => status.to_string(),
            Err(e) => format!("unknown status ({e})"),
        };
        let log = self.options.run_dir.join("nats-server.log");
        format!("{status}; log: {}", log_tail(&log))
    }

    /// Starts `nodes` servers as one cluster, each from `base` with its
    /// store and run directory under `dir/node-<n>/` and its own client
    /// port (the first on `base.port` when it is free), routes on free
    /// ports of `base.host`. They are started together: in a cluster
    /// JetStream serves only once a majority is up. Their client URLs,
    /// joined with commas, are what a client connects with.
    pub async fn start_cluster(
        base: &EmbeddedOptions,
        dir: &Path,
        nodes: usize,
    ) -> Result<Vec<EmbeddedServer>> {
        if nodes < 2 {
            return Err(Error::Config(format!(
                "a cluster needs at least 2 servers (3 for replicas to survive one lost), not {nodes}"
            )));
        }
        let route_ports = free_ports(&base.host, nodes)?;
        let routes: Vec<String> = route_ports
            .iter()
            .map(|p| format!("nats-route://{}:{p}", base.host))
            .collect();
        let starts = (0..nodes).map(|n| {
            let node_dir = dir.join(format!("node-{n}"));
            let options = EmbeddedOptions {
                store_dir: node_dir.join("jetstream"),
                run_dir: node_dir,
                port: if n == 0 { base.port } else { None },
                cluster: Some(ClusterNode {
                    name: "nisse".into(),
                    server_name: format!("nisse-{n}"),
                    route_port: route_ports[n],
                    routes: routes.clone(),
                }),
                ..base.clone()
            };
            Self::start(options)
        });
        futures::future::try_join_all(starts).await
    }

    /// The client URLs of `servers`, joined with commas, as `bus.url`
    /// takes them.
    pub fn cluster_url(servers: &[EmbeddedServer]) -> String {
        servers
            .iter()
            .map(EmbeddedServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts the server again on the same port and store, after it died
    /// or was killed: clients reconnect to it on their own.
    pub async fn restart(&mut self) -> Result<()> {
        let _ = self.child.kill().await;
        let mut options = self.options.clone();
        options.port = Some(self.port);
        let fresh = Self::spawn(&options, Some(self.port)).await?;
        *self = fresh;
        Ok(())
    }
}

/// The program to run: as configured, or, for a bare name that is not
/// on `PATH`, Debian's `/usr/sbin/<name>` (a normal user's `PATH` often
/// lacks `/usr/sbin`, where Debian installs the server).
pub fn resolve_program(program: &Path) -> PathBuf {
    let bare = program.components().count() == 1;
    let on_path = || {
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir| dir.join(program).is_file())
        })
    };
    let fallback = Path::new("/usr/sbin").join(program);
    if bare && !on_path() && fallback.is_file() {
        fallback
    } else {
        program.to_path_buf()
    }
}

/// The server's version, from `nats-server --version`; `None` when it
/// cannot be told (the server then starts without settings that need a
/// known version).
async fn server_version(program: &Path) -> Option<ServerVersion> {
    let out = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .await
        .ok()?;
    ServerVersion::parse(&String::from_utf8_lossy(&out.stdout))
        .or_else(|| ServerVersion::parse(&String::from_utf8_lossy(&out.stderr)))
}

/// Writes the server's configuration file: the authorization block and
/// JetStream's sync interval (command-line flags give the rest). Written
/// at every start, so it always says what this start was given.
async fn write_config(conf: &Path, options: &EmbeddedOptions, program: &Path) -> Result<()> {
    let mut text = String::from("# Written by nisse at every start of the embedded server.\n");
    let sync = match options.sync {
        SyncInterval::ServerDefault => None,
        SyncInterval::Always => Some("always".to_string()),
        SyncInterval::Every(d) => Some(format!("\"{}s\"", d.as_secs().max(1))),
    };
    if let Some(sync) = sync {
        match server_version(program).await {
            Some(v) if v >= ServerVersion::SYNC_INTERVAL => {
                text.push_str(&format!("jetstream {{ sync_interval: {sync} }}\n"));
            }
            found => tracing::warn!(
                version = %found.map_or_else(|| "unknown".to_string(), |v| v.to_string()),
                "this nats-server cannot be told how often to fsync (sync_interval needs 2.10 or later): it fsyncs every two minutes, so messages it acknowledged can be lost on a power failure (not on a crash of a process), and a brain whose stream went back then refuses to start; install nats-server 2.10 or later for `sync-interval = \"always\"`"
            ),
        }
    }
    if let Some(node) = &options.cluster {
        let routes: Vec<String> = node.routes.iter().map(|r| format!("{r:?}")).collect();
        text.push_str(&format!(
            "server_name: {:?}\ncluster {{\n  name: {:?}\n  listen: \"{}:{}\"\n  routes: [{}]\n}}\n",
            node.server_name,
            node.name,
            options.host,
            node.route_port,
            routes.join(", ")
        ));
    }
    if let Some(auth) = &options.authorization {
        text.push_str(auth);
    }
    std::fs::write(conf, text)
        .map_err(|e| Error::Embedded(format!("writing {}: {e}", conf.display())))
}

/// `n` distinct free ports on `host`, each bound at once and let go
/// together (so no two are the same).
fn free_ports(host: &str, n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind((host, 0)))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Error::Embedded(format!("finding free ports on {host}: {e}")))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Error::Embedded(format!("finding free ports on {host}: {e}")))
}

fn port_is_free(host: &str, port: u16) -> bool {
    TcpListener::bind((host, port)).is_ok()
}

fn clear_ports_files(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "ports") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The first client URL in a ports file (`{"nats": ["nats://..."], ...}`).
fn read_client_url(path: &Path) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Ports {
        nats: Vec<String>,
    }
    let text = std::fs::read_to_string(path).ok()?;
    let ports: Ports = serde_json::from_str(&text).ok()?;
    ports.nats.into_iter().next()
}

/// Whether the server accepts clients with JetStream on: its greeting, the
/// plain-text `INFO` line every client gets first (before any TLS handshake
/// or authentication), says `"jetstream": true`. The server opens its client
/// port only once JetStream has started, so this is readiness, and it works
/// for servers that require TLS or credentials, which a client probe could
/// not satisfy.
async fn jetstream_answers(url: &str) -> bool {
    use tokio::io::AsyncBufReadExt as _;

    let Some(addr) = url.split("://").nth(1) else {
        return false;
    };
    let probe = async {
        let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut line = String::new();
        tokio::io::BufReader::new(stream)
            .read_line(&mut line)
            .await
            .ok()?;
        let info: serde_json::Value =
            serde_json::from_str(line.strip_prefix("INFO ")?.trim()).ok()?;
        info.get("jetstream")?.as_bool()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), probe).await,
        Ok(Some(true))
    )
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    if lines.is_empty() {
        format!("no log at {}", log.display())
    } else {
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

/// Asks Linux to SIGTERM the server if this process dies without stopping
/// it (SIGKILL, a panic abort), so no orphaned server keeps the store locked.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only
    // makes the async-signal-safe prctl(2) call.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
        });
    }
}
