//! The model gateway against a scripted OpenAI-compatible server over real
//! HTTP and a real `nats-server`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test by panicking"
)]

mod suite;
