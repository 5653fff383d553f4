//! ditto's calibrated step-time model: roofline basis terms from the model's architecture and
//! the GPU's peaks, weighted by a few learned, hardware-generic coefficients.
//!
//! Per step, with T = P prefill tokens + D decodes scheduled, B sequences, on one GPU
//! (tensor-parallel shard):
//!
//! - weights `t_w = (dense bytes + MoE layers · E(T) · expert bytes) · f_w / bw` (`f_w` the
//!   GPU's `weight_read_factor`, 1 on Hopper), where the dense bytes are the attention
//!   projections, dense FFNs, shared experts and the LM head, and
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
//! - LM head FLOPs `t_h = B · 2·vocab·hidden/tp / peak`: logits are computed for each
//!   scheduled sequence's last position only, so the head is a per-sequence GEMM (added to
//!   the dense FLOPs);
//! - sampler `t_s = B · vocab · 4 bytes / bw`: one pass over a sequence's fp32 logits (vLLM's
//!   sampler converts the logits to fp32, applies temperature, and for top-p / top-k, which
//!   the models' `generation_config.json` sets and vLLM applies by default, sorts the whole
//!   vocabulary: `vllm/v1/sample/ops/topk_topp_sampler.py`), priced `c_sampler` passes;
//! - host work per scheduled token `c_token·T` (input ids, positions, slot mapping);
//!
//! The step is `c_sampler·t_s + c_token·T + c_step + c_seq·B + c_layer·L + c_allreduce·n_ar + c_peer·n_ar·(tp − 1) + c_link·t_ar +
//! max(c_w·t_w, c_f·t_f) + c_kv·t_kv + c_attn·t_a`, where `c_f·t_f` is `c_flops·t_f,dense + c_moe_flops·t_f,experts` (routed
//! experts run as grouped GEMMs with few tokens per expert, far below dense GEMMs' tensor-core
//! efficiency), and `n_ar = 2L` all-reduces at tp > 1 (0 at tp = 1); `c_peer` is each
//! all-reduce's latency per peer it synchronises with (vLLM's custom all-reduce for small
//! decode messages waits on a flag from every peer; 0 in the shipped coefficients, see
//! docs/fidelity.md, "The TP 4 step"); with `allreduce_base_peers` = b it prices only the
//! peers beyond the first b (`(tp − 1 − b)`, at least 0: the first peers' latency is then
//! in `c_allreduce`, which the TP 2 runs fit), and the first token's decode step (below)
//! pays `first_token_peer_share` of it (1 in a file without the key). The GEMMs are a
//! roofline (weights stream while the tensor cores work), the rest adds up. The weights'
//! time is `t_w` with the routed experts' bytes times `c_moe_weights` (their grouped GEMM
//! kernels' bandwidth efficiency relative to the dense GEMMs'), all of it times
//! `c_fp8_weights` for 1-byte weights (FP8 checkpoints: the FP8 GEMM and MoE kernels'
//! efficiency relative to the 16-bit ones; 1 for 16-bit weights), and at most
//! `allreduce_peer_cap` peers beyond the base pay the per-peer latency (vLLM's one-shot
//! custom all-reduce reads every peer's buffer at once over NVSwitch, so its latency stops
//! growing with the peers; 0 = no cap). With `allreduce_measured` > 0, on a GPU and TP
//! degree the measured table has (`data/allreduce_latency.tsv`, [`super::allreduce`]), each
//! of the `n_ar` all-reduces costs `allreduce_measured` × the measured time of its message
//! (T · hidden · activation bytes) instead, in place of `c_allreduce`, `c_peer` and `c_link`
//! (1.116 in the shipped coefficients, where the table has H100 TP 4 only: docs/fidelity.md,
//! "The measured all-reduce"). The coefficients
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
//! flight and one decode step of that model, see docs/fidelity.md; the step is priced with
//! the KV reads of the batch's context, as the engine hands it); `output_token_us` per
//! streamed token and `post_decode_us` after the last one.
//!
//! Per step, on the host: `waiting_us · min(W, waiting_cap)` for the W requests left waiting
//! in the scheduler's queue ([`CalibratedModel::waiting_us`]; the engine adds it to every
//! step). Both are 0 in the shipped coefficients: the measured overloaded runs' steps grow
//! with the queue, but a fitted term does not carry across models (docs/fidelity.md, "The
//! knee of the overloaded runs").
//!
//! Sums are kept in integers until the end so pricing a batch entry by entry and pricing
//! "batch + n decodes with total context c" ([`CalibratedModel::step_with_decodes_us`]) give
//! the same microsecond.

use super::allreduce::{AllreduceCurve, measured_curve};
use super::roofline::activated_expert_fraction;
use super::validate::{check_arch, check_gpu_peaks, check_tp};
use super::{
    BatchEntry, GpuSpec, LatencyError, ModelArch, check_coefficients, nonzero_or, us_trunc_from_f64,
};

mod coefficients;
mod unloaded_ttft;

pub use unloaded_ttft::UnloadedTtft;

pub use coefficients::{
    COEFFICIENT_NAMES, COEFFICIENTS, CalibratedCoefficients, OPTIONAL_COEFFICIENTS, idx,
};

/// The calibrated model with its per-model constants folded in.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibratedModel {
    c: [f64; COEFFICIENTS],
    /// Transformer layers.
    layers: f64,
    /// All-reduces per step (2L at tp > 1).
    allreduces: f64,
    /// The all-reduce peer latency an engine step pays: `allreduce_peer_us` for each of the
    /// step's 2L·(tp − 1 − base) peer hand-offs (each all-reduce waits on every peer; the
    /// first `allreduce_base_peers` of them are in `allreduce_us`), never below 0 hand-offs.
    step_peer_us: f64,
    /// What the first token's decode step pays of it (`first_token_peer_share` of it).
    first_token_peer_us: f64,
    /// Bytes read per step whatever the batch (µs at peak bandwidth).
    dense_weight_us: f64,
    /// One routed expert of one MoE layer (µs at peak bandwidth); 0 for dense models. Under
    /// expert parallelism over `expert_groups` data-parallel ranks, divided by them.
    expert_weight_us: f64,
    /// Data-parallel ranks whose tokens every GPU's routed experts serve (expert
    /// parallelism, [`CalibratedModel::with_expert_parallel`]); 1 without.
    expert_groups: f64,
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
    /// The LM head's FLOP time per sampled sequence (µs at peak): logits are computed for
    /// the last position of each scheduled sequence only (`2·vocab·hidden/tp`).
    head_flop_us_per_seq: f64,
    /// One pass over one sequence's fp32 logits, the whole vocabulary (µs at peak
    /// bandwidth): the sampler's unit of work (`sampler_passes` of them a sequence).
    logits_us_per_seq: f64,
    /// The weights' time multiplier for their precision: `fp8_weights` for 1-byte weights,
    /// 1 otherwise.
    weight_precision: f64,
    /// The measured all-reduce, when `allreduce_measured` is on and the GPU and TP degree
    /// have a curve: it then prices every all-reduce in place of `allreduce_us`, the peer
    /// latency and the link term.
    measured_allreduce: Option<MeasuredAllreduce>,
    /// Weights read from host memory each step, µs ([`super::offload`]); 0 without offload.
    offload_us: f64,
}

/// Each all-reduce priced from a measured curve: `scale · curve(T · hidden · activation
/// bytes)` µs, `n_ar` of them a step.
#[derive(Clone, Copy, Debug, PartialEq)]
struct MeasuredAllreduce {
    /// `allreduce_measured`.
    scale: f64,
    /// The GPU's curve at the model's TP degree.
    curve: &'static AllreduceCurve,
    /// One token's activations (bytes): `hidden · activation bytes`.
    bytes_per_token: f64,
}

impl MeasuredAllreduce {
    /// One all-reduce of a step of `tokens` tokens (µs).
    fn one_us(&self, tokens: f64) -> f64 {
        self.scale * self.curve.us(tokens.max(1.0) * self.bytes_per_token)
    }
}

/// Bytes of one logit as the sampler reads it (vLLM's sampler works on fp32 logits).
const LOGIT_BYTES: f64 = 4.0;

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

/// [`CalibratedModel::decode_steps`]: decode-only steps of a fixed number of sequences. Owns
/// the few numbers it needs, so a lazy window can keep it across steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeSteps {
    decodes: u64,
    batch_part_us: f64,
    context: ContextTerms,
}

/// The formula's last two terms' coefficients: attention and KV traffic.
#[derive(Clone, Copy, Debug, PartialEq)]
struct ContextTerms {
    attention: f64,
    attn_us_per_token_ctx: f64,
    kv: f64,
    kv_us_per_token: f64,
}

impl ContextTerms {
    /// The step in whole microseconds: `batch_part_us` plus the attention and KV terms of
    /// the batch's context, the formula's last two terms.
    #[inline]
    fn step_us(&self, batch_part_us: f64, attn_pairs_x2: u64, kv_tokens: u64) -> u64 {
        let attn_us = attn_pairs_x2 as f64 / 2.0 * self.attn_us_per_token_ctx;
        let kv_us = kv_tokens as f64 * self.kv_us_per_token;
        let step = batch_part_us + self.attention * attn_us + self.kv * kv_us;
        us_trunc_from_f64(step).max(1)
    }
}

impl DecodeSteps {
    /// Sequences the steps decode.
    pub fn decodes(&self) -> u64 {
        self.decodes
    }

    /// The step when the sequences hold `context` tokens of context in total: equals
    /// `step_with_decodes_us(&[], decodes, context)`.
    #[inline]
    pub fn step_us(&self, context: u64) -> u64 {
        if self.decodes == 0 {
            return 1;
        }
        let (attn_pairs_x2, kv_tokens) = decode_terms(self.decodes, context);
        self.context
            .step_us(self.batch_part_us, attn_pairs_x2, kv_tokens)
    }
}

/// The attention and KV sums of `decodes` decodes holding `context` tokens in total:
/// (2·Σ attention pairs, KV tokens read and written). A decode's query meets its context
/// plus itself, 1·(2·ctx + 1), and it reads its context and writes one token.
#[inline]
fn decode_terms(decodes: u64, context: u64) -> (u64, u64) {
    (2 * context + decodes, context + decodes)
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
        let scale = coefficients.values[idx::ALLREDUCE_MEASURED];
        let curve = if tp > 1 && scale > 0.0 {
            measured_curve(&gpu.name, tp)?
        } else {
            None
        };
        let measured = curve.map(|curve| MeasuredAllreduce {
            scale,
            curve,
            bytes_per_token: f64::from(arch.hidden_size) * arch.bytes_per_param,
        });
        Ok(Self::build(arch, gpu, tp, coefficients, measured))
    }

    fn build(
        arch: &ModelArch,
        gpu: &GpuSpec,
        tp_u: u32,
        coefficients: &CalibratedCoefficients,
        measured_allreduce: Option<MeasuredAllreduce>,
    ) -> Self {
        let tp = f64::from(tp_u);
        let layers = f64::from(arch.num_layers);
        let c = &coefficients.values;
        // Peer hand-offs a step priced by `allreduce_peer_us` (see `step_peer_us`).
        let allreduce_peers = if tp_u > 1 {
            let beyond = (tp - 1.0 - c[idx::ALLREDUCE_BASE_PEERS]).max(0.0);
            let cap = c[idx::ALLREDUCE_PEER_CAP];
            2.0 * layers * if cap > 0.0 { beyond.min(cap) } else { beyond }
        } else {
            0.0
        };
        let d = f64::from(arch.hidden_size);
        let heads = f64::from(arch.num_heads);
        let head_dim = f64::from(arch.effective_head_dim());
        let d_q = heads * head_dim;
        let d_kv = f64::from(arch.num_kv_heads) * head_dim;
        let d_ff = f64::from(arch.intermediate_size);
        let d_ff_moe = f64::from(arch.expert_intermediate_size());
        let d_ff_dense = nonzero_or(arch.dense_intermediate_size, d_ff);
        // The layers and shared experts vLLM builds (not BLIS's split, which roofline and
        // physics keep for parity).
        let d_ff_shared = f64::from(arch.vllm_shared_expert_intermediate());
        let (moe_u, dense_u) = arch.vllm_layer_split();
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
            step_peer_us: c[idx::ALLREDUCE_PEER_US] * allreduce_peers,
            first_token_peer_us: c[idx::FIRST_TOKEN_PEER_SHARE]
                * c[idx::ALLREDUCE_PEER_US]
                * allreduce_peers,
            dense_weight_us: dense_bytes * gpu.weight_read_factor / bytes_per_us,
            expert_weight_us: if arch.is_moe() {
                expert_params * wb * gpu.weight_read_factor / bytes_per_us
            } else {
                0.0
            },
            expert_groups: 1.0,
            moe_layers: if arch.is_moe() { moe_layers } else { 0.0 },
            experts: arch.num_experts,
            top_k: arch.experts_per_tok.max(1),
            flop_us_per_token: 2.0 * dense_params_per_token / flops_per_us,
            expert_flop_us_per_token: 2.0 * expert_params_per_token / flops_per_us,
            attn_us_per_token_ctx: 4.0 * layers * (heads / tp) * head_dim / flops_per_us,
            kv_us_per_token: arch.kv_bytes_per_token(tp_u) * gpu.kv_read_factor / bytes_per_us,
            head_flop_us_per_seq: 2.0 * head_params / flops_per_us,
            logits_us_per_seq: f64::from(arch.vocab_size) * LOGIT_BYTES / bytes_per_us,
            weight_precision: if wb < 1.5 { c[idx::FP8_WEIGHTS] } else { 1.0 },
            measured_allreduce,
            offload_us: 0.0,
        }
    }

    /// The same model with `step_us` of offloaded weights read over the host link added to
    /// every step ([`super::offload`]).
    pub fn with_weight_offload(mut self, step_us: f64) -> Self {
        self.offload_us = step_us;
        self
    }

    /// The same model for one rank of `data_parallel` ranks that run a mixture-of-experts
    /// model with expert parallelism (vLLM's `--data-parallel-size D
    /// --enable-expert-parallel`): each GPU of the tp·D holds 1/(tp·D) of the routed experts
    /// whole, not a 1/tp slice of each, and serves the routed tokens of every rank, which
    /// run their steps together. So a step reads 1/D of the expert bytes a TP-only rank
    /// reads, for the experts that all D ranks' tokens touch (D × this rank's tokens: the
    /// ranks' batches taken as equal). The FLOPs per GPU are unchanged (D× the tokens on
    /// 1/D of the experts); the MoE layers' collectives stay priced as the TP all-reduces
    /// (the extra all-gather and reduce-scatter over the D ranks are not). A dense model,
    /// or D of 1, is unchanged.
    pub fn with_expert_parallel(mut self, data_parallel: u32) -> Self {
        if self.moe_layers > 0.0 {
            // From the TP-only figure, so a second call sets rather than compounds.
            let ranks = f64::from(data_parallel.max(1));
            self.expert_weight_us *= self.expert_groups / ranks;
            self.expert_groups = ranks;
        }
        self
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
        let (attn_pairs_x2, kv_tokens) = decode_terms(decodes, context);
        shape.attn_pairs_x2 += attn_pairs_x2;
        shape.kv_tokens += kv_tokens;
        if shape.sequences == 0 {
            return 1;
        }
        self.price(shape)
    }

    /// The formula over a batch's sums.
    fn price(&self, shape: Shape) -> u64 {
        self.price_with_peer_us(shape, self.step_peer_us)
    }

    /// The formula with `peer_us` of all-reduce peer latency (an engine step's, or what the
    /// first token's decode step pays).
    fn price_with_peer_us(&self, shape: Shape, peer_us: f64) -> u64 {
        let fixed = self.batch_part_us(shape.sequences, shape.tokens, peer_us);
        self.context_terms()
            .step_us(fixed, shape.attn_pairs_x2, shape.kv_tokens)
    }

    /// The formula's terms that depend on the batch's sequences and tokens but not on their
    /// context, summed in the formula's order (so adding [`Self::context_part`]'s terms to it
    /// gives the formula's value to the last bit).
    fn batch_part_us(&self, sequences: u64, tokens: u64, peer_us: f64) -> f64 {
        use idx::*;
        let c = &self.c;
        let tokens = tokens as f64;
        let experts_touched = if self.moe_layers > 0.0 {
            let routed_tokens = tokens * self.expert_groups;
            f64::from(self.experts)
                * activated_expert_fraction(self.experts, self.top_k, routed_tokens)
        } else {
            0.0
        };
        let weights_us = self.weight_precision
            * (self.dense_weight_us
                + c[MOE_WEIGHTS] * self.moe_layers * experts_touched * self.expert_weight_us);
        let seqs = sequences as f64;
        let flops_us = tokens
            * (c[FLOPS] * self.flop_us_per_token + c[MOE_FLOPS] * self.expert_flop_us_per_token)
            + c[FLOPS] * seqs * self.head_flop_us_per_seq;
        let allreduce_us = match &self.measured_allreduce {
            Some(measured) => self.allreduces * measured.one_us(tokens),
            None => {
                c[ALLREDUCE_US] * self.allreduces
                    + peer_us
                    + c[ALLREDUCE_LINK] * tokens * self.allreduce_us_per_token
            }
        };
        c[STEP_US]
            + c[SEQ_US] * seqs
            + c[TOKEN_US] * tokens
            + c[SAMPLER_PASSES] * seqs * self.logits_us_per_seq
            + c[LAYER_US] * self.layers
            + allreduce_us
            + (c[WEIGHTS] * weights_us).max(flops_us)
            + self.offload_us
    }

    /// The all-reduces' fixed latency a step pays whatever its size: `allreduce_us·2L` plus
    /// the peer latency, or with the measured curve its time at one token's message.
    fn fixed_allreduce_us(&self) -> f64 {
        match &self.measured_allreduce {
            Some(measured) => self.allreduces * measured.one_us(1.0),
            None => self.c[idx::ALLREDUCE_US] * self.allreduces + self.step_peer_us,
        }
    }

    /// The coefficients of the formula's context terms.
    fn context_terms(&self) -> ContextTerms {
        ContextTerms {
            attention: self.c[idx::ATTENTION],
            attn_us_per_token_ctx: self.attn_us_per_token_ctx,
            kv: self.c[idx::KV],
            kv_us_per_token: self.kv_us_per_token,
        }
    }

    /// The steps of `decodes` decoding sequences and nothing else, priced as their context
    /// grows: the terms fixed by the batch's size are summed once (a drain prices hundreds of
    /// such steps between two changes of its batch). Each step's price is
    /// [`CalibratedModel::step_with_decodes_us`]'s to the last bit.
    pub fn decode_steps(&self, decodes: u64) -> DecodeSteps {
        DecodeSteps {
            decodes,
            batch_part_us: self.batch_part_us(decodes, decodes, self.step_peer_us),
            context: self.context_terms(),
        }
    }

    /// The parts of the TTFT of one `prompt_tokens` request on an idle server whose steps
    /// take at most `chunk_tokens` tokens (`max_num_batched_tokens`; chunked prefill), with
    /// nothing cached: see [`UnloadedTtft`].
    pub fn unloaded_ttft(&self, prompt_tokens: u32, chunk_tokens: u32) -> UnloadedTtft {
        use idx::*;
        let c = &self.c;
        let chunk_tokens = chunk_tokens.max(1);
        let fixed = c[STEP_US] + c[SEQ_US] + c[LAYER_US] * self.layers;
        let fixed = fixed + self.fixed_allreduce_us();
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
            first_token_us: self.first_token_delay_us(1, u64::from(prompt_tokens.max(1)))
                + self.output_token_us(),
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

    /// Delay of a first token made by a step of `batch` sequences that hold `context` tokens
    /// of KV once it has run (see the module doc).
    pub fn first_token_delay_us(&self, batch: u64, context: u64) -> u64 {
        let per_seq = self.c[idx::FIRST_TOKEN_US_PER_SEQ] * batch as f64;
        let steps = self.c[idx::FIRST_TOKEN_STEPS];
        let next_step = if steps > 0.0 {
            steps * self.decode_step_us(batch.max(1), context) as f64
        } else {
            0.0
        };
        us_trunc_from_f64(per_seq + next_step)
    }

    /// A decode step of `batch` sequences holding `context` tokens of KV in total (each reads
    /// its context and writes one token): the step after a first token, which the client
    /// waits for before it sees that token (see the module doc).
    fn decode_step_us(&self, batch: u64, context: u64) -> u64 {
        let (attn_pairs_x2, kv_tokens) = decode_terms(batch, context);
        let shape = Shape {
            sequences: batch,
            tokens: batch,
            attn_pairs_x2,
            kv_tokens,
        };
        self.price_with_peer_us(shape, self.first_token_peer_us)
    }

    /// Host time a step takes longer while `waiting` requests wait in the scheduler's queue:
    /// `waiting_us · min(waiting, waiting_cap)` (0 with either coefficient 0). Measured on
    /// the overloaded runs: at a constant batch and context the step grows with the queue
    /// (see docs/fidelity.md, "The knee of the overloaded runs"). Host work, not scaled by
    /// the GPU.
    pub fn waiting_us(&self, waiting: u64) -> u64 {
        let c = &self.c;
        if waiting == 0 || c[idx::WAITING_US] == 0.0 {
            return 0; // the common case: no queue, or the term off
        }
        let counted = (waiting as f64).min(c[idx::WAITING_CAP]);
        us_trunc_from_f64(c[idx::WAITING_US] * counted)
    }

    /// True if a waiting request can change a step's price ([`CalibratedModel::waiting_us`]
    /// on). Late entry (a request put in the queue after the fact) is exact only when false.
    pub fn prices_waiting(&self) -> bool {
        self.waiting_us(u64::MAX) > 0
    }

    /// Time after the last token.
    pub fn post_decode_us(&self) -> u64 {
        us_trunc_from_f64(self.c[idx::POST_DECODE_US])
    }
}

#[cfg(test)]
mod tests;
