//! The questions the twin answers and the shape of its answers, as plain domain types.
//! `server` converts the gRPC messages to and from these; `predict` and `forecast` compute
//! the answers.

use std::sync::Arc;

use crate::sim::SloClass;
use crate::workload::{LengthDist, Stage};

/// The engine id of the request a routing question is about, in every fork that asks it.
pub const QUESTION_REQUEST_ID: u64 = 0;

/// Expected output length of a request whose length is not known.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputLength {
    /// Exactly this many tokens (one replication suffices).
    Point(u32),
    /// A histogram of (tokens, weight); sampled per replication.
    Histogram(Vec<(u32, f64)>),
}

/// Latency objectives; a missing target is not checked.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct SloTargets {
    /// Time to first token, ms.
    pub ttft_ms: Option<f64>,
    /// Time per output token, ms.
    pub tpot_ms: Option<f64>,
    /// End-to-end latency, ms.
    pub e2e_ms: Option<f64>,
}

/// The request a routing question is about.
#[derive(Clone, Debug, PartialEq)]
pub struct CandidateRequest {
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Prompt token ids, if known (for prefix hits).
    pub token_ids: Option<Arc<[u32]>>,
    /// Keys of the prompt's full blocks, if known (for prefix hits).
    pub block_hashes: Vec<u64>,
    /// Expected output length.
    pub output: OutputLength,
    /// The request's `max_tokens`.
    pub max_tokens: u32,
    /// vLLM priority.
    pub priority: i32,
    /// SLO class.
    pub slo_class: SloClass,
    /// Objectives to score against.
    pub slo: SloTargets,
}

/// What to do with an instance whose observed state is older than the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StalePolicy {
    /// Simulate from the last observed state as if it were current.
    UseLast,
    /// Leave the instance out of the candidates.
    Exclude,
    /// Treat the instance as saturated (what the EPP's flow control does): predictions are
    /// marked invalid and it is never recommended.
    TreatSaturated,
    /// Advance the instance inside the simulation by its age before forking.
    RollForward,
}

/// Background traffic during a prediction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Background {
    /// Only the requests already in the snapshot (and the new one).
    None,
    /// Poisson arrivals at the mirror's observed rate and length mix.
    ObservedPoisson,
}

/// Options of a routing prediction.
#[derive(Clone, Debug, PartialEq)]
pub struct PredictOptions {
    /// Simulations per candidate (each with its own sampled lengths).
    pub replications: u32,
    /// Quantiles to report, each in (0, 1).
    pub quantiles: Vec<f64>,
    /// Simulated time after which a replication stops (µs).
    pub horizon_us: u64,
    /// Background traffic.
    pub background: Background,
    /// Stale-signal policy (the config's default when `None`).
    pub stale_policy: Option<StalePolicy>,
    /// Signals older than this are stale (µs; the snapshot's setting when `None`).
    pub max_signal_age_us: Option<u64>,
    /// Seed; the answer echoes the seed used.
    pub seed: u64,
}

/// "If I send this request to each of these instances, what happens?"
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingQuestion {
    /// The request.
    pub request: CandidateRequest,
    /// Candidate instance ids; empty means every instance.
    pub candidates: Vec<String>,
    /// Options.
    pub options: PredictOptions,
    /// The moment of the decision (client clock, µs); must not precede the observations.
    pub now_us: u64,
}

/// Mean and requested quantiles of one predicted metric, in ms.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Distribution {
    /// Mean over replications.
    pub mean: f64,
    /// Each requested quantile and its value.
    pub quantiles: Vec<QuantileValue>,
}

/// One requested quantile of a [`Distribution`] and its value (ms).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantileValue {
    /// The quantile, in (0, 1).
    pub quantile: f64,
    /// Its value, in ms.
    pub value: f64,
}

/// The predicted outcome of routing the request to one candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct CandidatePrediction {
    /// The instance.
    pub instance_id: String,
    /// False if the instance was treated as saturated or could not serve the request.
    pub valid: bool,
    /// Why the prediction is not valid (empty when valid).
    pub invalid_reason: String,
    /// Time to first token.
    pub ttft_ms: Distribution,
    /// Time per output token.
    pub tpot_ms: Distribution,
    /// End-to-end latency.
    pub e2e_ms: Distribution,
    /// Probability of meeting every given SLO target.
    pub slo_probability: f64,
    /// Probability of meeting the TTFT target (1 when none).
    pub ttft_slo_probability: f64,
    /// Probability of meeting the TPOT target (1 when none).
    pub tpot_slo_probability: f64,
    /// Mean time from arrival to first admission, ms.
    pub queue_wait_ms: f64,
    /// Prompt tokens served from the prefix cache (mean).
    pub prefix_hit_tokens: f64,
    /// KV usage right after the request is admitted (mean).
    pub kv_usage_after: f64,
    /// Change of the other in-flight requests' mean E2E on that instance, ms.
    pub others_delta_e2e_ms: f64,
    /// Age of the instance's observed state, ms.
    pub input_age_ms: f64,
}

/// The answer to a routing question.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingAnswer {
    /// One prediction per candidate, in the question's order.
    pub candidates: Vec<CandidatePrediction>,
    /// The recommended instance (highest SLO probability, then lowest mean E2E).
    pub recommended_instance_id: Option<String>,
    /// Snapshot generation used.
    pub generation: u64,
    /// Seed used.
    pub seed: u64,
    /// Simulation events processed for the answer.
    pub events: u64,
    /// A prefill/decode pool only: one answer per (prefill, decode) pair whose decode pod
    /// the decider sends to a remote prefill (`candidates` then answer decode only).
    pub pairs: Vec<PairPrediction>,
    /// The prefill pod of the recommendation when it is a pair (`recommended_instance_id`
    /// is its decode pod).
    pub recommended_prefill_instance_id: Option<String>,
    /// The decider's choice on each decode-serving candidate (P/D pools only).
    pub decider: Vec<DeciderChoice>,
}

/// The predicted outcome of serving the request on one (prefill, decode) pair.
#[derive(Clone, Debug, PartialEq)]
pub struct PairPrediction {
    /// The prefill pod.
    pub prefill_instance_id: String,
    /// The decode pod.
    pub decode_instance_id: String,
    /// The client's view: TTFT from arrival to the decode pod's first token, TPOT on the
    /// decode pod, the prefill's queue wait and prefix hits, the others' delta over both
    /// pods; `instance_id` is the decode pod.
    pub prediction: CandidatePrediction,
    /// Mean arrival to the prefill pod's token, ms.
    pub prefill_ttft_ms: f64,
    /// Mean KV pull, ms.
    pub transfer_ms: f64,
    /// Mean prefill's token to the decode pod's first token, ms.
    pub handover_ms: f64,
    /// Change of the other requests' mean E2E on the prefill pod, ms.
    pub prefill_others_delta_e2e_ms: f64,
    /// Change of the other requests' mean E2E on the decode pod, ms.
    pub decode_others_delta_e2e_ms: f64,
}

/// The `prefix-based-pd-decider` on one decode pod.
#[derive(Clone, Debug, PartialEq)]
pub struct DeciderChoice {
    /// The decode pod.
    pub decode_instance_id: String,
    /// Prompt tokens not cached there.
    pub uncached_tokens: u32,
    /// A separate prefill (true) or decode only.
    pub remote_prefill: bool,
}

/// Where a capacity forecast starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForecastStart {
    /// From the current snapshot's in-flight requests.
    Snapshot,
    /// From idle instances.
    Empty,
}

/// Replica counts to evaluate for one variant (an instance template from the config).
#[derive(Clone, Debug, PartialEq)]
pub struct VariantCandidates {
    /// Id of the config instance used as the template.
    pub template_instance_id: String,
    /// Counts to evaluate; empty means search 1..=max by cost bound.
    pub replica_counts: Vec<u32>,
}

/// "With N replicas under this forecast, what attainment and cost do I get?"
#[derive(Clone, Debug, PartialEq)]
pub struct ForecastQuestion {
    /// Start state.
    pub start: ForecastStart,
    /// Piecewise arrival rate: each stage's rate (requests per second) for its duration
    /// (seconds), in order.
    pub stages: Vec<Stage>,
    /// Prompt lengths.
    pub input_tokens: LengthDist,
    /// Output lengths.
    pub output_tokens: LengthDist,
    /// Variants and candidate counts.
    pub variants: Vec<VariantCandidates>,
    /// Highest acceptable cost per hour when searching (0: no bound).
    pub max_cost_per_hour: f64,
    /// Objectives.
    pub slo: SloTargets,
    /// Required fraction of requests meeting every objective, for the recommendation.
    pub target_attainment: f64,
    /// Replications per candidate.
    pub replications: u32,
    /// Quantiles to report.
    pub quantiles: Vec<f64>,
    /// Seed.
    pub seed: u64,
    /// The moment of the question (client clock, µs).
    pub now_us: u64,
}

/// The forecast for one candidate configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ForecastCandidate {
    /// Replicas per variant (template instance id, count).
    pub replicas: Vec<(String, u32)>,
    /// Time to first token.
    pub ttft_ms: Distribution,
    /// Inter-token latency.
    pub itl_ms: Distribution,
    /// End-to-end latency.
    pub e2e_ms: Distribution,
    /// Fraction of requests meeting every objective (mean over replications).
    pub slo_attainment: f64,
    /// 95 % confidence interval of the attainment over replications (low, high).
    pub slo_attainment_ci: (f64, f64),
    /// Largest wait-queue depth seen on any instance.
    pub max_queue_depth: u64,
    /// Mean KV usage.
    pub kv_usage_mean: f64,
    /// Completed requests per second.
    pub throughput_rps: f64,
    /// Cost per hour.
    pub cost_per_hour: f64,
}

#[cfg(test)]
impl ForecastCandidate {
    /// A candidate with only its replicas and attainment set, every latency empty: the
    /// fixture of the tests that pick among candidates by attainment.
    pub(crate) fn with_attainment(replicas: Vec<(String, u32)>, attainment: f64) -> Self {
        let none = Distribution {
            mean: 0.0,
            quantiles: Vec::new(),
        };
        Self {
            replicas,
            ttft_ms: none.clone(),
            itl_ms: none.clone(),
            e2e_ms: none,
            slo_attainment: attainment,
            slo_attainment_ci: (attainment, attainment),
            max_queue_depth: 0,
            kv_usage_mean: 0.0,
            throughput_rps: 0.0,
            cost_per_hour: 0.0,
        }
    }
}

/// The answer to a capacity forecast.
#[derive(Clone, Debug, PartialEq)]
pub struct ForecastAnswer {
    /// Every evaluated candidate.
    pub candidates: Vec<ForecastCandidate>,
    /// The cheapest candidate meeting the target attainment (llm-d's `desired_replicas`),
    /// per variant; empty if none meets it. For a P/D pair, the split search's answer trimmed
    /// to the fewest pods per role that still meet it (`forecast::trim`), the one the KEDA
    /// scaler serves: under noise it can differ from the cheapest candidate listed.
    pub desired_replicas: Vec<(String, u32)>,
    /// Snapshot generation used.
    pub generation: u64,
    /// Seed used.
    pub seed: u64,
    /// Age of the oldest instance state the forecast forked from (µs; 0 from idle).
    pub state_age_us: u64,
}
