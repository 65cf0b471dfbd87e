//! intake-alerts: Prometheus Alertmanager's webhook receiver.
//!
//! Alertmanager posts groups of alerts (webhook payload version 4) to
//! `POST /api/v1/alerts`; each alert becomes one `AlertReceived` on the
//! configured agent's stream (`nisse.<agent>.in.alert`), with the group's
//! fields copied into it and a dedup id derived from what the alert is
//! (`alert:<fingerprint>:<status>:<startsAt>[:<endsAt>]`). The request is
//! answered 200 only once JetStream has stored every alert, and 503 when it
//! has not, so Alertmanager retries; since the ids are the same, a retry
//! never stores an alert twice.
//!
//! Everything is checked before anything is published: a request with one
//! bad alert publishes nothing. Errors are RFC 9457 problem documents naming
//! exactly what is wrong (`alerts[1].startsAt: ...`).
//!
//! Callers authenticate with a bearer token or basic auth, as Alertmanager's
//! webhook `http_config` sends them; without credentials the receiver only
//! listens on loopback. `GET /healthz` says the process serves, `GET
//! /readyz` that it is connected to NATS.
//!
//! The `nisse` binary runs it: [`bind`] (which checks the configuration,
//! reads secret files and opens the socket), then [`Bound::serve`] until
//! shutdown.

mod auth;
mod config;
mod error;
mod payload;
mod problem;
mod server;

pub use config::{AuthConfig, BasicAuth, Config};
pub use error::Error;
pub use server::{Bound, bind};
