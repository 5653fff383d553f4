//! The HTTP listener's connection handling, bounded against slow and greedy clients: a cap
//! on open connections (beyond it a new connection is closed at once and counted), a
//! timeout on reading each request's headers (hyper's; it also closes idle keep-alive
//! connections), and, for the routes that read a body, a limit on its size (413, at once
//! when `Content-Length` announces more) and a timeout on receiving it (408).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus::{IntCounter, IntGauge};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::telemetry::Metrics;

/// Bounds of the HTTP listener (`--http-*` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest a client may take to send a request's headers (and longest an idle
    /// keep-alive connection stays open).
    pub header_read_timeout: Duration,
    /// Most connections open at once; beyond, new ones are closed at once.
    pub max_connections: usize,
    /// How the routes that read a body bound it.
    pub body: BodyLimits,
}

/// Bounds of a request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyLimits {
    /// Largest body, bytes (more: 413).
    pub max_bytes: usize,
    /// Longest a client may take to send the whole body (more: 408).
    pub read_timeout: Duration,
    /// Most body bytes held at once over every request of the listener, read or being
    /// read, until each request is answered (more: 503 at once). Without it, 32 uploads
    /// stalled one byte short of 63 MB held 2.3 GB (issue 38 D3).
    pub max_in_flight_bytes: usize,
}

impl BodyLimits {
    /// 64 MiB (a 10 000-entry bulk call is about 3 MB) within 30 s; 128 MiB in flight.
    pub const DEFAULT: Self = Self {
        max_bytes: 64 * 1024 * 1024,
        read_timeout: Duration::from_secs(30),
        max_in_flight_bytes: 128 * 1024 * 1024,
    };

    /// The budget the bodies of one listener share ([`limit_body`]'s state), in KiB
    /// permits.
    pub fn in_flight_budget(&self) -> Arc<Semaphore> {
        let permits = self
            .max_in_flight_bytes
            .div_ceil(1024)
            .min(Semaphore::MAX_PERMITS);
        Arc::new(Semaphore::new(permits))
    }
}

impl HttpLimits {
    /// Headers within 10 s, 1024 connections, [`BodyLimits::DEFAULT`].
    pub const DEFAULT: Self = Self {
        header_read_timeout: Duration::from_secs(10),
        max_connections: 1024,
        body: BodyLimits::DEFAULT,
    };
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The connection metrics.
#[derive(Clone, Debug)]
pub struct ConnectionMetrics {
    open: IntGauge,
    refused: IntCounter,
}

impl ConnectionMetrics {
    /// Registers `ditto_http_connections` and `ditto_http_connections_refused_total`.
    pub fn register(metrics: &Metrics) -> Result<Self, prometheus::Error> {
        Self::register_as(metrics, "ditto_http", "--http-max-connections")
    }

    /// Registers `<prefix>_connections` and `<prefix>_connections_refused_total` for a
    /// listener whose cap is set by `flag`.
    pub fn register_as(
        metrics: &Metrics,
        prefix: &str,
        flag: &str,
    ) -> Result<Self, prometheus::Error> {
        let open = IntGauge::new(
            format!("{prefix}_connections"),
            format!("HTTP connections open (at most {flag})."),
        )?;
        let refused = IntCounter::new(
            format!("{prefix}_connections_refused_total"),
            format!("HTTP connections closed on arrival because {flag} were open."),
        )?;
        metrics.register(Box::new(open.clone()))?;
        metrics.register(Box::new(refused.clone()))?;
        Ok(Self { open, refused })
    }
}

/// Decrements the open-connection gauge when a connection's task ends, however it ends.
struct OpenConnection(IntGauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Serves `router` over HTTP/1.1 on `listener` within `limits` until `stop` resolves; then
/// stops accepting, lets every connection finish its request in flight, and returns once
/// all are closed. Each request carries its connection's peer address as
/// `axum::extract::ConnectInfo<SocketAddr>`.
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: HttpLimits,
    metrics: ConnectionMetrics,
    stop: impl Future<Output = ()> + Send,
) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
{
    // Permits are u32 (acquire_many); the flag is validated far below.
    let capacity = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let slots = Arc::new(Semaphore::new(capacity as usize));
    let (stopping, stopped) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            metrics.refused.inc();
            drop(io);
            continue;
        };
        metrics.open.inc();
        let open = OpenConnection(metrics.open.clone());
        let inner = TowerToHyperService::new(router.clone());
        let service = hyper::service::service_fn(
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                hyper::service::Service::call(&inner, request)
            },
        );
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _open = open;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .keep_alive(true);
            let connection = builder.serve_connection(TokioIo::new(io), service);
            tokio::pin!(connection);
            let stop = async move {
                // An error means the sender is gone, which also means stop.
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(err) = result {
                        tracing::debug!(%err, "HTTP connection ended with an error");
                    }
                }
                () = stop => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    // Every connection holds a slot until it closes.
    let _all_closed = slots.acquire_many(capacity).await;
    Ok(())
}

fn refusal(status: StatusCode, detail: String) -> Response {
    let body = serde_json::json!({ "detail": detail }).to_string();
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            // The rest of the body is not read: the connection cannot be reused.
            (header::CONNECTION, "close"),
        ],
        body,
    )
        .into_response()
}

/// Why a body was not read whole.
enum BodyReadError {
    /// More than the limit arrived.
    TooLarge,
    /// The listener's bodies in flight already hold the budget.
    Busy,
    /// The connection failed mid-body.
    Failed,
}

/// Reads a body of at most `max_bytes` into one buffer, sized from `Content-Length` when it
/// was announced (within the limit), so a body is held once: collecting its frames and then
/// joining them (axum's `to_bytes`) held it twice at the peak (issue 38 D2). A capacity is
/// only reserved, not touched: a stalled upload costs what has arrived. Every KiB that
/// arrives takes a permit of `budget` first; the permits come back when the returned guard
/// is dropped (after the answer). A body whose announced length is more than `budget` has
/// left is refused before any of it is read (it would be refused part-way otherwise, each
/// refused body's first bytes held until the allocator gave them back).
async fn read_body(
    mut body: Body,
    max_bytes: usize,
    announced: Option<u64>,
    budget: &Arc<Semaphore>,
) -> Result<(bytes::Bytes, Option<OwnedSemaphorePermit>), BodyReadError> {
    use http_body_util::BodyExt;

    let expected = announced.map_or(0, |length| length.min(max_bytes as u64) as usize);
    if expected.div_ceil(1024) > budget.available_permits() {
        // It would be refused part-way anyway: refuse it before holding any of its bytes.
        return Err(BodyReadError::Busy);
    }
    let mut buffer = Vec::with_capacity(expected);
    let mut held: Option<OwnedSemaphorePermit> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| BodyReadError::Failed)?;
        if let Ok(data) = frame.into_data() {
            let total = buffer.len() + data.len();
            if total > max_bytes {
                return Err(BodyReadError::TooLarge);
            }
            let held_kib = held.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
            let more = total.div_ceil(1024).saturating_sub(held_kib);
            if more > 0 {
                let permit = u32::try_from(more)
                    .ok()
                    .and_then(|n| Arc::clone(budget).try_acquire_many_owned(n).ok())
                    .ok_or(BodyReadError::Busy)?;
                match &mut held {
                    Some(held) => held.merge(permit),
                    None => held = Some(permit),
                }
            }
            buffer.extend_from_slice(&data);
        }
    }
    Ok((bytes::Bytes::from(buffer), held))
}

/// Reads the request body within `limits` before the handler runs: 413 (JSON `detail`)
/// when `Content-Length` announces more than the limit or more arrives, 503 when the
/// listener's bodies in flight already hold `budget` (shared by every request; taken as the
/// bytes arrive, given back once the request is answered), 408 when the body does not arrive
/// within the read timeout, 400 when the connection fails mid-body.
pub async fn limit_body(
    State((limits, budget)): State<(BodyLimits, Arc<Semaphore>)>,
    request: Request,
    next: Next,
) -> Response {
    let too_large = || {
        refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "request body larger than {} bytes (--http-max-body-bytes)",
                limits.max_bytes
            ),
        )
    };
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if announced.is_some_and(|length| length > limits.max_bytes as u64) {
        return too_large();
    }
    let (parts, body) = request.into_parts();
    let read = read_body(body, limits.max_bytes, announced, &budget);
    match tokio::time::timeout(limits.read_timeout, read).await {
        Ok(Ok((bytes, held))) => {
            let response = next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await;
            drop(held);
            response
        }
        Ok(Err(BodyReadError::TooLarge)) => too_large(),
        Ok(Err(BodyReadError::Busy)) => refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the request bodies being read already hold {} bytes \
                 (--http-max-body-bytes-in-flight); retry",
                limits.max_in_flight_bytes
            ),
        ),
        Ok(Err(BodyReadError::Failed)) => refusal(
            StatusCode::BAD_REQUEST,
            "the request body could not be read".to_owned(),
        ),
        Err(_) => refusal(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "request body not received within {} ms (--http-body-read-timeout-ms)",
                limits.read_timeout.as_millis()
            ),
        ),
    }
}
