//! The control service: what an operator sees and decides from another
//! machine, over an authenticated gRPC API (tonic), and the web control
//! room served beside it on the same listener.
//!
//! It is never the system of record. Each agent's state it shows comes
//! from a read model it keeps by applying the agent's stream as the
//! brain does (`nisse_core::reactor::follow`), so it needs no access to
//! the brain's store and runs wherever the bus reaches; what an operator
//! decides through it goes onto the agent's stream as that operator's
//! command (`in.operator.<name>`, channel `control`), which the brain
//! binds exactly like a command from the CLI or a chat.
//!
//! This crate holds the API, the tokens, the live-event hub and the
//! server's plumbing; the `nisse` binary supplies the [`Backend`] (its
//! views and commands over the configuration).

pub mod client;
pub mod config;
pub mod hub;
pub mod server;
pub mod tls;
pub mod tokens;
pub mod web;

pub use config::Config;
pub use hub::Hub;
pub use server::{Backend, Caller, ControlService, Failure, Records};
pub use tokens::{Refused, Tokens};
/// The gRPC crate, for a backend's `#[tonic::async_trait]` and a client.
pub use tonic;

use tokio_util::sync::CancellationToken;

/// The channel an operator's command through the control plane carries,
/// and the prefix of the allowlist entries that name the operators who
/// may use it (`control:<name>`).
pub const CHANNEL: &str = "control";

/// The generated API (`proto/nisse/control/v1/control.proto`): messages,
/// the server trait and the client.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/nisse.control.v1.rs"));
}

/// Serves `service` on `listener` until `shutdown`: the gRPC API and the
/// web room on one listener (HTTP/2 for gRPC, HTTP/1.1 or 2 for the
/// page), over TLS with `tls`, connections in flight finishing their
/// calls.
pub async fn serve<B: Backend>(
    listener: tokio::net::TcpListener,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    service: ControlService<B>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let grpc =
        tonic::service::Routes::new(api::control_server::ControlServer::new(service.clone()))
            .prepare()
            .into_axum_router();
    let app = web::router(service, tls.is_some()).merge(grpc);
    let stop = async move { shutdown.cancelled().await };
    match tls {
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await?
        }
        Some(config) => {
            axum::serve(tls::TlsListener::new(listener, config)?, app)
                .with_graceful_shutdown(stop)
                .await?;
        }
    }
    Ok(())
}
