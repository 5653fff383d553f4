//! The `ditto serve` flags bounding the HTTP listeners and the plaintext gRPC listener
//! against slow and greedy clients (`server::http_conn`, `server::grpc_conn`).

use std::time::Duration;

use clap::Args;

use super::error::ServeCommandError;
use crate::server::grpc_conn::GrpcLimits;
use crate::server::http_conn::{BodyLimits, HttpLimits};
use crate::server::run::DEFAULT_METRICS_MAX_CONNECTIONS;

/// Most connections the cap may be set to (each holds a file descriptor and a task).
const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;

/// Flags of the HTTP listener.
#[derive(Clone, Debug, Args)]
pub struct HttpArgs {
    /// Longest a client may take to send a request's headers, milliseconds; an idle
    /// keep-alive connection is closed after it too.
    #[arg(long, env = "DITTO_HTTP_HEADER_READ_TIMEOUT_MS", default_value_t = HttpLimits::DEFAULT.header_read_timeout.as_millis() as u64)]
    pub http_header_read_timeout_ms: u64,
    /// Longest a client may take to send a request body, milliseconds (then 408).
    #[arg(long, env = "DITTO_HTTP_BODY_READ_TIMEOUT_MS", default_value_t = BodyLimits::DEFAULT.read_timeout.as_millis() as u64)]
    pub http_body_read_timeout_ms: u64,
    /// Largest request body, bytes (more, or a Content-Length announcing more: 413).
    #[arg(long, env = "DITTO_HTTP_MAX_BODY_BYTES", default_value_t = BodyLimits::DEFAULT.max_bytes)]
    pub http_max_body_bytes: usize,
    /// Most request-body bytes held at once over every request, read or being read (more:
    /// 503 at once); at least --http-max-body-bytes.
    #[arg(long, env = "DITTO_HTTP_MAX_BODY_BYTES_IN_FLIGHT", default_value_t = BodyLimits::DEFAULT.max_in_flight_bytes)]
    pub http_max_body_bytes_in_flight: usize,
    /// Most HTTP connections open at once; a connection beyond is closed on arrival.
    #[arg(long, env = "DITTO_HTTP_MAX_CONNECTIONS", default_value_t = HttpLimits::DEFAULT.max_connections)]
    pub http_max_connections: usize,
    /// Most connections open at once on the --metrics-addr listener (probes and Prometheus),
    /// counted apart from --http-max-connections.
    #[arg(long, env = "DITTO_METRICS_MAX_CONNECTIONS", default_value_t = DEFAULT_METRICS_MAX_CONNECTIONS)]
    pub metrics_max_connections: usize,
    /// Most plaintext gRPC connections open at once; a connection beyond is closed on
    /// arrival.
    #[arg(long, env = "DITTO_GRPC_MAX_CONNECTIONS", default_value_t = GrpcLimits::DEFAULT.max_connections)]
    pub grpc_max_connections: usize,
    /// Longest a new plaintext gRPC connection may stay silent before it is closed,
    /// milliseconds (an HTTP/2 client sends its preface at once; TLS has its own 10 s
    /// handshake bound).
    #[arg(long, env = "DITTO_GRPC_FIRST_BYTE_TIMEOUT_MS", default_value_t = GrpcLimits::DEFAULT.first_byte_timeout.as_millis() as u64)]
    pub grpc_first_byte_timeout_ms: u64,
}

fn flag_error(flag: &'static str, reason: impl Into<String>) -> ServeCommandError {
    ServeCommandError::BadFlag {
        flag,
        reason: reason.into(),
    }
}

impl HttpArgs {
    /// The plaintext gRPC listener's bounds, or the flag that is out of range.
    pub fn grpc_limits(&self) -> Result<GrpcLimits, ServeCommandError> {
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&self.grpc_max_connections) {
            return Err(flag_error(
                "grpc-max-connections",
                format!("must be in [1, {MAX_CONNECTIONS_LIMIT}]"),
            ));
        }
        if self.grpc_first_byte_timeout_ms == 0 {
            return Err(flag_error(
                "grpc-first-byte-timeout-ms",
                "must be at least 1",
            ));
        }
        Ok(GrpcLimits {
            max_connections: self.grpc_max_connections,
            first_byte_timeout: Duration::from_millis(self.grpc_first_byte_timeout_ms),
        })
    }

    /// The metrics listener's connection cap, or the flag that is out of range.
    pub fn metrics_max_connections(&self) -> Result<usize, ServeCommandError> {
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&self.metrics_max_connections) {
            return Err(flag_error(
                "metrics-max-connections",
                format!("must be in [1, {MAX_CONNECTIONS_LIMIT}]"),
            ));
        }
        Ok(self.metrics_max_connections)
    }

    /// The listener's bounds, or the flag that is out of range.
    pub fn limits(&self) -> Result<HttpLimits, ServeCommandError> {
        if self.http_header_read_timeout_ms == 0 {
            return Err(flag_error(
                "http-header-read-timeout-ms",
                "must be at least 1",
            ));
        }
        if self.http_body_read_timeout_ms == 0 {
            return Err(flag_error(
                "http-body-read-timeout-ms",
                "must be at least 1",
            ));
        }
        if self.http_max_body_bytes == 0 {
            return Err(flag_error("http-max-body-bytes", "must be at least 1"));
        }
        if self.http_max_body_bytes_in_flight < self.http_max_body_bytes {
            return Err(flag_error(
                "http-max-body-bytes-in-flight",
                format!(
                    "{} is under --http-max-body-bytes {}: a body of the largest size could never be read",
                    self.http_max_body_bytes_in_flight, self.http_max_body_bytes
                ),
            ));
        }
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&self.http_max_connections) {
            return Err(flag_error(
                "http-max-connections",
                format!("must be in [1, {MAX_CONNECTIONS_LIMIT}]"),
            ));
        }
        Ok(HttpLimits {
            header_read_timeout: Duration::from_millis(self.http_header_read_timeout_ms),
            max_connections: self.http_max_connections,
            body: BodyLimits {
                max_bytes: self.http_max_body_bytes,
                read_timeout: Duration::from_millis(self.http_body_read_timeout_ms),
                max_in_flight_bytes: self.http_max_body_bytes_in_flight,
            },
        })
    }
}
