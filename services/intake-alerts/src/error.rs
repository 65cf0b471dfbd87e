use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the receiver could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration fails validation; the message lists every problem
    /// with its key.
    #[error("invalid intake-alerts configuration: {0}")]
    Invalid(String),
    /// Unauthenticated posts allowed on a non-loopback address: anyone who
    /// could reach it could inject alerts into the agent's stream.
    #[error(
        "refusing to listen on {addr} without credentials: it is not a loopback address, so intake-alerts.auth.allow-unauthenticated is refused there (remove it and the receiver generates a token and requires it, or set intake-alerts.auth.bearer-token, .bearer-token-file or .basic and the same in Alertmanager's webhook http_config), or listen on 127.0.0.1"
    )]
    NoCredentials {
        /// The configured address.
        addr: SocketAddr,
    },
    /// A secret file could not be read or holds nothing.
    #[error("intake-alerts.auth: {0}")]
    Secret(#[from] nisse_bus::secret::SecretError),
    /// The token the receiver generates when no credentials are
    /// configured could not be made (the data directory is not writable).
    #[error("cannot make the webhook's bearer token {path}: {reason}")]
    Token {
        /// The token file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The configured agent is not one the bus handle serves, so nothing
    /// could be published for it.
    #[error(
        "intake-alerts.agent `{agent}` is not an agent this process serves (it serves: {served}); add it to `agents`"
    )]
    AgentNotServed {
        /// The configured agent.
        agent: String,
        /// The agents the bus serves, comma-separated.
        served: String,
    },
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The configured address.
        addr: SocketAddr,
        /// What the system said.
        source: std::io::Error,
    },
    /// The HTTP server failed while serving.
    #[error("serving HTTP on {addr}: {source}")]
    Serve {
        /// The address served.
        addr: SocketAddr,
        /// What failed.
        source: std::io::Error,
    },
}
