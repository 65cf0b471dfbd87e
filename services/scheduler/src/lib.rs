//! Time on the stream (seed Nisse L1, L2, L8; Oikos REQ-OBS-1..5): two
//! services of one crate.
//!
//! - [`scheduler`] publishes each agent's clock ticks and its duties' due
//!   instants into the agent's stream, with dedup ids derived from the
//!   agent, the clock or duty, and the instant, so any number of
//!   instances publish one message per instant, and one that was down
//!   catches up with one message per duty, saying how late it is.
//! - [`prober`] answers the brain's `out.probe.req` with `in.probe.result`:
//!   the network checks of duties (HTTP, TCP, TLS).
//!
//! Each runs as its own NATS identity: the scheduler may only publish
//! ticks and due duties, the prober only probe results.

pub mod prober;
pub mod scheduler;
