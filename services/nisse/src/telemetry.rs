//! Structured logs and traces.
//!
//! Logs go to stderr through `tracing`: human-readable on a terminal, JSON
//! lines otherwise (under a supervisor, in a container). The filter comes from
//! `NISSE_LOG` (or `RUST_LOG`), default `info`. The W3C trace-context
//! propagator is always installed, so trace ids travel in message headers
//! between services; spans are exported over OTLP/HTTP only when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

use std::io::IsTerminal as _;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Keeps the span exporter alive; dropping it flushes what is buffered.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("flushing traces failed: {e}");
        }
    }
}

/// Installs logging and tracing for a process named `service`.
pub fn init(service: &str) -> anyhow::Result<Telemetry> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());

    let filter = std::env::var("NISSE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info,async_nats=warn".into());
    let filter = EnvFilter::try_new(&filter)
        .map_err(|e| anyhow::anyhow!("NISSE_LOG `{filter}` is not a valid log filter: {e}"))?;
    let fmt = if std::io::stderr().is_terminal() {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .boxed()
    };

    let otlp = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        .is_ok_and(|v| !v.is_empty());
    let provider = if otlp {
        // Endpoint, headers and timeout come from the standard OTEL_*
        // variables, which the exporter reads itself.
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|e| anyhow::anyhow!("OTLP exporter: {e}"))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(service.to_string())
            .build();
        Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource)
                .build(),
        )
    } else {
        None
    };
    let otel_layer = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("nisse")));

    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel_layer)
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))?;
    Ok(Telemetry { provider })
}
