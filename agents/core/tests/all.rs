//! nisse-core's integration tests, in one binary: the state store and the
//! work model on real SQLite files, and the shared brain — operators'
//! commands and chat, plans, approvals and the gates — driven through a
//! second brain defined here, on the test rig nisse-ops' tests share.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

#[path = "support/rig.rs"]
mod rig;
mod suite;
