//! The autoscaler's resolved settings: bounds, warm-up, sync period, HPA behaviour, the
//! objectives attainment is judged by, and the policies to run.

use super::hpa::HpaConfig;

/// A new replica's time to ready, drawn per replica uniformly in `[min_us, max_us]` from
/// the run's "autoscale-warmup" stream (fixed when both are equal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WarmUp {
    /// Shortest warm-up (µs).
    pub min_us: u64,
    /// Longest warm-up (µs).
    pub max_us: u64,
}

impl WarmUp {
    /// llm-d's measured range: 100 s to 2 min 15 s.
    pub const LLM_D: WarmUp = WarmUp {
        min_us: 100_000_000,
        max_us: 135_000_000,
    };
}

/// The latency objectives (µs); a request meets them when it completes with TTFT and TPOT
/// at or under both.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Objectives {
    /// Time to first token.
    pub ttft_us: f64,
    /// Time per output token.
    pub tpot_us: f64,
}

/// One scaling policy.
#[derive(Clone, Debug, PartialEq)]
pub enum Policy {
    /// A fixed replica count (default: the maximum).
    Static {
        /// Replicas.
        replicas: Option<u32>,
    },
    /// llm-d's SLO-aware KEDA rule (`README.slo-aware.md`): s = max(P90 TTFT / S_ttft,
    /// P90 TPOT / S_tpot), idle → 0, clamped at `clamp`, averaged over `smoothing_us`; up
    /// above `up`, down below `down`, ready over total pods while scaling up.
    SloAware {
        /// Scale-up threshold (0.55).
        up: f64,
        /// Scale-down threshold (0.40).
        down: f64,
        /// Clamp of the ratio (2).
        clamp: f64,
        /// Averaging window (45 s).
        smoothing_us: u64,
        /// Window the P90s are taken over (60 s).
        quantile_window_us: u64,
    },
    /// Requests waiting, summed over the ready pods, against a per-pod target (llm-d's
    /// `keda-epp-queue`).
    QueueDepth {
        /// Waiting requests per pod.
        target: f64,
    },
    /// WVA's saturation rule: a pod is non-saturated below `kv_threshold` KV usage and
    /// `queue_threshold` waiting; scale up when the non-saturated pods' mean spare KV or
    /// spare queue falls below `kv_spare` / `queue_spare`; scale down by one when the load
    /// spread over one pod fewer keeps both spares.
    Saturation {
        /// KV usage threshold (0.8).
        kv_threshold: f64,
        /// Queue threshold (5).
        queue_threshold: f64,
        /// Spare-KV trigger (0.1).
        kv_spare: f64,
        /// Spare-queue trigger (3).
        queue_spare: f64,
    },
    /// ditto's forecast: the arrival rate forecast over `horizon_us` (≥ the warm-up) by
    /// `workload::load_forecast`, over a replica's calibrated capacity.
    Predictive {
        /// How far ahead the forecast looks.
        horizon_us: u64,
        /// Share of the calibrated capacity a replica is planned at (≤ 1: headroom).
        utilization: f64,
    },
}

impl Policy {
    /// The policy's name in tables and YAML.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Static { .. } => "static",
            Policy::SloAware { .. } => "slo-aware",
            Policy::QueueDepth { .. } => "queue-depth",
            Policy::Saturation { .. } => "saturation",
            Policy::Predictive { .. } => "predictive",
        }
    }

    /// The policy with its published defaults, by name.
    pub fn by_name(name: &str) -> Option<Policy> {
        Some(match name {
            "static" => Policy::Static { replicas: None },
            "slo-aware" => Policy::SloAware {
                up: 0.55,
                down: 0.40,
                clamp: 2.0,
                smoothing_us: 45_000_000,
                quantile_window_us: 60_000_000,
            },
            "queue-depth" => Policy::QueueDepth { target: 5.0 },
            "saturation" => Policy::Saturation {
                kv_threshold: 0.8,
                queue_threshold: 5.0,
                kv_spare: 0.1,
                queue_spare: 3.0,
            },
            "predictive" => Policy::Predictive {
                horizon_us: 150_000_000,
                utilization: 0.9,
            },
            _ => return None,
        })
    }

    /// Every policy's name, in table order.
    pub const NAMES: [&'static str; 5] = [
        "static",
        "slo-aware",
        "queue-depth",
        "saturation",
        "predictive",
    ];
}

/// The whole autoscaler section, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoscaleConfig {
    /// Replicas ready at the start (within min/max).
    pub initial_replicas: u32,
    /// Warm-up of a new replica.
    pub warm_up: WarmUp,
    /// The HPA's sync period (15 s).
    pub sync_period_us: u64,
    /// The HPA (bounds, tolerance, behaviour).
    pub hpa: HpaConfig,
    /// Attainment is judged by these.
    pub objectives: Objectives,
    /// The policies to run, each on the same load.
    pub policies: Vec<Policy>,
    /// The attainment a replica's calibrated capacity keeps (predictive policy; 0.95).
    pub capacity_attainment: f64,
}

impl AutoscaleConfig {
    /// The section's defaults around bounds and objectives: llm-d's warm-up range, a 15 s
    /// sync, the guide's HPA behaviour, every policy.
    pub fn with_defaults(min: u32, max: u32, objectives: Objectives) -> Self {
        Self {
            initial_replicas: min,
            warm_up: WarmUp::LLM_D,
            sync_period_us: 15_000_000,
            hpa: HpaConfig::llm_d_guide(min, max),
            objectives,
            policies: Policy::NAMES
                .iter()
                .filter_map(|name| Policy::by_name(name))
                .collect(),
            capacity_attainment: 0.95,
        }
    }
}
