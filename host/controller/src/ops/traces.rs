//! OpenTelemetry traces, off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set: the `tracing` spans of reconciles, component
//! calls and the host's backend requests, sent over OTLP/HTTP (protobuf) by a batch exporter
//! on its own thread, so a slow or unreachable collector never holds up a reconcile. Spans
//! it could not deliver are counted in `banlieue_trace_spans_dropped_total`.
//!
//! One VM's creation is one trace: the VM reconcile that makes a Machine writes its
//! `traceparent` (W3C) in the Machine's annotation [`TRACEPARENT`], and the Machine's
//! reconciles continue that trace until it is provisioned ([`continue_trace`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The annotation carrying the trace a Machine's creation belongs to.
pub const TRACEPARENT: &str = "banlieue.io/traceparent";

/// Whether the environment asks for traces.
pub fn enabled() -> bool {
    let set = |v: &str| std::env::var(v).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The `tracing` layer exporting spans, when [`enabled`]; `service` names this process
/// (`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` override it, as usual).
pub fn layer<S>(service: &str) -> anyhow::Result<Option<tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>>>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    if !enabled() {
        return Ok(None);
    }
    // The exporter's blocking HTTP client runs a runtime of its own, which may not be made
    // (or dropped) on a thread of the process's async runtime.
    let service = service.to_string();
    let provider = std::thread::spawn(move || -> anyhow::Result<SdkTracerProvider> {
        // HTTPS to a collector, with ring's crypto as everywhere in banlieue (a second
        // install is refused harmlessly).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build()?;
        let resource = opentelemetry_sdk::Resource::builder().with_service_name(service).build();
        Ok(SdkTracerProvider::builder().with_batch_exporter(Counted(exporter)).with_resource(resource).build())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the trace exporter panicked while starting"))?
    .map_err(|e| anyhow::anyhow!("the OTLP trace exporter (OTEL_EXPORTER_OTLP_*): {e}"))?;
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let tracer = provider.tracer("banlieue");
    opentelemetry::global::set_tracer_provider(provider);
    Ok(Some(tracing_opentelemetry::layer().with_tracer(tracer)))
}

/// The exporter, counting the spans of each batch it failed to deliver.
#[derive(Debug)]
struct Counted(opentelemetry_otlp::SpanExporter);

impl SpanExporter for Counted {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        let result = self.0.export(batch).await;
        if result.is_err() {
            crate::ops::metrics::SPANS_DROPPED.fetch_add(n, Ordering::Relaxed);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.0.set_resource(resource);
    }
}

/// The current span's trace as a W3C `traceparent`, when traces are on.
pub fn traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// Make `span` (not entered yet) a child of the trace `traceparent` names.
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    // A malformed value (or traces off) leaves the span a root of its own.
    let _ = span.set_parent(cx);
}
