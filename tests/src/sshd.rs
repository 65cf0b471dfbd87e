//! A real OpenSSH server for tests: Debian's `sshd` (package
//! `openssh-server`) on a free loopback port with its own host key, client
//! key and `authorized_keys` in a temporary directory, standing in for a
//! tool VM. Tests talk to what OpenSSH really does (its banner, key
//! exchange, host key checking, session limits) rather than to an
//! imitation, and can stop, restart and re-key it.
//!
//! The login user is the user running the tests: as root `sshd` runs with
//! privilege separation (it needs `/run/sshd`, created here if missing);
//! unprivileged it can only log in as that same user, which is all the
//! tests need.
//!
//! A host that is not like this machine ([`SshdOptions`]: a login shell
//! other than the user's, no bash) is had without changing anything
//! outside the test: as root, `sshd` starts in a private mount namespace
//! of its own (`unshare`), where a copy of `/etc/passwd` giving the login
//! user another shell is mounted over `/etc/passwd`, and a file nobody can
//! execute over bash. Its sessions inherit that view; nothing else sees
//! it, and it goes away with the server.
//!
//! A missing binary fails the test naming the package; it never skips.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::{LaunchError, free_port, tail};
use nix::unistd::{User, getuid};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// Where Debian puts the server; `PATH` is searched after it.
const SSHD: &str = "/usr/sbin/sshd";

/// How long `sshd` gets to accept a connection and send its banner.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a restart keeps trying to bind the port it had before.
const REBIND_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `sshd` gets to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The host name [`TestSshd::ssh_command`] checks the host key under
/// (OpenSSH's `HostKeyAlias`); `client_known_hosts` pins the key for it.
pub const HOST_KEY_ALIAS: &str = "nisse-test-sshd";

/// What `sshd` writes, at `LogLevel VERBOSE`, for every TCP connection it
/// accepts: `Connection from 127.0.0.1 port 56802 on 127.0.0.1 port 42222
/// rdomain ""`.
const CONNECTION_LINE: &str = "Connection from ";

/// A readiness probe: a connection [`TestSshd::connections`] does not
/// count. It is the first `Connection from` line with the probe's client
/// port written after the log had `log_offset` bytes.
#[derive(Debug, Clone, Copy)]
struct Probe {
    log_offset: u64,
    client_port: u16,
}

/// How a [`TestSshd`] differs from the plain one [`TestSshd::start`]
/// gives: another login user, another login shell, no bash.
#[derive(Debug, Clone, Default)]
pub struct SshdOptions {
    user: Option<String>,
    login_shell: Option<(PathBuf, String)>,
    without_bash: bool,
}

impl SshdOptions {
    /// A plain server: the user running the tests, with their own shell.
    pub fn new() -> Self {
        Self::default()
    }

    /// Logs in as `user`, which must exist; see [`TestSshd::start_as`].
    pub fn user(mut self, user: &str) -> Self {
        self.user = Some(user.to_string());
        self
    }

    /// The login user's shell, as `sshd` and its sessions see it, is
    /// `path` (which the Debian package `package` installs: a missing one
    /// fails naming it), as on a host whose users log in to zsh. Needs
    /// root (a mount namespace).
    pub fn login_shell(mut self, path: impl Into<PathBuf>, package: &str) -> Self {
        self.login_shell = Some((path.into(), package.to_string()));
        self
    }

    /// The host has no bash: for `sshd` and its sessions, every `bash` on
    /// the standard paths is a file nobody may execute (so looking it up
    /// fails with "Permission denied"). Give the login user another shell
    /// too ([`SshdOptions::login_shell`], e.g. `/bin/sh`). Needs root.
    pub fn without_bash(mut self) -> Self {
        self.without_bash = true;
        self
    }

    /// Whether `sshd` must start in a mount namespace of its own.
    fn namespaced(&self) -> bool {
        self.login_shell.is_some() || self.without_bash
    }
}

/// The files mounted over the system's in `sshd`'s own mount namespace.
#[derive(Debug, Clone)]
struct Namespace {
    /// The copy of `/etc/passwd` with the login user's shell changed.
    passwd: PathBuf,
    /// The non-executable file, and the paths of bash it hides.
    no_bash: Option<(PathBuf, Vec<PathBuf>)>,
}

/// A running `sshd -D` on `127.0.0.1`, killed when dropped.
pub struct TestSshd {
    program: PathBuf,
    child: Option<Child>,
    port: u16,
    user: String,
    host_public_key: String,
    probes: Vec<Probe>,
    namespace: Option<Namespace>,
    dir: TempDir,
}

impl TestSshd {
    /// Generates a host key and a client key, authorizes the client key
    /// for the current user, starts `sshd` on a free loopback port and
    /// waits until it answers with an `SSH-2.0-` banner.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_as(&current_user()?).await
    }

    /// Like [`TestSshd::start`], logging in as `user` instead, which must
    /// exist; only root can run a server that lets in another user. The
    /// benchmark uses it for an account whose shell reads no profile, as on
    /// a tool VM, so that this machine's own shell start-up is not what is
    /// measured.
    pub async fn start_as(user: &str) -> anyhow::Result<Self> {
        Self::start_with(SshdOptions::new().user(user)).await
    }

    /// Like [`TestSshd::start`], for a host as `options` describe it.
    pub async fn start_with(options: SshdOptions) -> anyhow::Result<Self> {
        let program = find_sshd().with_context(|| {
            format!(
                "the tests need OpenSSH's server (`{SSHD}` or `sshd` on PATH): install the Debian package `openssh-server`"
            )
        })?;
        let user = match &options.user {
            Some(u) => u.clone(),
            None => current_user()?,
        };
        if nix::unistd::geteuid().is_root() {
            privsep_dir()?;
        }
        let dir = tempfile::Builder::new().prefix("nisse-sshd-").tempdir()?;
        let namespace = if options.namespaced() {
            Some(namespace(&options, &user, dir.path())?)
        } else {
            None
        };
        keygen(&dir.path().join("host_ed25519"), "nisse-test-sshd-host").await?;
        keygen(&dir.path().join("client_ed25519"), "nisse-test-sshd-client").await?;
        let client_public = std::fs::read_to_string(dir.path().join("client_ed25519.pub"))?;
        std::fs::write(dir.path().join("authorized_keys"), client_public)?;
        if user != current_user()? {
            // sshd reads the authorized keys as the user logging in.
            use std::os::unix::fs::PermissionsExt as _;
            for (path, mode) in [
                (dir.path().to_path_buf(), 0o755),
                (dir.path().join("authorized_keys"), 0o644),
            ] {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                    .with_context(|| format!("making {} readable", path.display()))?;
            }
        }
        let host_public_key = read_public_key(&dir.path().join("host_ed25519.pub"))?;
        std::fs::write(
            dir.path().join("client_known_hosts"),
            format!("{HOST_KEY_ALIAS} {host_public_key}\n"),
        )?;
        let mut sshd = Self {
            program,
            child: None,
            port: 0,
            user,
            host_public_key,
            probes: Vec::new(),
            namespace,
            dir,
        };
        // A free port is found by binding and releasing it, which another
        // process could take in between: try again on a fresh port then.
        let mut last_error = None;
        for _ in 0..3 {
            sshd.port = free_port()?;
            sshd.write_config()?;
            match sshd.launch().await {
                Ok(()) => return Ok(sshd),
                Err(LaunchError::PortInUse(e)) => last_error = Some(e),
                Err(LaunchError::Failed(e)) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("sshd did not start")))
    }

    /// Stops it with SIGTERM and waits until it has exited (killing it if
    /// it takes longer than 5 s). Sessions already open live on in their
    /// own processes until their clients leave; new connections are
    /// refused. Stopping a stopped server does nothing.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        crate::stop_child(&mut child, "sshd", STOP_TIMEOUT, || self.log_tail()).await
    }

    /// Starts it again (stopping it first if it runs) on the same port
    /// with the same keys, retrying for a few seconds while the port is
    /// still taken.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await?;
        let deadline = Instant::now() + REBIND_TIMEOUT;
        loop {
            match self.launch().await {
                Ok(()) => return Ok(()),
                Err(LaunchError::PortInUse(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(LaunchError::PortInUse(e) | LaunchError::Failed(e)) => {
                    return Err(e.context(format!("restarting sshd on port {}", self.port)));
                }
            }
        }
    }

    /// Stops it, replaces its host key with a newly generated one and
    /// starts it again on the same port: clients that pinned the old key
    /// (such as [`TestSshd::ssh_command`], whose `client_known_hosts` is
    /// not updated) now see a changed host key.
    pub async fn rotate_host_key(&mut self) -> anyhow::Result<()> {
        self.stop().await?;
        let key = self.dir().join("host_ed25519");
        // ssh-keygen asks before overwriting; there is nobody to answer.
        for path in [key.clone(), key.with_extension("pub")] {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("removing {}", path.display()));
                }
                _ => {}
            }
        }
        keygen(&key, "nisse-test-sshd-host").await?;
        self.host_public_key = read_public_key(&key.with_extension("pub"))?;
        self.restart().await
    }

    /// The port it listens on (never 22).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address it listens on: `127.0.0.1`.
    pub fn addr(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }

    /// [`TestSshd::addr`] and [`TestSshd::port`] together.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr(), self.port)
    }

    /// The user it lets in: the user running the tests.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The client's private key (ed25519, OpenSSH format, no passphrase),
    /// the only key in `authorized_keys`; its public half is next to it
    /// with `.pub` appended.
    pub fn client_key(&self) -> PathBuf {
        self.dir().join("client_ed25519")
    }

    /// Appends `line` to its `authorized_keys` (an OpenSSH key line,
    /// options first if any, e.g. a `command="..."` restriction). `sshd`
    /// reads the file at each login, so the key works from the next
    /// connection on, without a restart.
    pub fn authorize_key(&self, line: &str) -> anyhow::Result<()> {
        use std::io::Write as _;

        if line.contains('\n') {
            anyhow::bail!("an authorized_keys entry is one line, got {line:?}");
        }
        let path = self.dir().join("authorized_keys");
        let existing = std::fs::read(&path).unwrap_or_default();
        let separator = if existing.is_empty() || existing.ends_with(b"\n") {
            ""
        } else {
            "\n"
        };
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        writeln!(file, "{separator}{line}").with_context(|| format!("writing {}", path.display()))
    }

    /// The temporary directory holding its keys, configuration and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Its current host key as OpenSSH writes public keys, without the
    /// comment: `ssh-ed25519 AAAA...`.
    pub fn host_public_key(&self) -> &str {
        &self.host_public_key
    }

    /// An OpenSSH `known_hosts` line pinning its current host key for a
    /// host called `name` on its port: `[name]:port ssh-ed25519 AAAA...`.
    pub fn known_hosts_line(&self, name: &str) -> String {
        format!("[{name}]:{} {}", self.port, self.host_public_key)
    }

    /// Appends [`TestSshd::known_hosts_line`] for `name` to the
    /// `known_hosts` file at `path`, creating it and its directories if
    /// needed.
    pub fn write_known_hosts(&self, path: &Path, name: &str) -> anyhow::Result<()> {
        use std::io::Write as _;

        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let existing = std::fs::read(path).unwrap_or_default();
        let separator = if existing.is_empty() || existing.ends_with(b"\n") {
            ""
        } else {
            "\n"
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        writeln!(file, "{separator}{}", self.known_hosts_line(name))
            .with_context(|| format!("writing {}", path.display()))
    }

    /// An OpenSSH client command running `command` on this server as
    /// [`TestSshd::user`] with [`TestSshd::client_key`], non-interactive,
    /// reading no `ssh_config`, and checking the host key strictly against
    /// `client_known_hosts` in [`TestSshd::dir`], which pins the key the
    /// server started with under [`HOST_KEY_ALIAS`]. Its output is not
    /// redirected: set stdin, stdout and stderr as the test needs.
    pub fn ssh_command(&self, command: &str) -> Command {
        let mut ssh = Command::new("ssh");
        ssh.arg("-F")
            .arg("none")
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-i")
            .arg(self.client_key())
            .args(["-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o"])
            .arg(format!(
                "UserKnownHostsFile={}",
                self.dir().join("client_known_hosts").display()
            ))
            .args(["-o", "StrictHostKeyChecking=yes", "-o"])
            .arg(format!("HostKeyAlias={HOST_KEY_ALIAS}"))
            .arg(format!("{}@{}", self.user, self.addr()))
            .arg(command)
            .kill_on_drop(true);
        ssh
    }

    /// Its whole log so far, across restarts (`LogLevel VERBOSE`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The last lines of its log, for assertion messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log(), 30)
    }

    /// How many TCP connections reached it so far, across restarts,
    /// counted from its `Connection from 127.0.0.1 port N on 127.0.0.1
    /// port P` log lines; the harness's own readiness probes are not
    /// counted. A connection is logged before `sshd` sends its banner, so
    /// every connection a finished client made is counted.
    pub fn connections(&self) -> usize {
        let log = self.log();
        let mut probes = self.probes.clone();
        let mut count = 0;
        let mut offset = 0u64;
        for line in log.split_inclusive('\n') {
            let line_offset = offset;
            offset += line.len() as u64;
            let Some(rest) = line.strip_prefix(CONNECTION_LINE) else {
                continue;
            };
            // `127.0.0.1 port N on 127.0.0.1 port P rdomain ""`
            let client_port = rest
                .split_whitespace()
                .nth(2)
                .and_then(|p| p.parse::<u16>().ok());
            let probe = probes
                .iter()
                .position(|p| Some(p.client_port) == client_port && p.log_offset <= line_offset);
            match probe {
                Some(i) => {
                    probes.swap_remove(i);
                }
                None => count += 1,
            }
        }
        count
    }

    /// Waits until its log contains `needle`, failing with the log's tail
    /// after `timeout`.
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(needle) {
            if Instant::now() > deadline {
                anyhow::bail!(
                    "sshd did not log `{needle}` within {timeout:?}; log tail:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn log_path(&self) -> PathBuf {
        self.dir().join("sshd.log")
    }

    fn config_path(&self) -> PathBuf {
        self.dir().join("sshd_config")
    }

    /// Writes `sshd_config` for the current port.
    fn write_config(&self) -> anyhow::Result<()> {
        let dir = self.dir();
        let config = format!(
            "\
ListenAddress 127.0.0.1
Port {port}
HostKey {host_key}
AuthorizedKeysFile {authorized_keys}
PidFile {pid_file}
UsePAM no
# The keys live in a world-readable temporary directory.
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
AcceptEnv NISSE_*
LogLevel VERBOSE
MaxSessions 32
MaxStartups 100:30:200
Subsystem sftp internal-sftp
",
            port = self.port,
            host_key = dir.join("host_ed25519").display(),
            authorized_keys = dir.join("authorized_keys").display(),
            pid_file = dir.join("sshd.pid").display(),
        );
        std::fs::write(self.config_path(), config)
            .with_context(|| format!("writing {}", self.config_path().display()))
    }

    /// Starts `sshd` with the current configuration, appending to the log,
    /// and waits until it sends its banner.
    async fn launch(&mut self) -> Result<(), LaunchError> {
        let log_path = self.log_path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let log_start = log.metadata()?.len();
        let mut command = match &self.namespace {
            None => Command::new(&self.program),
            Some(ns) => {
                // sh binds the files over the system's, then becomes
                // sshd: one process, so its pid is the server's.
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
                    .arg(NAMESPACE_SCRIPT)
                    .arg("sh")
                    .arg(&ns.passwd);
                match &ns.no_bash {
                    Some((file, targets)) => {
                        c.arg(file).args(targets);
                    }
                    None => {
                        c.arg("");
                    }
                }
                c.arg("--").arg(&self.program);
                c
            }
        };
        let mut child = command
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(self.config_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.program.display()))?;
        let this_run = |log: &Path| -> String {
            let text = std::fs::read(log).unwrap_or_default();
            let start = usize::try_from(log_start).unwrap_or(0).min(text.len());
            String::from_utf8_lossy(&text[start..]).into_owned()
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                let output = this_run(&log_path);
                let error = anyhow::anyhow!(
                    "sshd exited ({status}) before it was ready on port {}; log tail:\n{}",
                    self.port,
                    tail(&output, 30)
                );
                return Err(
                    if output.contains("Address already in use")
                        || output.contains("Cannot bind any address")
                    {
                        LaunchError::PortInUse(error)
                    } else {
                        LaunchError::Failed(error)
                    },
                );
            }
            let log_offset = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
            match probe(self.port).await {
                Ok(client_port) => {
                    self.probes.push(Probe {
                        log_offset,
                        client_port,
                    });
                    self.child = Some(child);
                    return Ok(());
                }
                Err(Some(client_port)) => self.probes.push(Probe {
                    log_offset,
                    client_port,
                }),
                Err(None) => {}
            }
            if Instant::now() > deadline {
                let _ = child.kill().await;
                return Err(LaunchError::Failed(anyhow::anyhow!(
                    "sshd did not answer with an SSH-2.0- banner on port {} within {READY_TIMEOUT:?}; log tail:\n{}",
                    self.port,
                    tail(&this_run(&log_path), 30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for TestSshd {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
        }
    }
}

/// Run by `/bin/sh` in `sshd`'s new mount namespace, with the arguments
/// `passwd-copy no-bash-file bash-path… -- sshd args…` (an empty
/// `no-bash-file` and no paths when bash stays): binds the files, then
/// execs `sshd`.
const NAMESPACE_SCRIPT: &str = r#"set -e
passwd=$1; fake=$2; shift 2
mount --bind "$passwd" /etc/passwd
while [ "$1" != -- ]; do mount --bind "$fake" "$1"; shift; done
shift
exec "$@""#;

/// Makes the files [`SshdOptions`] asks for in `dir`: a copy of
/// `/etc/passwd` with `user`'s shell replaced, and a non-executable stand-in
/// for bash with the paths it hides.
fn namespace(options: &SshdOptions, user: &str, dir: &Path) -> anyhow::Result<Namespace> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!(
            "a test sshd with another login shell or without bash starts in a mount namespace of its own, which needs root; run the tests as root (CI does)"
        );
    }
    for (program, package) in [("unshare", "util-linux"), ("mount", "mount")] {
        if !["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .any(|d| Path::new(d).join(program).is_file())
        {
            anyhow::bail!(
                "a test sshd in a mount namespace needs `{program}`: install the Debian package `{package}`"
            );
        }
    }
    let passwd = std::fs::read_to_string("/etc/passwd").context("reading /etc/passwd")?;
    let mut found = false;
    let mut copy = String::new();
    for line in passwd.lines() {
        let mut fields: Vec<&str> = line.split(':').collect();
        if fields.len() == 7 && fields[0] == user {
            found = true;
            if let Some((shell, package)) = &options.login_shell {
                if !shell.is_file() {
                    anyhow::bail!(
                        "the test needs {} as a login shell: install the Debian package `{package}`",
                        shell.display()
                    );
                }
                let shell = shell.to_str().context("a login shell's path is text")?;
                fields[6] = shell;
                copy.push_str(&fields.join(":"));
                copy.push('\n');
                continue;
            }
        }
        copy.push_str(line);
        copy.push('\n');
    }
    if !found {
        anyhow::bail!("{user} is not in /etc/passwd");
    }
    let passwd = dir.join("passwd");
    std::fs::write(&passwd, copy).with_context(|| format!("writing {}", passwd.display()))?;
    let no_bash = if options.without_bash {
        let file = dir.join("no-bash");
        // Not executable by anyone, root included.
        std::fs::write(&file, "#!/bin/false\n")?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))?;
        let mut targets: Vec<PathBuf> = Vec::new();
        for path in ["/usr/bin/bash", "/bin/bash", "/usr/local/bin/bash"] {
            if let Ok(real) = std::fs::canonicalize(path)
                && !targets.contains(&real)
            {
                targets.push(real);
            }
        }
        Some((file, targets))
    } else {
        None
    };
    Ok(Namespace { passwd, no_bash })
}

/// Connects to `port` and reads the first line it sends. `Ok(client_port)`
/// means it was an `SSH-2.0-` banner; `Err(Some(client_port))` that a
/// connection was made but no banner came; `Err(None)` that no connection
/// was made.
async fn probe(port: u16) -> Result<u16, Option<u16>> {
    let connect = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port));
    let stream = match tokio::time::timeout(Duration::from_secs(1), connect).await {
        Ok(Ok(stream)) => stream,
        _ => return Err(None),
    };
    let client_port = stream.local_addr().map_err(|_| None)?.port();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let read = tokio::time::timeout(Duration::from_secs(2), reader.read_line(&mut line)).await;
    match read {
        Ok(Ok(_)) if line.starts_with("SSH-2.0-") => Ok(client_port),
        _ => Err(Some(client_port)),
    }
}

/// The user running the tests.
fn current_user() -> anyhow::Result<String> {
    let uid = getuid();
    let user = User::from_uid(uid)
        .with_context(|| format!("looking up the user with uid {uid}"))?
        .with_context(|| format!("uid {uid} has no user name (no passwd entry)"))?;
    Ok(user.name)
}

/// Creates `/run/sshd`, the empty directory a root `sshd` chroots its
/// unprivileged pre-authentication processes into, if it is missing.
fn privsep_dir() -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;

    let path = Path::new("/run/sshd");
    match std::fs::DirBuilder::new().mode(0o755).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| {
            format!(
                "creating {}, which sshd needs when it runs as root",
                path.display()
            )
        }),
    }
}

/// Generates an ed25519 key pair without passphrase at `path` and
/// `path.pub`.
async fn keygen(path: &Path, comment: &str) -> anyhow::Result<()> {
    let output = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .await
        .context(
            "the tests need OpenSSH's `ssh-keygen` on PATH: install the Debian package `openssh-server` (it brings `openssh-client`)",
        )?;
    if !output.status.success() {
        anyhow::bail!(
            "ssh-keygen failed ({}) generating {}: {}",
            output.status,
            path.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// The key type and base64 key of an OpenSSH public key file, without the
/// comment.
fn read_public_key(path: &Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut fields = text.split_whitespace();
    match (fields.next(), fields.next()) {
        (Some(kind), Some(key)) => Ok(format!("{kind} {key}")),
        _ => anyhow::bail!("{} is not an OpenSSH public key: {text:?}", path.display()),
    }
}

/// `/usr/sbin/sshd`, else `sshd` on `PATH`; `sshd` re-executes itself for
/// every connection, so the path must be absolute.
fn find_sshd() -> Option<PathBuf> {
    let debian = PathBuf::from(SSHD);
    if debian.is_file() {
        return Some(debian);
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join("sshd"))
        .find(|p| p.is_file())
        .and_then(|p| std::path::absolute(p).ok())
}
