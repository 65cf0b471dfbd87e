//! Real MCP servers for tests: `nisse-test-mcp`, this crate's stand-in
//! for one site's hypervisor API (built with `rmcp`, the official Rust
//! SDK), and the reference filesystem server published on npm
//! (`@modelcontextprotocol/server-filesystem`). Both are reached the way a
//! configured MCP instance is, over stdio or streamable HTTP, so the code
//! under test speaks the real protocol to a real server.
//!
//! # The hypervisor stand-in
//!
//! [`HypervisorSite`] is one site: a temporary directory holding its state
//! file (the VMs, kept across restarts and shared by every server process
//! of the site, so an elevated instance's `stop_vm` shows in the read-only
//! instance's `list_vms`), its journal (one JSON line per tool call the
//! site's servers received), and a read token and a write token. From it a
//! test gets the stdio command of an instance ([`HypervisorSite::stdio_command`],
//! the token going in [`TOKEN_ENV`]), starts a streamable HTTP server
//! ([`HypervisorSite::start_http`], bearer tokens), and reads back what the
//! servers saw ([`HypervisorSite::journal`]) and did ([`HypervisorSite::vm`]).
//!
//! A new site has VMs 101 and 102 running and 103 stopped. Its tools are
//! `list_vms`, `vm_status`, `stop_vm`, `start_vm`, `delete_vm`,
//! `read_console` (only reads, but declares itself destructive) and
//! `slow_op` (sleeps, journaled when it starts and when it answers). The
//! read token may call the tools that change nothing (`list_vms`,
//! `vm_status`, `read_console`); any other call with it answers
//! [`FORBIDDEN`]; a call without a token or with another answers
//! [`UNAUTHORIZED`] (over HTTP such a request gets a 401 before reaching
//! MCP).
//!
//! # Finding the binary from another package
//!
//! Cargo builds a package's binaries only for that package's own tests,
//! so [`server_binary`] finds or builds it: `CARGO_BIN_EXE_nisse-test-mcp`
//! when cargo set it (this crate's tests), else the binary next to the
//! running test executable when it is newer than its sources (a
//! `cargo nextest run --workspace` or `cargo build -p nisse-tests` built
//! it), else it runs `cargo build -p nisse-tests --bin nisse-test-mcp`
//! once per test process, in the same target directory, and uses what
//! that built. A test of another package needs nothing but `nisse-tests`
//! as a dev-dependency; the first such test may wait for that build.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// The hypervisor stand-in's binary target in this package.
pub const BINARY: &str = "nisse-test-mcp";

/// The environment variable a stdio instance reads its token from.
pub const TOKEN_ENV: &str = "HV_TOKEN";

/// What a call without a token, or with one the site does not know,
/// answers (as an `isError` tool result).
pub const UNAUTHORIZED: &str = "unauthorized";

/// What a call with the read token to a tool that changes something
/// answers (as an `isError` tool result).
pub const FORBIDDEN: &str = "forbidden: read-only credentials";

/// What the HTTP server prints on stdout once bound, before its URL.
pub const LISTENING: &str = "listening ";

/// The published reference filesystem server on npm.
pub const FILESYSTEM_SERVER_PACKAGE: &str = "@modelcontextprotocol/server-filesystem";

/// The version of [`FILESYSTEM_SERVER_PACKAGE`] the tests install: pinned
/// so a new release cannot change what the tests talk to unnoticed.
pub const FILESYSTEM_SERVER_VERSION: &str = "2026.8.31";

/// How long the HTTP server gets to print that it is listening.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a VM runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VmStatus {
    /// Running.
    Running,
    /// Stopped.
    Stopped,
}

impl std::fmt::Display for VmStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Stopped => "stopped",
        })
    }
}

/// One VM of a site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vm {
    /// Its id (as Proxmox numbers VMs).
    pub vmid: u64,
    /// Its name.
    pub name: String,
    /// Whether it runs.
    pub status: VmStatus,
}

/// A site's state file: its name and its VMs, in id order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteState {
    /// The site.
    pub site: String,
    /// Its VMs (a deleted VM is gone from the list).
    pub vms: Vec<Vm>,
}

impl SiteState {
    /// A new site's VMs: 101 (`web`) and 102 (`db`) running, 103
    /// (`backup`) stopped.
    pub fn initial(site: &str) -> Self {
        let vm = |vmid, name: &str, status| Vm {
            vmid,
            name: name.to_string(),
            status,
        };
        Self {
            site: site.to_string(),
            vms: vec![
                vm(101, "web", VmStatus::Running),
                vm(102, "db", VmStatus::Running),
                vm(103, "backup", VmStatus::Stopped),
            ],
        }
    }

    /// The state in `path`, `None` when there is no such file.
    pub fn load(path: &Path) -> anyhow::Result<Option<Self>> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("reading the site state in {}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes the state to `path` by replacing the file, so a reader (or a
    /// kill) never sees half of it.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = sibling(path, &format!(".tmp-{}", std::process::id()));
        let json = serde_json::to_vec_pretty(self)?;
        std::fs::write(&tmp, json).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("replacing {} with {}", path.display(), tmp.display()))
    }

    /// Runs `change` on the state in `path` (a new site's state when the
    /// file does not exist yet) and saves the result, holding the site's
    /// lock so concurrent servers of the site never lose an update. Fails
    /// when the file belongs to another site.
    pub fn update<T>(
        path: &Path,
        site: &str,
        change: impl FnOnce(&mut Self) -> T,
    ) -> anyhow::Result<T> {
        let _lock = lock_site(path)?;
        let mut state = match Self::load(path)? {
            Some(state) if state.site != site => anyhow::bail!(
                "the state file {} is site {}'s, not {site}'s",
                path.display(),
                state.site
            ),
            Some(state) => state,
            None => Self::initial(site),
        };
        let out = change(&mut state);
        state.save(path)?;
        Ok(out)
    }

    /// The VM `vmid`, if the site has it.
    pub fn vm(&self, vmid: u64) -> Option<&Vm> {
        self.vms.iter().find(|vm| vm.vmid == vmid)
    }
}

/// Holds the site's lock (`<state file>.lock`) while alive.
fn lock_site(state: &Path) -> anyhow::Result<std::fs::File> {
    let path = sibling(state, ".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening the site lock {}", path.display()))?;
    file.lock()
        .with_context(|| format!("locking {}", path.display()))?;
    Ok(file)
}

/// `path` with `suffix` appended to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// Which of the site's credentials a call came with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenKind {
    /// The read token: only tools that change nothing.
    Read,
    /// The write token: every tool.
    Write,
    /// A token the site does not know.
    Unknown,
    /// No token at all.
    Missing,
}

impl TokenKind {
    /// What `presented` is for a site with these tokens.
    pub fn of(presented: Option<&str>, read_token: &str, write_token: &str) -> Self {
        match presented {
            None | Some("") => Self::Missing,
            Some(t) if t == write_token => Self::Write,
            Some(t) if t == read_token => Self::Read,
            Some(_) => Self::Unknown,
        }
    }
}

/// Where in a call a journal line was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The call began and has not answered yet: written only by tools
    /// that take a while (`slow_op`), before they do.
    Started,
    /// The call was answered, with [`Call::result`]. Every call received
    /// has exactly one such line, unless the server died first.
    Answered,
}

/// How a call was answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Whether it answered an error (`isError`, or a protocol error for an
    /// unknown tool).
    pub is_error: bool,
    /// Its text.
    pub text: String,
}

/// One line of a site's journal: a tool call one of its servers received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Call {
    /// When it was written (RFC 3339, UTC).
    pub time: String,
    /// The site.
    pub site: String,
    /// `stdio` or `http`.
    pub transport: String,
    /// The tool called.
    pub tool: String,
    /// Its arguments as received (`{}` when there were none).
    pub arguments: Value,
    /// The credentials it came with.
    pub token: TokenKind,
    /// Whether the call had started or was answered.
    pub phase: Phase,
    /// How it was answered (with [`Phase::Answered`]).
    pub result: Option<Outcome>,
}

impl Call {
    /// Appends the call to the journal at `path` as one line, under a lock
    /// on the file, so the lines of concurrent servers never interleave.
    pub fn append(&self, path: &Path) -> anyhow::Result<()> {
        use std::io::Write as _;
        let mut line = serde_json::to_vec(self)?;
        line.push(b'\n');
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening the journal {}", path.display()))?;
        file.lock()
            .with_context(|| format!("locking the journal {}", path.display()))?;
        file.write_all(&line)
            .with_context(|| format!("appending to the journal {}", path.display()))
    }

    /// Every call in the journal at `path`, in order; none when it does not
    /// exist yet.
    pub fn read_journal(path: &Path) -> anyhow::Result<Vec<Self>> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        text.lines()
            .enumerate()
            .map(|(i, line)| {
                serde_json::from_str(line).with_context(|| {
                    format!("line {} of the journal {}: {line}", i + 1, path.display())
                })
            })
            .collect()
    }

    /// Whether this is the answer of a call of `tool`.
    pub fn answered(&self, tool: &str) -> bool {
        self.tool == tool && self.phase == Phase::Answered
    }
}

/// A command that runs an MCP server over stdio: what a configured stdio
/// instance holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables to set in its environment, on top of the inherited ones.
    pub env: Vec<(String, String)>,
}

impl StdioCommand {
    /// The command, ready for a client's child-process transport.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }
}

/// One site of the hypervisor stand-in, in a temporary directory.
pub struct HypervisorSite {
    site: String,
    binary: PathBuf,
    read_token: String,
    write_token: String,
    dir: TempDir,
}

impl HypervisorSite {
    /// A new site named `site` (`site-a`) with fresh tokens, finding or
    /// building the binary ([`server_binary`], which may take a while the
    /// first time).
    pub async fn new(site: &str) -> anyhow::Result<Self> {
        let binary = tokio::task::spawn_blocking(server_binary)
            .await
            .context("looking for the nisse-test-mcp binary panicked")??;
        let dir = tempfile::Builder::new()
            .prefix(&format!("nisse-hv-{site}-"))
            .tempdir()?;
        Ok(Self {
            site: site.to_string(),
            binary,
            read_token: format!("{site}-read-{}", uuid::Uuid::new_v4().simple()),
            write_token: format!("{site}-write-{}", uuid::Uuid::new_v4().simple()),
            dir,
        })
    }

    /// The site's name.
    pub fn site(&self) -> &str {
        &self.site
    }

    /// The token that may only read.
    pub fn read_token(&self) -> &str {
        &self.read_token
    }

    /// The token that may also change VMs.
    pub fn write_token(&self) -> &str {
        &self.write_token
    }

    /// The temporary directory holding the state, the journal and the
    /// HTTP servers' logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The state file (absent until a server started).
    pub fn state_file(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }

    /// The journal (absent until a call was received).
    pub fn journal_file(&self) -> PathBuf {
        self.dir.path().join("journal.jsonl")
    }

    /// The binary's arguments for this site, without a transport.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--site".into(),
            self.site.clone(),
            "--state".into(),
            self.state_file().display().to_string(),
            "--journal".into(),
            self.journal_file().display().to_string(),
            "--read-token".into(),
            self.read_token.clone(),
            "--write-token".into(),
            self.write_token.clone(),
        ]
    }

    /// The command of a stdio instance of this site presenting `token`
    /// (one of [`Self::read_token`], [`Self::write_token`], another string
    /// for a wrong one; `None` for none) in [`TOKEN_ENV`].
    pub fn stdio_command(&self, token: Option<&str>) -> StdioCommand {
        StdioCommand {
            program: self.binary.clone(),
            args: self.args(),
            env: token
                .map(|t| (TOKEN_ENV.to_string(), t.to_string()))
                .into_iter()
                .collect(),
        }
    }

    /// Starts a streamable HTTP server of this site on a free loopback
    /// port, accepting both tokens as `Authorization: Bearer`; it is killed
    /// when the returned handle is dropped.
    pub async fn start_http(&self) -> anyhow::Result<HttpHypervisor> {
        let log = self
            .dir
            .path()
            .join(format!("http-{}.log", uuid::Uuid::new_v4().simple()));
        let stderr = std::fs::File::create(&log)
            .with_context(|| format!("creating the server log {}", log.display()))?;
        let mut child = Command::new(&self.binary)
            .args(self.args())
            .args(["--listen", "127.0.0.1:0"])
            .env_remove(TOKEN_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        let mut stdout = BufReader::new(child.stdout.take().context("no stdout pipe")?);
        let log_tail = || crate::tail(&std::fs::read_to_string(&log).unwrap_or_default(), 20);
        let mut line = String::new();
        let read = tokio::time::timeout(LISTEN_TIMEOUT, stdout.read_line(&mut line))
            .await
            .with_context(|| {
                format!(
                    "nisse-test-mcp did not say it was listening within {LISTEN_TIMEOUT:?}; log:\n{}",
                    log_tail()
                )
            })?
            .context("reading nisse-test-mcp's stdout")?;
        let url = line.trim().strip_prefix(LISTENING).map(str::to_string);
        match url {
            Some(url) if read > 0 => Ok(HttpHypervisor {
                child,
                _stdout: stdout,
                url,
                log,
            }),
            _ => {
                let status = child.try_wait().ok().flatten();
                anyhow::bail!(
                    "nisse-test-mcp printed {line:?} instead of `{LISTENING}<url>` (exit: {status:?}); log:\n{}",
                    log_tail()
                )
            }
        }
    }

    /// Every line of the site's journal, in order.
    pub fn journal(&self) -> anyhow::Result<Vec<Call>> {
        Call::read_journal(&self.journal_file())
    }

    /// The answered calls of `tool`, in order.
    pub fn calls(&self, tool: &str) -> anyhow::Result<Vec<Call>> {
        Ok(self
            .journal()?
            .into_iter()
            .filter(|c| c.answered(tool))
            .collect())
    }

    /// The site's VMs now (a new site's before any server started).
    pub fn vms(&self) -> anyhow::Result<Vec<Vm>> {
        Ok(SiteState::load(&self.state_file())?
            .unwrap_or_else(|| SiteState::initial(&self.site))
            .vms)
    }

    /// VM `vmid` now, `None` when the site has no such VM (or deleted it).
    pub fn vm(&self, vmid: u64) -> anyhow::Result<Option<Vm>> {
        Ok(self.vms()?.into_iter().find(|vm| vm.vmid == vmid))
    }
}

/// A streamable HTTP server of a [`HypervisorSite`], killed when dropped.
pub struct HttpHypervisor {
    child: Child,
    /// Kept open so the server's stdout never breaks.
    _stdout: BufReader<ChildStdout>,
    url: String,
    log: PathBuf,
}

impl HttpHypervisor {
    /// The MCP endpoint, `http://127.0.0.1:<port>/mcp`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What the server wrote on stderr.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("killing nisse-test-mcp")
    }
}

/// The `nisse-test-mcp` binary, found or built (see the module's
/// documentation); the answer is kept for the rest of the process. It
/// blocks while cargo builds.
pub fn server_binary() -> anyhow::Result<PathBuf> {
    static BINARY_PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY_PATH
        .get_or_init(|| find_or_build().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn find_or_build() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(format!("CARGO_BIN_EXE_{BINARY}")) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
    }
    let exe = std::env::current_exe().context("finding the test executable")?;
    // A test executable is `<target>/<profile>/deps/<name>-<hash>`, and the
    // package's binaries are in `<target>/<profile>`.
    let profile_dir = exe.parent().and_then(Path::parent);
    if let Some(candidate) = profile_dir.map(|d| d.join(BINARY))
        && is_fresh(&candidate)
    {
        return Ok(candidate);
    }
    build(profile_dir)
}

/// The files the binary is built from, besides its dependencies'.
fn sources() -> [PathBuf; 4] {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        manifest.join("src/bin/nisse-test-mcp.rs"),
        manifest.join("src/mcp.rs"),
        manifest.join("Cargo.toml"),
        manifest.join("../Cargo.lock"),
    ]
}

/// Whether `binary` exists and was built after its sources last changed.
fn is_fresh(binary: &Path) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(built) = modified(binary) else {
        return false;
    };
    sources()
        .iter()
        .all(|s| modified(s).is_some_and(|changed: SystemTime| changed <= built))
}

/// Builds the binary with cargo in the target directory holding
/// `profile_dir` (with that profile), returning the executable cargo
/// reports.
fn build(profile_dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut command = std::process::Command::new(&cargo);
    command
        .args([
            "build",
            "--quiet",
            "--message-format=json-render-diagnostics",
        ])
        .args(["--package", env!("CARGO_PKG_NAME"), "--bin", BINARY])
        .arg("--manifest-path")
        .arg(&manifest)
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(dir) = profile_dir {
        // Only a real target directory (cargo tags it) is reused; else
        // cargo's own choice stands.
        if let Some(target) = dir.parent().filter(|t| t.join("CACHEDIR.TAG").is_file()) {
            command.arg("--target-dir").arg(target);
        }
        if dir.file_name().is_some_and(|n| n == "release") {
            command.arg("--release");
        }
    }
    let output = command.output().with_context(|| {
        format!(
            "running `{} build -p {} --bin {BINARY}` (cargo builds the MCP test server)",
            Path::new(&cargo).display(),
            env!("CARGO_PKG_NAME")
        )
    })?;
    anyhow::ensure!(
        output.status.success(),
        "`cargo build -p {} --bin {BINARY}` failed ({}):\n{}",
        env!("CARGO_PKG_NAME"),
        output.status,
        crate::tail(&String::from_utf8_lossy(&output.stderr), 40)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == BINARY)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .with_context(|| format!("cargo built no `{BINARY}` executable"))
}

/// The reference filesystem server ([`FILESYSTEM_SERVER_PACKAGE`] at
/// [`FILESYSTEM_SERVER_VERSION`]) serving `dir` over stdio: `node
/// <package>/dist/index.js <dir>`. The package is installed with npm once
/// into [`npm_cache_dir`] and reused after that. Fails naming npm or node
/// when either is missing.
pub async fn filesystem_server(dir: &Path) -> anyhow::Result<StdioCommand> {
    let entry = tokio::task::spawn_blocking(install_filesystem_server)
        .await
        .context("installing the filesystem MCP server panicked")??;
    let node = which("node").context(
        "the reference MCP filesystem server runs on Node.js: no `node` on PATH \
         (Debian package `nodejs`)",
    )?;
    Ok(StdioCommand {
        program: node,
        args: vec![entry.display().to_string(), dir.display().to_string()],
        env: Vec::new(),
    })
}

/// Where npm packages for the tests are installed:
/// `$NISSE_NPM_MCP_CACHE`, else `$XDG_CACHE_HOME/nisse/npm-mcp`, else
/// `~/.cache/nisse/npm-mcp`: outside the clone, so `cargo clean` or a
/// fresh clone does not install them again.
pub fn npm_cache_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("NISSE_NPM_MCP_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let cache = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("HOME").context(
            "neither NISSE_NPM_MCP_CACHE, XDG_CACHE_HOME nor HOME is set: nowhere to install npm packages",
        )?)
        .join(".cache"),
    };
    Ok(cache.join("nisse").join("npm-mcp"))
}

/// Installs the filesystem server unless it is there, returning its entry
/// point. npm installs into a directory of its own that is then renamed
/// into place, so an interrupted install never looks complete; concurrent
/// test processes wait on a lock rather than install it twice.
fn install_filesystem_server() -> anyhow::Result<PathBuf> {
    let cache = npm_cache_dir()?;
    let name = format!("server-filesystem-{FILESYSTEM_SERVER_VERSION}");
    let prefix = cache.join(&name);
    let entry_in = |prefix: &Path| {
        prefix
            .join("node_modules")
            .join(FILESYSTEM_SERVER_PACKAGE)
            .join("dist/index.js")
    };
    let entry = entry_in(&prefix);
    if entry.is_file() {
        return Ok(entry);
    }
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let lock_path = cache.join(format!("{name}.lock"));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    if entry.is_file() {
        return Ok(entry);
    }
    let npm = which("npm").context(
        "the tests install the reference MCP filesystem server from the npm registry: \
         no `npm` on PATH (Debian package `npm`)",
    )?;
    let staging = cache.join(format!("{name}.installing"));
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .with_context(|| format!("removing the unfinished install {}", staging.display()))?;
    }
    let spec = format!("{FILESYSTEM_SERVER_PACKAGE}@{FILESYSTEM_SERVER_VERSION}");
    let output = std::process::Command::new(&npm)
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--omit=dev",
            "--prefix",
        ])
        .arg(&staging)
        .arg(&spec)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} install {spec}", npm.display()))?;
    anyhow::ensure!(
        output.status.success() && entry_in(&staging).is_file(),
        "`npm install --prefix {} {spec}` failed ({}), leaving no {}:\n{}",
        staging.display(),
        output.status,
        entry_in(&staging).display(),
        crate::tail(&String::from_utf8_lossy(&output.stderr), 30)
    );
    if prefix.exists() {
        // A directory without the entry point: an older, broken install.
        std::fs::remove_dir_all(&prefix)
            .with_context(|| format!("removing the broken install {}", prefix.display()))?;
    }
    std::fs::rename(&staging, &prefix)
        .with_context(|| format!("moving {} to {}", staging.display(), prefix.display()))?;
    Ok(entry)
}

/// `program` on `PATH`.
fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}
