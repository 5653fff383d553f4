//! Embedded reference data and its parsing: model architectures, GPU specs and BLIS's fitted
//! latency coefficients, turned into the plain types `crate::sim` consumes.
//!
//! This is the only place that knows about JSON and YAML for these inputs: `src/sim` has no
//! serde. All data is compiled in (`data/`, see `data/PROVENANCE.md`), so nothing here reads
//! files or the network; the CLI reads a user-supplied `config.json` and passes its text to
//! [`parse_model_config`]. Parsed tables are cached once per process (`OnceLock`), so lookups
//! are cheap and deterministic. Knows nothing about the engine, workloads or the CLI.

pub mod calibrated;
mod coefficients;
mod embedded;
mod gpus;
mod hf_config;
pub mod kv_connectors;

use std::sync::OnceLock;

use crate::sim::latency::{
    BlackboxCoefficients, CalibratedCoefficients, CalibratedModel, GpuSpec, LatencyError,
    LatencyKind, LatencyModel, ModelArch, PhysicsCoefficients, PhysicsModel, RooflineModel,
};

/// Why a catalog lookup or parse failed. Messages name the thing asked for and, for unknown
/// names, list the known ones.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// No bundled model has this name.
    #[error("unknown model `{name}`; bundled models: {known}")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// Comma-separated bundled model names.
        known: String,
    },
    /// No GPU has this name.
    #[error("unknown GPU `{name}`; known GPUs: {known}")]
    UnknownGpu {
        /// The name asked for.
        name: String,
        /// Comma-separated GPU names.
        known: String,
    },
    /// BLIS fitted no blackbox coefficients for this combination.
    #[error("no blackbox coefficients for model `{model}` on {gpu} at TP {tp}; {available}")]
    NoBlackboxCoefficients {
        /// Model asked for.
        model: String,
        /// GPU asked for.
        gpu: String,
        /// Tensor parallelism asked for.
        tp: u32,
        /// What the file does offer for this model (or which models it covers).
        available: String,
    },
    /// A `config.json` is not valid JSON.
    #[error("model config `{model}`: invalid JSON: {source}")]
    ConfigJson {
        /// Model name.
        model: String,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A `config.json` field is missing, malformed or inconsistent.
    #[error("model config `{model}`: {field} {problem}")]
    InvalidModelConfig {
        /// Model name.
        model: String,
        /// The config.json key at fault.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// An embedded GPU file is not valid JSON of the expected shape.
    #[error("GPU table `{file}`: {source}")]
    GpuJson {
        /// File name under `data/`.
        file: &'static str,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A GPU entry has an out-of-range value.
    #[error("GPU `{gpu}`: {field} {problem}")]
    InvalidGpuSpec {
        /// GPU name.
        gpu: String,
        /// The JSON key at fault.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// An embedded coefficient file is not valid YAML of the expected shape.
    #[error("coefficients file `{file}`: {source}")]
    CoefficientsYaml {
        /// File name under `data/coefficients/`.
        file: &'static str,
        /// The parser's error (boxed: it is large).
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// An embedded table failed to parse earlier in this process (the first error's text).
    #[error("embedded {what} is invalid: {message}")]
    EmbeddedData {
        /// Which table.
        what: &'static str,
        /// The original error message.
        message: String,
    },
    /// The inputs are valid data but a latency model rejects them (e.g. heads not divisible
    /// by TP, bad coefficients).
    #[error(transparent)]
    Latency(#[from] LatencyError),
}

/// Canonical catalog key of a model name or HuggingFace id: the last `/`-separated segment,
/// trimmed and lowercased (`meta-llama/Llama-3.1-8B-Instruct` -> `llama-3.1-8b-instruct`).
pub fn normalize_model_name(name: &str) -> String {
    let trimmed = name.trim().trim_end_matches('/');
    let last = trimmed.rsplit('/').next().unwrap_or(trimmed);
    last.to_ascii_lowercase()
}

/// Architecture of a bundled model, by directory name (case-insensitive) or HF id.
pub fn model(name: &str) -> Result<ModelArch, CatalogError> {
    let key = normalize_model_name(name);
    let found = embedded::MODEL_CONFIGS
        .binary_search_by(|(known, _)| (*known).cmp(key.as_str()))
        .map(|index| embedded::MODEL_CONFIGS[index]);
    match found {
        Ok((dir_name, json)) => hf_config::parse(dir_name, json),
        Err(_) => Err(CatalogError::UnknownModel {
            name: name.to_string(),
            known: model_names().join(", "),
        }),
    }
}

/// Names of the bundled models, sorted.
pub fn model_names() -> Vec<&'static str> {
    embedded::MODEL_CONFIGS
        .iter()
        .map(|(name, _)| *name)
        .collect()
}

/// Parses the text of a user-supplied HF `config.json` for model `name` (the name is kept in
/// the result and also feeds the weight-precision fallback, e.g. `...-w4a16`, `...-FP8`).
/// Reads fields as BLIS does: `text_config` pivot, `torch_dtype`/`dtype`,
/// `quantization_config`, MoE and GQA field aliases, rope-scaled `max_model_len`.
pub fn parse_model_config(name: &str, json: &str) -> Result<ModelArch, CatalogError> {
    hf_config::parse(name.trim(), json)
}

/// The parsed GPU table, cached.
fn gpu_table() -> Result<&'static [GpuSpec], CatalogError> {
    static TABLE: OnceLock<Result<Vec<GpuSpec>, String>> = OnceLock::new();
    let cached = TABLE.get_or_init(|| gpus::parse_embedded().map_err(|err| err.to_string()));
    match cached {
        Ok(table) => Ok(table),
        Err(message) => Err(CatalogError::EmbeddedData {
            what: "GPU table",
            message: message.clone(),
        }),
    }
}

/// GPU spec by name (case-insensitive; `A100` is accepted for `A100-80`).
pub fn gpu(name: &str) -> Result<GpuSpec, CatalogError> {
    let table = gpu_table()?;
    gpus::find(table, name)
        .cloned()
        .ok_or_else(|| CatalogError::UnknownGpu {
            name: name.to_string(),
            known: gpu_names().join(", "),
        })
}

/// Names of the known GPUs, sorted. (Empty only if the embedded table were invalid, which
/// the test suite rules out.)
pub fn gpu_names() -> Vec<&'static str> {
    match gpu_table() {
        Ok(table) => table.iter().map(|gpu| gpu.name.as_str()).collect(),
        Err(_) => Vec::new(),
    }
}

/// The parsed blackbox list, cached.
fn blackbox_table() -> Result<&'static [coefficients::BlackboxEntry], CatalogError> {
    static TABLE: OnceLock<Result<Vec<coefficients::BlackboxEntry>, String>> = OnceLock::new();
    let cached =
        TABLE.get_or_init(|| coefficients::parse_blackbox().map_err(|err| err.to_string()));
    match cached {
        Ok(table) => Ok(table),
        Err(message) => Err(CatalogError::EmbeddedData {
            what: "blackbox coefficients",
            message: message.clone(),
        }),
    }
}

/// BLIS's blackbox coefficients for `model` (name or HF id; matched on the id's last path
/// segment, lowercase) on `gpu` at tensor parallelism `tp`. When several vLLM versions were
/// fitted for the combination, the first in the file wins (as in BLIS).
pub fn blackbox_coefficients(
    model: &str,
    gpu: &str,
    tp: u32,
) -> Result<BlackboxCoefficients, CatalogError> {
    let table = blackbox_table()?;
    let Some(entry) = coefficients::find_blackbox(table, model, gpu, tp) else {
        return Err(CatalogError::NoBlackboxCoefficients {
            model: model.to_string(),
            gpu: gpu.to_string(),
            tp,
            available: coefficients::describe_available(table, model),
        });
    };
    Ok(BlackboxCoefficients::new(
        &entry.alpha_coeffs,
        &entry.beta_coeffs,
    )?)
}

/// BLIS's global trained-physics coefficients (3 alphas, 11 betas).
pub fn physics_coefficients() -> PhysicsCoefficients {
    static COEFFICIENTS: OnceLock<PhysicsCoefficients> = OnceLock::new();
    COEFFICIENTS
        .get_or_init(|| {
            let entry = coefficients::parse_physics()
                .expect("embedded blis-trained-physics.yaml parses (checked by the test suite)");
            let alpha = &entry.alpha_coeffs;
            assert!(
                alpha.len() >= 3,
                "embedded physics alphas: 3 expected, got {alpha:?}"
            );
            PhysicsCoefficients {
                alpha: [alpha[0], alpha[1], alpha[2]],
                beta: entry.beta_coeffs,
            }
        })
        .clone()
}

/// Builds the `kind` latency model for `arch` on `gpu` at tensor parallelism `tp`, with the
/// embedded coefficients (blackbox: looked up by `arch.name`, `gpu.name`, `tp`).
pub fn latency_model(
    kind: LatencyKind,
    arch: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
) -> Result<LatencyModel, CatalogError> {
    let model = match kind {
        LatencyKind::Blackbox => {
            LatencyModel::Blackbox(blackbox_coefficients(&arch.name, &gpu.name, tp)?)
        }
        LatencyKind::Roofline => LatencyModel::Roofline(RooflineModel::try_new(arch, gpu, tp)?),
        LatencyKind::Physics => {
            LatencyModel::Physics(PhysicsModel::new(arch, gpu, tp, physics_coefficients())?)
        }
        LatencyKind::Calibrated => calibrated_model(arch, gpu, tp, calibrated_coefficients()?)?,
    };
    Ok(model)
}

/// ditto's embedded calibrated coefficients (`data/coefficients/ditto-calibrated.yaml`).
pub fn calibrated_coefficients() -> Result<CalibratedCoefficients, CatalogError> {
    static COEFFICIENTS: OnceLock<Result<CalibratedCoefficients, String>> = OnceLock::new();
    COEFFICIENTS
        .get_or_init(|| calibrated::parse(embedded::CALIBRATED_YAML).map_err(|err| err.to_string()))
        .clone()
        .map_err(|message| CatalogError::EmbeddedData {
            what: "calibrated coefficients",
            message,
        })
}

/// Parses a calibrated coefficients file (as written by `ditto calibrate`).
pub fn parse_calibrated(
    text: &str,
) -> Result<CalibratedCoefficients, calibrated::CalibratedFileError> {
    calibrated::parse(text)
}

/// Builds the calibrated latency model with `coefficients`.
pub fn calibrated_model(
    arch: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
    coefficients: CalibratedCoefficients,
) -> Result<LatencyModel, CatalogError> {
    Ok(LatencyModel::Calibrated(CalibratedModel::new(
        arch,
        gpu,
        tp,
        &coefficients,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_normalize() {
        assert_eq!(
            normalize_model_name("meta-llama/Llama-3.1-8B-Instruct"),
            "llama-3.1-8b-instruct"
        );
        assert_eq!(normalize_model_name("  Qwen3-14B "), "qwen3-14b");
        assert_eq!(normalize_model_name("org/model/"), "model");
    }

    #[test]
    fn lookups_accept_hf_ids_and_any_case() {
        let arch = model("meta-llama/Llama-3.1-8B-Instruct").unwrap();
        assert_eq!(arch.name, "llama-3.1-8b-instruct");
        assert_eq!(model("QWEN3-14B").unwrap().name, "qwen3-14b");
        assert_eq!(gpu("h100").unwrap().name, "H100");
    }

    #[test]
    fn physics_coefficients_are_blis_iter29() {
        let coeffs = physics_coefficients();
        assert_eq!(coeffs.alpha, [15563.199579, 777.3455, 45.907545]);
        assert_eq!(coeffs.beta.len(), 11);
        assert_eq!(coeffs.beta[9], 1.94710771);
    }

    #[test]
    fn blackbox_errors_list_alternatives() {
        let err = blackbox_coefficients("llama-3.1-8b-instruct", "H100", 8).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("TP 8") && message.contains("H100 TP1"),
            "{message}"
        );
    }
}
