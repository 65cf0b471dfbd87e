//! nisse-ops: the ops agent's brain.
//!
//! Alert intake is a duty (seed Nisse L1, O5): each alert from
//! Alertmanager is a finding with a stable fingerprint taken from its
//! labels, deduplicated onto work items, resolved, reopened when it flaps,
//! and bound to the hosts its labels name. Everything an operator says, the
//! plans and approvals, and the model-driven loop are nisse-core's shared
//! brain ([`nisse_core::brain`]); this crate adds only what is ops: the
//! alert findings, what labels mean, its scheduled checks ([`checks`]:
//! duties run on the scheduler's due messages, their findings on the same
//! fingerprint dedup as alerts, and the stale sweep), a Vikunja task for
//! a finding's item when configured ([`Config::ticket_project`]), its
//! configuration and its brief.

mod alerts;
mod brain;
pub mod checks;
mod config;
mod labels;
mod tickets;

pub use alerts::ALERT_DUTY;
pub use brain::OpsBrain;
pub use config::{Config, DEFAULT_BRIEF, FingerprintRule};
