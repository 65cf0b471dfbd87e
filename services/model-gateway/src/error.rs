//! The gateway's own errors. A model that fails is not one of them: that
//! is a `ModelError` in the response, which the caller acts on. These are
//! the cases where no response can be given now.

/// Why the gateway could not answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bus (the usage bucket, publishing): the request is retried
    /// later, since a call whose budget cannot be checked is not made.
    #[error(transparent)]
    Bus(#[from] nisse_bus::Error),
    /// The HTTP client could not be built (a TLS setup problem): the
    /// gateway cannot start.
    #[error("building the HTTP client: {0}")]
    Client(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
