//! The plaintext gRPC listener's connections, bounded: at most `max_connections` open (one
//! more is closed on arrival and counted), and a connection whose client sends nothing
//! within `first_byte_timeout` of connecting is closed.
//!
//! Why: tonic takes every connection it is handed and waits on it for ever. 4,200 idle
//! plaintext connections (~30 KB each) exhausted the process's 4,096 file descriptors, after
//! which new clients and `/healthz` timed out (issue 38 D6). Over TLS the handshake timeout
//! already closed them at 10 s; this gives plaintext the same bound, and both a count.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus::{IntCounter, IntGauge};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::telemetry::Metrics;

/// Bounds of the plaintext gRPC listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest a new connection may stay silent (an HTTP/2 client sends its preface at
    /// once).
    pub first_byte_timeout: Duration,
}

impl GrpcLimits {
    /// 1,024 connections; 10 s to the first byte (as the TLS handshake's bound).
    pub const DEFAULT: Self = Self {
        max_connections: 1024,
        first_byte_timeout: Duration::from_secs(10),
    };
}

/// The gRPC listener's connection metrics.
#[derive(Clone, Debug)]
pub struct GrpcConnectionMetrics {
    open: IntGauge,
    refused: IntCounter,
    silent: IntCounter,
}

impl GrpcConnectionMetrics {
    /// Registers `ditto_grpc_connections`, `ditto_grpc_connections_refused_total` and
    /// `ditto_grpc_connections_silent_total`.
    pub fn register(metrics: &Metrics) -> Result<Self, prometheus::Error> {
        let open = IntGauge::new(
            "ditto_grpc_connections",
            "Plaintext gRPC connections open (at most --grpc-max-connections).",
        )?;
        let refused = IntCounter::new(
            "ditto_grpc_connections_refused_total",
            "gRPC connections closed on arrival: --grpc-max-connections were open.",
        )?;
        let silent = IntCounter::new(
            "ditto_grpc_connections_silent_total",
            "gRPC connections closed because the client sent nothing within \
             --grpc-first-byte-timeout-ms.",
        )?;
        metrics.register(Box::new(open.clone()))?;
        metrics.register(Box::new(refused.clone()))?;
        metrics.register(Box::new(silent.clone()))?;
        Ok(Self {
            open,
            refused,
            silent,
        })
    }
}

/// How many accepted connections may wait to be taken by tonic.
const ACCEPTED_BACKLOG: usize = 64;

/// Accepts plaintext connections on `listener` within `limits`, for tonic's
/// `serve_with_incoming_shutdown`. Stops when tonic drops the stream.
pub fn incoming(
    listener: TcpListener,
    limits: GrpcLimits,
    metrics: GrpcConnectionMetrics,
) -> impl tokio_stream::Stream<Item = Result<BoundedStream, io::Error>> {
    let (sender, receiver) = mpsc::channel(ACCEPTED_BACKLOG);
    let slots = Arc::new(Semaphore::new(
        limits.max_connections.min(Semaphore::MAX_PERMITS),
    ));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = sender.closed() => return,
            };
            let tcp = match accepted {
                Ok((tcp, _peer)) => tcp,
                Err(err) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%err, "accepting a gRPC connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                metrics.refused.inc();
                drop(tcp);
                continue;
            };
            // TCP_NODELAY: without it small responses wait for delayed ACKs (~40 ms).
            let _ = tcp.set_nodelay(true);
            let (sender, metrics) = (sender.clone(), metrics.clone());
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                match tokio::time::timeout(limits.first_byte_timeout, tcp.peek(&mut first)).await {
                    Ok(Ok(n)) if n > 0 => {
                        metrics.open.inc();
                        let stream = BoundedStream {
                            tcp,
                            _slot: slot,
                            open: metrics.open.clone(),
                        };
                        // The server stopped taking connections: dropping this one is right.
                        let _ = sender.send(Ok(stream)).await;
                    }
                    Ok(_) => {}
                    Err(_) => metrics.silent.inc(),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

/// One plaintext gRPC connection holding its slot until it closes.
pub struct BoundedStream {
    tcp: TcpStream,
    _slot: OwnedSemaphorePermit,
    open: IntGauge,
}

impl Drop for BoundedStream {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl std::fmt::Debug for BoundedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BoundedStream")
    }
}

impl Connected for BoundedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tcp.connect_info()
    }
}

impl AsyncRead for BoundedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for BoundedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
