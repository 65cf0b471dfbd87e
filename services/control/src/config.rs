//! `[control]`: where the control plane listens.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The control service's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Address of the gRPC API and the web control room (one listener,
    /// HTTP/1.1 and HTTP/2). It serves only operators with a token
    /// (`control:<name>` on an allowlist); with none, it does not listen.
    pub listen: SocketAddr,
    /// Serve TLS with this certificate chain (PEM, leaf first): the
    /// gRPC API and the web room both, `nisse --control https://…`
    /// reaching it. Read at start; with `tls-key`.
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// Listening beyond loopback without TLS sends tokens over the
    /// network in the clear: refused unless this is set, for a listener
    /// behind a proxy that terminates TLS (a container network's reverse
    /// proxy).
    pub plaintext_beyond_loopback: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 9096)),
            tls_cert: None,
            tls_key: None,
            plaintext_beyond_loopback: false,
        }
    }
}

impl Config {
    /// What is wrong with it, each as (key under `prefix`, why).
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => out.push((
                format!("{prefix}.tls-key"),
                "missing: tls-cert is set, and a certificate needs its private key".into(),
            )),
            (None, Some(_)) => out.push((
                format!("{prefix}.tls-cert"),
                "missing: tls-key is set, and a key needs its certificate".into(),
            )),
            _ => {}
        }
        if !self.listen.ip().is_loopback() && !self.plaintext_beyond_loopback && !self.tls() {
            out.push((
                format!("{prefix}.listen"),
                format!(
                    "`{}` is beyond loopback: operators' tokens would cross the network in the clear. Set {prefix}.tls-cert and tls-key, or put a TLS-terminating proxy in front and set {prefix}.plaintext-beyond-loopback = true, or listen on loopback",
                    self.listen
                ),
            ));
        }
        out
    }

    /// Whether it serves TLS.
    pub fn tls(&self) -> bool {
        self.tls_cert.is_some() && self.tls_key.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(cfg: &Config) -> Vec<String> {
        cfg.validate("control")
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    #[test]
    fn beyond_loopback_needs_tls_or_a_proxy_and_a_certificate_needs_its_key() {
        let wide: SocketAddr = "0.0.0.0:9096".parse().unwrap();
        let mut cfg = Config {
            listen: wide,
            ..Config::default()
        };
        assert_eq!(keys(&cfg), ["control.listen"]);
        cfg.tls_cert = Some("cert.pem".into());
        assert_eq!(keys(&cfg), ["control.tls-key", "control.listen"]);
        cfg.tls_key = Some("key.pem".into());
        assert!(keys(&cfg).is_empty());
        cfg.tls_cert = None;
        assert_eq!(keys(&cfg), ["control.tls-cert", "control.listen"]);
        let proxied = Config {
            listen: wide,
            plaintext_beyond_loopback: true,
            ..Config::default()
        };
        assert!(keys(&proxied).is_empty());
        assert!(keys(&Config::default()).is_empty());
    }
}
