//! The one place where the twin's errors become gRPC statuses, and the server's own
//! startup errors.
//!
//! Mapping: `InvalidArgument` → INVALID_ARGUMENT (message `field.path: reason`), `NotFound`
//! → NOT_FOUND, `FailedPrecondition` → FAILED_PRECONDITION, `ResourceExhausted` →
//! RESOURCE_EXHAUSTED, `DeadlineExceeded` → DEADLINE_EXCEEDED, `Cancelled` → CANCELLED. Anything else that goes wrong
//! inside the server (a panicked simulation task) is INTERNAL.

use std::net::SocketAddr;

use thiserror::Error;
use tonic::{Code, Status};

use crate::twin::TwinError;

/// Longest status message, in characters: an error echoes what the client sent (an id, a
/// number), and a hostile value must not make a huge reply or log line.
pub const MESSAGE_CHARS_MAX: usize = 256;

/// `message` cut to at most [`MESSAGE_CHARS_MAX`] characters, the ellipsis marking a cut
/// included.
pub fn shorten(message: &str) -> String {
    if message.chars().nth(MESSAGE_CHARS_MAX).is_none() {
        return message.to_owned();
    }
    match message.char_indices().nth(MESSAGE_CHARS_MAX - 1) {
        None => message.to_owned(),
        Some((end, _)) => format!("{}…", &message[..end]),
    }
}

/// The gRPC status of a twin error (its message cut to [`MESSAGE_CHARS_MAX`] characters).
pub fn status_from(err: &TwinError) -> Status {
    let code = match err {
        TwinError::InvalidArgument { .. } => Code::InvalidArgument,
        TwinError::NotFound { .. } => Code::NotFound,
        TwinError::FailedPrecondition(_) => Code::FailedPrecondition,
        TwinError::ResourceExhausted(_) => Code::ResourceExhausted,
        TwinError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
        TwinError::Cancelled { .. } => Code::Cancelled,
    };
    Status::new(code, shorten(&err.to_string()))
}

/// The gRPC status of a twin error met while handling message `index` of a client stream:
/// the same code, with the message's index in front.
pub fn stream_status_from(err: &TwinError, index: u64) -> Status {
    let status = status_from(err);
    Status::new(
        status.code(),
        shorten(&format!("stream message {index}: {}", status.message())),
    )
}

/// DEADLINE_EXCEEDED for a call whose deadline passed before or while it ran.
pub fn deadline_status(what: &str) -> Status {
    Status::deadline_exceeded(format!("deadline exceeded {what}"))
}

/// INTERNAL for a simulation task that did not finish (it panicked or was cancelled).
pub fn internal_status(what: &str) -> Status {
    Status::internal(format!("internal error: {what}"))
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The initial cluster config was refused.
    #[error("initial cluster config: {0}")]
    Config(#[source] TwinError),
    /// A listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The async runtime could not be built.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The metrics registry refused a metric.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The reflection service could not load the API's descriptors.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The HTTP server failed.
    #[error("HTTP server: {0}")]
    Http(#[source] std::io::Error),
    /// The TLS certificate, key or client CA could not be loaded.
    #[error("TLS: {0}")]
    Tls(#[from] super::tls::TlsError),
    /// Installing a signal handler failed.
    #[error("signal handler: {0}")]
    Signal(#[source] std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_twin_error_has_its_code() {
        let cases = [
            (
                TwinError::invalid("instances[2].tp", "bad"),
                Code::InvalidArgument,
            ),
            (
                TwinError::NotFound {
                    what: "generation",
                    id: "7".into(),
                },
                Code::NotFound,
            ),
            (
                TwinError::FailedPrecondition("x".into()),
                Code::FailedPrecondition,
            ),
            (
                TwinError::ResourceExhausted("x".into()),
                Code::ResourceExhausted,
            ),
            (
                TwinError::DeadlineExceeded { events: 3 },
                Code::DeadlineExceeded,
            ),
            (TwinError::Cancelled { events: 3 }, Code::Cancelled),
        ];
        for (err, code) in cases {
            assert_eq!(status_from(&err).code(), code, "{err}");
        }
        let status = status_from(&TwinError::invalid("instances[2].tp", "bad"));
        assert_eq!(status.message(), "instances[2].tp: bad");
        let status = stream_status_from(&TwinError::invalid("seq", "bad"), 4);
        assert_eq!(status.message(), "stream message 4: seq: bad");
    }

    #[test]
    fn messages_are_cut_short() {
        let long = TwinError::invalid("instances[0].id", "x".repeat(1_000_000));
        let status = status_from(&long);
        assert!(status.message().chars().count() <= MESSAGE_CHARS_MAX);
        assert!(status.message().starts_with("instances[0].id: xxx"));
        assert!(status.message().ends_with('…'));
        assert_eq!(
            shorten("é".repeat(300).as_str()).chars().count(),
            MESSAGE_CHARS_MAX
        );
        assert_eq!(shorten(&"é".repeat(MESSAGE_CHARS_MAX)).chars().count(), 256);
        let streamed = stream_status_from(&long, u64::MAX);
        assert!(streamed.message().chars().count() <= MESSAGE_CHARS_MAX);
        assert_eq!(shorten("short"), "short");
    }
}
