//! Bounds on the work one call may trigger: every simulation a request causes is bounded by
//! these, by the call's deadline and by its cancellation flag.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A flag the caller raises to stop a call's simulations (its client went away or its deadline
/// passed): the runners check it with the event budget, so a cancelled call stops within one
/// chunk of events. Pure: the twin only reads it; whoever owns the call sets it.
#[derive(Clone, Debug, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    /// A flag not raised yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises the flag: every simulation of the call stops at its next check.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the flag was raised.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Two flags are equal when they are the same flag.
impl PartialEq for CancelFlag {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CancelFlag {}

/// Per-call limits.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// The call's cancellation flag, if it can be cancelled.
    pub cancel: Option<CancelFlag>,
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
        cancel: None,
    };
}
