//! The cross-cutting work around every call, done once here instead of in each handler:
//! for each `ditto.v1.Twin` call ([`ObserveGrpc`], a tower service like the auth and drain
//! gates) and each HTTP request ([`observe_http`], an axum middleware), its span, its wall
//! time, and its count by the status the client saw.
//!
//! A gRPC call is counted once, when it ends, with the `grpc-status` its client received:
//! from the response headers for a trailers-only answer (an error before any message,
//! including bytes that do not decode), else from the trailers at the end of the body (so a
//! stream that fails halfway counts as that failure); a body dropped before its trailers
//! (the client went away) counts as `Cancelled`. HTTP requests are counted by the route the
//! router matched (`other` when none did); the latency predictor's routes are also counted
//! as RPCs, `http:<route>`, with the gRPC code name of their HTTP status, so a 200 is `Ok`
//! and never an error.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::MatchedPath;
use tonic::body::Body;

use super::gate::Gate;
use super::spans;
use crate::telemetry::Metrics;

/// The methods of `ditto.v1.Twin` (the `rpc` label; any other path counts as `other`).
pub const TWIN_METHODS: [&str; 8] = [
    "SyncClusterConfig",
    "PushInstanceState",
    "PushKvEvents",
    "GetSnapshot",
    "PredictRouting",
    "PredictRoutingStream",
    "ForecastCapacity",
    "AddTrainingSamples",
];

/// The RPCs that write the mirror (their refusals also count in
/// `ditto_write_rejections_total`).
const WRITES: [&str; 3] = ["SyncClusterConfig", "PushInstanceState", "PushKvEvents"];

/// The response header carrying a call's wall time until its answer was ready, µs (kept out
/// of the message so identical questions get identical bytes).
pub const WALL_TIME_HEADER: &str = "x-ditto-wall-time-us";

/// The `rpc` label of a gRPC path: its Twin method, or `other`.
pub fn twin_method(path: &str) -> &'static str {
    let method = path.strip_prefix("/ditto.v1.Twin/").unwrap_or("");
    TWIN_METHODS
        .iter()
        .copied()
        .find(|known| *known == method)
        .unwrap_or("other")
}

/// The name of a gRPC code as the metrics label it (`Ok`, `InvalidArgument`, ...).
pub fn code_name(code: tonic::Code) -> String {
    format!("{code:?}")
}

/// The gRPC code a response header map carries in `grpc-status`, if any.
fn grpc_status(headers: &http::HeaderMap) -> Option<tonic::Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    value.trim().parse::<i32>().ok().map(tonic::Code::from_i32)
}

/// Records one finished call, once.
struct Finish {
    metrics: Arc<Metrics>,
    rpc: &'static str,
    started: Instant,
    done: bool,
}

impl Finish {
    fn record(&mut self, code: tonic::Code) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let code = code_name(code);
        self.metrics
            .observe_rpc(self.rpc, &code, self.started.elapsed().as_secs_f64());
        if code != "Ok" && WRITES.contains(&self.rpc) {
            self.metrics
                .write_rejections
                .with_label_values(&[self.rpc, &code])
                .inc();
        }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        // The body went away before its trailers: the client cancelled or disconnected.
        self.record(tonic::Code::Cancelled);
    }
}

/// A response body that records its call when its trailers pass (or it is dropped).
struct Observed {
    body: Body,
    finish: Finish,
}

impl http_body::Body for Observed {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = grpc_status(trailers).unwrap_or(tonic::Code::Unknown);
                    self.finish.record(code);
                }
            }
            Poll::Ready(Some(Err(status))) => {
                let code = status.code();
                self.finish.record(code);
            }
            Poll::Ready(None) => self.finish.record(tonic::Code::Unknown),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The observation layer in front of the gRPC services (`server::gate`): a span per call
/// (continuing the caller's W3C trace), its count and duration by the code its client saw,
/// the wall time header.
#[derive(Clone, Debug)]
pub struct ObserveGrpc {
    metrics: Arc<Metrics>,
}

impl ObserveGrpc {
    /// Observes calls into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

/// A call being observed: its span and what records its end.
pub struct Observing {
    span: tracing::Span,
    finish: Finish,
}

impl std::fmt::Debug for Observing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observing")
            .field("rpc", &self.finish.rpc)
            .finish_non_exhaustive()
    }
}

impl Gate for ObserveGrpc {
    type Pass = Observing;

    fn admit<B>(&self, request: &http::Request<B>) -> Result<Observing, Box<tonic::Status>> {
        let rpc = twin_method(request.uri().path());
        let span = spans::grpc_request(rpc, request.headers());
        Ok(Observing {
            span,
            finish: Finish {
                metrics: Arc::clone(&self.metrics),
                rpc,
                started: Instant::now(),
                done: false,
            },
        })
    }

    fn span(pass: &Observing) -> tracing::Span {
        pass.span.clone()
    }

    fn respond(pass: Observing, mut response: http::Response<Body>) -> http::Response<Body> {
        let mut finish = pass.finish;
        if let Some(code) = grpc_status(response.headers()) {
            // Trailers-only: the call ended before any message.
            finish.record(code);
            return response;
        }
        let wall_us = u64::try_from(finish.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        response
            .headers_mut()
            .insert(WALL_TIME_HEADER, http::HeaderValue::from(wall_us));
        response.map(|body| Body::new(Observed { body, finish }))
    }
}

/// The route label of an HTTP request: the route the router matched, or `other`.
fn route_of(request: &axum::extract::Request) -> String {
    request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |path| path.as_str().to_owned())
}

/// The gRPC code an HTTP status means, for the predictor's calls counted as RPCs.
pub fn http_code(status: http::StatusCode) -> tonic::Code {
    use http::StatusCode as S;
    match status {
        s if s.is_success() => tonic::Code::Ok,
        S::BAD_REQUEST | S::UNPROCESSABLE_ENTITY => tonic::Code::InvalidArgument,
        S::UNAUTHORIZED => tonic::Code::Unauthenticated,
        S::FORBIDDEN => tonic::Code::PermissionDenied,
        S::NOT_FOUND => tonic::Code::NotFound,
        S::CONFLICT => tonic::Code::Aborted,
        S::PAYLOAD_TOO_LARGE | S::TOO_MANY_REQUESTS => tonic::Code::ResourceExhausted,
        S::REQUEST_TIMEOUT | S::GATEWAY_TIMEOUT => tonic::Code::DeadlineExceeded,
        S::SERVICE_UNAVAILABLE | S::BAD_GATEWAY => tonic::Code::Unavailable,
        S::NOT_IMPLEMENTED | S::METHOD_NOT_ALLOWED => tonic::Code::Unimplemented,
        s if s.is_client_error() => tonic::Code::FailedPrecondition,
        _ => tonic::Code::Internal,
    }
}

/// What [`observe_http`] needs: the metrics, and which routes are the latency predictor's
/// (also counted as RPCs).
#[derive(Clone, Debug)]
pub struct HttpObserver {
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The predictor API's routes, as the router spells them.
    pub predictor_routes: Arc<[&'static str]>,
}

/// Counts every HTTP request and its duration by matched route and status code, in a span;
/// the predictor's routes also as RPCs `http:<route>` with their status's gRPC code name.
/// Applied with `Router::layer`, so it sees the matched route.
pub async fn observe_http(
    axum::extract::State(observer): axum::extract::State<HttpObserver>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = route_of(&request);
    let span = spans::http_request(request.method(), &route, request.headers());
    let started = Instant::now();
    let response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", i64::from(status.as_u16()));
    let seconds = started.elapsed().as_secs_f64();
    observer
        .metrics
        .observe_http(&route, status.as_u16(), seconds);
    if observer.predictor_routes.contains(&route.as_str()) {
        let code = code_name(http_code(status));
        observer
            .metrics
            .observe_rpc(&format!("http:{route}"), &code, seconds);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_and_codes_have_bounded_names() {
        assert_eq!(
            twin_method("/ditto.v1.Twin/PredictRoutingStream"),
            "PredictRoutingStream"
        );
        assert_eq!(twin_method("/ditto.v1.Twin/Nope"), "other");
        assert_eq!(twin_method("/x"), "other");
        assert_eq!(code_name(tonic::Code::Ok), "Ok");
        assert_eq!(code_name(http_code(http::StatusCode::OK)), "Ok");
        assert_eq!(code_name(http_code(http::StatusCode::ACCEPTED)), "Ok");
        assert_eq!(
            http_code(http::StatusCode::UNPROCESSABLE_ENTITY),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            http_code(http::StatusCode::GATEWAY_TIMEOUT),
            tonic::Code::DeadlineExceeded
        );
        assert_eq!(
            http_code(http::StatusCode::INTERNAL_SERVER_ERROR),
            tonic::Code::Internal
        );
    }
}
