//! The executor's settings (`[executor]` in `nisse.toml`): timeouts, the
//! output cap, the circuit breaker, and per agent its SSH identity, its
//! pinned host keys, the hosts it can reach and the secrets it may hand
//! out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use nisse_bus::secret::Secret;

/// The executor's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// How long connecting, verifying the host key and authenticating may
    /// take.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub connect_timeout: Duration,
    /// The longest any command may run; a request may ask for less. A
    /// command that outruns it is reported as outcome-unknown (it may still
    /// be running on the host), never retried blindly.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub command_timeout: Duration,
    /// A pooled connection unused this long is closed.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub idle_timeout: Duration,
    /// Output kept per stream (stdout, stderr): half from the start, half
    /// from the end; the middle is counted, not kept.
    #[schemars(with = "String")]
    pub output_cap: ByteSize,
    /// How often a running command's new output is published as progress.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub progress_interval: Duration,
    /// Requests handled at once, per agent (each runs at most one
    /// command); further ones wait their turn, kept alive meanwhile.
    pub max_in_flight: usize,
    /// Channels open at once on one connection (OpenSSH's `MaxSessions`
    /// is 10 by default).
    pub max_channels_per_connection: usize,
    /// Consecutive connection failures to a host that open its circuit.
    pub breaker_failures: u32,
    /// Failures further apart than this do not add up.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub breaker_window: Duration,
    /// How long an open circuit fails requests at once.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub breaker_cooldown: Duration,
    /// The oldest an execution request may be when it arrives (its signed
    /// creation time): an older one is refused, so a signed request
    /// replayed after its execution record expired
    /// (`EXEC_RECORD_MAX_AGE`, 30 days) can never run again.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub max_request_age: Duration,
    /// Per agent: identity, known hosts, hosts and secrets.
    pub agents: BTreeMap<String, AgentConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            command_timeout: Duration::from_secs(30 * 60),
            idle_timeout: Duration::from_secs(300),
            output_cap: ByteSize::kib(256),
            progress_interval: Duration::from_secs(5),
            max_in_flight: 16,
            max_channels_per_connection: 8,
            breaker_failures: 3,
            breaker_window: Duration::from_secs(60),
            breaker_cooldown: Duration::from_secs(30),
            max_request_age: Duration::from_secs(7 * 24 * 3600),
            agents: BTreeMap::new(),
        }
    }
}

/// One agent's SSH side. Each agent has its own key and known-hosts file,
/// so no agent can reach with another's identity (seed X1, L12).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct AgentConfig {
    /// The private key (OpenSSH format, unencrypted). Default:
    /// `<data-dir>/agents/<agent>/ssh/id_ed25519`.
    pub key_file: Option<PathBuf>,
    /// The pinned host keys, in OpenSSH `known_hosts` format (hashed names
    /// work). Default: `<data-dir>/agents/<agent>/ssh/known_hosts`. A host
    /// whose key is not there is refused; one whose key differs is refused
    /// and reported.
    pub known_hosts: Option<PathBuf>,
    /// The public key of the agent's brain, which signs every execution
    /// request and host binding (read at each request, so a new key takes
    /// effect at once). Default: `<data-dir>/agents/<agent>/brain/signing.pub`,
    /// which the brain writes when it first starts.
    pub brain_key: Option<PathBuf>,
    /// The hosts the agent can reach, by the name plans and bindings use.
    pub hosts: BTreeMap<String, HostConfig>,
    /// Secrets the executor can hand out, by name: where each value is
    /// read from, at the moment of each operation.
    pub secrets: BTreeMap<String, SecretSource>,
}

/// How to reach one host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct HostConfig {
    /// Address or DNS name to connect to. Empty: the host's name. Its
    /// `known_hosts` entry is looked up under this (as `[address]:port`
    /// when the port is not 22), as `ssh-keyscan` writes it.
    pub address: String,
    /// SSH port.
    pub port: u16,
    /// The user to log in as.
    pub user: String,
    /// Trust the key the host offers the first time and pin it, when the
    /// host has no entry yet. Off by default: pin keys ahead with
    /// `ssh-keyscan`. A changed key is refused either way.
    pub trust_on_first_use: bool,
    /// Secrets handed to every operation on this host, and the only ones
    /// a request may ask for there.
    pub secrets: Vec<SecretGrant>,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            address: String::new(),
            port: 22,
            user: "nisse".into(),
            trust_on_first_use: false,
            secrets: Vec::new(),
        }
    }
}

/// A secret handed to operations on a host: through an environment
/// variable (the host's sshd must accept it: `AcceptEnv NAME`) or written
/// to the command's standard input first, followed by a newline. Never on
/// the command line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SecretGrant {
    /// The secret's name under `secrets`.
    pub name: String,
    /// The environment variable to set.
    #[serde(default)]
    pub env: Option<String>,
    /// Write it to standard input instead.
    #[serde(default)]
    pub stdin: bool,
}

/// Where a secret's value is read from (on the executor's machine), at
/// each operation; surrounding whitespace is dropped and an empty value
/// refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SecretSource {
    /// A file holding the value.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// An environment variable of the executor's process.
    #[serde(default)]
    pub env: Option<String>,
}

impl SecretSource {
    /// The secret, when exactly one source is set (validation makes sure).
    pub fn secret(&self) -> Option<Secret> {
        match (&self.file, &self.env) {
            (Some(path), None) => Some(Secret::File(path.clone())),
            (None, Some(var)) => Some(Secret::Env(var.clone())),
            _ => None,
        }
    }
}

impl Config {
    /// Problems as (key under `prefix`, what is wrong); empty when valid.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (key, d) in [
            ("connect-timeout", self.connect_timeout),
            ("command-timeout", self.command_timeout),
            ("idle-timeout", self.idle_timeout),
            ("progress-interval", self.progress_interval),
            ("breaker-cooldown", self.breaker_cooldown),
            ("max-request-age", self.max_request_age),
        ] {
            if d.is_zero() {
                out.push((format!("{prefix}.{key}"), "must be longer than zero".into()));
            }
        }
        if self.output_cap.as_u64() < 64 {
            out.push((
                format!("{prefix}.output-cap"),
                "must be at least 64 B".into(),
            ));
        }
        if self.output_cap.as_u64() > 8 * 1024 * 1024 {
            out.push((
                format!("{prefix}.output-cap"),
                "must be at most 8 MiB (results travel on the bus)".into(),
            ));
        }
        for (key, n) in [
            ("max-in-flight", self.max_in_flight),
            (
                "max-channels-per-connection",
                self.max_channels_per_connection,
            ),
            ("breaker-failures", self.breaker_failures as usize),
        ] {
            if n == 0 {
                out.push((format!("{prefix}.{key}"), "must be at least 1".into()));
            }
        }
        for (agent, a) in &self.agents {
            let at = format!("{prefix}.agents.{agent}");
            for (name, s) in &a.secrets {
                if s.file.is_some() == s.env.is_some() {
                    out.push((
                        format!("{at}.secrets.{name}"),
                        "set exactly one of `file` and `env`".into(),
                    ));
                }
            }
            for (host, h) in &a.hosts {
                if h.user.trim().is_empty() {
                    out.push((
                        format!("{at}.hosts.{host}.user"),
                        "must not be empty".into(),
                    ));
                }
                if h.port == 0 {
                    out.push((format!("{at}.hosts.{host}.port"), "must not be 0".into()));
                }
                for (i, g) in h.secrets.iter().enumerate() {
                    let key = format!("{at}.hosts.{host}.secrets[{i}]");
                    if !a.secrets.contains_key(&g.name) {
                        out.push((
                            key.clone(),
                            format!("no secret `{}` is configured under {at}.secrets", g.name),
                        ));
                    }
                    if g.env.is_some() == g.stdin {
                        out.push((
                            key.clone(),
                            "set exactly one of `env` and `stdin = true`".into(),
                        ));
                    }
                    if let Some(env) = &g.env
                        && (env.is_empty()
                            || !env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                            || env.as_bytes()[0].is_ascii_digit())
                    {
                        out.push((key, format!("`{env}` is not an environment variable name")));
                    }
                }
            }
        }
        out
    }

    /// One agent's settings with default paths filled in under `data_dir`.
    pub fn agent(&self, agent: &str, data_dir: &Path) -> AgentSetup {
        let a = self.agents.get(agent).cloned().unwrap_or_default();
        let ssh = data_dir.join("agents").join(agent).join("ssh");
        AgentSetup {
            key_is_default: a.key_file.is_none(),
            key_file: a.key_file.unwrap_or_else(|| ssh.join("id_ed25519")),
            known_hosts: a.known_hosts.unwrap_or_else(|| ssh.join("known_hosts")),
            brain_key: a
                .brain_key
                .unwrap_or_else(|| nisse_bus::signing::key_files(data_dir, agent).1),
            hosts: a
                .hosts
                .into_iter()
                .map(|(name, mut h)| {
                    if h.address.is_empty() {
                        h.address = name.clone();
                    }
                    (name, h)
                })
                .collect(),
            secrets: a.secrets,
        }
    }
}

/// One agent's resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSetup {
    /// The private key file.
    pub key_file: PathBuf,
    /// Whether it is the default one, which is made on first use (a key
    /// the operator named is never made: a missing one is an error).
    pub key_is_default: bool,
    /// The known-hosts file.
    pub known_hosts: PathBuf,
    /// The brain's public signing key.
    pub brain_key: PathBuf,
    /// Reachable hosts, addresses filled in.
    pub hosts: BTreeMap<String, HostConfig>,
    /// Secret sources.
    pub secrets: BTreeMap<String, SecretSource>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_paths_are_per_agent() {
        let c = Config::default();
        assert!(c.validate("executor").is_empty());
        let a = c.agent("ops", Path::new("/d"));
        assert_eq!(a.key_file, Path::new("/d/agents/ops/ssh/id_ed25519"));
        assert_eq!(a.known_hosts, Path::new("/d/agents/ops/ssh/known_hosts"));
    }

    #[test]
    fn problems_name_their_key() {
        let mut c = Config::default();
        let mut a = AgentConfig::default();
        a.hosts.insert(
            "nas".into(),
            HostConfig {
                secrets: vec![SecretGrant {
                    name: "pg".into(),
                    env: Some("1BAD".into()),
                    stdin: false,
                }],
                ..HostConfig::default()
            },
        );
        c.agents.insert("ops".into(), a);
        let problems = c.validate("executor");
        let keys: Vec<&str> = problems.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["executor.agents.ops.hosts.nas.secrets[0]"; 2]);
        assert!(problems[0].1.contains("no secret `pg`"));
        assert!(problems[1].1.contains("`1BAD`"));
    }
}
