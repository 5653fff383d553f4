//! ditto's calibrated step-time model: roofline basis terms from the model's architecture and
//! the GPU's peaks, weighted by a few learned, hardware-generic coefficients.
//!
//! Per step, with T = P prefill tokens + D decodes scheduled, B sequences, on one GPU
//! (tensor-parallel shard):
//!
//! - weights `t_w = (dense bytes + MoE layers · E(T) · expert bytes) / bw`, where the dense
//!   bytes are the attention projections, dense FFNs, shared experts and the LM head, and
//!   `E(T) = N·(1 − (1 − k/N)^T)` is the expected number of distinct routed experts T tokens
//!   touch (top-k of N): a MoE step reads only the experts its tokens use;
//! - linear FLOPs `t_f = T · 2 · (active params per token) / peak`, split into dense and
//!   routed-expert parameters;
//! - attention FLOPs `t_a = (Σ_prefill chunk·(ctx + chunk/2) + Σ_decode ctx) · 4·L·(H/tp)·dh / peak`;
//! - KV traffic `t_kv = (Σ context read + T written) · KV bytes per token / bw`;
//! - all-reduce traffic `t_ar = 2L · T · hidden · activation bytes · 2(tp − 1)/tp / link`:
//!   two ring all-reduces per layer over the step's activations, on the GPU table's
//!   per-direction interconnect bandwidth (NVLink, or PCIe where a GPU has none), so the
//!   term grows with the TP degree and the batch and shrinks with a faster link (0 at tp = 1);
//!
//! The step is `c_step + c_seq·B + c_layer·L + c_allreduce·n_ar + c_link·t_ar +
//! max(c_w·t_w, c_f·t_f) + c_kv·t_kv + c_attn·t_a`, where `c_f·t_f` is `c_flops·t_f,dense + c_moe_flops·t_f,experts` (routed
//! experts run as grouped GEMMs with few tokens per expert, far below dense GEMMs' tensor-core
//! efficiency), and `n_ar = 2L` all-reduces at tp > 1 (0 at tp = 1). The GEMMs are a
//! roofline (weights stream while the tensor cores work), the rest adds up. The coefficients
//! are efficiencies (≥ 1 means slower than peak) and CPU/launch overheads in µs, the same for
//! every model and GPU: that is what lets a fit on a few runs carry to others.
//!
//! Overheads outside the engine step, on the client's clock (inference-perf measures TTFT
//! and E2E at the client): `queue_us + queue_us_per_token · prompt` before the request
//! reaches the scheduler (HTTP, tokenization); `first_token_us_per_seq · B` before the
//! client sees the first token of a step of B sequences (vLLM's API server detokenizes and
//! streams every running sequence's token in one event loop, so a new stream's first chunk
//! waits behind the others; later tokens inherit the delay); `first_token_steps` decode
//! steps of B sequences more before the client sees that first token (the measured runs'
//! clients see a request's first token one engine step after the step that sampled it: the
//! low-load TTFT of every model is the front end, the prefill, the wait for the step in
//! flight and one decode step of that model, see docs/fidelity.md; the step is priced
//! without its KV reads, whose context the delay does not know); `output_token_us` per
//! streamed token and `post_decode_us` after the last one.
//!
//! Sums are kept in integers until the end so pricing a batch entry by entry and pricing
//! "batch + n decodes with total context c" ([`CalibratedModel::step_with_decodes_us`]) give
//! the same microsecond.

use super::roofline::activated_expert_fraction;
use super::validate::{check_arch, check_gpu_peaks, check_tp};
use super::{
    BatchEntry, GpuSpec, LatencyError, ModelArch, check_coefficients, nonzero_or, us_trunc_from_f64,
};

/// Number of coefficients.
pub const COEFFICIENTS: usize = 16;

/// The coefficients' names, in [`CalibratedCoefficients::values`] order (the coefficients
/// file uses them as keys).
pub const COEFFICIENT_NAMES: [&str; COEFFICIENTS] = [
    "queue_us",
    "queue_us_per_token",
    "output_token_us",
    "post_decode_us",
    "step_us",
    "seq_us",
    "layer_us",
    "allreduce_us",
    "weights",
    "flops",
    "attention",
    "kv",
    "first_token_us_per_seq",
    "moe_flops",
    "allreduce_link",
    "first_token_steps",
];

/// Coefficients a file may omit (added after files were written), with the value that keeps
/// such a file's predictions what they were.
pub const OPTIONAL_COEFFICIENTS: [(&str, f64); 2] =
    [("allreduce_link", 0.0), ("first_token_steps", 0.0)];

/// Index of each coefficient in [`CalibratedCoefficients::values`].
#[allow(missing_docs)]
pub mod idx {
    pub const QUEUE_US: usize = 0;
    pub const QUEUE_US_PER_TOKEN: usize = 1;
    pub const OUTPUT_TOKEN_US: usize = 2;
    pub const POST_DECODE_US: usize = 3;
    pub const STEP_US: usize = 4;
    pub const SEQ_US: usize = 5;
    pub const LAYER_US: usize = 6;
    pub const ALLREDUCE_US: usize = 7;
    pub const WEIGHTS: usize = 8;
    pub const FLOPS: usize = 9;
    pub const ATTENTION: usize = 10;
    pub const KV: usize = 11;
    pub const FIRST_TOKEN_US_PER_SEQ: usize = 12;
    pub const MOE_FLOPS: usize = 13;
    pub const ALLREDUCE_LINK: usize = 14;
    pub const FIRST_TOKEN_STEPS: usize = 15;
}

/// The calibrated model's coefficients (all finite and ≥ 0).
#[derive(Clone, Debug, PartialEq)]
pub struct CalibratedCoefficients {
    /// Values in [`COEFFICIENT_NAMES`] order.
    pub values: [f64; COEFFICIENTS],
}

impl CalibratedCoefficients {
    /// Pure roofline: efficiencies 1, no overheads.
    pub const ROOFLINE: CalibratedCoefficients = CalibratedCoefficients {
        values: [
            0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0,
        ],
    };

    /// The value named `name`, if it is one.
    pub fn get(&self, name: &str) -> Option<f64> {
        COEFFICIENT_NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| self.values[i])
    }
}

/// The calibrated model with its per-model constants folded in.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibratedModel {
    c: [f64; COEFFICIENTS],
    /// Transformer layers.
    layers: f64,
    /// All-reduces per step (2L at tp > 1).
    allreduces: f64,
    /// Bytes read per step whatever the batch (µs at peak bandwidth).
    dense_weight_us: f64,
    /// One routed expert of one MoE layer (µs at peak bandwidth); 0 for dense models.
    expert_weight_us: f64,
    /// MoE layers.
    moe_layers: f64,
    /// Routed experts and experts per token (MoE only).
    experts: u32,
    top_k: u32,
    /// Dense linear-layer FLOP time per token (µs at peak).
    flop_us_per_token: f64,
    /// Routed-expert FLOP time per token (µs at peak); 0 for dense models.
    expert_flop_us_per_token: f64,
    /// Attention FLOP time per (query token × context token) (µs at peak).
    attn_us_per_token_ctx: f64,
    /// KV read/write time per token (µs at peak bandwidth).
    kv_us_per_token: f64,
    /// All-reduce link time per token of a step, all layers (µs at the link's peak); 0 at
    /// tp = 1 or on a GPU with no known link.
    allreduce_us_per_token: f64,
}

/// What makes up the TTFT of one request on an idle server, as the calibrated model prices
/// it (µs; the parts add up to the TTFT the engine simulates). Each part is its own term, so
/// a fit moves them apart: the front end is host time the GPU does not change, the prefill
/// is GPU work that scales with the model, the GPU and the TP degree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnloadedTtft {
    /// Before the scheduler sees the request: HTTP, tokenisation, the API server's hand-off
    /// to the engine core (`queue_us + queue_us_per_token·prompt`).
    pub front_end_us: u64,
    /// The steps' fixed host and launch part, per prefill chunk: the scheduler, input
    /// preparation, sampling, kernel launches, the fixed latency of the all-reduces
    /// (`step_us + seq_us + layer_us·L + allreduce_us·2L`).
    pub scheduler_us: u64,
    /// The prefill chunks' GPU work: weights or GEMM FLOPs, attention, KV writes, all-reduce
    /// bytes over the link (the rest of each chunk's step).
    pub prefill_us: u64,
    /// The first sampled token's way to the client: detokenisation, the API server's
    /// streaming path, and the decode step after the prefill, which the client waits for
    /// before it sees the first token (`first_token_us_per_seq·1 + first_token_steps·(one
    /// decode step of one sequence) + output_token_us`).
    pub first_token_us: u64,
}

impl UnloadedTtft {
    /// The whole TTFT.
    pub fn total_us(&self) -> u64 {
        self.front_end_us + self.scheduler_us + self.prefill_us + self.first_token_us
    }
}

/// A batch reduced to the integer sums the formula needs.
#[derive(Clone, Copy, Debug, Default)]
struct Shape {
    sequences: u64,
    tokens: u64,
    /// 2·Σ attention (query × context) pairs: chunk·(2·ctx + chunk) for prefills, 2·ctx for
    /// decodes (kept doubled so it stays an integer).
    attn_pairs_x2: u64,
    /// Σ context read plus tokens written.
    kv_tokens: u64,
}

impl CalibratedModel {
    /// Builds the model for `arch` on `gpu` at tensor parallelism `tp`.
    pub fn new(
        arch: &ModelArch,
        gpu: &GpuSpec,
        tp: u32,
        coefficients: &CalibratedCoefficients,
    ) -> Result<CalibratedModel, LatencyError> {
        check_coefficients("calibrated", &coefficients.values, COEFFICIENTS)?;
        check_tp(tp)?;
        check_arch(arch)?;
        check_gpu_peaks(gpu)?;
        Ok(Self::build(arch, gpu, tp, coefficients))
    }

    fn build(
        arch: &ModelArch,
        gpu: &GpuSpec,
        tp_u: u32,
        coefficients: &CalibratedCoefficients,
    ) -> Self {
        let tp = f64::from(tp_u);
        let layers = f64::from(arch.num_layers);
        let d = f64::from(arch.hidden_size);
        let heads = f64::from(arch.num_heads);
        let head_dim = f64::from(arch.effective_head_dim());
        let d_q = heads * head_dim;
        let d_kv = f64::from(arch.num_kv_heads) * head_dim;
        let d_ff = f64::from(arch.intermediate_size);
        let d_ff_moe = nonzero_or(arch.moe_intermediate_size, d_ff);
        let d_ff_dense = nonzero_or(arch.dense_intermediate_size, d_ff);
        let d_ff_shared = f64::from(arch.shared_expert_intermediate_size);
        let (moe_u, dense_u) = arch.step_layer_split();
        let (moe_layers, dense_layers) = (f64::from(moe_u), f64::from(dense_u));
        let top_k = f64::from(arch.experts_per_tok.max(1));
        let wb = arch.effective_weight_bytes_per_param();
        let bytes_per_us = gpu.bw_peak_tbs * 1e6;
        let flops_per_us = gpu.tflops_for_weight_bytes(wb) * 1e6;

        // Parameters per GPU: attention projections (q, k, v, o), FFNs, LM head.
        let attn_params = layers * d * (2.0 * d_q + 2.0 * d_kv) / tp;
        let dense_ffn_params = dense_layers * 3.0 * d * d_ff_dense / tp;
        let shared_params = moe_layers * 3.0 * d * d_ff_shared / tp;
        let head_params = f64::from(arch.vocab_size) * d / tp;
        let expert_params = 3.0 * d * d_ff_moe / tp;
        let dense_bytes = (attn_params + dense_ffn_params + shared_params + head_params) * wb;
        let dense_params_per_token = attn_params + dense_ffn_params + shared_params;
        let expert_params_per_token = if arch.is_moe() {
            moe_layers * top_k * expert_params
        } else {
            0.0
        };
        // Ring all-reduce: each GPU sends and receives 2(tp − 1)/tp of the activations.
        let link_bytes_per_us = gpu.interconnect_gbs * 1e3;
        let allreduce_us_per_token = if tp_u > 1 && link_bytes_per_us > 0.0 {
            2.0 * layers * d * arch.bytes_per_param * 2.0 * (tp - 1.0) / tp / link_bytes_per_us
        } else {
            0.0
        };
        CalibratedModel {
            c: coefficients.values,
            allreduce_us_per_token,
            layers,
            allreduces: if tp_u > 1 { 2.0 * layers } else { 0.0 },
            dense_weight_us: dense_bytes / bytes_per_us,
            expert_weight_us: if arch.is_moe() {
                expert_params * wb / bytes_per_us
            } else {
                0.0
            },
            moe_layers: if arch.is_moe() { moe_layers } else { 0.0 },
            experts: arch.num_experts,
            top_k: arch.experts_per_tok.max(1),
            flop_us_per_token: 2.0 * dense_params_per_token / flops_per_us,
            expert_flop_us_per_token: 2.0 * expert_params_per_token / flops_per_us,
            attn_us_per_token_ctx: 4.0 * layers * (heads / tp) * head_dim / flops_per_us,
            kv_us_per_token: arch.kv_bytes_per_token(tp_u) / bytes_per_us,
        }
    }

    /// The batch's integer sums.
    fn shape(batch: &[BatchEntry]) -> Shape {
        let mut shape = Shape::default();
        for entry in batch {
            let ctx = u64::from(entry.context_tokens);
            let new = u64::from(entry.new_tokens);
            shape.sequences += 1;
            shape.tokens += new;
            shape.attn_pairs_x2 += new * (2 * ctx + new);
            shape.kv_tokens += ctx + new;
        }
        shape
    }

    /// Step time in whole microseconds (truncated, at least 1).
    pub fn step_us(&self, batch: &[BatchEntry]) -> u64 {
        if batch.is_empty() {
            return 1;
        }
        self.price(Self::shape(batch))
    }

    /// Step time of `batch` plus `decodes` decodes with `context` tokens of context in
    /// total; equals [`CalibratedModel::step_us`] of the batch with those entries added.
    pub fn step_with_decodes_us(&self, batch: &[BatchEntry], decodes: u64, context: u64) -> u64 {
        let mut shape = Self::shape(batch);
        shape.sequences += decodes;
        shape.tokens += decodes;
        // A decode's query meets its context plus itself: 1·(2·ctx + 1).
        shape.attn_pairs_x2 += 2 * context + decodes;
        shape.kv_tokens += context + decodes;
        if shape.sequences == 0 {
            return 1;
        }
        self.price(shape)
    }

    /// The formula over a batch's sums.
    fn price(&self, shape: Shape) -> u64 {
        use idx::*;
        let c = &self.c;
        let tokens = shape.tokens as f64;
        let experts_touched = if self.moe_layers > 0.0 {
            f64::from(self.experts) * activated_expert_fraction(self.experts, self.top_k, tokens)
        } else {
            0.0
        };
        let weights_us =
            self.dense_weight_us + self.moe_layers * experts_touched * self.expert_weight_us;
        let flops_us = tokens
            * (c[FLOPS] * self.flop_us_per_token + c[MOE_FLOPS] * self.expert_flop_us_per_token);
        let attn_us = shape.attn_pairs_x2 as f64 / 2.0 * self.attn_us_per_token_ctx;
        let kv_us = shape.kv_tokens as f64 * self.kv_us_per_token;
        let step = c[STEP_US]
            + c[SEQ_US] * shape.sequences as f64
            + c[LAYER_US] * self.layers
            + c[ALLREDUCE_US] * self.allreduces
            + c[ALLREDUCE_LINK] * tokens * self.allreduce_us_per_token
            + (c[WEIGHTS] * weights_us).max(flops_us)
            + c[ATTENTION] * attn_us
            + c[KV] * kv_us;
        us_trunc_from_f64(step).max(1)
    }

    /// The parts of the TTFT of one `prompt_tokens` request on an idle server whose steps
    /// take at most `chunk_tokens` tokens (`max_num_batched_tokens`; chunked prefill), with
    /// nothing cached: see [`UnloadedTtft`].
    pub fn unloaded_ttft(&self, prompt_tokens: u32, chunk_tokens: u32) -> UnloadedTtft {
        use idx::*;
        let c = &self.c;
        let chunk_tokens = chunk_tokens.max(1);
        let fixed = c[STEP_US] + c[SEQ_US] + c[LAYER_US] * self.layers;
        let fixed = fixed + c[ALLREDUCE_US] * self.allreduces;
        let (mut scheduler_us, mut steps_us, mut done) = (0u64, 0u64, 0u32);
        while done < prompt_tokens.max(1) {
            let new = chunk_tokens.min(prompt_tokens.max(1) - done);
            let step = self.step_us(&[BatchEntry {
                context_tokens: done,
                new_tokens: new,
                prompt_tokens,
                is_prefill: true,
            }]);
            steps_us += step;
            scheduler_us += us_trunc_from_f64(fixed).min(step);
            done += new;
        }
        UnloadedTtft {
            front_end_us: self.queueing_us(prompt_tokens),
            scheduler_us,
            prefill_us: steps_us - scheduler_us,
            first_token_us: self.first_token_delay_us(1) + self.output_token_us(),
        }
    }

    /// Delay before the scheduler sees a request of `input_tokens` prompt tokens.
    pub fn queueing_us(&self, input_tokens: u32) -> u64 {
        let c = &self.c;
        us_trunc_from_f64(c[idx::QUEUE_US] + c[idx::QUEUE_US_PER_TOKEN] * f64::from(input_tokens))
    }

    /// Time added to each streamed token.
    pub fn output_token_us(&self) -> u64 {
        us_trunc_from_f64(self.c[idx::OUTPUT_TOKEN_US])
    }

    /// Delay of a first token made by a step of `batch` sequences (see the module doc).
    pub fn first_token_delay_us(&self, batch: u64) -> u64 {
        let per_seq = self.c[idx::FIRST_TOKEN_US_PER_SEQ] * batch as f64;
        let steps = self.c[idx::FIRST_TOKEN_STEPS];
        let next_step = if steps > 0.0 {
            steps * self.decode_step_us(batch.max(1)) as f64
        } else {
            0.0
        };
        us_trunc_from_f64(per_seq + next_step)
    }

    /// A decode step of `batch` sequences, their KV reads not counted (the delay knows the
    /// batch, not its context): the step after a first token, which the client waits for
    /// before it sees that token (see the module doc).
    fn decode_step_us(&self, batch: u64) -> u64 {
        self.price(Shape {
            sequences: batch,
            tokens: batch,
            attn_pairs_x2: batch,
            kv_tokens: batch,
        })
    }

    /// Time after the last token.
    pub fn post_decode_us(&self) -> u64 {
        us_trunc_from_f64(self.c[idx::POST_DECODE_US])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::latency::arch::tests::{h100, llama_8b};

    fn entry(context_tokens: u32, new_tokens: u32, is_prefill: bool) -> BatchEntry {
        BatchEntry {
            context_tokens,
            new_tokens,
            prompt_tokens: context_tokens + new_tokens,
            is_prefill,
        }
    }

    #[test]
    fn roofline_decode_is_weight_read_time() {
        // Goal: with pure roofline coefficients one decode costs the weights plus its KV.
        // Method: hand-compute llama-3.1-8b on H100 (bf16): 8.03e9 params ≈ 16.06 GB.
        let model =
            CalibratedModel::new(&llama_8b(), &h100(), 1, &CalibratedCoefficients::ROOFLINE)
                .unwrap();
        let (l, d, dkv, dff, vocab) = (32.0, 4096.0, 1024.0, 14336.0, 128256.0);
        let params = l * d * (2.0 * d + 2.0 * dkv) + l * 3.0 * d * dff + vocab * d;
        let weights_us = params * 2.0 / 3.35e6;
        let kv_us = 1001.0 * l * 2.0 * dkv * 2.0 / 3.35e6;
        let attn_us = 1000.5 * 4.0 * l * 32.0 * 128.0 / 989.5e6;
        let expected = (weights_us + kv_us + attn_us) as u64;
        let got = model.step_us(&[entry(1000, 1, false)]);
        assert!(
            got.abs_diff(expected) <= 1,
            "got {got}, expected {expected}"
        );
    }

    #[test]
    fn decodes_priced_in_aggregate_equal_entry_by_entry() {
        let mut coefficients = CalibratedCoefficients::ROOFLINE;
        coefficients.values[idx::SEQ_US] = 3.3;
        coefficients.values[idx::STEP_US] = 100.0;
        let model = CalibratedModel::new(&llama_8b(), &h100(), 2, &coefficients).unwrap();
        let prefill = [entry(32, 700, true)];
        let decodes: Vec<BatchEntry> = (0..37).map(|i| entry(500 + i * 13, 1, false)).collect();
        let context: u64 = decodes.iter().map(|e| u64::from(e.context_tokens)).sum();
        let mut all = prefill.to_vec();
        all.extend(&decodes);
        assert_eq!(
            model.step_us(&all),
            model.step_with_decodes_us(&prefill, 37, context)
        );
        assert_eq!(model.step_with_decodes_us(&[], 0, 0), 1);
    }

    #[test]
    fn moe_reads_only_the_experts_its_tokens_touch() {
        let mut arch = llama_8b();
        arch.num_experts = 8;
        arch.experts_per_tok = 2;
        let model =
            CalibratedModel::new(&arch, &h100(), 1, &CalibratedCoefficients::ROOFLINE).unwrap();
        let one = model.step_us(&[entry(100, 1, false)]);
        let many: Vec<BatchEntry> = (0..64).map(|_| entry(100, 1, false)).collect();
        let batch = model.step_us(&many);
        // One token reads 2 of 8 experts; 64 tokens read nearly all 8: about 4x the expert bytes.
        assert!(batch > 2 * one, "one {one} batch {batch}");
    }

    #[test]
    fn allreduce_link_term_grows_with_tp_and_tokens_and_shrinks_with_the_link() {
        // Goal: the all-reduce bytes term is physics: 2L ring all-reduces of T·hidden
        // activations, 2(tp-1)/tp of them over the link each way.
        // Method: only the link coefficient on; hand-compute llama-3.1-8b at tp 2 and 4.
        let mut coefficients = CalibratedCoefficients::ROOFLINE;
        for (i, value) in coefficients.values.iter_mut().enumerate() {
            *value = if i == idx::ALLREDUCE_LINK { 1.0 } else { 0.0 };
        }
        let price = |gpu: &GpuSpec, tp: u32, tokens: u32| {
            let model = CalibratedModel::new(&llama_8b(), gpu, tp, &coefficients).unwrap();
            let batch: Vec<BatchEntry> = (0..tokens).map(|_| entry(100, 1, false)).collect();
            model.step_us(&batch)
        };
        let nvlink = h100();
        // 64 tokens · 2·32 layers · 4096 · 2 bytes · 2·(1/2) / 450 GB/s = 74.6 µs.
        assert_eq!(price(&nvlink, 2, 64), 74);
        assert_eq!(price(&nvlink, 4, 64), 111); // 2·(3/4): 1.5×
        assert_eq!(price(&nvlink, 2, 128), 149);
        assert_eq!(price(&nvlink, 1, 64), 1); // no all-reduce at tp 1
        let pcie = GpuSpec {
            interconnect_gbs: 32.0,
            ..h100()
        };
        assert!(price(&pcie, 2, 64) > 10 * price(&nvlink, 2, 64));
        let unknown = GpuSpec {
            interconnect_gbs: 0.0,
            ..h100()
        };
        assert_eq!(price(&unknown, 2, 64), 1);
    }

    #[test]
    fn unloaded_ttft_parts_add_up_and_separate_host_from_gpu() {
        // Goal: the TTFT's parts are explicit: the front end and the steps' host part do
        // not change with the GPU, the prefill does. Method: coefficients close to the
        // shipped ones (the engine does not read the catalog) on llama-3.1-8b, H100 against
        // a GPU with a third of its FLOPs and bandwidth.
        let mut coefficients = CalibratedCoefficients::ROOFLINE;
        for (i, value) in [
            (idx::QUEUE_US, 20_000.0),
            (idx::POST_DECODE_US, 1_600.0),
            (idx::STEP_US, 545.0),
            (idx::SEQ_US, 4.0),
            (idx::LAYER_US, 17.7),
            (idx::ALLREDUCE_US, 0.56),
            (idx::WEIGHTS, 1.26),
            (idx::FLOPS, 0.75),
            (idx::KV, 1.08),
            (idx::FIRST_TOKEN_US_PER_SEQ, 7.7),
            (idx::MOE_FLOPS, 2.4),
        ] {
            coefficients.values[i] = value;
        }
        let fast = CalibratedModel::new(&llama_8b(), &h100(), 1, &coefficients).unwrap();
        let slow_gpu = GpuSpec {
            tflops_peak: h100().tflops_peak / 3.0,
            bw_peak_tbs: h100().bw_peak_tbs / 3.0,
            ..h100()
        };
        let slow = CalibratedModel::new(&llama_8b(), &slow_gpu, 1, &coefficients).unwrap();
        let (a, b) = (fast.unloaded_ttft(600, 2048), slow.unloaded_ttft(600, 2048));
        assert_eq!(a.front_end_us, fast.queueing_us(600));
        assert_eq!(
            a.scheduler_us + a.prefill_us,
            fast.step_us(&[entry(0, 600, true)])
        );
        assert_eq!(
            (a.front_end_us, a.scheduler_us),
            (b.front_end_us, b.scheduler_us)
        );
        assert_eq!(a.first_token_us, b.first_token_us);
        assert!(b.prefill_us >= 3 * a.prefill_us - 3, "{a:?} {b:?}");
        assert_eq!(
            a.total_us(),
            a.front_end_us + a.scheduler_us + a.prefill_us + a.first_token_us
        );
        // Chunked: two steps of 2048 and 952 tokens, each with its fixed part.
        let chunked = fast.unloaded_ttft(3000, 2048);
        assert_eq!(chunked.scheduler_us, 2 * a.scheduler_us);
        assert_eq!(
            chunked.scheduler_us + chunked.prefill_us,
            fast.step_us(&[entry(0, 2048, true)]) + fast.step_us(&[entry(2048, 952, true)])
        );
    }

    #[test]
    fn first_token_waits_one_decode_step_of_the_batch() {
        // Goal: `first_token_steps` delays a first token by that many decode steps of the
        // batch that made it (weights, host costs, no KV), on top of the per-sequence delay;
        // 0 (a file without it) leaves the delay as it was.
        let mut coefficients = CalibratedCoefficients::ROOFLINE;
        coefficients.values[idx::STEP_US] = 500.0;
        coefficients.values[idx::SEQ_US] = 4.0;
        coefficients.values[idx::FIRST_TOKEN_US_PER_SEQ] = 10.0;
        let off = CalibratedModel::new(&llama_8b(), &h100(), 1, &coefficients).unwrap();
        assert_eq!(off.first_token_delay_us(8), 80);
        coefficients.values[idx::FIRST_TOKEN_STEPS] = 1.0;
        let on = CalibratedModel::new(&llama_8b(), &h100(), 1, &coefficients).unwrap();
        for batch in [1u64, 8, 64] {
            let decodes: Vec<BatchEntry> = (0..batch).map(|_| entry(0, 1, false)).collect();
            let step = on.step_us(&decodes);
            let got = on.first_token_delay_us(batch);
            assert!(
                got.abs_diff(10 * batch + step) <= 1,
                "batch {batch}: {got} vs {step}"
            );
        }
        // About one weight read of llama-3.1-8b (15 GB at 3.35 TB/s: 4.5 ms) plus the host.
        let one = on.first_token_delay_us(1);
        assert!((4_900..5_100).contains(&one), "{one}");
        let parts = on.unloaded_ttft(600, 2048);
        assert_eq!(parts.first_token_us, on.first_token_delay_us(1));
    }

    #[test]
    fn rejects_bad_coefficients() {
        let mut coefficients = CalibratedCoefficients::ROOFLINE;
        coefficients.values[3] = f64::NAN;
        let err = CalibratedModel::new(&llama_8b(), &h100(), 1, &coefficients).unwrap_err();
        assert!(err.to_string().contains("calibrated[3]"), "{err}");
    }
}
