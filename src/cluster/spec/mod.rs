//! The cluster YAML: pools of identical instances, router, admission and staleness,
//! resolved into a [`ClusterConfig`] with every engine config and latency model built.
//!
//! Parsing is strict (unknown fields are errors) and every validation error names the field
//! path, e.g. `pools[1].engine.max_num_seqs: must be at least 1`. Knows the file format and
//! the catalog; knows nothing about running a simulation. See docs/cluster.md.

use serde::Deserialize;
use thiserror::Error;

mod autoscale;
mod disagg;
mod offload;
mod policies;

pub use autoscale::{
    AutoscalerSpec, PolicySpec, RateSpec, RulesSpec, parse_autoscaler, resolve_autoscaler,
};

pub use disagg::{
    DEFAULT_CONNECTOR, DEFAULT_LINK, DeciderSpec, DisaggSpec, disaggregation_section, pool_kv,
    resolve_disaggregation, resolve_role,
};

pub use offload::{OffloadConnectorSpec, resolve_offload_connector};
pub use policies::{
    AdmissionSpec, RoutingSpec, ScorerSpec, StalenessSpec, resolve_admission, resolve_routing,
    resolve_staleness, routing_by_name,
};

use super::config::{AdmissionPolicy, ClusterConfig, InstanceConfig, InstanceRole, RoutingPolicy};
use crate::catalog;
use crate::sim::latency::{
    BlackboxCoefficients, GpuSpec, LatencyKind, LatencyModel, ModelArch, WeightOffload,
};
use crate::sim::{EngineConfig, SchedulingPolicy, capacity};

/// The embedded default cluster's YAML.
pub const DEFAULT_CLUSTER_YAML: &str = include_str!("../../../data/clusters/default.yaml");

/// Most instances a cluster may have.
pub const INSTANCES_MAX: u32 = 4096;

/// A cluster file that cannot be used.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum ClusterSpecError {
    /// The YAML does not parse or has unknown fields.
    #[error("cluster YAML: {0}")]
    Yaml(String),
    /// A field has an unusable value.
    #[error("{field}: {reason}")]
    Invalid {
        /// Field path.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ClusterSpecError {
    ClusterSpecError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The file's top level.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    pools: Vec<PoolEntry>,
    #[serde(default)]
    routing: Option<RoutingSpec>,
    #[serde(default)]
    admission: Option<AdmissionSpec>,
    #[serde(default)]
    staleness: Option<StalenessSpec>,
    /// Prefill/decode disaggregation (docs/disaggregation.md).
    #[serde(default)]
    disaggregation: Option<DisaggSpec>,
    /// The autoscaler, read by `spec::autoscale::parse_autoscaler` (docs/autoscaling.md).
    #[serde(default)]
    #[allow(dead_code)]
    autoscaler: Option<serde::de::IgnoredAny>,
    /// Live-mirror pod sources, read by `live::config` (not part of the simulated cluster).
    #[serde(default)]
    #[allow(dead_code)]
    sources: Option<serde::de::IgnoredAny>,
}

/// A pool as the YAML gives it: [`PoolSpec`]'s fields and the pool's role (a copy of its
/// fields, so unknown fields stay errors: serde cannot deny them through a flattened struct).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolEntry {
    name: String,
    #[serde(default = "one")]
    replicas: u32,
    #[serde(default = "default_model")]
    model: String,
    #[serde(default)]
    model_config: Option<String>,
    #[serde(default = "default_gpu")]
    gpu: String,
    #[serde(default = "one")]
    tp: u32,
    #[serde(default = "default_latency")]
    latency_model: String,
    #[serde(default)]
    coefficients: Option<CoefficientsSpec>,
    #[serde(default)]
    calibrated_coefficients: Option<std::collections::BTreeMap<String, f64>>,
    #[serde(default)]
    cost_per_hour: f64,
    #[serde(default)]
    engine: EngineSpec,
    /// `prefill`, `decode` or `both` (default; llm-d's `llm-d.ai/role` label).
    #[serde(default)]
    role: Option<String>,
}

impl PoolEntry {
    fn pool(&self) -> PoolSpec {
        PoolSpec {
            name: self.name.clone(),
            replicas: self.replicas,
            model: self.model.clone(),
            model_config: self.model_config.clone(),
            model_config_json: None,
            gpu: self.gpu.clone(),
            tp: self.tp,
            latency_model: self.latency_model.clone(),
            coefficients: self.coefficients.clone(),
            calibrated_coefficients: self.calibrated_coefficients.clone(),
            cost_per_hour: self.cost_per_hour,
            engine: self.engine.clone(),
        }
    }
}

/// A pool of identical instances.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSpec {
    /// Pool name; instances are `<name>-0`, `<name>-1`, ...
    pub name: String,
    /// Number of instances (default 1).
    #[serde(default = "one")]
    pub replicas: u32,
    /// Model name (default llama-3.1-8b-instruct): an embedded one, one under the model
    /// directory (`DIR/<name>/config.json`, name normalised as for the embedded ones), or
    /// only a display name when `model_config` is given.
    #[serde(default = "default_model")]
    pub model: String,
    /// Path of a HuggingFace `config.json` for the model (parsed as `ditto run --model`).
    #[serde(default)]
    pub model_config: Option<String>,
    /// The text of a HuggingFace `config.json` (SyncClusterConfig's `model_config_json`;
    /// not a YAML field).
    #[serde(skip)]
    pub model_config_json: Option<String>,
    /// Embedded GPU name (default H100).
    #[serde(default = "default_gpu")]
    pub gpu: String,
    /// Tensor-parallel degree (default 1).
    #[serde(default = "one")]
    pub tp: u32,
    /// `calibrated` (default: fitted on measured vLLM runs), `physics`, `roofline` or
    /// `blackbox`.
    #[serde(default = "default_latency")]
    pub latency_model: String,
    /// Explicit blackbox coefficients (then `latency_model` must be `blackbox`).
    #[serde(default)]
    pub coefficients: Option<CoefficientsSpec>,
    /// The calibrated model's coefficients fitted for this pool: the `coefficients:` map of
    /// a `ditto calibrate --out` file, pasted as is (then `latency_model` must be
    /// `calibrated`; absent: the embedded fit). How a platform team puts its own fit in the
    /// chart's values (docs/fidelity.md).
    #[serde(default)]
    pub calibrated_coefficients: Option<std::collections::BTreeMap<String, f64>>,
    /// Cost per instance-hour (default 0).
    #[serde(default)]
    pub cost_per_hour: f64,
    /// vLLM limits.
    #[serde(default)]
    pub engine: EngineSpec,
}

/// Explicit blackbox alpha/beta coefficients.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoefficientsSpec {
    /// alpha0..2.
    pub alpha: Vec<f64>,
    /// beta0..2.
    pub beta: Vec<f64>,
}

/// vLLM limits of a pool's instances; absent fields take vLLM's defaults.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSpec {
    /// `--max-num-seqs` (256).
    pub max_num_seqs: Option<u32>,
    /// `--max-num-batched-tokens` (2048).
    pub max_num_batched_tokens: Option<u32>,
    /// `--block-size` (16).
    pub block_size: Option<u32>,
    /// GPU blocks (derived from memory when absent).
    pub num_gpu_blocks: Option<u32>,
    /// `--gpu-memory-utilization` (0.9).
    pub gpu_memory_utilization: Option<f64>,
    /// `--max-model-len` (the model's maximum).
    pub max_model_len: Option<u32>,
    /// `--long-prefill-token-threshold` (0).
    pub long_prefill_token_threshold: Option<u32>,
    /// `--enable-chunked-prefill` (true).
    pub enable_chunked_prefill: Option<bool>,
    /// `--enable-prefix-caching` (true).
    pub enable_prefix_caching: Option<bool>,
    /// `fcfs` (default), `priority` or `sjf`.
    pub scheduling_policy: Option<String>,
    /// CPU offload tier in blocks (0).
    pub num_cpu_blocks: Option<u32>,
    /// Host-to-GPU bandwidth for CPU-tier reloads, GB/s (25).
    pub cpu_offload_bandwidth_gbps: Option<f64>,
    /// `--cpu-offload-gb`: GiB of weights per GPU held in host memory (0).
    pub cpu_offload_gb: Option<f64>,
    /// vLLM's KV-offload connector (`OffloadingConnector`, `cpu_bytes_to_use`; none).
    pub offload_connector: Option<OffloadConnectorSpec>,
}

fn one() -> u32 {
    1
}
fn default_model() -> String {
    "llama-3.1-8b-instruct".to_owned()
}
fn default_gpu() -> String {
    "H100".to_owned()
}
fn default_latency() -> String {
    "calibrated".to_owned()
}

/// The embedded default cluster: 4 x llama-3.1-8b-instruct on H100, llm-d's default profile.
pub fn default_cluster() -> ClusterConfig {
    parse_cluster_yaml(DEFAULT_CLUSTER_YAML)
        .expect("the embedded default cluster is valid (tested in cluster_spec)")
}

/// Parses and resolves a cluster YAML document whose models are embedded (it reads no
/// files: see [`parse_cluster_yaml_with`]).
pub fn parse_cluster_yaml(text: &str) -> Result<ClusterConfig, ClusterSpecError> {
    parse_cluster_yaml_with(text, None)
}

/// Parses and resolves a cluster YAML document; `model_config` files and a `model:` that is
/// not embedded (`<model dir>/<normalised name>/config.json`, `ditto serve --model-dir`) are
/// read through `files`. A `disaggregation:` section is validated but not returned (see
/// [`parse_cluster_file`]).
pub fn parse_cluster_yaml_with(
    text: &str,
    files: Option<&dyn ModelFiles>,
) -> Result<ClusterConfig, ClusterSpecError> {
    parse_cluster_file(text, files).map(|file| file.config)
}

/// A resolved cluster file: the cluster, its disaggregation if it has a
/// `disaggregation:` section, and every instance's KV geometry (what a disaggregation added
/// later, e.g. by `--routing pd`, needs).
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterFileConfig {
    /// The cluster (`routing` is the decode profile when disaggregated).
    pub config: ClusterConfig,
    /// The disaggregation section, resolved.
    pub disaggregation: Option<crate::cluster::disagg::DisaggConfig>,
    /// Each instance's KV geometry, in instance order.
    pub kv: Vec<crate::cluster::disagg::InstanceKv>,
}

/// Parses and resolves a cluster YAML document with its disaggregation section (model
/// files read through `files`, as in [`parse_cluster_yaml_with`]).
pub fn parse_cluster_file(
    text: &str,
    files: Option<&dyn ModelFiles>,
) -> Result<ClusterFileConfig, ClusterSpecError> {
    let file: ClusterFile =
        serde_saphyr::from_str(text).map_err(|err| ClusterSpecError::Yaml(err.to_string()))?;
    if file.pools.is_empty() {
        return Err(invalid("pools", "needs at least one pool"));
    }
    let mut instances = Vec::new();
    let mut kv = Vec::new();
    for (index, pool) in file.pools.iter().enumerate() {
        let path = format!("pools[{index}]");
        let role = pool.role.as_deref();
        let pool = &pool.pool();
        if file.pools[..index].iter().any(|p| p.name == pool.name) {
            return Err(invalid(
                format!("{path}.name"),
                format!("duplicate pool {:?}", pool.name),
            ));
        }
        let mut pool = pool.clone();
        if pool.model_config_json.is_none() {
            pool.model_config_json = read_model_config(&pool, &path, files)?;
        }
        let mut template = resolve_pool(&pool, &path)?;
        template.role = resolve_role(role, &path)?;
        let pool_kv = pool_kv(&pool, &path, template.engine.block_size)?;
        for replica in 0..pool.replicas {
            let mut instance = template.clone();
            instance.id = format!("{}-{replica}", pool.name);
            instances.push(instance);
            kv.push(pool_kv);
        }
        if instances.len() as u64 > u64::from(INSTANCES_MAX) {
            return Err(invalid(
                format!("{path}.replicas"),
                format!("more than {INSTANCES_MAX} instances in all"),
            ));
        }
    }
    let routing = match (&file.routing, &file.disaggregation) {
        (Some(spec), _) => resolve_routing(spec)?,
        (None, Some(_)) => crate::cluster::disagg::llm_d_pd_profile(),
        (None, None) => RoutingPolicy::llm_d_default(),
    };
    let disaggregation = match &file.disaggregation {
        Some(spec) => {
            if !instances
                .iter()
                .any(|i| crate::cluster::disagg::serves_decode(i.role))
            {
                return Err(invalid(
                    "pools",
                    "a disaggregated cluster needs a pool with role decode or both",
                ));
            }
            Some(resolve_disaggregation(spec, kv.clone())?)
        }
        None => None,
    };
    let admission = match &file.admission {
        Some(spec) => resolve_admission(spec)?,
        None => AdmissionPolicy::Always,
    };
    let staleness = resolve_staleness(file.staleness.unwrap_or_default())?;
    Ok(ClusterFileConfig {
        config: ClusterConfig {
            instances,
            routing,
            admission,
            staleness,
        },
        disaggregation,
        kv,
    })
}

/// Where a cluster file's model configs come from when a pool's model is not embedded: the
/// caller's file reading (`cli::model_files` at the edge), so resolving stays pure.
pub trait ModelFiles {
    /// The text of a pool's `model_config` file, or why it cannot be read.
    fn read(&self, file: &str) -> Result<String, String>;
    /// The `config.json` of `model` (its normalised name) under the model directory, `None`
    /// when there is no directory or no such file, or why it cannot be read (naming it).
    fn in_model_dir(&self, model: &str) -> Result<Option<String>, String>;
}

/// The `config.json` text for a pool whose model is not embedded: its `model_config` file,
/// else `<model dir>/<normalised model>/config.json` when that exists (`None`: use the
/// embedded catalog). Without `files`, a `model_config` file is an error.
fn read_model_config(
    pool: &PoolSpec,
    path: &str,
    files: Option<&dyn ModelFiles>,
) -> Result<Option<String>, ClusterSpecError> {
    if let Some(file) = &pool.model_config {
        return match files {
            Some(files) => files.read(file).map(Some),
            None => Err("this caller reads no files".to_owned()),
        }
        .map_err(|err| invalid(format!("{path}.model_config"), format!("{file}: {err}")));
    }
    let Some(files) = files else {
        return Ok(None);
    };
    if catalog::model(&pool.model).is_ok() {
        return Ok(None);
    }
    files
        .in_model_dir(&catalog::normalize_model_name(&pool.model))
        .map_err(|err| invalid(format!("{path}.model"), err))
}

/// Builds one instance of `pool` (its id is set by the caller).
pub fn resolve_pool(pool: &PoolSpec, path: &str) -> Result<InstanceConfig, ClusterSpecError> {
    if pool.name.trim().is_empty() {
        return Err(invalid(format!("{path}.name"), "must not be empty"));
    }
    if pool.replicas == 0 || pool.replicas > INSTANCES_MAX {
        return Err(invalid(
            format!("{path}.replicas"),
            format!("must be in 1..={INSTANCES_MAX}"),
        ));
    }
    if pool.tp == 0 || pool.tp > 64 {
        return Err(invalid(format!("{path}.tp"), "must be in 1..=64"));
    }
    if !(pool.cost_per_hour.is_finite() && pool.cost_per_hour >= 0.0) {
        return Err(invalid(
            format!("{path}.cost_per_hour"),
            "must be a non-negative number",
        ));
    }
    let arch = pool_arch(pool, path)?;
    let gpu =
        catalog::gpu(&pool.gpu).map_err(|err| invalid(format!("{path}.gpu"), err.to_string()))?;
    let offload_path = format!("{path}.engine.cpu_offload_gb");
    let offload = WeightOffload::plan(
        &arch,
        &gpu,
        pool.tp,
        pool.engine.cpu_offload_gb.unwrap_or(0.0),
    )
    .map_err(|err| invalid(offload_path.clone(), err.to_string()))?;
    let latency = pool_latency(pool, path, &arch, &gpu)?
        .with_weight_offload(&offload)
        .map_err(|err| invalid(offload_path, err.to_string()))?;
    let engine = resolve_engine(
        &pool.engine,
        (&arch, &gpu, pool.tp),
        &offload,
        &format!("{path}.engine"),
    )?;
    Ok(InstanceConfig {
        id: pool.name.clone(),
        model: arch.name.clone(),
        model_config_json: pool.model_config_json.as_deref().map(std::sync::Arc::from),
        gpu: gpu.name.clone(),
        tp: pool.tp,
        role: InstanceRole::Both,
        engine,
        latency,
        cost_per_hour: pool.cost_per_hour,
    })
}

/// The model of `pool`: its own config.json, else the catalog's.
fn pool_arch(pool: &PoolSpec, path: &str) -> Result<ModelArch, ClusterSpecError> {
    Ok(match &pool.model_config_json {
        Some(json) => catalog::parse_model_config(&pool.model, json).map_err(|err| {
            let field = if pool.model_config.is_some() {
                "model_config"
            } else if path.starts_with("instances") {
                // SyncClusterConfig's text.
                "model_config_json"
            } else {
                "model"
            };
            invalid(format!("{path}.{field}"), err.to_string())
        })?,
        None => catalog::model(&pool.model)
            .map_err(|err| invalid(format!("{path}.model"), err.to_string()))?,
    })
}

/// The latency model of `pool`: its `latency_model` with the catalog's coefficients, or its
/// own (`coefficients` for blackbox, `calibrated_coefficients` for calibrated).
fn pool_latency(
    pool: &PoolSpec,
    path: &str,
    arch: &ModelArch,
    gpu: &GpuSpec,
) -> Result<LatencyModel, ClusterSpecError> {
    let kind = LatencyKind::parse(&pool.latency_model).ok_or_else(|| {
        invalid(
            format!("{path}.latency_model"),
            format!(
                "unknown model {:?}; expected roofline, blackbox or physics",
                pool.latency_model
            ),
        )
    })?;
    Ok(match (&pool.coefficients, &pool.calibrated_coefficients) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                format!("{path}.calibrated_coefficients"),
                "give `coefficients` (blackbox) or `calibrated_coefficients`, not both",
            ));
        }
        (None, Some(map)) => {
            if kind != LatencyKind::Calibrated {
                return Err(invalid(
                    format!("{path}.calibrated_coefficients"),
                    "calibrated coefficients need latency_model: calibrated",
                ));
            }
            let coefficients = catalog::calibrated::from_map(map).map_err(|err| match err {
                catalog::calibrated::CalibratedFileError::Coefficient { name, problem } => {
                    invalid(format!("{path}.calibrated_coefficients.{name}"), problem)
                }
                other => invalid(format!("{path}.calibrated_coefficients"), other.to_string()),
            })?;
            catalog::calibrated_model(arch, gpu, pool.tp, coefficients).map_err(|err| {
                invalid(format!("{path}.calibrated_coefficients"), err.to_string())
            })?
        }
        (Some(coefficients), None) => {
            if kind != LatencyKind::Blackbox {
                return Err(invalid(
                    format!("{path}.coefficients"),
                    "explicit coefficients need latency_model: blackbox",
                ));
            }
            LatencyModel::Blackbox(
                BlackboxCoefficients::new(&coefficients.alpha, &coefficients.beta)
                    .map_err(|err| invalid(format!("{path}.coefficients"), err.to_string()))?,
            )
        }
        (None, None) => catalog::latency_model(kind, arch, gpu, pool.tp)
            .map_err(|err| invalid(format!("{path}.latency_model"), err.to_string()))?,
    })
}

fn resolve_engine(
    spec: &EngineSpec,
    (arch, gpu, tp): (&ModelArch, &GpuSpec, u32),
    offload: &WeightOffload,
    path: &str,
) -> Result<EngineConfig, ClusterSpecError> {
    let block_size = spec.block_size.unwrap_or(16);
    if block_size == 0 {
        return Err(invalid(format!("{path}.block_size"), "must be at least 1"));
    }
    let num_gpu_blocks = match spec.num_gpu_blocks {
        Some(blocks) => blocks,
        None => {
            let utilization = spec.gpu_memory_utilization.unwrap_or(0.9);
            capacity::num_gpu_blocks_offloaded(
                arch,
                gpu,
                tp,
                utilization,
                block_size,
                offload.bytes,
            )
            .map_err(|err| invalid(format!("{path}.num_gpu_blocks"), err.to_string()))?
        }
    };
    let mut config = EngineConfig::vllm_defaults(
        num_gpu_blocks,
        spec.max_model_len.unwrap_or(arch.max_position_embeddings),
    );
    config.block_size = block_size;
    config.max_num_seqs = spec.max_num_seqs.unwrap_or(config.max_num_seqs);
    config.max_num_batched_tokens = spec
        .max_num_batched_tokens
        .unwrap_or(config.max_num_batched_tokens);
    config.long_prefill_token_threshold = spec.long_prefill_token_threshold.unwrap_or(0);
    config.enable_chunked_prefill = spec.enable_chunked_prefill.unwrap_or(true);
    config.enable_prefix_caching = spec.enable_prefix_caching.unwrap_or(true);
    config.num_cpu_blocks = spec.num_cpu_blocks.unwrap_or(0);
    config.cpu_offload_gb = spec.cpu_offload_gb.unwrap_or(0.0);
    config.offload_connector = offload::connector(spec, (arch, tp, block_size), path)?;
    if let Some(name) = &spec.scheduling_policy {
        config.scheduling_policy = SchedulingPolicy::parse(name).ok_or_else(|| {
            invalid(
                format!("{path}.scheduling_policy"),
                format!("unknown policy {name:?}; expected fcfs, priority or sjf"),
            )
        })?;
    }
    let bandwidth = spec.cpu_offload_bandwidth_gbps.unwrap_or(25.0);
    if !(bandwidth.is_finite() && bandwidth > 0.0) {
        return Err(invalid(
            format!("{path}.cpu_offload_bandwidth_gbps"),
            "must be a positive number",
        ));
    }
    config.cpu_block_load_us =
        (arch.kv_bytes_per_block(tp, block_size) as f64 / (bandwidth * 1e3)).ceil() as u64;
    config.kv_sample_interval_us = 10_000_000;
    config
        .validate()
        .map_err(|err| invalid(format!("{path}.{}", err.field), err.reason))?;
    Ok(config)
}
