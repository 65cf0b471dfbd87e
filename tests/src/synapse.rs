//! A real Matrix homeserver for tests: Synapse (PyPI `matrix-synapse`,
//! which `scripts/install-synapse` installs into a virtualenv outside the
//! clone) on a free loopback port, with a SQLite database, its keys, media
//! and log in a temporary directory. Tests talk to what a homeserver really
//! does (registration, rooms, threads and reactions, pagination, rate
//! limits, refused tokens, a restart) rather than to an imitation, and
//! [`TestClient`] plays the operator's side over plain HTTP.
//!
//! Users are made with Synapse's shared-secret admin registration, so open
//! registration stays off as on a real deployment. Rate limits are generous
//! unless a test asks for a low message limit
//! ([`TestSynapse::start_with_rate_limits`]).
//!
//! A missing virtualenv fails the test saying to run
//! `scripts/install-synapse`; it never skips.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;

use crate::{LaunchError, free_port, tail};
use reqwest::Method;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::process::{Child, Command};

/// The homeserver's name: user ids are `@name:localhost`.
pub const SERVER_NAME: &str = "localhost";

/// The `rc_message` rate (messages per second, per user) of a server
/// started with [`TestSynapse::start_with_rate_limits`].
pub const LIMITED_MESSAGES_PER_SECOND: f64 = 0.5;

/// The `rc_message` burst (messages a user may send at once before being
/// limited) of a server started with [`TestSynapse::start_with_rate_limits`].
pub const LIMITED_MESSAGE_BURST: u32 = 3;

/// The environment variable naming the virtualenv Synapse is installed in
/// (`scripts/install-synapse` prints the path and `scripts/test` sets it).
pub const VENV_ENV: &str = "NISSE_SYNAPSE_VENV";

/// How long Synapse gets to answer `/_matrix/client/versions`: it takes a
/// few seconds on two cores, more while other tests compete for them.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long Synapse gets to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a restart keeps trying to bind the port it had before.
const REBIND_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one request of [`TestClient`] or the harness may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What Twisted writes when the listening port is taken.
const PORT_IN_USE: &str = "Address already in use";

/// The rate limiters Synapse (1.163) has besides federation's and remote
/// media downloads' (neither is used here), each set to
/// [`GENEROUS`] so that tests sending bursts are never throttled. Dotted
/// keys are nested (`rc_login.address` is `rc_login: {address: ...}`).
const RATE_LIMITERS: [&str; 23] = [
    "rc_message",
    "rc_registration",
    "rc_registration_token_validity",
    "rc_login.address",
    "rc_login.account",
    "rc_login.failed_attempts",
    "rc_admin_redaction",
    "rc_joins.local",
    "rc_joins.remote",
    "rc_joins_per_room",
    "rc_key_requests",
    "rc_3pid_validation",
    "rc_invites.per_room",
    "rc_invites.per_user",
    "rc_invites.per_issuer",
    "rc_third_party_invite",
    "rc_media_create",
    "rc_presence.per_user",
    "rc_delayed_event_mgmt",
    "rc_room_creation",
    "rc_reports",
    "rc_user_directory",
    "rc_profile",
];

/// The per-second rate and burst of every limiter of a test server.
const GENEROUS: (f64, u32) = (1000.0, 10_000);

/// A user registered on [`TestSynapse`], logged in on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestUser {
    /// The full Matrix id, `@localpart:localhost`.
    pub user_id: String,
    /// The access token of the device registration created; send it as
    /// `Authorization: Bearer`.
    pub access_token: String,
    /// The device registration created (an agent logging in with the
    /// password gets a device of its own).
    pub device_id: String,
    /// The password, for clients under test that log in themselves.
    pub password: String,
}

/// A running Synapse on `127.0.0.1`, killed when dropped.
pub struct TestSynapse {
    python: PathBuf,
    child: Option<Child>,
    port: u16,
    base_url: String,
    shared_secret: String,
    rate_limited: bool,
    http: reqwest::Client,
    dir: TempDir,
}

impl TestSynapse {
    /// Starts Synapse on a free loopback port with a fresh SQLite database
    /// and rate limits generous enough that no test is throttled, and waits
    /// until it answers `/_matrix/client/versions` (up to 60 s).
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_inner(false).await
    }

    /// Like [`TestSynapse::start`], but with a low per-user message rate
    /// limit ([`LIMITED_MESSAGES_PER_SECOND`], a burst of
    /// [`LIMITED_MESSAGE_BURST`]), so that a test can provoke
    /// `M_LIMIT_EXCEEDED` (HTTP 429 with `retry_after_ms`) by sending a few
    /// messages quickly.
    pub async fn start_with_rate_limits() -> anyhow::Result<Self> {
        Self::start_inner(true).await
    }

    async fn start_inner(rate_limited: bool) -> anyhow::Result<Self> {
        let venv = venv()?;
        let python = venv.join("bin/python");
        if !python.is_file() {
            anyhow::bail!(
                "the tests need Synapse in a virtualenv at {} ({VENV_ENV}, else the default path), which has no bin/python: run scripts/install-synapse",
                venv.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("nisse-synapse-")
            .tempdir()?;
        let http = reqwest::Client::builder()
            // Synapse is on loopback; a proxy from the environment must not
            // get in the way.
            .no_proxy()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .context("building an HTTP client")?;
        let mut synapse = Self {
            python,
            child: None,
            port: 0,
            base_url: String::new(),
            shared_secret: random_hex(24)?,
            rate_limited,
            http,
            dir,
        };
        synapse.write_log_config()?;
        // A free port is found by binding and releasing it, which another
        // process could take in between: try again on a fresh port then.
        let mut last_error = None;
        for attempt in 0..3 {
            synapse.port = free_port()?;
            synapse.base_url = format!("http://127.0.0.1:{}", synapse.port);
            synapse.write_config()?;
            if attempt == 0 {
                synapse.generate_keys().await?;
            }
            match synapse.launch().await {
                Ok(()) => return Ok(synapse),
                Err(LaunchError::PortInUse(e)) => last_error = Some(e),
                Err(LaunchError::Failed(e)) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("Synapse did not start")))
    }

    /// Stops it with SIGTERM and waits until it has exited (killing it if
    /// it takes longer than 10 s); clients then get connection errors.
    /// Stopping a stopped server does nothing.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        crate::stop_child(&mut child, "Synapse", STOP_TIMEOUT, || self.log_tail()).await
    }

    /// Starts it again (stopping it first if it runs) on the same port with
    /// the same database, so users, tokens, rooms and messages survive,
    /// retrying for a few seconds while the port is still taken, and waits
    /// until it is ready.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await?;
        let deadline = Instant::now() + REBIND_TIMEOUT;
        loop {
            match self.launch().await {
                Ok(()) => return Ok(()),
                Err(LaunchError::PortInUse(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(LaunchError::PortInUse(e) | LaunchError::Failed(e)) => {
                    return Err(e.context(format!("restarting Synapse on port {}", self.port)));
                }
            }
        }
    }

    /// Its client-server API base URL, `http://127.0.0.1:<port>` (the same
    /// across restarts).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Its server name, [`SERVER_NAME`]: the part after the colon of its
    /// user ids.
    pub fn server_name(&self) -> &str {
        SERVER_NAME
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The full user id of `localpart` on this server.
    pub fn user_id(&self, localpart: &str) -> String {
        format!("@{localpart}:{SERVER_NAME}")
    }

    /// The temporary directory holding its configuration, database, keys,
    /// media and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Its whole log so far, across restarts (INFO: every request is a
    /// `Processed request` line).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The last lines of its log, for assertion messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log(), 30)
    }

    /// Waits until its log contains `needle`, failing with the log's tail
    /// after `timeout`.
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(needle) {
            if Instant::now() > deadline {
                anyhow::bail!(
                    "Synapse did not log `{needle}` within {timeout:?}; log tail:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Registers `@localpart:localhost` with `password` (a server admin if
    /// `admin`) through Synapse's shared-secret admin registration
    /// (`/_synapse/admin/v1/register`), which works with open registration
    /// off, and returns it logged in on a new device.
    pub async fn register(
        &self,
        localpart: &str,
        password: &str,
        admin: bool,
    ) -> anyhow::Result<TestUser> {
        let url = format!("{}/_synapse/admin/v1/register", self.base_url);
        let nonce = self.http.get(&url).send().await.with_context(|| {
            format!(
                "getting a registration nonce; log tail:\n{}",
                self.log_tail()
            )
        })?;
        let nonce: Value = check(nonce, "GET /_synapse/admin/v1/register").await?;
        let nonce = nonce["nonce"]
            .as_str()
            .with_context(|| format!("Synapse sent no registration nonce: {nonce}"))?;
        let mac = self
            .registration_mac(nonce, localpart, password, admin)
            .await?;
        let response = self
            .http
            .post(&url)
            .json(&json!({
                "nonce": nonce,
                "username": localpart,
                "password": password,
                "admin": admin,
                "mac": mac,
            }))
            .send()
            .await
            .with_context(|| format!("registering {localpart}; log tail:\n{}", self.log_tail()))?;
        let registered: Value = check(response, "POST /_synapse/admin/v1/register")
            .await
            .with_context(|| format!("registering {localpart}"))?;
        let field = |name: &str| -> anyhow::Result<String> {
            registered[name]
                .as_str()
                .map(str::to_string)
                .with_context(|| {
                    format!("Synapse's registration answer has no {name}: {registered}")
                })
        };
        Ok(TestUser {
            user_id: field("user_id")?,
            access_token: field("access_token")?,
            device_id: field("device_id")?,
            password: password.to_string(),
        })
    }

    /// A [`TestClient`] acting as `user` on this server.
    pub fn client(&self, user: &TestUser) -> TestClient {
        TestClient::new(&self.base_url, user)
    }

    /// The hex HMAC-SHA1, keyed with the shared secret, of
    /// `nonce\0user\0password\0admin|notadmin`: what the admin registration
    /// API checks. Computed by the venv's Python (`hmac`, `hashlib`), as no
    /// SHA-1 crate is a dependency of the workspace.
    async fn registration_mac(
        &self,
        nonce: &str,
        localpart: &str,
        password: &str,
        admin: bool,
    ) -> anyhow::Result<String> {
        const SCRIPT: &str = "import hashlib, hmac, sys\n\
key, *parts = sys.argv[1:]\n\
print(hmac.new(key.encode(), b'\\0'.join(p.encode() for p in parts), hashlib.sha1).hexdigest())";
        let output = Command::new(&self.python)
            .arg("-c")
            .arg(SCRIPT)
            .arg(&self.shared_secret)
            .arg(nonce)
            .arg(localpart)
            .arg(password)
            .arg(if admin { "admin" } else { "notadmin" })
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .with_context(|| format!("running {}", self.python.display()))?;
        if !output.status.success() {
            anyhow::bail!(
                "computing the registration MAC with {} failed ({}): {}",
                self.python.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    }

    fn log_path(&self) -> PathBuf {
        self.dir().join("homeserver.log")
    }

    fn config_path(&self) -> PathBuf {
        self.dir().join("homeserver.yaml")
    }

    fn log_config_path(&self) -> PathBuf {
        self.dir().join("log.yaml")
    }

    /// Writes the Python logging configuration: INFO and up, appended to
    /// [`TestSynapse::log`]'s file unbuffered, so the tail is current when
    /// a test fails. JSON, which YAML reads too.
    fn write_log_config(&self) -> anyhow::Result<()> {
        let config = json!({
            "version": 1,
            "formatters": {
                "precise": {
                    "format": "%(asctime)s - %(name)s - %(lineno)d - %(levelname)s - %(request)s - %(message)s",
                },
            },
            "handlers": {
                "file": {
                    "class": "logging.FileHandler",
                    "formatter": "precise",
                    "filename": self.log_path(),
                    "encoding": "utf8",
                },
            },
            "root": { "level": "INFO", "handlers": ["file"] },
            "disable_existing_loggers": false,
        });
        let path = self.log_config_path();
        std::fs::write(&path, serde_json::to_string_pretty(&config)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Writes `homeserver.yaml` for the current port. It is written as
    /// JSON, which is YAML too, so no value needs YAML quoting rules.
    fn write_config(&self) -> anyhow::Result<()> {
        let dir = self.dir();
        let mut config = json!({
            "server_name": SERVER_NAME,
            "report_stats": false,
            // Only the client-server API (the admin API is part of it), on
            // loopback, plain HTTP: no federation listener.
            "listeners": [{
                "port": self.port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": false,
                "x_forwarded": false,
                "resources": [{ "names": ["client"], "compress": false }],
            }],
            "database": {
                "name": "sqlite3",
                "args": { "database": dir.join("homeserver.db") },
            },
            "log_config": self.log_config_path(),
            "media_store_path": dir.join("media_store"),
            "signing_key_path": dir.join("signing.key"),
            "registration_shared_secret": self.shared_secret,
            "enable_registration": false,
            "macaroon_secret_key": format!("{}-macaroon", self.shared_secret),
            "form_secret": format!("{}-form", self.shared_secret),
            // No network: no key servers to ask, and no warning about it.
            "trusted_key_servers": [],
            "suppress_key_server_warning": true,
            "presence": { "enabled": false },
            "url_preview_enabled": false,
            "enable_metrics": false,
        });
        let (per_second, burst_count) = GENEROUS;
        for limiter in RATE_LIMITERS {
            let mut node = &mut config;
            for part in limiter.split('.') {
                node = &mut node[part];
            }
            *node = json!({ "per_second": per_second, "burst_count": burst_count });
        }
        if self.rate_limited {
            config["rc_message"] = json!({
                "per_second": LIMITED_MESSAGES_PER_SECOND,
                "burst_count": LIMITED_MESSAGE_BURST,
            });
        }
        let path = self.config_path();
        std::fs::write(&path, serde_json::to_string_pretty(&config)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Has Synapse generate its signing key (`--generate-keys` writes the
    /// missing key files and exits).
    async fn generate_keys(&self) -> anyhow::Result<()> {
        let output = Command::new(&self.python)
            .args(["-m", "synapse.app.homeserver", "-c"])
            .arg(self.config_path())
            .arg("--generate-keys")
            .current_dir(self.dir())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .with_context(|| format!("running {}", self.python.display()))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            if stderr.contains("No module named") {
                anyhow::bail!(
                    "the tests need Synapse, which {} cannot import: run scripts/install-synapse\n{}",
                    self.python.display(),
                    tail(&stderr, 5)
                );
            }
            anyhow::bail!(
                "Synapse failed ({}) generating its signing key: {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout).trim(),
                tail(&stderr, 30)
            );
        }
        Ok(())
    }

    /// Starts Synapse with the current configuration, appending to the
    /// log, and waits until `/_matrix/client/versions` answers 200.
    async fn launch(&mut self) -> Result<(), LaunchError> {
        let log_path = self.log_path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let log_start = log.metadata()?.len();
        let mut child = Command::new(&self.python)
            .args(["-m", "synapse.app.homeserver", "-c"])
            .arg(self.config_path())
            .current_dir(self.dir())
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting Synapse with {}", self.python.display()))?;
        let this_run = |log: &Path| -> String {
            let text = std::fs::read(log).unwrap_or_default();
            let start = usize::try_from(log_start).unwrap_or(0).min(text.len());
            String::from_utf8_lossy(&text[start..]).into_owned()
        };
        let versions = format!("{}/_matrix/client/versions", self.base_url);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                let output = this_run(&log_path);
                let error = anyhow::anyhow!(
                    "Synapse exited ({status}) before it was ready on port {}; log tail:\n{}",
                    self.port,
                    tail(&output, 30)
                );
                return Err(if output.contains(PORT_IN_USE) {
                    LaunchError::PortInUse(error)
                } else {
                    LaunchError::Failed(error)
                });
            }
            let ready = self
                .http
                .get(&versions)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status() == reqwest::StatusCode::OK);
            if ready {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill().await;
                return Err(LaunchError::Failed(anyhow::anyhow!(
                    "Synapse did not answer {versions} within {READY_TIMEOUT:?}; log tail:\n{}",
                    tail(&this_run(&log_path), 30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for TestSynapse {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
        }
    }
}

/// A refusal from the homeserver: a non-2xx answer with the Matrix error
/// body. [`TestClient`]'s errors carry it, so a test can check what was
/// refused and why with `error.downcast_ref::<MatrixError>()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixError {
    /// The request, e.g. `PUT /_matrix/client/v3/rooms/.../send/...`.
    pub request: String,
    /// The HTTP status, e.g. 401 or 429.
    pub status: u16,
    /// The Matrix error code, e.g. `M_UNKNOWN_TOKEN` or `M_LIMIT_EXCEEDED`
    /// (empty if the body had none).
    pub errcode: String,
    /// The human-readable message.
    pub error: String,
    /// How long to wait before retrying, with `M_LIMIT_EXCEEDED`.
    pub retry_after_ms: Option<u64>,
}

impl std::fmt::Display for MatrixError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} was refused: {} {}: {}",
            self.request, self.status, self.errcode, self.error
        )?;
        if let Some(ms) = self.retry_after_ms {
            write!(f, " (retry after {ms} ms)")?;
        }
        Ok(())
    }
}

impl std::error::Error for MatrixError {}

/// The operator's side of a test: a plain HTTP client of the Matrix
/// client-server API acting as one [`TestUser`], with just what tests need
/// to talk to an agent (rooms, text, threads, reactions, reading a room
/// back). It does no encryption: in a room created encrypted it still
/// sends plaintext.
#[derive(Debug, Clone)]
pub struct TestClient {
    http: reqwest::Client,
    base_url: String,
    user_id: String,
    access_token: String,
}

impl TestClient {
    /// A client of the homeserver at `base_url` (e.g.
    /// [`TestSynapse::base_url`]) acting as `user`.
    pub fn new(base_url: impl Into<String>, user: &TestUser) -> Self {
        let http = reqwest::Client::builder()
            // The homeserver is on loopback; a proxy from the environment
            // must not get in the way.
            .no_proxy()
            .timeout(REQUEST_TIMEOUT)
            .build()
            // Without TLS there is nothing to set up that could fail.
            .unwrap_or_default();
        Self {
            http,
            base_url: base_url.into().trim_end_matches('/').to_string(),
            user_id: user.user_id.clone(),
            access_token: user.access_token.clone(),
        }
    }

    /// The user it acts as.
    pub fn user_id(&self) -> &str {
        &self.user_id
    }

    /// Sends `method path` (everything after the base URL, with its
    /// segments already encoded with [`percent_encode`]) with `body` as
    /// JSON, authenticated as the user, and returns the JSON answer. A
    /// non-2xx answer fails with a [`MatrixError`]; a connection failure
    /// (e.g. the server is stopped) with a plain error.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let request = format!("{method} {}", path.split('?').next().unwrap_or(path));
        let mut builder = self
            .http
            .request(method, format!("{}{path}", self.base_url))
            .bearer_auth(&self.access_token);
        if let Some(body) = body {
            builder = builder.json(body);
        }
        let response = builder
            .send()
            .await
            .with_context(|| format!("{request} as {}", self.user_id))?;
        check(response, &request).await
    }

    /// The user id the homeserver has for this client's token
    /// (`GET /account/whoami`).
    pub async fn whoami(&self) -> anyhow::Result<String> {
        let answer = self
            .request(Method::GET, "/_matrix/client/v3/account/whoami", None)
            .await?;
        string_field(&answer, "user_id")
    }

    /// Creates a room named `name` (preset `private_chat`: invite only,
    /// history shared with members) inviting the users `invite`; with
    /// `encrypted` its initial state enables Megolm encryption
    /// (`m.room.encryption`, `m.megolm.v1.aes-sha2`). Returns the room id.
    pub async fn create_room(
        &self,
        name: &str,
        invite: &[&str],
        encrypted: bool,
    ) -> anyhow::Result<String> {
        let mut body = json!({
            "name": name,
            "preset": "private_chat",
            "invite": invite,
        });
        if encrypted {
            body["initial_state"] = json!([{
                "type": "m.room.encryption",
                "state_key": "",
                "content": { "algorithm": "m.megolm.v1.aes-sha2" },
            }]);
        }
        let answer = self
            .request(Method::POST, "/_matrix/client/v3/createRoom", Some(&body))
            .await?;
        string_field(&answer, "room_id")
    }

    /// Invites `user_id` into `room_id`.
    pub async fn invite(&self, room_id: &str, user_id: &str) -> anyhow::Result<()> {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/invite",
            percent_encode(room_id)
        );
        self.request(Method::POST, &path, Some(&json!({ "user_id": user_id })))
            .await?;
        Ok(())
    }

    /// Joins a room by id or alias; returns its id.
    pub async fn join(&self, room_id_or_alias: &str) -> anyhow::Result<String> {
        let path = format!(
            "/_matrix/client/v3/join/{}",
            percent_encode(room_id_or_alias)
        );
        let answer = self.request(Method::POST, &path, Some(&json!({}))).await?;
        string_field(&answer, "room_id")
    }

    /// Sends an event of type `event_type` with `content` into `room_id`
    /// under a fresh transaction id; returns its event id.
    pub async fn send_event(
        &self,
        room_id: &str,
        event_type: &str,
        content: &Value,
    ) -> anyhow::Result<String> {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/send/{}/{}",
            percent_encode(room_id),
            percent_encode(event_type),
            percent_encode(&txn_id())
        );
        let answer = self.request(Method::PUT, &path, Some(content)).await?;
        string_field(&answer, "event_id")
    }

    /// Uploads `bytes` as a file named `name` of type `content_type`
    /// through the media API (`POST /_matrix/media/v3/upload`); returns
    /// its `mxc://` URI, for an `m.file` (or image, video, sound) message.
    pub async fn upload(
        &self,
        content_type: &str,
        name: &str,
        bytes: Vec<u8>,
    ) -> anyhow::Result<String> {
        let request = "POST /_matrix/media/v3/upload";
        let response = self
            .http
            .post(format!(
                "{}/_matrix/media/v3/upload?filename={}",
                self.base_url,
                percent_encode(name)
            ))
            .bearer_auth(&self.access_token)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(bytes)
            .send()
            .await
            .with_context(|| format!("{request} as {}", self.user_id))?;
        let answer = check(response, request).await?;
        string_field(&answer, "content_uri")
    }

    /// Sends a plain `m.text` message; returns its event id.
    pub async fn send_text(&self, room_id: &str, body: &str) -> anyhow::Result<String> {
        self.send_event(
            room_id,
            "m.room.message",
            &json!({ "msgtype": "m.text", "body": body }),
        )
        .await
    }

    /// Sends an `m.text` reply in the thread rooted at `thread_root`, as
    /// thread-aware clients do: `m.thread` relation to the root, falling
    /// back to a reply to the root for clients without threads. Returns
    /// its event id.
    pub async fn send_thread_reply(
        &self,
        room_id: &str,
        thread_root: &str,
        body: &str,
    ) -> anyhow::Result<String> {
        self.send_event(
            room_id,
            "m.room.message",
            &json!({
                "msgtype": "m.text",
                "body": body,
                "m.relates_to": {
                    "rel_type": "m.thread",
                    "event_id": thread_root,
                    "is_falling_back": true,
                    "m.in_reply_to": { "event_id": thread_root },
                },
            }),
        )
        .await
    }

    /// Reacts to `event_id` with `key` (an emoji such as `👍`): an
    /// `m.reaction` annotation. Returns the reaction's event id.
    pub async fn react(&self, room_id: &str, event_id: &str, key: &str) -> anyhow::Result<String> {
        self.send_event(
            room_id,
            "m.reaction",
            &json!({
                "m.relates_to": {
                    "rel_type": "m.annotation",
                    "event_id": event_id,
                    "key": key,
                },
            }),
        )
        .await
    }

    /// The content of `room_id`'s state event `event_type` with
    /// `state_key` (empty for most room state), e.g. its
    /// `m.room.power_levels`.
    pub async fn state(
        &self,
        room_id: &str,
        event_type: &str,
        state_key: &str,
    ) -> anyhow::Result<Value> {
        self.request(
            Method::GET,
            &state_path(room_id, event_type, state_key),
            None,
        )
        .await
    }

    /// Replaces that state event's content; returns its event id. With
    /// `m.room.power_levels`, raising `events."m.room.message"` above a
    /// user's level takes away that user's right to post until it is
    /// lowered back.
    pub async fn set_state(
        &self,
        room_id: &str,
        event_type: &str,
        state_key: &str,
        content: &Value,
    ) -> anyhow::Result<String> {
        let path = state_path(room_id, event_type, state_key);
        let answer = self.request(Method::PUT, &path, Some(content)).await?;
        string_field(&answer, "event_id")
    }

    /// Every event of `room_id` this user may see, state events included,
    /// oldest first: `/messages` read forwards from the start of the room,
    /// page after page until there is no `end` token.
    pub async fn messages(&self, room_id: &str) -> anyhow::Result<Vec<Value>> {
        let mut events = Vec::new();
        let mut from: Option<String> = None;
        loop {
            let mut path = format!(
                "/_matrix/client/v3/rooms/{}/messages?dir=f&limit=1000",
                percent_encode(room_id)
            );
            if let Some(from) = &from {
                path.push_str("&from=");
                path.push_str(&percent_encode(from));
            }
            let page = self.request(Method::GET, &path, None).await?;
            let chunk = page["chunk"]
                .as_array()
                .with_context(|| format!("/messages answered without a chunk: {page}"))?;
            events.extend(chunk.iter().cloned());
            match page["end"].as_str() {
                Some(end) if !chunk.is_empty() && from.as_deref() != Some(end) => {
                    from = Some(end.to_string());
                }
                _ => return Ok(events),
            }
        }
    }

    /// Polls [`TestClient::messages`] until an event of `room_id` matches
    /// `predicate` and returns the first that does, failing after
    /// `timeout` with the events seen last.
    pub async fn wait_for_message<F>(
        &self,
        room_id: &str,
        predicate: F,
        timeout: Duration,
    ) -> anyhow::Result<Value>
    where
        F: Fn(&Value) -> bool,
    {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.messages(room_id).await {
                Ok(events) => {
                    if let Some(event) = events.iter().find(|e| predicate(e)) {
                        return Ok(event.clone());
                    }
                    summarize(&events)
                }
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                anyhow::bail!(
                    "no matching event in {room_id} within {timeout:?}; last seen:\n{last}"
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `s` percent-encoded for one URL path segment or query value: every byte
/// but the unreserved `A-Z a-z 0-9 - . _ ~` becomes `%XX`, so room ids
/// (`!x:localhost`), event ids (`$x`) and aliases (`#x:localhost`) fit in
/// a path.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The virtualenv Synapse is in: `$NISSE_SYNAPSE_VENV`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/nisse/synapse-venv`, where
/// `scripts/install-synapse` puts it by default.
pub fn venv() -> anyhow::Result<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(venv) = set(VENV_ENV) {
        return Ok(PathBuf::from(venv));
    }
    let cache = match (set("XDG_CACHE_HOME"), set("HOME")) {
        (Some(cache), _) => PathBuf::from(cache),
        (None, Some(home)) => PathBuf::from(home).join(".cache"),
        (None, None) => anyhow::bail!(
            "neither {VENV_ENV}, XDG_CACHE_HOME nor HOME is set, so Synapse's virtualenv cannot be found: run scripts/install-synapse and set {VENV_ENV} to the path it prints"
        ),
    };
    Ok(cache.join("nisse/synapse-venv"))
}

/// The lowercase hex SHA-256 of `bytes`: what the agent records as an
/// uploaded attachment's hash.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The JSON body of a 2xx answer to `request`; else a [`MatrixError`].
async fn check(response: reqwest::Response, request: &str) -> anyhow::Result<Value> {
    let status = response.status();
    let text = response
        .text()
        .await
        .with_context(|| format!("reading the answer to {request}"))?;
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if !status.is_success() {
        return Err(MatrixError {
            request: request.to_string(),
            status: status.as_u16(),
            errcode: body["errcode"].as_str().unwrap_or_default().to_string(),
            error: body["error"]
                .as_str()
                .map_or_else(|| text.clone(), str::to_string),
            retry_after_ms: body["retry_after_ms"].as_u64(),
        }
        .into());
    }
    if body.is_null() {
        anyhow::bail!("{request} answered {status} with no JSON: {text:?}");
    }
    Ok(body)
}

fn string_field(answer: &Value, name: &str) -> anyhow::Result<String> {
    answer[name]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("the answer has no {name}: {answer}"))
}

/// `/rooms/{room}/state/{type}/{key}`, each part encoded.
fn state_path(room_id: &str, event_type: &str, state_key: &str) -> String {
    format!(
        "/_matrix/client/v3/rooms/{}/state/{}/{}",
        percent_encode(room_id),
        percent_encode(event_type),
        percent_encode(state_key)
    )
}

/// One line per event: sender, type and body, for failure messages.
fn summarize(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {} {}",
                e["sender"].as_str().unwrap_or("?"),
                e["type"].as_str().unwrap_or("?"),
                e["content"]["body"].as_str().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A transaction id unique within this process and across processes
/// running at the same time, as the send API needs for idempotence.
fn txn_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "nisse-test-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// `bytes` random bytes from the kernel, hex-encoded: the shared secret.
fn random_hex(bytes: usize) -> anyhow::Result<String> {
    use std::io::Read as _;

    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("reading /dev/urandom")?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
