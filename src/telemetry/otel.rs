//! OpenTelemetry traces over OTLP/gRPC, configured only by the standard environment
//! variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns
//! tracing on; `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`,
//! `OTEL_TRACES_SAMPLER_ARG` and the batch processor's `OTEL_BSP_*` are read by the SDK;
//! `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true` turn it off.
//!
//! Off (the default) costs nothing: no exporter, no layer, and the server asks
//! [`active`] before it builds a span. On, the exporter runs on its own one-thread runtime,
//! apart from the server's, and [`OtelGuard`] flushes the spans still buffered when dropped
//! (after the server stopped). Incoming W3C `traceparent`/`tracestate` continue the caller's
//! trace ([`parent_from_headers`]).

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::Extractor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};

/// Whether spans are exported (set once, when tracing starts).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Whether traces are being exported; servers build spans only then.
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Why the OTLP exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// Its runtime could not be built.
    #[error("OTLP exporter runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The exporter refused its configuration (e.g. a bad endpoint).
    #[error("OTLP exporter: {0}")]
    Exporter(String),
}

/// Whether the environment asks for trace export.
pub fn requested_by_env() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
    let endpoint = set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let exporter_off = std::env::var("OTEL_TRACES_EXPORTER")
        .is_ok_and(|value| value.trim().eq_ignore_ascii_case("none"));
    let sdk_off = std::env::var("OTEL_SDK_DISABLED")
        .is_ok_and(|value| value.trim().eq_ignore_ascii_case("true"));
    endpoint && !exporter_off && !sdk_off
}

/// Keeps the exporter alive; dropping it flushes and shuts the exporter down. Drop it
/// outside any async runtime (the flush blocks).
pub struct OtelGuard {
    provider: SdkTracerProvider,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for OtelGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtelGuard")
    }
}

impl Drop for OtelGuard {
    fn drop(&mut self) {
        ACTIVE.store(false, Ordering::Relaxed);
        if let Err(err) = self.provider.shutdown() {
            tracing::warn!(%err, "flushing the last spans failed");
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Starts the OTLP/gRPC exporter as the environment configures it and installs the W3C
/// trace-context propagator; returns the guard and the tracer for the tracing layer.
pub fn start() -> Result<(OtelGuard, Tracer), OtelError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ditto-otlp")
        .enable_all()
        .build()
        .map_err(OtelError::Runtime)?;
    // The exporter's channel spawns its worker on the runtime it is built in: this one.
    let exporter = {
        let _entered = runtime.enter();
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|err| OtelError::Exporter(err.to_string()))?
    };
    // The environment's resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), with
    // `service.name` "ditto" when it names none and the build's version.
    let mut resource = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|name| !name.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES")
            .is_ok_and(|attributes| attributes.contains("service.name="));
    if !named {
        resource = resource.with_service_name("ditto");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let tracer = provider.tracer("ditto");
    ACTIVE.store(true, Ordering::Relaxed);
    Ok((
        OtelGuard {
            provider,
            runtime: Some(runtime),
        },
        tracer,
    ))
}

/// Header names and values of an HTTP request (gRPC metadata is HTTP/2 headers) as a
/// propagation carrier.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Makes `span` continue the trace of an incoming W3C `traceparent` in `headers` (nothing
/// happens without one, or with a malformed one: the span starts a new trace).
pub fn parent_from_headers(span: &tracing::Span, headers: &http::HeaderMap) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if headers.contains_key("traceparent") {
        let context = opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.extract(&Headers(headers))
        });
        // Fails only when the span is disabled, and then there is nothing to continue.
        let _ = span.set_parent(context);
    }
}
