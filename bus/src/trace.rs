//! W3C trace context across the bus. The publisher injects the current
//! span's context into the `traceparent`/`tracestate` headers (and a copy into
//! the envelope); the consumer makes it the parent of the span it handles the
//! message in, so one trace follows work from intake to executor and back.
//!
//! Both sides use the process's global propagator, which the `nisse` binary
//! sets to W3C trace context. Without one (a library user that never set it)
//! nothing is injected and nothing breaks.

use std::collections::HashMap;

use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use nisse_proto::v1::TraceContext;

/// Header naming the protobuf type of the payload, e.g.
/// `nisse.v1.AlertReceived`, so tools can decode a message without knowing
/// the subject table.
pub const HEADER_TYPE: &str = "Nisse-Type";

struct MapInjector<'a>(&'a mut HashMap<String, String>);

impl Injector for MapInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_string(), value);
    }
}

/// The trace context of the current span, as the envelope carries it.
pub(crate) fn current_trace_context() -> TraceContext {
    let cx = tracing::Span::current().context();
    let mut map = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut MapInjector(&mut map))
    });
    TraceContext {
        traceparent: map.remove("traceparent").unwrap_or_default(),
        tracestate: map.remove("tracestate").unwrap_or_default(),
    }
}

struct HeaderExtractor<'a>(&'a async_nats::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_ref()).collect()
    }
}

/// Makes the trace context in `headers` the parent of `span`.
pub(crate) fn adopt_parent(span: &tracing::Span, headers: Option<&async_nats::HeaderMap>) {
    // No subscriber records the span: there is no trace to join, so skip
    // the header lookup on this per-message path.
    if span.is_disabled() {
        return;
    }
    let Some(headers) = headers else { return };
    if headers.get("traceparent").is_none() {
        return;
    }
    let cx =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    // Fails only when the span is not recorded by an OpenTelemetry layer,
    // in which case there is no trace to join.
    let _ = span.set_parent(cx);
}
