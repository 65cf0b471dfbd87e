use std::time::Duration;

/// Errors of the bus.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot work (a bad URL, a missing credentials
    /// file). Not retryable: fix the configuration.
    #[error("bus configuration: {0}")]
    Config(String),
    /// NATS could not be reached or the connection failed. Retryable: the
    /// client reconnects on its own, so the same call may succeed later.
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect {
        /// The server URL tried.
        url: String,
        /// What the client reported.
        reason: String,
    },
    /// A JetStream API call (stream or consumer management) failed.
    #[error("JetStream {action}: {reason}")]
    JetStream {
        /// What was being done, e.g. "create stream AGENT_OPS".
        action: String,
        /// What the server or client reported.
        reason: String,
    },
    /// A publish was not stored: no ack from JetStream in time, or an error.
    /// Retryable: publishing again with the same message id is a no-op if the
    /// first one was in fact stored.
    #[error("publish to {subject} not acknowledged: {reason}")]
    Publish {
        /// The subject published to.
        subject: String,
        /// What the client or server reported.
        reason: String,
    },
    /// A message handed to `publish` is not fit for the bus (no envelope, no
    /// message id, an invalid agent name). A bug in the caller.
    #[error("message cannot be published: {0}")]
    InvalidMessage(String),
    /// Acknowledging a delivery failed. The message will be redelivered after
    /// the ack wait, so handlers must be idempotent (they are, by design).
    #[error("ack {kind} for stream sequence {sequence} failed: {reason}")]
    Ack {
        /// Which acknowledgement ("ack", "nak", "term", "progress").
        kind: &'static str,
        /// The stream sequence of the message.
        sequence: u64,
        /// What the client reported.
        reason: String,
    },
    /// The consumer's message stream failed in a way the client does not
    /// recover from on its own (e.g. the consumer was deleted).
    #[error("consumer {consumer} on {stream}: {reason}")]
    Consume {
        /// The stream name.
        stream: String,
        /// The durable consumer name.
        consumer: String,
        /// What the client reported.
        reason: String,
    },
    /// A read of the stream (replay) failed.
    #[error("reading {stream}: {reason}")]
    Read {
        /// The stream name.
        stream: String,
        /// What went wrong.
        reason: String,
    },
    /// The server lacks streams, consumers or buckets a service relies
    /// on: nobody made the topology there. Not retryable: an admin runs
    /// `nisse bus init` (or `nisse up`) first.
    #[error(
        "the NATS server has no {missing}: its streams, consumers and buckets were never made there; run `nisse bus init` (as the admin identity) against it first"
    )]
    NotInitialised {
        /// What is missing, named.
        missing: String,
    },
    /// The embedded `nats-server` could not be started or stopped.
    #[error("embedded NATS server: {0}")]
    Embedded(String),
    /// A call did not finish within its time limit.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long it waited.
        after: Duration,
    },
}

/// Result with the bus's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
