//! Why a call failed, by kind ([`CallError`]: the twin's errors and the server's own), and
//! its one mapping to gRPC ([`CallError::code`], [`status_from`]); the latency predictor's
//! handlers map the same kinds to HTTP JSON once (`predictor::handlers::error_response`).
//! Also the server's startup errors.
//!
//! gRPC mapping: `InvalidField` → INVALID_ARGUMENT (message `field.path: reason`),
//! `NotFound` → NOT_FOUND, `NotSynced` and `Unsimulable` → FAILED_PRECONDITION, `OverLimit`,
//! `EventBudget` and a full simulation queue → RESOURCE_EXHAUSTED, `Deadline` →
//! DEADLINE_EXCEEDED, `Cancelled` → CANCELLED, unavailable → UNAVAILABLE; a simulation task
//! that panicked is INTERNAL.

use std::net::SocketAddr;

use thiserror::Error;
use tonic::{Code, Status};

use crate::twin::TwinError;

/// Longest status message, in characters (the ellipsis marking a cut included): an
/// error echoes what the client sent (an id, a number), and a hostile value must not make a
/// huge reply or log line.
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

/// Why a call failed.
#[derive(Debug, Error)]
pub enum CallError {
    /// The twin refused the update or the question.
    #[error(transparent)]
    Twin(#[from] TwinError),
    /// Every simulation slot is busy and the bounded queue for one is full.
    #[error(
        "all {slots} simulation slots are busy and {waiting} calls already wait for one; \
         retry later or add replicas"
    )]
    Busy {
        /// Simulation slots.
        slots: usize,
        /// Calls allowed to wait.
        waiting: usize,
    },
    /// The call's deadline passed outside a simulation (waiting, reading a stream).
    #[error("deadline exceeded {0}")]
    Deadline(String),
    /// The service cannot answer now (no config synced, a part not running).
    #[error("{0}")]
    Unavailable(String),
    /// A task of the server failed (a panicked simulation): the server's fault.
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// An error met at message `index` of a client stream.
    #[error("stream message {index}: {source}")]
    InStream {
        /// The message's index.
        index: u64,
        /// What went wrong with it.
        source: Box<CallError>,
    },
}

impl CallError {
    /// `err` met at message `index` of a client stream.
    pub fn in_stream(err: impl Into<CallError>, index: u64) -> Self {
        CallError::InStream {
            index,
            source: Box::new(err.into()),
        }
    }

    /// The gRPC code of this kind of error (the one mapping to gRPC).
    pub fn code(&self) -> Code {
        match self {
            CallError::Twin(err) => match err {
                TwinError::InvalidField { .. } | TwinError::Superseded { .. } => {
                    Code::InvalidArgument
                }
                TwinError::NotFound { .. } => Code::NotFound,
                TwinError::NotSynced | TwinError::Unsimulable(_) => Code::FailedPrecondition,
                TwinError::OverLimit(_) | TwinError::EventBudget { .. } => Code::ResourceExhausted,
                TwinError::Deadline { .. } => Code::DeadlineExceeded,
                TwinError::Cancelled { .. } => Code::Cancelled,
            },
            CallError::Busy { .. } => Code::ResourceExhausted,
            CallError::Deadline(_) => Code::DeadlineExceeded,
            CallError::Unavailable(_) => Code::Unavailable,
            CallError::Internal(_) => Code::Internal,
            CallError::InStream { source, .. } => source.code(),
        }
    }

    /// Whether this is a call's simulation event budget running out.
    pub fn is_event_budget(&self) -> bool {
        match self {
            CallError::Twin(TwinError::EventBudget { .. }) => true,
            CallError::InStream { source, .. } => source.is_event_budget(),
            _ => false,
        }
    }
}

impl From<CallError> for Status {
    fn from(err: CallError) -> Status {
        Status::new(err.code(), shorten(&err.to_string()))
    }
}

/// The gRPC status of a twin error (its message cut to [`MESSAGE_CHARS_MAX`] characters).
pub fn status_from(err: &TwinError) -> Status {
    Status::from(CallError::Twin(err.clone()))
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
    fn every_error_kind_has_its_code() {
        let cases = [
            (
                TwinError::invalid("instances[2].tp", "bad").into(),
                Code::InvalidArgument,
            ),
            (
                TwinError::NotFound {
                    what: "generation",
                    id: "7".into(),
                }
                .into(),
                Code::NotFound,
            ),
            (TwinError::NotSynced.into(), Code::FailedPrecondition),
            (
                TwinError::Unsimulable("x".into()).into(),
                Code::FailedPrecondition,
            ),
            (
                TwinError::OverLimit("x".into()).into(),
                Code::ResourceExhausted,
            ),
            (
                TwinError::EventBudget { events: 3 }.into(),
                Code::ResourceExhausted,
            ),
            (
                TwinError::Deadline { events: 3 }.into(),
                Code::DeadlineExceeded,
            ),
            (TwinError::Cancelled { events: 3 }.into(), Code::Cancelled),
            (
                CallError::Busy {
                    slots: 1,
                    waiting: 2,
                },
                Code::ResourceExhausted,
            ),
            (CallError::Deadline("x".into()), Code::DeadlineExceeded),
            (CallError::Unavailable("x".into()), Code::Unavailable),
            (CallError::Internal("x"), Code::Internal),
        ];
        for (err, code) in cases {
            assert_eq!(err.code(), code, "{err}");
            assert_eq!(Status::from(err).code(), code);
        }
        let status = status_from(&TwinError::invalid("instances[2].tp", "bad"));
        assert_eq!(status.message(), "instances[2].tp: bad");
        let status = Status::from(CallError::in_stream(TwinError::invalid("seq", "bad"), 4));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "stream message 4: seq: bad");
        assert!(CallError::in_stream(TwinError::EventBudget { events: 1 }, 0).is_event_budget());
        assert!(!CallError::from(TwinError::OverLimit("event budget".into())).is_event_budget());
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
        let streamed = Status::from(CallError::in_stream(long, u64::MAX));
        assert!(streamed.message().chars().count() <= MESSAGE_CHARS_MAX);
        assert_eq!(shorten("short"), "short");
    }
}
