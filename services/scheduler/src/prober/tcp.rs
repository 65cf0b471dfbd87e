//! The TCP check: healthy when a connection is accepted.

use std::io;
use std::time::Instant;

use tokio::net::TcpStream;

use nisse_bus::proto::TcpProbe;

use super::{Found, endpoint, host_port};

pub(super) async fn check(probe: &TcpProbe) -> Found {
    let port = match endpoint("TCP", &probe.host, probe.port) {
        Ok(p) => p,
        Err(e) => return Found::unhealthy(e),
    };
    let started = Instant::now();
    match connect(&probe.host, port).await {
        Ok(_) => {
            let latency = started.elapsed();
            Found {
                latency: Some(latency),
                ..Found::healthy(format!(
                    "connection to {} accepted in {} ms",
                    host_port(&probe.host, probe.port),
                    latency.as_millis()
                ))
            }
        }
        Err(e) => Found {
            latency: Some(started.elapsed()),
            ..Found::unhealthy(e)
        },
    }
}

/// A connection to `host:port` (every address the name resolves to, in
/// turn), or a line saying why there is none: resolving and connecting
/// fail for different reasons, and the operator fixes them in different
/// places.
pub(super) async fn connect(host: &str, port: u16) -> Result<TcpStream, String> {
    let at = host_port(host, port.into());
    let addresses: Vec<_> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    if addresses.is_empty() {
        return Err(format!("cannot resolve {host}: no addresses"));
    }
    TcpStream::connect(&addresses[..])
        .await
        .map_err(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused => format!("connection to {at} refused"),
            io::ErrorKind::TimedOut => format!("connection to {at} timed out"),
            _ => format!("connection to {at} failed: {e}"),
        })
}
