//! BLIS's fitted coefficients: the blackbox `models:` list and the global trained-physics
//! `trained_physics_coefficients`, parsed from the embedded YAML files.
//!
//! Owns the YAML schema (only the keys used here are read; `defaults`, `workloads`, `lora`
//! and the rest are ignored) and the blackbox matching rule. Knows nothing about how the
//! coefficients are applied.

use serde::Deserialize;

use super::embedded::{BLACKBOX_YAML, PHYSICS_YAML};
use super::{CatalogError, gpus, normalize_model_name};

/// Name of the embedded blackbox file, for error messages.
const BLACKBOX_FILE: &str = "blis-blackbox-alpha-beta.yaml";
/// Name of the embedded physics file, for error messages.
const PHYSICS_FILE: &str = "blis-trained-physics.yaml";

/// One `models:` entry of the blackbox file.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct BlackboxEntry {
    /// HF id, lowercase (e.g. `meta-llama/llama-3.1-8b-instruct`).
    pub(crate) id: String,
    /// GPU name (`H100`, `A100-80`).
    #[serde(rename = "GPU")]
    pub(crate) gpu: String,
    /// Tensor parallelism.
    pub(crate) tensor_parallelism: u32,
    /// vLLM image the coefficients were fitted on.
    pub(crate) vllm_version: String,
    /// alpha0..2.
    pub(crate) alpha_coeffs: Vec<f64>,
    /// beta0..2.
    pub(crate) beta_coeffs: Vec<f64>,
}

/// The part of the blackbox file this module reads.
#[derive(Deserialize)]
struct BlackboxFile {
    /// Fitted combinations, in file order (the first match wins).
    models: Vec<BlackboxEntry>,
}

/// The coefficient pair under `trained_physics_coefficients`.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct PhysicsEntry {
    /// alpha0..2.
    pub(crate) alpha_coeffs: Vec<f64>,
    /// beta list (7 to 11 values).
    pub(crate) beta_coeffs: Vec<f64>,
}

/// The part of the physics file this module reads.
#[derive(Deserialize)]
struct PhysicsFile {
    /// The global coefficients.
    trained_physics_coefficients: PhysicsEntry,
}

/// Parses the embedded blackbox list, in file order.
pub(crate) fn parse_blackbox() -> Result<Vec<BlackboxEntry>, CatalogError> {
    let file: BlackboxFile =
        serde_saphyr::from_str(BLACKBOX_YAML).map_err(|source| CatalogError::CoefficientsYaml {
            file: BLACKBOX_FILE,
            source: Box::new(source),
        })?;
    Ok(file.models)
}

/// Parses the embedded trained-physics coefficients.
pub(crate) fn parse_physics() -> Result<PhysicsEntry, CatalogError> {
    let file: PhysicsFile =
        serde_saphyr::from_str(PHYSICS_YAML).map_err(|source| CatalogError::CoefficientsYaml {
            file: PHYSICS_FILE,
            source: Box::new(source),
        })?;
    Ok(file.trained_physics_coefficients)
}

/// The first entry fitted for `model` (name or HF id, matched on the id's last path segment,
/// lowercase) on `gpu` (same GPU family) at tensor parallelism `tp`.
pub(crate) fn find_blackbox<'a>(
    entries: &'a [BlackboxEntry],
    model: &str,
    gpu: &str,
    tp: u32,
) -> Option<&'a BlackboxEntry> {
    let model_key = normalize_model_name(model);
    let gpu_key = gpus::family_key(gpu);
    entries.iter().find(|entry| {
        entry.tensor_parallelism == tp
            && gpus::family_key(&entry.gpu) == gpu_key
            && normalize_model_name(&entry.id) == model_key
    })
}

/// What the blackbox file does offer, for an error message: the (GPU, TP) pairs fitted for
/// `model`, or the list of models when it has none.
pub(crate) fn describe_available(entries: &[BlackboxEntry], model: &str) -> String {
    let model_key = normalize_model_name(model);
    let mut combos: Vec<String> = entries
        .iter()
        .filter(|entry| normalize_model_name(&entry.id) == model_key)
        .map(|entry| {
            format!(
                "{} TP{} ({})",
                entry.gpu, entry.tensor_parallelism, entry.vllm_version
            )
        })
        .collect();
    if !combos.is_empty() {
        combos.dedup();
        return format!("fitted for this model: {}", combos.join(", "));
    }
    let mut models: Vec<String> = entries
        .iter()
        .map(|entry| normalize_model_name(&entry.id))
        .collect();
    models.sort();
    models.dedup();
    format!("models with blackbox coefficients: {}", models.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_files_parse() {
        let entries = parse_blackbox().unwrap();
        assert!(entries.len() >= 100, "{} entries", entries.len());
        let physics = parse_physics().unwrap();
        assert_eq!(physics.alpha_coeffs.len(), 3);
        assert_eq!(physics.beta_coeffs.len(), 11);
    }

    #[test]
    fn first_match_wins_and_a100_spellings_match() {
        let entries = parse_blackbox().unwrap();
        let h100 = find_blackbox(&entries, "meta-llama/Llama-3.1-8B-Instruct", "h100", 2).unwrap();
        assert_eq!(h100.alpha_coeffs[0], 1601.350510688092);
        let a100 = find_blackbox(&entries, "llama-3.1-8b-instruct", "A100", 1).unwrap();
        assert_eq!(a100.gpu, "A100-80");
        assert!(find_blackbox(&entries, "llama-3.1-8b-instruct", "L40S", 1).is_none());
    }

    #[test]
    fn describe_lists_what_exists() {
        let entries = parse_blackbox().unwrap();
        let fitted = describe_available(&entries, "qwen3-14b");
        assert!(fitted.contains("H100 TP1"), "{fitted}");
        let models = describe_available(&entries, "no-such-model");
        assert!(models.contains("llama-3.1-8b-instruct"), "{models}");
    }
}
