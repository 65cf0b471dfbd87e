//! The service's configuration (`[intake-alerts]` in `nisse.toml`) and its
//! validation.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use nisse_bus::secret::SecretString;

/// The Alertmanager webhook receiver: where it listens, which agent's stream
/// the alerts go to, how callers authenticate and how much one request may
/// carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Address to listen on. A non-loopback address is refused with
    /// `auth.allow-unauthenticated`: anyone who can reach an open receiver
    /// could inject alerts.
    pub listen: SocketAddr,
    /// The agent whose stream the alerts go to (`nisse.<agent>.in.alert`).
    pub agent: String,
    /// The credentials Alertmanager must send (its webhook `http_config`).
    /// None configured: a bearer token is generated on first start into
    /// `<data-dir>/credentials/alertmanager-webhook.token` and required.
    pub auth: AuthConfig,
    /// Largest request body accepted; larger ones are answered 413.
    #[schemars(with = "String")]
    pub max_body: ByteSize,
    /// Largest size the alerts of one request may take once each becomes
    /// its own message with the group's labels and annotations copied in
    /// (their text plus a fixed overhead per label and per message).
    /// Computed before any message is built; a request over it is
    /// answered 413.
    #[schemars(with = "String")]
    pub max_expanded: ByteSize,
    /// Most alerts accepted in one request; more are answered 413 (set
    /// Alertmanager's `max_alerts` at or below this).
    pub max_alerts: usize,
    /// Longest wait for JetStream to store all of a request's alerts. When
    /// it passes, the request is answered 503 and Alertmanager retries.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub publish_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 9095)),
            agent: "ops".into(),
            auth: AuthConfig::default(),
            max_body: ByteSize::mib(16),
            max_expanded: ByteSize::mib(64),
            max_alerts: 10_000,
            publish_timeout: Duration::from_secs(10),
        }
    }
}

/// Credentials required of callers, mirroring what Alertmanager's webhook
/// `http_config` sends: a bearer token or basic auth, not both. With none
/// configured the receiver generates a bearer token of its own, unless
/// `allow-unauthenticated` says to take anyone's posts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Bearer token (Alertmanager: `authorization: {type: Bearer,
    /// credentials: ...}`).
    pub bearer_token: Option<SecretString>,
    /// A file holding the bearer token (Alertmanager: `authorization:
    /// {credentials_file: ...}`); surrounding whitespace is ignored.
    pub bearer_token_file: Option<PathBuf>,
    /// Basic auth (Alertmanager: `basic_auth`).
    pub basic: Option<BasicAuth>,
    /// Accept posts without any credentials. Only on a loopback `listen`
    /// address, and not together with credentials: any local process can
    /// then inject alerts into the agent's stream.
    pub allow_unauthenticated: bool,
}

/// Basic-auth credentials: a user name and a password, given inline or in a
/// file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct BasicAuth {
    /// The user name.
    pub username: String,
    /// The password; set this or `password-file`.
    pub password: Option<SecretString>,
    /// A file holding the password; surrounding whitespace is ignored.
    pub password_file: Option<PathBuf>,
}

impl AuthConfig {
    /// Whether any credentials are configured (without any, a token is
    /// generated, or posts are open when `allow-unauthenticated`).
    pub fn is_configured(&self) -> bool {
        self.bearer_token.is_some() || self.bearer_token_file.is_some() || self.basic.is_some()
    }
}

impl Config {
    /// Checks what serde cannot: combinations, ranges, files. Each problem
    /// is a pair of the key (under `prefix`, e.g. `intake-alerts.listen`)
    /// and what is wrong with it; empty means valid.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut bad = |key: &str, problem: String| out.push((format!("{prefix}.{key}"), problem));

        if let Err(e) = self.agent.parse::<nisse_bus::AgentName>() {
            bad("agent", e.to_string());
        }
        let auth = &self.auth;
        if auth.allow_unauthenticated {
            if auth.is_configured() {
                bad(
                    "auth.allow-unauthenticated",
                    "set credentials or `allow-unauthenticated`, not both".into(),
                );
            } else if !self.listen.ip().is_loopback() {
                bad(
                    "auth.allow-unauthenticated",
                    format!(
                        "is only allowed on a loopback address, and `listen` is {}: remove it (a token is then generated and required) or listen on 127.0.0.1",
                        self.listen
                    ),
                );
            }
        }
        let bearer = auth.bearer_token.is_some() || auth.bearer_token_file.is_some();
        if bearer && auth.basic.is_some() {
            bad(
                "auth.basic",
                "set either a bearer token or basic auth, not both".into(),
            );
        }
        if auth.bearer_token.is_some() && auth.bearer_token_file.is_some() {
            bad(
                "auth.bearer-token",
                "set `bearer-token` or `bearer-token-file`, not both".into(),
            );
        }
        if auth
            .bearer_token
            .as_ref()
            .is_some_and(SecretString::is_empty)
        {
            bad("auth.bearer-token", "must not be empty".into());
        }
        if let Some(basic) = &auth.basic {
            if basic.username.is_empty() {
                bad("auth.basic.username", "must not be empty".into());
            }
            match (&basic.password, &basic.password_file) {
                (None, None) => bad(
                    "auth.basic.password",
                    "set `password` or `password-file`".into(),
                ),
                (Some(_), Some(_)) => bad(
                    "auth.basic.password",
                    "set `password` or `password-file`, not both".into(),
                ),
                (Some(p), None) if p.is_empty() => {
                    bad("auth.basic.password", "must not be empty".into());
                }
                _ => {}
            }
        }
        for (key, path) in [
            ("auth.bearer-token-file", auth.bearer_token_file.as_ref()),
            (
                "auth.basic.password-file",
                auth.basic.as_ref().and_then(|b| b.password_file.as_ref()),
            ),
        ] {
            if let Some(p) = path
                && !p.is_file()
            {
                bad(key, format!("file `{}` does not exist", p.display()));
            }
        }

        if self.max_alerts == 0 {
            bad("max-alerts", "must be at least 1".into());
        }
        if self.max_body.as_u64() < 1024 {
            bad("max-body", "must be at least 1 KiB".into());
        }
        if usize::try_from(self.max_body.as_u64()).is_err() {
            bad("max-body", "is larger than this machine can address".into());
        }
        if self.max_expanded.as_u64() < 1024 {
            bad("max-expanded", "must be at least 1 KiB".into());
        }
        if self.publish_timeout.is_zero() {
            bad("publish-timeout", "must be longer than zero".into());
        }
        out
    }

    /// The same configuration with secret values replaced by `<redacted>`,
    /// for showing it (`nisse config check`). Paths of secret files are not
    /// secrets and stay.
    pub fn redacted(&self) -> Self {
        let mut shown = self.clone();
        if let Some(token) = &mut shown.auth.bearer_token {
            *token = SecretString::masked();
        }
        if let Some(password) = shown.auth.basic.as_mut().and_then(|b| b.password.as_mut()) {
            *password = SecretString::masked();
        }
        shown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(cfg: &Config) -> Vec<String> {
        cfg.validate("intake-alerts")
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    fn basic(password: Option<&str>, password_file: Option<PathBuf>) -> BasicAuth {
        BasicAuth {
            username: "am".into(),
            password: password.map(SecretString::from),
            password_file,
        }
    }

    #[test]
    fn defaults_are_valid_and_as_documented() {
        let cfg = Config::default();
        assert!(cfg.validate("intake-alerts").is_empty());
        assert_eq!(cfg.listen.to_string(), "127.0.0.1:9095");
        assert_eq!(cfg.agent, "ops");
        assert_eq!(cfg.max_body, ByteSize::mib(16));
        assert_eq!(cfg.max_expanded, ByteSize::mib(64));
        assert_eq!(cfg.max_alerts, 10_000);
        assert_eq!(cfg.publish_timeout, Duration::from_secs(10));
        // No credentials configured and posts not open: a token is
        // generated and required.
        assert!(!cfg.auth.is_configured());
        assert!(!cfg.auth.allow_unauthenticated);
    }

    #[test]
    fn parses_kebab_case_toml_and_refuses_unknown_keys() {
        let cfg: Config = toml::from_str(
            r#"
            listen = "0.0.0.0:9200"
            agent = "dev"
            max-body = "2 MiB"
            max-expanded = "32 MiB"
            publish-timeout = "3s"
            [auth]
            bearer-token = "s3cret"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.listen.to_string(), "0.0.0.0:9200");
        assert_eq!(cfg.max_body, ByteSize::mib(2));
        assert_eq!(cfg.max_expanded, ByteSize::mib(32));
        assert_eq!(cfg.publish_timeout, Duration::from_secs(3));
        assert_eq!(
            cfg.auth.bearer_token.as_ref().map(SecretString::expose),
            Some("s3cret")
        );
        assert!(cfg.validate("intake-alerts").is_empty());

        let err = toml::from_str::<Config>("listn = \"127.0.0.1:1\"").unwrap_err();
        assert!(err.to_string().contains("listn"), "{err}");
    }

    #[test]
    fn round_trips_through_toml_and_documents_every_key() {
        let mut cfg = Config::default();
        cfg.auth.basic = Some(basic(Some("pw"), None));
        let text = toml::to_string(&cfg).unwrap();
        assert!(text.contains("max-body = \"16.0 MiB\""), "{text}");
        assert_eq!(toml::from_str::<Config>(&text).unwrap(), cfg);

        // `nisse config check` shows each key under its doc comment.
        let schema = serde_json::to_value(schemars::schema_for!(Config)).unwrap();
        for key in [
            "listen",
            "agent",
            "auth",
            "max-body",
            "max-expanded",
            "max-alerts",
            "publish-timeout",
        ] {
            assert!(
                schema["properties"][key]["description"].is_string(),
                "{key}: {schema}"
            );
        }
        let auth = &schema["$defs"]["AuthConfig"]["properties"];
        for key in [
            "bearer-token",
            "bearer-token-file",
            "basic",
            "allow-unauthenticated",
        ] {
            assert!(auth[key]["description"].is_string(), "auth.{key}: {schema}");
        }
    }

    #[test]
    fn rejects_both_bearer_and_basic() {
        let mut cfg = Config::default();
        cfg.auth.bearer_token = Some("t".into());
        cfg.auth.basic = Some(basic(Some("p"), None));
        assert_eq!(keys(&cfg), ["intake-alerts.auth.basic"]);
    }

    #[test]
    fn rejects_token_and_token_file_together() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut cfg = Config::default();
        cfg.auth.bearer_token = Some("t".into());
        cfg.auth.bearer_token_file = Some(file.path().into());
        assert_eq!(keys(&cfg), ["intake-alerts.auth.bearer-token"]);
    }

    #[test]
    fn basic_needs_exactly_one_password_source() {
        let file = tempfile::NamedTempFile::new().unwrap();
        for b in [
            basic(None, None),
            basic(Some("p"), Some(file.path().into())),
        ] {
            let mut cfg = Config::default();
            cfg.auth.basic = Some(b);
            assert_eq!(keys(&cfg), ["intake-alerts.auth.basic.password"]);
        }
        let mut cfg = Config::default();
        cfg.auth.basic = Some(basic(None, Some(file.path().into())));
        assert!(keys(&cfg).is_empty());
    }

    #[test]
    fn rejects_empty_secrets() {
        let mut cfg = Config::default();
        cfg.auth.bearer_token = Some(SecretString::from(""));
        assert_eq!(keys(&cfg), ["intake-alerts.auth.bearer-token"]);

        let mut cfg = Config::default();
        let mut b = basic(Some(""), None);
        b.username = String::new();
        cfg.auth.basic = Some(b);
        assert_eq!(
            keys(&cfg),
            [
                "intake-alerts.auth.basic.username",
                "intake-alerts.auth.basic.password"
            ]
        );
    }

    #[test]
    fn rejects_missing_secret_files() {
        let mut cfg = Config::default();
        cfg.auth.bearer_token_file = Some("/nonexistent/nisse-token".into());
        let problems = cfg.validate("intake-alerts");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].0, "intake-alerts.auth.bearer-token-file");
        assert!(problems[0].1.contains("/nonexistent/nisse-token"));

        let mut cfg = Config::default();
        cfg.auth.basic = Some(basic(None, Some("/nonexistent/pw".into())));
        assert_eq!(keys(&cfg), ["intake-alerts.auth.basic.password-file"]);
    }

    #[test]
    fn rejects_bad_limits_and_agent() {
        let cfg = Config {
            agent: "Ops!".into(),
            max_alerts: 0,
            max_body: ByteSize::b(1023),
            max_expanded: ByteSize::b(1023),
            publish_timeout: Duration::ZERO,
            ..Config::default()
        };
        assert_eq!(
            keys(&cfg),
            [
                "intake-alerts.agent",
                "intake-alerts.max-alerts",
                "intake-alerts.max-body",
                "intake-alerts.max-expanded",
                "intake-alerts.publish-timeout"
            ]
        );
    }

    #[test]
    fn unauthenticated_posts_are_allowed_on_loopback_only_and_without_credentials() {
        let mut cfg = Config::default();
        cfg.auth.allow_unauthenticated = true;
        assert!(cfg.validate("x").is_empty());

        cfg.listen = "0.0.0.0:9095".parse().unwrap();
        let problems = cfg.validate("x");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].0, "x.auth.allow-unauthenticated");
        assert!(problems[0].1.contains("0.0.0.0:9095"), "{}", problems[0].1);

        // Beyond loopback with the generated token or configured
        // credentials is fine.
        cfg.auth.allow_unauthenticated = false;
        assert!(cfg.validate("x").is_empty());
        cfg.auth.bearer_token = Some("t".into());
        assert!(cfg.validate("x").is_empty());

        // Credentials and open posts contradict each other.
        cfg.listen = "127.0.0.1:9095".parse().unwrap();
        cfg.auth.allow_unauthenticated = true;
        assert_eq!(keys(&cfg), ["intake-alerts.auth.allow-unauthenticated"]);
    }

    #[test]
    fn redacted_hides_secret_values_only() {
        let mut cfg = Config::default();
        cfg.auth.bearer_token = Some("s3cret".into());
        cfg.auth.basic = Some(BasicAuth {
            username: "am".into(),
            password: Some("pw".into()),
            password_file: Some("/etc/pw".into()),
        });
        let shown = cfg.redacted();
        assert_eq!(
            shown.auth.bearer_token.as_ref().map(SecretString::expose),
            Some("<redacted>")
        );
        let b = shown.auth.basic.unwrap();
        assert_eq!(b.username, "am");
        assert_eq!(
            b.password.as_ref().map(SecretString::expose),
            Some("<redacted>")
        );
        assert_eq!(b.password_file, Some(PathBuf::from("/etc/pw")));
        assert_eq!(Config::default().redacted(), Config::default());
    }
}
