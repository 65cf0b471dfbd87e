//! The Matrix service's settings (`[matrix]` in `nisse.toml`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The Matrix service's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// The homeserver's client-server API base URL. Empty: the Matrix
    /// service is not configured, and does nothing.
    pub homeserver: String,
    /// How long one sync request waits for news on the server.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub sync_timeout: Duration,
    /// The longest wait between retries while the homeserver is away.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub backoff_max: Duration,
    /// How many times a message the homeserver refuses for good (an event
    /// over its size limit, a power level the agent lacks, content it will
    /// not take: any 4xx but a rate limit or the login) is sent before it
    /// is dead-lettered and a notice in its place says so. Rate limits,
    /// outages and the homeserver's own errors are waited out instead,
    /// however long they last.
    pub refused_attempts: u32,
    /// The largest attachment (file, image, video, sound) the service
    /// downloads to hash; a larger one, declared or received, is recorded
    /// by reference without a hash, saying why.
    #[schemars(with = "String")]
    pub attachment_max: ByteSize,
    /// The longest an attachment's download may take; one that takes
    /// longer is recorded without a hash, so a slow homeserver never
    /// holds up the room's messages for long.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub attachment_timeout: Duration,
    /// Per agent: its Matrix identity and room.
    pub agents: BTreeMap<String, AgentConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            homeserver: String::new(),
            sync_timeout: Duration::from_secs(30),
            backoff_max: Duration::from_secs(180),
            refused_attempts: 3,
            attachment_max: ByteSize::mib(25),
            attachment_timeout: Duration::from_secs(60),
            agents: BTreeMap::new(),
        }
    }
}

/// One agent's Matrix identity and room.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct AgentConfig {
    /// The agent's Matrix user id (`@nisse-ops:example.org`).
    pub user_id: String,
    /// A file holding an access token for it.
    pub access_token_file: Option<PathBuf>,
    /// A file holding its password (used to log in when there is no token
    /// and no saved session).
    pub password_file: Option<PathBuf>,
    /// The agent's room, by id (`!abc:example.org`) or alias
    /// (`#ops:example.org`). An alias that does not exist yet is created,
    /// with the `invite` users invited.
    pub room: String,
    /// Users invited when the room is created.
    pub invite: Vec<String>,
    /// Whether a room created here is encrypted.
    pub encrypted: bool,
    /// The device's display name.
    pub device_name: String,
}

impl Config {
    /// How the service waits for a homeserver that is away: from a quarter
    /// second, doubling up to `backoff-max`.
    pub fn backoff(&self) -> nisse_bus::Backoff {
        nisse_bus::Backoff::new(crate::FIRST_WAIT, self.backoff_max)
    }

    /// Whether anything is configured.
    pub fn enabled(&self) -> bool {
        !self.homeserver.trim().is_empty()
    }

    /// Problems as (key under `prefix`, what is wrong); empty when valid.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !self.enabled() {
            return out;
        }
        if !(self.homeserver.starts_with("http://") || self.homeserver.starts_with("https://")) {
            out.push((
                format!("{prefix}.homeserver"),
                format!("`{}` is not an http(s) URL", self.homeserver),
            ));
        }
        if self.sync_timeout.is_zero() || self.backoff_max.is_zero() {
            out.push((
                format!("{prefix}.sync-timeout"),
                "sync-timeout and backoff-max must be longer than zero".into(),
            ));
        }
        if self.refused_attempts == 0 {
            out.push((
                format!("{prefix}.refused-attempts"),
                "must be at least 1: a message is sent once before it can be refused".into(),
            ));
        }
        // The content is held in memory to hash it.
        if usize::try_from(self.attachment_max.as_u64()).is_err() {
            out.push((
                format!("{prefix}.attachment-max"),
                "is larger than this machine can address".into(),
            ));
        }
        if self.attachment_timeout.is_zero() {
            out.push((
                format!("{prefix}.attachment-timeout"),
                "must be longer than zero".into(),
            ));
        }
        for (agent, a) in &self.agents {
            let at = format!("{prefix}.agents.{agent}");
            if !(a.user_id.starts_with('@') && a.user_id.contains(':')) {
                out.push((
                    format!("{at}.user-id"),
                    "must be a Matrix user id, `@name:server`".into(),
                ));
            }
            if a.access_token_file.is_none() && a.password_file.is_none() {
                out.push((at.clone(), "set access-token-file or password-file".into()));
            }
            // Room ids of room version 12 have no server part.
            let id = a.room.len() > 1 && a.room.starts_with('!');
            let alias = a.room.starts_with('#') && a.room.contains(':');
            if !(id || alias) {
                out.push((
                    format!("{at}.room"),
                    "must be a room id (`!id`) or alias (`#name:server`)".into(),
                ));
            }
        }
        out
    }
}

/// Where an agent's Matrix state lives: its session and its encrypted
/// state and crypto store (one device per agent identity).
pub fn store_dir(data_dir: &Path, agent: &str) -> PathBuf {
    data_dir.join("agents").join(agent).join("matrix")
}

#[cfg(test)]
mod tests {

    use super::*;

    fn configured() -> Config {
        let agent = AgentConfig {
            user_id: "@nisse-ops:example.org".into(),
            password_file: Some("/run/secrets/pw".into()),
            room: "#ops:example.org".into(),
            ..Default::default()
        };
        Config {
            homeserver: "https://matrix.example.org".into(),
            agents: [("ops".to_string(), agent)].into_iter().collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_refused_message_is_tried_a_few_times_by_default_and_at_least_once() {
        let config = configured();
        assert_eq!(config.refused_attempts, 3);
        assert_eq!(config.validate("matrix"), Vec::<(String, String)>::new());
        let none = Config {
            refused_attempts: 0,
            ..config
        };
        let problems = none.validate("matrix");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "matrix.refused-attempts");
    }

    #[test]
    fn attachments_are_hashed_up_to_25_mib_within_a_minute_by_default() {
        let config = configured();
        assert_eq!(config.attachment_max, ByteSize::mib(25));
        assert_eq!(config.attachment_timeout, Duration::from_secs(60));
        let toml_text = "homeserver = \"https://m.example.org\"\nattachment-max = \"1 MiB\"\nattachment-timeout = \"5s\"\n";
        let parsed: Config = toml::from_str(toml_text).unwrap();
        assert_eq!(parsed.attachment_max, ByteSize::mib(1));
        assert_eq!(parsed.attachment_timeout, Duration::from_secs(5));
        let never = Config {
            attachment_timeout: Duration::ZERO,
            ..config
        };
        let problems = never.validate("matrix");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "matrix.attachment-timeout");
    }
}
