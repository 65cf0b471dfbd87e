//! Web servers for checks to look at, on free loopback ports: an HTTP
//! server whose answer a test sets, a TLS server with a certificate from a
//! CA of its own that expires when the test says, and a port nothing
//! listens on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Redirect;
use axum::routing::get;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;

/// An HTTP server: `/health` answers with the status the test sets (200
/// at first) and "status: ok", `/slow` after 300 ms, `/moved` redirects to
/// `/health`.
pub struct TestWeb {
    /// Where it listens.
    pub addr: SocketAddr,
    status: Arc<AtomicU16>,
}

impl TestWeb {
    /// Starts it.
    pub async fn start() -> anyhow::Result<Self> {
        let status = Arc::new(AtomicU16::new(200));
        let app = Router::new()
            .route(
                "/health",
                get(|State(s): State<Arc<AtomicU16>>| async move {
                    let code = StatusCode::from_u16(s.load(Ordering::SeqCst))
                        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    (code, "status: ok")
                }),
            )
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    "status: ok"
                }),
            )
            .route("/moved", get(|| async { Redirect::temporary("/health") }))
            .with_state(status.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self { addr, status })
    }

    /// The URL of `path` on it.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Makes `/health` answer with `status` from now on.
    pub fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }
}

/// A port nothing listens on: bound, then let go.
pub async fn closed_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    Ok(listener.local_addr()?.port())
}

/// A server that accepts connections and never says a word.
pub async fn silent() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    Ok(addr)
}

/// A CA (its PEM in `ca_file`) and a TLS server whose certificate for
/// `localhost` it signed, expiring in the days given; each connection that
/// completes the handshake gets a one-line HTTP 200.
pub struct TestTls {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The CA's certificate, PEM.
    pub ca_file: String,
    _dir: tempfile::TempDir,
}

impl TestTls {
    /// Starts it with a certificate with `days_left` whole days left: it
    /// expires half a day after that, so the whole days left stay the
    /// same however long the test takes (exactly `days_left` days would
    /// read as one fewer a moment later, and two probes could disagree).
    pub async fn start(days_left: i64) -> anyhow::Result<Self> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

        let dir = tempfile::tempdir()?;
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Nisse test CA");
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate()?;
        let mut leaf_params = CertificateParams::new(vec!["localhost".to_string()])?;
        let now = time::OffsetDateTime::now_utc();
        leaf_params.not_before = now - time::Duration::days(30);
        leaf_params.not_after = now + time::Duration::days(days_left) + time::Duration::hours(12);
        let leaf_cert = leaf_params.signed_by(&leaf_key, &issuer)?;
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca_cert.pem())?;

        let chain: Vec<CertificateDer<'static>> = vec![leaf_cert.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the test TLS server's certificate")?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A refused handshake is what some tests are about.
                    if let Ok(mut tls) = acceptor.accept(socket).await {
                        let _ = tls
                            .write_all(
                                b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\nconnection: close\r\n\r\nstatus ok",
                            )
                            .await;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            ca_file: ca_file.display().to_string(),
            _dir: dir,
        })
    }
}
