//! One MCP server instance, as this service holds it: its connection
//! (a process started with a clean environment and its own secrets, or a
//! streamable HTTP endpoint with its bearer token, each read anew at every
//! connect), the tools it last listed, and what the brain is told of them.
//!
//! A supervisor per instance connects at start and lists its tools (every
//! page), publishes them as `McpTools` on `in.mcp.tools`, again after every
//! reconnect and whenever the server says its list changed; an instance
//! that cannot be reached is announced with the error and tried again with
//! backoff. A call that finds the connection gone (a crashed child, a
//! broken session) connects again itself first, so a crashed server is
//! restarted on the next call.

use std::collections::{BTreeSet, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion, Tool};
use rmcp::service::{
    ClientInitializeError, NotificationContext, Peer, RoleClient, RunningService, ServiceError,
};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceExt as _};
use tokio::io::AsyncBufReadExt as _;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use nisse_bus::proto::{Actor, ActorKind, Envelope, McpTools};
use nisse_bus::redact::Redactor;
use nisse_bus::secret::Secret;
use nisse_bus::{AgentName, Backoff, Bus, now_ms};

use crate::config::{InstanceConfig, Transport};
use crate::content;

/// How often the supervisor looks whether the connection is still there
/// and whether an announcement is still to be published.
const WATCH_EVERY: Duration = Duration::from_millis(500);

/// Lines of a server's standard error kept to explain a failed start.
const LAST_WORDS: usize = 8;

/// What connecting takes from the service's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// Starting or reaching the server, `initialize` and the first list.
    pub(crate) connect_timeout: Duration,
    /// The waits between tries to reach it.
    pub(crate) reconnect: Backoff,
}

/// The tools an instance last listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listing {
    /// The server's name and version, as it introduced itself.
    pub(crate) server: String,
    /// The tools' names.
    pub(crate) tools: BTreeSet<String>,
    /// The risk each tool's declared hints give it, when they make it
    /// stricter than the policy may say (`nisse_policy::mcp::hinted_risk`).
    pub(crate) hints: std::collections::BTreeMap<String, Option<nisse_policy::RiskClass>>,
}

/// A live connection, for one call.
#[derive(Clone)]
pub(crate) struct Session {
    /// Which connection it is (to drop that one when it broke).
    pub(crate) generation: u64,
    /// The server.
    pub(crate) peer: Peer<RoleClient>,
    /// Every credential handed to this connection.
    pub(crate) redactor: Redactor,
}

/// The client side of a connection: it hears the server say its tools
/// changed.
#[derive(Clone)]
struct Client {
    info: ClientConfig,
    changed: Arc<Notify>,
}

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }
}

struct Conn {
    generation: u64,
    client: RunningService<RoleClient, Client>,
    redactor: Redactor,
    since: Instant,
}

impl Conn {
    fn alive(&self) -> bool {
        !self.client.is_closed() && !self.client.peer().is_transport_closed()
    }

    fn session(&self) -> Session {
        Session {
            generation: self.generation,
            peer: self.client.peer().clone(),
            redactor: self.redactor.clone(),
        }
    }
}

/// What the brain was last told of the instance, and whether it was
/// published yet (a publish that failed is tried again, under the same
/// message id).
#[derive(Default)]
struct Announcement {
    current: Option<McpTools>,
    published: bool,
}

/// One instance.
pub(crate) struct Server {
    /// Its configuration.
    pub(crate) config: InstanceConfig,
    agent: AgentName,
    bus: Bus,
    settings: Settings,
    conn: tokio::sync::Mutex<Option<Conn>>,
    generations: std::sync::atomic::AtomicU64,
    listing: Mutex<Option<Arc<Listing>>>,
    changed: Arc<Notify>,
    announcement: Mutex<Announcement>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl Server {
    /// The instance `config` of `agent`, not connected yet.
    pub(crate) fn new(
        config: InstanceConfig,
        agent: AgentName,
        bus: Bus,
        settings: Settings,
    ) -> Self {
        Self {
            config,
            agent,
            bus,
            settings,
            conn: tokio::sync::Mutex::new(None),
            generations: std::sync::atomic::AtomicU64::new(0),
            listing: Mutex::new(None),
            changed: Arc::new(Notify::new()),
            announcement: Mutex::new(Announcement::default()),
        }
    }

    /// Its name.
    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    /// The tools it last listed, if it was ever reached.
    pub(crate) fn listing(&self) -> Option<Arc<Listing>> {
        lock(&self.listing).clone()
    }

    /// The live connection, connecting first when there is none (or the
    /// one there was is gone). The error says why it cannot be reached.
    pub(crate) async fn session(&self) -> Result<Session, String> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            if c.alive() {
                return Ok(c.session());
            }
            tracing::warn!(agent = %self.agent, instance = %self.name(), "the connection is gone (the server stopped or the session broke); connecting again");
        }
        if let Some(old) = conn.take() {
            close(old);
        }
        match self.connect().await {
            Ok((c, server, tools)) => {
                let session = c.session();
                self.listed(server, &tools, &c.redactor).await;
                *conn = Some(c);
                Ok(session)
            }
            Err(e) => {
                self.unreachable(&e).await;
                Err(e)
            }
        }
    }

    /// Drops connection `generation` if it is still the current one: a
    /// call found it broken, and the next one connects anew.
    pub(crate) async fn discard(&self, generation: u64) {
        let mut conn = self.conn.lock().await;
        if conn.as_ref().is_some_and(|c| c.generation == generation)
            && let Some(old) = conn.take()
        {
            close(old);
        }
    }

    /// Connects, then lists: the connection, the server's name and
    /// version, and its tools.
    async fn connect(&self) -> Result<(Conn, String, Vec<Tool>), String> {
        let last_words = Arc::new(Mutex::new(VecDeque::new()));
        let attempt = self.connect_within(last_words.clone());
        match tokio::time::timeout(self.settings.connect_timeout, attempt).await {
            Ok(Ok(connected)) => Ok(connected),
            Ok(Err(e)) => Err(with_last_words(e, &last_words)),
            Err(_) => Err(with_last_words(
                format!(
                    "it did not start and list its tools within {} (mcp.connect-timeout)",
                    humantime::format_duration(self.settings.connect_timeout)
                ),
                &last_words,
            )),
        }
    }

    async fn connect_within(
        &self,
        last_words: Arc<Mutex<VecDeque<String>>>,
    ) -> Result<(Conn, String, Vec<Tool>), String> {
        let client = Client {
            info: ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new(crate::SERVICE.name, env!("CARGO_PKG_VERSION")),
            )
            .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE),
            changed: self.changed.clone(),
        };
        let (running, redactor) = match self.config.transport() {
            Transport::Stdio {
                command,
                env,
                secret_env,
            } => {
                // Read at each start, so a rotated secret is used at once;
                // given to this process only.
                let mut secrets = Vec::new();
                for (var, path) in &secret_env {
                    let value = Secret::File(path.clone())
                        .read_text()
                        .map_err(|e| format!("its secret-env {var}: {e}"))?;
                    secrets.push((var.clone(), value));
                }
                let redactor = Redactor::new(secrets.iter().map(|(_, v)| v.as_bytes()));
                let (program, args) = command
                    .split_first()
                    .ok_or_else(|| "it has no command".to_string())?;
                let program = resolve(program)?;
                let mut cmd = tokio::process::Command::new(&program);
                cmd.args(args)
                    .env_clear()
                    .envs(env)
                    .envs(secrets)
                    .kill_on_drop(true);
                let (transport, stderr) = TokioChildProcess::builder(cmd)
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|e| format!("`{}` cannot be started: {e}", program.display()))?;
                if let Some(stderr) = stderr {
                    self.log_stderr(stderr, redactor.clone(), last_words);
                }
                let running = client.serve(transport).await.map_err(|e| {
                    format!(
                        "`{}` did not initialize: {}",
                        program.display(),
                        explain_init(&e)
                    )
                })?;
                (running, redactor)
            }
            Transport::Http { url, token_file } => {
                // Read at every connect, so a rotated token is used at once.
                let token = match &token_file {
                    Some(path) => Some(
                        Secret::File(path.clone())
                            .read_text()
                            .map_err(|e| format!("its token-file: {e}"))?,
                    ),
                    None => None,
                };
                let redactor = Redactor::new(token.iter().map(|t| t.as_bytes()));
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone());
                // A session the server let expire is not opened again
                // behind our back with the request sent again: a call is
                // made at most once, so it fails and the next one connects.
                config.reinit_on_expired_session = false;
                if let Some(token) = token {
                    config = config.auth_header(token);
                }
                let http = reqwest::Client::builder()
                    .connect_timeout(self.settings.connect_timeout)
                    .build()
                    .map_err(|e| format!("no HTTP client: {e}"))?;
                let transport = StreamableHttpClientTransport::with_client(http, config);
                let running = client.serve(transport).await.map_err(|e| {
                    content::redacted(
                        &redactor,
                        &format!("{url} did not initialize: {}", explain_init(&e)),
                    )
                })?;
                (running, redactor)
            }
        };
        let server = running
            .peer()
            .peer_info()
            .and_then(|info| info.server_info.clone())
            .map(|i| format!("{} {}", i.name, i.version))
            .unwrap_or_default();
        let tools = running.peer().list_all_tools().await.map_err(|e| {
            content::redacted(&redactor, &format!("listing its tools: {}", explain(&e)))
        })?;
        let generation = self
            .generations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        tracing::info!(agent = %self.agent, instance = %self.name(), %server, tools = tools.len(), "connected");
        Ok((
            Conn {
                generation,
                client: running,
                redactor,
                since: Instant::now(),
            },
            server,
            tools,
        ))
    }

    /// The server's standard error, redacted, in the log; its last lines
    /// kept to explain a start that failed.
    fn log_stderr(
        &self,
        stderr: tokio::process::ChildStderr,
        redactor: Redactor,
        last_words: Arc<Mutex<VecDeque<String>>>,
    ) {
        let (agent, instance) = (self.agent.clone(), self.name().to_string());
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let line = content::redacted(&redactor, &line);
                tracing::info!(%agent, %instance, "server: {line}");
                let mut last = lock(&last_words);
                if last.len() == LAST_WORDS {
                    last.pop_front();
                }
                last.push_back(line);
            }
        });
    }

    /// The server listed `tools`: kept for the walls and announced.
    async fn listed(&self, server: String, tools: &[Tool], redactor: &Redactor) {
        *lock(&self.listing) = Some(Arc::new(Listing {
            server: server.clone(),
            tools: tools.iter().map(|t| t.name.to_string()).collect(),
            hints: tools
                .iter()
                .map(|t| {
                    let a = t.annotations.clone().unwrap_or_default();
                    (
                        t.name.to_string(),
                        nisse_policy::mcp::hinted_risk(a.read_only_hint, a.destructive_hint),
                    )
                })
                .collect(),
        }));
        let msg = McpTools {
            envelope: Some(self.envelope()),
            instance: self.name().to_string(),
            server,
            tools: tools.iter().map(|t| content::tool(t, redactor)).collect(),
            error: String::new(),
            call_timeout_ms: self.call_timeout_ms(),
        };
        self.announce(msg).await;
    }

    /// The instance's call timeout, as announced with its tools.
    fn call_timeout_ms(&self) -> u64 {
        u64::try_from(self.config.call_timeout.as_millis()).unwrap_or(u64::MAX)
    }

    /// The instance cannot be reached: announced, once per reason.
    async fn unreachable(&self, why: &str) {
        let error = format!("{} cannot be reached: {why}", self.name());
        let same = lock(&self.announcement)
            .current
            .as_ref()
            .is_some_and(|m| m.error == error);
        if same {
            tracing::debug!(agent = %self.agent, instance = %self.name(), "{error}");
            return;
        }
        tracing::warn!(agent = %self.agent, instance = %self.name(), "{error}; tried again with backoff");
        let msg = McpTools {
            envelope: Some(self.envelope()),
            instance: self.name().to_string(),
            server: String::new(),
            tools: Vec::new(),
            error,
            call_timeout_ms: self.call_timeout_ms(),
        };
        self.announce(msg).await;
    }

    /// An envelope for what this service says of the instance: the
    /// agent's, no work item, a message id of its own (each announcement
    /// is what was heard at that moment).
    fn envelope(&self) -> Envelope {
        Envelope {
            agent: self.agent.to_string(),
            actor: Some(Actor {
                kind: ActorKind::Service as i32,
                id: crate::SERVICE.name.to_string(),
            }),
            message_id: format!(
                "tools:{}:{}:{}",
                self.name(),
                now_ms(),
                self.generations.load(std::sync::atomic::Ordering::Relaxed)
            ),
            ..Default::default()
        }
    }

    async fn announce(&self, msg: McpTools) {
        {
            let mut a = lock(&self.announcement);
            a.current = Some(msg);
            a.published = false;
        }
        self.publish_announcement().await;
    }

    /// Publishes the current announcement if it was not yet.
    async fn publish_announcement(&self) {
        let pending = {
            let a = lock(&self.announcement);
            a.current.clone().filter(|_| !a.published)
        };
        let Some(msg) = pending else { return };
        let id = msg
            .envelope
            .as_ref()
            .map(|e| e.message_id.clone())
            .unwrap_or_default();
        match self.bus.publish(msg).await {
            Ok(_) => {
                let mut a = lock(&self.announcement);
                let same = a
                    .current
                    .as_ref()
                    .and_then(|m| m.envelope.as_ref())
                    .is_some_and(|e| e.message_id == id);
                if same {
                    a.published = true;
                }
            }
            Err(e) => {
                tracing::warn!(agent = %self.agent, instance = %self.name(), "publishing the instance's tools (tried again): {e}");
            }
        }
    }

    /// The server said its tools changed: listed again and announced.
    async fn relist(&self) {
        let session = {
            let conn = self.conn.lock().await;
            conn.as_ref().filter(|c| c.alive()).map(Conn::session)
        };
        let Some(session) = session else { return };
        let listed =
            tokio::time::timeout(self.settings.connect_timeout, session.peer.list_all_tools())
                .await;
        match listed {
            Ok(Ok(tools)) => {
                let server = self.listing().map(|l| l.server.clone()).unwrap_or_default();
                tracing::info!(agent = %self.agent, instance = %self.name(), tools = tools.len(), "the server's tools changed");
                self.listed(server, &tools, &session.redactor).await;
            }
            Ok(Err(e)) => {
                let e = content::redacted(&session.redactor, &explain(&e));
                tracing::warn!(agent = %self.agent, instance = %self.name(), "listing the changed tools: {e}");
            }
            Err(_) => {
                tracing::warn!(agent = %self.agent, instance = %self.name(), "listing the changed tools took too long");
            }
        }
    }

    /// Whether the connection is up, and since when.
    async fn up_since(&self) -> Option<Instant> {
        self.conn
            .lock()
            .await
            .as_ref()
            .filter(|c| c.alive())
            .map(|c| c.since)
    }

    /// Keeps the instance connected and the brain told, until `shutdown`
    /// (given once no call is in flight any more); then closes the
    /// connection (a child process is asked to stop, and killed if it does
    /// not).
    pub(crate) async fn supervise(self: Arc<Self>, shutdown: CancellationToken) {
        let mut delays = self.settings.reconnect.delays();
        let mut was_up: Option<Instant> = None;
        loop {
            match self.up_since().await {
                Some(since) => was_up = Some(since),
                None => {
                    if let Some(since) = was_up.take() {
                        // A connection that lived long resets the waits;
                        // one that keeps dying right away backs off.
                        if since.elapsed() > self.settings.reconnect.max() {
                            delays = self.settings.reconnect.delays();
                        }
                        let wait = delays.next().unwrap_or(self.settings.reconnect.max());
                        tracing::warn!(agent = %self.agent, instance = %self.name(), "the connection was lost; connecting again in {}", humantime::format_duration(wait));
                        tokio::select! {
                            () = shutdown.cancelled() => break,
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                    match self.session().await {
                        Ok(_) => {}
                        Err(_) => {
                            let wait = delays.next().unwrap_or(self.settings.reconnect.max());
                            tokio::select! {
                                () = shutdown.cancelled() => break,
                                () = tokio::time::sleep(wait) => {}
                            }
                            continue;
                        }
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.changed.notified() => self.relist().await,
                () = tokio::time::sleep(WATCH_EVERY) => self.publish_announcement().await,
            }
        }
        if let Some(mut c) = self.conn.lock().await.take() {
            let _ = c.client.close_with_timeout(Duration::from_secs(5)).await;
        }
    }
}

/// Closes a connection that is no longer used, in the background.
fn close(mut old: Conn) {
    tokio::spawn(async move {
        let _ = old.client.close_with_timeout(Duration::from_secs(5)).await;
    });
}

/// Why the start of a session failed, in a line: a transport's error by
/// the step that failed and its first cause (`send initialize request:
/// Connection refused`), not the whole chain of wrappers.
fn explain_init(e: &ClientInitializeError) -> String {
    match e {
        ClientInitializeError::TransportError { error, context } => {
            format!("{context}: {}", root_cause(error))
        }
        other => other.to_string(),
    }
}

/// Why a request on a session failed, in a line.
pub(crate) fn explain(e: &ServiceError) -> String {
    match e {
        ServiceError::TransportSend(error) => format!("sending failed: {}", root_cause(error)),
        other => other.to_string(),
    }
}

/// The innermost cause of `e`: what actually went wrong (through the HTTP
/// transport's client errors too, which it wraps without naming them as
/// their source).
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    loop {
        let next = match cause.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            Some(StreamableHttpError::Client(inner)) => {
                Some(inner as &(dyn std::error::Error + 'static))
            }
            _ => cause.source(),
        };
        match next {
            Some(next) => cause = next,
            None => return cause.to_string(),
        }
    }
}

/// `e`, with the server's last lines on standard error when it said any.
fn with_last_words(e: String, last_words: &Mutex<VecDeque<String>>) -> String {
    let last = lock(last_words);
    if last.is_empty() {
        e
    } else {
        format!(
            "{e} (its last words: {})",
            last.iter().cloned().collect::<Vec<_>>().join(" / ")
        )
    }
}

/// The program to start: as configured when it holds a `/`, else found
/// on this service's own `PATH` (the child's environment is clean, so it
/// cannot be looked up there).
fn resolve(program: &str) -> Result<PathBuf, String> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| format!("`{program}` is not found on the service's PATH"))
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_on_path_or_taken_as_given() {
        assert_eq!(
            resolve("/opt/x/hv-mcp").unwrap(),
            PathBuf::from("/opt/x/hv-mcp")
        );
        let sh = resolve("sh").unwrap();
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        let e = resolve("no-such-program-here").unwrap_err();
        assert!(e.contains("not found on the service's PATH"), "{e}");
    }

    #[test]
    fn a_failed_start_says_what_the_server_last_said() {
        let words = Mutex::new(VecDeque::from(["bad token".to_string()]));
        assert_eq!(
            with_last_words("it exited".into(), &words),
            "it exited (its last words: bad token)"
        );
        assert_eq!(
            with_last_words("x".into(), &Mutex::new(VecDeque::new())),
            "x"
        );
    }
}
