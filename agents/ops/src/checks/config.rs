//! Scheduled checks as configured (seed L1, O5; Oikos REQ-OBS-2, 5):
//! `[[ops.duty]]` entries in the configuration and one TOML file per duty
//! in `ops.duties-dir`, so an operator can keep them in git, plus a
//! starter set for each host the executor knows.
//!
//! An entry is a flat table whose `kind` says which fields it takes; it
//! is checked once, at load, into a [`Duty`]: a field another kind takes,
//! a missing one, a bad name or interval, two duties of one name, and a
//! host check whose command is not read-only are refused with the duty
//! and the reason. A duty run is read-only by construction.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use nisse_policy::{Action, ActionClass, Policy};

/// One duty as written (`[[ops.duty]]` or a file in `ops.duties-dir`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct DutyEntry {
    /// Its name: lowercase letters, digits and `-` (it names the duty's
    /// subject and its findings). A file's name (without `.toml`) when the
    /// file does not say.
    #[serde(default)]
    pub name: String,
    /// `http`, `tcp`, `tls`, `ping`, `disk` or `ssh-script`. An entry that
    /// only turns a starter duty off (`enabled = false`) needs none.
    #[serde(default)]
    pub kind: String,
    /// How often it runs (default 1m).
    #[serde(default, with = "humantime_serde")]
    #[schemars(with = "Option<String>")]
    pub interval: Option<Duration>,
    /// How long one run may take (default 10s).
    #[serde(default, with = "humantime_serde")]
    #[schemars(with = "Option<String>")]
    pub timeout: Option<Duration>,
    /// The severity of its findings (default `warning`).
    #[serde(default)]
    pub severity: Option<String>,
    /// Failed runs in a row before a finding opens an item (default 2).
    #[serde(default)]
    pub fail_after: Option<u32>,
    /// Passed runs in a row before the finding resolves (default 2).
    #[serde(default)]
    pub recover_after: Option<u32>,
    /// `false` turns it off (a starter duty, by its name).
    #[serde(default)]
    pub enabled: Option<bool>,
    /// http: the URL.
    #[serde(default)]
    pub url: Option<String>,
    /// http: the status codes that pass (default any 2xx).
    #[serde(default)]
    pub expect_status: Option<Vec<u16>>,
    /// http: text the body must contain.
    #[serde(default)]
    pub body_contains: Option<String>,
    /// http: the longest acceptable answer time.
    #[serde(default, with = "humantime_serde")]
    #[schemars(with = "Option<String>")]
    pub max_latency: Option<Duration>,
    /// http: follow redirects (default true).
    #[serde(default)]
    pub follow_redirects: Option<bool>,
    /// http, tls: a PEM file of extra trusted certificate authorities.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// tcp, tls: the host to connect to; ping: the host to ping; disk,
    /// ssh-script: the host (as the executor names it) to run on.
    #[serde(default)]
    pub host: Option<String>,
    /// tcp, tls: the port (tls: default 443).
    #[serde(default)]
    pub port: Option<u16>,
    /// tls: the name the certificate must be valid for (default `host`).
    #[serde(default)]
    pub server_name: Option<String>,
    /// tls: the fewest days the certificate may have left (default 14).
    #[serde(default)]
    pub min_days_left: Option<u32>,
    /// ping: the host the ping runs from (default the first tool host).
    #[serde(default)]
    pub from: Option<String>,
    /// ping: echo requests to send (default 3).
    #[serde(default)]
    pub count: Option<u32>,
    /// disk: the mount point (default `/`).
    #[serde(default)]
    pub mount: Option<String>,
    /// disk: the highest acceptable use, in percent (default 90).
    #[serde(default)]
    pub max_used_percent: Option<u8>,
    /// ssh-script: the command; it must be read-only.
    #[serde(default)]
    pub command: Option<String>,
    /// ssh-script: the exit code that passes (default 0).
    #[serde(default)]
    pub expect_exit: Option<i32>,
    /// ssh-script: text the output must contain.
    #[serde(default)]
    pub output_contains: Option<String>,
}

/// A duty, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duty {
    /// Its name.
    pub name: String,
    /// How often it runs.
    pub interval: Duration,
    /// How long one run may take.
    pub timeout: Duration,
    /// Its findings' severity.
    pub severity: String,
    /// Failed runs in a row before a finding.
    pub fail_after: u32,
    /// Passed runs in a row before recovery.
    pub recover_after: u32,
    /// What it checks.
    pub check: Check,
    /// Whether it is one of the generated starter duties.
    pub starter: bool,
}

/// What a duty checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// An HTTP(S) request, by the prober.
    Http {
        /// The URL.
        url: String,
        /// Passing status codes; empty: any 2xx.
        expect_status: Vec<u16>,
        /// Text the body must contain.
        body_contains: Option<String>,
        /// The longest acceptable answer time.
        max_latency: Option<Duration>,
        /// Whether redirects are followed.
        follow_redirects: bool,
        /// Extra trusted authorities.
        ca_file: Option<PathBuf>,
    },
    /// A TCP connection, by the prober.
    Tcp {
        /// Host.
        host: String,
        /// Port.
        port: u16,
    },
    /// A TLS handshake and the certificate's days left, by the prober.
    Tls {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// The name the certificate must be valid for.
        server_name: String,
        /// The fewest days left that pass.
        min_days_left: u32,
        /// Extra trusted authorities.
        ca_file: Option<PathBuf>,
    },
    /// A command on a host, over SSH through the executor: `ping`, `disk`
    /// and `ssh-script` duties.
    Host {
        /// The host it runs on (bound to the duty).
        host: String,
        /// The command line (read-only, checked at load).
        command: String,
        /// How its result is judged.
        judge: Judge,
    },
}

/// How a host check's result is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judge {
    /// `ping`: exit 0 passes.
    Ping {
        /// The host pinged.
        target: String,
    },
    /// `disk`: the use `df` reports for the mount, at most this percent.
    Disk {
        /// The mount point.
        mount: String,
        /// The highest passing use.
        max_used_percent: u8,
    },
    /// `ssh-script`: the exit code, and text in the output.
    Script {
        /// The passing exit code.
        expect_exit: i32,
        /// Text the output must contain.
        output_contains: Option<String>,
    },
}

impl Check {
    /// The host a host check runs on.
    pub fn host(&self) -> Option<&str> {
        match self {
            Self::Host { host, .. } => Some(host),
            _ => None,
        }
    }

    /// What it checks, for a finding's fingerprint and title: the URL, or
    /// `host:port`, or the host (and mount).
    pub fn target(&self) -> String {
        match self {
            Self::Http { url, .. } => url.clone(),
            Self::Tcp { host, port } | Self::Tls { host, port, .. } => format!("{host}:{port}"),
            Self::Host { host, judge, .. } => match judge {
                Judge::Ping { target } => target.clone(),
                Judge::Disk { mount, .. } => format!("{host}:{mount}"),
                Judge::Script { .. } => host.clone(),
            },
        }
    }

    /// The kind's name as configured.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Http { .. } => "http",
            Self::Tcp { .. } => "tcp",
            Self::Tls { .. } => "tls",
            Self::Host { judge, .. } => match judge {
                Judge::Ping { .. } => "ping",
                Judge::Disk { .. } => "disk",
                Judge::Script { .. } => "ssh-script",
            },
        }
    }
}

/// The names of the starter duties for a host.
pub fn starter_names(host: &str) -> [String; 2] {
    [format!("{host}-ssh"), format!("{host}-root-disk")]
}

/// The shortest interval a duty may have.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// What the duties are loaded from.
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    /// `[[ops.duty]]`, where `ops` is configured (`prefix`, for errors).
    pub entries: &'a [DutyEntry],
    /// The configuration key they are under (`ops.duty`).
    pub prefix: &'a str,
    /// `ops.duties-dir`, when set.
    pub dir: Option<&'a Path>,
    /// The hosts the executor knows for the agent: each gets the starter
    /// duties (reachable over SSH, root filesystem use).
    pub hosts: &'a [String],
    /// Whether starter duties are made (`ops.starter-duties`).
    pub starters: bool,
    /// The agent's tool hosts: where a ping runs by default.
    pub tool_hosts: &'a [String],
}

/// Loads and checks every duty. `Err` lists every problem, each naming
/// its duty (or file) and what is wrong; nothing is half loaded.
pub fn load(sources: Sources<'_>, policy: &Policy) -> Result<Vec<Duty>, Vec<String>> {
    let mut named: Vec<(String, DutyEntry)> = sources
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| (format!("{}[{i}]", sources.prefix), e.clone()))
        .collect();
    let mut problems = Vec::new();
    if let Some(dir) = sources.dir {
        match read_dir(dir) {
            Ok(files) => named.extend(files),
            Err(e) => problems.push(e),
        }
    }
    // Starter duties: an entry of the same name replaces one (an operator
    // turns it off with `enabled = false`).
    let mut starters: Vec<(String, DutyEntry)> = Vec::new();
    if sources.starters {
        for host in sources.hosts {
            let [ssh, disk] = starter_names(host);
            starters.push((
                format!("the starter duty {ssh}"),
                DutyEntry {
                    name: ssh,
                    kind: "ssh-script".into(),
                    interval: Some(Duration::from_secs(300)),
                    host: Some(host.clone()),
                    command: Some("true".into()),
                    ..DutyEntry::default()
                },
            ));
            starters.push((
                format!("the starter duty {disk}"),
                DutyEntry {
                    name: disk,
                    kind: "disk".into(),
                    interval: Some(Duration::from_secs(900)),
                    host: Some(host.clone()),
                    ..DutyEntry::default()
                },
            ));
        }
    }
    let configured: BTreeSet<String> = named.iter().map(|(_, e)| e.name.clone()).collect();
    let starter_set: BTreeSet<String> = starters.iter().map(|(_, e)| e.name.clone()).collect();
    named.extend(
        starters
            .into_iter()
            .filter(|(_, e)| !configured.contains(&e.name)),
    );

    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut duties = Vec::new();
    for (whence, entry) in named {
        if let Some(first) = seen.insert(entry.name.clone(), whence.clone()) {
            problems.push(format!(
                "{whence}: a duty named `{}` is already defined by {first}",
                entry.name
            ));
            continue;
        }
        if entry.enabled == Some(false) {
            continue;
        }
        match check_entry(&entry, sources.tool_hosts, policy) {
            Ok(mut duty) => {
                duty.starter = starter_set.contains(&duty.name) && !configured.contains(&duty.name);
                duties.push(duty);
            }
            Err(why) => problems.push(format!("{whence} (`{}`): {why}", entry.name)),
        }
    }
    if problems.is_empty() {
        duties.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(duties)
    } else {
        Err(problems)
    }
}

/// The duties in `dir`: one per `*.toml` file, named by the file unless
/// it says otherwise, in name order.
fn read_dir(dir: &Path) -> Result<Vec<(String, DutyEntry)>, String> {
    let listing =
        std::fs::read_dir(dir).map_err(|e| format!("ops.duties-dir {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = listing
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for file in files {
        let whence = file.display().to_string();
        let parsed = std::fs::read_to_string(&file)
            .map_err(|e| e.to_string())
            .and_then(|text| toml::from_str::<DutyEntry>(&text).map_err(|e| e.to_string()));
        match parsed {
            Ok(mut entry) => {
                if entry.name.is_empty() {
                    entry.name = file
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default();
                }
                out.push((whence, entry));
            }
            Err(e) => problems.push(format!("{whence}: {}", e.trim())),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems.join("; "))
    }
}

/// Checks one entry into a duty.
fn check_entry(e: &DutyEntry, tool_hosts: &[String], policy: &Policy) -> Result<Duty, String> {
    if !nisse_bus::topology::is_duty_name(&e.name) {
        return Err(
            "a duty's name is lowercase letters, digits and `-`, at most 64 characters".into(),
        );
    }
    let interval = e.interval.unwrap_or(Duration::from_secs(60));
    if interval < MIN_INTERVAL {
        return Err(format!(
            "interval {} is shorter than {}",
            humantime::format_duration(interval),
            humantime::format_duration(MIN_INTERVAL)
        ));
    }
    let timeout = e.timeout.unwrap_or(Duration::from_secs(10));
    if timeout.is_zero() || timeout > Duration::from_secs(600) {
        return Err("timeout must be longer than zero and at most 10m".into());
    }
    let fail_after = e.fail_after.unwrap_or(2);
    let recover_after = e.recover_after.unwrap_or(2);
    if fail_after == 0 || recover_after == 0 {
        return Err("fail-after and recover-after must be at least 1".into());
    }
    // Which fields each kind takes; any other set is refused by name.
    let set: Vec<(&str, bool)> = vec![
        ("url", e.url.is_some()),
        ("expect-status", e.expect_status.is_some()),
        ("body-contains", e.body_contains.is_some()),
        ("max-latency", e.max_latency.is_some()),
        ("follow-redirects", e.follow_redirects.is_some()),
        ("ca-file", e.ca_file.is_some()),
        ("host", e.host.is_some()),
        ("port", e.port.is_some()),
        ("server-name", e.server_name.is_some()),
        ("min-days-left", e.min_days_left.is_some()),
        ("from", e.from.is_some()),
        ("count", e.count.is_some()),
        ("mount", e.mount.is_some()),
        ("max-used-percent", e.max_used_percent.is_some()),
        ("command", e.command.is_some()),
        ("expect-exit", e.expect_exit.is_some()),
        ("output-contains", e.output_contains.is_some()),
    ];
    let takes: &[&str] = match e.kind.as_str() {
        "http" => &[
            "url",
            "expect-status",
            "body-contains",
            "max-latency",
            "follow-redirects",
            "ca-file",
        ],
        "tcp" => &["host", "port"],
        "tls" => &["host", "port", "server-name", "min-days-left", "ca-file"],
        "ping" => &["host", "from", "count"],
        "disk" => &["host", "mount", "max-used-percent"],
        "ssh-script" => &["host", "command", "expect-exit", "output-contains"],
        "" => {
            return Err(
                "a duty needs `kind`: one of http, tcp, tls, ping, disk, ssh-script".into(),
            );
        }
        other => {
            return Err(format!(
                "kind `{other}` is not one of http, tcp, tls, ping, disk, ssh-script"
            ));
        }
    };
    if let Some((field, _)) = set.iter().find(|(f, on)| *on && !takes.contains(f)) {
        return Err(format!("`{field}` is not a field of {} duties", e.kind));
    }
    let need = |v: &Option<String>, field: &str| -> Result<String, String> {
        v.as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .ok_or_else(|| format!("{} duties need `{field}`", e.kind))
    };
    let check = match e.kind.as_str() {
        "http" => {
            let url = need(&e.url, "url")?;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!("url `{url}` is not an http:// or https:// URL"));
            }
            Check::Http {
                url,
                expect_status: e.expect_status.clone().unwrap_or_default(),
                body_contains: e.body_contains.clone().filter(|b| !b.is_empty()),
                max_latency: e.max_latency,
                follow_redirects: e.follow_redirects.unwrap_or(true),
                ca_file: e.ca_file.clone(),
            }
        }
        "tcp" => Check::Tcp {
            host: need(&e.host, "host")?,
            port: e
                .port
                .filter(|p| *p > 0)
                .ok_or("tcp duties need `port` (1-65535)")?,
        },
        "tls" => {
            let host = need(&e.host, "host")?;
            Check::Tls {
                server_name: e.server_name.clone().unwrap_or_else(|| host.clone()),
                port: e.port.unwrap_or(443),
                min_days_left: e.min_days_left.unwrap_or(14),
                ca_file: e.ca_file.clone(),
                host,
            }
        }
        "ping" => {
            let target = need(&e.host, "host")?;
            let from = match &e.from {
                Some(f) => f.clone(),
                None => tool_hosts.first().cloned().ok_or(
                    "ping duties run from a host: set `from`, or give the agent a tool host (ops.tool-hosts)",
                )?,
            };
            let count = e.count.unwrap_or(3).clamp(1, 20);
            let wait = timeout.as_secs().max(1);
            Check::Host {
                host: from,
                command: format!("ping -c {count} -w {wait} -- {}", shell_word(&target)?),
                judge: Judge::Ping { target },
            }
        }
        "disk" => {
            let mount = e.mount.clone().unwrap_or_else(|| "/".into());
            if !mount.starts_with('/') {
                return Err(format!("mount `{mount}` is not an absolute path"));
            }
            let max = e.max_used_percent.unwrap_or(90);
            if max == 0 || max > 100 {
                return Err("max-used-percent must be 1 to 100".into());
            }
            Check::Host {
                host: need(&e.host, "host")?,
                command: format!("df -P -- {}", shell_word(&mount)?),
                judge: Judge::Disk {
                    mount,
                    max_used_percent: max,
                },
            }
        }
        _ => Check::Host {
            host: need(&e.host, "host")?,
            command: need(&e.command, "command")?,
            judge: Judge::Script {
                expect_exit: e.expect_exit.unwrap_or(0),
                output_contains: e.output_contains.clone().filter(|o| !o.is_empty()),
            },
        },
    };
    if let Check::Host { host, command, .. } = &check {
        let assessed = policy.assess(&Action::shell(host, command), None);
        if assessed.class != ActionClass::NoSideEffects {
            return Err(format!(
                "its command `{command}` is not read-only ({}): a duty only looks{}",
                assessed.risk,
                if assessed.reasons.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", assessed.reasons.join("; "))
                }
            ));
        }
    }
    Ok(Duty {
        name: e.name.clone(),
        interval,
        timeout,
        severity: e.severity.clone().unwrap_or_else(|| "warning".into()),
        fail_after,
        recover_after,
        check,
        starter: false,
    })
}

/// `s` as one shell word: plain words as they are, anything else refused
/// (a duty's host and mount are names, not shell).
fn shell_word(s: &str) -> Result<&str, String> {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/' | ':'))
        && !s.starts_with('-')
    {
        Ok(s)
    } else {
        Err(format!("`{s}` is not a plain host name or path"))
    }
}
