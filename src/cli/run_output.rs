//! What `ditto run` prints (single engine, cluster or autoscaled pool): the summary, the
//! per-instance and per-role parts and the resolved settings, shared by `cli::run` and
//! `cli::cluster_run`.

use serde::Serialize;

use super::report::{StatsJson, SummaryJson};
use crate::cluster::Cluster;
use crate::cluster::config::InstanceConfig;
use crate::cluster::disagg::PdSummary;

/// The resolved settings of a run, echoed in the output so any result can be reproduced.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunInfo {
    /// Model name.
    pub model: String,
    /// GPU name.
    pub gpu: String,
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Latency model.
    pub latency_model: String,
    /// GPU KV blocks.
    pub num_gpu_blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Running-request limit.
    pub max_num_seqs: u32,
    /// Step token budget.
    pub max_num_batched_tokens: u32,
    /// Longest accepted sequence.
    pub max_model_len: u32,
    /// Scheduling policy.
    pub scheduling_policy: &'static str,
    /// Where requests came from: `flags`, a workload file or a trace file.
    pub workload: String,
    /// Seed of the random streams.
    pub seed: u64,
    /// Cluster settings (cluster runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterInfo>,
}

impl RunInfo {
    /// The settings of a run over instances like `first` (a cluster's first instance, an
    /// autoscaled pool's template).
    pub fn of_instance(
        first: &InstanceConfig,
        workload: String,
        seed: u64,
        cluster: Option<ClusterInfo>,
    ) -> Self {
        Self {
            model: first.model.clone(),
            gpu: first.gpu.clone(),
            tp: first.tp,
            latency_model: first.latency.kind().as_str().to_owned(),
            num_gpu_blocks: first.engine.num_gpu_blocks,
            block_size: first.engine.block_size,
            max_num_seqs: first.engine.max_num_seqs,
            max_num_batched_tokens: first.engine.max_num_batched_tokens,
            max_model_len: first.engine.max_model_len,
            scheduling_policy: first.engine.scheduling_policy.as_str(),
            workload,
            seed,
            cluster,
        }
    }
}

/// What `ditto run` prints: the summary fields, then (for a cluster) the rejected count and
/// each instance's summary, then the resolved settings.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunOutput {
    /// The run's aggregate outcome.
    #[serde(flatten)]
    pub summary: SummaryJson,
    /// Requests refused at admission (cluster runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_requests: Option<u64>,
    /// Per-instance summaries (cluster runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<InstanceJson>>,
    /// Per-role metrics (disaggregated cluster runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disaggregation: Option<DisaggJson>,
    /// The resolved settings.
    pub run: RunInfo,
}

/// Cluster settings echoed in the output.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ClusterInfo {
    /// Number of instances.
    pub instances: usize,
    /// Routing policy.
    pub routing: String,
    /// Admission policy.
    pub admission: String,
    /// Refresh interval of each signal, ms (queue depth, running, KV usage, prefix cache).
    pub refresh_interval_ms: [f64; 4],
}

/// One instance's part of a cluster run's output.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct InstanceJson {
    /// Instance id.
    pub id: String,
    /// Model.
    pub model: String,
    /// GPU.
    pub gpu: String,
    /// Requests the router sent to it.
    pub routed_requests: u32,
    /// Its summary.
    #[serde(flatten)]
    pub summary: SummaryJson,
}

/// The per-role metrics of a disaggregated run (times in ms).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DisaggJson {
    /// Requests whose prefill ran on a prefill pod.
    pub disaggregated_requests: u64,
    /// Requests served decode-only.
    pub decode_only_requests: u64,
    /// Disaggregated requests that ended on their prefill pod.
    pub failed_on_prefill: u64,
    /// Pulls that failed (the prefill's hold expired first, or the transport failed; the
    /// decode pod recomputed).
    pub failed_pulls: u64,
    /// Of those, pulls failed in transport (`transfer_failure_rate`).
    pub transfer_failures: u64,
    /// Prefill attempts that failed with a retryable error (`prefill_failure_rate`).
    pub prefill_attempt_failures: u64,
    /// Retries the routing sidecars sent (`prefill_max_retries`).
    pub prefill_retries: u64,
    /// Requests whose last prefill attempt failed: the error went to the client (dropped).
    pub prefill_errors: u64,
    /// The order the handler ran its profiles in (`decode-first`, `prefill-first`).
    pub stage_order: &'static str,
    /// Arrival to admission on the prefill pod.
    pub prefill_queue_ms: StatsJson,
    /// Arrival to the prefill pod's first token.
    pub prefill_ttft_ms: StatsJson,
    /// Decode pod arrival to the pull's start (blocks reserved).
    pub decode_wait_ms: StatsJson,
    /// The KV pulls.
    pub transfer_ms: StatsJson,
    /// Prefill's first token to the decode pod's first token.
    pub handover_ms: StatsJson,
    /// The decider's threshold (`nonCachedTokens`).
    pub non_cached_tokens: u32,
    /// Link bandwidth, GB/s.
    pub bandwidth_gb_s: f64,
    /// Cost per descriptor, µs.
    pub descriptor_us: f64,
    /// Fixed cost per transfer, µs.
    pub setup_us: u64,
    /// Instances per role: prefill, decode, both.
    pub roles: [usize; 3],
}

impl DisaggJson {
    /// The per-role metrics of `cluster`'s run.
    pub fn new(pd: &PdSummary, cluster: &Cluster) -> Self {
        use crate::cluster::config::InstanceRole;
        let config = cluster.disaggregation();
        let count = |role: InstanceRole| {
            cluster
                .config()
                .instances
                .iter()
                .filter(|i| i.role == role)
                .count()
        };
        Self {
            disaggregated_requests: pd.disaggregated,
            decode_only_requests: pd.decode_only,
            failed_on_prefill: pd.failed_on_prefill,
            failed_pulls: pd.failed_pulls,
            transfer_failures: pd.transfer_failures,
            prefill_attempt_failures: pd.prefill_attempt_failures,
            prefill_retries: pd.prefill_retries,
            prefill_errors: pd.prefill_errors,
            stage_order: config.map_or("decode-first", |c| c.stage_order.as_str()),
            prefill_queue_ms: StatsJson::from(&pd.prefill_queue),
            prefill_ttft_ms: StatsJson::from(&pd.prefill_ttft),
            decode_wait_ms: StatsJson::from(&pd.decode_wait),
            transfer_ms: StatsJson::from(&pd.transfer),
            handover_ms: StatsJson::from(&pd.handover),
            non_cached_tokens: config.map_or(0, |c| c.decider.non_cached_tokens),
            bandwidth_gb_s: config.map_or(0.0, |c| c.transfer.bandwidth_gb_s),
            descriptor_us: config.map_or(0.0, |c| c.transfer.descriptor_us),
            setup_us: config.map_or(0, |c| c.transfer.setup_us),
            roles: [
                count(InstanceRole::Prefill),
                count(InstanceRole::Decode),
                count(InstanceRole::Both),
            ],
        }
    }
}
