use std::time::Duration;

use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;

use nisse_bus::ConsumerSpec;
use nisse_bus::proto::{Envelope, ExecRequest};
use nisse_tests::{Recording, TestNats, ops};

/// A trace started where a message is published continues where it is
/// handled, through the `traceparent` header, and the envelope keeps a copy.
/// (Current-thread runtime: the subscriber set here is this thread's only.)
#[tokio::test(flavor = "current_thread")]
async fn the_trace_context_crosses_the_bus() {
    let provider = SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("nisse-tests")));
    let _guard = tracing::subscriber::set_default(subscriber);
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());

    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();

    let intake = tracing::info_span!("intake");
    let trace_id = intake.context().span().span_context().trace_id();
    assert_ne!(trace_id, opentelemetry::trace::TraceId::INVALID);
    let msg = ExecRequest {
        envelope: Some(Envelope {
            agent: "ops".into(),
            message_id: "exec:traced".into(),
            ..Default::default()
        }),
        request_id: "traced".into(),
        ..Default::default()
    };
    bus.publish(msg).instrument(intake).await.unwrap();

    let stored = Recording::record(&bus, &ops(), 1, None).await.unwrap();
    let header = stored.messages[0]
        .header("traceparent")
        .unwrap()
        .to_string();
    assert!(
        header.contains(&trace_id.to_string()),
        "{header} lacks {trace_id}"
    );

    let mut c = bus
        .consumer::<ExecRequest>(&ops(), ConsumerSpec::EXECUTOR)
        .await
        .unwrap();
    let token = CancellationToken::new();
    let d = tokio::time::timeout(Duration::from_secs(5), c.next(&token))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(d.envelope().trace.as_ref().unwrap().traceparent, header);
    let handled = d.span().context().span().span_context().trace_id();
    assert_eq!(
        handled, trace_id,
        "the handler's span joins the publisher's trace"
    );
    d.ack().await.unwrap();
}
