//! The contracts of the Nisse bus: every message any service publishes, as
//! protobuf types generated from `proto/nisse/v1/*.proto`.
//!
//! This crate is only the shape of the messages and the rules that keep that
//! shape compatible over time ([`compat`]). It knows nothing of subjects,
//! streams or NATS; `nisse-bus` maps message kinds to subjects.

mod descriptor;
mod error;

pub mod compat;

pub use descriptor::{FILE_DESCRIPTOR_SET, descriptor_pool, released_descriptor_set};
pub use error::{Error, Result};

/// Version 1 of the contracts. Fields are only ever added; see
/// `proto/nisse/v1/envelope.proto` for the wire rules.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/nisse.v1.rs"));
}
