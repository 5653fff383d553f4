//! Input checks shared by the analytic latency models (roofline and trained physics).
//!
//! Mirrors BLIS's `ValidateRooflineConfig` / `NewTrainedPhysicsModel` checks so a bad config
//! fails at construction with the field named, instead of producing NaN or infinite step
//! times later. Knows nothing about the formulas themselves.

use super::{GpuSpec, LatencyError, ModelArch};

/// Rejects `tp == 0`.
pub(crate) fn check_tp(tp: u32) -> Result<(), LatencyError> {
    if tp == 0 {
        return Err(LatencyError::InvalidTp { tp });
    }
    Ok(())
}

/// Builds the error for a model field.
fn model_error(arch: &ModelArch, field: &'static str, problem: String) -> LatencyError {
    LatencyError::InvalidModel {
        model: arch.name.clone(),
        field,
        problem,
    }
}

/// Checks the architecture fields every analytic model divides by or multiplies with, plus
/// BLIS's MoE consistency rules.
pub(crate) fn check_arch(arch: &ModelArch) -> Result<(), LatencyError> {
    let positive_counts = [
        ("num_layers", arch.num_layers),
        ("hidden_size", arch.hidden_size),
        ("num_heads", arch.num_heads),
        ("num_kv_heads", arch.num_kv_heads),
    ];
    for (field, value) in positive_counts {
        if value == 0 {
            return Err(model_error(arch, field, "must be > 0, got 0".to_string()));
        }
    }
    if !(arch.bytes_per_param.is_finite() && arch.bytes_per_param > 0.0) {
        let problem = format!("must be finite and > 0, got {}", arch.bytes_per_param);
        return Err(model_error(arch, "bytes_per_param", problem));
    }
    if !(arch.kv_bytes_per_element.is_finite() && arch.kv_bytes_per_element > 0.0) {
        let problem = format!("must be finite and > 0, got {}", arch.kv_bytes_per_element);
        return Err(model_error(arch, "kv_bytes_per_element", problem));
    }
    if !(arch.weight_bytes_per_param.is_finite() && arch.weight_bytes_per_param >= 0.0) {
        let problem = format!(
            "must be finite and >= 0 (0 = compute dtype), got {}",
            arch.weight_bytes_per_param
        );
        return Err(model_error(arch, "weight_bytes_per_param", problem));
    }
    check_moe(arch)
}

/// BLIS's MoE consistency rules: a routed model needs 1..=num_experts active experts, and a
/// dense model must not declare active experts.
fn check_moe(arch: &ModelArch) -> Result<(), LatencyError> {
    if arch.is_moe() && arch.experts_per_tok == 0 {
        let problem = format!(
            "must be > 0 for an MoE model with {} experts",
            arch.num_experts
        );
        return Err(model_error(arch, "experts_per_tok", problem));
    }
    if arch.is_moe() && arch.experts_per_tok > arch.num_experts {
        let problem = format!(
            "({}) cannot exceed num_experts ({})",
            arch.experts_per_tok, arch.num_experts
        );
        return Err(model_error(arch, "experts_per_tok", problem));
    }
    if arch.num_experts == 0 && arch.experts_per_tok > 0 {
        let problem = format!(
            "is {} but num_experts is 0 (the total expert count is missing)",
            arch.experts_per_tok
        );
        return Err(model_error(arch, "experts_per_tok", problem));
    }
    Ok(())
}

/// Rejects a GPU field that is not finite and strictly positive.
fn check_positive(gpu: &GpuSpec, field: &'static str, value: f64) -> Result<(), LatencyError> {
    if value.is_finite() && value > 0.0 {
        return Ok(());
    }
    Err(LatencyError::InvalidGpu {
        gpu: gpu.name.clone(),
        field,
        expected: "finite and > 0",
        value,
    })
}

/// Checks the peak figures both analytic models divide by (FP8 peak may be 0: no FP8 path).
pub(crate) fn check_gpu_peaks(gpu: &GpuSpec) -> Result<(), LatencyError> {
    check_positive(gpu, "tflops_peak", gpu.tflops_peak)?;
    check_positive(gpu, "bw_peak_tbs", gpu.bw_peak_tbs)?;
    check_positive(gpu, "kv_read_factor", gpu.kv_read_factor)?;
    check_positive(gpu, "weight_read_factor", gpu.weight_read_factor)?;
    if !(gpu.tflops_fp8.is_finite() && gpu.tflops_fp8 >= 0.0) {
        return Err(LatencyError::InvalidGpu {
            gpu: gpu.name.clone(),
            field: "tflops_fp8",
            expected: "finite and >= 0 (0 = no FP8 path)",
            value: gpu.tflops_fp8,
        });
    }
    Ok(())
}

/// Checks the calibrated efficiencies the roofline divides by.
pub(crate) fn check_gpu_mfu(gpu: &GpuSpec) -> Result<(), LatencyError> {
    check_positive(gpu, "mfu_prefill", gpu.mfu_prefill)?;
    check_positive(gpu, "mfu_decode", gpu.mfu_decode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::latency::arch::tests::{h100, llama_8b};

    #[test]
    fn good_inputs_pass() {
        assert_eq!(check_arch(&llama_8b()), Ok(()));
        assert_eq!(check_gpu_peaks(&h100()), Ok(()));
        assert_eq!(check_gpu_mfu(&h100()), Ok(()));
        assert_eq!(check_tp(1), Ok(()));
        assert_eq!(check_tp(0), Err(LatencyError::InvalidTp { tp: 0 }));
    }

    #[test]
    fn errors_name_the_field() {
        let mut arch = llama_8b();
        arch.num_heads = 0;
        let message = check_arch(&arch).unwrap_err().to_string();
        assert!(message.contains("num_heads"), "{message}");

        let mut arch = llama_8b();
        arch.num_experts = 8;
        let message = check_arch(&arch).unwrap_err().to_string();
        assert!(message.contains("experts_per_tok"), "{message}");

        let mut gpu = h100();
        gpu.mfu_decode = f64::NAN;
        let message = check_gpu_mfu(&gpu).unwrap_err().to_string();
        assert!(message.contains("mfu_decode"), "{message}");

        let mut gpu = h100();
        gpu.kv_read_factor = 0.0;
        let message = check_gpu_peaks(&gpu).unwrap_err().to_string();
        assert!(message.contains("kv_read_factor"), "{message}");

        for bad in [0.0, -1.1, f64::INFINITY, f64::NAN] {
            let mut gpu = h100();
            gpu.weight_read_factor = bad;
            let message = check_gpu_peaks(&gpu).unwrap_err().to_string();
            assert!(message.contains("weight_read_factor"), "{bad}: {message}");
        }
    }
}
