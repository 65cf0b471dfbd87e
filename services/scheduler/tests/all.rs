//! The scheduler and the prober against a real NATS server (and real
//! HTTP, TCP and TLS servers the tests start).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod prober;
mod scheduler;
