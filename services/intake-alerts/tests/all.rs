//! Integration tests of intake-alerts against a real NATS server and a real
//! Alertmanager (one binary for the crate keeps link time down; nextest runs
//! it in the serial `servers` group).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test by panicking"
)]

mod suite;
