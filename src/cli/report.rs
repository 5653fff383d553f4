//! JSON shapes of the command line's output: the run summary and per-request lines.
//!
//! These are the wire forms of `sim::metrics` types, converted by hand here so the engine
//! stays free of serialisation. Field order is fixed by the structs, so output is stable.

use serde::Serialize;

use crate::sim::metrics::{LatencyStats, RequestRecord, Summary};

/// Mean and percentiles of one metric (milliseconds).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StatsJson {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Samples.
    pub count: u64,
}

impl From<&LatencyStats> for StatsJson {
    fn from(stats: &LatencyStats) -> Self {
        Self {
            mean: stats.mean,
            p50: stats.p50,
            p90: stats.p90,
            p95: stats.p95,
            p99: stats.p99,
            count: stats.count,
        }
    }
}

/// KV-cache usage over the run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct KvUsageJson {
    /// Time-weighted mean fraction of blocks in use.
    pub mean: f64,
    /// Peak fraction.
    pub peak: f64,
    /// [time_s, fraction] samples.
    pub timeline: Vec<[f64; 2]>,
}

/// The summary of a run, as printed by `ditto run`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SummaryJson {
    /// Requests that arrived.
    pub injected_requests: u64,
    /// Requests that finished.
    pub completed_requests: u64,
    /// Requests still waiting when the run ended.
    pub still_queued: u64,
    /// Requests still running when the run ended.
    pub still_running: u64,
    /// Requests rejected as unservable.
    pub dropped_requests: u64,
    /// Requests past their deadline.
    pub timed_out_requests: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Prompt tokens of completed requests.
    pub input_tokens: u64,
    /// Output tokens of completed requests.
    pub output_tokens: u64,
    /// Simulated time covered.
    pub sim_duration_s: f64,
    /// Completed requests per simulated second.
    pub requests_per_s: f64,
    /// Output tokens per simulated second.
    pub output_tokens_per_s: f64,
    /// Prefix-cache hit rate in tokens.
    pub prefix_cache_hit_rate: f64,
    /// Time to first token.
    pub ttft_ms: StatsJson,
    /// End-to-end latency.
    pub e2e_ms: StatsJson,
    /// Inter-token latency over every token gap.
    pub itl_ms: StatsJson,
    /// Per-request time per output token.
    pub tpot_ms: StatsJson,
    /// Arrival to first admission.
    pub scheduling_delay_ms: StatsJson,
    /// Engine steps executed.
    pub steps: u64,
    /// KV usage.
    pub kv_usage: KvUsageJson,
}

impl From<&Summary> for SummaryJson {
    fn from(summary: &Summary) -> Self {
        let counts = summary.counts;
        Self {
            injected_requests: counts.injected,
            completed_requests: counts.completed,
            still_queued: counts.queued,
            still_running: counts.running,
            dropped_requests: counts.dropped,
            timed_out_requests: counts.timed_out,
            preemptions: counts.preemptions,
            input_tokens: summary.input_tokens,
            output_tokens: summary.output_tokens,
            sim_duration_s: summary.sim_duration_s(),
            requests_per_s: summary.requests_per_s(),
            output_tokens_per_s: summary.output_tokens_per_s(),
            prefix_cache_hit_rate: summary.prefix_cache_hit_rate,
            ttft_ms: (&summary.ttft).into(),
            e2e_ms: (&summary.e2e).into(),
            itl_ms: (&summary.itl).into(),
            tpot_ms: (&summary.tpot).into(),
            scheduling_delay_ms: (&summary.scheduling_delay).into(),
            steps: counts.steps,
            kv_usage: KvUsageJson {
                mean: summary.kv_usage_mean,
                peak: summary.kv_usage_peak,
                timeline: summary
                    .kv_usage_timeline
                    .iter()
                    .map(|&(t, usage)| [t as f64 / 1e6, usage])
                    .collect(),
            },
        }
    }
}

/// One request's line in the `--per-request` JSONL file.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RequestJson {
    /// Request id.
    pub id: u64,
    /// The instance that served it (cluster runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// SLO class.
    pub slo_class: &'static str,
    /// completed, dropped or timed_out.
    pub outcome: &'static str,
    /// Arrival (µs).
    pub arrival_us: u64,
    /// Entry into the wait queue (µs).
    pub enqueue_us: Option<u64>,
    /// First admission (µs).
    pub schedule_us: Option<u64>,
    /// First token at the client (µs).
    pub first_token_us: Option<u64>,
    /// Completion, drop or timeout (µs).
    pub end_us: u64,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Output tokens generated.
    pub output_tokens: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: u32,
    /// Times preempted.
    pub preemptions: u32,
    /// Time to first token (ms).
    pub ttft_ms: Option<f64>,
    /// End-to-end latency (ms).
    pub e2e_ms: Option<f64>,
    /// Mean time per output token after the first (ms).
    pub tpot_ms: Option<f64>,
    /// Every inter-token gap (µs).
    pub itl_us: Vec<u64>,
}

impl From<&RequestRecord> for RequestJson {
    fn from(record: &RequestRecord) -> Self {
        Self {
            id: record.id.0,
            instance: None,
            slo_class: record.slo_class.as_str(),
            outcome: record.outcome.as_str(),
            arrival_us: record.arrival_us,
            enqueue_us: record.enqueue_us,
            schedule_us: record.schedule_us,
            first_token_us: record.first_token_us,
            end_us: record.end_us,
            input_tokens: record.input_tokens,
            output_tokens: record.output_tokens,
            cached_tokens: record.cached_tokens,
            preemptions: record.preemptions,
            ttft_ms: record.ttft_us().map(|v| v as f64 / 1000.0),
            e2e_ms: record.e2e_us().map(|v| v as f64 / 1000.0),
            tpot_ms: record.tpot_us().map(|v| v / 1000.0),
            itl_us: record.token_gaps_us.clone(),
        }
    }
}
