//! The prober: the brain's `out.probe.req` → `in.probe.result`, the
//! network checks of duties (HTTP, TCP, TLS).
//!
//! Every request gets exactly one answer, healthy or not, because the
//! brain holds a deadline for it (seed L2: it never waits unexplained). A
//! request without a check, or with one that cannot be run (a bad URL,
//! port 0, an unreadable CA file), is answered as unhealthy with what is
//! wrong, never dead-lettered; a check that outlasts the request's
//! `timeout_ms` is answered as timed out. Only a result that could not be
//! published is retried.
//!
//! What counts as healthy travels with the request (expected statuses,
//! body text, latency bound, days of certificate left), so the prober
//! judges by the duty's thresholds as they were when the run started and
//! keeps no state of its own: a redelivered request is checked again, and
//! its result's id (`probe:<request id>`) makes JetStream drop the second
//! answer.
//!
//! Trust is read at every check: the system's roots and the request's
//! `ca_file`, like every secret in Nisse, so a CA installed or rotated
//! applies to the next check without a restart.
//!
//! Deliberately not here: retries of a failing check (the duty's next run
//! is the retry, and the brain decides what a failure means), and any
//! notion of "up" or "down" over time (the brain's).

mod http;
mod tcp;
mod tls;
mod trust;

use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use nisse_bus::proto::probe_request::Check;
use nisse_bus::proto::{ProbeRequest, ProbeResult};
use nisse_bus::service::{Context, Service};
use nisse_bus::{AgentName, Bus, ConsumerSpec, Delivery, Handler, Intake, Unhandled};

/// The service; its name is its durable consumer's.
pub const SERVICE: Service = Service {
    name: ConsumerSpec::PROBER.name,
    about: "the prober: duties' HTTP, TCP and TLS checks, one answer for every request",
};

/// The prober's settings (`[prober]` in `nisse.toml`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Checks run at once, per agent. Checks mostly wait on the network,
    /// so many can run together; a slow host then holds up only its own
    /// check, not every duty behind it.
    pub max_in_flight: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self { max_in_flight: 16 }
    }
}

impl Config {
    /// What is wrong with the settings, as (key under `prefix`, problem).
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.max_in_flight == 0 {
            out.push((
                format!("{prefix}.max-in-flight"),
                "must be at least 1".into(),
            ));
        }
        out
    }
}

/// Serves every agent of `ctx` until shutdown on its `prober` consumer
/// (several processes may share it), with up to `max-in-flight` checks at
/// once per agent; on shutdown the checks under way finish and are
/// answered.
pub async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    let handlers = ctx.every_agent(Probe {
        bus: ctx.bus.clone(),
    });
    let intake = Intake {
        consumer: ConsumerSpec::PROBER,
        in_flight: ctx.config.max_in_flight,
    };
    nisse_bus::serve(&ctx, intake, handlers).await?;
    Ok(())
}

/// The handler: one check and one result per request.
struct Probe {
    bus: Bus,
}

impl Handler<ProbeRequest> for Probe {
    async fn handle(
        &self,
        _agent: &AgentName,
        delivery: &Delivery<ProbeRequest>,
    ) -> Result<(), Unhandled> {
        let request = delivery.message();
        let result = check(request).await;
        // At debug: a thousand duties are a thousand probes a second, and
        // what a check found reaches the operator through the brain's
        // findings, not this log.
        tracing::debug!(
            parent: delivery.span(),
            request = %request.request_id,
            duty = %request.duty,
            healthy = result.healthy,
            latency_ms = result.latency_ms,
            "probed: {}",
            result.summary
        );
        self.bus
            .publish(result)
            .await
            .map_err(|e| Unhandled::retry(format!("publishing the probe result: {e}")))?;
        Ok(())
    }
}

/// Runs `request`'s check within its `timeout_ms` and says what was found:
/// the whole answer the prober publishes, envelope included. Never fails:
/// a request that cannot be checked is answered as unhealthy, saying why.
pub async fn check(request: &ProbeRequest) -> ProbeResult {
    let started = Instant::now();
    let found = match &request.check {
        None => Found::unhealthy("the request names no check (http, tcp or tls)"),
        Some(_) if request.timeout_ms == 0 => {
            Found::unhealthy("the request gives no timeout (timeout_ms is 0)")
        }
        Some(check) => {
            let limit = Duration::from_millis(request.timeout_ms.into());
            match tokio::time::timeout(limit, run_check(check)).await {
                Ok(found) => found,
                Err(_) => Found {
                    latency: Some(limit),
                    ..Found::unhealthy(format!(
                        "{} timed out after {} ms",
                        what(check),
                        request.timeout_ms
                    ))
                },
            }
        }
    };
    let latency = found.latency.unwrap_or_else(|| started.elapsed());
    ProbeResult {
        envelope: Some(SERVICE.reply_to(
            request.envelope.as_ref(),
            format!("probe:{}", request.request_id),
        )),
        request_id: request.request_id.clone(),
        duty: request.duty.clone(),
        healthy: found.healthy,
        summary: found.summary,
        latency_ms: u32::try_from(latency.as_millis()).unwrap_or(u32::MAX),
        status_code: found.status_code,
        days_left: found.days_left,
    }
}

async fn run_check(check: &Check) -> Found {
    match check {
        Check::Http(probe) => http::check(probe).await,
        Check::Tcp(probe) => tcp::check(probe).await,
        Check::Tls(probe) => tls::check(probe).await,
    }
}

/// What a check is, for a summary that says it did not finish.
fn what(check: &Check) -> String {
    match check {
        Check::Http(p) => format!("HTTP request to {}", p.url),
        Check::Tcp(p) => format!("connection to {}", host_port(&p.host, p.port)),
        Check::Tls(p) => format!("TLS handshake with {}", host_port(&p.host, p.port)),
    }
}

/// What one check found, before it becomes a [`ProbeResult`].
#[derive(Debug)]
struct Found {
    healthy: bool,
    summary: String,
    /// How long the service took to answer; `None`: the whole time the
    /// check took (when it failed before reaching the service).
    latency: Option<Duration>,
    status_code: Option<u32>,
    days_left: Option<i64>,
}

impl Found {
    fn healthy(summary: impl Into<String>) -> Self {
        Self {
            healthy: true,
            ..Self::unhealthy(summary)
        }
    }

    fn unhealthy(summary: impl Into<String>) -> Self {
        Self {
            healthy: false,
            summary: summary.into(),
            latency: None,
            status_code: None,
            days_left: None,
        }
    }
}

/// `host:port`, with an IPv6 address in brackets so the port stays
/// readable.
fn host_port(host: &str, port: u32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The host and port of a TCP or TLS check, or what is wrong with them.
fn endpoint(kind: &str, host: &str, port: u32) -> Result<u16, String> {
    if host.trim().is_empty() {
        return Err(format!("invalid {kind} check: no host given"));
    }
    match u16::try_from(port) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(format!(
            "invalid {kind} check: port {port} (must be 1 to 65535)"
        )),
    }
}

/// "1 day", "3 days".
fn days(n: i64) -> String {
    if n.abs() == 1 {
        format!("{n} day")
    } else {
        format!("{n} days")
    }
}
