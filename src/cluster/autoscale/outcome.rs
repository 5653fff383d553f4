//! What one policy's run produced: attainment, replica-hours and cost, scale events, time
//! over the objectives, latency percentiles, and the timeline a plot is drawn from.

use crate::sim::metrics::Counts;

/// A replica slot's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// No pod.
    Off,
    /// A pod starting; routable from `ready_at_us`.
    Warming {
        /// When it becomes ready.
        ready_at_us: u64,
    },
    /// A ready pod the router may pick.
    Ready,
    /// A removed pod finishing its requests; the router no longer picks it.
    Draining,
}

/// A slot's change of state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotChange {
    /// When (µs).
    pub at_us: u64,
    /// Which slot.
    pub slot: usize,
    /// Its new state.
    pub state: SlotState,
}

/// The pool at one sync.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Time (s).
    pub at_s: f64,
    /// Arrivals per second over the last sync period.
    pub arrival_rate: f64,
    /// Ready replicas (after the sync's decision).
    pub ready: u32,
    /// Replicas the HPA set.
    pub desired: u32,
    /// Pods held (warming, ready, draining).
    pub billed: u32,
    /// P90 TTFT of the requests finished in the last window (ms).
    pub p90_ttft_ms: Option<f64>,
    /// P90 TPOT over the same requests (ms).
    pub p90_tpot_ms: Option<f64>,
}

/// One policy's result.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyOutcome {
    /// Policy name.
    pub policy: String,
    /// Requests submitted.
    pub requests: u64,
    /// Requests that left (completed, dropped, timed out or rejected).
    pub finished: u64,
    /// Requests completed.
    pub completed: u64,
    /// Requests completed within both objectives.
    pub met: u64,
    /// Pod-hours held (warming, ready and draining pods all hold their GPUs).
    pub replica_hours: f64,
    /// Replica-hours × the pool's `cost_per_hour`.
    pub cost: f64,
    /// Syncs that raised the replica count.
    pub scale_ups: u32,
    /// Syncs that lowered it.
    pub scale_downs: u32,
    /// Pods started.
    pub pods_added: u32,
    /// Pods stopped.
    pub pods_removed: u32,
    /// Most pods held at a sync.
    pub peak_replicas: u32,
    /// Seconds (in sync periods) whose window P90 TTFT or TPOT exceeded its objective.
    pub time_over_slo_s: f64,
    /// TTFT percentiles of completed requests (ms): p50, p90, p99.
    pub ttft_ms: [f64; 3],
    /// TPOT percentiles (ms): p50, p90, p99.
    pub tpot_ms: [f64; 3],
    /// The cluster's request accounting at the end.
    pub counts: Counts,
    /// Simulated seconds.
    pub duration_s: f64,
    /// Events processed.
    pub events: u64,
    /// One sample per sync.
    pub timeline: Vec<Sample>,
    /// Every slot change.
    pub changes: Vec<SlotChange>,
}

impl PolicyOutcome {
    /// An empty outcome for `policy`.
    pub fn new(policy: &str) -> Self {
        Self {
            policy: policy.to_owned(),
            requests: 0,
            finished: 0,
            completed: 0,
            met: 0,
            replica_hours: 0.0,
            cost: 0.0,
            scale_ups: 0,
            scale_downs: 0,
            pods_added: 0,
            pods_removed: 0,
            peak_replicas: 0,
            time_over_slo_s: 0.0,
            ttft_ms: [0.0; 3],
            tpot_ms: [0.0; 3],
            counts: Counts::default(),
            duration_s: 0.0,
            events: 0,
            timeline: Vec::new(),
            changes: Vec::new(),
        }
    }

    /// Share of submitted requests completed within both objectives.
    pub fn attainment(&self) -> f64 {
        if self.requests == 0 {
            1.0
        } else {
            self.met as f64 / self.requests as f64
        }
    }

    /// Mean pods held over the run.
    pub fn mean_replicas(&self) -> f64 {
        if self.duration_s <= 0.0 {
            0.0
        } else {
            self.replica_hours * 3600.0 / self.duration_s
        }
    }

    /// Sets the percentiles from the completed requests' latencies (reorders them).
    pub fn set_latencies(&mut self, ttft_ms: &mut [f32], tpot_ms: &mut [f32]) {
        self.ttft_ms = percentiles(ttft_ms);
        self.tpot_ms = percentiles(tpot_ms);
    }
}

/// p50, p90, p99 by nearest rank (0 when empty).
fn percentiles(values: &mut [f32]) -> [f64; 3] {
    if values.is_empty() {
        return [0.0; 3];
    }
    values.sort_unstable_by(|a, b| a.total_cmp(b));
    let at = |p: f64| {
        let rank = ((values.len() as f64 * p).ceil() as usize).clamp(1, values.len());
        f64::from(values[rank - 1])
    };
    [at(0.5), at(0.9), at(0.99)]
}
