//! `ditto run` in cluster mode (`--cluster`, `--instances`, `--routing`,
//! `--refresh-interval-ms`): builds the cluster config and shapes its JSON output.

use std::path::Path;

use serde::Serialize;

use super::args::RunArgs;
use super::error::CliError;
use super::report::SummaryJson;
use super::run::{RunInfo, RunOutput};
use crate::cluster::config::{
    AdmissionPolicy, ClusterConfig, DEFAULT_REFRESH_INTERVAL_US, InstanceConfig, RoutingPolicy,
    StalenessConfig,
};
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

/// True if the flags ask for a cluster run.
pub fn wanted(args: &RunArgs) -> bool {
    args.cluster.is_some()
        || args.instances.is_some()
        || args.routing.is_some()
        || args.refresh_interval_ms.is_some()
}

/// The cluster config the flags describe; `template` is the instance the other flags define.
pub fn cluster_config(args: &RunArgs, template: InstanceConfig) -> Result<ClusterConfig, CliError> {
    let mut config = match args.cluster.as_deref() {
        Some("default") => spec::default_cluster(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| CliError::Io {
                path: Path::new(path).to_path_buf(),
                source,
            })?;
            spec::parse_cluster_yaml(&text).map_err(|err| CliError::BadFile {
                path: Path::new(path).to_path_buf(),
                reason: err.to_string(),
            })?
        }
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
        config.routing = spec::routing_by_name(name)
            .map_err(|err| CliError::flag("routing", err.to_string()))?;
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
    Ok(config)
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
                routing: routing_name(&config.routing),
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
