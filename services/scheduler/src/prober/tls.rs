//! The TLS check: healthy when the chain verifies for the server name and
//! the leaf certificate has at least `min_days_left` days left. A refused
//! certificate is still read for its days left: "expires in 2 days and
//! is not for this name" tells the operator both things to fix.

use std::sync::Arc;
use std::time::Instant;

use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt as _;
use tokio_rustls::TlsConnector;

use nisse_bus::proto::TlsProbe;

use super::trust::{self, Certificate, Refusal};
use super::{Found, days, endpoint, host_port, tcp};

pub(super) async fn check(probe: &TlsProbe) -> Found {
    let port = match endpoint("TLS", &probe.host, probe.port) {
        Ok(p) => p,
        Err(e) => return Found::unhealthy(e),
    };
    let name = if probe.server_name.is_empty() {
        probe.host.as_str()
    } else {
        probe.server_name.as_str()
    };
    let Ok(server_name) = ServerName::try_from(name.to_string()) else {
        return Found::unhealthy(format!(
            "invalid TLS check: server name {name:?} is neither a DNS name nor an IP address"
        ));
    };
    let (config, leaf) = match trust::client_config(&probe.ca_file).await {
        Ok(c) => c,
        Err(e) => return Found::unhealthy(e),
    };
    let at = host_port(&probe.host, probe.port);
    let started = Instant::now();
    let stream = match tcp::connect(&probe.host, port).await {
        Ok(s) => s,
        Err(e) => {
            return Found {
                latency: Some(started.elapsed()),
                ..Found::unhealthy(e)
            };
        }
    };
    let handshake = TlsConnector::from(Arc::new(config))
        .connect(server_name, stream)
        .await;
    let latency = started.elapsed();
    let cert = leaf.get().map(|der| Certificate::read(&der));
    let days_left = cert.as_ref().and_then(|c| c.days_left);

    let mut found = match handshake {
        Ok(mut stream) => {
            // Say goodbye properly, so the server does not log a broken
            // connection for every check.
            let _ = stream.shutdown().await;
            judge_verified(name, days_left, probe.min_days_left)
        }
        Err(e) => {
            let refusal = trust::find::<rustls::Error>(&e).and_then(trust::refusal);
            match refusal {
                Some(r) => Found::unhealthy(refused(name, &at, &r, cert.as_ref())),
                None => Found::unhealthy(format!("TLS handshake with {at} failed: {e}")),
            }
        }
    };
    found.latency = Some(latency);
    found.days_left = days_left;
    found
}

/// A verified certificate: healthy with enough days left.
fn judge_verified(name: &str, days_left: Option<i64>, min_days_left: u32) -> Found {
    match days_left {
        Some(d) if d >= i64::from(min_days_left) => Found::healthy(format!(
            "certificate for {name} verified, expires in {}",
            days(d)
        )),
        Some(d) => Found::unhealthy(format!(
            "certificate for {name} expires in {} (at least {min_days_left} wanted)",
            if d < 1 {
                "less than a day".to_string()
            } else {
                days(d)
            },
        )),
        // rustls accepted it, so it parsed as X.509 there; this parser
        // disagreeing is not the server's fault, but the threshold cannot
        // be judged either.
        None => Found::unhealthy(format!(
            "certificate for {name} verified, but its expiry could not be read"
        )),
    }
}

/// A refused certificate, in one line: why, and how long it has left.
fn refused(name: &str, at: &str, refusal: &Refusal, cert: Option<&Certificate>) -> String {
    let days_left = cert.and_then(|c| c.days_left);
    let expiry = match days_left {
        Some(d) if d >= 0 => format!("; it expires in {}", days(d)),
        Some(d) => format!("; it expired {} ago", days(-d)),
        None => String::new(),
    };
    match refusal {
        Refusal::NotForName(presented) => format!(
            "certificate from {at} is not valid for {name}{}{expiry}",
            trust::is_for(cert, presented)
        ),
        Refusal::UnknownIssuer => format!(
            "certificate for {name} from {at} has an unknown issuer (no trusted CA signed it){expiry}"
        ),
        Refusal::Expired => match days_left {
            Some(d) if d < 0 => {
                format!("certificate for {name} from {at} expired {} ago", days(-d))
            }
            _ => format!("certificate for {name} from {at} has expired"),
        },
        Refusal::NotValidYet => {
            format!("certificate for {name} from {at} is not valid yet{expiry}")
        }
        Refusal::Other(why) => {
            format!("certificate for {name} from {at} was refused: {why}{expiry}")
        }
    }
}
