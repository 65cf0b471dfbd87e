//! The mcp service's settings (`[mcp]` in `nisse.toml`): its MCP server
//! instances (`[[mcp.instance]]`), each for one agent and one (service,
//! site, privilege), reached over stdio (a process started from a command
//! the configuration fixes, never one a model chose) or streamable HTTP;
//! and what every instance shares: connecting, the circuit breaker, how
//! old a request may be.
//!
//! ```toml
//! [[mcp.instance]]
//! name = "hv-site-a-ro"
//! service = "hv"
//! site = "site-a"
//! privilege = "read-only"
//! command = ["/usr/local/bin/hv-mcp", "--site", "a"]
//! env = { HV_URL = "https://hv.site-a.lan" }
//! secret-env = { HV_TOKEN = "/run/secrets/hv-site-a-ro" }
//!
//! [[mcp.instance]]
//! name = "hv-site-a-elevated"
//! service = "hv"
//! site = "site-a"
//! privilege = "elevated"
//! url = "https://hv-mcp.site-a.lan/mcp"
//! token-file = "/run/secrets/hv-site-a-elevated"
//! call-timeout = "5m"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use nisse_bus::Backoff;

/// The longest instance name: it is a key token on the bus and part of
/// the name the model calls a tool by (`<instance>` and the tool's own
/// name together, which model APIs cap at 64 characters).
pub const NAME_MAX: usize = 40;

/// The mcp service's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// The MCP server instances, one `[[mcp.instance]]` each.
    #[serde(rename = "instance")]
    pub instances: Vec<InstanceConfig>,
    /// How long starting or reaching a server, its `initialize` and its
    /// first tool list may take.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub connect_timeout: Duration,
    /// The first wait before trying an instance that cannot be reached
    /// again; it doubles up to `reconnect-backoff-max`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub reconnect_backoff: Duration,
    /// The longest wait between tries to reach an instance.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub reconnect_backoff_max: Duration,
    /// Calls handled at once, per agent; further ones wait their turn,
    /// kept alive meanwhile.
    pub max_in_flight: usize,
    /// Consecutive failures to reach an instance that open its circuit.
    pub breaker_failures: u32,
    /// Failures further apart than this do not add up.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub breaker_window: Duration,
    /// How long an open circuit fails calls at once.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub breaker_cooldown: Duration,
    /// The oldest a call may be when it arrives (its signed creation
    /// time): an older one is refused, so a signed call replayed after its
    /// record expired (30 days) is never made again.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub max_request_age: Duration,
    /// The public key of each agent's brain, which signs every call and
    /// mount (read at each call). Default:
    /// `<data-dir>/agents/<agent>/brain/signing.pub`, which the brain
    /// writes when it first starts.
    pub brain_keys: BTreeMap<String, PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            instances: Vec::new(),
            connect_timeout: Duration::from_secs(30),
            reconnect_backoff: Duration::from_secs(1),
            reconnect_backoff_max: Duration::from_secs(60),
            max_in_flight: 8,
            breaker_failures: 3,
            breaker_window: Duration::from_secs(60),
            breaker_cooldown: Duration::from_secs(30),
            max_request_age: Duration::from_secs(7 * 24 * 3600),
            brain_keys: BTreeMap::new(),
        }
    }
}

/// What an instance's credentials may do, as the operator declares it
/// (the policy file says the same of it, per tool).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Privilege {
    /// Credentials that can only read: mounted by default, callable while
    /// autonomy is off.
    ReadOnly,
    /// Credentials that can change things: mounted only under an approved
    /// plan, and refused while autonomy is off unless the operator
    /// confirmed the very call.
    Elevated,
}

impl Privilege {
    /// The name the configuration uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::Elevated => "elevated",
        }
    }
}

impl<'de> Deserialize<'de> for Privilege {
    /// By name, refusing any other with the two there are (serde's own
    /// message names neither).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        match name.as_str() {
            "read-only" => Ok(Self::ReadOnly),
            "elevated" => Ok(Self::Elevated),
            other => Err(serde::de::Error::custom(format!(
                "`{other}` is not a privilege: `read-only` or `elevated`"
            ))),
        }
    }
}

/// One MCP server instance: one agent's, for one service at one site
/// with one privilege. Exactly one transport: `command` (stdio) or `url`
/// (streamable HTTP).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct InstanceConfig {
    /// The instance's name, as the policy and plans name it
    /// (`hv-site-a-elevated`): lowercase letters, digits and single `-`,
    /// holding its site, so a wrong-site action needs a tool that is not
    /// mounted.
    pub name: String,
    /// The agent whose instance it is.
    #[serde(default = "default_agent")]
    pub agent: String,
    /// The service it reaches (`hv`, `unifi`, `gitea`).
    pub service: String,
    /// The site it reaches (`site-a`); part of the name.
    pub site: String,
    /// `read-only` or `elevated`: what its credentials may do.
    pub privilege: Privilege,
    /// stdio: the program and its arguments, started with a clean
    /// environment holding only `env` and `secret-env` (set `PATH` there
    /// if the program needs one). A program without a `/` is looked up on
    /// the service's own `PATH`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// stdio: environment variables given to the process.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// stdio: environment variables whose values are read from these
    /// files at each start, given only to this process and redacted from
    /// everything it returns.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secret_env: BTreeMap<String, PathBuf>,
    /// Streamable HTTP: the server's endpoint (`https://…/mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Streamable HTTP: a file holding the bearer token, read at every
    /// connect, sent as `Authorization: Bearer` and redacted from
    /// everything the server returns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The longest a call may take (a request may ask for less); one that
    /// outruns it is abandoned as TIMEOUT, and may still take effect.
    #[serde(default = "default_call_timeout", with = "humantime_serde")]
    #[schemars(with = "String")]
    pub call_timeout: Duration,
    /// The most of a call's content (and of its structured content) kept:
    /// half from the start, half from the end; the middle is counted.
    #[serde(default = "default_max_output")]
    #[schemars(with = "String")]
    pub max_output: ByteSize,
    /// The work items whose tool profile holds the instance (seed X3:
    /// per-task tool profiles mount only what an item's scope needs), as
    /// glob patterns over an item's scope (an alert's host, the hosts an
    /// operator named): `["pve-a*", "nas*"]`. An item with no scope (the
    /// operator's words alone) gets every instance. Elevated instances
    /// are mounted only under an approved plan whatever this says.
    #[serde(default = "all_scopes")]
    pub scopes: Vec<String>,
}

fn all_scopes() -> Vec<String> {
    vec!["*".into()]
}

fn default_agent() -> String {
    "ops".into()
}

fn default_call_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_max_output() -> ByteSize {
    ByteSize::kib(64)
}

/// How an instance is reached, resolved from its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A process this service starts, spoken to over its stdin and stdout.
    Stdio {
        /// The program and its arguments.
        command: Vec<String>,
        /// Plain environment variables.
        env: BTreeMap<String, String>,
        /// Variables read from files at each start.
        secret_env: BTreeMap<String, PathBuf>,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// The endpoint.
        url: String,
        /// The bearer token's file, if the server wants one.
        token_file: Option<PathBuf>,
    },
}

impl InstanceConfig {
    /// Its transport (validation makes sure there is exactly one).
    pub fn transport(&self) -> Transport {
        match &self.url {
            Some(url) => Transport::Http {
                url: url.clone(),
                token_file: self.token_file.clone(),
            },
            None => Transport::Stdio {
                command: self.command.clone(),
                env: self.env.clone(),
                secret_env: self.secret_env.clone(),
            },
        }
    }
}

/// Why `name` cannot name an instance, if it cannot.
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".into());
    }
    if name.len() > NAME_MAX {
        return Some(format!(
            "`{name}` is longer than {NAME_MAX} characters (it is part of the tools' names)"
        ));
    }
    let plain = name.split('-').all(|part| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    });
    if !plain {
        return Some(format!(
            "`{name}` is not a name: lowercase letters and digits, in parts joined by single `-`"
        ));
    }
    None
}

fn env_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
}

impl Config {
    /// Problems as (key under `prefix`, what is wrong); empty when valid.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (key, d) in [
            ("connect-timeout", self.connect_timeout),
            ("reconnect-backoff", self.reconnect_backoff),
            ("reconnect-backoff-max", self.reconnect_backoff_max),
            ("breaker-cooldown", self.breaker_cooldown),
            ("max-request-age", self.max_request_age),
        ] {
            if d.is_zero() {
                out.push((format!("{prefix}.{key}"), "must be longer than zero".into()));
            }
        }
        for (key, n) in [
            ("max-in-flight", self.max_in_flight),
            ("breaker-failures", self.breaker_failures as usize),
        ] {
            if n == 0 {
                out.push((format!("{prefix}.{key}"), "must be at least 1".into()));
            }
        }
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, inst) in self.instances.iter().enumerate() {
            let at = format!("{prefix}.instance[{i}]");
            if let Some(problem) = name_problem(&inst.name) {
                out.push((format!("{at}.name"), problem));
            } else if let Some(first) = seen.insert(&inst.name, i) {
                out.push((
                    format!("{at}.name"),
                    format!(
                        "`{}` is already the name of {prefix}.instance[{first}]",
                        inst.name
                    ),
                ));
                seen.insert(&inst.name, first);
            }
            if inst.agent.parse::<nisse_bus::AgentName>().is_err() {
                out.push((
                    format!("{at}.agent"),
                    format!("`{}` is not an agent's name", inst.agent),
                ));
            }
            for (key, value) in [("service", &inst.service), ("site", &inst.site)] {
                if let Some(problem) = name_problem(value) {
                    out.push((format!("{at}.{key}"), problem));
                }
            }
            if name_problem(&inst.site).is_none()
                && name_problem(&inst.name).is_none()
                && !format!("-{}-", inst.name).contains(&format!("-{}-", inst.site))
            {
                out.push((
                    format!("{at}.name"),
                    format!(
                        "`{}` does not name its site `{}`: the site is part of an instance's name, so a tool of another site is another tool",
                        inst.name, inst.site
                    ),
                ));
            }
            let stdio =
                !inst.command.is_empty() || !inst.env.is_empty() || !inst.secret_env.is_empty();
            let http = inst.url.is_some() || inst.token_file.is_some();
            match (stdio, http) {
                (true, true) => out.push((
                    at.clone(),
                    "set either `command` (stdio, with `env` and `secret-env`) or `url` (streamable HTTP, with `token-file`), not both".into(),
                )),
                (false, false) => out.push((
                    at.clone(),
                    "set how it is reached: `command` (stdio) or `url` (streamable HTTP)".into(),
                )),
                (true, false) => {
                    if inst.command.first().is_none_or(|p| p.trim().is_empty()) {
                        out.push((
                            format!("{at}.command"),
                            "must name the program to start (`[\"program\", \"arg\", …]`)".into(),
                        ));
                    }
                    for name in inst.env.keys().chain(inst.secret_env.keys()) {
                        if !env_name_ok(name) {
                            out.push((
                                format!("{at}.env"),
                                format!("`{name}` is not an environment variable name"),
                            ));
                        }
                    }
                    for name in inst.env.keys().filter(|k| inst.secret_env.contains_key(*k)) {
                        out.push((
                            format!("{at}.secret-env.{name}"),
                            format!("`{name}` is set in `env` too"),
                        ));
                    }
                }
                (false, true) => match &inst.url {
                    None => out.push((
                        format!("{at}.url"),
                        "`token-file` is set but not the `url` it is for".into(),
                    )),
                    Some(url) => match reqwest::Url::parse(url) {
                        Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                        Ok(u) => out.push((
                            format!("{at}.url"),
                            format!("`{url}` is not an http or https URL (it is {})", u.scheme()),
                        )),
                        Err(e) => {
                            out.push((format!("{at}.url"), format!("`{url}` is not a URL: {e}")));
                        }
                    },
                },
            }
            if inst.scopes.is_empty() {
                out.push((
                    format!("{at}.scopes"),
                    "is empty: no item would ever have the instance (leave it out for every item)"
                        .into(),
                ));
            }
            for pattern in &inst.scopes {
                if let Err(e) = glob::Pattern::new(pattern) {
                    out.push((
                        format!("{at}.scopes"),
                        format!("`{pattern}` is not a glob pattern: {}", e.msg),
                    ));
                }
            }
            if inst.call_timeout.is_zero() {
                out.push((
                    format!("{at}.call-timeout"),
                    "must be longer than zero".into(),
                ));
            }
            if inst.max_output.as_u64() < 64 {
                out.push((format!("{at}.max-output"), "must be at least 64 B".into()));
            }
            if inst.max_output.as_u64() > 4 * 1024 * 1024 {
                out.push((
                    format!("{at}.max-output"),
                    "must be at most 4 MiB (results travel on the bus, content and structured content both)".into(),
                ));
            }
        }
        out
    }

    /// Whether any instance is configured for `agent`.
    pub fn serves(&self, agent: &str) -> bool {
        self.instances.iter().any(|i| i.agent == agent)
    }

    /// The instances of `agent`.
    pub fn instances_of<'a>(
        &'a self,
        agent: &'a str,
    ) -> impl Iterator<Item = &'a InstanceConfig> + 'a {
        self.instances.iter().filter(move |i| i.agent == agent)
    }

    /// The public key file of `agent`'s brain.
    pub fn brain_key(&self, agent: &str, data_dir: &Path) -> PathBuf {
        self.brain_keys
            .get(agent)
            .cloned()
            .unwrap_or_else(|| nisse_bus::signing::key_files(data_dir, agent).1)
    }

    /// The waits between tries to reach an instance.
    pub fn reconnect(&self) -> Backoff {
        Backoff::new(self.reconnect_backoff, self.reconnect_backoff_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdio(name: &str, site: &str) -> InstanceConfig {
        InstanceConfig {
            name: name.into(),
            agent: "ops".into(),
            service: "hv".into(),
            site: site.into(),
            privilege: Privilege::ReadOnly,
            command: vec!["hv-mcp".into()],
            env: BTreeMap::new(),
            secret_env: BTreeMap::new(),
            url: None,
            token_file: None,
            call_timeout: default_call_timeout(),
            max_output: default_max_output(),
            scopes: all_scopes(),
        }
    }

    fn keys(c: &Config) -> Vec<String> {
        c.validate("mcp").into_iter().map(|(k, _)| k).collect()
    }

    #[test]
    fn defaults_and_a_plain_instance_are_valid() {
        assert!(Config::default().validate("mcp").is_empty());
        let c = Config {
            instances: vec![stdio("hv-site-a-ro", "site-a")],
            ..Config::default()
        };
        assert!(keys(&c).is_empty(), "{:?}", c.validate("mcp"));
        assert!(c.serves("ops") && !c.serves("dev"));
        assert_eq!(
            c.brain_key("ops", Path::new("/d")),
            Path::new("/d/agents/ops/brain/signing.pub")
        );
    }

    #[test]
    fn names_must_be_safe_unique_and_hold_their_site() {
        for bad in ["", "HV", "hv_a", "hv--a", "-hv", "hv.a", "hv a"] {
            assert!(name_problem(bad).is_some(), "{bad:?}");
        }
        assert!(name_problem(&"a".repeat(NAME_MAX + 1)).is_some());
        assert!(name_problem("hv-site-a-elevated").is_none());
        let c = Config {
            instances: vec![
                stdio("hv-site-a-ro", "site-a"),
                stdio("hv-site-a-ro", "site-a"),
                stdio("hv-site-b-ro", "site-a"),
                stdio("Hv", "site-a"),
            ],
            ..Config::default()
        };
        let problems = c.validate("mcp");
        let keys: Vec<&str> = problems.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "mcp.instance[1].name",
                "mcp.instance[2].name",
                "mcp.instance[3].name"
            ]
        );
        assert!(
            problems[0]
                .1
                .contains("already the name of mcp.instance[0]")
        );
        assert!(problems[1].1.contains("does not name its site `site-a`"));
    }

    #[test]
    fn exactly_one_transport_with_its_own_settings() {
        let mut both = stdio("hv-site-a-ro", "site-a");
        both.url = Some("https://hv.example.org/mcp".into());
        let mut neither = stdio("hv-site-a-rw", "site-a");
        neither.command.clear();
        let mut token_only = neither.clone();
        token_only.name = "hv-site-a-x".into();
        token_only.token_file = Some("/run/t".into());
        let mut bad_url = neither.clone();
        bad_url.name = "hv-site-a-y".into();
        bad_url.url = Some("ftp://hv".into());
        let mut bad_env = stdio("hv-site-a-z", "site-a");
        bad_env.env.insert("1X".into(), "v".into());
        bad_env.env.insert("TOKEN".into(), "v".into());
        bad_env.secret_env.insert("TOKEN".into(), "/run/t".into());
        let c = Config {
            instances: vec![both, neither, token_only, bad_url, bad_env],
            ..Config::default()
        };
        assert_eq!(
            keys(&c),
            [
                "mcp.instance[0]",
                "mcp.instance[1]",
                "mcp.instance[2].url",
                "mcp.instance[3].url",
                "mcp.instance[4].env",
                "mcp.instance[4].secret-env.TOKEN",
            ]
        );
        let mut http = stdio("hv-site-a-ro", "site-a");
        http.command.clear();
        http.url = Some("http://127.0.0.1:9/mcp".into());
        http.token_file = Some("/run/t".into());
        assert_eq!(
            http.transport(),
            Transport::Http {
                url: "http://127.0.0.1:9/mcp".into(),
                token_file: Some("/run/t".into())
            }
        );
    }

    #[test]
    fn the_documented_example_parses() {
        let text = include_str!("config.rs")
            .split("//! ```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("//! ```").next())
            .unwrap()
            .lines()
            .map(|l| {
                l.strip_prefix("//! ")
                    .unwrap_or(l.trim_start_matches("//!"))
            })
            .collect::<Vec<_>>()
            .join("\n");
        #[derive(Deserialize)]
        struct Doc {
            mcp: Config,
        }
        let doc: Doc = toml::from_str(&text).unwrap();
        assert!(doc.mcp.validate("mcp").is_empty());
        assert_eq!(doc.mcp.instances[1].privilege, Privilege::Elevated);
        assert_eq!(doc.mcp.instances[1].call_timeout, Duration::from_secs(300));
    }
}
