//! A process's health for whatever supervises it (a container engine's
//! health check, a process manager): `nisse serve --health-listen ADDR`
//! answers `GET /healthz` while the process runs and `GET /readyz` once
//! every service it runs is ready (its consumers bound, its listeners
//! open), 503 before; `nisse health URL` asks one and exits 0 only on
//! success, so an image needs no HTTP client of its own.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use nisse_bus::service::Readiness;

/// What `/readyz` waits for: these keys of `readiness`.
#[derive(Clone)]
struct Ready {
    readiness: Readiness,
    keys: Arc<Vec<String>>,
}

/// Serves `/healthz` and `/readyz` on `addr` until `shutdown`.
pub async fn listen(
    addr: SocketAddr,
    readiness: Readiness,
    keys: Vec<String>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("the health listener cannot listen on {addr}: {e}"))?;
    let app = Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .with_state(Ready {
            readiness,
            keys: Arc::new(keys),
        });
    tracing::info!(%addr, "health: /healthz and /readyz");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
}

async fn readyz(State(ready): State<Ready>) -> (StatusCode, String) {
    if ready.readiness.is_ready(&ready.keys) {
        (StatusCode::OK, "ready\n".into())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready yet: waiting for {}\n", ready.keys.join(", ")),
        )
    }
}

/// `nisse health URL`: whether `url` answers 2xx within a few seconds.
pub async fn check(url: &str) -> anyhow::Result<()> {
    let response = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .build()?
        .get(url)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    anyhow::ensure!(status.is_success(), "{url}: {status}: {}", body.trim());
    println!("{}", body.trim());
    Ok(())
}
