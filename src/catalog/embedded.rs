//! The reference data compiled into the binary: nothing here reads files at run time.
//!
//! Every table is sorted by name (a test checks it) so lookups and listings are
//! deterministic. The files live under `data/` (see `data/PROVENANCE.md`). Knows nothing
//! about parsing them.

/// HuggingFace `config.json` of each bundled model, keyed by its lowercase directory name.
pub(crate) static MODEL_CONFIGS: [(&str, &str); 16] = [
    (
        "codellama-34b-instruct-hf",
        include_str!("../../data/model_configs/codellama-34b-instruct-hf/config.json"),
    ),
    (
        "deepseek-v2-lite",
        include_str!("../../data/model_configs/deepseek-v2-lite/config.json"),
    ),
    (
        "glm-5.2-fp8",
        include_str!("../../data/model_configs/glm-5.2-fp8/config.json"),
    ),
    (
        "gpt-oss-120b",
        include_str!("../../data/model_configs/gpt-oss-120b/config.json"),
    ),
    (
        "llama-2-70b-hf",
        include_str!("../../data/model_configs/llama-2-70b-hf/config.json"),
    ),
    (
        "llama-2-7b-hf",
        include_str!("../../data/model_configs/llama-2-7b-hf/config.json"),
    ),
    (
        "llama-3.1-70b-instruct",
        include_str!("../../data/model_configs/llama-3.1-70b-instruct/config.json"),
    ),
    (
        "llama-3.1-8b-instruct",
        include_str!("../../data/model_configs/llama-3.1-8b-instruct/config.json"),
    ),
    (
        "llama-4-scout-17b-16e-instruct-fp8-dynamic",
        include_str!(
            "../../data/model_configs/llama-4-scout-17b-16e-instruct-fp8-dynamic/config.json"
        ),
    ),
    (
        "mistral-nemo-instruct-2407",
        include_str!("../../data/model_configs/mistral-nemo-instruct-2407/config.json"),
    ),
    (
        "mixtral-8x7b-v0.1",
        include_str!("../../data/model_configs/mixtral-8x7b-v0.1/config.json"),
    ),
    (
        "qwen2.5-7b-instruct",
        include_str!("../../data/model_configs/qwen2.5-7b-instruct/config.json"),
    ),
    (
        "qwen3-14b",
        include_str!("../../data/model_configs/qwen3-14b/config.json"),
    ),
    (
        "qwen3-30b-a3b",
        include_str!("../../data/model_configs/qwen3-30b-a3b/config.json"),
    ),
    (
        "qwen3-32b",
        include_str!("../../data/model_configs/qwen3-32b/config.json"),
    ),
    (
        "yi-34b",
        include_str!("../../data/model_configs/yi-34b/config.json"),
    ),
];

/// BLIS's GPU table (`hardware_config.json`, verbatim).
pub(crate) static BLIS_GPUS_JSON: &str = include_str!("../../data/hardware_config.json");

/// GPUs ditto adds from public datasheets, in the same schema.
pub(crate) static ADDED_GPUS_JSON: &str = include_str!("../../data/hardware_config.added.json");

/// Per-GPU interconnect bandwidth for tensor-parallel all-reduces (ditto's, with sources).
pub(crate) static INTERCONNECT_JSON: &str = include_str!("../../data/gpu_interconnect.json");

/// Per-GPU decode attention kernel and the relative cost of its KV reads (ditto's, with
/// sources).
pub(crate) static ATTENTION_JSON: &str = include_str!("../../data/gpu_attention.json");

/// Per-GPU weight-read factor of the decode GEMMs relative to Hopper's (ditto's, with
/// sources).
pub(crate) static GEMM_JSON: &str = include_str!("../../data/gpu_gemm.json");

/// Per-GPU host-to-device bandwidth for weights offloaded to host memory (ditto's, with
/// sources).
pub(crate) static HOST_LINK_JSON: &str = include_str!("../../data/gpu_host_link.json");

/// BLIS's per (model, GPU, TP, vLLM version) blackbox alpha/beta coefficients.
pub(crate) static BLACKBOX_YAML: &str =
    include_str!("../../data/coefficients/blis-blackbox-alpha-beta.yaml");

/// BLIS's current defaults, holding the global trained-physics coefficients.
pub(crate) static PHYSICS_YAML: &str =
    include_str!("../../data/coefficients/blis-trained-physics.yaml");

/// ditto's calibrated step-time coefficients (fitted by `ditto calibrate`, see
/// docs/fidelity.md and data/PROVENANCE.md).
pub(crate) static CALIBRATED_YAML: &str =
    include_str!("../../data/coefficients/ditto-calibrated.yaml");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_table_is_sorted_unique_and_lowercase() {
        for pair in MODEL_CONFIGS.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{} before {}", pair[0].0, pair[1].0);
        }
        for (name, json) in MODEL_CONFIGS {
            assert_eq!(name, name.to_ascii_lowercase());
            assert!(json.trim_start().starts_with('{'), "{name}");
        }
    }
}
