//! The server's trace spans: one per `ditto.v1.Twin` RPC and per HTTP request (continuing an
//! incoming W3C `traceparent`), and the children of a question (snapshot, resolve,
//! simulate) and of a write (apply).
//!
//! Every constructor returns `Span::none()` unless trace export is on
//! (`telemetry::otel::active`), so with tracing off no span is built at all. Integers are
//! recorded as i64 ([`as_i64`]): the OpenTelemetry layer exports unsigned ones as strings.

use tracing::Span;

use crate::telemetry::otel;

/// The span of one `ditto.v1.Twin` call to `method` (one of `observe::TWIN_METHODS`, or
/// `other`): `ditto.v1.Twin/<Method>`, server kind, continuing the caller's trace.
pub fn grpc_request(method: &str, headers: &http::HeaderMap) -> Span {
    if !otel::active() {
        return Span::none();
    }
    let span = tracing::info_span!(
        "rpc",
        otel.name = %format_args!("ditto.v1.Twin/{method}"),
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = "ditto.v1.Twin",
        rpc.method = %method,
    );
    otel::parent_from_headers(&span, headers);
    span
}

/// The span of one HTTP request on `route` (the route the router matched, or `other`).
pub fn http_request(method: &http::Method, route: &str, headers: &http::HeaderMap) -> Span {
    if !otel::active() {
        return Span::none();
    }
    let span = tracing::info_span!(
        "http",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
    );
    otel::parent_from_headers(&span, headers);
    span
}

/// Picking the snapshot a question runs on.
pub fn snapshot(generation: u64) -> Span {
    if !otel::active() {
        return Span::none();
    }
    tracing::info_span!(
        "snapshot",
        ditto.generation_asked = as_i64(generation),
        ditto.generation = tracing::field::Empty,
    )
}

/// Resolving a question against its snapshot (candidates, now, background).
pub fn resolve() -> Span {
    if !otel::active() {
        return Span::none();
    }
    tracing::info_span!("resolve")
}

/// Simulating a question's forks; the counts are recorded when it ends.
pub fn simulate(replications: u32, horizon_us: u64) -> Span {
    if !otel::active() {
        return Span::none();
    }
    tracing::info_span!(
        "simulate",
        ditto.replications = i64::from(replications),
        ditto.simulated_horizon_us = as_i64(horizon_us),
        ditto.candidates = tracing::field::Empty,
        ditto.forks = tracing::field::Empty,
        ditto.events = tracing::field::Empty,
    )
}

/// Applying one write (a config, a state update, a KV batch) to the mirror.
pub fn apply() -> Span {
    if !otel::active() {
        return Span::none();
    }
    tracing::info_span!("apply")
}

/// `value` as the i64 an OpenTelemetry integer attribute holds (saturating).
pub fn as_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
