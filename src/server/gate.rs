//! The one shape of the layers in front of the gRPC services (authentication, the drain
//! gate, observation): a [`Gate`] decides on each call before the service sees it
//! (answering it at once, or letting it through with what it keeps) and shapes the
//! service's response on the way out; [`Gated`] is the tower `Service` that runs a gate
//! around an inner service, written once.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;
use tower_service::Service;

/// What one layer does with a call.
pub trait Gate: Clone + Send + 'static {
    /// What the gate keeps from a call it lets through, until the response.
    type Pass: Send + 'static;

    /// Decides on `request` before the inner service sees it: `Err` is the refusal, sent at
    /// once as the call's status without calling the service (boxed: refusals are rare and
    /// a status is large).
    fn admit<B>(&self, request: &http::Request<B>) -> Result<Self::Pass, Box<Status>>;

    /// The span the inner service's call runs in (none by default).
    fn span(_pass: &Self::Pass) -> tracing::Span {
        tracing::Span::none()
    }

    /// The inner service's response as the client gets it.
    fn respond(pass: Self::Pass, response: http::Response<Body>) -> http::Response<Body>;
}

/// An inner gRPC service behind a gate.
#[derive(Clone, Debug)]
pub struct Gated<G, S> {
    gate: G,
    inner: S,
}

impl<G, S> Gated<G, S> {
    /// Puts `inner` behind `gate`.
    pub fn new(inner: S, gate: G) -> Self {
        Self { gate, inner }
    }
}

impl<G, S: NamedService> NamedService for Gated<G, S> {
    const NAME: &'static str = S::NAME;
}

impl<G, S, B> Service<http::Request<B>> for Gated<G, S>
where
    G: Gate,
    S: Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let pass = match self.gate.admit(&request) {
            Ok(pass) => pass,
            Err(refusal) => return Box::pin(std::future::ready(Ok(refusal.into_http()))),
        };
        // The ready inner service serves this call; the clone is the next call's.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let call = tracing::Instrument::instrument(inner.call(request), G::span(&pass));
        Box::pin(async move {
            let response = call.await?;
            Ok(G::respond(pass, response))
        })
    }
}
