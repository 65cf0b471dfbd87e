//! SSH to the hosts of one agent: pinned host keys, key authentication,
//! one authenticated connection per host shared by many channels, and
//! every command run under bash whatever the login shell ([`crate::bash`]).
//!
//! Host keys are checked against the agent's own known-hosts file before
//! authentication (Oikos §8.4 B4 turned verification off; here there is no
//! switch for that). An unknown key is refused unless the operator enabled
//! trust-on-first-use for that host; a changed key is always refused, with
//! the offered key's fingerprint so the operator can compare it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use russh::client::{self, Handle};
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate};
use russh::{ChannelMsg, Disconnect};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::bash::{self, Watch};
use crate::config::{AgentSetup, HostConfig};

/// Why a command could not be run, or did not finish.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SshError {
    /// The host's key is not pinned.
    #[error(
        "the host key of {host} ({fingerprint}) is not in {known_hosts}; nothing was run. Check the key on the host, then add it (e.g. `ssh-keyscan -p {port} {address} >> {known_hosts}`) or enable trust-on-first-use for the host"
    )]
    HostKeyUnknown {
        /// The host's name.
        host: String,
        /// Its address.
        address: String,
        /// Its port.
        port: u16,
        /// The offered key.
        fingerprint: String,
        /// The agent's known-hosts file.
        known_hosts: String,
    },
    /// The host's key differs from the pinned one.
    #[error(
        "the host key of {host} CHANGED: it offered {fingerprint}, which differs from the key pinned at line {line} of {known_hosts}; nothing was run. Someone may be intercepting the connection, or the host was reinstalled. If the change is expected, replace that line with the new key"
    )]
    HostKeyChanged {
        /// The host's name.
        host: String,
        /// The offered key.
        fingerprint: String,
        /// The pinned entry's line.
        line: usize,
        /// The agent's known-hosts file.
        known_hosts: String,
    },
    /// Authentication failed or the key could not be used.
    #[error("{0}")]
    Auth(String),
    /// The host could not be reached, or the connection failed before the
    /// command was started.
    #[error("{0}")]
    Connect(String),
    /// The host refused to pass a secret on.
    #[error("{0}")]
    Secret(String),
    /// The command outran its time.
    #[error(
        "the command did not finish within {0:?}; its channel was closed, but it may still be running on the host"
    )]
    Timeout(Duration),
    /// The connection broke after the command was started.
    #[error("the connection broke while the command ran: {0}")]
    Broken(String),
    /// The command cannot be handed to bash as it is.
    #[error("{0}")]
    Unsendable(#[from] bash::Unsendable),
    /// The host's login shell did not start bash, so the command, which
    /// only bash reads, did not run. Lasting: it holds until bash is
    /// installed there.
    #[error(
        "{host} did not start bash for the command, so nothing was run: the executor runs every command with bash, never with the login shell (which could read it otherwise than it was classified). The login shell answered {answer}. Install bash on {host} (the login shell can stay: it only starts bash)"
    )]
    NoBash {
        /// The host's name.
        host: String,
        /// What the login shell said and how it exited.
        answer: String,
    },
}

impl SshError {
    /// Whether this says the host could not be reached (what the circuit
    /// breaker counts).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Connect(_) | Self::Broken(_))
    }
}

/// Connection settings shared by every host.
#[derive(Debug, Clone, Copy)]
pub struct SshSettings {
    /// Connecting, key check and authentication together.
    pub connect_timeout: Duration,
    /// An unused connection is closed after this.
    pub idle_timeout: Duration,
    /// Channels at once per connection.
    pub max_channels: usize,
}

/// Output as it arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Standard output.
    Stdout(Vec<u8>),
    /// Standard error.
    Stderr(Vec<u8>),
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Exit {
    /// Its exit status, if it exited.
    pub code: Option<u32>,
    /// The signal that ended it, if one did.
    pub signal: Option<String>,
}

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct RunSpec {
    /// The literal command line, for bash to run (never the login shell).
    pub command: String,
    /// Environment variables to pass (secrets), by SSH `env` requests.
    pub env: Vec<(String, String)>,
    /// Standard input, then end of file (after the command itself, which
    /// bash reads first and the command never sees).
    pub stdin: Vec<u8>,
    /// How long it may run.
    pub timeout: Duration,
}

/// Checks the server's key against the known-hosts file.
struct Verifier {
    host: String,
    address: String,
    port: u16,
    known_hosts: PathBuf,
    trust_on_first_use: bool,
    problem: Arc<Mutex<Option<SshError>>>,
}

fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

impl Verifier {
    fn refuse(&self, problem: SshError) -> bool {
        if let Ok(mut slot) = self.problem.lock() {
            *slot = Some(problem);
        }
        false
    }

    fn verify(&self, key: &PublicKey) -> bool {
        let path = self.known_hosts.display().to_string();
        match russh::keys::check_known_hosts_path(&self.address, self.port, key, &self.known_hosts)
        {
            Ok(true) => true,
            Ok(false) if self.trust_on_first_use => {
                match russh::keys::known_hosts::learn_known_hosts_path(
                    &self.address,
                    self.port,
                    key,
                    &self.known_hosts,
                ) {
                    Ok(()) => {
                        tracing::warn!(
                            host = %self.host,
                            key = %fingerprint(key),
                            known_hosts = %path,
                            "trusted the host key on first use and pinned it"
                        );
                        true
                    }
                    Err(e) => self.refuse(SshError::Auth(format!(
                        "could not pin the host key of {} in {path}: {e}",
                        self.host
                    ))),
                }
            }
            Ok(false) => self.refuse(SshError::HostKeyUnknown {
                host: self.host.clone(),
                address: self.address.clone(),
                port: self.port,
                fingerprint: fingerprint(key),
                known_hosts: path,
            }),
            Err(russh::keys::Error::KeyChanged { line }) => self.refuse(SshError::HostKeyChanged {
                host: self.host.clone(),
                fingerprint: fingerprint(key),
                line,
                known_hosts: path,
            }),
            Err(e) => self.refuse(SshError::Auth(format!(
                "the known-hosts file {path} cannot be read: {e}"
            ))),
        }
    }
}

impl client::Handler for Verifier {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        offered: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(match offered {
            PublicKeyOrCertificate::PublicKey { key, .. } => self.verify(key),
            PublicKeyOrCertificate::Certificate(_) => self.refuse(SshError::Auth(format!(
                "{} offered a host certificate; pin its plain host key instead",
                self.host
            ))),
        })
    }
}

/// One authenticated connection.
struct Conn {
    handle: Handle<Verifier>,
    slots: Arc<Semaphore>,
    max: usize,
    last_used: Mutex<Instant>,
}

impl Conn {
    fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
    }

    fn idle_for(&self) -> Duration {
        if self.slots.available_permits() < self.max {
            return Duration::ZERO;
        }
        self.last_used
            .lock()
            .map_or(Duration::ZERO, |t| t.elapsed())
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;

/// The connections of one agent, one per host, reused for every command.
pub struct Pool {
    setup: AgentSetup,
    settings: SshSettings,
    conns: Mutex<HashMap<String, Slot>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("hosts", &self.setup.hosts.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool for one agent's hosts. Nothing connects until a command
    /// needs it.
    pub fn new(setup: AgentSetup, settings: SshSettings) -> Self {
        Self {
            setup,
            settings,
            conns: Mutex::new(HashMap::new()),
        }
    }

    /// The host's settings, if the agent has any for it.
    pub fn host(&self, name: &str) -> Option<&HostConfig> {
        self.setup.hosts.get(name)
    }

    /// The agent's resolved settings.
    pub fn setup(&self) -> &AgentSetup {
        &self.setup
    }

    fn slot(&self, host: &str) -> Slot {
        let mut conns = match self.conns.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        conns.entry(host.to_string()).or_default().clone()
    }

    /// A live connection to `host`, made if there is none.
    async fn connection(&self, host: &str) -> Result<Arc<Conn>, SshError> {
        let slot = self.slot(host);
        let mut guard = slot.lock().await;
        if let Some(conn) = guard.as_ref()
            && !conn.handle.is_closed()
        {
            return Ok(conn.clone());
        }
        *guard = None;
        let conn = Arc::new(self.connect(host).await?);
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets `host`'s connection if it is `conn` (it broke).
    async fn evict(&self, host: &str, conn: &Arc<Conn>) {
        let slot = self.slot(host);
        let mut guard = slot.lock().await;
        if guard.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *guard = None;
        }
    }

    async fn connect(&self, host: &str) -> Result<Conn, SshError> {
        let cfg = self
            .setup
            .hosts
            .get(host)
            .ok_or_else(|| SshError::Connect(format!("no connection settings for {host}")))?;
        let key = russh::keys::load_secret_key(&self.setup.key_file, None).map_err(|e| {
            SshError::Auth(format!(
                "the agent's SSH key {} cannot be used: {e}",
                self.setup.key_file.display()
            ))
        })?;
        let problem = Arc::new(Mutex::new(None));
        let verifier = Verifier {
            host: host.to_string(),
            address: cfg.address.clone(),
            port: cfg.port,
            known_hosts: self.setup.known_hosts.clone(),
            trust_on_first_use: cfg.trust_on_first_use,
            problem: problem.clone(),
        };
        let config = Arc::new(client::Config {
            // Our own reaper closes idle connections; a session-level
            // inactivity timeout would also cut a quiet long command.
            inactivity_timeout: None,
            keepalive_interval: Some(Duration::from_secs(15)),
            keepalive_max: 3,
            nodelay: true,
            ..Default::default()
        });
        let target = format!("{}:{}", cfg.address, cfg.port);
        let attempt = async {
            let mut handle = client::connect(config, (cfg.address.as_str(), cfg.port), verifier)
                .await
                .map_err(|e| {
                    problem
                        .lock()
                        .ok()
                        .and_then(|mut p| p.take())
                        .unwrap_or_else(|| {
                            SshError::Connect(format!("cannot connect to {host} ({target}): {e}"))
                        })
                })?;
            let hash = handle
                .best_supported_rsa_hash()
                .await
                .map_err(|e| SshError::Connect(format!("{host}: {e}")))?
                .flatten();
            let auth = handle
                .authenticate_publickey(
                    cfg.user.clone(),
                    PrivateKeyWithHashAlg::new(Arc::new(key), hash),
                )
                .await
                .map_err(|e| SshError::Connect(format!("{host}: authentication broke off: {e}")))?;
            if !auth.success() {
                return Err(SshError::Auth(format!(
                    "{host} refused the agent's key {} for user `{}`",
                    self.setup.key_file.display(),
                    cfg.user
                )));
            }
            Ok(handle)
        };
        let handle = tokio::time::timeout(self.settings.connect_timeout, attempt)
            .await
            .map_err(|_| {
                SshError::Connect(format!(
                    "connecting to {host} ({target}) took longer than {:?}",
                    self.settings.connect_timeout
                ))
            })??;
        tracing::debug!(%host, %target, "connected");
        let max = self.settings.max_channels;
        Ok(Conn {
            handle,
            slots: Arc::new(Semaphore::new(max)),
            max,
            last_used: Mutex::new(Instant::now()),
        })
    }

    /// Runs `spec` on `host` under bash, sending output to `out` as it
    /// arrives. An error before the command was sent is `Unsendable`,
    /// `Connect`, `Auth`, a host key or a `Secret` refusal, and `NoBash`
    /// says the host did not start bash (nothing ran); after, `Timeout`
    /// or `Broken` (its outcome is unknown).
    pub async fn run(
        &self,
        host: &str,
        spec: &RunSpec,
        out: &mpsc::UnboundedSender<Chunk>,
    ) -> Result<Exit, SshError> {
        // Refused before any connection: a command bash cannot hold would
        // run as something else.
        let input = bash::input(&spec.command, &spec.stdin)?;
        // A pooled connection may have died since its last use; one retry
        // on a fresh connection, only while nothing was started.
        let mut retried = false;
        loop {
            let conn = self.connection(host).await?;
            let permit = conn
                .slots
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| SshError::Connect("the connection is closing".into()))?;
            match self.run_on(&conn, permit, host, spec, &input, out).await {
                Err(Attempt::NotStarted(e)) if !retried => {
                    tracing::debug!(%host, "channel failed on a pooled connection ({e}); reconnecting");
                    self.evict(host, &conn).await;
                    retried = true;
                }
                Err(Attempt::NotStarted(e)) => {
                    self.evict(host, &conn).await;
                    return Err(SshError::Connect(format!("{host}: {e}")));
                }
                Err(Attempt::Failed(e)) => {
                    if conn.handle.is_closed() {
                        self.evict(host, &conn).await;
                    }
                    return Err(e);
                }
                Ok(exit) => return Ok(exit),
            }
        }
    }

    async fn run_on(
        &self,
        conn: &Arc<Conn>,
        _permit: OwnedSemaphorePermit,
        host: &str,
        spec: &RunSpec,
        input: &[u8],
        out: &mpsc::UnboundedSender<Chunk>,
    ) -> Result<Exit, Attempt> {
        conn.touch();
        let mut channel = conn
            .handle
            .channel_open_session()
            .await
            .map_err(|e| Attempt::NotStarted(e.to_string()))?;
        for (name, value) in &spec.env {
            channel
                .set_env(true, name.clone(), value.clone())
                .await
                .map_err(|e| Attempt::NotStarted(e.to_string()))?;
            match wait_reply(&mut channel).await {
                Some(true) => {}
                Some(false) => {
                    let _ = channel.close().await;
                    return Err(Attempt::Failed(SshError::Secret(format!(
                        "sshd on {host} refused the environment variable {name}; nothing was run. Add `AcceptEnv {name}` to its sshd_config, or hand the secret over stdin"
                    ))));
                }
                None => return Err(Attempt::NotStarted("the channel closed".into())),
            }
        }
        // The login shell gets the fixed bootstrap; the command goes on
        // standard input, for bash alone to read.
        channel
            .exec(true, bash::BOOTSTRAP)
            .await
            .map_err(|e| Attempt::NotStarted(e.to_string()))?;
        // From here on the command may be running.
        let (mut reader, writer) = channel.split();
        // Standard input is written while output is read: a command that
        // prints before it reads, or a login shell that exits without
        // reading, cannot hold the writing up past the deadline.
        let send = async {
            writer.data_bytes(input.to_vec()).await?;
            writer.eof().await
        };
        tokio::pin!(send);
        let mut sending = true;
        let mut send_error = None;
        let mut watch = Watch::new();
        let deadline = tokio::time::Instant::now() + spec.timeout;
        let mut exit = Exit::default();
        let mut accepted = false;
        loop {
            let msg = tokio::select! {
                sent = &mut send, if sending => {
                    sending = false;
                    send_error = sent.err().map(|e| e.to_string());
                    continue;
                }
                m = reader.wait() => m,
                () = tokio::time::sleep_until(deadline) => {
                    let _ = writer.close().await;
                    conn.touch();
                    return Err(Attempt::Failed(SshError::Timeout(spec.timeout)));
                }
            };
            match msg {
                Some(ChannelMsg::Data { data }) => {
                    let data = watch.stdout(&data);
                    if !data.is_empty() {
                        let _ = out.send(Chunk::Stdout(data));
                    }
                }
                Some(ChannelMsg::ExtendedData { data, ext: 1 }) => {
                    watch.stderr(&data);
                    let _ = out.send(Chunk::Stderr(data.to_vec()));
                }
                Some(ChannelMsg::ExitStatus { exit_status }) => exit.code = Some(exit_status),
                Some(ChannelMsg::ExitSignal { signal_name, .. }) => {
                    exit.signal = Some(format!("{signal_name:?}"));
                }
                Some(ChannelMsg::Success) => accepted = true,
                Some(ChannelMsg::Failure) if !accepted => {
                    return Err(Attempt::Failed(SshError::Connect(format!(
                        "{host} refused to run the command"
                    ))));
                }
                Some(ChannelMsg::Close) | None => break,
                Some(_) => {}
            }
        }
        conn.touch();
        let held = watch.finish();
        if !held.is_empty() {
            let _ = out.send(Chunk::Stdout(held));
        }
        if exit.code.is_none() && exit.signal.is_none() {
            return Err(Attempt::Failed(SshError::Broken(match send_error {
                Some(e) => format!("sending the command and its input: {e}"),
                None => "the channel closed without an exit status".into(),
            })));
        }
        if !watch.seen() {
            // The login shell ended, and bash never said it had started.
            let said = watch.answer();
            let ended = match (exit.code, &exit.signal) {
                (Some(code), _) => format!("exit status {code}"),
                (None, Some(signal)) => format!("killed by signal {signal}"),
                (None, None) => "no exit status".into(),
            };
            return Err(Attempt::Failed(SshError::NoBash {
                host: host.to_string(),
                answer: if said.is_empty() {
                    format!("nothing ({ended})")
                } else {
                    format!("`{said}` ({ended})")
                },
            }));
        }
        // The command ran to its end; if it did not read all of its
        // standard input, that was its own business.
        Ok(exit)
    }

    /// Closes connections unused for longer than the idle timeout.
    pub async fn reap_idle(&self) {
        let slots: Vec<(String, Slot)> = match self.conns.lock() {
            Ok(c) => c.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            Err(_) => return,
        };
        for (host, slot) in slots {
            let mut guard = slot.lock().await;
            let idle = guard
                .as_ref()
                .is_some_and(|c| c.handle.is_closed() || c.idle_for() > self.settings.idle_timeout);
            if idle && let Some(conn) = guard.take() {
                tracing::debug!(%host, "closing an idle connection");
                let _ = conn
                    .handle
                    .disconnect(Disconnect::ByApplication, "idle", "en")
                    .await;
            }
        }
    }

    /// Closes every connection (at shutdown).
    pub async fn close_all(&self) {
        let slots: Vec<Slot> = match self.conns.lock() {
            Ok(c) => c.values().cloned().collect(),
            Err(_) => return,
        };
        for slot in slots {
            if let Some(conn) = slot.lock().await.take() {
                let _ = conn
                    .handle
                    .disconnect(Disconnect::ByApplication, "shutdown", "en")
                    .await;
            }
        }
    }
}

/// How an attempt on one connection went wrong.
enum Attempt {
    /// Before the command was sent: safe to try another connection.
    NotStarted(String),
    /// After, or for a reason another connection would not change.
    Failed(SshError),
}

/// Waits for the reply to a channel request: `Some(true)` success,
/// `Some(false)` failure, `None` the channel closed.
async fn wait_reply(channel: &mut russh::Channel<client::Msg>) -> Option<bool> {
    loop {
        match channel.wait().await? {
            ChannelMsg::Success => return Some(true),
            ChannelMsg::Failure => return Some(false),
            ChannelMsg::Close => return None,
            _ => {}
        }
    }
}
