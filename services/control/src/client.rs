//! A client of the control API from another machine (`nisse --control
//! URL`): one connection, every call carrying the operator's token.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::api::control_client::ControlClient;

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(MetadataValue<Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

/// A connected client whose calls carry a token.
pub type Client = ControlClient<InterceptedService<Channel, Bearer>>;

/// Connects to the control service at `url` (`https://host:port`, or
/// `http://` on loopback only: a token is never sent over a network in
/// the clear), trusting `ca` (a PEM file) for https, or the system's
/// roots without one; every call carries `token`.
pub async fn connect(url: &str, token: &str, ca: Option<&Path>) -> anyhow::Result<Client> {
    let token = token.trim();
    anyhow::ensure!(!token.is_empty(), "the control token is empty");
    let bearer: MetadataValue<Ascii> = format!("Bearer {token}")
        .parse()
        .map_err(|_| anyhow::anyhow!("the control token has characters no token has"))?;
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .with_context(|| format!("`{url}` is not a control URL (e.g. https://nisse.lan:9096)"))?
        .connect_timeout(Duration::from_secs(10));
    let uri = endpoint.uri().clone();
    let host = uri.host().unwrap_or_default();
    match uri.scheme_str() {
        Some("https") => {
            let mut tls = ClientTlsConfig::new();
            tls = match ca {
                Some(ca) => {
                    let pem = std::fs::read(ca)
                        .with_context(|| format!("reading the control CA {}", ca.display()))?;
                    tls.ca_certificate(Certificate::from_pem(pem))
                }
                None => tls.with_native_roots(),
            };
            endpoint = endpoint
                .tls_config(tls)
                .with_context(|| format!("the TLS settings for {url}"))?;
        }
        Some("http") => {
            let loopback = host == "localhost"
                || host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            anyhow::ensure!(
                loopback,
                "`{url}` would send the control token across the network in the clear: use https:// (the service's `[control] tls-cert`, or a TLS proxy in front)"
            );
            anyhow::ensure!(
                ca.is_none(),
                "a CA file is for https:// URLs; `{url}` is plain http"
            );
        }
        _ => anyhow::bail!(
            "`{url}` is not a control URL: it starts with https:// (or http:// on loopback)"
        ),
    }
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("connecting to the control service at {url}"))?;
    Ok(ControlClient::with_interceptor(channel, Bearer(bearer)))
}
