//! The Nisse bus: how services meet on NATS JetStream.
//!
//! It owns the topology (one stream per agent, `AGENT_<NAME>` over
//! `nisse.<agent>.>`, and one durable pull consumer per service), typed
//! publishing of the `nisse-proto` contracts with an envelope, a dedup id and
//! W3C trace headers, and typed consuming with explicit ack, nak-with-delay,
//! terminate and dead-lettering of anything that can never be processed.
//!
//! It also gives every service its shape: the one loop that takes a
//! service's messages ([`serve`]), what a service is started with
//! ([`service`]), the one backoff policy ([`Backoff`]), the one way a
//! secret is read ([`secret`]), versioned key-value records for the
//! services that keep durable state ([`Bus::kv_read`]), and what the
//! services that reach out to other systems share: a circuit breaker per
//! target ([`breaker`]), redaction of the secrets they hand out
//! ([`redact`]), capped output ([`capped`]), and the walls the services
//! that carry out the brain's requests hold: its signature ([`signing`])
//! and the classifier's verdict a request names ([`verdicts`]).
//!
//! It deliberately knows nothing of what the messages mean: brains and
//! services decide that. Subjects, consumers and buckets live only in
//! [`topology`], so there is one place to read the bus's shape.

pub mod auth;
mod backoff;
pub mod breaker;
mod bus;
mod config;
mod consume;
mod contract;
mod error;
mod kv;
mod lease;
pub mod once;
mod publish;
mod replay;
mod serve;
mod switches;

pub mod capped;
pub mod embedded;
pub mod redact;
pub mod secret;
pub mod service;
pub mod signing;
mod trace;
pub mod verdicts;

pub mod topology;

pub use backoff::{Backoff, Persist};
pub use bus::{Bus, install_tls_provider};
pub use config::{BusConfig, ConsumerTuning, Replicas, StreamLimits, TlsConfig};
pub use consume::{Consumer, Delivery, Disposition, Settled, Unhandled};
pub use contract::{AnyMessage, Contract, Decode, Rejection};
pub use error::{Error, Result};
pub use kv::{Versioned, key_hash, kv_key};
pub use lease::{BrainStatus, Lease};
pub use once::now_ms;
pub use publish::{PendingPublish, Published};
pub use replay::{RangeReader, StoredMessage, StreamBounds};
pub use serve::{Handler, Intake, serve};
pub use switches::{NeverEntry, SwitchBoard, SwitchState};
pub use topology::{
    AgentName, BRAIN_MAX_ACK_PENDING, ConsumerSpec, Direction, Filter, Publisher, Role,
    SubjectKind, TopologyChange, TopologyReport, dead_letter_subject,
};
pub use trace::HEADER_TYPE;

/// Re-exported so users of the bus name the same contract types.
pub use nisse_proto::v1 as proto;
