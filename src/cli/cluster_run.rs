//! `ditto run` in cluster mode (`--cluster`, `--instances`, `--routing`,
//! `--refresh-interval-ms`): builds the cluster config and shapes its JSON output.

use std::path::Path;

use serde::Serialize;

use super::args::RunArgs;
use super::error::CliError;
use super::report::StatsJson;
use super::report::SummaryJson;
use super::run::{RunInfo, RunOutput};
use crate::cluster::config::{
    AdmissionPolicy, ClusterConfig, DEFAULT_REFRESH_INTERVAL_US, InstanceConfig, RoutingPolicy,
    StalenessConfig,
};
use crate::cluster::disagg::{DisaggConfig, PdSummary};
use crate::cluster::{Cluster, spec};

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
    /// Pulls that failed (the prefill's hold expired first; the decode pod recomputed).
    pub failed_pulls: u64,
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
    fn new(pd: &PdSummary, cluster: &Cluster) -> Self {
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

/// True if the flags ask for a cluster run.
pub fn wanted(args: &RunArgs) -> bool {
    args.cluster.is_some()
        || args.instances.is_some()
        || args.routing.is_some()
        || args.refresh_interval_ms.is_some()
}

/// `--routing` names that select llm-d's `disagg-profile-handler` (with the P/D profiles and
/// the `prefix-based-pd-decider`'s sample threshold); they need a cluster file (its pools'
/// roles and models).
pub const PD_ROUTING_NAMES: [&str; 4] = [
    "pd",
    "disagg",
    "disagg-profile-handler",
    "pd-profile-handler",
];

/// The cluster config the flags describe, and its disaggregation if any; `template` is the
/// instance the other flags define.
pub fn cluster_config(
    args: &RunArgs,
    template: InstanceConfig,
) -> Result<(ClusterConfig, Option<DisaggConfig>), CliError> {
    let mut file = match args.cluster.as_deref() {
        Some("default") => Some(spec::ClusterFileConfig {
            config: spec::default_cluster(),
            disaggregation: None,
            kv: Vec::new(),
        }),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| CliError::Io {
                path: Path::new(path).to_path_buf(),
                source,
            })?;
            Some(
                spec::parse_cluster_file(&text, Some(&super::model_files::FsModelFiles::new(None)))
                    .map_err(|err| CliError::BadFile {
                        path: Path::new(path).to_path_buf(),
                        reason: err.to_string(),
                    })?,
            )
        }
        None => None,
    };
    let mut disaggregation = file.as_mut().and_then(|f| f.disaggregation.take());
    let mut config = match file.as_ref() {
        Some(file) => file.config.clone(),
        None => {
            let count = args.instances.unwrap_or(1);
            if count == 0 || count > spec::INSTANCES_MAX {
                return Err(CliError::flag(
                    "instances",
                    format!("must be in 1..={}", spec::INSTANCES_MAX),
                ));
            }
            let instances = (0..count)
                .map(|index| InstanceConfig {
                    id: format!("instance-{index}"),
                    ..template.clone()
                })
                .collect();
            ClusterConfig {
                instances,
                routing: RoutingPolicy::llm_d_default(),
                admission: AdmissionPolicy::Always,
                staleness: StalenessConfig::uniform(DEFAULT_REFRESH_INTERVAL_US),
            }
        }
    };
    if let Some(name) = &args.routing {
        let lowered = name.trim().to_ascii_lowercase();
        if PD_ROUTING_NAMES.contains(&lowered.as_str()) {
            let kv = file.as_ref().map(|f| f.kv.clone()).unwrap_or_default();
            if kv.len() != config.instances.len() {
                return Err(CliError::flag(
                    "routing",
                    format!("{name} needs --cluster FILE (pools with roles)"),
                ));
            }
            let disagg = spec::resolve_disaggregation(&spec::DisaggSpec::default(), kv)
                .map_err(|err| CliError::flag("routing", err.to_string()))?;
            config.routing = crate::cluster::disagg::llm_d_pd_profile();
            disaggregation = Some(disagg);
        } else {
            config.routing = spec::routing_by_name(name)
                .map_err(|err| CliError::flag("routing", err.to_string()))?;
            disaggregation = None;
        }
    }
    if let Some(ms) = args.refresh_interval_ms {
        if !(ms.is_finite() && (0.0..=3.6e6).contains(&ms)) {
            return Err(CliError::flag(
                "refresh-interval-ms",
                format!("must be in [0, 3600000], got {ms}"),
            ));
        }
        config.staleness = StalenessConfig::uniform((ms * 1000.0).round() as u64);
    }
    Ok((config, disaggregation))
}

/// The JSON output of a finished cluster run.
pub fn output(cluster: &Cluster, workload: String, seed: u64) -> RunOutput {
    let summary = cluster.summary();
    let config = cluster.config();
    let first = &config.instances[0];
    let staleness = config.staleness;
    let instances = summary
        .instances
        .iter()
        .zip(&config.instances)
        .zip(cluster.routed_counts())
        .map(
            |(((id, instance_summary), instance), &routed)| InstanceJson {
                id: id.clone(),
                model: instance.model.clone(),
                gpu: instance.gpu.clone(),
                routed_requests: routed,
                summary: SummaryJson::from(instance_summary),
            },
        )
        .collect();
    RunOutput {
        summary: SummaryJson::from(&summary.total),
        rejected_requests: Some(summary.total.counts.rejected),
        instances: Some(instances),
        disaggregation: summary
            .disaggregation
            .as_ref()
            .map(|pd| DisaggJson::new(pd, cluster)),
        run: RunInfo {
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
            cluster: Some(ClusterInfo {
                instances: config.instances.len(),
                routing: match cluster.disaggregation() {
                    Some(disagg) => format!(
                        "disagg-profile-handler(decode: {}, prefill: {})",
                        routing_name(&config.routing),
                        routing_name(&disagg.prefill_routing)
                    ),
                    None => routing_name(&config.routing),
                },
                admission: admission_name(&config.admission).to_owned(),
                refresh_interval_ms: [
                    staleness.queue_depth_us as f64 / 1000.0,
                    staleness.running_us as f64 / 1000.0,
                    staleness.kv_usage_us as f64 / 1000.0,
                    staleness.prefix_cache_us as f64 / 1000.0,
                ],
            }),
        },
    }
}

fn routing_name(policy: &RoutingPolicy) -> String {
    match policy {
        RoutingPolicy::RoundRobin => "round-robin".to_owned(),
        RoutingPolicy::Random => "random".to_owned(),
        RoutingPolicy::LeastLoaded => "least-loaded".to_owned(),
        RoutingPolicy::VllmDataParallel => "vllm-dp".to_owned(),
        RoutingPolicy::Weighted { scorers, .. } => {
            let parts: Vec<String> = scorers
                .iter()
                .map(|s| format!("{:?}:{}", s.scorer, s.weight))
                .collect();
            format!("weighted({})", parts.join(","))
        }
    }
}

fn admission_name(policy: &AdmissionPolicy) -> &'static str {
    match policy {
        AdmissionPolicy::Always => "always",
        AdmissionPolicy::TokenBucket { .. } => "token-bucket",
        AdmissionPolicy::SaturationShedding { .. } => "saturation",
    }
}
