//! The `disaggregation:` section of the cluster YAML and the pools' `role:`, resolved into
//! a [`DisaggConfig`] (docs/disaggregation.md).

use serde::Deserialize;

use super::{ClusterSpecError, PoolSpec, RoutingSpec, invalid, resolve_routing};
use crate::catalog;
use crate::catalog::kv_connectors::{kv_connector, kv_link};
use crate::cluster::config::InstanceRole;
use crate::cluster::disagg::{
    DEFAULT_HOLD_TIMEOUT_US, DEFAULT_PREFILL_RETRY_BACKOFF_US, DisaggConfig, InstanceKv, PdDecider,
    PdFaults, StageOrder, TransferModel, llm_d_pd_profile,
};

/// The connector used when the section names none (llm-d's default).
pub const DEFAULT_CONNECTOR: &str = "nixl";
/// The link used when the section names none (the HGX reference design's NIC per GPU).
pub const DEFAULT_LINK: &str = "rdma-400g";

/// The `disaggregation:` section.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisaggSpec {
    /// `disagg-profile-handler` (default) or its alias `pd-profile-handler`.
    #[serde(default)]
    pub handler: Option<String>,
    /// `decode-first` (llm-d's default) or `prefill-first`.
    #[serde(default)]
    pub stage_order: Option<String>,
    /// The `prefix-based-pd-decider`'s parameters.
    #[serde(default)]
    pub decider: Option<DeciderSpec>,
    /// The prefill profile (default: llm-d's P/D profile, prefix-cache 2, queue 1).
    #[serde(default)]
    pub prefill_routing: Option<RoutingSpec>,
    /// KV connector in `data/kv_connectors.json` (default nixl).
    #[serde(default)]
    pub connector: Option<String>,
    /// Link in `data/kv_connectors.json` (default rdma-400g).
    #[serde(default)]
    pub link: Option<String>,
    /// Overrides the link's bandwidth, GB/s per direction per GPU pair.
    #[serde(default)]
    pub bandwidth_gb_s: Option<f64>,
    /// Overrides the connector's cost per descriptor, µs.
    #[serde(default)]
    pub descriptor_us: Option<f64>,
    /// Overrides the connector's fixed cost per transfer, µs.
    #[serde(default)]
    pub setup_us: Option<u64>,
    /// How long a prefill pod holds KV for its pull, s (vLLM's
    /// `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`, default 480).
    #[serde(default)]
    pub abort_request_timeout_s: Option<f64>,
    /// Probability that one prefill attempt fails with a retryable 5xx (default 0).
    #[serde(default)]
    pub prefill_failure_rate: Option<f64>,
    /// The routing sidecar's `--prefill-max-retries` (default 0).
    #[serde(default)]
    pub prefill_max_retries: Option<u32>,
    /// The routing sidecar's `--prefill-retry-backoff`, ms (default 200).
    #[serde(default)]
    pub prefill_retry_backoff_ms: Option<f64>,
    /// Probability that one KV pull fails in transport (default 0).
    #[serde(default)]
    pub transfer_failure_rate: Option<f64>,
}

/// The most retries a sidecar may be configured with here (a bound on simulated events).
pub const MAX_PREFILL_RETRIES: u32 = 100;

/// `prefix-based-pd-decider` parameters (llm-d's names in snake case).
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeciderSpec {
    /// `nonCachedTokens` (default 16, llm-d's sample P/D config).
    #[serde(default)]
    pub non_cached_tokens: Option<u32>,
    /// `promptTokens` (default 0: no gate).
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
}

/// Parses a pool's `role:` (`both` when absent, as llm-d treats an unlabelled pod).
pub fn resolve_role(role: Option<&str>, path: &str) -> Result<InstanceRole, ClusterSpecError> {
    match role.map(|r| r.trim().to_ascii_lowercase()).as_deref() {
        None | Some("both") | Some("prefill-decode") => Ok(InstanceRole::Both),
        Some("prefill") => Ok(InstanceRole::Prefill),
        Some("decode") => Ok(InstanceRole::Decode),
        Some(other) => Err(invalid(
            format!("{path}.role"),
            format!("unknown role {other:?}; expected prefill, decode or both"),
        )),
    }
}

/// The KV geometry of one instance of `pool` (its model resolved as `resolve_pool` does).
pub fn pool_kv(
    pool: &PoolSpec,
    path: &str,
    block_size: u32,
) -> Result<InstanceKv, ClusterSpecError> {
    let arch = match &pool.model_config_json {
        Some(json) => catalog::parse_model_config(&pool.model, json)
            .map_err(|err| invalid(format!("{path}.model"), err.to_string()))?,
        None => catalog::model(&pool.model)
            .map_err(|err| invalid(format!("{path}.model"), err.to_string()))?,
    };
    Ok(InstanceKv {
        bytes_per_token_per_rank: arch.kv_bytes_per_token(pool.tp),
        layers: arch.num_layers,
        planes: if arch.is_mla() { 1 } else { 2 },
        tp: pool.tp,
        block_size,
    })
}

/// Resolves the section over the instances' KV geometry; errors name
/// `disaggregation.*` fields.
pub fn resolve_disaggregation(
    spec: &DisaggSpec,
    kv: Vec<InstanceKv>,
) -> Result<DisaggConfig, ClusterSpecError> {
    let field = |name: &str| format!("disaggregation.{name}");
    match spec.handler.as_deref().map(str::trim) {
        None | Some("disagg-profile-handler") | Some("pd-profile-handler") => {}
        Some(other) => {
            return Err(invalid(
                field("handler"),
                format!("unknown handler {other:?}; expected disagg-profile-handler"),
            ));
        }
    }
    let stage_order = resolve_stage_order(spec.stage_order.as_deref())?;
    let decider_set = spec
        .decider
        .is_some_and(|d| d.non_cached_tokens.is_some() || d.prompt_tokens.is_some());
    if stage_order == StageOrder::PrefillFirst && decider_set {
        return Err(invalid(
            field("decider"),
            "a prefill decider is not supported in the prefill-first stage order (llm-d \
             refuses it: the prefill profile runs for every request)",
        ));
    }
    let faults = resolve_faults(spec)?;
    let decider_spec = spec.decider.unwrap_or_default();
    let decider = PdDecider {
        non_cached_tokens: decider_spec
            .non_cached_tokens
            .unwrap_or(PdDecider::LLM_D_SAMPLE.non_cached_tokens),
        prompt_tokens: decider_spec.prompt_tokens.unwrap_or(0),
    };
    let prefill_routing = match &spec.prefill_routing {
        Some(routing) => resolve_routing(routing).map_err(|err| match err {
            ClusterSpecError::Invalid {
                field: inner,
                reason,
            } => invalid(format!("disaggregation.prefill_{inner}"), reason),
            other => other,
        })?,
        None => llm_d_pd_profile(),
    };
    let connector = kv_connector(spec.connector.as_deref().unwrap_or(DEFAULT_CONNECTOR))
        .map_err(|err| invalid(field("connector"), err.to_string()))?;
    let link = kv_link(spec.link.as_deref().unwrap_or(DEFAULT_LINK))
        .map_err(|err| invalid(field("link"), err.to_string()))?;
    let bandwidth_gb_s = spec.bandwidth_gb_s.unwrap_or(link.bandwidth_gb_s);
    if !(bandwidth_gb_s.is_finite() && bandwidth_gb_s > 0.0) {
        return Err(invalid(
            field("bandwidth_gb_s"),
            "must be a positive number",
        ));
    }
    let descriptor_us = spec.descriptor_us.unwrap_or(connector.descriptor_us);
    if !(descriptor_us.is_finite() && descriptor_us >= 0.0) {
        return Err(invalid(
            field("descriptor_us"),
            "must be a non-negative number",
        ));
    }
    let hold_timeout_us = match spec.abort_request_timeout_s {
        None => DEFAULT_HOLD_TIMEOUT_US,
        Some(seconds) if seconds.is_finite() && seconds > 0.0 && seconds <= 1e6 => {
            (seconds * 1e6).round() as u64
        }
        Some(_) => {
            return Err(invalid(
                field("abort_request_timeout_s"),
                "must be a positive number of seconds, at most 1e6",
            ));
        }
    };
    Ok(DisaggConfig {
        hold_timeout_us,
        decider,
        stage_order,
        faults,
        prefill_routing,
        transfer: TransferModel {
            bandwidth_gb_s,
            descriptor_us,
            setup_us: spec.setup_us.unwrap_or(connector.setup_us),
        },
        kv,
    })
}

/// llm-d's `ParseStageOrder`: case, `-` and `_` ignored; `decode-first` (or `decode`, or
/// nothing) and `prefill-first` (or `prefill`).
fn resolve_stage_order(order: Option<&str>) -> Result<StageOrder, ClusterSpecError> {
    let Some(order) = order else {
        return Ok(StageOrder::DecodeFirst);
    };
    let squashed: String = order
        .trim()
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .collect::<String>()
        .to_ascii_lowercase();
    match squashed.as_str() {
        "" | "decodefirst" | "decode" => Ok(StageOrder::DecodeFirst),
        "prefillfirst" | "prefill" => Ok(StageOrder::PrefillFirst),
        _ => Err(invalid(
            "disaggregation.stage_order",
            format!("unknown order {order:?}; expected decode-first or prefill-first"),
        )),
    }
}

/// The failure rates and the sidecar's retry settings; errors name their field.
fn resolve_faults(spec: &DisaggSpec) -> Result<PdFaults, ClusterSpecError> {
    let rate = |value: Option<f64>, name: &str| match value {
        None => Ok(0.0),
        Some(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        Some(_) => Err(invalid(
            format!("disaggregation.{name}"),
            "must be a probability between 0 and 1",
        )),
    };
    let prefill_max_retries = spec.prefill_max_retries.unwrap_or(0);
    if prefill_max_retries > MAX_PREFILL_RETRIES {
        return Err(invalid(
            "disaggregation.prefill_max_retries",
            format!("at most {MAX_PREFILL_RETRIES}"),
        ));
    }
    let prefill_retry_backoff_us = match spec.prefill_retry_backoff_ms {
        None => DEFAULT_PREFILL_RETRY_BACKOFF_US,
        // llm-d: the backoff must be positive when retries are on.
        Some(ms) if ms.is_finite() && ms > 0.0 && ms <= 3.6e6 => (ms * 1e3).round() as u64,
        Some(_) => {
            return Err(invalid(
                "disaggregation.prefill_retry_backoff_ms",
                "must be a positive number of ms, at most one hour",
            ));
        }
    };
    Ok(PdFaults {
        prefill_failure_rate: rate(spec.prefill_failure_rate, "prefill_failure_rate")?,
        prefill_max_retries,
        prefill_retry_backoff_us,
        transfer_failure_rate: rate(spec.transfer_failure_rate, "transfer_failure_rate")?,
    })
}

/// The `disaggregation:` section of a cluster YAML document alone (`None` without one), for
/// callers that resolve the rest of the document with [`super::parse_cluster_yaml`] (which
/// validates the section but returns only the `ClusterConfig`).
pub fn disaggregation_section(text: &str) -> Result<Option<DisaggSpec>, ClusterSpecError> {
    #[derive(serde::Deserialize)]
    struct Section {
        #[serde(default)]
        disaggregation: Option<DisaggSpec>,
    }
    let section: Section =
        serde_saphyr::from_str(text).map_err(|err| ClusterSpecError::Yaml(err.to_string()))?;
    Ok(section.disaggregation)
}
