//! Integration tests of intake-vikunja against a real NATS server and the
//! harness's Vikunja stand-in (one binary for the crate keeps link time
//! down).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test by panicking"
)]

mod suite;
