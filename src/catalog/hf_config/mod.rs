//! Reading a HuggingFace `config.json` into a [`ModelArch`], field for field as BLIS does
//! (`sim/latency/config.go GetModelConfigFromHF`, `ExtractKVCapacityParams`, the CLI's
//! weight-precision fallback and rope-scaled `max_model_len`).
//!
//! Owns the field aliases (Falcon/GLM/DeepSeek/Kimi spellings), the `text_config` pivot of
//! multimodal configs; the weights' precision (dtype table, quantization detection) is
//! `precision.rs`'s. Knows nothing about
//! files (callers pass the text) nor about what the figures are used for.

use serde_json::{Map, Value};

use super::CatalogError;
use crate::sim::latency::{MOE_MIN_EXPERTS, ModelArch};

mod precision;

pub(crate) use precision::weight_bytes_from_name;
use precision::{DTYPE_BYTES, quantization_bytes};

/// Fields carrying the total routed-expert count, in vLLM's `get_num_experts` order (plus
/// BLIS's historical alias); the first that is >= 2 wins.
const EXPERT_COUNT_FIELDS: [&str; 5] = [
    "num_experts",
    "moe_num_experts",
    "n_routed_experts",
    "num_local_experts",
    "num_routed_experts",
];

/// The parsed JSON object of one config, with the model name for error messages.
struct Fields<'a> {
    /// Model name.
    model: &'a str,
    /// Top-level keys with `text_config` merged over them.
    map: Map<String, Value>,
}

/// Parses `json` (the text of a `config.json`) into the architecture of model `name`.
pub(crate) fn parse(name: &str, json: &str) -> Result<ModelArch, CatalogError> {
    let value: Value = serde_json::from_str(json).map_err(|source| CatalogError::ConfigJson {
        model: name.to_string(),
        source,
    })?;
    let Value::Object(mut map) = value else {
        return Err(invalid(
            name,
            "config.json",
            "must be a JSON object".to_string(),
        ));
    };
    // Multimodal configs keep the language model under `text_config`: pivot onto it.
    if let Some(Value::Object(text)) = map.get("text_config").cloned() {
        map.extend(text);
    }
    let fields = Fields { model: name, map };
    let arch = fields.to_arch()?;
    check(&arch)?;
    Ok(arch)
}

impl Fields<'_> {
    /// Builds the architecture (no consistency checks yet).
    fn to_arch(&self) -> Result<ModelArch, CatalogError> {
        let num_heads = self.int("num_attention_heads")?;
        let num_kv_heads = self.int_fallback(&[
            "num_key_value_heads",
            "num_kv_heads",
            "multi_query_group_num",
        ])?;
        let intermediate_size = self.int_fallback(&["intermediate_size", "ffn_hidden_size"])?;
        let moe_intermediate_size = self.int("moe_intermediate_size")?;
        let bytes_per_param = self.dtype_bytes()?;
        let max_position_embeddings = self.int("max_position_embeddings")?;
        let sliding_window_layers = self.sliding_layers()?;
        let model_type = self.string("model_type").unwrap_or("");
        let max_model_len = scaled_max_model_len(
            max_position_embeddings,
            model_type,
            self.map.get("rope_scaling"),
        );
        Ok(ModelArch {
            name: self.model.to_string(),
            num_layers: self.int("num_hidden_layers")?,
            hidden_size: self.int("hidden_size")?,
            num_heads,
            num_kv_heads: if num_kv_heads == 0 {
                num_heads
            } else {
                num_kv_heads
            },
            head_dim: self.int("head_dim")?,
            intermediate_size,
            vocab_size: self.int("vocab_size")?,
            bytes_per_param,
            kv_bytes_per_element: bytes_per_param,
            weight_bytes_per_param: self.weight_bytes()?,
            hidden_act: self.string("hidden_act").unwrap_or("").to_string(),
            tie_word_embeddings: self.map.get("tie_word_embeddings") == Some(&Value::Bool(true)),
            max_position_embeddings,
            max_model_len,
            num_experts: self.expert_count()?,
            experts_per_tok: self
                .int_fallback(&["num_experts_per_tok", "num_experts_per_token"])?,
            moe_intermediate_size,
            shared_expert_intermediate_size: self
                .shared_expert_width(moe_intermediate_size, intermediate_size)?,
            interleave_moe_layer_step: self.int("interleave_moe_layer_step")?,
            dense_intermediate_size: self.int("intermediate_size_mlp")?,
            first_k_dense_replace: self.int("first_k_dense_replace")?,
            kv_lora_rank: self.int("kv_lora_rank")?,
            qk_rope_head_dim: self.int("qk_rope_head_dim")?,
            sliding_window_layers,
            sliding_window: if sliding_window_layers > 0 {
                self.int("sliding_window")?
            } else {
                0
            },
            unquantized_weight_bytes_per_param: self.unquantized_weight_bytes(bytes_per_param),
        })
    }

    /// Sliding-window layers: the `sliding_attention` entries of `layer_types` (gpt-oss,
    /// Gemma 3); 0 without `layer_types`, or with `use_sliding_window: false` (Qwen's
    /// configs name a window they do not use). A config with sliding layers must give a
    /// positive `sliding_window`.
    fn sliding_layers(&self) -> Result<u32, CatalogError> {
        if self.map.get("use_sliding_window") == Some(&Value::Bool(false)) {
            return Ok(0);
        }
        let Some(Value::Array(types)) = self.map.get("layer_types") else {
            return Ok(0);
        };
        let sliding = types
            .iter()
            .filter(|kind| kind.as_str() == Some("sliding_attention"))
            .count();
        let sliding = u32::try_from(sliding).unwrap_or(u32::MAX);
        if sliding > 0 && self.int("sliding_window")? == 0 {
            let problem =
                format!("is missing or 0 while layer_types names {sliding} sliding layers");
            return Err(invalid(self.model, "sliding_window", problem));
        }
        Ok(sliding)
    }

    /// The width of the modules a quantized checkpoint leaves unquantized
    /// (`quantization_config.modules_to_not_convert`, as gpt-oss's MXFP4 config lists its
    /// attention, router, embeddings and LM head): the compute dtype; 0 otherwise.
    fn unquantized_weight_bytes(&self, compute_bytes: f64) -> f64 {
        match self.map.get("quantization_config") {
            Some(Value::Object(quant)) => match quant.get("modules_to_not_convert") {
                Some(Value::Array(modules)) if !modules.is_empty() => compute_bytes,
                _ => 0.0,
            },
            _ => 0.0,
        }
    }

    /// A non-negative integer field; 0 when absent or not a number (BLIS's `getInt`).
    /// Fractions truncate; negative or oversized values are errors.
    fn int(&self, key: &'static str) -> Result<u32, CatalogError> {
        let Some(number) = self.map.get(key).and_then(Value::as_f64) else {
            return Ok(0);
        };
        if !(number >= 0.0 && number <= f64::from(u32::MAX)) {
            let problem = format!("must be an integer in 0..={}, got {number}", u32::MAX);
            return Err(invalid(self.model, key, problem));
        }
        Ok(number as u32)
    }

    /// The first of `keys` that is a non-zero integer, else 0.
    fn int_fallback(&self, keys: &[&'static str]) -> Result<u32, CatalogError> {
        for &key in keys {
            let value = self.int(key)?;
            if value != 0 {
                return Ok(value);
            }
        }
        Ok(0)
    }

    /// A string field, if present and a string.
    fn string(&self, key: &str) -> Option<&str> {
        self.map.get(key).and_then(Value::as_str)
    }

    /// Routed expert count: the first alias that is >= 2 (single-expert models are dense).
    fn expert_count(&self) -> Result<u32, CatalogError> {
        for key in EXPERT_COUNT_FIELDS {
            let value = self.int(key)?;
            if value >= MOE_MIN_EXPERTS {
                return Ok(value);
            }
        }
        Ok(0)
    }

    /// Total shared-expert FFN width: explicit, else count x per-expert width.
    fn shared_expert_width(&self, moe_width: u32, dense_width: u32) -> Result<u32, CatalogError> {
        let explicit = self.int("shared_expert_intermediate_size")?;
        if explicit > 0 {
            return Ok(explicit);
        }
        let count = self.int_fallback(&["n_shared_experts", "num_shared_experts"])?;
        let per_expert = if moe_width > 0 {
            moe_width
        } else {
            dense_width
        };
        count.checked_mul(per_expert).ok_or_else(|| {
            invalid(
                self.model,
                "n_shared_experts",
                "times the expert width overflows".into(),
            )
        })
    }

    /// Compute dtype width from `torch_dtype` (or `dtype` when `torch_dtype` is absent).
    fn dtype_bytes(&self) -> Result<f64, CatalogError> {
        let (key, dtype) = match (self.string("torch_dtype"), self.string("dtype")) {
            (Some(dtype), _) => ("torch_dtype", dtype),
            (None, Some(dtype)) => ("dtype", dtype),
            // gpt-oss's MXFP4 configs give no dtype: the checkpoint keeps its unquantized
            // modules in bf16 and vLLM computes in bf16.
            (None, None) if self.quant_method().eq_ignore_ascii_case("mxfp4") => {
                return Ok(2.0);
            }
            (None, None) => {
                let problem = "is missing (needed for bytes per parameter)".to_string();
                return Err(invalid(self.model, "torch_dtype", problem));
            }
        };
        DTYPE_BYTES
            .iter()
            .find(|(name, _)| *name == dtype)
            .map(|&(_, bytes)| bytes)
            .ok_or_else(|| {
                let known: Vec<&str> = DTYPE_BYTES.iter().map(|(name, _)| *name).collect();
                let problem = format!("`{dtype}` is not one of {}", known.join(", "));
                invalid(self.model, key, problem)
            })
    }

    /// `quantization_config.quant_method`, or "" when absent.
    fn quant_method(&self) -> &str {
        self.map
            .get("quantization_config")
            .and_then(|quant| quant.get("quant_method"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// Quantized weight width: `quantization_config`, else the model name, else 0.
    fn weight_bytes(&self) -> Result<f64, CatalogError> {
        if let Some(Value::Object(quant)) = self.map.get("quantization_config") {
            let bytes = quantization_bytes(quant);
            if bytes > 0.0 {
                return Ok(bytes);
            }
        }
        Ok(weight_bytes_from_name(self.model))
    }
}

/// vLLM's `max_model_len` from `max_position_embeddings` and `rope_scaling`: unchanged for
/// gemma3 and for `su`/`longrope`/`llama3` scaling (already folded in), or without a factor
/// > 1; otherwise the base (`original_max_position_embeddings` for yarn) times the factor.
fn scaled_max_model_len(max_position: u32, model_type: &str, rope: Option<&Value>) -> u32 {
    if max_position == 0 || model_type.contains("gemma3") {
        return max_position;
    }
    let Some(Value::Object(rope)) = rope else {
        return max_position;
    };
    let kind = rope
        .get("type")
        .and_then(Value::as_str)
        .filter(|kind| !kind.is_empty())
        .or_else(|| rope.get("rope_type").and_then(Value::as_str))
        .unwrap_or("");
    if matches!(kind, "su" | "longrope" | "llama3") {
        return max_position;
    }
    let factor = rope.get("factor").and_then(Value::as_f64).unwrap_or(0.0);
    if !(factor.is_finite() && factor > 1.0) {
        return max_position;
    }
    let mut base = f64::from(max_position);
    if kind == "yarn" {
        let original = rope
            .get("original_max_position_embeddings")
            .and_then(Value::as_f64);
        if let Some(original) = original.filter(|&original| original > 0.0) {
            base = original.trunc();
        }
    }
    // Saturating float-to-int conversion; truncation is the intent.
    (base * factor) as u32
}

/// Builds an `InvalidModelConfig` error.
fn invalid(model: &str, field: &str, problem: String) -> CatalogError {
    CatalogError::InvalidModelConfig {
        model: model.to_string(),
        field: field.to_string(),
        problem,
    }
}

/// The longest context a config may declare, tokens (2^24): above the longest any model
/// publishes (Llama 4 Scout's 10,485,760); a config declaring more is broken, and one
/// declaring 4e9 made ditto size every sequence limit from it (issue 38 D15).
pub const MAX_CONTEXT_TOKENS: u32 = 1 << 24;
/// The shortest context a config may declare, tokens (one KV block of 16): a model of one
/// token's context serves no request, and a forecast on it answered TTFT 0 (issue 38 D15).
pub const MIN_CONTEXT_TOKENS: u32 = 16;

/// Rejects configs no latency model or capacity estimate could use: zero dimensions,
/// a context longer than [`MAX_CONTEXT_TOKENS`] and inconsistent MoE fields (BLIS rejects
/// the others when it builds a model).
fn check(arch: &ModelArch) -> Result<(), CatalogError> {
    for (field, value) in [
        ("max_position_embeddings", arch.max_position_embeddings),
        ("rope_scaling.factor", arch.max_model_len),
    ] {
        if value > 0 && value < MIN_CONTEXT_TOKENS {
            let problem = format!(
                "gives a context of {value} tokens, less than one KV block ({MIN_CONTEXT_TOKENS}): \
                 no request fits"
            );
            return Err(invalid(&arch.name, field, problem));
        }
        if value > MAX_CONTEXT_TOKENS {
            let problem = format!(
                "gives a context of {value} tokens, more than {MAX_CONTEXT_TOKENS} \
                 (no published model is that long)"
            );
            return Err(invalid(&arch.name, field, problem));
        }
    }
    let required = [
        ("num_hidden_layers", arch.num_layers),
        ("hidden_size", arch.hidden_size),
        ("num_attention_heads", arch.num_heads),
    ];
    for (field, value) in required {
        if value == 0 {
            return Err(invalid(&arch.name, field, "is missing or 0".to_string()));
        }
    }
    if arch.is_moe() && arch.experts_per_tok == 0 {
        let problem = format!(
            "is missing for an MoE model with {} experts",
            arch.num_experts
        );
        return Err(invalid(&arch.name, "num_experts_per_tok", problem));
    }
    if arch.is_moe() && arch.experts_per_tok > arch.num_experts {
        let problem = format!(
            "({}) exceeds the expert count ({})",
            arch.experts_per_tok, arch.num_experts
        );
        return Err(invalid(&arch.name, "num_experts_per_tok", problem));
    }
    if !arch.is_moe() && arch.experts_per_tok > 0 {
        let problem = format!(
            "is {} but no total expert count (num_experts, n_routed_experts, \
             num_local_experts, ...) is given",
            arch.experts_per_tok
        );
        return Err(invalid(&arch.name, "num_experts_per_tok", problem));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(json: &str) -> ModelArch {
        parse("test-model", json).unwrap()
    }

    const BASE: &str = r#""num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 100, "torch_dtype": "bfloat16""#;

    #[test]
    fn defaults_kv_heads_to_heads_and_reads_aliases() {
        let arch = parse_ok(&format!("{{{BASE}}}"));
        assert_eq!(arch.num_kv_heads, 4);
        assert_eq!(arch.bytes_per_param, 2.0);
        assert_eq!(arch.weight_bytes_per_param, 0.0);
        let glm = parse_ok(
            r#"{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                "multi_query_group_num": 2, "ffn_hidden_size": 256, "dtype": "float16"}"#,
        );
        assert_eq!(glm.num_kv_heads, 2);
        assert_eq!(glm.intermediate_size, 256);
    }

    #[test]
    fn an_absurd_context_is_refused_naming_the_field() {
        let err = parse(
            "m",
            &format!(r#"{{{BASE}, "max_position_embeddings": 4e9}}"#),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("max_position_embeddings"), "{err}");
        let err = parse(
            "m",
            &format!(
                r#"{{{BASE}, "max_position_embeddings": 1048576,
                    "rope_scaling": {{"type": "dynamic", "factor": 32.0}}}}"#
            ),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("rope_scaling.factor"), "{err}");
        let err = parse("m", &format!(r#"{{{BASE}, "max_position_embeddings": 1}}"#))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("max_position_embeddings") && err.contains("no request fits"),
            "{err}"
        );
        // Llama 4 Scout's ten million tokens are fine.
        let arch = parse_ok(&format!(
            r#"{{{BASE}, "max_position_embeddings": 10485760}}"#
        ));
        assert_eq!(arch.max_model_len, 10_485_760);
    }

    #[test]
    fn text_config_wins() {
        let arch = parse_ok(&format!(
            r#"{{{BASE}, "text_config": {{"num_hidden_layers": 7, "hidden_size": 32}}}}"#
        ));
        assert_eq!((arch.num_layers, arch.hidden_size), (7, 32));
    }

    #[test]
    fn moe_fields_and_shared_experts() {
        let arch = parse_ok(&format!(
            r#"{{{BASE}, "num_local_experts": 1, "n_routed_experts": 64,
                "num_experts_per_tok": 6, "moe_intermediate_size": 16, "n_shared_experts": 2}}"#
        ));
        assert_eq!(arch.num_experts, 64);
        assert_eq!(arch.experts_per_tok, 6);
        assert_eq!(arch.shared_expert_intermediate_size, 32);
    }

    #[test]
    fn quantization_and_name_fallback() {
        let bits = parse_ok(&format!(
            r#"{{{BASE}, "quantization_config": {{"bits": "4"}}}}"#
        ));
        assert_eq!(bits.weight_bytes_per_param, 0.5);
        let fp8 = parse_ok(&format!(
            r#"{{{BASE}, "quantization_config": {{"quant_method": "FP8"}}}}"#
        ));
        assert_eq!(fp8.weight_bytes_per_param, 1.0);
        let groups = parse_ok(&format!(
            r#"{{{BASE}, "quantization_config": {{"quant_method": "compressed-tensors",
                "config_groups": {{"group_1": {{"weights": {{"num_bits": 4}}}},
                                   "group_0": {{"weights": {{"num_bits": 8}}}}}}}}}}"#
        ));
        assert_eq!(groups.weight_bytes_per_param, 1.0); // group_0 sorts first
        assert_eq!(
            weight_bytes_from_name("RedHatAI/Llama-3.3-70B-Instruct-quantized.w4a16"),
            0.5
        );
        assert_eq!(weight_bytes_from_name("phi-4-FP8-dynamic"), 1.0);
        assert_eq!(weight_bytes_from_name("fp8x-model"), 0.0);
        assert_eq!(weight_bytes_from_name("llama-3.1-8b"), 0.0);
    }

    #[test]
    fn sliding_layers_and_mxfp4_are_read() {
        let arch = parse_ok(
            r#"{"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
                "vocab_size": 100, "num_local_experts": 8, "num_experts_per_tok": 2,
                "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention",
                                "sliding_attention", "full_attention"],
                "quantization_config": {"quant_method": "mxfp4",
                    "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}}"#,
        );
        assert_eq!((arch.sliding_window_layers, arch.sliding_window), (2, 128));
        assert!(arch.is_hybrid_kv());
        assert_eq!(arch.bytes_per_param, 2.0);
        assert_eq!(arch.weight_bytes_per_param, 0.53125);
        assert_eq!(arch.unquantized_weight_bytes(), 2.0);
        // Qwen names a window it does not use.
        let qwen = parse_ok(&format!(
            r#"{{{BASE}, "use_sliding_window": false, "sliding_window": 4096,
                "layer_types": ["sliding_attention", "full_attention"]}}"#
        ));
        assert_eq!((qwen.sliding_window_layers, qwen.sliding_window), (0, 0));
        let err = parse(
            "m",
            &format!(r#"{{{BASE}, "layer_types": ["sliding_attention", "full_attention"]}}"#),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("sliding_window"), "{err}");
    }

    #[test]
    fn rope_scaling_sets_max_model_len() {
        let yarn = serde_json::json!({"type": "yarn", "factor": 40,
            "original_max_position_embeddings": 4096});
        assert_eq!(
            scaled_max_model_len(163_840, "deepseek_v2", Some(&yarn)),
            163_840
        );
        let linear = serde_json::json!({"rope_type": "linear", "factor": 2.0});
        assert_eq!(scaled_max_model_len(4096, "llama", Some(&linear)), 8192);
        let llama3 = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
        assert_eq!(
            scaled_max_model_len(131_072, "llama", Some(&llama3)),
            131_072
        );
        assert_eq!(
            scaled_max_model_len(8192, "gemma3_text", Some(&linear)),
            8192
        );
        assert_eq!(scaled_max_model_len(4096, "llama", None), 4096);
    }

    #[test]
    fn errors_name_model_and_field() {
        let err = parse("m1", r#"{"hidden_size": 64}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("m1") && err.contains("torch_dtype"), "{err}");
        let err = parse("m2", &format!(r#"{{{BASE}, "num_experts_per_tok": 2}}"#))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("m2") && err.contains("num_experts_per_tok"),
            "{err}"
        );
        let err = parse("m3", &format!(r#"{{{BASE}, "head_dim": -1}}"#))
            .unwrap_err()
            .to_string();
        assert!(err.contains("head_dim"), "{err}");
        let err = parse("m4", "[1, 2]").unwrap_err().to_string();
        assert!(err.contains("JSON object"), "{err}");
        let err = parse("m5", "{").unwrap_err().to_string();
        assert!(err.contains("m5"), "{err}");
    }
}
