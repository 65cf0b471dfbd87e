//! `[control]`: where the control plane listens.

use std::net::{Ipv4Addr, SocketAddr};

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
    /// Listening beyond loopback sends tokens over the network in the
    /// clear: refused unless this is set, for a listener behind a proxy
    /// that terminates TLS (a container network's reverse proxy).
    pub plaintext_beyond_loopback: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 9096)),
            plaintext_beyond_loopback: false,
        }
    }
}

impl Config {
    /// What is wrong with it, each as (key under `prefix`, why).
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !self.listen.ip().is_loopback() && !self.plaintext_beyond_loopback {
            out.push((
                format!("{prefix}.listen"),
                format!(
                    "`{}` is beyond loopback: operators' tokens would cross the network in the clear. Put a TLS-terminating proxy in front and set {prefix}.plaintext-beyond-loopback = true, or listen on loopback",
                    self.listen
                ),
            ));
        }
        out
    }
}
