//! TLS on the control listener itself (`[control] tls-cert`, `tls-key`),
//! and the client side of it for `nisse --control https://…`.
//!
//! `axum::serve` has no TLS, but it serves any [`axum::serve::Listener`]:
//! [`TlsListener`] accepts TCP connections, does each handshake in a task
//! of its own (a client that stalls its handshake holds up nobody), and
//! hands axum the finished streams. ALPN offers HTTP/2 (gRPC) and
//! HTTP/1.1 (the web room's browsers).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client has to finish its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Finished handshakes waiting for axum to take them.
const WAITING: usize = 64;

/// The server's TLS settings from a PEM certificate chain (leaf first)
/// and its PEM private key, each error naming the file and what is wrong.
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading the certificate {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading the certificate {}", cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "{} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
        cert.display()
    );
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the private key {} (PEM)", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("the TLS protocol versions")?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .with_context(|| {
        format!(
            "the certificate {} and its key do not make a TLS identity",
            cert.display()
        )
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener whose connections have finished a TLS handshake.
#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, std::net::SocketAddr)>,
    local: std::net::SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accepts on `tcp`, handshaking with `config`.
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(WAITING);
        let tls = TlsAcceptor::from(config);
        let acceptor = tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors and the like: pause, go on.
                        tracing::warn!("accepting a control connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (tls, tx) = (tls.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE, tls.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::info!(%peer, "a control connection's TLS handshake failed: {e}");
                        }
                        Err(_) => {
                            tracing::info!(%peer, "a control connection did not finish its TLS handshake in {HANDSHAKE:?}");
                        }
                    }
                });
            }
        });
        Ok(Self {
            ready,
            local,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The acceptor never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
