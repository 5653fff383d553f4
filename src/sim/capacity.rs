//! KV-cache capacity derived from GPU memory (BLIS `sim/latency/kv_capacity.go
//! CalculateKVBlocks`, which follows llm-d-benchmark's `capacity_planner.py`).
//!
//! Owns the memory budget: how many KV blocks fit once weights, activations and non-torch
//! overhead are set aside. Knows nothing about how blocks are allocated (the KV cache), about
//! step time, or about where the model and GPU figures come from.

use crate::sim::latency::{GpuSpec, ModelArch};

mod profile;

pub use profile::{ProfileShape, forward_peak_bytes, sampler_peak_bytes, torch_peak_bytes};

/// Bytes per GiB.
pub(crate) const GIB: f64 = (1u64 << 30) as f64;
/// Activation memory reserved per replica for a dense model, GiB.
const ACTIVATION_DENSE_GIB: f64 = 5.5;
/// Activation memory reserved per replica for an MoE model, GiB.
const ACTIVATION_MOE_GIB: f64 = 8.0;
/// Non-torch memory (CUDA context, NCCL buffers) per GPU at TP 1, GiB.
const NON_TORCH_TP1_GIB: f64 = 0.15;
/// Non-torch memory per GPU at TP > 1, GiB.
const NON_TORCH_MULTI_GPU_GIB: f64 = 0.6;
/// Activations whose MLP has three matrices (gate, up, down), the only kind the weight
/// estimate supports; an empty name is accepted as SwiGLU (BLIS's default).
const SWIGLU_ACTIVATIONS: [&str; 4] = ["silu", "swiglu", "geglu", ""];

/// Why the KV capacity could not be computed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CapacityError {
    /// `gpu_memory_utilization` outside (0, 1].
    #[error("gpu_memory_utilization must be in (0, 1], got {value}")]
    InvalidUtilization {
        /// The rejected value.
        value: f64,
    },
    /// Tensor parallelism must be at least 1.
    #[error("tensor parallelism must be >= 1, got {tp}")]
    InvalidTp {
        /// The rejected value.
        tp: u32,
    },
    /// Block size must be at least one token.
    #[error("block_size must be >= 1 token, got {block_size}")]
    InvalidBlockSize {
        /// The rejected value.
        block_size: u32,
    },
    /// A model field the estimate needs is missing or out of range.
    #[error("model `{model}`: {field} {problem}")]
    InvalidModel {
        /// Model name.
        model: String,
        /// The `ModelArch` field at fault.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The GPU's memory is not a finite positive number.
    #[error("GPU `{gpu}`: memory_gib must be finite and > 0, got {value}")]
    InvalidGpuMemory {
        /// GPU name.
        gpu: String,
        /// The rejected value.
        value: f64,
    },
    /// Weights, activations and overhead leave no room for the KV cache.
    #[error(
        "model `{model}` does not fit: a weight shard of {weights_gib:.2} GiB + activations \
         {activation_gib:.2} GiB + non-torch {non_torch_gib:.2} GiB exceed the \
         {available_gib:.2} GiB available per GPU at TP {tp}; at least {tp_min} GPU(s) needed"
    )]
    WeightsDoNotFit {
        /// Model name.
        model: String,
        /// Weight memory per GPU (the TP shard), GiB.
        weights_gib: f64,
        /// Reserved activation memory, GiB.
        activation_gib: f64,
        /// Non-torch overhead per GPU, GiB.
        non_torch_gib: f64,
        /// Memory the utilisation allows per GPU, GiB.
        available_gib: f64,
        /// Tensor parallelism tried.
        tp: u32,
        /// Smallest TP that would leave room (BLIS's estimate).
        tp_min: u64,
    },
    /// The budget left after overhead is smaller than one block.
    #[error("only {allocatable_gib:.4} GiB left for KV: less than one {block_bytes}-byte block")]
    NoBlocks {
        /// Memory left for KV, GiB.
        allocatable_gib: f64,
        /// Bytes per block on one GPU.
        block_bytes: u64,
    },
    /// The block count does not fit the engine's 32-bit block ids.
    #[error("{blocks} KV blocks exceed the supported maximum of {}", u32::MAX)]
    TooManyBlocks {
        /// The computed count.
        blocks: u64,
    },
}

/// Number of KV-cache blocks one replica of `arch` on `tp` GPUs of type `gpu` can hold, as
/// vLLM sizes it: per GPU, since every block is sharded across the TP group and each worker
/// reports the same count.
///
/// ```text
/// available   = memory_gib · gpu_memory_utilization                  (one GPU)
/// overhead    = weights / tp + activation (5.5 GiB dense, 8 MoE)
///               + non_torch (0.15 GiB at TP 1, 0.6 GiB above: NCCL buffers)
/// block_bytes = trunc(kv_bytes_per_token(tp) · block_size)           (one GPU's shard)
/// blocks      = trunc((available − overhead) GiB in bytes) / block_bytes   (floor)
/// ```
///
/// `weights` = (embeddings + L·(attention + MLP + 2 norms) + LM head unless tied + final
/// norm) · weight bytes, with attention `d(d + 2·kv_heads·head_dim) + d²`, a 3-matrix MLP
/// `3·d·dFF`, and for MoE models `N·3·d·dFF_moe + 3·d·dFF_shared + N·d` (router) on all but
/// the first `first_k_dense_replace` layers. KV bytes per token use the explicit `head_dim`
/// and the MLA latent (see [`ModelArch::kv_bytes_per_token`]). Only SwiGLU-family
/// activations are supported. The constants are BLIS's (from llm-d-benchmark's capacity
/// planner): llama-3.1-8b on H100, TP 1, 0.9, block 16 gives 26312, exactly BLIS's figure.
///
/// Above TP 1 this deliberately differs from BLIS, which sums memory over the TP group but
/// divides by one GPU's shard of a block, over-counting blocks by about a factor tp.
pub fn num_gpu_blocks(
    arch: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
    gpu_memory_utilization: f64,
    block_size: u32,
) -> Result<u32, CapacityError> {
    num_gpu_blocks_offloaded(arch, gpu, tp, gpu_memory_utilization, block_size, 0)
}

/// [`num_gpu_blocks`] with `offloaded_bytes` of each GPU's weight shard held in host memory
/// (vLLM's `--cpu-offload-gb`, [`crate::sim::latency::offload`]): vLLM profiles the memory
/// after loading, so the bytes that left the GPU are the KV cache's.
pub fn num_gpu_blocks_offloaded(
    arch: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
    gpu_memory_utilization: f64,
    block_size: u32,
    offloaded_bytes: u64,
) -> Result<u32, CapacityError> {
    let activation_gib = if arch.is_moe() {
        ACTIVATION_MOE_GIB
    } else {
        ACTIVATION_DENSE_GIB
    };
    blocks_with_reserve(
        arch,
        gpu,
        tp,
        gpu_memory_utilization,
        block_size,
        offloaded_bytes,
        activation_gib,
    )
}

/// [`num_gpu_blocks`] with the activation reserve vLLM's memory profiling measures
/// ([`torch_peak_bytes`] of a run shaped by `shape`) in place of BLIS's fixed 5.5 GiB
/// (dense) / 8 GiB (MoE); the non-torch overhead is the same. Not the default: see
/// docs/fidelity/memory.md for how it compares with the runs that recorded their blocks.
pub fn num_gpu_blocks_profiled(
    arch: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
    gpu_memory_utilization: f64,
    block_size: u32,
    shape: ProfileShape,
) -> Result<u32, CapacityError> {
    check_inputs(arch, gpu, tp, gpu_memory_utilization, block_size)?;
    let activation_gib = torch_peak_bytes(arch, tp, shape) as f64 / GIB;
    blocks_with_reserve(
        arch,
        gpu,
        tp,
        gpu_memory_utilization,
        block_size,
        0,
        activation_gib,
    )
}

/// The block count once `activation_gib` (with the weights and non-torch overhead) is set
/// aside; see [`num_gpu_blocks`].
fn blocks_with_reserve(
    arch: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
    gpu_memory_utilization: f64,
    block_size: u32,
    offloaded_bytes: u64,
    activation_gib: f64,
) -> Result<u32, CapacityError> {
    check_inputs(arch, gpu, tp, gpu_memory_utilization, block_size)?;
    let block_bytes = arch.kv_bytes_per_block(tp, block_size);
    if block_bytes == 0 {
        return Err(invalid(
            arch,
            "kv_bytes_per_element",
            "gives 0 bytes per block".into(),
        ));
    }
    let tp_f = f64::from(tp);
    let available_gib = gpu.memory_gib * gpu_memory_utilization;
    let weights_gib = model_weight_bytes(arch) as f64 / GIB;
    let non_torch_per_gpu = if tp == 1 {
        NON_TORCH_TP1_GIB
    } else {
        NON_TORCH_MULTI_GPU_GIB
    };
    let non_torch_gib = non_torch_per_gpu;
    let offloaded_gib = offloaded_bytes as f64 / GIB;
    let overhead_gib = weights_gib / tp_f - offloaded_gib + activation_gib + non_torch_gib;
    if overhead_gib >= available_gib {
        // The smallest TP whose weight shard leaves room on each GPU.
        let per_gpu =
            gpu.memory_gib * gpu_memory_utilization - NON_TORCH_MULTI_GPU_GIB - activation_gib;
        let tp_min = if per_gpu > 0.0 {
            (weights_gib / per_gpu).ceil() as u64
        } else {
            u64::MAX
        };
        return Err(CapacityError::WeightsDoNotFit {
            model: arch.name.clone(),
            weights_gib: weights_gib / tp_f - offloaded_gib,
            activation_gib,
            non_torch_gib,
            available_gib,
            tp,
            tp_min,
        });
    }
    let allocatable_gib = available_gib - overhead_gib;
    // Truncation to whole bytes, then floor division: BLIS's int64 arithmetic.
    let allocatable_bytes = (allocatable_gib * GIB) as u64;
    let blocks =
        (allocatable_bytes / block_bytes).saturating_sub(sliding_reserve(arch, block_size));
    if blocks == 0 {
        return Err(CapacityError::NoBlocks {
            allocatable_gib,
            block_bytes,
        });
    }
    u32::try_from(blocks).map_err(|_| CapacityError::TooManyBlocks { blocks })
}

/// Running requests whose sliding-window blocks a hybrid model's pool sets aside: vLLM's
/// default `max_num_seqs`, the most a pod admits at once.
pub const HYBRID_RESERVED_REQUESTS: u64 = 256;

/// Blocks a hybrid model ([`ModelArch::is_hybrid_kv`]) sets aside from the pool for its
/// sliding-window group: [`ModelArch::sliding_blocks_per_request`] for each of
/// [`HYBRID_RESERVED_REQUESTS`] running requests, an upper bound of what the group holds
/// (vLLM's scheduler admits a request only when both groups' blocks fit; the engine here
/// allocates the full group's blocks only, so the sliding group's are taken off its pool up
/// front). 0 for every other model.
pub fn sliding_reserve(arch: &ModelArch, block_size: u32) -> u64 {
    u64::from(arch.sliding_blocks_per_request(block_size)) * HYBRID_RESERVED_REQUESTS
}

/// Estimated weight memory of the whole model in bytes (all experts resident), as BLIS's
/// `computeModelWeightBytes` / `capacity_planner.py` count it. See [`num_gpu_blocks`].
pub fn model_weight_bytes(arch: &ModelArch) -> u64 {
    let d = u64::from(arch.hidden_size);
    let vocab = u64::from(arch.vocab_size);
    let layers = u64::from(arch.num_layers);
    let d_ff = u64::from(arch.intermediate_size);
    let kv_dim = u64::from(arch.num_kv_heads) * u64::from(arch.effective_head_dim());

    let embeddings = vocab * d;
    let attention_per_layer = d * (d + 2 * kv_dim) + d * d;
    let norms_per_layer = 2 * d;
    let dense_mlp_per_layer = 3 * d * d_ff;
    let mlp_total = if arch.is_moe() {
        let experts = u64::from(arch.num_experts);
        // Beside the routed experts: the shared experts and the router.
        let moe_rest_per_layer =
            3 * d * u64::from(arch.shared_expert_intermediate_size) + experts * d;
        let dense_prefix_per_layer = if arch.dense_intermediate_size > 0 {
            3 * d * u64::from(arch.dense_intermediate_size)
        } else {
            dense_mlp_per_layer
        };
        let dense_layers = u64::from(arch.first_k_dense_replace).min(layers);
        dense_layers * dense_prefix_per_layer
            + (layers - dense_layers) * moe_rest_per_layer
            + routed_expert_params(arch)
    } else {
        layers * dense_mlp_per_layer
    };
    let lm_head = if arch.tie_word_embeddings {
        0
    } else {
        vocab * d
    };
    let final_norm = d;
    let params = embeddings
        + layers * (attention_per_layer + norms_per_layer)
        + mlp_total
        + lm_head
        + final_norm;
    if arch.unquantized_weight_bytes_per_param > 0.0 {
        // A checkpoint that quantizes its routed experts only (gpt-oss's MXFP4): the
        // experts at the quantized width, the rest at the width it keeps them in.
        let experts = routed_expert_params(arch);
        let rest = params - experts;
        return (experts as f64 * arch.effective_weight_bytes_per_param()
            + rest as f64 * arch.unquantized_weight_bytes()) as u64;
    }
    // Truncation to whole bytes is the intent (BLIS int64(...)).
    (params as f64 * arch.effective_weight_bytes_per_param()) as u64
}

/// Bytes of the routed experts' weights, every expert of every MoE layer (the part expert
/// parallelism spreads over all the GPUs of a server's data-parallel ranks instead of
/// slicing it over one rank's TP group); 0 for a dense model. Counted as
/// [`model_weight_bytes`] counts them.
pub fn routed_expert_weight_bytes(arch: &ModelArch) -> u64 {
    (routed_expert_params(arch) as f64 * arch.effective_weight_bytes_per_param()) as u64
}

/// Parameters of every routed expert of every MoE layer (the layers after the first
/// `first_k_dense_replace`, as BLIS counts them); 0 for a dense model.
fn routed_expert_params(arch: &ModelArch) -> u64 {
    if !arch.is_moe() {
        return 0;
    }
    let d = u64::from(arch.hidden_size);
    let layers = u64::from(arch.num_layers);
    let moe_layers = layers - u64::from(arch.first_k_dense_replace).min(layers);
    moe_layers * 3 * d * u64::from(arch.expert_intermediate_size()) * u64::from(arch.num_experts)
}

/// Builds an `InvalidModel` error for `arch`.
fn invalid(arch: &ModelArch, field: &'static str, problem: String) -> CapacityError {
    CapacityError::InvalidModel {
        model: arch.name.clone(),
        field,
        problem,
    }
}

/// BLIS's input validation for the capacity estimate (also what a fidelity replay's own
/// block derivation checks first).
pub(crate) fn check_inputs(
    arch: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
    gpu_memory_utilization: f64,
    block_size: u32,
) -> Result<(), CapacityError> {
    if !(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0) {
        return Err(CapacityError::InvalidUtilization {
            value: gpu_memory_utilization,
        });
    }
    if tp == 0 {
        return Err(CapacityError::InvalidTp { tp });
    }
    if block_size == 0 {
        return Err(CapacityError::InvalidBlockSize { block_size });
    }
    if !(gpu.memory_gib.is_finite() && gpu.memory_gib > 0.0) {
        return Err(CapacityError::InvalidGpuMemory {
            gpu: gpu.name.clone(),
            value: gpu.memory_gib,
        });
    }
    let required = [
        ("num_layers", arch.num_layers),
        ("hidden_size", arch.hidden_size),
        ("num_heads", arch.num_heads),
        ("intermediate_size", arch.intermediate_size),
        ("vocab_size", arch.vocab_size),
    ];
    for (field, value) in required {
        if value == 0 {
            return Err(invalid(arch, field, "must be > 0, got 0".to_string()));
        }
    }
    check_arch_widths(arch)?;
    check_kv_heads(arch, tp)
}

/// Byte widths and activation: finite positive KV and compute widths, a non-negative weight
/// width, and a SwiGLU-family activation.
fn check_arch_widths(arch: &ModelArch) -> Result<(), CapacityError> {
    if !(arch.bytes_per_param.is_finite() && arch.bytes_per_param > 0.0) {
        let problem = format!("must be finite and > 0, got {}", arch.bytes_per_param);
        return Err(invalid(arch, "bytes_per_param", problem));
    }
    if !(arch.kv_bytes_per_element.is_finite() && arch.kv_bytes_per_element > 0.0) {
        let problem = format!("must be finite and > 0, got {}", arch.kv_bytes_per_element);
        return Err(invalid(arch, "kv_bytes_per_element", problem));
    }
    if !(arch.weight_bytes_per_param.is_finite() && arch.weight_bytes_per_param >= 0.0) {
        let problem = format!(
            "must be finite and >= 0, got {}",
            arch.weight_bytes_per_param
        );
        return Err(invalid(arch, "weight_bytes_per_param", problem));
    }
    if !SWIGLU_ACTIVATIONS.contains(&arch.hidden_act.as_str()) {
        let problem = format!(
            "`{}` is not supported; the weight estimate needs a SwiGLU-family activation \
             (silu, swiglu, geglu)",
            arch.hidden_act
        );
        return Err(invalid(arch, "hidden_act", problem));
    }
    Ok(())
}

/// KV heads must shard evenly when there are at least `tp` of them, and the implicit head
/// dimension must be exact (standard attention only; MLA stores a latent instead).
fn check_kv_heads(arch: &ModelArch, tp: u32) -> Result<(), CapacityError> {
    if arch.is_mla() {
        return Ok(());
    }
    if arch.head_dim == 0 && !arch.hidden_size.is_multiple_of(arch.num_heads) {
        let problem = format!(
            "({}) must be divisible by num_heads ({})",
            arch.hidden_size, arch.num_heads
        );
        return Err(invalid(arch, "hidden_size", problem));
    }
    if arch.num_kv_heads == 0 {
        return Err(invalid(
            arch,
            "num_kv_heads",
            "must be > 0, got 0".to_string(),
        ));
    }
    if arch.num_kv_heads >= tp && !arch.num_kv_heads.is_multiple_of(tp) {
        let problem = format!("({}) must be divisible by TP ({tp})", arch.num_kv_heads);
        return Err(invalid(arch, "num_kv_heads", problem));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::latency::arch::tests::{h100, llama_8b};

    #[test]
    fn llama_8b_on_h100_gives_blis_reference() {
        // BLIS's reference runs use 26312 blocks for this setup.
        assert_eq!(num_gpu_blocks(&llama_8b(), &h100(), 1, 0.9, 16), Ok(26312));
    }

    #[test]
    fn weight_estimate_for_llama_8b() {
        // 8,030,261,248 parameters (3-matrix MLP, untied head, norms) x 2 bytes.
        assert_eq!(model_weight_bytes(&llama_8b()), 16_060_522_496);
    }

    #[test]
    fn more_gpus_more_blocks() {
        let one = num_gpu_blocks(&llama_8b(), &h100(), 1, 0.9, 16).unwrap();
        let two = num_gpu_blocks(&llama_8b(), &h100(), 2, 0.9, 16).unwrap();
        // Per GPU, as vLLM counts: each GPU holds half of every block and half the weights,
        // so blocks slightly more than double (not quadruple, as BLIS's summed formula gives).
        assert!(two > 2 * one && two < 5 * one / 2, "tp1 {one}, tp2 {two}");
        // By hand: (80*0.9 - weights/2 - 5.5 - 0.6) GiB over 1 MiB per GPU per block.
        let weights_gib = model_weight_bytes(&llama_8b()) as f64 / GIB;
        let expected = ((80.0 * 0.9 - weights_gib / 2.0 - 5.5 - 0.6) * 1024.0).floor() as u32;
        assert!(two.abs_diff(expected) <= 1, "tp2 {two}, by hand {expected}");
    }

    #[test]
    fn errors_name_the_input() {
        let arch = llama_8b();
        let gpu = h100();
        assert_eq!(
            num_gpu_blocks(&arch, &gpu, 1, 1.5, 16),
            Err(CapacityError::InvalidUtilization { value: 1.5 })
        );
        assert_eq!(
            num_gpu_blocks(&arch, &gpu, 0, 0.9, 16),
            Err(CapacityError::InvalidTp { tp: 0 })
        );
        let mut small = gpu.clone();
        small.memory_gib = 16.0;
        let err = num_gpu_blocks(&arch, &small, 1, 0.9, 16).unwrap_err();
        assert!(
            matches!(err, CapacityError::WeightsDoNotFit { tp_min: 2, .. }),
            "{err}"
        );
        let mut gelu = arch.clone();
        gelu.hidden_act = "gelu".to_string();
        let err = num_gpu_blocks(&gelu, &gpu, 1, 0.9, 16).unwrap_err();
        assert!(err.to_string().contains("hidden_act"), "{err}");
        let mut odd = arch;
        odd.num_kv_heads = 6;
        let err = num_gpu_blocks(&odd, &gpu, 4, 0.9, 16).unwrap_err();
        assert!(err.to_string().contains("num_kv_heads"), "{err}");
    }

    #[test]
    fn moe_counts_every_expert_and_the_dense_prefix() {
        // A toy MoE: 2 layers, first one dense; hand-count the parameters.
        let mut arch = llama_8b();
        arch.num_layers = 2;
        arch.hidden_size = 8;
        arch.num_heads = 2;
        arch.num_kv_heads = 2;
        arch.intermediate_size = 16;
        arch.vocab_size = 10;
        arch.num_experts = 4;
        arch.experts_per_tok = 2;
        arch.moe_intermediate_size = 4;
        arch.shared_expert_intermediate_size = 8;
        arch.first_k_dense_replace = 1;
        arch.bytes_per_param = 1.0;
        let (d, kv) = (8, 8);
        let attention = d * (d + 2 * kv) + d * d;
        let dense_mlp = 3 * d * 16;
        let moe_mlp = 3 * d * 4 * 4 + 3 * d * 8 + 4 * d;
        let params = 10 * d + 2 * (attention + 2 * d) + dense_mlp + moe_mlp + 10 * d + d;
        assert_eq!(model_weight_bytes(&arch), params);
    }

    #[test]
    fn the_offloaded_bytes_become_kv_blocks() {
        // vLLM profiles memory after loading: the bytes that left the GPU hold KV blocks.
        let (arch, gpu) = (llama_8b(), h100());
        let plan = crate::sim::latency::WeightOffload::plan(&arch, &gpu, 1, 4.0).unwrap();
        let block = arch.kv_bytes_per_block(1, 16);
        let before = num_gpu_blocks(&arch, &gpu, 1, 0.9, 16).unwrap();
        let after = num_gpu_blocks_offloaded(&arch, &gpu, 1, 0.9, 16, plan.bytes).unwrap();
        let gained = u64::from(after - before);
        let expected = plan.bytes / block;
        assert!(gained.abs_diff(expected) <= 1, "{gained} vs {expected}");
        assert_eq!(
            num_gpu_blocks_offloaded(&arch, &gpu, 1, 0.9, 16, 0).unwrap(),
            before
        );
    }
}
