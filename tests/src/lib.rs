//! The harness every Nisse integration test stands on: a real `nats-server`
//! with JetStream per test, on a free loopback port with a temporary store
//! (never the shared server on 4222), buses connected to it, services run
//! in-process with their own shutdown token, and recording of a stream range
//! on one server to replay it on another.
//!
//! A missing server binary fails the test with the package to install; it
//! never skips.

pub mod alertmanager;
pub mod gitea;
pub mod mcp;
pub mod model;
pub mod sshd;
pub mod synapse;
pub mod vikunja;
pub mod web;
use std::time::Duration;

use anyhow::Context as _;
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use nisse_bus::auth::{AuthPlan, Credentials, Identity};
use nisse_bus::embedded::{EmbeddedOptions, EmbeddedServer};
use nisse_bus::{AgentName, Bus, BusConfig, StoredMessage};

/// How one launch of a harness server failed.
pub(crate) enum LaunchError {
    /// The port was taken: another one (or the same one later) may work.
    PortInUse(anyhow::Error),
    /// Anything else.
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for LaunchError {
    fn from(e: anyhow::Error) -> Self {
        Self::Failed(e)
    }
}

impl From<std::io::Error> for LaunchError {
    fn from(e: std::io::Error) -> Self {
        Self::Failed(e.into())
    }
}

/// A loopback port that was free a moment ago (bound and released: a
/// launch that then finds it taken tries another).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The last `lines` lines of `text`, for error messages.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Stops a server the harness started: SIGTERM, then waits up to
/// `timeout` for it to exit, and kills it if it has not. `name` and
/// `log_tail` go into the error, so a server that will not stop says what
/// it was doing.
pub async fn stop_child(
    child: &mut tokio::process::Child,
    name: &str,
    timeout: Duration,
    log_tail: impl Fn() -> String,
) -> anyhow::Result<()> {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    if let Some(pid) = child.id() {
        let pid =
            i32::try_from(pid).with_context(|| format!("{name}'s pid does not fit a pid_t"))?;
        // It may have exited already; waiting below tells.
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => {
            status.with_context(|| format!("waiting for {name}; log tail:\n{}", log_tail()))?;
        }
        Err(_) => {
            child.kill().await.with_context(|| {
                format!(
                    "{name} ignored SIGTERM for {timeout:?} and could not be killed; log tail:\n{}",
                    log_tail()
                )
            })?;
        }
    }
    Ok(())
}

/// A `nats-server -js` of the test's own, killed when dropped.
pub struct TestNats {
    server: EmbeddedServer,
    dir: TempDir,
    /// With the generated authorization: the credentials it was made with.
    credentials: Option<Credentials>,
}

impl TestNats {
    /// Starts a server on a free loopback port with a fresh store.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with::<&str>(&[]).await
    }

    /// Starts a server with more `nats-server` arguments, e.g.
    /// `["--user", "u", "--pass", "p"]` to require authentication.
    pub async fn start_with<S: AsRef<str>>(args: &[S]) -> anyhow::Result<Self> {
        Self::launch(|options, _| {
            options.extra_args = args.iter().map(|a| a.as_ref().to_string()).collect();
            Ok(None)
        })
        .await
    }

    /// Starts a server in a new temporary directory with the options
    /// `set` gives (and the credentials it made there, if any).
    async fn launch(
        set: impl FnOnce(&mut EmbeddedOptions, &std::path::Path) -> anyhow::Result<Option<Credentials>>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("nisse-nats-").tempdir()?;
        let mut options = EmbeddedOptions::in_dir(dir.path());
        let credentials = set(&mut options, dir.path())?;
        let server = EmbeddedServer::start(options)
            .await
            .context("the tests need `nats-server` (Debian package `nats-server`)")?;
        Ok(Self {
            server,
            dir,
            credentials,
        })
    }

    /// Starts a server with the authorization `nisse up` generates for
    /// `plan`, its credentials made under a data directory of the server's
    /// own ([`TestNats::data_dir`], where `nisse up` would make them):
    /// every connection needs an identity of the plan, and each may do
    /// only its part. [`TestNats::bus`] then connects as the admin.
    pub async fn with_auth(plan: &AuthPlan) -> anyhow::Result<Self> {
        Self::launch(|options, dir| {
            let credentials = Credentials::in_data_dir(&dir.join("data"));
            options.authorization =
                Some(nisse_bus::auth::server_authorization(plan, &credentials)?);
            Ok(Some(credentials))
        })
        .await
    }

    /// A server with the authorization `nisse up` makes for `agents`
    /// operated by the user running the tests: what every end-to-end test
    /// of the services runs on, so each `nisse serve` process and the CLI
    /// connect as their own identities, with only their permissions.
    pub async fn secured(agents: &[&str]) -> anyhow::Result<Self> {
        Self::with_auth(&local_plan(agents, &[])?).await
    }

    /// The data directory whose credentials a server started
    /// [`TestNats::with_auth`] accepts: installs under test use it as
    /// theirs, so their services find their identities.
    pub fn data_dir(&self) -> Option<std::path::PathBuf> {
        self.credentials
            .as_ref()
            .map(|_| self.dir.path().join("data"))
    }

    /// A connection as `identity` (see [`TestNats::with_auth`]), serving
    /// `agents`, with [`TestNats::bus_config`].
    pub async fn bus_as(&self, identity: &Identity, agents: &[&str]) -> anyhow::Result<Bus> {
        let credentials = self
            .credentials
            .as_ref()
            .context("this server was started without authorization (TestNats::with_auth)")?;
        Ok(Bus::connect_as(
            &self.bus_config(),
            agent_names(agents)?,
            identity,
            credentials,
        )
        .await?)
    }

    /// The credentials of a server started [`TestNats::with_auth`].
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// The client URL.
    pub fn url(&self) -> &str {
        self.server.url()
    }

    /// The temporary directory holding the store and the server log.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Bus settings for this server with timings short enough for tests:
    /// a 1 s ack wait, 3 deliveries, 50 ms retry backoff.
    pub fn bus_config(&self) -> BusConfig {
        let mut cfg = BusConfig {
            url: Some(self.url().to_string()),
            ..BusConfig::default()
        };
        cfg.consumers.ack_wait = Duration::from_secs(1);
        cfg.consumers.max_deliver = 3;
        cfg.consumers.retry_backoff = Duration::from_millis(50);
        cfg.consumers.retry_backoff_max = Duration::from_millis(200);
        cfg.streams.duplicate_window = Duration::from_secs(60);
        cfg
    }

    /// A new connection serving `agents`, with [`TestNats::bus_config`].
    pub async fn bus(&self, agents: &[&str]) -> anyhow::Result<Bus> {
        self.bus_with(self.bus_config(), agents).await
    }

    /// A new connection with the given settings (its URL set to this
    /// server); as the admin when the server requires credentials.
    pub async fn bus_with(&self, mut cfg: BusConfig, agents: &[&str]) -> anyhow::Result<Bus> {
        cfg.url = Some(self.url().to_string());
        let agents = agent_names(agents)?;
        Ok(match &self.credentials {
            Some(credentials) => {
                Bus::connect_as(&cfg, agents, &Identity::Admin, credentials).await?
            }
            None => Bus::connect(&cfg, agents, "nisse-tests").await?,
        })
    }

    /// Kills the server as a crash would.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        Ok(self.server.kill().await?)
    }

    /// Starts it again on the same port with the same store.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        Ok(self.server.restart().await?)
    }
}

fn agent_names(agents: &[&str]) -> anyhow::Result<Vec<AgentName>> {
    Ok(agents
        .iter()
        .map(|a| a.parse::<AgentName>())
        .collect::<Result<Vec<_>, _>>()?)
}

/// The authorization plan of an installation of `agents` operated from
/// the CLI by the user running the tests, as `nisse up` makes it with the
/// default configuration (`cli:<local user>` on every allowlist), plus
/// the `extra` operators.
pub fn local_plan(agents: &[&str], extra: &[&str]) -> anyhow::Result<AuthPlan> {
    let uid = nix::unistd::getuid();
    let user = nix::unistd::User::from_uid(uid)?.map_or_else(|| format!("uid{uid}"), |u| u.name);
    let agents = agent_names(agents)?;
    let mut operators = std::collections::BTreeMap::new();
    for name in std::iter::once(user.as_str()).chain(extra.iter().copied()) {
        operators.insert(name.parse()?, agents.iter().cloned().collect());
    }
    Ok(AuthPlan {
        agents,
        operators,
        ..Default::default()
    })
}

/// A certificate authority and a server certificate for `127.0.0.1` and
/// `localhost` it signed, written as PEM files into a directory: for
/// starting a server that requires TLS.
pub struct TestTls {
    /// The CA certificate clients verify the server with.
    pub ca_file: std::path::PathBuf,
    /// The server's certificate.
    pub cert_file: std::path::PathBuf,
    /// The server's private key.
    pub key_file: std::path::PathBuf,
}

impl TestTls {
    /// Generates the files in `dir`.
    pub fn generate(dir: &std::path::Path) -> anyhow::Result<Self> {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate()?;
        let server_params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
        let server_cert = server_params.signed_by(&server_key, &issuer)?;

        let files = Self {
            ca_file: dir.join("ca.pem"),
            cert_file: dir.join("server.pem"),
            key_file: dir.join("server-key.pem"),
        };
        std::fs::write(&files.ca_file, ca_cert.pem())?;
        std::fs::write(&files.cert_file, server_cert.pem())?;
        std::fs::write(&files.key_file, server_key.serialize_pem())?;
        Ok(files)
    }

    /// The `nats-server` arguments that require TLS with this certificate.
    pub fn server_args(&self) -> Vec<String> {
        vec![
            "--tls".into(),
            "--tlscert".into(),
            self.cert_file.display().to_string(),
            "--tlskey".into(),
            self.key_file.display().to_string(),
        ]
    }
}

/// An agent brain's signing key, installed under a data directory where
/// the brain makes it on its first start (and the executor finds its
/// public half): for tests that publish execution requests and host
/// bindings the way the brain does, signed.
pub struct BrainKey(nisse_bus::signing::SigningKey);

impl BrainKey {
    /// The key of `agent`'s brain under `data_dir`, made if missing.
    pub fn install(data_dir: &std::path::Path, agent: &str) -> anyhow::Result<Self> {
        let (key, public) = nisse_bus::signing::key_files(data_dir, agent);
        Ok(Self(
            nisse_bus::signing::SigningKey::load_or_create(&key, &public)?.0,
        ))
    }

    /// `request`, signed.
    pub fn exec(&self, mut request: nisse_proto::v1::ExecRequest) -> nisse_proto::v1::ExecRequest {
        self.0.sign(&mut request);
        request
    }

    /// `binding`, signed.
    pub fn binding(
        &self,
        mut binding: nisse_proto::v1::HostBinding,
    ) -> nisse_proto::v1::HostBinding {
        self.0.sign(&mut binding);
        binding
    }

    /// The key itself.
    pub fn key(&self) -> &nisse_bus::signing::SigningKey {
        &self.0
    }
}

/// A command request for agent `ops` on work item `wi-1`, with the dedup id
/// `exec:<id>`: a valid message of a fixed shape for tests to publish.
pub fn exec_request(id: &str) -> nisse_proto::v1::ExecRequest {
    nisse_proto::v1::ExecRequest {
        envelope: Some(nisse_proto::v1::Envelope {
            agent: "ops".into(),
            work_item_id: "wi-1".into(),
            message_id: format!("exec:{id}"),
            ..Default::default()
        }),
        request_id: id.into(),
        host: "nas".into(),
        command: format!("zpool status # {id}"),
        ..Default::default()
    }
}

/// A REPLACE of `path` with `markdown` for agent `ops` on work item
/// `wi-1`, under request id `request` and the dedup id
/// `vault-write:<request>`: a note as the brain asks for one.
pub fn vault_write(request: &str, path: &str, markdown: &str) -> nisse_proto::v1::VaultWrite {
    nisse_proto::v1::VaultWrite {
        envelope: Some(nisse_proto::v1::Envelope {
            agent: "ops".into(),
            work_item_id: "wi-1".into(),
            message_id: format!("vault-write:{request}"),
            ..Default::default()
        }),
        request_id: request.into(),
        path: path.into(),
        markdown: markdown.into(),
        mode: nisse_proto::v1::VaultWriteMode::Replace as i32,
        source: "driver via note".into(),
        ..Default::default()
    }
}

/// Every file under `root` whose path has no hidden component (`.git`,
/// the writer's temporaries), by path relative to `root`, with its bytes:
/// a vault folder to compare with another. A missing `root` is empty.
pub fn vault_files(root: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(
        root: &std::path::Path,
        dir: &std::path::Path,
        out: &mut std::collections::BTreeMap<String, Vec<u8>>,
    ) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if let (Ok(rel), Ok(bytes)) = (path.strip_prefix(root), std::fs::read(&path)) {
                out.insert(rel.to_string_lossy().into_owned(), bytes);
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The sequence of the last input (`nisse.<agent>.in.>`) in `agent`'s
/// stream, 0 when there is none: where a brain that has applied
/// everything stands.
pub async fn last_input_sequence(bus: &Bus, agent: &AgentName) -> anyhow::Result<u64> {
    let mut reader = bus.read_range(agent, 1, None).await?;
    let mut last = 0;
    while let Some(m) = reader.next().await {
        let m = m?;
        let input = nisse_bus::SubjectKind::parse(&m.subject)
            .is_some_and(|(_, kind)| kind.direction() == nisse_bus::Direction::In);
        if input {
            last = m.sequence;
        }
    }
    Ok(last)
}

/// The agent name `ops`.
pub fn ops() -> AgentName {
    agent("ops")
}

/// An agent name; panics on an invalid one, which is a test bug.
pub fn agent(name: &str) -> AgentName {
    name.parse()
        .unwrap_or_else(|e| panic!("test agent name {name}: {e}"))
}

/// The context a service is started with, for running one in a test:
/// every agent `bus` serves, `config` as its section, `shutdown` as its
/// token, a readiness nobody waits on, and the working directory as its
/// data directory unless the test sets another.
pub fn service_context<C>(
    bus: &Bus,
    config: C,
    shutdown: CancellationToken,
) -> nisse_bus::service::Context<C> {
    nisse_bus::service::Context {
        config: std::sync::Arc::new(config),
        bus: bus.clone(),
        agents: bus.agents().to_vec(),
        shutdown,
        ready: nisse_bus::service::Ready::detached("test"),
        data_dir: std::path::PathBuf::from("."),
    }
}

/// A service or loop running in-process on its own task, stopped by its own
/// token, the way `nisse up` runs services.
pub struct InProcess {
    token: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

impl InProcess {
    /// Spawns `run(token)`.
    pub fn spawn<F, Fut>(run: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let token = CancellationToken::new();
        let task = tokio::spawn(run(token.clone()));
        Self { token, task }
    }

    /// Starts a service the way `nisse` does, with a context for every
    /// agent of `bus`, `config` as its section and `data_dir` as its data
    /// directory, and returns once it has reported ready. Fails if it stops
    /// before.
    pub async fn service<C, F, Fut>(
        bus: &Bus,
        config: C,
        data_dir: &std::path::Path,
        run: F,
    ) -> anyhow::Result<Self>
    where
        F: FnOnce(nisse_bus::service::Context<C>) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let token = CancellationToken::new();
        let readiness = nisse_bus::service::Readiness::default();
        let mut ctx = service_context(bus, config, token.clone());
        ctx.data_dir = data_dir.to_path_buf();
        ctx.ready = readiness.reporter("service");
        let mut task = tokio::spawn(run(ctx));
        let name = ["service".to_string()];
        tokio::select! {
            _ = readiness.wait_for(&name) => Ok(Self { token, task }),
            ended = &mut task => {
                ended.context("the service panicked")??;
                anyhow::bail!("the service stopped before it was ready")
            }
        }
    }

    /// Asks it to stop and waits for it, failing if it does not stop within
    /// `grace` or returned an error.
    pub async fn stop(self, grace: Duration) -> anyhow::Result<()> {
        self.token.cancel();
        tokio::time::timeout(grace, self.task)
            .await
            .context("the service did not stop in time")??
    }
}

/// A recorded range of an agent's stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Recording {
    /// The messages in stream order.
    pub messages: Vec<StoredMessage>,
}

impl Recording {
    /// Records `agent`'s stream from `from` through `to` (inclusive).
    pub async fn record(
        bus: &Bus,
        agent: &AgentName,
        from: u64,
        to: Option<u64>,
    ) -> anyhow::Result<Self> {
        let mut reader = bus.read_range(agent, from, to).await?;
        let mut messages = Vec::new();
        while let Some(m) = reader.next().await {
            messages.push(m?);
        }
        Ok(Self { messages })
    }

    /// Publishes every recorded message, in order, onto `bus` (usually
    /// another server), as it was.
    pub async fn replay(&self, bus: &Bus) -> anyhow::Result<()> {
        for m in &self.messages {
            bus.republish(m).await?;
        }
        Ok(())
    }
}
