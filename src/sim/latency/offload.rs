//! Weights held in host memory: vLLM's `--cpu-offload-gb`, what it moves and what every
//! step pays for it.
//!
//! What vLLM does (`vllm/model_executor/offloader/uva.py` `UVAOffloader`, formerly
//! `maybe_offload_to_cpu` in `vllm/model_executor/models/utils.py`; `vllm/config/offload.py`):
//! `cpu_offload_gb` is GiB **per GPU**. `make_layers` hands the decoder layers to the offloader
//! in index order (embeddings, final norm and LM head are never offered). For each layer it
//! walks the parameters in registration order and moves each whole parameter (this GPU's TP
//! shard) to pinned host memory while the bytes moved so far are below `cpu_offload_gb · 2^30`:
//! the check is before each parameter, so the last one moved can overshoot the budget, and a
//! layer can be split (its first parameters on the host, the rest on the GPU). By default the
//! parameter then stays in host memory and the GPU's kernels read it in place through a
//! unified-virtual-address view (zero copy); with `VLLM_WEIGHT_OFFLOADING_DISABLE_UVA` the
//! layer's forward copies its state to the GPU (`non_blocking`) before running instead.
//! Either way every forward pass, which is every engine step, moves the offloaded bytes over
//! the host link once, in line with the step's kernels (nothing prefetches them).
//!
//! The model here: [`WeightOffload::plan`] replays that walk over the parameters vLLM builds
//! for the architecture (per layer: the fused QKV and output projections, then the MLP's fused
//! gate/up and down projections, for an MoE layer the router, the experts' fused `w13` and
//! `w2` and any shared expert, then the two norms), giving the bytes per GPU that leave the
//! GPU. Those bytes are free for the KV cache (vLLM profiles the memory after loading), and
//! each step pays `bytes / host link` ([`WeightOffload::step_us`]) on the GPU's sourced
//! host-to-device bandwidth (`data/gpu_host_link.json`). Nothing is fitted. Not modelled: the
//! HBM read and FLOPs the step formulas still count for the offloaded weights (a kernel on
//! host-resident weights computes while it reads them, so those overlap the term: the HBM
//! read is ~1% of it at PCIe speeds, the FLOPs up to ~10% in a 2048-token prefill on H100),
//! GEMM tiles a long prefill fetches more than once from host memory, and MLA's projections
//! (priced as standard attention's).

use super::{GpuSpec, LatencyKind, ModelArch};

/// Bytes per GiB (`cpu_offload_gb` is GiB: vLLM multiplies by `1024**3`).
pub const GIB: f64 = (1u64 << 30) as f64;

/// Why a weight offload cannot be set up.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum OffloadError {
    /// Negative, NaN or infinite.
    #[error("cpu_offload_gb must be a finite number >= 0, got {value}")]
    Invalid {
        /// The rejected value.
        value: f64,
    },
    /// More than the decoder layers' weights on one GPU, all that vLLM can move.
    #[error(
        "cpu_offload_gb {value} exceeds the decoder layers' weights of `{model}` on one GPU at \
         TP {tp} ({weights_gib:.2} GiB), all that vLLM can offload"
    )]
    MoreThanWeights {
        /// The rejected value.
        value: f64,
        /// Model name.
        model: String,
        /// Tensor parallelism.
        tp: u32,
        /// The decoder layers' weights per GPU, GiB.
        weights_gib: f64,
    },
    /// The GPU's host link is unknown (0), so the term cannot be priced.
    #[error("GPU `{gpu}` has no host-to-device bandwidth (data/gpu_host_link.json)")]
    NoHostLink {
        /// GPU name.
        gpu: String,
    },
    /// A latency model whose fitted coefficients cannot carry the term.
    #[error(
        "cpu_offload_gb needs a latency model that prices it (calibrated, roofline or physics), \
         not {kind}"
    )]
    Unpriced {
        /// The model's name.
        kind: &'static str,
    },
}

/// The weights one GPU holds in host memory, and the link it reads them over.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WeightOffload {
    /// Weight bytes per GPU in pinned host memory (0: no offload).
    pub bytes: u64,
    /// The GPU's host-to-device bandwidth, GB/s.
    pub host_link_gbs: f64,
}

impl WeightOffload {
    /// No offload: no bytes, no time.
    pub const NONE: WeightOffload = WeightOffload {
        bytes: 0,
        host_link_gbs: 0.0,
    };

    /// What `--cpu-offload-gb cpu_offload_gb` moves to the host for `arch` on `gpu` at
    /// tensor parallelism `tp` (see the module doc). 0 moves nothing; a negative, NaN or
    /// infinite value, or more than the decoder layers' weights on one GPU (vLLM offers it
    /// nothing else), is refused.
    pub fn plan(
        arch: &ModelArch,
        gpu: &GpuSpec,
        tp: u32,
        cpu_offload_gb: f64,
    ) -> Result<WeightOffload, OffloadError> {
        if !(cpu_offload_gb.is_finite() && cpu_offload_gb >= 0.0) {
            return Err(OffloadError::Invalid {
                value: cpu_offload_gb,
            });
        }
        if cpu_offload_gb == 0.0 {
            return Ok(WeightOffload::NONE);
        }
        let tp = tp.max(1);
        let movable = offloaded_bytes(arch, tp, u64::MAX);
        let budget = (cpu_offload_gb * GIB) as u64;
        if budget > movable {
            return Err(OffloadError::MoreThanWeights {
                value: cpu_offload_gb,
                model: arch.name.clone(),
                tp,
                weights_gib: movable as f64 / GIB,
            });
        }
        if !(gpu.host_link_gbs.is_finite() && gpu.host_link_gbs > 0.0) {
            return Err(OffloadError::NoHostLink {
                gpu: gpu.name.clone(),
            });
        }
        Ok(WeightOffload {
            bytes: offloaded_bytes(arch, tp, budget),
            host_link_gbs: gpu.host_link_gbs,
        })
    }

    /// What every step pays to read the offloaded weights over the host link, µs (0 without
    /// offload).
    pub fn step_us(&self) -> f64 {
        if self.bytes == 0 || self.host_link_gbs <= 0.0 {
            return 0.0;
        }
        // GB/s = 1e3 bytes per µs.
        self.bytes as f64 / (self.host_link_gbs * 1e3)
    }

    /// Refuses an offload under a latency model that cannot price it (blackbox: its
    /// coefficients are fitted per run and have no weights term). No offload passes.
    pub fn check_priced_by(&self, kind: LatencyKind) -> Result<(), OffloadError> {
        if self.bytes > 0 && kind == LatencyKind::Blackbox {
            return Err(OffloadError::Unpriced {
                kind: kind.as_str(),
            });
        }
        Ok(())
    }
}

/// The bytes vLLM's offloader moves with a budget of `budget` bytes: the decoder layers'
/// parameters in order, each whole, while the bytes moved are below the budget.
pub fn offloaded_bytes(arch: &ModelArch, tp: u32, budget: u64) -> u64 {
    let mut moved = 0u64;
    let mut parameters = Vec::with_capacity(8);
    for layer in 0..arch.num_layers {
        parameters.clear();
        layer_parameter_bytes(arch, tp, layer, &mut parameters);
        for &bytes in &parameters {
            if moved >= budget {
                return moved;
            }
            moved += bytes;
        }
    }
    moved
}

/// True when vLLM builds decoder layer `layer` of `arch` with an MoE block: with an
/// interleave step s > 0 (Llama 4) when (layer + 1) is a multiple of s, otherwise every layer
/// after the first `first_k_dense_replace` (as [`ModelArch::vllm_layer_split`] counts them).
fn is_moe_layer(arch: &ModelArch, layer: u32) -> bool {
    if !arch.is_moe() {
        return false;
    }
    match arch.interleave_moe_layer_step {
        0 => layer >= arch.first_k_dense_replace,
        step => (layer + 1).is_multiple_of(step),
    }
}

/// One GPU's bytes of each parameter of decoder layer `layer`, in the order vLLM registers
/// them (Llama/Qwen/Mixtral decoder layers: attention, MLP or MoE block, norms), appended to
/// `out`. Sharded projections are divided by `tp`; the router and norms are replicated.
fn layer_parameter_bytes(arch: &ModelArch, tp: u32, layer: u32, out: &mut Vec<u64>) {
    let tp = f64::from(tp.max(1));
    let d = f64::from(arch.hidden_size);
    let head_dim = f64::from(arch.effective_head_dim());
    let d_q = f64::from(arch.num_heads) * head_dim;
    let d_kv = f64::from(arch.num_kv_heads) * head_dim;
    // Attention, router and shared parts at the checkpoint's unquantized width where it
    // keeps one (gpt-oss), the routed experts at the quantized width.
    let dense_width = arch.unquantized_weight_bytes();
    let expert_width = arch.effective_weight_bytes_per_param();
    let norm_width = arch.bytes_per_param;
    let bytes = |params: f64, width: f64| (params * width) as u64;
    out.push(bytes(d * (d_q + 2.0 * d_kv) / tp, dense_width)); // qkv_proj
    out.push(bytes(d_q * d / tp, dense_width)); // o_proj
    if is_moe_layer(arch, layer) {
        let experts = f64::from(arch.num_experts);
        let d_ff = f64::from(arch.expert_intermediate_size());
        out.push(bytes(d * experts, norm_width)); // router (replicated)
        out.push(bytes(experts * 2.0 * d_ff * d / tp, expert_width)); // w13
        out.push(bytes(experts * d * d_ff / tp, expert_width)); // w2
        let shared = f64::from(arch.vllm_shared_expert_intermediate());
        if shared > 0.0 {
            out.push(bytes(2.0 * shared * d / tp, dense_width)); // shared gate_up
            out.push(bytes(d * shared / tp, dense_width)); // shared down
        }
    } else {
        let d_ff = if arch.is_moe() && arch.dense_intermediate_size > 0 {
            f64::from(arch.dense_intermediate_size)
        } else {
            f64::from(arch.intermediate_size)
        };
        out.push(bytes(2.0 * d_ff * d / tp, dense_width)); // gate_up_proj
        out.push(bytes(d * d_ff / tp, dense_width)); // down_proj
    }
    out.push(bytes(d, norm_width)); // input_layernorm
    out.push(bytes(d, norm_width)); // post_attention_layernorm
}

#[cfg(test)]
mod tests;
