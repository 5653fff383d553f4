//! The HTTP side of the server: `/metrics` (Prometheus text format), `/healthz` (the
//! process is up) and `/readyz` (a config is synced and the server is not shutting down),
//! both with the latency predictor's JSON bodies.
//! With a bearer token required on reads, `/metrics` answers 401 without it; the probes
//! never need it. The predictor API's writes from a peer other than loopback need a token or
//! `--allow-remote-writes` (403 otherwise). With `--metrics-addr`, [`probe_router`] alone
//! serves a second listener, so a client holding the API listener's connections cannot
//! starve the kubelet's probes or Prometheus.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use prometheus::IntCounterVec;

use super::auth::{AuthPolicy, REMOTE_WRITE_REFUSED, Verdict};
use super::deadline::wall_now_us;
use super::observe::{HttpObserver, observe_http};
use super::service::ServerState;

/// The probe and Prometheus routes: `/metrics` (guarded by `auth` as a read, refusals counted
/// in `rejections`), `/healthz`, `/readyz`. Alone they are the `--metrics-addr` listener;
/// [`router`] serves them beside the predictor API.
pub fn probe_router(
    shared: Arc<ServerState>,
    predictor: Arc<super::predictor::Predictor>,
    auth: Arc<AuthPolicy>,
    rejections: IntCounterVec,
) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move |state, headers: HeaderMap| async move {
                if auth.allows(false, &headers) {
                    metrics(state).await
                } else {
                    rejections.with_label_values(&["/metrics"]).inc();
                    unauthorized()
                }
            }),
        )
        .route("/healthz", get(|| async { super::predictor::healthz() }))
        .route(
            "/readyz",
            get(move || async move { super::predictor::readyz(&predictor) }),
        )
        .with_state(shared)
}

/// The observation of every HTTP request (`ditto_http_requests_total`, the predictor's
/// RPC series) over `routes`.
pub fn observed(routes: Router, shared: &ServerState) -> Router {
    routes.layer(axum::middleware::from_fn_with_state(
        HttpObserver {
            metrics: Arc::clone(&shared.metrics),
            predictor_routes: Arc::from(super::predictor::RPC_ROUTES),
        },
        observe_http,
    ))
}

/// The HTTP routes over the server's shared state: the probes and `/metrics`
/// ([`probe_router`]) with the latency predictor API (`server::predictor`) merged in; `auth`
/// guards `/metrics` (a read) and the predictor's calls (writes from a peer other than
/// loopback need a token or `--allow-remote-writes`), its refusals counted in `rejections`.
pub fn router(
    shared: Arc<ServerState>,
    predictor: Arc<super::predictor::Predictor>,
    auth: Arc<AuthPolicy>,
    rejections: IntCounterVec,
) -> Router {
    let probes = probe_router(
        Arc::clone(&shared),
        Arc::clone(&predictor),
        Arc::clone(&auth),
        rejections.clone(),
    );
    let routes = probes.merge(super::predictor::router(predictor).route_layer(
        axum::middleware::from_fn_with_state((auth, rejections), guard_predictor),
    ));
    observed(routes, &shared)
}

/// The latency predictor API's paths that change state (training samples, flush, reload):
/// writes, so they need the token whenever one is configured.
const PREDICTOR_WRITES: [&str; 3] = ["/add_training_data_bulk", "/flush", "/reload"];

/// Applies the policy to the latency predictor API: with a token, writes always need it and
/// reads (predictions, status) with `--auth-reads` (else 401); without one, writes from a
/// peer other than loopback are refused with 403 unless `--allow-remote-writes`. Runs on
/// matched routes only, so the refusal label is one of the API's own paths.
async fn guard_predictor(
    State((auth, rejections)): State<(Arc<AuthPolicy>, IntCounterVec)>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path().to_owned();
    let write = PREDICTOR_WRITES.contains(&path.as_str());
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip());
    let verdict = auth.verdict(write, request.headers(), peer);
    if verdict == Verdict::Allow {
        next.run(request).await
    } else {
        // The route the router matched (`/model/{name}/info`), not the path: a client must
        // not grow the label set.
        let route = request
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .map_or("other", axum::extract::MatchedPath::as_str);
        rejections.with_label_values(&[route]).inc();
        if verdict == Verdict::RemoteWrite {
            remote_write_refused()
        } else {
            unauthorized()
        }
    }
}

/// 403 with the peer's JSON `detail`, naming the ways out.
fn remote_write_refused() -> Response {
    let body = serde_json::json!({ "detail": REMOTE_WRITE_REFUSED }).to_string();
    (
        StatusCode::FORBIDDEN,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// 401 with the scheme to use.
fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "missing or wrong bearer token\n",
    )
        .into_response()
}

async fn metrics(State(shared): State<Arc<ServerState>>) -> Response {
    if let Some(stored) = shared.store.latest() {
        shared
            .metrics
            .observe_snapshot(&stored.snapshot, wall_now_us());
    }
    match shared.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}
