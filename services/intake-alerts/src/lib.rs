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
//! webhook `http_config` sends them. With no credentials configured the
//! receiver makes a bearer token of its own on first start
//! (`<data-dir>/credentials/alertmanager-webhook.token`, mode 0600) and
//! requires it; accepting anyone's posts takes `allow-unauthenticated` and
//! a loopback address. `GET /healthz` says the process serves, `GET
//! /readyz` that it is connected to NATS.
//!
//! A request's memory is bounded before anything is built: the body by
//! `max-body`, and what its alerts become (each its own message, with the
//! group's labels copied in) by `max-expanded`, computed from a first pass
//! over the body that keeps nothing.
//!
//! [`run`] is the service: [`bind`] (which checks the configuration,
//! reads secret files and opens the socket), then [`Bound::serve`] until
//! shutdown. Secret files are read again at every request, so a rotated
//! token takes effect at once.

mod auth;
mod config;
mod error;
mod payload;
mod problem;
mod server;
mod token;

pub use config::{AuthConfig, BasicAuth, Config};
pub use error::Error;
pub use server::{Bound, bind};
pub use token::{ensure as ensure_token, generated_token_file};

use nisse_bus::service::{Context, Service};

/// The service.
pub const SERVICE: Service = Service {
    name: "intake-alerts",
    about: "Alertmanager's webhook receiver: each alert onto the agent's stream",
};

/// The name its webhook address is reported under (`endpoints.json`).
pub const LISTENER: &str = "alertmanager-webhook";

/// The name the file holding its bearer token is reported under
/// (`endpoints.json`), when the token is read from a file (the generated
/// one or `auth.bearer-token-file`): what Alertmanager's
/// `http_config.authorization.credentials_file` names.
pub const TOKEN_FILE_LISTENER: &str = "alertmanager-token-file";

/// Binds the webhook receiver, reports its address (and token file) and
/// readiness, and serves until shutdown.
pub async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    let bound = bind(&ctx.config, ctx.bus.clone(), &ctx.data_dir).await?;
    ctx.ready.listening(LISTENER, bound.webhook_url());
    if let Some(path) = bound.token_file() {
        // Absolute: Alertmanager resolves a relative `credentials_file`
        // against its own configuration's directory, not ours.
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        ctx.ready
            .listening(TOKEN_FILE_LISTENER, path.display().to_string());
    }
    ctx.ready.ready();
    bound.serve(ctx.shutdown.clone()).await?;
    Ok(())
}
