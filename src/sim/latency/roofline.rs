//! BLIS's roofline step-time model (`sim/latency/roofline.go rooflineStepTime`).
//!
//! One forward pass per step: every request's FLOPs are charged at its phase's MFU, the
//! weights are read once, and the step takes `max(compute, memory)` over the whole mixed
//! batch (a single crossover). There is no all-reduce or overhead term (BLIS's docs claim
//! one; its code has none). Per request with `s` context tokens and `t` new tokens:
//!
//! - FLOPs = L·[2t(d² + 2d·dKV) + 2t·d² + 4·H·t·ctx·dh] + L·(5·H·t·ctx + 2t·d) + MLP, with
//!   `ctx = s + (t−1)/2` when `t > 1` else `s`, MLP = `2t·2·d·dFF` per dense layer and
//!   `2t·2·d·dFF_moe·k` per MoE layer (BLIS counts 2 MLP matrices here).
//! - dynamic bytes = KV write `2·L·Hkv·dh·b·t` + KV read `2·L·Hkv·dh·b·s` + activations
//!   `L·d·b·t` (b = KV/compute bytes per element).
//! - weight bytes (once per step) = [L·(d(d + 2dKV) + d²) + nMoE·2·d·dFF_moe·nEff +
//!   nDense·2·d·dFF]·weight bytes, with `nEff = N·(1 − ((N−k)/N)^B)` and B the step's new
//!   tokens.
//!
//! `step = max(Σ_prefill FLOPs/(tp·peak·mfuPrefill) + Σ_decode FLOPs/(tp·peak·mfuDecode),
//! (weights + Σ dynamic)/(tp·bandwidth))`, truncated to whole µs. `dh = d/H`; the config's
//! `head_dim` is not used here. Knows nothing about queues, KV blocks or the catalog.

use super::validate::{check_arch, check_gpu_mfu, check_gpu_peaks, check_tp};
use super::{BatchEntry, GpuSpec, LatencyError, ModelArch, nonzero_or, us_trunc_from_f64};

/// MLP matrices the roofline charges per layer (up + down; BLIS's `mlpMatrixCount`).
const MLP_MATRICES: f64 = 2.0;

/// BLIS's roofline, with every per-model constant folded in at construction so a step costs
/// one pass over the batch and one `powf` (MoE only).
#[derive(Clone, Debug, PartialEq)]
pub struct RooflineModel {
    /// FLOPs per new token that do not depend on context (projections, RoPE, MLP).
    flops_per_token: f64,
    /// FLOPs per (new token x effective context token) (attention scores and softmax).
    flops_per_token_ctx: f64,
    /// Prefill FLOPs the whole TP group retires per second (`tp·peak·mfuPrefill`).
    prefill_flops_per_s: f64,
    /// Decode FLOPs the whole TP group retires per second (`tp·peak·mfuDecode`).
    decode_flops_per_s: f64,
    /// HBM bytes per new token (KV write plus activations).
    bytes_per_new_token: f64,
    /// HBM bytes per context token (KV read).
    bytes_per_context_token: f64,
    /// Weight bytes read every step regardless of the batch (attention and dense MLP).
    weight_bytes_fixed: f64,
    /// Weight bytes of every routed expert of every MoE layer (scaled by the active fraction).
    weight_bytes_all_experts: f64,
    /// Routed experts (0 for dense models).
    num_experts: u32,
    /// Experts active per token.
    experts_per_tok: u32,
    /// Bytes the whole TP group reads per second (`tp·bandwidth`).
    bytes_per_s: f64,
    /// Weights read from host memory each step, µs ([`super::offload`]); 0 without offload.
    offload_us: f64,
}

impl RooflineModel {
    /// Builds the roofline for `arch` on `gpu` at tensor parallelism `tp`.
    ///
    /// # Invariants
    /// The inputs should pass [`RooflineModel::try_new`]'s checks (the catalog guarantees
    /// this); otherwise step times may be infinite and saturate to `u64::MAX`. `tp == 0` is
    /// treated as 1.
    pub fn new(arch: &ModelArch, gpu: &GpuSpec, tp: u32) -> RooflineModel {
        let tp = f64::from(tp.max(1));
        let layers = f64::from(arch.num_layers);
        let d = f64::from(arch.hidden_size);
        let heads = f64::from(arch.num_heads);
        let head_dim = d / heads;
        let d_kv = f64::from(arch.num_kv_heads) * head_dim;
        let d_ff = if arch.intermediate_size > 0 {
            f64::from(arch.intermediate_size)
        } else {
            4.0 * d
        };
        let d_ff_moe = f64::from(arch.expert_intermediate_size());
        let d_ff_dense = nonzero_or(arch.dense_intermediate_size, d_ff);
        let (moe_layers, dense_layers) = arch.step_layer_split();
        let (moe_layers, dense_layers) = (f64::from(moe_layers), f64::from(dense_layers));
        let top_k = f64::from(arch.experts_per_tok);

        let attn_gemm_per_token = 2.0 * (d * d + 2.0 * d * d_kv) + 2.0 * d * d;
        let rope_per_token = 2.0 * d;
        let mlp_per_token = moe_layers * 2.0 * MLP_MATRICES * d * d_ff_moe * top_k
            + dense_layers * 2.0 * MLP_MATRICES * d * d_ff_dense;
        let flops_per_token = layers * (attn_gemm_per_token + rope_per_token) + mlp_per_token;
        let flops_per_token_ctx = layers * (4.0 * heads * head_dim + 5.0 * heads);

        let kv_per_token = 2.0 * layers * f64::from(arch.num_kv_heads) * head_dim;
        let kv_per_token = kv_per_token * arch.kv_bytes_per_element;
        let activations_per_token = layers * d * arch.bytes_per_param;

        let weight_bpp = arch.effective_weight_bytes_per_param();
        let attn_weights = layers * (d * (d + 2.0 * d_kv) + d * d);
        let dense_mlp_weights = dense_layers * MLP_MATRICES * d * d_ff_dense;
        let all_expert_weights =
            moe_layers * MLP_MATRICES * d * d_ff_moe * f64::from(arch.num_experts);

        let peak_flops = gpu.tflops_for_weight_bytes(weight_bpp) * 1e12;
        RooflineModel {
            flops_per_token,
            flops_per_token_ctx,
            prefill_flops_per_s: tp * peak_flops * gpu.mfu_prefill,
            decode_flops_per_s: tp * peak_flops * gpu.mfu_decode,
            bytes_per_new_token: kv_per_token + activations_per_token,
            bytes_per_context_token: kv_per_token,
            weight_bytes_fixed: (attn_weights + dense_mlp_weights) * weight_bpp,
            weight_bytes_all_experts: all_expert_weights * weight_bpp,
            num_experts: if arch.is_moe() { arch.num_experts } else { 0 },
            experts_per_tok: arch.experts_per_tok,
            bytes_per_s: tp * gpu.bw_peak_tbs * 1e12,
            offload_us: 0.0,
        }
    }

    /// The same model with `step_us` of offloaded weights read over the host link added to
    /// every step ([`super::offload`]).
    pub fn with_weight_offload(mut self, step_us: f64) -> Self {
        self.offload_us = step_us;
        self
    }

    /// Validates the inputs as BLIS's `ValidateRooflineConfig` does (positive dimensions,
    /// bytes, peaks and MFUs; consistent MoE fields; `tp >= 1`), then builds the model.
    pub fn try_new(
        arch: &ModelArch,
        gpu: &GpuSpec,
        tp: u32,
    ) -> Result<RooflineModel, LatencyError> {
        check_tp(tp)?;
        check_arch(arch)?;
        check_gpu_peaks(gpu)?;
        check_gpu_mfu(gpu)?;
        Ok(RooflineModel::new(arch, gpu, tp))
    }

    /// Step time in whole microseconds (truncated; 0 for an empty batch, which the caller
    /// clamps to 1). One pass over `batch`, no allocation.
    pub fn step_us(&self, batch: &[BatchEntry]) -> u64 {
        self.step_with_decodes_us(batch, 0, 0)
    }

    /// Step time of `batch` plus `decodes` more decode requests with `context` cached tokens
    /// in total: exactly [`RooflineModel::step_us`] of the batch with those decodes added
    /// anywhere (decodes are summed as integers, so their order and split never matter).
    pub fn step_with_decodes_us(&self, batch: &[BatchEntry], decodes: u64, context: u64) -> u64 {
        let mut prefill_flops = 0.0;
        let mut prefill_bytes = 0.0;
        // Decode entries (one token each) are summed as integers, so a batch's cost depends
        // only on (decodes, their total context): the engine's lazy decode path relies on it.
        let mut decodes = decodes;
        let mut decode_context = context;
        let mut new_tokens_total = decodes;
        for entry in batch {
            debug_assert!(
                entry.new_tokens > 0,
                "step entries must compute tokens: {entry:?}"
            );
            if entry.new_tokens == 0 {
                continue;
            }
            if entry.is_prefill {
                let context = f64::from(entry.context_tokens);
                let new_tokens = f64::from(entry.new_tokens);
                prefill_flops += self.flops(context, new_tokens);
                prefill_bytes +=
                    new_tokens * self.bytes_per_new_token + context * self.bytes_per_context_token;
            } else {
                debug_assert_eq!(entry.new_tokens, 1, "a decode computes one token");
                decodes += u64::from(entry.new_tokens);
                decode_context += u64::from(entry.context_tokens) * u64::from(entry.new_tokens);
            }
            new_tokens_total += u64::from(entry.new_tokens);
        }
        self.finish(
            prefill_flops,
            prefill_bytes,
            decodes,
            decode_context,
            new_tokens_total,
        )
    }

    fn finish(
        &self,
        prefill_flops: f64,
        prefill_bytes: f64,
        decodes: u64,
        decode_context: u64,
        new_tokens_total: u64,
    ) -> u64 {
        if new_tokens_total == 0 {
            return 0;
        }
        let decode_flops = decodes as f64 * self.flops_per_token
            + decode_context as f64 * self.flops_per_token_ctx;
        let decode_bytes = decodes as f64 * self.bytes_per_new_token
            + decode_context as f64 * self.bytes_per_context_token;
        let compute_s =
            prefill_flops / self.prefill_flops_per_s + decode_flops / self.decode_flops_per_s;
        let weight_bytes = self.weight_bytes(new_tokens_total as f64);
        let memory_s = (weight_bytes + prefill_bytes + decode_bytes) / self.bytes_per_s;
        us_trunc_from_f64(compute_s.max(memory_s) * 1e6 + self.offload_us)
    }

    /// The steps of `decodes` decoding sequences and nothing else, priced as their context
    /// grows: the terms fixed by the batch's size (its FLOPs and bytes per new token, the
    /// weights it reads) are computed once. Each step's price is
    /// [`RooflineModel::step_with_decodes_us`]'s to the last bit.
    pub fn decode_steps(&self, decodes: u64) -> DecodeSteps {
        let count = decodes as f64;
        DecodeSteps {
            decodes,
            flops_fixed: count * self.flops_per_token,
            flops_per_token_ctx: self.flops_per_token_ctx,
            flops_per_s: self.decode_flops_per_s,
            // (`finish` adds the prefill bytes to these first: 0 here, which changes nothing.)
            bytes_fixed: self.weight_bytes(count),
            bytes_new: count * self.bytes_per_new_token,
            bytes_per_context_token: self.bytes_per_context_token,
            bytes_per_s: self.bytes_per_s,
            offload_us: self.offload_us,
        }
    }

    /// FLOPs of one request computing `new_tokens` on top of `context` cached tokens.
    fn flops(&self, context: f64, new_tokens: f64) -> f64 {
        // The chunk's tokens attend to each other causally: on average to half the chunk.
        let effective_context = if new_tokens > 1.0 {
            context + (new_tokens - 1.0) / 2.0
        } else {
            context
        };
        new_tokens * self.flops_per_token
            + new_tokens * effective_context * self.flops_per_token_ctx
    }

    /// Weight bytes read in a step computing `tokens` new tokens: every dense weight, plus
    /// the experts the step's tokens are expected to activate.
    fn weight_bytes(&self, tokens: f64) -> f64 {
        let fraction = activated_expert_fraction(self.num_experts, self.experts_per_tok, tokens);
        self.weight_bytes_fixed + self.weight_bytes_all_experts * fraction
    }
}

/// [`RooflineModel::decode_steps`]: decode-only steps of a fixed number of sequences. Owns
/// the few numbers it needs, so a lazy window or a drain can keep it across steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeSteps {
    decodes: u64,
    /// The decodes' FLOPs that do not depend on context.
    flops_fixed: f64,
    flops_per_token_ctx: f64,
    flops_per_s: f64,
    /// The weights the step reads (the experts its tokens activate included).
    bytes_fixed: f64,
    /// The decodes' KV write and activation bytes.
    bytes_new: f64,
    bytes_per_context_token: f64,
    bytes_per_s: f64,
    /// The offloaded weights' host-link time, µs.
    offload_us: f64,
}

impl DecodeSteps {
    /// Sequences the steps decode.
    pub fn decodes(&self) -> u64 {
        self.decodes
    }

    /// The step in whole microseconds (truncated, 0 without sequences) when the sequences
    /// hold `context` tokens of context in total: `finish`'s arithmetic, in its order, with
    /// no prefill (a prefill sum of 0 adds exactly nothing).
    #[inline]
    pub fn step_us(&self, context: u64) -> u64 {
        if self.decodes == 0 {
            return 0;
        }
        let context = context as f64;
        let flops = self.flops_fixed + context * self.flops_per_token_ctx;
        let bytes = self.bytes_new + context * self.bytes_per_context_token;
        let compute_s = flops / self.flops_per_s;
        let memory_s = (self.bytes_fixed + bytes) / self.bytes_per_s;
        us_trunc_from_f64(compute_s.max(memory_s) * 1e6 + self.offload_us)
    }
}

/// Expected fraction of `num_experts` experts that `tokens` tokens activate when each picks
/// `top_k` uniformly at random: `1 − ((N−k)/N)^tokens`. No tokens activate nothing; a dense
/// model (N = 0) or `k >= N` gives 1 (the factor it scales is then 0 or all experts).
pub fn activated_expert_fraction(num_experts: u32, top_k: u32, tokens: f64) -> f64 {
    if tokens <= 0.0 {
        return 0.0;
    }
    if num_experts == 0 || top_k >= num_experts {
        return 1.0;
    }
    let n = f64::from(num_experts);
    let k = f64::from(top_k);
    1.0 - ((n - k) / n).powf(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::latency::arch::tests::{h100, llama_8b};

    fn decode(context_tokens: u32) -> BatchEntry {
        BatchEntry {
            context_tokens,
            new_tokens: 1,
            prompt_tokens: 100,
            is_prefill: false,
        }
    }

    #[test]
    fn single_decode_matches_hand_computation() {
        // Goal: one decode at context 1000 on llama-3.1-8b/H100/TP1 equals the §3 formula.
        // Method: evaluate each term with plain arithmetic.
        let (l, d, h, hkv, dh, dff): (f64, f64, f64, f64, f64, f64) =
            (32.0, 4096.0, 32.0, 8.0, 128.0, 14336.0);
        let dkv = hkv * dh;
        let s = 1000.0;
        let flops = l * (2.0 * (d * d + 2.0 * d * dkv) + 2.0 * d * d + 4.0 * h * s * dh)
            + l * (5.0 * h * s + 2.0 * d)
            + l * 2.0 * 2.0 * d * dff;
        let compute_s = flops / (989.5e12 * 0.30);
        let weights = (l * (d * (d + 2.0 * dkv) + d * d) + l * 2.0 * d * dff) * 2.0;
        let dynamic = 2.0 * l * hkv * dh * 2.0 * (1.0 + s) + l * d * 2.0;
        let memory_s = (weights + dynamic) / 3.35e12;
        let expected = (compute_s.max(memory_s) * 1e6) as u64;
        assert!(memory_s > compute_s, "a lone decode is memory bound");
        assert_eq!(expected, 3084); // (10.2 GB weights + 131 MB KV) / 3.35 TB/s

        let model = RooflineModel::new(&llama_8b(), &h100(), 1);
        assert_eq!(model.step_us(&[decode(1000)]), expected);
    }

    #[test]
    fn prefill_chunk_is_compute_bound_and_uses_half_chunk_context() {
        // Goal: a 2048-token prefill chunk after 512 cached tokens follows the FLOPs formula.
        let (l, d, h, dh, dff) = (32.0, 4096.0, 32.0, 128.0, 14336.0);
        let dkv = 8.0 * dh;
        let (s, t) = (512.0, 2048.0);
        let ctx = s + (t - 1.0) / 2.0;
        let flops = l * (2.0 * t * (d * d + 2.0 * d * dkv) + 2.0 * t * d * d)
            + l * 4.0 * h * t * ctx * dh
            + l * (5.0 * h * t * ctx + 2.0 * t * d)
            + l * 2.0 * t * 2.0 * d * dff;
        let expected = (flops / (989.5e12 * 0.45) * 1e6) as u64;
        let entry = BatchEntry {
            context_tokens: 512,
            new_tokens: 2048,
            prompt_tokens: 4096,
            is_prefill: true,
        };
        let model = RooflineModel::new(&llama_8b(), &h100(), 1);
        let got = model.step_us(&[entry]);
        assert!(
            got.abs_diff(expected) <= 1,
            "got {got}, expected {expected}"
        );
    }

    #[test]
    fn reference_decode_batch_is_about_five_ms() {
        // BLIS's reference run (llama-3.1-8b/H100/TP1) averages 6.45 ms ITL with ~66 running
        // decodes around 768 tokens of context (plus mixed-in prefill chunks). A pure decode
        // step of that shape is memory bound at ~5 ms.
        let model = RooflineModel::new(&llama_8b(), &h100(), 1);
        let batch = vec![decode(768); 66];
        let step = model.step_us(&batch);
        assert!((4_800..5_300).contains(&step), "step {step} µs");
    }

    #[test]
    fn tensor_parallelism_divides_everything() {
        let model_tp1 = RooflineModel::new(&llama_8b(), &h100(), 1);
        let model_tp2 = RooflineModel::new(&llama_8b(), &h100(), 2);
        let batch = vec![decode(500); 8];
        let (one, two) = (model_tp1.step_us(&batch), model_tp2.step_us(&batch));
        assert!(two.abs_diff(one / 2) <= 1, "tp1 {one}, tp2 {two}");
    }

    #[test]
    fn empty_batch_costs_nothing() {
        let model = RooflineModel::new(&llama_8b(), &h100(), 1);
        assert_eq!(model.step_us(&[]), 0);
    }

    #[test]
    fn moe_active_fraction_limits() {
        // Mixtral-like: N = 8, k = 2.
        assert_eq!(activated_expert_fraction(8, 2, 0.0), 0.0);
        assert_eq!(activated_expert_fraction(8, 2, 1.0), 0.25); // 1 token: k/N
        let two = activated_expert_fraction(8, 2, 2.0);
        assert!((two - (1.0 - 0.75 * 0.75)).abs() < 1e-15);
        assert!(activated_expert_fraction(8, 2, 1000.0) > 0.999_999);
        assert_eq!(activated_expert_fraction(0, 0, 5.0), 1.0);
        assert_eq!(activated_expert_fraction(4, 4, 5.0), 1.0);
    }

    #[test]
    fn moe_weights_grow_with_the_batch() {
        // Goal: nEff makes a 1-token MoE step read k/N of the experts. Method: compare a
        // 1-decode step with the hand-computed weight bytes.
        let mut arch = llama_8b();
        arch.num_experts = 8;
        arch.experts_per_tok = 2;
        let model = RooflineModel::new(&arch, &h100(), 1);
        let (l, d, dkv, dff) = (32.0, 4096.0, 1024.0, 14336.0);
        let attn = l * (d * (d + 2.0 * dkv) + d * d) * 2.0;
        let experts = l * 2.0 * d * dff * 8.0 * 2.0;
        assert_eq!(model.weight_bytes(1.0), attn + experts * 0.25);
        assert!(model.weight_bytes(64.0) > model.weight_bytes(2.0));
        assert!(model.weight_bytes(1e6) <= attn + experts);
    }

    #[test]
    fn decode_steps_price_exactly_as_the_whole_formula() {
        // Goal: the kept terms give step_with_decodes_us's bits for every batch size and
        // context, dense and MoE (whose weights depend on the batch), compute- and
        // memory-bound. Method: compare over a grid, including very large contexts.
        let mut moe = llama_8b();
        moe.num_experts = 8;
        moe.experts_per_tok = 2;
        for arch in [llama_8b(), moe] {
            for tp in [1, 4] {
                let model = RooflineModel::new(&arch, &h100(), tp);
                for decodes in [0u64, 1, 2, 7, 64, 255, 1024] {
                    let steps = model.decode_steps(decodes);
                    assert_eq!(steps.decodes(), decodes);
                    for context in [0u64, 1, 17, 1000, 65_537, 4_000_000, 300_000_000] {
                        let context = context * decodes.min(1);
                        assert_eq!(
                            steps.step_us(context),
                            model.step_with_decodes_us(&[], decodes, context),
                            "{decodes} decodes, {context} context, tp {tp}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn try_new_rejects_bad_inputs() {
        assert!(RooflineModel::try_new(&llama_8b(), &h100(), 0).is_err());
        let mut gpu = h100();
        gpu.mfu_prefill = 0.0;
        assert!(RooflineModel::try_new(&llama_8b(), &gpu, 1).is_err());
        assert!(RooflineModel::try_new(&llama_8b(), &h100(), 1).is_ok());
    }
}
