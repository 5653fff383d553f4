//! A checkpoint's weight precision, bytes per parameter: the dtype table, the
//! `quantization_config` forms (bits, fp8, MXFP4, compressed-tensors' groups) and the naming
//! conventions (`w4a16`, `FP8`) a model's name carries when its config says nothing.

use serde_json::{Map, Value};

/// Bytes per element of each `torch_dtype` / `dtype` BLIS recognises (int4/nf4 are stored
/// in one-byte containers).
pub(super) const DTYPE_BYTES: [(&str, f64); 8] = [
    ("float32", 4.0),
    ("float16", 2.0),
    ("bfloat16", 2.0),
    ("int8", 1.0),
    ("uint8", 1.0),
    ("fp8", 1.0),
    ("int4", 1.0),
    ("nf4", 1.0),
];

/// MXFP4 weight width, bytes per parameter: 4-bit E2M1 values plus one 8-bit E8M0 scale per
/// block of 32 (the OCP Microscaling spec; gpt-oss's `*_blocks` / `*_scales` tensors):
/// 4 + 8 / 32 = 4.25 bits.
pub const MXFP4_BYTES_PER_PARAM: f64 = 4.25 / 8.0;

/// Weight width from a `quantization_config`: `bits`, else `fp8`, else compressed-tensors'
/// first `config_groups.*.weights.num_bits` in key order; 0 when none applies.
pub(super) fn quantization_bytes(quant: &Map<String, Value>) -> f64 {
    let bits = match quant.get("bits") {
        Some(Value::Number(number)) => number.as_f64().unwrap_or(0.0).trunc(),
        Some(Value::String(text)) => text.trim().parse::<i64>().map_or(0.0, |bits| bits as f64),
        _ => 0.0,
    };
    if bits > 0.0 {
        return bits / 8.0;
    }
    let method = quant
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("");
    if method.eq_ignore_ascii_case("fp8") {
        return 1.0;
    }
    if method.eq_ignore_ascii_case("mxfp4") {
        return MXFP4_BYTES_PER_PARAM;
    }
    if !method.eq_ignore_ascii_case("compressed-tensors") {
        return 0.0;
    }
    let Some(Value::Object(groups)) = quant.get("config_groups") else {
        return 0.0;
    };
    let mut keys: Vec<&String> = groups.keys().collect();
    keys.sort();
    for key in keys {
        let num_bits = groups[key.as_str()]
            .get("weights")
            .and_then(|weights| weights.get("num_bits"))
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        if num_bits > 0.0 {
            return num_bits / 8.0;
        }
    }
    0.0
}

/// Weight width implied by naming conventions: a `wXaY` token gives X/8 bytes, an `fp8`
/// token 1 byte (tokens are separated by `.`, `-`, `_` or `/`); 0 when neither appears.
pub(crate) fn weight_bytes_from_name(name: &str) -> f64 {
    let lower = name.to_ascii_lowercase();
    let tokens = || lower.split(['.', '-', '_', '/']);
    for token in tokens() {
        if let Some(bits) = weight_bits_of_token(token) {
            return f64::from(bits) / 8.0;
        }
    }
    if tokens().any(|token| token == "fp8") {
        return 1.0;
    }
    0.0
}

/// `Some(X)` when `token` is exactly `w<X digits>a<digits>` with X > 0.
fn weight_bits_of_token(token: &str) -> Option<u32> {
    let rest = token.strip_prefix('w')?;
    let (weight_bits, activation_bits) = rest.split_once('a')?;
    let all_digits = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(weight_bits) || !all_digits(activation_bits) {
        return None;
    }
    weight_bits.parse::<u32>().ok().filter(|&bits| bits > 0)
}
