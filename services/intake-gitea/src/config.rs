//! The service's configuration (`[gitea]` in `nisse.toml`) and its
//! validation.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One Gitea instance for one agent: where it is, who the agent is there,
/// where its secrets are, which repositories it serves, and how the
/// webhook receiver and the poll behave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Gitea's base URL (`https://git.example.org`, or with the sub-path
    /// Gitea is served under); its API is under `<url>/api/v1`. Not set:
    /// nothing is connected, and the service idles.
    pub url: Option<String>,
    /// The agent whose stream Gitea's events go to and whose API calls are
    /// made (`nisse.<agent>.in.gitea`, `out.gitea.req`).
    pub agent: String,
    /// The agent's own Gitea login: the account issues are assigned to and
    /// pull requests are opened by.
    pub account: String,
    /// A file holding the agent's API token (Gitea: Settings →
    /// Applications). Read at every call, so a rotated token takes effect
    /// at once; it never travels on the bus and is never logged.
    pub token_file: Option<PathBuf>,
    /// A file holding the webhook's secret (the "Secret" of the Gitea
    /// webhook). Read at every request; deliveries not signed with it are
    /// refused.
    pub webhook_secret_file: Option<PathBuf>,
    /// Address the webhook receiver listens on. Every delivery must carry
    /// Gitea's signature, so another address than loopback is safe when
    /// Gitea runs elsewhere.
    pub listen: SocketAddr,
    /// The repositories served, `owner/name`. Events and calls for any
    /// other repository are refused.
    pub repositories: Vec<String>,
    /// How often the repositories are read for what a lost webhook would
    /// have carried (issues, comments and their edits, pull requests'
    /// closes, merges, reopens, reviews and inline comments). `0s` turns
    /// the poll off.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub poll_interval: Duration,
    /// Largest webhook body accepted; larger ones are answered 413.
    #[schemars(with = "String")]
    pub max_body: ByteSize,
    /// Longest one Gitea API call may take, its retries included:
    /// transient failures (no answer, a 5xx, a 429) are tried again a few
    /// times, waiting with backoff or as long as Gitea's `Retry-After`
    /// asks, and no attempt or wait runs past this; a call that still
    /// fails is answered FAILED with the status and the wait asked for.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub call_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            url: None,
            agent: "dev".into(),
            account: String::new(),
            token_file: None,
            webhook_secret_file: None,
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 9097)),
            repositories: Vec::new(),
            poll_interval: Duration::from_secs(60),
            max_body: ByteSize::mib(4),
            call_timeout: Duration::from_secs(30),
        }
    }
}

/// Whether `repo` is an `owner/name` Gitea could hold: two non-empty parts
/// of letters, digits, `-`, `_` and `.`, neither `.` nor `..`.
pub(crate) fn is_repository(repo: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.len() <= 100
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    matches!(repo.split_once('/'), Some((owner, name)) if part(owner) && part(name))
}

impl Config {
    /// Whether a Gitea instance is configured: without a `url` the service
    /// has nothing to do and idles.
    pub fn enabled(&self) -> bool {
        self.url.is_some()
    }

    /// The configured spelling of `repo` when it is served (Gitea's names
    /// are not case-sensitive), else `None`.
    pub fn served(&self, repo: &str) -> Option<&str> {
        self.repositories
            .iter()
            .find(|r| r.eq_ignore_ascii_case(repo))
            .map(String::as_str)
    }

    /// Checks what serde cannot. Each problem is a pair of the key (under
    /// `prefix`, e.g. `gitea.url`) and what is wrong with it; empty means
    /// valid. Without a `url` only the form of what is set is checked: an
    /// unconfigured Gitea is valid, and idles.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut bad = |key: &str, problem: String| out.push((format!("{prefix}.{key}"), problem));

        if let Err(e) = self.agent.parse::<nisse_bus::AgentName>() {
            bad("agent", e.to_string());
        }
        if let Some(url) = &self.url {
            match reqwest::Url::parse(url) {
                Err(e) => bad("url", format!("`{url}` is not a URL: {e}")),
                Ok(u) if !matches!(u.scheme(), "http" | "https") => {
                    bad("url", format!("`{url}` must be an http:// or https:// URL"))
                }
                Ok(u) if u.query().is_some() || u.fragment().is_some() => bad(
                    "url",
                    format!("`{url}` must be Gitea's base URL, without a query or fragment"),
                ),
                Ok(u) if !u.username().is_empty() || u.password().is_some() => bad(
                    "url",
                    "must not hold credentials; the token is read from `token-file`".into(),
                ),
                Ok(_) => {}
            }
            if self.account.trim().is_empty() {
                bad(
                    "account",
                    "must be the agent's Gitea login (issues are assigned to it)".into(),
                );
            }
            if self.token_file.is_none() {
                bad(
                    "token-file",
                    "must name the file holding the agent's Gitea API token".into(),
                );
            }
            if self.webhook_secret_file.is_none() {
                bad(
                    "webhook-secret-file",
                    "must name the file holding the webhook's secret (deliveries are refused unless signed with it)".into(),
                );
            }
            if self.repositories.is_empty() {
                bad(
                    "repositories",
                    "must list at least one `owner/name` to serve".into(),
                );
            }
        }
        for (key, path) in [
            ("token-file", self.token_file.as_ref()),
            ("webhook-secret-file", self.webhook_secret_file.as_ref()),
        ] {
            if let Some(p) = path
                && !p.is_file()
            {
                bad(key, format!("file `{}` does not exist", p.display()));
            }
        }
        let mut seen: Vec<String> = Vec::new();
        for repo in &self.repositories {
            if !is_repository(repo) {
                bad(
                    "repositories",
                    format!("`{repo}` is not an `owner/name` repository"),
                );
            } else if seen.contains(&repo.to_ascii_lowercase()) {
                bad("repositories", format!("`{repo}` is listed twice"));
            } else {
                seen.push(repo.to_ascii_lowercase());
            }
        }
        if !self.poll_interval.is_zero() && self.poll_interval < Duration::from_secs(1) {
            bad(
                "poll-interval",
                "must be at least 1s, or 0s to turn the poll off".into(),
            );
        }
        if self.max_body.as_u64() < 1024 {
            bad("max-body", "must be at least 1 KiB".into());
        }
        if usize::try_from(self.max_body.as_u64()).is_err() {
            bad("max-body", "is larger than this machine can address".into());
        }
        if self.call_timeout.is_zero() {
            bad("call-timeout", "must be longer than zero".into());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(cfg: &Config) -> Vec<String> {
        cfg.validate("gitea").into_iter().map(|(k, _)| k).collect()
    }

    fn configured(dir: &tempfile::TempDir) -> Config {
        let token = dir.path().join("token");
        let secret = dir.path().join("secret");
        std::fs::write(&token, "t\n").unwrap();
        std::fs::write(&secret, "s\n").unwrap();
        Config {
            url: Some("https://git.example.org".into()),
            account: "nisse-dev".into(),
            token_file: Some(token),
            webhook_secret_file: Some(secret),
            repositories: vec!["alice/project".into()],
            ..Config::default()
        }
    }

    #[test]
    fn defaults_are_valid_idle_and_as_documented() {
        let cfg = Config::default();
        assert!(cfg.validate("gitea").is_empty());
        assert!(!cfg.enabled());
        assert_eq!(cfg.agent, "dev");
        assert_eq!(cfg.listen.to_string(), "127.0.0.1:9097");
        assert_eq!(cfg.poll_interval, Duration::from_secs(60));
        assert_eq!(cfg.max_body, ByteSize::mib(4));
        assert_eq!(cfg.call_timeout, Duration::from_secs(30));
    }

    #[test]
    fn parses_kebab_case_toml_and_refuses_unknown_keys() {
        let cfg: Config = toml::from_str(
            r#"
            url = "https://git.example.org/gitea"
            account = "nisse-dev"
            token-file = "/run/secrets/gitea-token"
            webhook-secret-file = "/run/secrets/gitea-hook"
            listen = "0.0.0.0:9097"
            repositories = ["alice/project", "ops/infra"]
            poll-interval = "2m"
            max-body = "1 MiB"
            call-timeout = "10s"
            "#,
        )
        .unwrap();
        assert!(cfg.enabled());
        assert_eq!(cfg.poll_interval, Duration::from_secs(120));
        assert_eq!(cfg.max_body, ByteSize::mib(1));
        assert_eq!(cfg.served("Alice/Project"), Some("alice/project"));
        assert_eq!(cfg.served("alice/other"), None);
        let err = toml::from_str::<Config>("repos = []").unwrap_err();
        assert!(err.to_string().contains("repos"), "{err}");
    }

    #[test]
    fn round_trips_and_documents_every_key() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = configured(&dir);
        let text = toml::to_string(&cfg).unwrap();
        assert_eq!(toml::from_str::<Config>(&text).unwrap(), cfg);
        let schema = serde_json::to_value(schemars::schema_for!(Config)).unwrap();
        for key in [
            "url",
            "agent",
            "account",
            "token-file",
            "webhook-secret-file",
            "listen",
            "repositories",
            "poll-interval",
            "max-body",
            "call-timeout",
        ] {
            assert!(
                schema["properties"][key]["description"].is_string(),
                "{key}: {schema}"
            );
        }
    }

    #[test]
    fn a_configured_gitea_needs_account_secrets_and_repositories() {
        let dir = tempfile::tempdir().unwrap();
        assert!(keys(&configured(&dir)).is_empty());
        let cfg = Config {
            url: Some("https://git.example.org".into()),
            ..Config::default()
        };
        assert_eq!(
            keys(&cfg),
            [
                "gitea.account",
                "gitea.token-file",
                "gitea.webhook-secret-file",
                "gitea.repositories"
            ]
        );
    }

    #[test]
    fn refuses_bad_urls_files_repositories_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        for url in [
            "git.example.org",
            "ftp://git.example.org",
            "https://git.example.org/?x=1",
            "https://u:p@git.example.org",
        ] {
            let mut cfg = configured(&dir);
            cfg.url = Some(url.into());
            assert_eq!(keys(&cfg), ["gitea.url"], "{url}");
        }
        let mut cfg = configured(&dir);
        cfg.token_file = Some(dir.path().join("missing"));
        let problems = cfg.validate("gitea");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].0, "gitea.token-file");
        assert!(problems[0].1.contains("missing"), "{}", problems[0].1);

        let mut cfg = configured(&dir);
        cfg.repositories = vec![
            "alice/project".into(),
            "Alice/Project".into(),
            "noslash".into(),
            "a/../b".into(),
            "a/..".into(),
        ];
        assert_eq!(keys(&cfg).len(), 4);

        let mut cfg = configured(&dir);
        cfg.agent = "Dev!".into();
        cfg.poll_interval = Duration::from_millis(500);
        cfg.max_body = ByteSize::b(10);
        cfg.call_timeout = Duration::ZERO;
        assert_eq!(
            keys(&cfg),
            [
                "gitea.agent",
                "gitea.poll-interval",
                "gitea.max-body",
                "gitea.call-timeout"
            ]
        );
        cfg.poll_interval = Duration::ZERO;
        assert!(!keys(&cfg).contains(&"gitea.poll-interval".to_string()));
    }
}
