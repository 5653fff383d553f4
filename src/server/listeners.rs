//! The server's listeners: binding the gRPC, HTTP and metrics addresses, and serving each
//! (plain or over TLS) until the stop signal, for `run::start`.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::error::ServeError;
use super::service::ServerState;
use super::tls::{self, TlsAcceptors};

pub(super) async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

pub(super) async fn stopped(mut stop: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The gRPC and HTTP listeners, bound, and their local addresses.
pub(super) struct Listeners {
    pub(super) grpc: TcpListener,
    pub(super) http: TcpListener,
    pub(super) grpc_addr: SocketAddr,
    pub(super) http_addr: SocketAddr,
    /// The HTTP address asked for (named in a TLS setup error).
    pub(super) http_asked: SocketAddr,
}

/// Binds the gRPC, HTTP and (with `--metrics-addr`) metrics listeners, in that order.
pub(super) async fn bind_all(
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
) -> Result<(Listeners, Option<(SocketAddr, TcpListener)>), ServeError> {
    let grpc = bind(grpc_addr).await?;
    let http = bind(http_addr).await?;
    let metrics = match metrics_addr {
        Some(addr) => Some((addr, bind(addr).await?)),
        None => None,
    };
    let local = |listener: &TcpListener, addr: SocketAddr| {
        listener
            .local_addr()
            .map_err(|source| ServeError::Bind { addr, source })
    };
    let listeners = Listeners {
        grpc_addr: local(&grpc, grpc_addr)?,
        http_addr: local(&http, http_addr)?,
        grpc,
        http,
        http_asked: http_addr,
    };
    Ok((listeners, metrics))
}

pub(super) type ServeTasks = (
    JoinHandle<Result<(), tonic::transport::Error>>,
    JoinHandle<std::io::Result<()>>,
);

/// Serves `routes` on the gRPC listener and `router` on the HTTP one, plain or over TLS,
/// each until `stop`; returns their tasks.
pub(super) fn serve_main(
    listeners: Listeners,
    routes: tonic::transport::server::Router,
    router: axum::Router,
    (grpc_limits, http_limits): (super::grpc_conn::GrpcLimits, super::http_conn::HttpLimits),
    (shared, connections): (&ServerState, super::http_conn::ConnectionMetrics),
    tls: Option<&TlsAcceptors>,
    stop: &watch::Receiver<bool>,
) -> Result<ServeTasks, ServeError> {
    match tls {
        None => {
            let grpc = routes.serve_with_incoming_shutdown(
                super::grpc_conn::incoming(
                    listeners.grpc,
                    grpc_limits,
                    super::grpc_conn::GrpcConnectionMetrics::register(&shared.metrics)?,
                ),
                stopped(stop.clone()),
            );
            let http = super::http_conn::serve(
                listeners.http,
                router,
                http_limits,
                connections,
                stopped(stop.clone()),
            );
            Ok((tokio::spawn(grpc), tokio::spawn(http)))
        }
        Some(acceptors) => {
            let grpc = routes.serve_with_incoming_shutdown(
                tls::grpc_incoming(listeners.grpc, acceptors.grpc.clone()),
                stopped(stop.clone()),
            );
            let listener = tls::TlsListener::new(listeners.http, acceptors.http.clone()).map_err(
                |source| ServeError::Bind {
                    addr: listeners.http_asked,
                    source,
                },
            )?;
            let http = super::http_conn::serve(
                listener,
                router,
                http_limits,
                connections,
                stopped(stop.clone()),
            );
            Ok((tokio::spawn(grpc), tokio::spawn(http)))
        }
    }
}

/// Serves `probes` (metrics and the probes) on the `--metrics-addr` listener within the HTTP
/// limits but its own connection cap,
/// over TLS when the server has it, its connections counted apart
/// (`ditto_metrics_http_connections*`); returns the bound address and the task.
pub(super) fn serve_probes(
    addr: SocketAddr,
    listener: TcpListener,
    probes: axum::Router,
    (http, max_connections): (super::http_conn::HttpLimits, usize),
    shared: &ServerState,
    tls: Option<&TlsAcceptors>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, JoinHandle<std::io::Result<()>>), ServeError> {
    let limits = super::http_conn::HttpLimits {
        max_connections,
        ..http
    };
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let connections = super::http_conn::ConnectionMetrics::register_as(
        &shared.metrics,
        "ditto_metrics_http",
        "--metrics-max-connections",
    )?;
    let task = match tls {
        None => tokio::spawn(super::http_conn::serve(
            listener,
            probes,
            limits,
            connections,
            stop,
        )),
        Some(acceptors) => {
            let listener = tls::TlsListener::new(listener, acceptors.http.clone())
                .map_err(|source| ServeError::Bind { addr, source })?;
            tokio::spawn(super::http_conn::serve(
                listener,
                probes,
                limits,
                connections,
                stop,
            ))
        }
    };
    Ok((bound, task))
}
