//! Graceful lifecycle of the gRPC Twin service: a drain gate in front of it that counts the
//! calls in flight and, once shutdown begins, refuses new ones with UNAVAILABLE while the
//! listeners stay up (so health checks and `/readyz` report NOT_SERVING during the drain
//! instead of failing to connect).
//!
//! A call counts from the moment it reaches the service until its response body is done
//! (for streams: until the stream ends), so a push stream or a prediction stream open at
//! SIGTERM finishes like a unary call does. Health and reflection are not gated: a health
//! `Watch` stream must never hold the drain open. Background loops subscribe to
//! [`Lifecycle::draining`] and stop when it turns true.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use prometheus::IntGauge;
use tokio::sync::{Notify, watch};
use tonic::Status;
use tonic::body::Body;

use super::gate::Gate;

/// Name of the gauge of Twin calls in flight.
pub const IN_FLIGHT_METRIC: &str = "ditto_grpc_requests_in_flight";

/// Whether the server is draining and how many Twin calls are in flight.
#[derive(Debug)]
pub struct Lifecycle {
    draining: AtomicBool,
    draining_tx: watch::Sender<bool>,
    in_flight: AtomicUsize,
    idle: Notify,
    gauge: IntGauge,
}

impl Lifecycle {
    /// A serving (not draining) lifecycle with no call in flight; `gauge` mirrors the count.
    pub fn new(gauge: IntGauge) -> Self {
        Self {
            draining: AtomicBool::new(false),
            draining_tx: watch::Sender::new(false),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            gauge,
        }
    }

    /// The gauge of Twin calls in flight (unregistered; the caller registers it).
    pub fn in_flight_gauge() -> Result<IntGauge, prometheus::Error> {
        IntGauge::new(
            IN_FLIGHT_METRIC,
            "ditto.v1.Twin calls in flight (streams count until they end).",
        )
    }

    /// Twin calls in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// True once shutdown began.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// A receiver that turns true when shutdown begins: background loops select on it.
    pub fn draining(&self) -> watch::Receiver<bool> {
        self.draining_tx.subscribe()
    }

    /// Refuses new Twin calls from now on and tells background loops to stop.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.draining_tx.send_replace(true);
        // Wakes a waiter that raced with the last call ending before the flag was set.
        self.idle.notify_waiters();
    }

    /// Resolves when no Twin call is in flight (at once if none is).
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            // Register before checking, so a call ending in between is not missed.
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Admits a call (None once draining); the guard counts it until dropped.
    fn enter(self: &Arc<Self>) -> Option<InFlight> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.gauge.inc();
        let guard = InFlight {
            lifecycle: Arc::clone(self),
        };
        // Checked after counting: a drain that saw zero calls cannot miss this one.
        if self.is_draining() {
            return None;
        }
        Some(guard)
    }
}

/// One admitted call; dropping it ends the call's count.
#[derive(Debug)]
pub struct InFlight {
    lifecycle: Arc<Lifecycle>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.lifecycle.gauge.dec();
        if self.lifecycle.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.lifecycle.idle.notify_waiters();
        }
    }
}

/// A response body that holds its call's [`InFlight`] guard until the body is dropped.
struct Guarded {
    body: Body,
    _call: InFlight,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The drain gate in front of the gRPC services (`server::gate`): counts their calls,
/// refuses new ones with UNAVAILABLE once draining.
#[derive(Clone, Debug)]
pub struct DrainGate {
    lifecycle: Arc<Lifecycle>,
}

impl DrainGate {
    /// Gates by `lifecycle`.
    pub fn new(lifecycle: Arc<Lifecycle>) -> Self {
        Self { lifecycle }
    }
}

impl Gate for DrainGate {
    type Pass = InFlight;

    fn admit<B>(&self, _request: &http::Request<B>) -> Result<InFlight, Box<Status>> {
        self.lifecycle.enter().ok_or_else(|| {
            Box::new(Status::unavailable(
                "ditto is shutting down (draining); send this call to another replica",
            ))
        })
    }

    fn respond(call: InFlight, response: http::Response<Body>) -> http::Response<Body> {
        response.map(|body| Body::new(Guarded { body, _call: call }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lifecycle() -> Arc<Lifecycle> {
        Arc::new(Lifecycle::new(
            Lifecycle::in_flight_gauge().expect("valid gauge"),
        ))
    }

    #[tokio::test]
    async fn calls_are_counted_until_dropped_and_refused_once_draining() {
        let lifecycle = lifecycle();
        let first = lifecycle.enter().expect("serving admits");
        let second = lifecycle.enter().expect("serving admits");
        assert_eq!(lifecycle.in_flight(), 2);
        assert_eq!(lifecycle.gauge.get(), 2);
        lifecycle.begin_drain();
        assert!(*lifecycle.draining().borrow());
        assert!(lifecycle.enter().is_none(), "draining refuses");
        assert_eq!(lifecycle.in_flight(), 2, "a refused call is not counted");
        drop(first);
        let waiter = {
            let lifecycle = Arc::clone(&lifecycle);
            tokio::spawn(async move { lifecycle.idle().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one call still in flight");
        drop(second);
        waiter.await.expect("idle resolves once the last call ends");
        assert_eq!(lifecycle.gauge.get(), 0);
    }

    #[tokio::test]
    async fn idle_resolves_at_once_with_nothing_in_flight() {
        let lifecycle = lifecycle();
        lifecycle.idle().await;
        lifecycle.begin_drain();
        lifecycle.idle().await;
    }
}
