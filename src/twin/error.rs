//! Errors of the twin, classified the way the gRPC layer reports them.

use thiserror::Error;

/// Why the twin refused an update or a question.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum TwinError {
    /// Bad input; `field` is the path of the offending field (e.g. `instances[2].tp`).
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// Field path.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// An id that does not exist (instance, variant, generation).
    #[error("{what} not found: {id}")]
    NotFound {
        /// Kind of thing.
        what: &'static str,
        /// The id.
        id: String,
    },
    /// Nothing to work on yet (no config synced).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A limit (candidates, replications, horizon, events) was exceeded.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The call's deadline passed.
    #[error("deadline exceeded after {events} simulation events")]
    DeadlineExceeded {
        /// Events processed before giving up.
        events: u64,
    },
    /// The caller cancelled the call (its client went away or its deadline passed).
    #[error("cancelled after {events} simulation events")]
    Cancelled {
        /// Events processed before stopping.
        events: u64,
    },
}

impl TwinError {
    /// An `InvalidArgument` error.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        TwinError::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
