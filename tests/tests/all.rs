//! Integration tests of Nisse against real servers (one binary for the
//! whole crate keeps link time down).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test by panicking"
)]

mod suite;
