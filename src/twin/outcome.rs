//! What a question's forks are and what they give: how a candidate is treated (its signal
//! age against the stale policy), how its forks run, and one replication's outcome on it.
//! Shared by the orchestrator (`predict.rs`), the forks (`fork.rs`), the P/D pairs (`pd.rs`)
//! and the summaries (`summary.rs`), none of which imports another for these.

/// One replication's outcome on one candidate.
#[derive(Clone, Debug, Default)]
pub(super) struct ReplicationOutcome {
    pub(super) ttft_ms: f64,
    pub(super) tpot_ms: f64,
    pub(super) e2e_ms: f64,
    pub(super) completed: bool,
    pub(super) ttft_known: bool,
    pub(super) dropped: bool,
    pub(super) queue_wait_ms: f64,
    pub(super) prefix_hit_tokens: f64,
    pub(super) kv_usage_after: f64,
    pub(super) others_delta_e2e_ms: f64,
    pub(super) events: u64,
}

/// How one candidate is treated given its signal age and the stale policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Treatment {
    /// Restore at the observation time and simulate forward to `now` first.
    RollForward,
    /// Pretend the observed state is the state at `now`.
    UseLast,
    /// Report invalid (saturated), never recommend.
    Saturated,
    /// Leave out.
    Excluded,
}

/// How a question's forks are run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forking {
    /// With shortcuts (the default: same answers, less work): each fork starts where the
    /// request would first be reached, from a remembered checkpoint when there is one
    /// (`sim::engine::ReachLog`), and ends in closed form once only time can change its batch
    /// (`sim::engine::Drain`).
    Shortcuts,
    /// Plainly: roll forward from the observation, submit the request at `now` and step to the
    /// end. The path the shortcuts are checked against.
    Plain,
}
