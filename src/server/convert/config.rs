//! `ClusterConfig` messages to and from the domain's cluster config and twin settings.
//!
//! Instances are resolved by `cluster::spec::resolve_pool`, the same code that resolves the
//! cluster YAML, so a gRPC-synced instance and a YAML pool with the same fields are the same
//! instance. Field paths are the message's (`instances[1].engine.max_num_seqs`).

use crate::cluster::config::{
    AdmissionPolicy, ClusterConfig, DEFAULT_REFRESH_INTERVAL_US, InstanceConfig, InstanceRole,
    Picker, PrefixMode, RoutingPolicy, Scorer, StalenessConfig, WeightedScorer,
};
use crate::cluster::spec::{
    AdmissionSpec, ClusterSpecError, CoefficientsSpec, EngineSpec, INSTANCES_MAX,
    OffloadConnectorSpec, PoolSpec, RoutingSpec, ScorerSpec, StalenessSpec, resolve_admission,
    resolve_pool, resolve_routing, resolve_staleness,
};
use crate::sim::latency::LatencyModel;
use crate::twin::TwinError;
use crate::twin::snapshot::TwinSettings;

use super::{
    count_in, join, length_dist_from, length_dist_to, ms_to_us, positive, stale_policy_from,
    stale_policy_to, tokens, us_to_ms,
};
use crate::server::proto;

/// A decoded config sync: the cluster, the twin settings, and each instance's address.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedConfig {
    /// The cluster.
    pub cluster: ClusterConfig,
    /// The twin settings.
    pub settings: TwinSettings,
    /// Instance addresses, index-aligned with `cluster.instances`.
    pub addresses: Vec<String>,
}

fn spec_error(err: ClusterSpecError) -> TwinError {
    match err {
        ClusterSpecError::Invalid { field, reason } => TwinError::invalid(field, reason),
        ClusterSpecError::Yaml(reason) => TwinError::invalid("", reason),
    }
}

/// Decodes and resolves a `ClusterConfig` message.
pub fn cluster_from_proto(message: &proto::ClusterConfig) -> Result<DecodedConfig, TwinError> {
    if message.instances.is_empty() {
        return Err(TwinError::invalid(
            "instances",
            "needs at least one instance",
        ));
    }
    if message.instances.len() > INSTANCES_MAX as usize {
        return Err(TwinError::OverLimit(format!(
            "instances: {} instances exceed the limit of {INSTANCES_MAX}",
            message.instances.len()
        )));
    }
    let mut instances = Vec::with_capacity(message.instances.len());
    let mut addresses = Vec::with_capacity(message.instances.len());
    for (index, spec) in message.instances.iter().enumerate() {
        let path = format!("instances[{index}]");
        if message.instances[..index]
            .iter()
            .any(|other| other.id == spec.id)
        {
            return Err(TwinError::invalid(
                format!("{path}.id"),
                format!("duplicate instance id {:?}", spec.id),
            ));
        }
        instances.push(instance_from_proto(spec, &path)?);
        addresses.push(spec.address.clone());
    }
    let cluster = ClusterConfig {
        instances,
        routing: routing_from_proto(message.router.as_ref())?,
        admission: admission_from_proto(message.admission.as_ref())?,
        staleness: staleness_from_proto(message.staleness.as_ref())?,
    };
    let mut settings = settings_from_proto(message.twin.as_ref())?;
    settings.disaggregation =
        super::pd::disaggregation_from_proto(message.disaggregation.as_ref())?;
    Ok(DecodedConfig {
        cluster,
        settings,
        addresses,
    })
}

/// Largest `model_config_json`, bytes: ten times the largest config.json ditto embeds
/// (Llama 4 Scout FP8's 27 KB, most of it its quantization ignore list). A 14 MB array parsed
/// to 521 MB per sync, and echoed by GetSnapshot it broke clients' 4 MB receive limit
/// (issue 38 D13).
pub const MAX_MODEL_CONFIG_BYTES: usize = 256 * 1024;

fn instance_from_proto(
    spec: &proto::InstanceSpec,
    path: &str,
) -> Result<InstanceConfig, TwinError> {
    if spec.model_config_json.len() > MAX_MODEL_CONFIG_BYTES {
        return Err(TwinError::invalid(
            join(path, "model_config_json"),
            format!(
                "{} bytes exceed the limit of {MAX_MODEL_CONFIG_BYTES} (a config.json is tens of KB)",
                spec.model_config_json.len()
            ),
        ));
    }
    if spec.id.trim().is_empty() {
        return Err(TwinError::invalid(join(path, "id"), "must not be empty"));
    }
    super::id(&spec.id, &join(path, "id"))?;
    super::id(&spec.address, &join(path, "address"))?;
    let role = match spec.role.trim().to_ascii_lowercase().as_str() {
        "" | "both" => InstanceRole::Both,
        "prefill" => InstanceRole::Prefill,
        "decode" => InstanceRole::Decode,
        other => {
            return Err(TwinError::invalid(
                join(path, "role"),
                format!("unknown role {other:?}; expected both, prefill or decode"),
            ));
        }
    };
    let tp = match spec.tp {
        0 => 1,
        tp if (1..=64).contains(&tp) => tp as u32,
        tp => {
            return Err(TwinError::invalid(
                join(path, "tp"),
                format!("{tp} must be in 1..=64"),
            ));
        }
    };
    let latency_model = match (spec.latency_model.trim(), &spec.coefficients) {
        ("", Some(_)) => "blackbox".to_owned(),
        ("", None) => "calibrated".to_owned(),
        (name, _) => name.to_owned(),
    };
    let pool = PoolSpec {
        name: spec.id.clone(),
        replicas: 1,
        model: or_default(&spec.model, "llama-3.1-8b-instruct"),
        model_config: None,
        model_config_json: (!spec.model_config_json.trim().is_empty())
            .then(|| spec.model_config_json.clone()),
        gpu: or_default(&spec.gpu, "H100"),
        tp,
        latency_model,
        coefficients: spec.coefficients.as_ref().map(|c| CoefficientsSpec {
            alpha: c.alpha.clone(),
            beta: c.beta.clone(),
        }),
        calibrated_coefficients: None,
        cost_per_hour: spec.cost_per_hour,
        engine: engine_from_proto(spec.engine.as_ref(), &join(path, "engine"))?,
    };
    let mut instance = resolve_pool(&pool, path).map_err(spec_error)?;
    instance.id = spec.id.clone();
    instance.role = role;
    Ok(instance)
}

fn or_default(value: &str, default: &str) -> String {
    if value.trim().is_empty() {
        default.to_owned()
    } else {
        value.trim().to_owned()
    }
}

fn engine_from_proto(
    limits: Option<&proto::EngineLimits>,
    path: &str,
) -> Result<EngineSpec, TwinError> {
    let Some(limits) = limits else {
        return Ok(EngineSpec::default());
    };
    let count = |value: Option<i64>, field: &str| -> Result<Option<u32>, TwinError> {
        value.map(|v| tokens(v, &join(path, field))).transpose()
    };
    Ok(EngineSpec {
        max_num_seqs: count(limits.max_num_seqs, "max_num_seqs")?,
        max_num_batched_tokens: count(limits.max_num_batched_tokens, "max_num_batched_tokens")?,
        block_size: count(limits.block_size, "block_size")?,
        num_gpu_blocks: count(limits.num_gpu_blocks, "num_gpu_blocks")?,
        gpu_memory_utilization: limits
            .gpu_memory_utilization
            .map(|u| {
                let field = join(path, "gpu_memory_utilization");
                match positive(u, &field) {
                    Ok(u) if u <= 1.0 => Ok(u),
                    _ => Err(TwinError::invalid(
                        field,
                        format!("{} must be in (0, 1]", super::num(u)),
                    )),
                }
            })
            .transpose()?,
        max_model_len: count(limits.max_model_len, "max_model_len")?,
        long_prefill_token_threshold: count(
            limits.long_prefill_token_threshold,
            "long_prefill_token_threshold",
        )?,
        enable_chunked_prefill: limits.enable_chunked_prefill,
        enable_prefix_caching: limits.enable_prefix_caching,
        scheduling_policy: limits.scheduling_policy.clone(),
        num_cpu_blocks: count(limits.num_cpu_blocks, "num_cpu_blocks")?,
        cpu_offload_bandwidth_gbps: limits.cpu_offload_bandwidth_gbps,
        cpu_offload_gb: limits.cpu_offload_gb,
        offload_connector: limits
            .kv_offload_cpu_bytes
            .map(|bytes| match u64::try_from(bytes) {
                Ok(bytes) if bytes > 0 => Ok(OffloadConnectorSpec::of_bytes(bytes)),
                _ => Err(TwinError::invalid(
                    join(path, "kv_offload_cpu_bytes"),
                    format!("{bytes} must be at least 1 (bytes of the connector's CPU tier)"),
                )),
            })
            .transpose()?,
    })
}

/// The router policy, resolved by the same code as the cluster YAML (`cluster::spec`); its
/// `routing.*` error paths are renamed to the message's `router.*`.
fn routing_from_proto(router: Option<&proto::RouterPolicy>) -> Result<RoutingPolicy, TwinError> {
    let Some(router) = router else {
        return Ok(RoutingPolicy::llm_d_default());
    };
    let scorers = router
        .scorers
        .iter()
        .enumerate()
        .map(|(index, scorer)| scorer_spec(scorer, &format!("router.scorers[{index}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let policy = router.policy.trim();
    let spec = RoutingSpec {
        policy: if policy.is_empty() {
            "weighted"
        } else {
            policy
        }
        .to_owned(),
        scorers: (!scorers.is_empty()).then_some(scorers),
        picker: Some(router.picker.trim().to_owned()).filter(|p| !p.is_empty()),
    };
    resolve_routing(&spec).map_err(|err| match spec_error(err) {
        TwinError::InvalidField { path, why } => TwinError::InvalidField {
            path: path.replacen("routing", "router", 1),
            why,
        },
        other => other,
    })
}

/// One scorer entry, with the wire's integer fields range-checked.
fn scorer_spec(spec: &proto::ScorerSpec, path: &str) -> Result<ScorerSpec, TwinError> {
    let optional = |value: Option<i64>, field: &str| {
        value
            .map(|v| count_in(v, u32::MAX, &join(path, field)))
            .transpose()
    };
    Ok(ScorerSpec {
        name: spec.name.clone(),
        weight: spec.weight,
        mode: Some(spec.mode.trim().to_owned()).filter(|m| !m.is_empty()),
        blocks_per_instance: optional(spec.blocks_per_instance, "blocks_per_instance")?,
        threshold: optional(spec.threshold, "threshold")?,
    })
}

/// The admission policy, resolved by the same code as the cluster YAML.
fn admission_from_proto(
    admission: Option<&proto::AdmissionPolicy>,
) -> Result<AdmissionPolicy, TwinError> {
    let Some(admission) = admission else {
        return Ok(AdmissionPolicy::Always);
    };
    let policy = admission.policy.trim();
    let spec = AdmissionSpec {
        policy: if policy.is_empty() { "always" } else { policy }.to_owned(),
        capacity_tokens: admission.capacity_tokens,
        refill_tokens_per_s: admission.refill_tokens_per_s,
        queue_threshold: admission.queue_threshold,
        kv_threshold: admission.kv_threshold,
    };
    resolve_admission(&spec).map_err(spec_error)
}

/// Signal staleness, resolved by the same code as the cluster YAML.
fn staleness_from_proto(
    staleness: Option<&proto::Staleness>,
) -> Result<StalenessConfig, TwinError> {
    let Some(staleness) = staleness else {
        return Ok(StalenessConfig::uniform(DEFAULT_REFRESH_INTERVAL_US));
    };
    resolve_staleness(StalenessSpec {
        refresh_interval_ms: staleness.refresh_interval_ms,
        queue_depth_ms: staleness.queue_depth_ms,
        running_ms: staleness.running_ms,
        kv_usage_ms: staleness.kv_usage_ms,
        prefix_cache_ms: staleness.prefix_cache_ms,
    })
    .map_err(spec_error)
}

fn settings_from_proto(twin: Option<&proto::TwinSettings>) -> Result<TwinSettings, TwinError> {
    let mut settings = TwinSettings::defaults();
    let Some(twin) = twin else {
        return Ok(settings);
    };
    if let Some(policy) = stale_policy_from(twin.default_stale_policy, "twin.default_stale_policy")?
    {
        settings.default_stale_policy = policy;
    }
    if let Some(ms) = twin.max_signal_age_ms {
        let path = "twin.max_signal_age_ms";
        settings.max_signal_age_us = ms_to_us(positive(ms, path)?, path)?;
    }
    if twin.output_tokens.is_some() {
        settings.output_tokens =
            length_dist_from(twin.output_tokens.as_ref(), "twin.output_tokens")?;
    }
    Ok(settings)
}

/// Encodes the config in force with every default resolved (for snapshots).
pub fn cluster_to_proto(
    cluster: &ClusterConfig,
    settings: &TwinSettings,
    addresses: &[String],
) -> proto::ClusterConfig {
    let instances = cluster
        .instances
        .iter()
        .enumerate()
        .map(|(index, instance)| {
            instance_to_proto(instance, addresses.get(index).map_or("", String::as_str))
        })
        .collect();
    proto::ClusterConfig {
        instances,
        router: Some(routing_to_proto(&cluster.routing)),
        admission: Some(admission_to_proto(&cluster.admission)),
        staleness: Some(proto::Staleness {
            refresh_interval_ms: None,
            queue_depth_ms: Some(us_to_ms(cluster.staleness.queue_depth_us)),
            running_ms: Some(us_to_ms(cluster.staleness.running_us)),
            kv_usage_ms: Some(us_to_ms(cluster.staleness.kv_usage_us)),
            prefix_cache_ms: Some(us_to_ms(cluster.staleness.prefix_cache_us)),
        }),
        twin: Some(proto::TwinSettings {
            default_stale_policy: stale_policy_to(Some(settings.default_stale_policy)),
            max_signal_age_ms: Some(us_to_ms(settings.max_signal_age_us)),
            output_tokens: Some(length_dist_to(&settings.output_tokens)),
        }),
        disaggregation: settings
            .disaggregation
            .as_ref()
            .map(super::pd::disaggregation_to_proto),
    }
}

/// The connector's `cpu_bytes_to_use` as GetSnapshot echoes it: its tier's whole blocks
/// times one block's KV over layers and ranks (what `OffloadConnector::of_bytes` divides
/// by), so the echo re-syncs to the same tier.
fn connector_bytes(instance: &InstanceConfig) -> Option<i64> {
    let connector = instance.engine.offload_connector?;
    let arch = match instance.model_config_json.as_deref() {
        Some(json) => crate::catalog::parse_model_config(&instance.model, json).ok()?,
        None => crate::catalog::model(&instance.model).ok()?,
    };
    let per_block =
        crate::sim::OffloadConnector::block_bytes(&arch, instance.tp, instance.engine.block_size);
    i64::try_from(u64::from(connector.cpu_blocks).saturating_mul(per_block)).ok()
}

fn instance_to_proto(instance: &InstanceConfig, address: &str) -> proto::InstanceSpec {
    let engine = &instance.engine;
    let role = match instance.role {
        InstanceRole::Both => "both",
        InstanceRole::Prefill => "prefill",
        InstanceRole::Decode => "decode",
    };
    let coefficients = match &instance.latency {
        LatencyModel::Blackbox(coefficients) => Some(proto::BlackboxCoefficients {
            alpha: coefficients.alpha.to_vec(),
            beta: coefficients.beta.to_vec(),
        }),
        _ => None,
    };
    proto::InstanceSpec {
        id: instance.id.clone(),
        address: address.to_owned(),
        role: role.to_owned(),
        model: instance.model.clone(),
        // A model that is not embedded goes back with its config, so the answer re-syncs.
        model_config_json: instance
            .model_config_json
            .as_deref()
            .unwrap_or_default()
            .to_owned(),
        gpu: instance.gpu.clone(),
        tp: i64::from(instance.tp),
        engine: Some(proto::EngineLimits {
            block_size: Some(i64::from(engine.block_size)),
            num_gpu_blocks: Some(i64::from(engine.num_gpu_blocks)),
            max_num_seqs: Some(i64::from(engine.max_num_seqs)),
            max_num_batched_tokens: Some(i64::from(engine.max_num_batched_tokens)),
            max_model_len: Some(i64::from(engine.max_model_len)),
            enable_prefix_caching: Some(engine.enable_prefix_caching),
            enable_chunked_prefill: Some(engine.enable_chunked_prefill),
            scheduling_policy: Some(engine.scheduling_policy.as_str().to_owned()),
            long_prefill_token_threshold: Some(i64::from(engine.long_prefill_token_threshold)),
            gpu_memory_utilization: None,
            num_cpu_blocks: Some(i64::from(engine.num_cpu_blocks)),
            cpu_offload_bandwidth_gbps: None,
            cpu_offload_gb: (engine.cpu_offload_gb > 0.0).then_some(engine.cpu_offload_gb),
            kv_offload_cpu_bytes: connector_bytes(instance),
        }),
        latency_model: instance.latency.kind().as_str().to_owned(),
        coefficients,
        cost_per_hour: instance.cost_per_hour,
    }
}

fn routing_to_proto(routing: &RoutingPolicy) -> proto::RouterPolicy {
    let simple = |policy: &str| proto::RouterPolicy {
        policy: policy.to_owned(),
        ..proto::RouterPolicy::default()
    };
    match routing {
        RoutingPolicy::RoundRobin => simple("round-robin"),
        RoutingPolicy::Random => simple("random"),
        RoutingPolicy::LeastLoaded => simple("least-loaded"),
        RoutingPolicy::VllmDataParallel => simple("vllm-dp"),
        RoutingPolicy::Weighted { scorers, picker } => proto::RouterPolicy {
            policy: "weighted".to_owned(),
            scorers: scorers.iter().map(scorer_to_proto).collect(),
            picker: match picker {
                Picker::MaxScore => "max-score",
                Picker::WeightedRandom => "weighted-random",
            }
            .to_owned(),
        },
    }
}

fn scorer_to_proto(scorer: &WeightedScorer) -> proto::ScorerSpec {
    let mut spec = proto::ScorerSpec {
        weight: scorer.weight,
        ..proto::ScorerSpec::default()
    };
    spec.name = match scorer.scorer {
        Scorer::QueueDepth => "queue-depth",
        Scorer::KvCacheUtilization => "kv-cache-utilization",
        Scorer::ActiveRequests => "active-requests",
        Scorer::RunningRequests => "running-requests",
        Scorer::LoadAware { threshold } => {
            spec.threshold = Some(i64::from(threshold));
            "load-aware"
        }
        Scorer::PrefixCache(PrefixMode::Approximate {
            blocks_per_instance,
        }) => {
            spec.mode = "approximate".to_owned();
            spec.blocks_per_instance = Some(i64::from(blocks_per_instance));
            "prefix-cache"
        }
        Scorer::PrefixCache(PrefixMode::Precise) => {
            spec.mode = "precise".to_owned();
            "prefix-cache"
        }
    }
    .to_owned();
    spec
}

fn admission_to_proto(admission: &AdmissionPolicy) -> proto::AdmissionPolicy {
    match *admission {
        AdmissionPolicy::Always => proto::AdmissionPolicy {
            policy: "always".to_owned(),
            ..proto::AdmissionPolicy::default()
        },
        AdmissionPolicy::TokenBucket {
            capacity_tokens,
            refill_tokens_per_s,
        } => proto::AdmissionPolicy {
            policy: "token-bucket".to_owned(),
            capacity_tokens: Some(capacity_tokens),
            refill_tokens_per_s: Some(refill_tokens_per_s),
            ..proto::AdmissionPolicy::default()
        },
        AdmissionPolicy::SaturationShedding {
            queue_threshold,
            kv_threshold,
        } => proto::AdmissionPolicy {
            policy: "saturation".to_owned(),
            queue_threshold: Some(queue_threshold),
            kv_threshold: Some(kv_threshold),
            ..proto::AdmissionPolicy::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_instance() -> proto::ClusterConfig {
        proto::ClusterConfig {
            instances: vec![proto::InstanceSpec {
                id: "ns/vllm-0:8000".into(),
                address: "10.0.0.1:8000".into(),
                ..proto::InstanceSpec::default()
            }],
            ..proto::ClusterConfig::default()
        }
    }

    #[test]
    fn defaults_resolve_like_the_yaml() {
        let decoded = cluster_from_proto(&one_instance()).unwrap();
        let instance = &decoded.cluster.instances[0];
        assert_eq!(instance.id, "ns/vllm-0:8000");
        assert_eq!(instance.model, "llama-3.1-8b-instruct");
        assert_eq!(instance.engine.num_gpu_blocks, 26312);
        assert_eq!(decoded.cluster.routing, RoutingPolicy::llm_d_default());
        assert_eq!(decoded.settings, TwinSettings::defaults());
        assert_eq!(decoded.addresses, vec!["10.0.0.1:8000".to_owned()]);
    }

    #[test]
    fn the_echoed_config_decodes_to_the_same_config() {
        let decoded = cluster_from_proto(&one_instance()).unwrap();
        let echoed = cluster_to_proto(&decoded.cluster, &decoded.settings, &decoded.addresses);
        let again = cluster_from_proto(&echoed).unwrap();
        assert_eq!(again, decoded);
    }

    #[test]
    fn errors_name_the_field() {
        let mut message = one_instance();
        message.instances[0].tp = -2;
        let err = cluster_from_proto(&message).unwrap_err();
        assert!(err.to_string().starts_with("instances[0].tp: "), "{err}");
        let mut message = one_instance();
        message.instances[0].engine = Some(proto::EngineLimits {
            max_num_seqs: Some(-1),
            ..proto::EngineLimits::default()
        });
        let err = cluster_from_proto(&message).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("instances[0].engine.max_num_seqs: "),
            "{err}"
        );
        let mut message = one_instance();
        message.instances[0].model_config_json = format!("[{}0]", "0,".repeat(200_000));
        let err = cluster_from_proto(&message).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("instances[0].model_config_json: 400003 bytes exceed"),
            "{err}"
        );
        let mut message = one_instance();
        message.instances[0].model = "no-such-model".into();
        let err = cluster_from_proto(&message).unwrap_err();
        assert!(err.to_string().starts_with("instances[0].model: "), "{err}");
    }
}
