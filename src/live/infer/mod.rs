//! Inferring what a pod runs from what the live mirror can read, instead of simulating a
//! configured pool (docs/live.md, "Inferring the pool"): the served model from the pod's
//! args or its `/metrics` `model_name`, its config.json from the catalog, `--model-dir` or a
//! HuggingFace cache, the TP from the args or the `nvidia.com/gpu` request, the GPU from the
//! node's `nvidia.com/gpu.product` label, the engine limits from the args. Fields the
//! source's pool sets explicitly in the cluster YAML win. What cannot be inferred is an
//! error naming the missing piece: the pod is then held stale, never simulated as something
//! else.
//!
//! `args` is pure (pod JSON in, facts out); [`infer`] is pure given its config lookup;
//! [`find_model_config`] reads files (the model directory, the HF cache).

pub mod args;
pub mod kv_offload;

use std::path::{Path, PathBuf};

pub use args::{EngineArgs, PodFacts, gpu_from_product, parse_command_line, pod_facts};

use crate::catalog;
use crate::cluster::config::InstanceConfig;
use crate::cluster::spec::{EngineSpec, OffloadConnectorSpec, PoolSpec, resolve_pool};
use crate::twin::snapshot::InferredSetup;

/// Where an inferred value came from (the `*_source` strings of GetSnapshot and /metrics).
pub mod source {
    /// The pod's container command line.
    pub const POD_ARGS: &str = "pod-args";
    /// The `model_name` label of the pod's vLLM series.
    pub const METRICS: &str = "metrics";
    /// The container's `nvidia.com/gpu` resources.
    pub const GPU_REQUEST: &str = "gpu-request";
    /// The node's `nvidia.com/gpu.product` label.
    pub const NODE_LABEL: &str = "node-label";
    /// `--default-gpu`.
    pub const DEFAULT_GPU: &str = "default-gpu";
    /// The source's pool (cluster YAML or the embedded default).
    pub const POOL: &str = "pool";
    /// vLLM's own default.
    pub const VLLM_DEFAULT: &str = "vllm-default";
    /// The embedded model catalog.
    pub const CATALOG: &str = "catalog";
    /// `--model-dir DIR/<name>/config.json`.
    pub const MODEL_DIR: &str = "model-dir";
    /// A HuggingFace hub cache (`models--ORG--NAME/snapshots/*/config.json`).
    pub const HF_CACHE: &str = "hf-cache";
}

/// Why a pod whose args name no model is not inferred before its first `/metrics` page.
pub const PENDING_MODEL: &str =
    "model: neither the pod's args nor its /metrics (model_name) name one yet";

/// Inference for one source: on, the source pool's explicitly set fields winning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InferSpec {
    /// Fields the source's pool sets in the cluster YAML (`model`, `model_config`, `gpu`,
    /// `tp`, `latency_model`, `coefficients`, `calibrated_coefficients`, `engine.<field>`):
    /// they override what is inferred.
    pub explicit: Vec<String>,
}

impl InferSpec {
    fn sets(&self, field: &str) -> bool {
        self.explicit.iter().any(|known| known == field)
    }
}

/// Where model configs and GPUs come from when they are inferred.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InferOptions {
    /// `--model-dir`: `DIR/<normalised name>/config.json`.
    pub model_dir: Option<PathBuf>,
    /// A HuggingFace hub cache (the directory holding `models--ORG--NAME`).
    pub hf_cache: Option<PathBuf>,
    /// `--default-gpu`: the GPU of pods whose node's GPU cannot be read.
    pub default_gpu: Option<String>,
}

/// What a pod's node says about its GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeGpu {
    /// The `nvidia.com/gpu.product` label.
    Product(String),
    /// The node has no such label (no GPU feature discovery).
    NoLabel,
    /// The node could not be read (why: forbidden, not found, ...).
    Unreadable(String),
}

/// What the live mirror knows about one pod to infer its setup from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInputs {
    /// What its spec says (Kubernetes discovery only).
    pub facts: Option<PodFacts>,
    /// What its node says.
    pub node_gpu: Option<NodeGpu>,
    /// The `model_name` its `/metrics` series carry.
    pub served_model: Option<String>,
}

/// A model's config.json, found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundConfig {
    /// Its text (`None`: the catalog's embedded one).
    pub json: Option<String>,
    /// Where it was found ([`source`]).
    pub source: &'static str,
}

/// What was inferred about one pod: the setup shown, and the instance to simulate or the
/// reason it cannot be (naming the missing piece).
#[derive(Clone, Debug, PartialEq)]
pub struct Inferred {
    /// The values and their sources (empty where unknown).
    pub setup: InferredSetup,
    /// The instance (its id is the caller's), or why there is none.
    pub instance: Result<InstanceConfig, String>,
}

/// The HuggingFace hub cache of the environment: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub`.
pub fn default_hf_cache() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE") {
        return Some(PathBuf::from(dir));
    }
    if let Some(home) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(home).join("hub"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/huggingface/hub"))
}

/// The hub directory under `dir` (`dir/hub` when it is an `HF_HOME`, else `dir`).
fn hub_dir(dir: &Path) -> PathBuf {
    let hub = dir.join("hub");
    if hub.is_dir() { hub } else { dir.to_path_buf() }
}

/// `config.json` of `model` in a hub cache: `models--ORG--NAME` (else any `models--*--NAME`,
/// case-insensitive), the snapshot `refs/main` names, else the first with a config.json.
fn hf_cache_config(hub: &Path, model: &str) -> Option<PathBuf> {
    let exact = format!(
        "models--{}",
        model.trim().trim_matches('/').replace('/', "--")
    );
    let suffix = format!("--{}", catalog::normalize_model_name(model));
    let repo = if hub.join(&exact).is_dir() {
        hub.join(&exact)
    } else {
        let mut names: Vec<String> = std::fs::read_dir(hub)
            .ok()?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| {
                name.starts_with("models--") && name.to_ascii_lowercase().ends_with(&suffix)
            })
            .collect();
        names.sort();
        hub.join(names.first()?)
    };
    let snapshots = repo.join("snapshots");
    if let Ok(main) = std::fs::read_to_string(repo.join("refs/main")) {
        let file = snapshots.join(main.trim()).join("config.json");
        if file.is_file() {
            return Some(file);
        }
    }
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(&snapshots)
        .ok()?
        .filter_map(|entry| Some(entry.ok()?.path().join("config.json")))
        .filter(|file| file.is_file())
        .collect();
    candidates.sort();
    candidates.into_iter().next()
}

/// Finds `model`'s config.json: the embedded catalog (matched by name: `Qwen/Qwen3-14B` is
/// `qwen3-14b`), else `--model-dir`, else the HF cache. The error names the model and every
/// place looked in.
pub fn find_model_config(model: &str, options: &InferOptions) -> Result<FoundConfig, String> {
    if catalog::model(model).is_ok() {
        return Ok(FoundConfig {
            json: None,
            source: source::CATALOG,
        });
    }
    let read = |file: &Path, from: &'static str| -> Result<FoundConfig, String> {
        let text = std::fs::read_to_string(file)
            .map_err(|err| format!("model {model}: {}: {err}", file.display()))?;
        catalog::parse_model_config(model, &text)
            .map_err(|err| format!("model {model}: {}: {err}", file.display()))?;
        Ok(FoundConfig {
            json: Some(text),
            source: from,
        })
    };
    let mut looked = Vec::new();
    if let Some(dir) = &options.model_dir {
        let file = dir
            .join(catalog::normalize_model_name(model))
            .join("config.json");
        if file.is_file() {
            return read(&file, source::MODEL_DIR);
        }
        looked.push(file.display().to_string());
    }
    if let Some(dir) = &options.hf_cache {
        let hub = hub_dir(dir);
        if let Some(file) = hf_cache_config(&hub, model) {
            return read(&file, source::HF_CACHE);
        }
        looked.push(hub.display().to_string());
    }
    let looked = if looked.is_empty() {
        String::new()
    } else {
        format!(" (looked in {})", looked.join(", "))
    };
    Err(format!(
        "model {model}: no config.json in the catalog, --model-dir or the HF cache{looked}"
    ))
}

/// The pool name of pods with this setup: `<model>-<gpu>-tp<N>`, plus a digest of the
/// engine args when the pod sets any (pods with other limits are another pool; a pod
/// without `--cpu-offload-gb` or the KV-offload connector keeps the digest it had before
/// they were read).
fn pool_name(model: &str, gpu: &str, tp: u32, facts: &PodFacts) -> String {
    let (engine, cpu_offload_gb) = (&facts.engine, facts.cpu_offload_gb.as_deref());
    let connector_bytes = facts.kv_offload_cpu_bytes.clone().and_then(Result::ok);
    let base = format!(
        "{}-{}-tp{tp}",
        catalog::normalize_model_name(model),
        gpu.to_ascii_lowercase()
    );
    if *engine == EngineArgs::default() && cpu_offload_gb.is_none() && connector_bytes.is_none() {
        return base;
    }
    // FNV-1a over the args as written: stable across runs and builds.
    let mut text = format!("{engine:?}");
    if let Some(offload) = cpu_offload_gb {
        text.push_str(" cpu_offload_gb=");
        text.push_str(offload);
    }
    if let Some(bytes) = connector_bytes {
        text.push_str(&format!(" kv_offload_cpu_bytes={bytes}"));
    }
    let digest = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{base}-{:06x}", digest & 0xff_ffff)
}

/// Infers one pod's setup from `inputs` over its source's pool `template` (whose fields in
/// `spec.explicit` win; its GPU is also the fallback when the node's cannot be read and no
/// `--default-gpu` is given). `find` looks a model's config.json up
/// ([`find_model_config`]).
pub fn infer(
    inputs: &PodInputs,
    template: &InstanceConfig,
    spec: &InferSpec,
    options: &InferOptions,
    find: impl Fn(&str) -> Result<FoundConfig, String>,
) -> Inferred {
    let mut setup = InferredSetup::default();
    let facts = inputs.facts.clone().unwrap_or_default();
    let mut problems = Vec::new();
    // The model and its config.
    let mut model_json: Option<Option<std::sync::Arc<str>>> = None;
    if spec.sets("model") || spec.sets("model_config") {
        setup.model = template.model.clone();
        setup.model_source = source::POOL.to_owned();
        setup.config_source = source::POOL.to_owned();
        model_json = Some(template.model_config_json.clone());
    } else {
        let candidates: Vec<(&String, &str)> = [
            (facts.model.as_ref(), source::POD_ARGS),
            (inputs.served_model.as_ref(), source::METRICS),
        ]
        .into_iter()
        .filter_map(|(name, from)| name.map(|name| (name, from)))
        .collect();
        let mut first_error = None;
        for (name, from) in &candidates {
            match find(name) {
                Ok(found) => {
                    setup.model = (*name).clone();
                    setup.model_source = (*from).to_owned();
                    setup.config_source = found.source.to_owned();
                    model_json = Some(found.json.map(std::sync::Arc::from));
                    break;
                }
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        if model_json.is_none() {
            if let Some((name, from)) = candidates.first() {
                setup.model = (*name).clone();
                setup.model_source = (*from).to_owned();
            }
            problems.push(first_error.unwrap_or_else(|| PENDING_MODEL.to_owned()));
        }
    }
    // TP.
    let groups = facts.gpu_groups.max(1);
    let (tp, tp_source) = if spec.sets("tp") {
        (template.tp, source::POOL)
    } else if let Some(tp) = facts.tp {
        (tp, source::POD_ARGS)
    } else if let Some(gpus) = facts.gpus.filter(|gpus| gpus % groups == 0) {
        (gpus / groups, source::GPU_REQUEST)
    } else if inputs.facts.is_some() {
        (1, source::VLLM_DEFAULT)
    } else {
        (template.tp, source::POOL)
    };
    setup.tp = tp;
    setup.tp_source = tp_source.to_owned();
    // GPU.
    let fallback = || match &options.default_gpu {
        Some(gpu) => (gpu.clone(), source::DEFAULT_GPU),
        None => (template.gpu.clone(), source::POOL),
    };
    let gpu = if spec.sets("gpu") {
        Some((template.gpu.clone(), source::POOL))
    } else {
        match &inputs.node_gpu {
            Some(NodeGpu::Product(product)) => match gpu_from_product(product) {
                Some(gpu) => Some((gpu.to_owned(), source::NODE_LABEL)),
                None => {
                    problems.push(format!(
                        "gpu: node label nvidia.com/gpu.product={product} is not a catalog GPU \
                         (known: {})",
                        catalog::gpu_names().join(", ")
                    ));
                    None
                }
            },
            _ => Some(fallback()),
        }
    };
    if let Some((gpu, from)) = &gpu {
        setup.gpu = gpu.clone();
        setup.gpu_source = (*from).to_owned();
    }
    let (Some(model_json), Some((gpu, _)), true) = (model_json, gpu, problems.is_empty()) else {
        return Inferred {
            setup,
            instance: Err(problems.join("; ")),
        };
    };
    setup.pool = pool_name(&setup.model, &gpu, tp, &facts);
    let instance = build(template, spec, &setup, model_json, &facts);
    Inferred { setup, instance }
}

/// A number-valued flag as written (`None`: not given), parsed and checked by `valid`; the
/// error names the flag and says what it must be (`must_be`).
fn number_arg(
    flag: &str,
    text: Option<&str>,
    must_be: &str,
    valid: impl Fn(f64) -> bool,
) -> Result<Option<f64>, String> {
    text.map(|text| {
        text.trim()
            .parse::<f64>()
            .ok()
            .filter(|value| valid(*value))
            .ok_or_else(|| format!("engine: {flag} {text:?} is not {must_be}"))
    })
    .transpose()
}

/// The pod's KV-offload connector unless its pool sets one; a value vLLM would refuse is
/// the error.
fn pod_connector(
    facts: &PodFacts,
    spec: &InferSpec,
) -> Result<Option<OffloadConnectorSpec>, String> {
    match &facts.kv_offload_cpu_bytes {
        _ if spec.sets("engine.offload_connector") => Ok(None),
        Some(Err(err)) => Err(format!("engine: {err}")),
        Some(Ok(bytes)) => Ok(Some(OffloadConnectorSpec::of_bytes(*bytes))),
        None => Ok(None),
    }
}

/// The instance of an inferred setup: the pod's engine args, the pool's explicit fields.
fn build(
    template: &InstanceConfig,
    spec: &InferSpec,
    setup: &InferredSetup,
    model_json: Option<std::sync::Arc<str>>,
    facts: &PodFacts,
) -> Result<InstanceConfig, String> {
    let args = &facts.engine;
    let offload = number_arg(
        "--cpu-offload-gb",
        facts.cpu_offload_gb.as_deref(),
        "a number of GiB >= 0",
        |value| value.is_finite() && value >= 0.0,
    )?;
    let utilization = number_arg(
        "--gpu-memory-utilization",
        args.gpu_memory_utilization.as_deref(),
        "in (0, 1]",
        |value| value > 0.0 && value <= 1.0,
    )?;
    let pool_engine = &template.engine;
    let pick = |field: &str, inferred: Option<u32>, pool: u32| {
        if spec.sets(&format!("engine.{field}")) {
            Some(pool)
        } else {
            inferred
        }
    };
    let engine = EngineSpec {
        max_num_seqs: pick("max_num_seqs", args.max_num_seqs, pool_engine.max_num_seqs),
        max_num_batched_tokens: pick(
            "max_num_batched_tokens",
            args.max_num_batched_tokens,
            pool_engine.max_num_batched_tokens,
        ),
        block_size: pick("block_size", args.block_size, pool_engine.block_size),
        num_gpu_blocks: pick("num_gpu_blocks", None, pool_engine.num_gpu_blocks),
        gpu_memory_utilization: utilization,
        max_model_len: pick(
            "max_model_len",
            args.max_model_len,
            pool_engine.max_model_len,
        ),
        long_prefill_token_threshold: pick(
            "long_prefill_token_threshold",
            None,
            pool_engine.long_prefill_token_threshold,
        ),
        enable_chunked_prefill: if spec.sets("engine.enable_chunked_prefill") {
            Some(pool_engine.enable_chunked_prefill)
        } else {
            args.enable_chunked_prefill
        },
        enable_prefix_caching: if spec.sets("engine.enable_prefix_caching") {
            Some(pool_engine.enable_prefix_caching)
        } else {
            args.enable_prefix_caching
        },
        cpu_offload_gb: if spec.sets("engine.cpu_offload_gb") {
            Some(pool_engine.cpu_offload_gb)
        } else {
            offload
        },
        offload_connector: pod_connector(facts, spec)?,
        ..EngineSpec::default()
    };
    let explicit_limits = (
        engine.max_num_seqs.is_some(),
        engine.max_num_batched_tokens.is_some(),
    );
    let pool = PoolSpec {
        name: "inferred".to_owned(),
        replicas: 1,
        model: setup.model.clone(),
        model_config: None,
        model_config_json: model_json.as_deref().map(str::to_owned),
        gpu: setup.gpu.clone(),
        tp: setup.tp,
        latency_model: "calibrated".to_owned(),
        coefficients: None,
        calibrated_coefficients: None,
        cost_per_hour: template.cost_per_hour,
        engine,
    };
    let mut instance = resolve_pool(&pool, "inferred").map_err(|err| err.to_string())?;
    instance.model_config_json = model_json;
    keep_pool_fields(&mut instance, template, spec);
    super::vllm_defaults::apply_vllm_batch_defaults(&mut instance, explicit_limits);
    Ok(instance)
}

/// What the source's pool sets itself and the inferred engine cannot rebuild from its spec:
/// its KV-offload connector (its tier sized for the pool's model and TP) and its latency
/// model (when the pod runs the pool's model, GPU and TP).
fn keep_pool_fields(instance: &mut InstanceConfig, template: &InstanceConfig, spec: &InferSpec) {
    if spec.sets("engine.offload_connector") {
        instance.engine.offload_connector = template.engine.offload_connector;
    }
    if ["latency_model", "coefficients", "calibrated_coefficients"]
        .iter()
        .any(|field| spec.sets(field))
        && (instance.model.as_str(), instance.gpu.as_str(), instance.tp)
            == (template.model.as_str(), template.gpu.as_str(), template.tp)
    {
        instance.latency = template.latency.clone();
    }
}

/// The fields a pool of the cluster YAML `text` sets itself (see [`InferSpec::explicit`]);
/// empty when the file or the pool cannot be read (the pool was already validated).
pub fn explicit_fields(text: &str, pool: &str) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        pools: Vec<std::collections::BTreeMap<String, serde_json::Value>>,
    }
    let Ok(file) = serde_saphyr::from_str::<File>(text) else {
        return Vec::new();
    };
    let Some(found) = file
        .pools
        .iter()
        .find(|fields| fields.get("name").and_then(serde_json::Value::as_str) == Some(pool))
    else {
        return Vec::new();
    };
    let mut explicit = Vec::new();
    for (key, value) in found {
        if key == "engine" {
            if let Some(engine) = value.as_object() {
                explicit.extend(engine.keys().map(|field| format!("engine.{field}")));
            }
        } else {
            explicit.push(key.clone());
        }
    }
    explicit
}

#[cfg(test)]
mod tests;
