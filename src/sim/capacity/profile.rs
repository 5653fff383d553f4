//! What vLLM's start-up memory profiling sets aside beside the weights, as arithmetic on
//! the model's shapes instead of BLIS's fixed activation reserve (issue 36).
//!
//! vLLM (`vllm/v1/worker/gpu_worker.py`, `determine_available_memory`) gives the KV cache
//! `total_memory · gpu_memory_utilization − non_kv_cache_memory`, where
//! `non_kv_cache_memory` (`vllm/utils/mem_utils.py`, `memory_profiling`) is the weights +
//! the torch allocator's peak during `profile_run` + the non-torch memory that appeared
//! since the worker started (NCCL and cuBLAS buffers; the CUDA context predates the start
//! snapshot and is not counted). `profile_run` (`gpu_model_runner.py`) is one
//! `_dummy_run(max_num_batched_tokens)` forward pass followed by `_dummy_sampler_run` on
//! the last token of each of `min(max_num_seqs, max_num_batched_tokens)` dummy requests.
//! CUDA graphs are captured after the KV cache is sized (`compile_or_warm_up_model`) and
//! are not subtracted unless `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` is set, so they
//! are left out here. See docs/fidelity/memory.md for the comparison with the runs that
//! recorded their block counts.

use crate::sim::latency::ModelArch;

/// Bytes per element of the activations: the models run in bf16/fp16 (an FP8 checkpoint
/// still computes its activations in bf16).
const ACTIVATION_BYTES: u64 = 2;
/// Bytes per vocabulary entry per sampled request held at the sampler's peak: the logits
/// in the model dtype (2), their fp32 copy (`Sampler.forward`, 4), the top-k/top-p sort's
/// fp32 values and int64 indices (`apply_top_k_top_p`, 4 + 8) and the fp32 softmax (4).
/// `_dummy_sampler_run` sets top-k and top-p so that the sort runs.
const SAMPLER_BYTES_PER_LOGIT: u64 = 22;

/// The batch limits vLLM's profiling run is shaped by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileShape {
    /// `max_num_batched_tokens`: the tokens of the profiling forward pass.
    pub max_num_batched_tokens: u32,
    /// `max_num_seqs`: the requests whose logits the dummy sampler run computes (capped
    /// at `max_num_batched_tokens`).
    pub max_num_seqs: u32,
}

impl ProfileShape {
    /// vLLM's online-serving defaults below 70 GiB of GPU memory, which are also
    /// ditto's engine defaults (`EngineConfig::vllm_defaults`): 2048 tokens, 256 requests.
    pub const VLLM_DEFAULT: ProfileShape = ProfileShape {
        max_num_batched_tokens: 2048,
        max_num_seqs: 256,
    };
}

/// Peak bytes one GPU's torch allocator reaches during vLLM's profiling run: the larger of
/// the forward pass's live tensors ([`forward_peak_bytes`]) and the sampler's
/// ([`sampler_peak_bytes`], with the forward's output hidden states still alive).
pub fn torch_peak_bytes(arch: &ModelArch, tp: u32, shape: ProfileShape) -> u64 {
    let tokens = u64::from(shape.max_num_batched_tokens);
    let hidden_out = tokens * u64::from(arch.hidden_size) * ACTIVATION_BYTES;
    forward_peak_bytes(arch, tp, shape).max(hidden_out + sampler_peak_bytes(arch, shape))
}

/// Largest set of live activations in one decoder layer of a `max_num_batched_tokens`
/// forward pass on one GPU of `tp`: the residual stream and the layer input (`2·T·d`),
/// the block's output before the all-reduce (`T·d`), and the larger of attention (q, k, v
/// and the attention output: `T·(2·H + 2·KVH)/tp·head_dim`) and the MLP (SwiGLU's fused
/// gate-up projection and its activated half: `T·3·dFF/tp`; for an MoE layer the fused-MoE
/// kernel's three caches, `T·k·(3·dFF_expert/tp + d)`), all at the model's dtype.
pub fn forward_peak_bytes(arch: &ModelArch, tp: u32, shape: ProfileShape) -> u64 {
    let tp = u64::from(tp.max(1));
    let t = u64::from(shape.max_num_batched_tokens);
    let d = u64::from(arch.hidden_size);
    let head_dim = u64::from(arch.effective_head_dim());
    let heads = u64::from(arch.num_heads).div_ceil(tp);
    let kv_heads = u64::from(arch.num_kv_heads).div_ceil(tp);
    let attention = t * (2 * heads + 2 * kv_heads) * head_dim;
    let mlp = if arch.is_moe() {
        let k = u64::from(arch.experts_per_tok.max(1));
        let expert_ff = u64::from(arch.expert_intermediate_size()).div_ceil(tp);
        t * k * (3 * expert_ff + d)
    } else {
        t * 3 * u64::from(arch.intermediate_size).div_ceil(tp)
    };
    (3 * t * d + attention.max(mlp)) * ACTIVATION_BYTES
}

/// Bytes the dummy sampler run holds at its peak: [`SAMPLER_BYTES_PER_LOGIT`] for each
/// vocabulary entry of each of `min(max_num_seqs, max_num_batched_tokens)` requests (the
/// logits are gathered to the full vocabulary on every TP rank).
pub fn sampler_peak_bytes(arch: &ModelArch, shape: ProfileShape) -> u64 {
    let requests = u64::from(shape.max_num_seqs.min(shape.max_num_batched_tokens));
    requests * u64::from(arch.vocab_size) * SAMPLER_BYTES_PER_LOGIT
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;
    use crate::sim::capacity::{CapacityError, GIB, num_gpu_blocks, num_gpu_blocks_profiled};

    /// The H100 runs in tests/data/gt that record the KV blocks vLLM gave them (model, TP,
    /// max_num_seqs, max_num_batched_tokens, recorded blocks), all at
    /// gpu_memory_utilization 0.9 and block size 16.
    const RECORDED: [(&str, u32, u32, u32, u32); 4] = [
        // h100-llama2-7b-tp1-*: replay_requests.json kv_blocks_total_gpu.
        ("llama-2-7b-hf", 1, 128, 2048, 7_462),
        // h100-codellama34b-tp2-*.
        ("codellama-34b-instruct-hf", 2, 128, 2048, 26_602),
        // h100-llama2-70b-tp4-*.
        ("llama-2-70b-hf", 4, 128, 2048, 31_356),
        // h100-mixtral8x7b-tp2-*.
        ("mixtral-8x7b-v0.1", 2, 128, 2048, 27_510),
    ];

    fn error_pct(derived: u32, recorded: u32) -> f64 {
        (f64::from(derived) / f64::from(recorded) - 1.0) * 100.0
    }

    #[test]
    fn profiled_reserve_against_the_recorded_blocks() {
        // Goal: the profiled reserve lands nearer vLLM's recorded block counts than BLIS's
        // fixed one. Method: each recorded H100 run's model, TP and batch limits; errors
        // pinned to bands around what docs/fidelity/memory.md reports (fixed -7.7..-25.9%,
        // profiled +1.4..+3.0%: the remaining over-count is the catalog's nominal 80 GiB
        // against the ~0.8% less that CUDA reports).
        let h100 = catalog::gpu("H100").unwrap();
        for (model, tp, seqs, tokens, recorded) in RECORDED {
            let arch = catalog::model(model).unwrap();
            let shape = ProfileShape {
                max_num_batched_tokens: tokens,
                max_num_seqs: seqs,
            };
            let fixed = num_gpu_blocks(&arch, &h100, tp, 0.9, 16).unwrap();
            let profiled = num_gpu_blocks_profiled(&arch, &h100, tp, 0.9, 16, shape).unwrap();
            let (fixed_err, profiled_err) =
                (error_pct(fixed, recorded), error_pct(profiled, recorded));
            eprintln!(
                "{model} tp{tp}: recorded {recorded}, fixed {fixed} ({fixed_err:+.1}%), \
                 profiled {profiled} ({profiled_err:+.1}%)"
            );
            assert!(
                (-27.0..-7.0).contains(&fixed_err),
                "{model}: fixed {fixed_err}"
            );
            assert!(
                (0.0..3.5).contains(&profiled_err),
                "{model}: {profiled_err}"
            );
            assert!(profiled_err.abs() < fixed_err.abs(), "{model}");
            // With the memory CUDA reports instead of the nominal 80 GiB (an A100-SXM4-80GB
            // reports 85,198,045,184 bytes, data/PROVENANCE.md; the H100's ratio assumed the
            // same), the profiled count is within 1%.
            let mut reported = h100.clone();
            reported.memory_gib = 85_198_045_184.0 / GIB;
            let blocks = num_gpu_blocks_profiled(&arch, &reported, tp, 0.9, 16, shape).unwrap();
            let err = error_pct(blocks, recorded);
            eprintln!("  at the reported memory: {blocks} ({err:+.1}%)");
            assert!(err.abs() < 1.0, "{model}: {err}");
        }
    }

    #[test]
    fn llama_2_7b_profile_by_hand() {
        // T = 2048, d = 4096, 32 heads and 32 KV heads of 128, dFF = 11008, vocab 32000,
        // 128 sequences, TP 1, 2-byte activations.
        let arch = catalog::model("llama-2-7b-hf").unwrap();
        let shape = ProfileShape {
            max_num_batched_tokens: 2048,
            max_num_seqs: 128,
        };
        let streams = 3 * 2048 * 4096;
        let attention = 2048 * (2 * 32 + 2 * 32) * 128;
        let mlp = 2048 * 3 * 11008;
        let forward = (streams + attention.max(mlp)) * 2;
        assert_eq!(forward_peak_bytes(&arch, 1, shape), forward);
        let sampler = 128 * 32000 * 22;
        assert_eq!(sampler_peak_bytes(&arch, shape), sampler);
        let peak = forward.max(2048 * 4096 * 2 + sampler);
        assert_eq!(torch_peak_bytes(&arch, 1, shape), peak);
        // Blocks: 0.9 · 80 GiB − weights − peak − 0.15 GiB non-torch, over 16 tokens of
        // 32 layers · 2 · 4096 · 2 bytes (8 MiB).
        let h100 = catalog::gpu("H100").unwrap();
        let weights = crate::sim::capacity::model_weight_bytes(&arch) as f64;
        let free = 0.9 * 80.0 * GIB - weights - peak as f64 - 0.15 * GIB;
        let expected = (free / (8.0 * 1024.0 * 1024.0)).floor() as u32;
        let blocks = num_gpu_blocks_profiled(&arch, &h100, 1, 0.9, 16, shape).unwrap();
        assert!(blocks.abs_diff(expected) <= 1, "{blocks} vs {expected}");
    }

    #[test]
    fn scout_fp8_against_its_recorded_blocks() {
        // h100-scout17b16e-fp8-tp2-*: summary.json golden_kv_blocks_gpu 8,253 (TP 2, 128
        // sequences, 2048 batched tokens, 0.9).
        let h100 = catalog::gpu("H100").unwrap();
        let mut arch = catalog::model("llama-4-scout-17b-16e-instruct-fp8-dynamic").unwrap();
        crate::fidelity::deployment::apply_precision(&mut arch, "FP8").unwrap();
        let shape = ProfileShape {
            max_num_batched_tokens: 2048,
            max_num_seqs: 128,
        };
        let fixed = num_gpu_blocks(&arch, &h100, 2, 0.9, 16);
        let profiled = num_gpu_blocks_profiled(&arch, &h100, 2, 0.9, 16, shape);
        eprintln!("scout: recorded 8253, fixed {fixed:?}, profiled {profiled:?}");
        // What is left (docs/fidelity/memory.md): vLLM also profiles the vision encoder of
        // this multimodal model, which the arithmetic leaves out, so both over-count; the
        // profiled reserve more so.
        let (fixed, profiled) = (fixed.unwrap(), profiled.unwrap());
        assert!(8_253 < fixed && fixed < profiled, "{fixed} {profiled}");
    }

    #[test]
    fn llama_8b_fits_an_l4_as_vllm_serves_it() {
        let (arch, l4) = (
            catalog::model("llama-3.1-8b-instruct").unwrap(),
            catalog::gpu("L4").unwrap(),
        );
        let fixed = num_gpu_blocks(&arch, &l4, 1, 0.9, 16);
        assert!(
            matches!(fixed, Err(CapacityError::WeightsDoNotFit { .. })),
            "{fixed:?}"
        );
        let blocks =
            num_gpu_blocks_profiled(&arch, &l4, 1, 0.9, 16, ProfileShape::VLLM_DEFAULT).unwrap();
        eprintln!("L4 llama-3.1-8b profiled blocks {blocks}");
        assert!(blocks * 16 >= 8192, "{blocks}");
    }
}
