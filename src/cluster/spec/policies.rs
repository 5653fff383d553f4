//! The router, admission and staleness sections of the cluster YAML (and the same policies
//! named by the gRPC config and `--routing`), resolved into domain config with field-path
//! errors.

use serde::Deserialize;

use super::{ClusterSpecError, invalid};
use crate::cluster::config::{
    AdmissionPolicy, DEFAULT_PREFIX_INDEX_BLOCKS, DEFAULT_REFRESH_INTERVAL_US, Picker, PrefixMode,
    RoutingPolicy, Scorer, StalenessConfig, WeightedScorer,
};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
/// The `routing:` section (also built from the gRPC `RouterPolicy`).
pub struct RoutingSpec {
    /// Policy name.
    pub policy: String,
    #[serde(default)]
    /// Weighted scorers (default: llm-d's profile).
    pub scorers: Option<Vec<ScorerSpec>>,
    #[serde(default)]
    /// Picker name (default max-score).
    pub picker: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
/// One weighted scorer entry.
pub struct ScorerSpec {
    /// Scorer name.
    pub name: String,
    /// Weight.
    pub weight: f64,
    #[serde(default)]
    /// Prefix mode: approximate or precise.
    pub mode: Option<String>,
    #[serde(default)]
    /// Approximate index size per instance.
    pub blocks_per_instance: Option<u32>,
    #[serde(default)]
    /// Load-aware queue threshold.
    pub threshold: Option<u32>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
/// The `admission:` section (also built from the gRPC `AdmissionPolicy`).
pub struct AdmissionSpec {
    /// Policy name.
    pub policy: String,
    #[serde(default)]
    /// Token-bucket size.
    pub capacity_tokens: Option<f64>,
    #[serde(default)]
    /// Token-bucket refill rate.
    pub refill_tokens_per_s: Option<f64>,
    #[serde(default)]
    /// Saturation queue threshold.
    pub queue_threshold: Option<f64>,
    #[serde(default)]
    /// Saturation KV threshold.
    pub kv_threshold: Option<f64>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
/// The `staleness:` section, in milliseconds (also built from the gRPC `Staleness`).
pub struct StalenessSpec {
    #[serde(default)]
    /// Every signal's refresh interval.
    pub refresh_interval_ms: Option<f64>,
    #[serde(default)]
    /// Queue-depth refresh interval.
    pub queue_depth_ms: Option<f64>,
    #[serde(default)]
    /// Running-count refresh interval.
    pub running_ms: Option<f64>,
    #[serde(default)]
    /// KV-usage refresh interval.
    pub kv_usage_ms: Option<f64>,
    #[serde(default)]
    /// Prefix-view refresh interval.
    pub prefix_cache_ms: Option<f64>,
}

/// Resolves a routing section; errors name `routing.*` fields.
pub fn resolve_routing(spec: &RoutingSpec) -> Result<RoutingPolicy, ClusterSpecError> {
    let policy = spec.policy.trim().to_ascii_lowercase();
    if policy != "weighted" && (spec.scorers.is_some() || spec.picker.is_some()) {
        return Err(invalid(
            "routing.scorers",
            format!("scorers and picker need policy: weighted (got {policy:?})"),
        ));
    }
    match policy.as_str() {
        "round-robin" => Ok(RoutingPolicy::RoundRobin),
        "random" => Ok(RoutingPolicy::Random),
        "least-loaded" => Ok(RoutingPolicy::LeastLoaded),
        "vllm-dp" => Ok(RoutingPolicy::VllmDataParallel),
        "weighted" => {
            let picker = match spec.picker.as_deref().map(str::trim) {
                None | Some("max-score") => Picker::MaxScore,
                Some("weighted-random") => Picker::WeightedRandom,
                Some(other) => {
                    return Err(invalid(
                        "routing.picker",
                        format!("unknown picker {other:?}; expected max-score or weighted-random"),
                    ));
                }
            };
            let scorers = match &spec.scorers {
                None => match RoutingPolicy::llm_d_default() {
                    RoutingPolicy::Weighted { scorers, .. } => scorers,
                    _ => Vec::new(),
                },
                Some(list) => list
                    .iter()
                    .enumerate()
                    .map(|(index, scorer)| {
                        resolve_scorer(scorer, &format!("routing.scorers[{index}]"))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            };
            if scorers.is_empty() || scorers.iter().all(|s| s.weight == 0.0) {
                return Err(invalid(
                    "routing.scorers",
                    "needs at least one scorer with a positive weight",
                ));
            }
            Ok(RoutingPolicy::Weighted { scorers, picker })
        }
        other => Err(invalid(
            "routing.policy",
            format!(
                "unknown policy {other:?}; expected round-robin, random, least-loaded, vllm-dp or weighted"
            ),
        )),
    }
}

fn resolve_scorer(spec: &ScorerSpec, path: &str) -> Result<WeightedScorer, ClusterSpecError> {
    if !(spec.weight.is_finite() && spec.weight >= 0.0) {
        return Err(invalid(
            format!("{path}.weight"),
            "must be a non-negative number",
        ));
    }
    let name = spec.name.trim().to_ascii_lowercase();
    if name != "prefix-cache" && (spec.mode.is_some() || spec.blocks_per_instance.is_some()) {
        return Err(invalid(
            format!("{path}.mode"),
            "only the prefix-cache scorer has a mode",
        ));
    }
    if name != "load-aware" && spec.threshold.is_some() {
        return Err(invalid(
            format!("{path}.threshold"),
            "only the load-aware scorer has a threshold",
        ));
    }
    let scorer = match name.as_str() {
        "queue-depth" | "queue" => Scorer::QueueDepth,
        "kv-cache-utilization" | "kv-cache" => Scorer::KvCacheUtilization,
        "active-requests" => Scorer::ActiveRequests,
        "running-requests" => Scorer::RunningRequests,
        "load-aware" => {
            let threshold = spec.threshold.unwrap_or(128);
            if threshold == 0 {
                return Err(invalid(format!("{path}.threshold"), "must be at least 1"));
            }
            Scorer::LoadAware { threshold }
        }
        "prefix-cache" | "prefix" => {
            match spec.mode.as_deref().map(str::trim).unwrap_or("approximate") {
                "approximate" => {
                    let blocks = spec
                        .blocks_per_instance
                        .unwrap_or(DEFAULT_PREFIX_INDEX_BLOCKS);
                    if blocks == 0 {
                        return Err(invalid(
                            format!("{path}.blocks_per_instance"),
                            "must be at least 1",
                        ));
                    }
                    Scorer::PrefixCache(PrefixMode::Approximate {
                        blocks_per_instance: blocks,
                    })
                }
                "precise" => {
                    if spec.blocks_per_instance.is_some() {
                        return Err(invalid(
                            format!("{path}.blocks_per_instance"),
                            "only the approximate mode has an index size",
                        ));
                    }
                    Scorer::PrefixCache(PrefixMode::Precise)
                }
                other => {
                    return Err(invalid(
                        format!("{path}.mode"),
                        format!("unknown mode {other:?}; expected approximate or precise"),
                    ));
                }
            }
        }
        other => {
            return Err(invalid(
                format!("{path}.name"),
                format!(
                    "unknown scorer {other:?}; expected queue-depth, kv-cache-utilization, prefix-cache, load-aware, active-requests or running-requests"
                ),
            ));
        }
    };
    Ok(WeightedScorer {
        scorer,
        weight: spec.weight,
    })
}

/// Resolves an admission section; errors name `admission.*` fields.
pub fn resolve_admission(spec: &AdmissionSpec) -> Result<AdmissionPolicy, ClusterSpecError> {
    let positive =
        |value: Option<f64>, default: f64, field: &str| -> Result<f64, ClusterSpecError> {
            let value = value.unwrap_or(default);
            if value.is_finite() && value > 0.0 {
                Ok(value)
            } else {
                Err(invalid(
                    format!("admission.{field}"),
                    "must be a positive number",
                ))
            }
        };
    let policy = spec.policy.trim().to_ascii_lowercase();
    let unused = |fields: &[(&str, bool)]| -> Result<(), ClusterSpecError> {
        match fields.iter().find(|(_, set)| *set) {
            Some((field, _)) => Err(invalid(
                format!("admission.{field}"),
                format!("not used by policy {policy:?}"),
            )),
            None => Ok(()),
        }
    };
    let bucket_fields = [
        ("capacity_tokens", spec.capacity_tokens.is_some()),
        ("refill_tokens_per_s", spec.refill_tokens_per_s.is_some()),
    ];
    let saturation_fields = [
        ("queue_threshold", spec.queue_threshold.is_some()),
        ("kv_threshold", spec.kv_threshold.is_some()),
    ];
    match policy.as_str() {
        "always" => {
            unused(&bucket_fields)?;
            unused(&saturation_fields)?;
            Ok(AdmissionPolicy::Always)
        }
        "token-bucket" => {
            unused(&saturation_fields)?;
            Ok(AdmissionPolicy::TokenBucket {
                capacity_tokens: positive(spec.capacity_tokens, 10_000.0, "capacity_tokens")?,
                refill_tokens_per_s: positive(
                    spec.refill_tokens_per_s,
                    1_000.0,
                    "refill_tokens_per_s",
                )?,
            })
        }
        "saturation" | "saturation-shedding" => {
            unused(&bucket_fields)?;
            Ok(AdmissionPolicy::SaturationShedding {
                queue_threshold: positive(spec.queue_threshold, 5.0, "queue_threshold")?,
                kv_threshold: positive(spec.kv_threshold, 0.8, "kv_threshold")?,
            })
        }
        other => Err(invalid(
            "admission.policy",
            format!("unknown policy {other:?}; expected always, token-bucket or saturation"),
        )),
    }
}

/// Resolves a staleness section; errors name `staleness.*` fields.
pub fn resolve_staleness(spec: StalenessSpec) -> Result<StalenessConfig, ClusterSpecError> {
    let to_us =
        |value: Option<f64>, default_us: u64, field: &str| -> Result<u64, ClusterSpecError> {
            match value {
                None => Ok(default_us),
                Some(ms) if ms.is_finite() && (0.0..=3.6e6).contains(&ms) => {
                    Ok((ms * 1000.0).round() as u64)
                }
                Some(_) => Err(invalid(
                    format!("staleness.{field}"),
                    "must be in [0, 3600000] ms",
                )),
            }
        };
    let base = to_us(
        spec.refresh_interval_ms,
        DEFAULT_REFRESH_INTERVAL_US,
        "refresh_interval_ms",
    )?;
    Ok(StalenessConfig {
        queue_depth_us: to_us(spec.queue_depth_ms, base, "queue_depth_ms")?,
        running_us: to_us(spec.running_ms, base, "running_ms")?,
        kv_usage_us: to_us(spec.kv_usage_ms, base, "kv_usage_ms")?,
        prefix_cache_us: to_us(spec.prefix_cache_ms, base, "prefix_cache_ms")?,
    })
}

/// Parses a routing policy name for quick experiments (`--routing`): `round-robin`,
/// `random`, `least-loaded`, `vllm-dp` or `weighted` (llm-d's default profile).
pub fn routing_by_name(name: &str) -> Result<RoutingPolicy, ClusterSpecError> {
    resolve_routing(&RoutingSpec {
        policy: name.to_owned(),
        scorers: None,
        picker: None,
    })
}
