//! The HTTP side of the server: `/metrics` (Prometheus text format), `/healthz` (the
//! process is up) and `/readyz` (a config is synced and the server is not shutting down).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::deadline::wall_now_us;
use super::service::Shared;

/// The HTTP routes over the server's shared state, with the latency predictor API
/// (`server::predictor`) merged in.
pub fn router(shared: Arc<Shared>, predictor: Arc<super::predictor::Predictor>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(shared)
        .merge(super::predictor::router(predictor))
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

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    if shared.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}
