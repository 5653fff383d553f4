use super::*;
use crate::sim::latency::arch::tests::{h100, llama_8b};

mod gemm_factor;

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
        CalibratedModel::new(&llama_8b(), &h100(), 1, &CalibratedCoefficients::ROOFLINE).unwrap();
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
fn decode_steps_price_as_step_with_decodes() {
    // Goal: a drain's pricer (context-free terms summed once) gives every step the price the
    // whole formula gives, dense and MoE, TP 1 and 4 with the per-peer term on.
    // Method: many (decodes, context) pairs with fractional coefficients, so a regrouped sum
    // would truncate differently somewhere.
    let mut coefficients = CalibratedCoefficients::ROOFLINE;
    for (index, value) in coefficients.values.iter_mut().enumerate() {
        *value += 0.137 * index as f64 + 0.011;
    }
    coefficients.values[idx::ALLREDUCE_PEER_US] = 5.3;
    let mut moe = llama_8b();
    moe.num_experts = 8;
    moe.experts_per_tok = 2;
    for (arch, tp) in [(llama_8b(), 1), (llama_8b(), 4), (moe, 2)] {
        let model = CalibratedModel::new(&arch, &h100(), tp, &coefficients).unwrap();
        let mut mismatches = 0;
        let mut state = 0x9e37_79b9_u64;
        for decodes in [0u64, 1, 2, 7, 64, 128, 255] {
            let steps = model.decode_steps(decodes);
            for _ in 0..500 {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                let context = decodes * ((state >> 33) % 4096);
                if steps.step_us(context) != model.step_with_decodes_us(&[], decodes, context) {
                    mismatches += 1;
                }
            }
        }
        assert_eq!(mismatches, 0, "tp {tp}");
    }
}

#[test]
fn moe_reads_only_the_experts_its_tokens_touch() {
    let mut arch = llama_8b();
    arch.num_experts = 8;
    arch.experts_per_tok = 2;
    let model = CalibratedModel::new(&arch, &h100(), 1, &CalibratedCoefficients::ROOFLINE).unwrap();
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
    // batch that made it (weights, host costs, and the KV reads of the batch's context),
    // on top of the per-sequence delay; 0 (a file without it) leaves the delay as it was.
    let mut coefficients = CalibratedCoefficients::ROOFLINE;
    coefficients.values[idx::STEP_US] = 500.0;
    coefficients.values[idx::SEQ_US] = 4.0;
    coefficients.values[idx::FIRST_TOKEN_US_PER_SEQ] = 10.0;
    let off = CalibratedModel::new(&llama_8b(), &h100(), 1, &coefficients).unwrap();
    assert_eq!(off.first_token_delay_us(8, 8 * 4000), 80);
    coefficients.values[idx::FIRST_TOKEN_STEPS] = 1.0;
    let on = CalibratedModel::new(&llama_8b(), &h100(), 1, &coefficients).unwrap();
    for batch in [1u64, 8, 64] {
        for context in [0u32, 600, 4000] {
            let decodes: Vec<BatchEntry> = (0..batch).map(|_| entry(context, 1, false)).collect();
            let step = on.step_us(&decodes);
            let got = on.first_token_delay_us(batch, batch * u64::from(context));
            assert!(
                got.abs_diff(10 * batch + step) <= 1,
                "batch {batch}, context {context}: {got} vs {step}"
            );
        }
    }
    // The KV reads count: 64 sequences of 4,000 tokens hold 31 GiB of llama-3.1-8b's KV
    // (128 KiB a token), ~10 ms at 3.35 TB/s, on top of the weights.
    let short = on.first_token_delay_us(64, 0);
    let long = on.first_token_delay_us(64, 64 * 4000);
    assert!((9_000..12_000).contains(&(long - short)), "{short} {long}");
    // About one weight read of llama-3.1-8b (15 GB at 3.35 TB/s: 4.5 ms) plus the host.
    let one = on.first_token_delay_us(1, 0);
    assert!((4_900..5_100).contains(&one), "{one}");
    // Unloaded, the next step reads the request's own prompt.
    let parts = on.unloaded_ttft(600, 2048);
    assert_eq!(parts.first_token_us, on.first_token_delay_us(1, 600));
}

#[test]
fn rejects_bad_coefficients() {
    let mut coefficients = CalibratedCoefficients::ROOFLINE;
    coefficients.values[3] = f64::NAN;
    let err = CalibratedModel::new(&llama_8b(), &h100(), 1, &coefficients).unwrap_err();
    assert!(err.to_string().contains("calibrated[3]"), "{err}");
}

#[test]
fn a_waiting_queue_costs_waiting_us_per_request_up_to_the_cap() {
    // Goal: the host cost of an open queue is `waiting_us · min(waiting, waiting_cap)`, 0
    // with either coefficient 0 (a file without the term), and independent of the GPU.
    let mut coefficients = CalibratedCoefficients::ROOFLINE;
    let model = |c: &CalibratedCoefficients, gpu: &GpuSpec| {
        CalibratedModel::new(&llama_8b(), gpu, 1, c).unwrap()
    };
    assert_eq!(model(&coefficients, &h100()).waiting_us(500), 0);
    coefficients.values[idx::WAITING_US] = 7.5;
    assert_eq!(
        model(&coefficients, &h100()).waiting_us(500),
        0,
        "cap 0: off"
    );
    coefficients.values[idx::WAITING_CAP] = 400.0;
    let on = model(&coefficients, &h100());
    assert!(on.prices_waiting());
    assert_eq!(on.waiting_us(0), 0);
    assert_eq!(on.waiting_us(10), 75);
    assert_eq!(on.waiting_us(400), 3000);
    assert_eq!(on.waiting_us(5000), 3000);
    let slow = GpuSpec {
        bw_peak_tbs: h100().bw_peak_tbs / 3.0,
        ..h100()
    };
    assert_eq!(model(&coefficients, &slow).waiting_us(10), 75);
}

#[test]
fn all_reduce_peer_latency_grows_with_the_peers() {
    // Goal: `allreduce_peer_us` is paid once per all-reduce per peer: 2L·(tp − 1) times a
    // step (0 at tp 1), three times as much at tp 4 as at tp 2, in every step's price and
    // in the unloaded TTFT's scheduler part.
    let mut coefficients = CalibratedCoefficients::ROOFLINE;
    for value in coefficients.values.iter_mut() {
        *value = 0.0;
    }
    coefficients.values[idx::ALLREDUCE_PEER_US] = 2.0;
    let price = |tp: u32| {
        let model = CalibratedModel::new(&llama_8b(), &h100(), tp, &coefficients).unwrap();
        (
            model.step_us(&[entry(100, 1, false)]),
            model.unloaded_ttft(100, 2048).scheduler_us,
        )
    };
    // 2 · 32 layers · (tp − 1) · 2 µs.
    assert_eq!(price(1), (1, 0));
    assert_eq!(price(2), (128, 128));
    assert_eq!(price(4), (384, 384));
}

#[test]
fn peer_latency_can_skip_the_base_peers_and_the_first_token_step() {
    // Goal: `allreduce_base_peers` b prices the per-peer all-reduce latency for the peers
    // beyond the first b only (TP 2 untouched at b = 1), and `first_token_peer_share` scales
    // what the first token's decode step pays of it, while an engine step pays all of it;
    // the defaults (0, 1) price as before.
    let mut coefficients = CalibratedCoefficients::ROOFLINE;
    coefficients.values[idx::STEP_US] = 500.0;
    coefficients.values[idx::FIRST_TOKEN_STEPS] = 1.0;
    coefficients.values[idx::ALLREDUCE_PEER_US] = 5.0;
    let model = |c: &CalibratedCoefficients, tp: u32| {
        CalibratedModel::new(&llama_8b(), &h100(), tp, c).unwrap()
    };
    let decodes: Vec<BatchEntry> = (0..8).map(|_| entry(100, 1, false)).collect();
    let layers = u64::from(llama_8b().num_layers);
    let base = model(&coefficients, 1).step_us(&decodes);
    // Default: 2L·(tp − 1) hand-offs of 5 µs.
    for tp in [2u32, 4] {
        let peers = 2 * layers * u64::from(tp - 1);
        let got = model(&coefficients, tp).step_us(&decodes);
        let without = {
            let mut c = coefficients.clone();
            c.values[idx::ALLREDUCE_PEER_US] = 0.0;
            model(&c, tp).step_us(&decodes)
        };
        assert!(got.abs_diff(without + 5 * peers) <= 1, "tp {tp}: {got}");
        assert!(without <= base, "tp {tp}: a sharded step is not dearer");
    }
    coefficients.values[idx::ALLREDUCE_BASE_PEERS] = 1.0;
    let mut no_peer = coefficients.clone();
    no_peer.values[idx::ALLREDUCE_PEER_US] = 0.0;
    assert_eq!(
        model(&coefficients, 2).step_us(&decodes),
        model(&no_peer, 2).step_us(&decodes),
        "b = 1: TP 2 pays nothing"
    );
    let tp4 = model(&coefficients, 4).step_us(&decodes);
    let tp4_without = model(&no_peer, 4).step_us(&decodes);
    assert!(tp4.abs_diff(tp4_without + 5 * 2 * layers * 2) <= 1, "{tp4}");
    // The first token's step: all of it at share 1, none at share 0; engine steps unchanged.
    let full = model(&coefficients, 4).first_token_delay_us(8, 8 * 500);
    coefficients.values[idx::FIRST_TOKEN_PEER_SHARE] = 0.0;
    let shared = model(&coefficients, 4);
    assert_eq!(shared.step_us(&decodes), tp4);
    assert_eq!(
        shared.first_token_delay_us(8, 8 * 500),
        model(&no_peer, 4).first_token_delay_us(8, 8 * 500)
    );
    assert!(full.abs_diff(shared.first_token_delay_us(8, 8 * 500) + 5 * 2 * layers * 2) <= 1);
}

#[test]
fn the_kv_term_scales_with_the_gpus_attention_kernel() {
    // A GPU whose attention kernel reads the KV cache 2.5x dearer (FlashAttention 2 on
    // Ampere) prices a decode step's KV part 2.5x, everything else unchanged.
    // Pure roofline: every efficiency 1, no host terms.
    let coefficients = CalibratedCoefficients::ROOFLINE;
    let fa2 = GpuSpec {
        kv_read_factor: 2.5,
        ..h100()
    };
    let hopper = CalibratedModel::new(&llama_8b(), &h100(), 1, &coefficients).unwrap();
    let ampere_kernel = CalibratedModel::new(&llama_8b(), &fa2, 1, &coefficients).unwrap();
    let step = |model: &CalibratedModel, context: u32| {
        let batch: Vec<BatchEntry> = (0..32).map(|_| entry(context, 1, false)).collect();
        model.step_us(&batch) as f64
    };
    // 32 sequences x 2,000 more tokens x 128 KiB = 8.4 GB more KV: 2,504 us at 3.35 TB/s,
    // beside 34 us of attention FLOPs that the factor leaves alone.
    let hopper_kv = step(&hopper, 2_000) - step(&hopper, 0);
    let ampere_kv = step(&ampere_kernel, 2_000) - step(&ampere_kernel, 0);
    assert!((hopper_kv - 2_538.0).abs() < 3.0, "{hopper_kv}");
    assert!(
        (ampere_kv - hopper_kv - 1.5 * 2_504.0).abs() < 3.0,
        "{ampere_kv}"
    );
}

#[test]
fn expert_parallel_ranks_read_a_share_of_the_routed_experts() {
    // Mixtral-8x7B's shape (Llama-3.1-8B's with 8 experts of 14,336, 2 a token) at TP 2:
    // one rank of two with expert parallelism reads half the routed-expert bytes a TP-only
    // rank does, the rest of the step unchanged; a dense model is unchanged.
    let moe = ModelArch {
        num_experts: 8,
        experts_per_tok: 2,
        ..llama_8b()
    };
    // Pure roofline: every efficiency 1, no host terms.
    let coefficients = CalibratedCoefficients::ROOFLINE;
    let tp_only = CalibratedModel::new(&moe, &h100(), 2, &coefficients).unwrap();
    let ep = tp_only.clone().with_expert_parallel(2);
    let decodes: Vec<BatchEntry> = (0..64).map(|_| entry(500, 1, false)).collect();
    // 32 layers x 8 experts x 3 x 4096 x 14336 x 2 bytes / 2 GPUs = 45.1 GB: 13.5 ms at
    // 3.35 TB/s on a TP-only rank; expert parallelism over 2 ranks saves half of it.
    let saved = tp_only.step_us(&decodes) as f64 - ep.step_us(&decodes) as f64;
    let expert_us = 32.0 * 8.0 * 3.0 * 4096.0 * 14336.0 * 2.0 / 2.0 / 3.35e6;
    assert!(
        (saved - expert_us / 2.0).abs() < 2.0,
        "{saved} vs {expert_us}"
    );
    // With one token a rank, the other rank's token touches experts this rank's does not:
    // 3.5 experts expected (1 - 0.75^2 of 8) at half the bytes, against 2 on a TP-only
    // rank: a quarter of an expert's bytes saved, not the whole one a rank's own token
    // alone would give.
    let one = vec![entry(500, 1, false)];
    let saved_one = tp_only.step_us(&one) as f64 - ep.step_us(&one) as f64;
    assert!(
        (saved_one - expert_us / 32.0).abs() < 2.0,
        "{saved_one} vs {}",
        expert_us / 32.0
    );
    // Applying it again sets the degree, it does not compound.
    assert_eq!(
        ep.clone().with_expert_parallel(2).step_us(&decodes),
        ep.step_us(&decodes)
    );
    assert_eq!(
        ep.clone().with_expert_parallel(1).step_us(&decodes),
        tp_only.step_us(&decodes)
    );
    let dense = CalibratedModel::new(&llama_8b(), &h100(), 2, &coefficients).unwrap();
    assert_eq!(
        dense.clone().with_expert_parallel(2).step_us(&decodes),
        dense.step_us(&decodes)
    );
}

#[test]
fn an_interleaved_moe_is_priced_with_the_layers_vllm_builds() {
    // Llama-4 Scout's shape (48 layers, interleave step 1: every layer MoE, 16 experts of
    // 8,192 plus a shared expert of 8,192; dense MLP 16,384 unused): 64 decodes touch
    // 16 (1 - (15/16)^64) = 15.74 experts in expectation, so the step reads
    // 48 x (15.74 + 1) x 3 x 5,120 x 8,192 bytes (1-byte weights) of FFNs on one GPU, beside
    // the attention and LM head.
    let scout = ModelArch {
        num_layers: 48,
        hidden_size: 5120,
        num_heads: 40,
        num_kv_heads: 8,
        head_dim: 128,
        intermediate_size: 8192,
        dense_intermediate_size: 16384,
        vocab_size: 202_048,
        weight_bytes_per_param: 1.0,
        num_experts: 16,
        experts_per_tok: 1,
        interleave_moe_layer_step: 1,
        ..llama_8b()
    };
    // Pure roofline: every efficiency 1, no host terms.
    let coefficients = CalibratedCoefficients::ROOFLINE;
    let model = CalibratedModel::new(&scout, &h100(), 1, &coefficients).unwrap();
    let decodes: Vec<BatchEntry> = (0..64).map(|_| entry(0, 1, false)).collect();
    let touched = 16.0 * (1.0 - (15.0f64 / 16.0).powi(64));
    let ffn_bytes = 48.0 * (touched + 1.0) * 3.0 * 5120.0 * 8192.0;
    let attn_bytes = 48.0 * 5120.0 * (2.0 * 5120.0 + 2.0 * 1024.0);
    let head_bytes = 202_048.0 * 5120.0;
    let expected_weights_us = (ffn_bytes + attn_bytes + head_bytes) / 3.35e6;
    let step = model.step_us(&decodes) as f64;
    // The weights are this step (ROOFLINE's host terms are 0; FLOPs and KV reads of 64
    // one-token decodes are far below).
    assert!(
        (step - expected_weights_us).abs() / expected_weights_us < 0.002,
        "{step} vs {expected_weights_us}"
    );
}

#[test]
fn the_sampler_pays_each_sequence_a_pass_over_its_vocabulary() {
    // Goal: issue 36's vocabulary cost: `sampler_passes` passes over each scheduled
    // sequence's fp32 logits at the GPU's bandwidth, so a 128k vocabulary costs 4× a 32k one
    // and the cost grows with the batch, not with its tokens. Method: the same decode batch
    // with the term at 0 and at 10, Llama-3.1-8B against the same model with a 32k vocab.
    let mut coefficients = CalibratedCoefficients::ROOFLINE;
    let batch: Vec<BatchEntry> = (0..64).map(|_| entry(500, 1, false)).collect();
    let price = |arch: &ModelArch, c: &CalibratedCoefficients| {
        CalibratedModel::new(arch, &h100(), 1, c)
            .unwrap()
            .step_us(&batch) as f64
    };
    let big = llama_8b();
    let mut small = llama_8b();
    small.vocab_size = 32_000;
    let (big_off, small_off) = (price(&big, &coefficients), price(&small, &coefficients));
    coefficients.values[idx::SAMPLER_PASSES] = 10.0;
    let big_cost = price(&big, &coefficients) - big_off;
    let small_cost = price(&small, &coefficients) - small_off;
    // 64 sequences × 128256 logits × 4 bytes × 10 passes at 3.35 TB/s ≈ 98 µs.
    let expected = 64.0 * 128_256.0 * 4.0 * 10.0 / 3.35e6;
    assert!(
        (big_cost - expected).abs() <= 1.0,
        "{big_cost} vs {expected}"
    );
    assert!(
        (big_cost / small_cost - 128_256.0 / 32_000.0).abs() < 0.1,
        "{big_cost} vs {small_cost}"
    );
}

#[test]
fn fp8_weights_and_the_peer_cap_price_only_what_they_name() {
    // Goal: `fp8_weights` scales only 1-byte weights' read time; `allreduce_peer_cap` bounds
    // the peers beyond the base that pay the per-peer latency (TP 8 pays as TP 4 at cap 2),
    // and 0 leaves it uncapped. Method: one decode step priced with each knob.
    let batch = [entry(500, 1, false)];
    let mut coefficients = CalibratedCoefficients::ROOFLINE;
    coefficients.values[idx::FP8_WEIGHTS] = 1.5;
    let mut fp8 = llama_8b();
    fp8.weight_bytes_per_param = 1.0;
    let step = |arch: &ModelArch, tp: u32, c: &CalibratedCoefficients| {
        CalibratedModel::new(arch, &h100(), tp, c)
            .unwrap()
            .step_us(&batch)
    };
    let roofline = CalibratedCoefficients::ROOFLINE;
    assert_eq!(
        step(&llama_8b(), 1, &coefficients),
        step(&llama_8b(), 1, &roofline)
    );
    let (slow, fast) = (step(&fp8, 1, &coefficients), step(&fp8, 1, &roofline));
    assert!(slow as f64 > 1.4 * fast as f64, "{slow} vs {fast}");

    let mut peers = CalibratedCoefficients::ROOFLINE;
    peers.values[idx::ALLREDUCE_PEER_US] = 5.0;
    peers.values[idx::ALLREDUCE_BASE_PEERS] = 1.0;
    let uncapped = step(&llama_8b(), 8, &peers) - step(&llama_8b(), 8, &roofline);
    peers.values[idx::ALLREDUCE_PEER_CAP] = 2.0;
    let capped = step(&llama_8b(), 8, &peers) - step(&llama_8b(), 8, &roofline);
    // 2L all-reduces × 5 µs × 6 peers beyond the first, or × 2 under the cap.
    assert!(uncapped.abs_diff(64 * 5 * 6) <= 1, "{uncapped}");
    assert!(capped.abs_diff(64 * 5 * 2) <= 1, "{capped}");
}

#[test]
fn the_measured_allreduce_replaces_the_formula_where_the_table_has_a_row() {
    // Goal: with `allreduce_measured` on, an H100 TP 4 step pays 2L all-reduces at the
    // measured time of its message (data/allreduce_latency.tsv) and none of the formula's
    // all-reduce terms; without a row (TP 2, another GPU) or with it off, nothing changes.
    // Method: llama-3.1-8b (hidden 4096, 32 layers), 128 decodes: 128·4096·2 B = 1 MiB, 18 µs
    // in the table (PR #24532, custom two-stage kernel); 20 decodes: 160 KiB, below the
    // first point, its 10 µs.
    let mut off = CalibratedCoefficients::ROOFLINE;
    off.values[idx::ALLREDUCE_LINK] = 0.0;
    let mut on = off.clone();
    on.values[idx::ALLREDUCE_MEASURED] = 1.0;
    let mut on_with_formula = on.clone();
    on_with_formula.values[idx::ALLREDUCE_US] = 5.0;
    on_with_formula.values[idx::ALLREDUCE_PEER_US] = 3.0;
    on_with_formula.values[idx::ALLREDUCE_LINK] = 1.0;
    let step = |gpu: &GpuSpec, tp: u32, c: &CalibratedCoefficients, decodes: u64| {
        CalibratedModel::new(&llama_8b(), gpu, tp, c)
            .unwrap()
            .step_with_decodes_us(&[], decodes, decodes * 500)
    };
    let h100 = h100();
    let added = step(&h100, 4, &on, 128) - step(&h100, 4, &off, 128);
    assert!(added.abs_diff(2 * 32 * 18) <= 1, "added {added} µs");
    let added = step(&h100, 4, &on, 20) - step(&h100, 4, &off, 20);
    assert!(added.abs_diff(2 * 32 * 10) <= 1, "added {added} µs");
    assert_eq!(
        step(&h100, 4, &on_with_formula, 128),
        step(&h100, 4, &on, 128)
    );
    assert_eq!(step(&h100, 2, &on, 128), step(&h100, 2, &off, 128));
    let a100 = GpuSpec {
        name: "A100-80".to_string(),
        ..h100.clone()
    };
    assert_eq!(step(&a100, 4, &on, 128), step(&a100, 4, &off, 128));
    // The unloaded TTFT's fixed part carries the measured latency too.
    let model = CalibratedModel::new(&llama_8b(), &h100, 4, &on).unwrap();
    let ttft = model.unloaded_ttft(100, 2048);
    assert!(ttft.scheduler_us >= 2 * 32 * 10, "{ttft:?}");
}
