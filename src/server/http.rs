//! The HTTP side of the server: `/metrics` (Prometheus text format), `/healthz` (the
//! process is up) and `/readyz` (a config is synced and the server is not shutting down),
//! both with the latency predictor's JSON bodies.
//! With a bearer token required on reads, `/metrics` answers 401 without it; the probes
//! never need it.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use prometheus::IntCounterVec;

use super::auth::AuthPolicy;
use super::deadline::wall_now_us;
use super::observe::{HttpObserver, observe_http};
use super::service::Shared;

/// The HTTP routes over the server's shared state, with the latency predictor API
/// (`server::predictor`) merged in; `auth` guards `/metrics` (a read), its refusals counted
/// in `rejections`.
pub fn router(
    shared: Arc<Shared>,
    predictor: Arc<super::predictor::Predictor>,
    auth: Arc<AuthPolicy>,
    rejections: IntCounterVec,
) -> Router {
    let auth_predictor = Arc::clone(&auth);
    let rejections_predictor = rejections.clone();
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
        .route("/readyz", {
            let predictor = Arc::clone(&predictor);
            get(move || async move { super::predictor::readyz(&predictor) })
        })
        .with_state(Arc::clone(&shared))
        .merge(super::predictor::router(predictor).route_layer(
            axum::middleware::from_fn_with_state(
                (auth_predictor, rejections_predictor),
                guard_predictor,
            ),
        ))
        .layer(axum::middleware::from_fn_with_state(
            HttpObserver {
                metrics: Arc::clone(&shared.metrics),
                predictor_routes: Arc::from(super::predictor::RPC_ROUTES),
            },
            observe_http,
        ))
}

/// The latency predictor API's paths that change state (training samples, flush, reload):
/// writes, so they need the token whenever one is configured.
const PREDICTOR_WRITES: [&str; 3] = ["/add_training_data_bulk", "/flush", "/reload"];

/// Applies the bearer-token policy to the latency predictor API: writes always, reads
/// (predictions, status) with `--auth-reads`. Runs on matched routes only, so the refusal
/// label is one of the API's own paths.
async fn guard_predictor(
    State((auth, rejections)): State<(Arc<AuthPolicy>, IntCounterVec)>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path().to_owned();
    let write = PREDICTOR_WRITES.contains(&path.as_str());
    if auth.allows(write, request.headers()) {
        next.run(request).await
    } else {
        // The route the router matched (`/model/{name}/info`), not the path: a client must
        // not grow the label set.
        let route = request
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .map_or("other", axum::extract::MatchedPath::as_str);
        rejections.with_label_values(&[route]).inc();
        unauthorized()
    }
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

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
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
