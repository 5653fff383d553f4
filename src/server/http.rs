//! The HTTP side of the server: `/metrics` (Prometheus text format), `/healthz` (the
//! process is up) and `/readyz` (a config is synced and the server is not shutting down).
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
use super::service::Shared;

/// The HTTP routes over the server's shared state; `auth` guards `/metrics` (a read), its
/// refusals counted in `rejections`.
pub fn router(shared: Arc<Shared>, auth: Arc<AuthPolicy>, rejections: IntCounterVec) -> Router {
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
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(shared)
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
