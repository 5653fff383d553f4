//! Errors of the twin, by what went wrong (not by how a transport reports it: the server
//! maps each kind once per transport, `server::error` for gRPC and the latency predictor's
//! handlers for HTTP JSON).

use thiserror::Error;

/// Why the twin refused an update or a question.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum TwinError {
    /// Bad input; `path` is the offending field's path in the caller's message (e.g.
    /// `instances[2].tp`).
    #[error("{path}: {why}")]
    InvalidField {
        /// Field path.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// A write older than what the instance already holds: a newer observation (e.g. a push
    /// that won the race against a scrape) is kept. Said and coded like `InvalidField` to a
    /// caller; its own kind so a writer can tell the race from a state that is wrong.
    #[error("{path}: {why}")]
    Superseded {
        /// Field path (`observed_at_us`).
        path: String,
        /// What it is older than.
        why: String,
    },
    /// An id that does not exist (instance, variant, generation).
    #[error("{what} not found: {id}")]
    NotFound {
        /// Kind of thing.
        what: &'static str,
        /// The id.
        id: String,
    },
    /// Nothing to work on yet: no cluster config has been synced.
    #[error("no cluster config has been synced yet")]
    NotSynced,
    /// The mirror holds a state the engine cannot simulate (the store accepted it, so the
    /// fault is the mirror's, not the caller's).
    #[error("{0}")]
    Unsimulable(String),
    /// A configured limit (candidates, replications, horizon, instances, events in a
    /// message, ...) was exceeded; the message names it.
    #[error("{0}")]
    OverLimit(String),
    /// The call's simulation event budget ran out.
    #[error("the simulation event budget of this call ran out after {events} events")]
    EventBudget {
        /// Events processed before it ran out.
        events: u64,
    },
    /// The call's deadline passed.
    #[error("deadline exceeded after {events} simulation events")]
    Deadline {
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
    /// An `InvalidField` error.
    pub fn invalid(path: impl Into<String>, why: impl Into<String>) -> Self {
        TwinError::InvalidField {
            path: path.into(),
            why: why.into(),
        }
    }
}

/// A number as an error message shows it: plain when short, in scientific notation when
/// plain would be long (`1e300` must not print 301 digits, nor `1e-300` 300 zeros).
pub fn short_num(value: f64) -> String {
    let magnitude = value.abs();
    if value.is_finite() && magnitude != 0.0 && !(1e-6..1e15).contains(&magnitude) {
        format!("{value:e}")
    } else {
        format!("{value}")
    }
}
