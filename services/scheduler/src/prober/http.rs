//! The HTTP(S) check: healthy when the status is expected (none listed:
//! any 2xx), the body holds the text (when given) and the whole answer
//! came within the bound (when given).

use std::io;
use std::time::Instant;

use reqwest::Url;
use reqwest::redirect::Policy;

use nisse_bus::proto::HttpProbe;

use super::{Found, trust};

/// The most of a body read: enough for any health page, and a duty that
/// points at a large download is not read whole every few minutes.
const BODY_LIMIT: usize = 1024 * 1024;

/// Redirects followed when the probe follows them, as the contract says.
const MAX_REDIRECTS: usize = 10;

pub(super) async fn check(probe: &HttpProbe) -> Found {
    let url = match Url::parse(&probe.url) {
        Ok(u) if !matches!(u.scheme(), "http" | "https") => {
            return Found::unhealthy(format!(
                "invalid HTTP check: URL {:?} is not http or https",
                probe.url
            ));
        }
        Ok(u) if u.host_str().is_none_or(str::is_empty) => {
            return Found::unhealthy(format!(
                "invalid HTTP check: URL {:?} names no host",
                probe.url
            ));
        }
        Ok(u) => u,
        Err(e) => {
            return Found::unhealthy(format!(
                "invalid HTTP check: URL {:?} is not valid: {e}",
                probe.url
            ));
        }
    };
    if let Some(bad) = probe
        .expect_status
        .iter()
        .find(|s| !(100..=599).contains(*s))
    {
        return Found::unhealthy(format!(
            "invalid HTTP check: expected status {bad} is not an HTTP status"
        ));
    }
    // Always the prober's own TLS configuration, even for http: a
    // followed redirect may lead to https, and then the request's CA file
    // and the system's roots apply as they do for a TLS check.
    let (mut tls, leaf) = match trust::client_config(&probe.ca_file).await {
        Ok(c) => c,
        Err(e) => return Found::unhealthy(e),
    };
    // The workspace's reqwest speaks HTTP/1.1 only.
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let client = reqwest::Client::builder()
        .redirect(if probe.follow_redirects {
            Policy::limited(MAX_REDIRECTS)
        } else {
            Policy::none()
        })
        // The check is of the service, not of a proxy the environment
        // names: a proxy's 502 would be blamed on the service.
        .no_proxy()
        .user_agent(concat!("nisse-prober/", env!("CARGO_PKG_VERSION")))
        .tls_backend_preconfigured(tls)
        .build();
    let client = match client {
        Ok(c) => c,
        Err(e) => return Found::unhealthy(format!("cannot make an HTTP client: {e}")),
    };

    let started = Instant::now();
    let mut response = match client.get(url.clone()).send().await {
        Ok(r) => r,
        Err(e) => {
            return Found {
                latency: Some(started.elapsed()),
                ..Found::unhealthy(format!(
                    "HTTP request to {url} failed: {}",
                    failure(&e, &url, &leaf)
                ))
            };
        }
    };
    let status = response.status();
    let code = u32::from(status.as_u16());
    let from = if response.url() == &url {
        url.to_string()
    } else {
        format!("{} (redirected from {url})", response.url())
    };
    let location = status
        .is_redirection()
        .then(|| response.headers().get(reqwest::header::LOCATION))
        .flatten()
        .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned());

    // The whole answer: the latency bound is on the body too, which is
    // where a slow backend shows.
    let mut body = Vec::new();
    let mut cut = false;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = BODY_LIMIT - body.len();
                if chunk.len() >= room {
                    body.extend_from_slice(&chunk[..room]);
                    cut = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => {
                return Found {
                    latency: Some(started.elapsed()),
                    status_code: Some(code),
                    ..Found::unhealthy(format!(
                        "HTTP {code} from {from}, but reading the body failed: {}",
                        failure(&e, &url, &leaf)
                    ))
                };
            }
        }
    }
    let latency = started.elapsed();
    let ms = latency.as_millis();

    let expected = if probe.expect_status.is_empty() {
        status.is_success()
    } else {
        probe.expect_status.contains(&code)
    };
    let mut found = if !expected {
        let redirect = match &location {
            Some(to) => format!(" (redirect to {to}, not followed)"),
            None => String::new(),
        };
        Found::unhealthy(format!(
            "HTTP {code} from {from}{redirect}, expected {}",
            expected_text(&probe.expect_status)
        ))
    } else if !probe.body_contains.is_empty() && !contains(&body, probe.body_contains.as_bytes()) {
        Found::unhealthy(format!(
            "HTTP {code} from {from}, but the body{} does not contain {:?}",
            if cut { "'s first MiB" } else { "" },
            probe.body_contains
        ))
    } else if probe.max_latency_ms > 0 && ms > u128::from(probe.max_latency_ms) {
        Found::unhealthy(format!(
            "HTTP {code} from {from} in {ms} ms, over the {} ms bound",
            probe.max_latency_ms
        ))
    } else {
        Found::healthy(format!("HTTP {code} from {from} in {ms} ms"))
    };
    found.latency = Some(latency);
    found.status_code = Some(code);
    found
}

/// "2xx", "200", "200 or 204", "200, 201 or 204".
fn expected_text(expected: &[u32]) -> String {
    match expected {
        [] => "2xx".into(),
        [one] => one.to_string(),
        [rest @ .., last] => {
            let rest: Vec<String> = rest.iter().map(u32::to_string).collect();
            format!("{} or {last}", rest.join(", "))
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// Why a request failed, in the operator's words: a refused connection
/// or a refused certificate said plainly, anything else as the causes
/// reqwest and hyper give (without reqwest's own line, which only repeats
/// the URL).
fn failure(e: &reqwest::Error, url: &Url, leaf: &trust::Leaf) -> String {
    let host = url.host_str().unwrap_or_default();
    let at = format!("{host}:{}", url.port_or_known_default().unwrap_or_default());
    if let Some(refused) = trust::find::<rustls::Error>(e) {
        let cert = leaf.get().map(|der| trust::Certificate::read(&der));
        return match trust::refusal(refused) {
            Some(trust::Refusal::NotForName(presented)) => format!(
                "the certificate of {at} is not valid for {host}{}",
                trust::is_for(cert.as_ref(), &presented)
            ),
            Some(trust::Refusal::UnknownIssuer) => {
                format!("the certificate of {at} has an unknown issuer (no trusted CA signed it)")
            }
            Some(trust::Refusal::Expired) => format!("the certificate of {at} has expired"),
            Some(trust::Refusal::NotValidYet) => {
                format!("the certificate of {at} is not valid yet")
            }
            Some(trust::Refusal::Other(why)) => {
                format!("the certificate of {at} was refused: {why}")
            }
            None => format!("TLS with {at}: {refused}"),
        };
    }
    if let Some(io) = trust::find::<io::Error>(e)
        && io.kind() == io::ErrorKind::ConnectionRefused
    {
        return format!("connection to {at} refused");
    }
    if e.is_redirect() {
        return format!("more than {MAX_REDIRECTS} redirects");
    }
    let mut causes: Vec<String> = Vec::new();
    let mut next = std::error::Error::source(e);
    while let Some(cause) = next {
        let text = cause.to_string();
        if !causes.iter().any(|c| c.contains(&text)) {
            causes.push(text);
        }
        next = cause.source();
    }
    if causes.is_empty() {
        e.to_string()
    } else {
        causes.join(": ")
    }
}
