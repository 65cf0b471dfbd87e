//! The service's configuration (`[vikunja]` in `nisse.toml`) and its
//! validation.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One Vikunja instance for one agent: where it is, who the agent is
/// there, where its secrets are, which projects it serves, and how the
/// webhook receiver and the poll behave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Vikunja's base URL (`https://tasks.example.org`, or with the
    /// sub-path Vikunja is served under); its API is under
    /// `<url>/api/v1`. Not set: nothing is connected, and the service
    /// idles.
    pub url: Option<String>,
    /// Where people open Vikunja in a browser, for the links to tasks
    /// (`<frontend-url>/tasks/<id>`). Not set: `url`.
    pub frontend_url: Option<String>,
    /// The agent whose stream Vikunja's events go to and whose API calls
    /// are made (`nisse.<agent>.in.vikunja`, `out.vikunja.req`).
    pub agent: String,
    /// The agent's own Vikunja username: the account its token is of.
    /// Events it caused (its own comments, its own status changes) are
    /// not taken again.
    pub account: String,
    /// A file holding the agent's API token (Vikunja: Settings → API
    /// Tokens, `tk_…`). Read at every call, so a rotated token takes
    /// effect at once; it never travels on the bus and is never logged.
    pub token_file: Option<PathBuf>,
    /// A file holding the webhook's secret (the "Secret" of the project's
    /// webhook). Read at every request; deliveries not signed with it are
    /// refused.
    pub webhook_secret_file: Option<PathBuf>,
    /// Address the webhook receiver listens on. Every delivery must carry
    /// Vikunja's signature, so another address than loopback is safe when
    /// Vikunja runs elsewhere.
    pub listen: SocketAddr,
    /// The projects served, by id (the number in the project's URL).
    /// Events and calls for tasks in any other project are refused.
    pub projects: Vec<i64>,
    /// How often the projects are read for what a lost webhook would have
    /// carried (tasks created or updated, assignments, comments and their
    /// edits). `0s` turns the poll off.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub poll_interval: Duration,
    /// Largest webhook body accepted; larger ones are answered 413.
    #[schemars(with = "String")]
    pub max_body: ByteSize,
    /// Longest one Vikunja API call may take, its retries included:
    /// transient failures (no answer, a 5xx, a 429) are tried again a few
    /// times, waiting with backoff or as long as `Retry-After` asks, and
    /// no attempt or wait runs past this; a call that still fails is
    /// answered FAILED with the status and the wait asked for.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub call_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            url: None,
            frontend_url: None,
            agent: "ops".into(),
            account: String::new(),
            token_file: None,
            webhook_secret_file: None,
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 9098)),
            projects: Vec::new(),
            poll_interval: Duration::from_secs(60),
            max_body: ByteSize::mib(4),
            call_timeout: Duration::from_secs(30),
        }
    }
}

/// What is wrong with `url` as the base URL of `what`, if anything.
fn url_problem(url: &str, what: &str) -> Option<String> {
    match reqwest::Url::parse(url) {
        Err(e) => Some(format!("`{url}` is not a URL: {e}")),
        Ok(u) if !matches!(u.scheme(), "http" | "https") => {
            Some(format!("`{url}` must be an http:// or https:// URL"))
        }
        Ok(u) if u.query().is_some() || u.fragment().is_some() => Some(format!(
            "`{url}` must be {what}, without a query or fragment"
        )),
        Ok(u) if !u.username().is_empty() || u.password().is_some() => {
            Some("must not hold credentials; the token is read from `token-file`".into())
        }
        Ok(_) => None,
    }
}

impl Config {
    /// Whether a Vikunja instance is configured: without a `url` the
    /// service has nothing to do and idles.
    pub fn enabled(&self) -> bool {
        self.url.is_some()
    }

    /// Whether tasks of `project` are served.
    pub fn served(&self, project: i64) -> bool {
        self.projects.contains(&project)
    }

    /// Where a browser opens Vikunja: `frontend-url`, else `url`, without
    /// a trailing slash.
    pub fn frontend(&self) -> String {
        self.frontend_url
            .as_deref()
            .or(self.url.as_deref())
            .unwrap_or_default()
            .trim_end_matches('/')
            .to_string()
    }

    /// The served projects as the reasons name them.
    pub(crate) fn projects_listed(&self) -> String {
        let ids: Vec<String> = self.projects.iter().map(i64::to_string).collect();
        ids.join(", ")
    }

    /// Checks what serde cannot. Each problem is a pair of the key (under
    /// `prefix`, e.g. `vikunja.url`) and what is wrong with it; empty
    /// means valid. Without a `url` only the form of what is set is
    /// checked: an unconfigured Vikunja is valid, and idles.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut bad = |key: &str, problem: String| out.push((format!("{prefix}.{key}"), problem));

        if let Err(e) = self.agent.parse::<nisse_bus::AgentName>() {
            bad("agent", e.to_string());
        }
        if let Some(url) = &self.url {
            if let Some(p) = url_problem(url, "Vikunja's base URL") {
                bad("url", p);
            }
            if self.account.trim().is_empty() {
                bad(
                    "account",
                    "must be the agent's Vikunja username (its own events are not taken again)"
                        .into(),
                );
            }
            if self.token_file.is_none() {
                bad(
                    "token-file",
                    "must name the file holding the agent's Vikunja API token".into(),
                );
            }
            if self.webhook_secret_file.is_none() {
                bad(
                    "webhook-secret-file",
                    "must name the file holding the webhook's secret (deliveries are refused unless signed with it)".into(),
                );
            }
            if self.projects.is_empty() {
                bad(
                    "projects",
                    "must list at least one project id to serve".into(),
                );
            }
        }
        if let Some(url) = &self.frontend_url
            && let Some(p) = url_problem(url, "where Vikunja's web interface is")
        {
            bad("frontend-url", p);
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
        let mut seen = Vec::new();
        for &project in &self.projects {
            if project <= 0 {
                bad(
                    "projects",
                    format!("`{project}` is not a project id (Vikunja's are positive)"),
                );
            } else if seen.contains(&project) {
                bad("projects", format!("`{project}` is listed twice"));
            } else {
                seen.push(project);
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
        cfg.validate("vikunja")
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    fn configured(dir: &tempfile::TempDir) -> Config {
        let token = dir.path().join("token");
        let secret = dir.path().join("secret");
        std::fs::write(&token, "tk_x\n").unwrap();
        std::fs::write(&secret, "s\n").unwrap();
        Config {
            url: Some("https://tasks.example.org".into()),
            account: "nisse".into(),
            token_file: Some(token),
            webhook_secret_file: Some(secret),
            projects: vec![3],
            ..Config::default()
        }
    }

    #[test]
    fn defaults_are_valid_idle_and_as_documented() {
        let cfg = Config::default();
        assert!(cfg.validate("vikunja").is_empty());
        assert!(!cfg.enabled());
        assert_eq!(cfg.agent, "ops");
        assert_eq!(cfg.listen.to_string(), "127.0.0.1:9098");
        assert_eq!(cfg.poll_interval, Duration::from_secs(60));
        assert_eq!(cfg.max_body, ByteSize::mib(4));
        assert_eq!(cfg.call_timeout, Duration::from_secs(30));
    }

    #[test]
    fn parses_kebab_case_toml_and_refuses_unknown_keys() {
        let cfg: Config = toml::from_str(
            r#"
            url = "https://tasks.example.org/"
            frontend-url = "https://tasks.example.org/app/"
            account = "nisse"
            token-file = "/run/secrets/vikunja-token"
            webhook-secret-file = "/run/secrets/vikunja-hook"
            listen = "0.0.0.0:9098"
            projects = [3, 7]
            poll-interval = "2m"
            max-body = "1 MiB"
            call-timeout = "10s"
            "#,
        )
        .unwrap();
        assert!(cfg.enabled());
        assert_eq!(cfg.poll_interval, Duration::from_secs(120));
        assert!(cfg.served(7) && !cfg.served(4));
        assert_eq!(cfg.frontend(), "https://tasks.example.org/app");
        let cfg = Config {
            frontend_url: None,
            ..cfg
        };
        assert_eq!(cfg.frontend(), "https://tasks.example.org");
        let err = toml::from_str::<Config>("project = [1]").unwrap_err();
        assert!(err.to_string().contains("project"), "{err}");
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
            "frontend-url",
            "agent",
            "account",
            "token-file",
            "webhook-secret-file",
            "listen",
            "projects",
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
    fn a_configured_vikunja_needs_account_secrets_and_projects() {
        let dir = tempfile::tempdir().unwrap();
        assert!(keys(&configured(&dir)).is_empty());
        let cfg = Config {
            url: Some("https://tasks.example.org".into()),
            ..Config::default()
        };
        assert_eq!(
            keys(&cfg),
            [
                "vikunja.account",
                "vikunja.token-file",
                "vikunja.webhook-secret-file",
                "vikunja.projects"
            ]
        );
    }

    #[test]
    fn refuses_bad_urls_files_projects_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        for url in [
            "tasks.example.org",
            "ftp://tasks.example.org",
            "https://tasks.example.org/?x=1",
            "https://u:p@tasks.example.org",
        ] {
            let mut cfg = configured(&dir);
            cfg.url = Some(url.into());
            assert_eq!(keys(&cfg), ["vikunja.url"], "{url}");
            let mut cfg = configured(&dir);
            cfg.frontend_url = Some(url.into());
            assert_eq!(keys(&cfg), ["vikunja.frontend-url"], "{url}");
        }
        let mut cfg = configured(&dir);
        cfg.token_file = Some(dir.path().join("missing"));
        let problems = cfg.validate("vikunja");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].0, "vikunja.token-file");
        assert!(problems[0].1.contains("missing"), "{}", problems[0].1);

        let mut cfg = configured(&dir);
        cfg.projects = vec![3, 3, 0, -2];
        assert_eq!(keys(&cfg).len(), 3);

        let mut cfg = configured(&dir);
        cfg.agent = "Ops!".into();
        cfg.poll_interval = Duration::from_millis(500);
        cfg.max_body = ByteSize::b(10);
        cfg.call_timeout = Duration::ZERO;
        assert_eq!(
            keys(&cfg),
            [
                "vikunja.agent",
                "vikunja.poll-interval",
                "vikunja.max-body",
                "vikunja.call-timeout"
            ]
        );
        cfg.poll_interval = Duration::ZERO;
        assert!(!keys(&cfg).contains(&"vikunja.poll-interval".to_string()));
    }
}
