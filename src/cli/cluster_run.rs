//! `ditto run` in cluster mode (`--cluster`, `--instances`, `--routing`,
//! `--refresh-interval-ms`): builds the cluster config and shapes its JSON output.

use std::path::Path;

use super::args::RunArgs;
use super::error::CliError;
use super::report::SummaryJson;
use super::run_output::{ClusterInfo, DisaggJson, InstanceJson, RunInfo, RunOutput};
use crate::cluster::config::{
    AdmissionPolicy, ClusterConfig, DEFAULT_REFRESH_INTERVAL_US, InstanceConfig, RoutingPolicy,
    StalenessConfig,
};
use crate::cluster::disagg::DisaggConfig;
use crate::cluster::{Cluster, spec};

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
        run: RunInfo::of_instance(
            first,
            workload,
            seed,
            Some(ClusterInfo {
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
        ),
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
