//! The GPU's GEMM weight-read factor (data/gpu_gemm.json) in the calibrated model's weight
//! term.

use super::entry;
use crate::sim::latency::arch::tests::{h100, llama_8b};
use crate::sim::latency::calibrated::{CalibratedCoefficients, CalibratedModel};
use crate::sim::latency::{GpuSpec, ModelArch};

#[test]
fn the_weight_term_scales_with_the_gpus_gemm_factor() {
    // Goal: an A100's decode GEMMs stream the weights 1.10x dearer than bandwidth scaling
    // from Hopper gives (data/gpu_gemm.json), dense and routed-expert bytes alike; an H100
    // (factor 1) prices the bare bandwidth. Method: pure roofline coefficients, one decode
    // at context 0 (the step is the weight stream plus one token's KV write, < 1 µs);
    // Llama-3.1-8B's bytes hand-computed, and a Mixtral-shaped MoE of it.
    let coefficients = CalibratedCoefficients::ROOFLINE;
    let a100 = GpuSpec {
        name: "A100-80".to_string(),
        tflops_peak: 312.0,
        tflops_fp8: 0.0,
        bw_peak_tbs: 2.039,
        kv_read_factor: 2.5,
        weight_read_factor: 1.10,
        ..h100()
    };
    let bare = GpuSpec {
        weight_read_factor: 1.0,
        ..a100.clone()
    };
    let step = |arch: &ModelArch, gpu: &GpuSpec| {
        let model = CalibratedModel::new(arch, gpu, 1, &coefficients).unwrap();
        model.step_us(&[entry(0, 1, false)]) as f64
    };
    let (l, d, dkv, dff, vocab) = (32.0, 4096.0, 1024.0, 14336.0, 128256.0);
    let bytes = (l * d * (2.0 * d + 2.0 * dkv) + l * 3.0 * d * dff + vocab * d) * 2.0;
    let weights_us = |tb_per_s: f64| bytes / (tb_per_s * 1e6);
    // 16.06 GB: 4,794 µs on the H100, 7,877 µs at the A100's bare 2.039 TB/s, 8,665 µs
    // with its factor (788 µs apart: far outside the tolerance).
    let llama = llama_8b();
    let h100_step = step(&llama, &h100());
    assert!((h100_step - weights_us(3.35)).abs() < 2.0, "{h100_step}");
    let bare_step = step(&llama, &bare);
    assert!((bare_step - weights_us(2.039)).abs() < 2.0, "{bare_step}");
    let a100_step = step(&llama, &a100);
    assert!(
        (a100_step - 1.10 * weights_us(2.039)).abs() < 2.0,
        "{a100_step}"
    );
    // The routed experts' bytes take the factor too (one token touches 2 of 8 experts).
    let moe = ModelArch {
        num_experts: 8,
        experts_per_tok: 2,
        ..llama_8b()
    };
    let (bare_moe, a100_moe) = (step(&moe, &bare), step(&moe, &a100));
    assert!(bare_moe > bare_step + 1_000.0, "{bare_moe}");
    assert!((a100_moe - 1.10 * bare_moe).abs() < 2.0, "{a100_moe}");
}
