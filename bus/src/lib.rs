//! The Nisse bus: how services meet on NATS JetStream.
//!
//! It owns the topology (one stream per agent, `AGENT_<NAME>` over
//! `nisse.<agent>.>`, and one durable pull consumer per service), typed
//! publishing of the `nisse-proto` contracts with an envelope, a dedup id and
//! W3C trace headers, and typed consuming with explicit ack, nak-with-delay,
//! terminate and dead-lettering of anything that can never be processed.
//!
//! It deliberately knows nothing of what the messages mean: brains and
//! services decide that. Subjects and consumer names live only in
//! [`topology`], so there is one place to read the bus's shape.

mod bus;
mod config;
mod consume;
mod contract;
mod error;
mod exec;
mod lease;
mod memo;
mod publish;
mod replay;
mod switches;
mod usage;

pub mod embedded;
mod trace;

pub mod topology;

pub use bus::{Bus, install_tls_provider};
pub use config::{BusConfig, ConsumerTuning, StreamLimits, TlsConfig};
pub use consume::{Consumer, Delivery, Disposition, HandlerError, Settled};
pub use contract::{AnyMessage, Contract, Decode, Rejection};
pub use error::{Error, Result};
pub use exec::{
    CIRCUIT_BUCKET, CircuitState, EXEC_BUCKET, EXEC_RECORD_MAX_AGE, ExecPhase, ExecRecord,
};
pub use lease::{LEASE_BUCKET, Lease};
pub use memo::{MEMO_BUCKET, memo_key};
pub use publish::{PendingPublish, Published};
pub use replay::{RangeReader, StoredMessage};
pub use switches::{NeverEntry, SWITCH_BUCKET, SwitchBoard, SwitchState};
pub use topology::{
    AgentName, ConsumerSpec, SubjectKind, TopologyChange, TopologyReport, dead_letter_subject,
};
pub use trace::HEADER_TYPE;
pub use usage::{MODEL_USAGE_BUCKET, MODEL_USAGE_MAX_AGE, ModelUsage};

/// Re-exported so users of the bus name the same contract types.
pub use nisse_proto::v1 as proto;
