//! BLIS's "trained physics" model (`sim/latency/trained_physics_model.go`): roofline-style
//! basis terms weighted by globally fitted coefficients, plus per-request overheads.
//!
//! All terms are µs on one GPU (tp-sharded, data parallelism 1). With P prefill tokens, D
//! decode requests, Σctx their context, t_i/s_i a prefill's chunk and full input length:
//!
//! - prefill compute `[L·2P·d(2d+2dKV)/tp + L·Σ 4(H/tp)·t_i(s_i + t_i/2)·dh + FFN(P)]/peak`
//! - prefill KV `L·2·(dKV/tp)·P·2 B/bw`; decode KV `L·2·(dKV/tp)·2 B·(Σctx + D)/bw`
//! - decode compute `[L·2D·d(2d+2dKV)/tp + L·4(H/tp)·Σctx·dh + FFN(D)]/peak`
//! - FFN(n) = nMoE·(n·k/tp)·6d·dFF_moe + nMoE·n·6d·dFF_shared/tp + nDense·n·6d·dFF/tp
//! - weights `[L·d(2d+2dKV) + nMoE·(N/tp)·3d·dFF_moe + nMoE·3d·dFF_shared/tp + nDense·3d·dFF/tp]·wb/bw`
//!   (all resident experts, independent of the batch)
//! - TP all-reduce `(L + nDense + nMoE)·(P+D)·d·ab·2·(tp−1)/tp/bw` (MoE layers only at tp>1)
//!
//! `step = β1a·pf_c + β1b·pf_kv + β2a·dc_c + β2b·dc_kv + β3·w + β4·tp + β5·L + β6·batch + β7 +
//! β8·nMoE` (β8 only for interleaved MoE; with fewer than 9/10 betas the prefill/decode terms
//! are `β·max(compute, kv)`), truncated, at least 1. `peak` is the FP8 rate for one-byte
//! weights on an FP8-capable GPU, without MFU. `dh = d/H` (integer), KV elements are 2 bytes.
//! Overheads: queueing = α0, post-decode = α1, per output token = α2.
//!
//! Knows nothing about where the coefficients come from (the catalog embeds BLIS's) nor
//! about queues or KV blocks.

use super::validate::{check_arch, check_gpu_peaks, check_tp};
use super::{
    BatchEntry, GpuSpec, LatencyError, ModelArch, check_coefficients, nonzero_or, us_trunc_from_f64,
};

/// KV-cache element width the physics basis assumes (FP16/BF16), whatever the weights are.
const KV_BYTES_PER_ELEMENT: f64 = 2.0;

/// Number of beta slots the formula uses (shorter lists are padded as BLIS does).
const BETA_SLOTS: usize = 11;

/// Global trained-physics coefficients.
#[derive(Clone, Debug, PartialEq)]
pub struct PhysicsCoefficients {
    /// α0 queueing (µs), α1 post-decode overhead (µs), α2 per output token (µs).
    pub alpha: [f64; 3],
    /// β1a, β2a, β3, β4, β5 (µs/layer), β6 (µs/request), β7 (µs/step), β8 (µs/MoE layer),
    /// β1b, β2b, β_EP: 7 to 11 values. Missing β8 is 0; from 9 values the prefill term
    /// splits into compute and KV, from 10 the decode term does; β_EP defaults to β4.
    pub beta: Vec<f64>,
}

/// The trained-physics model with its per-model constants folded in.
#[derive(Clone, Debug, PartialEq)]
pub struct PhysicsModel {
    /// Overhead coefficients (µs).
    alpha: [f64; 3],
    /// Betas padded to [`BETA_SLOTS`].
    beta: [f64; BETA_SLOTS],
    /// β1a·compute + β1b·kv instead of β1·max(compute, kv).
    prefill_split: bool,
    /// β2a·compute + β2b·kv instead of β2·max(compute, kv).
    decode_split: bool,
    /// Transformer layers.
    layers: f64,
    /// Projection and FFN FLOPs per token on one GPU.
    flops_per_token: f64,
    /// Attention FLOPs per (query token x context token) on one GPU, all layers
    /// (`L·4·(H/tp)·dh`).
    attn_flops_per_token_ctx: f64,
    /// FLOPs one GPU retires per µs (no MFU).
    flops_per_us: f64,
    /// KV bytes per token on one GPU, all layers.
    kv_bytes_per_token: f64,
    /// HBM bytes per µs.
    bytes_per_us: f64,
    /// Weight-loading time per step (µs), independent of the batch.
    weight_us: f64,
    /// TP all-reduce time per token (µs); 0 at tp = 1.
    allreduce_us_per_token: f64,
    /// MoE layers that pay β8 (interleaved architectures only), else 0.
    beta8_layers: f64,
    /// Weights read from host memory each step, µs ([`super::offload`]); 0 without offload.
    offload_us: f64,
}

impl PhysicsModel {
    /// Builds the model for `arch` on `gpu` at tensor parallelism `tp`, validating the inputs
    /// as BLIS's `NewTrainedPhysicsModel` does: at least 3 alphas and 7 betas, all finite and
    /// non-negative; positive dimensions and peaks; `intermediate_size > 0`; attention and KV
    /// heads divisible by `tp`; consistent MoE fields.
    pub fn new(
        arch: &ModelArch,
        gpu: &GpuSpec,
        tp: u32,
        coeffs: PhysicsCoefficients,
    ) -> Result<PhysicsModel, LatencyError> {
        check_coefficients("physics alpha", &coeffs.alpha, 3)?;
        check_coefficients("physics beta", &coeffs.beta, 7)?;
        check_tp(tp)?;
        check_arch(arch)?;
        check_gpu_peaks(gpu)?;
        check_physics_shape(arch, tp)?;
        Ok(Self::build(arch, gpu, tp, &coeffs))
    }

    /// Folds the validated inputs into per-step constants.
    fn build(arch: &ModelArch, gpu: &GpuSpec, tp: u32, coeffs: &PhysicsCoefficients) -> Self {
        let mut beta = [0.0; BETA_SLOTS];
        for (slot, value) in beta.iter_mut().zip(&coeffs.beta) {
            *slot = *value;
        }
        if coeffs.beta.len() < BETA_SLOTS {
            beta[10] = beta[3]; // β_EP defaults to β4
        }
        let tp_u = tp;
        let tp = f64::from(tp);
        let layers = f64::from(arch.num_layers);
        let d = f64::from(arch.hidden_size);
        let head_dim_u = arch.hidden_size / arch.num_heads; // integer, as BLIS
        let head_dim = f64::from(head_dim_u);
        let d_kv = f64::from(arch.num_kv_heads) * head_dim;
        let d_ff = f64::from(arch.intermediate_size);
        let d_ff_moe = f64::from(arch.expert_intermediate_size());
        let d_ff_dense = nonzero_or(arch.dense_intermediate_size, d_ff);
        let d_ff_shared = f64::from(arch.shared_expert_intermediate_size);
        let (moe_layers_u, dense_layers_u) = arch.step_layer_split();
        let (moe_layers, dense_layers) = (f64::from(moe_layers_u), f64::from(dense_layers_u));
        let top_k = f64::from(arch.experts_per_tok.max(1));
        // Data parallelism is 1, so the flattened MoE group is the TP group.
        let moe_group = tp;

        let proj_per_token = layers * 2.0 * d * (2.0 * d + 2.0 * d_kv) / tp;
        let ffn_per_token = moe_layers * (top_k / moe_group) * 6.0 * d * d_ff_moe
            + moe_layers * 6.0 * d * d_ff_shared / tp
            + dense_layers * 6.0 * d * d_ff_dense / tp;

        let weight_bpp = arch.effective_weight_bytes_per_param();
        let bytes_per_us = gpu.bw_peak_tbs * 1e6;
        let experts_per_gpu = f64::from(arch.num_experts) / moe_group;
        let weight_bytes = layers * d * (2.0 * d + 2.0 * d_kv) * weight_bpp / tp
            + moe_layers * experts_per_gpu * 3.0 * d * d_ff_moe * weight_bpp
            + moe_layers * 3.0 * d * d_ff_shared * weight_bpp / tp
            + dense_layers * 3.0 * d * d_ff_dense * weight_bpp / tp;

        let allreduce_units = layers + dense_layers + if tp_u > 1 { moe_layers } else { 0.0 };
        let allreduce_us_per_token = if tp_u > 1 {
            allreduce_units * d * arch.bytes_per_param * 2.0 * (tp - 1.0) / tp / bytes_per_us
        } else {
            0.0
        };
        let interleaved = arch.is_moe() && arch.interleave_moe_layer_step > 0;

        PhysicsModel {
            alpha: coeffs.alpha,
            beta,
            prefill_split: coeffs.beta.len() >= 9,
            decode_split: coeffs.beta.len() >= 10,
            layers,
            flops_per_token: proj_per_token + ffn_per_token,
            attn_flops_per_token_ctx: layers * 4.0 * (f64::from(arch.num_heads) / tp) * head_dim,
            flops_per_us: gpu.tflops_for_weight_bytes(weight_bpp) * 1e6,
            kv_bytes_per_token: layers * 2.0 * (d_kv / tp) * KV_BYTES_PER_ELEMENT,
            bytes_per_us,
            weight_us: weight_bytes / bytes_per_us,
            allreduce_us_per_token,
            beta8_layers: if interleaved { moe_layers } else { 0.0 },
            offload_us: 0.0,
        }
    }

    /// The same model with `step_us` of offloaded weights read over the host link added to
    /// every step ([`super::offload`]).
    pub fn with_weight_offload(mut self, step_us: f64) -> Self {
        self.offload_us = step_us;
        self
    }

    /// Step time in whole microseconds (truncated, at least 1). One pass over `batch`, no
    /// allocation. A prefill's attention uses its full prompt length `prompt_tokens` as s_i
    /// (BLIS's `len(InputTokens)`), whatever chunk is being computed.
    pub fn step_us(&self, batch: &[BatchEntry]) -> u64 {
        if batch.is_empty() {
            return 1;
        }
        let mut prefill_tokens = 0.0;
        let mut prefill_attn_token_ctx = 0.0; // Σ t_i·(s_i + t_i/2)
        let mut decode_requests = 0.0;
        let mut decode_context = 0.0; // Σ ctx
        for entry in batch {
            if entry.is_prefill {
                let chunk = f64::from(entry.new_tokens);
                prefill_tokens += chunk;
                prefill_attn_token_ctx += chunk * (f64::from(entry.prompt_tokens) + chunk / 2.0);
            } else {
                decode_requests += 1.0;
                decode_context += f64::from(entry.context_tokens);
            }
        }
        let prefill_term = self.prefill_term(prefill_tokens, prefill_attn_token_ctx);
        let decode_term = self.decode_term(decode_requests, decode_context);
        let beta = &self.beta;
        let step = prefill_term
            + decode_term
            + beta[2] * self.weight_us
            + beta[3] * self.allreduce_us_per_token * (prefill_tokens + decode_requests)
            + beta[4] * self.layers
            + beta[5] * batch.len() as f64
            + beta[6]
            + beta[7] * self.beta8_layers
            + self.offload_us;
        us_trunc_from_f64(step).max(1)
    }

    /// β-weighted prefill compute and KV-write time (µs); 0 without prefill tokens.
    fn prefill_term(&self, tokens: f64, attn_token_ctx: f64) -> f64 {
        if tokens <= 0.0 {
            return 0.0;
        }
        let flops = tokens * self.flops_per_token + attn_token_ctx * self.attn_flops_per_token_ctx;
        let compute_us = flops / self.flops_per_us;
        let kv_us = tokens * self.kv_bytes_per_token / self.bytes_per_us;
        if self.prefill_split {
            self.beta[0] * compute_us + self.beta[8] * kv_us
        } else {
            self.beta[0] * compute_us.max(kv_us)
        }
    }

    /// β-weighted decode compute and KV read+write time (µs); 0 without decodes.
    fn decode_term(&self, requests: f64, context: f64) -> f64 {
        if requests <= 0.0 {
            return 0.0;
        }
        let flops = requests * self.flops_per_token + context * self.attn_flops_per_token_ctx;
        let compute_us = flops / self.flops_per_us;
        let kv_us = (context + requests) * self.kv_bytes_per_token / self.bytes_per_us;
        if self.decode_split {
            self.beta[1] * compute_us + self.beta[9] * kv_us
        } else {
            self.beta[1] * compute_us.max(kv_us)
        }
    }

    /// Queueing delay (µs): α0, whatever the input length.
    pub fn queueing_us(&self, _input_tokens: u32) -> u64 {
        us_trunc_from_f64(self.alpha[0])
    }

    /// Per-output-token overhead (µs): α2.
    pub fn output_token_us(&self) -> u64 {
        us_trunc_from_f64(self.alpha[2])
    }

    /// Fixed per-request overhead after the last token (µs): α1.
    pub fn post_decode_us(&self) -> u64 {
        us_trunc_from_f64(self.alpha[1])
    }
}

/// The physics-only shape rules: an FFN width, and heads that shard evenly over `tp`.
fn check_physics_shape(arch: &ModelArch, tp: u32) -> Result<(), LatencyError> {
    let invalid = |field: &'static str, problem: String| LatencyError::InvalidModel {
        model: arch.name.clone(),
        field,
        problem,
    };
    if arch.intermediate_size == 0 {
        return Err(invalid(
            "intermediate_size",
            "must be > 0, got 0".to_string(),
        ));
    }
    if !arch.num_heads.is_multiple_of(tp) {
        let problem = format!("({}) must be divisible by TP ({tp})", arch.num_heads);
        return Err(invalid("num_heads", problem));
    }
    if !arch.num_kv_heads.is_multiple_of(tp) {
        let problem = format!("({}) must be divisible by TP ({tp})", arch.num_kv_heads);
        return Err(invalid("num_kv_heads", problem));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::latency::arch::tests::{h100, llama_8b};

    /// BLIS's shipped iter29 coefficients (defaults.yaml `trained_physics_coefficients`).
    fn shipped() -> PhysicsCoefficients {
        PhysicsCoefficients {
            alpha: [15563.199579, 777.3455, 45.907545],
            beta: vec![
                0.152128,
                0.0,
                1.36252915,
                0.752037,
                32.09546717,
                4.41684444,
                126.024825,
                481.8613888,
                0.0,
                1.94710771,
                0.752037,
            ],
        }
    }

    fn decode(context_tokens: u32) -> BatchEntry {
        BatchEntry {
            context_tokens,
            new_tokens: 1,
            prompt_tokens: 200,
            is_prefill: false,
        }
    }

    #[test]
    fn single_decode_matches_hand_computation() {
        // Goal: one decode at context 1000 on llama-3.1-8b/H100/TP1. Method: evaluate the
        // 11-beta formula term by term (decode split: β2a·compute + β2b·kv; tp = 1 so no
        // all-reduce; dense so no β8).
        let (l, d, dkv, dff) = (32.0, 4096.0, 1024.0, 14336.0);
        let bw = 3.35e6; // bytes per µs
        let weight_us = (l * d * (2.0 * d + 2.0 * dkv) * 2.0 + l * 3.0 * d * dff * 2.0) / bw;
        let kv_us = l * 2.0 * dkv * 2.0 * (1000.0 + 1.0) / bw;
        let flops = l * 2.0 * d * (2.0 * d + 2.0 * dkv)
            + l * 4.0 * 32.0 * 1000.0 * 128.0
            + l * 6.0 * d * dff;
        let compute_us = flops / 989.5e6;
        let step = 0.0 * compute_us
            + 1.94710771 * kv_us
            + 1.36252915 * weight_us
            + 32.09546717 * l
            + 4.41684444
            + 126.024825;
        let model = PhysicsModel::new(&llama_8b(), &h100(), 1, shipped()).unwrap();
        assert_eq!(model.step_us(&[decode(1000)]), step as u64);
        assert_eq!(step as u64, 6911);
    }

    #[test]
    fn prefill_attention_uses_the_full_prompt_length() {
        // Goal: s_i is the whole prompt, not the cached prefix (BLIS HEAD). Method: two
        // chunks with the same prompt but different cached context cost the same.
        let model = PhysicsModel::new(&llama_8b(), &h100(), 1, shipped()).unwrap();
        let chunk = |context_tokens| BatchEntry {
            context_tokens,
            new_tokens: 512,
            prompt_tokens: 4096,
            is_prefill: true,
        };
        assert_eq!(model.step_us(&[chunk(0)]), model.step_us(&[chunk(2048)]));
        let longer = BatchEntry {
            prompt_tokens: 8192,
            ..chunk(0)
        };
        assert!(model.step_us(&[longer]) > model.step_us(&[chunk(0)]));
    }

    #[test]
    fn overheads_are_the_alphas() {
        let model = PhysicsModel::new(&llama_8b(), &h100(), 1, shipped()).unwrap();
        assert_eq!(model.queueing_us(10), 15563);
        assert_eq!(model.queueing_us(10_000), 15563);
        assert_eq!(model.post_decode_us(), 777);
        assert_eq!(model.output_token_us(), 45);
        assert_eq!(model.step_us(&[]), 1);
    }

    #[test]
    fn tensor_parallel_adds_allreduce() {
        // At tp = 2 the all-reduce term is (2L)·tokens·d·2·2·(1/2)/bw for a dense model.
        let model = PhysicsModel::new(&llama_8b(), &h100(), 2, shipped()).unwrap();
        let expected = 64.0 * 4096.0 * 2.0 * 2.0 * 0.5 / 3.35e6;
        assert!((model.allreduce_us_per_token - expected).abs() < 1e-12);
        let single = PhysicsModel::new(&llama_8b(), &h100(), 1, shipped()).unwrap();
        assert_eq!(single.allreduce_us_per_token, 0.0);
    }

    #[test]
    fn short_beta_lists_follow_blis_modes() {
        // 7 betas: no split, β8 = 0, β_EP = β4.
        let coeffs = PhysicsCoefficients {
            alpha: [0.0; 3],
            beta: vec![1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0],
        };
        let model = PhysicsModel::new(&llama_8b(), &h100(), 1, coeffs).unwrap();
        assert!(!model.prefill_split && !model.decode_split);
        assert_eq!(model.beta[7], 0.0);
        assert_eq!(model.beta[10], 0.5);
    }

    #[test]
    fn interleaved_moe_pays_beta8_per_moe_layer() {
        let mut arch = llama_8b();
        arch.num_layers = 48;
        arch.num_experts = 16;
        arch.experts_per_tok = 1;
        arch.interleave_moe_layer_step = 1;
        let model = PhysicsModel::new(&arch, &h100(), 1, shipped()).unwrap();
        assert_eq!(model.beta8_layers, 24.0);
        arch.interleave_moe_layer_step = 0;
        let uniform = PhysicsModel::new(&arch, &h100(), 1, shipped()).unwrap();
        assert_eq!(uniform.beta8_layers, 0.0);
    }

    #[test]
    fn validation_names_the_problem() {
        let mut coeffs = shipped();
        coeffs.beta.truncate(6);
        let err = PhysicsModel::new(&llama_8b(), &h100(), 1, coeffs).unwrap_err();
        assert!(err.to_string().contains("at least 7"), "{err}");
        let err = PhysicsModel::new(&llama_8b(), &h100(), 3, shipped()).unwrap_err();
        assert!(err.to_string().contains("num_heads"), "{err}");
        let mut arch = llama_8b();
        arch.intermediate_size = 0;
        let err = PhysicsModel::new(&arch, &h100(), 1, shipped()).unwrap_err();
        assert!(err.to_string().contains("intermediate_size"), "{err}");
    }
}
