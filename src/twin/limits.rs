//! Bounds on the work one call may trigger: every simulation a request causes is bounded by
//! these and by the call's deadline.

use std::time::Instant;

/// Per-call limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most candidates per routing question.
    pub max_candidates: u32,
    /// Most replications per candidate.
    pub max_replications: u32,
    /// Longest simulated horizon (µs).
    pub max_horizon_us: u64,
    /// Most simulation events per call, over all forks.
    pub max_events_per_call: u64,
    /// Most forecast candidates (replica combinations) per call.
    pub max_forecast_candidates: u32,
    /// Wall-clock deadline of the call, if any.
    pub deadline: Option<Instant>,
}

impl Limits {
    /// Defaults sized for a sidecar answering in milliseconds.
    pub const DEFAULT: Limits = Limits {
        max_candidates: 256,
        max_replications: 64,
        max_horizon_us: 600_000_000,
        max_events_per_call: 50_000_000,
        max_forecast_candidates: 64,
        deadline: None,
    };
}
