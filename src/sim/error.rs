//! Errors the engine reports to its driver.

use thiserror::Error;

use crate::sim::config::ConfigError;
use crate::sim::request::RequestId;

/// Why the engine refused an input or stopped a run.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum SimError {
    /// The engine configuration is invalid.
    #[error("invalid engine config: {0}")]
    Config(#[from] ConfigError),
    /// A submitted request is malformed.
    #[error("request {id:?}: {field}: {reason}")]
    InvalidRequest {
        /// The request.
        id: RequestId,
        /// The offending field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Observed state that is inconsistent with the engine config (restore).
    #[error("{field}: {reason}")]
    InvalidState {
        /// The offending part of the state.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The run hit its event budget before finishing.
    #[error("event budget of {budget} events exhausted at t={now_us} µs")]
    EventBudgetExhausted {
        /// The budget.
        budget: u64,
        /// Simulated time reached.
        now_us: u64,
    },
}
