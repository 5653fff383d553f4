use super::*;
use crate::sim::latency::arch::tests::{h100, llama_8b};
use crate::sim::latency::{
    BatchEntry, BlackboxCoefficients, CalibratedCoefficients, CalibratedModel, LatencyModel,
    PhysicsCoefficients, PhysicsModel, RooflineModel,
};

/// Llama-3.1-8B's layer at TP 1 in vLLM's order, bytes (bf16): qkv 4096·(4096 + 2·1024),
/// o 4096², gate_up 2·14336·4096, down 14336·4096, two norms of 4096.
const QKV: u64 = 4096 * 6144 * 2;
const O: u64 = 4096 * 4096 * 2;
const GATE_UP: u64 = 2 * 14336 * 4096 * 2;
const DOWN: u64 = 14336 * 4096 * 2;
const NORM: u64 = 4096 * 2;
const LAYER: u64 = QKV + O + GATE_UP + DOWN + 2 * NORM;

fn decode(context_tokens: u32) -> BatchEntry {
    BatchEntry {
        context_tokens,
        new_tokens: 1,
        prompt_tokens: context_tokens,
        is_prefill: false,
    }
}

#[test]
fn nothing_offloaded_costs_nothing() {
    let plan = WeightOffload::plan(&llama_8b(), &h100(), 1, 0.0).unwrap();
    assert_eq!(plan, WeightOffload::NONE);
    assert_eq!(plan.step_us(), 0.0);
}

#[test]
fn whole_parameters_move_in_layer_order_until_the_budget_is_reached() {
    // Goal: vLLM's walk, checked before each parameter. Method: 1 GiB on Llama-3.1-8B:
    // two whole layers (872 MB) stay under it, then layer 2's qkv and o (still under), then
    // its gate_up crosses it and is moved whole: the offload overshoots by part of it.
    let budget = 1u64 << 30;
    assert!(2 * LAYER + QKV + O < budget && 2 * LAYER + QKV + O + GATE_UP >= budget);
    let expected = 2 * LAYER + QKV + O + GATE_UP;
    assert_eq!(offloaded_bytes(&llama_8b(), 1, budget), expected);
    let plan = WeightOffload::plan(&llama_8b(), &h100(), 1, 1.0).unwrap();
    assert_eq!(plan.bytes, expected);
    assert_eq!(plan.host_link_gbs, 35.2);
    // The step reads them over the host link once: bytes / (GB/s · 1e3) µs.
    let expected_us = expected as f64 / 35.2e3;
    assert!(
        (plan.step_us() - expected_us).abs() < 1e-9,
        "{}",
        plan.step_us()
    );
    // An exact layer boundary stops there: the check is "moved >= budget".
    assert_eq!(offloaded_bytes(&llama_8b(), 1, 3 * LAYER), 3 * LAYER);
    // A budget above the layers moves every layer and nothing else (no embeddings, head).
    assert_eq!(offloaded_bytes(&llama_8b(), 1, u64::MAX), 32 * LAYER);
}

#[test]
fn tensor_parallelism_shards_the_projections_not_the_norms() {
    // Each GPU of a TP 2 group moves half of every projection; the norms are replicated.
    let half = QKV / 2 + O / 2 + GATE_UP / 2 + DOWN / 2 + 2 * NORM;
    assert_eq!(offloaded_bytes(&llama_8b(), 2, 4 * half), 4 * half);
    assert_eq!(
        offloaded_bytes(&llama_8b(), 2, 4 * half + 1),
        4 * half + QKV / 2
    );
}

#[test]
fn an_moe_layer_moves_its_router_then_its_fused_experts() {
    // Mixtral-8x7B's shape: 8 experts of 14336, hidden 4096, GQA 32/8, bf16, at TP 2.
    let mut arch = llama_8b();
    arch.num_experts = 8;
    arch.experts_per_tok = 2;
    let router = 4096 * 8 * 2;
    let w13 = 8 * 2 * 14336 * 4096 * 2 / 2;
    let w2 = 8 * 14336 * 4096 * 2 / 2;
    let attention = QKV / 2 + O / 2;
    // Just past the attention and router: the fused w13 of all eight experts moves whole.
    assert_eq!(
        offloaded_bytes(&arch, 2, attention + router + 1),
        attention + router + w13
    );
    let layer = attention + router + w13 + w2 + 2 * NORM;
    assert_eq!(offloaded_bytes(&arch, 2, layer), layer);
}

#[test]
fn bad_values_are_refused_naming_the_field() {
    for value in [-1.0, f64::NAN, f64::INFINITY] {
        let err = WeightOffload::plan(&llama_8b(), &h100(), 1, value).unwrap_err();
        assert!(matches!(err, OffloadError::Invalid { .. }), "{err:?}");
        assert!(err.to_string().contains("cpu_offload_gb"), "{err}");
    }
    // Llama-3.1-8B's decoder layers, all vLLM offers the offloader, are 32 x 436 MB = 13.0005
    // GiB: 13 GiB moves all but the last layer's two norms (the budget is reached before
    // them); 13.1 on one GPU or 6.6 on each of two is more than there is to move.
    assert_eq!(
        WeightOffload::plan(&llama_8b(), &h100(), 1, 13.0)
            .unwrap()
            .bytes,
        32 * LAYER - 2 * NORM
    );
    for (tp, value) in [(1, 13.1), (2, 6.6)] {
        let err = WeightOffload::plan(&llama_8b(), &h100(), tp, value).unwrap_err();
        assert!(
            matches!(err, OffloadError::MoreThanWeights { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("cpu_offload_gb"), "{err}");
    }
    let mut no_link = h100();
    no_link.host_link_gbs = 0.0;
    let err = WeightOffload::plan(&llama_8b(), &no_link, 1, 1.0).unwrap_err();
    assert!(matches!(err, OffloadError::NoHostLink { .. }), "{err:?}");
}

#[test]
fn every_priced_model_adds_the_host_link_time_to_every_step() {
    // Goal: the hook adds the term, and only the term, in each model and on each path (a
    // batch entry by entry, a decode count with its context, a kept decode-step pricer).
    // Method: the same batches priced with and without 2 GiB offloaded.
    let (arch, gpu) = (llama_8b(), h100());
    let plan = WeightOffload::plan(&arch, &gpu, 1, 2.0).unwrap();
    let term = plan.step_us();
    assert!(term > 50_000.0, "2 GiB over ~35 GB/s is ~60 ms, got {term}");
    let shipped = CalibratedCoefficients::ROOFLINE;
    let physics = PhysicsCoefficients {
        alpha: [0.0; 3],
        beta: vec![1.0; 10],
    };
    let models = [
        LatencyModel::Calibrated(CalibratedModel::new(&arch, &gpu, 1, &shipped).unwrap()),
        LatencyModel::Roofline(RooflineModel::try_new(&arch, &gpu, 1).unwrap()),
        LatencyModel::Physics(PhysicsModel::new(&arch, &gpu, 1, physics).unwrap()),
    ];
    let batch: Vec<BatchEntry> = (0..24).map(|i| decode(300 + 17 * i)).collect();
    let context: u64 = batch.iter().map(|e| u64::from(e.context_tokens)).sum();
    for model in models {
        let offloaded = model.clone().with_weight_offload(&plan).unwrap();
        let (base, slow) = (model.step_us(&batch), offloaded.step_us(&batch));
        let added = (slow - base) as f64;
        assert!(
            (added - term).abs() <= 1.0,
            "{:?}: {added} vs {term}",
            model.kind()
        );
        if let Some(aggregate) = offloaded.step_with_decodes_us(&[], 24, context) {
            assert_eq!(aggregate, slow, "{:?}", model.kind());
            let mut kept = None;
            let kept_step = offloaded.decode_step_us(&mut kept, 24, context);
            assert_eq!(kept_step, Some(slow), "{:?}", model.kind());
        }
        // No offload leaves the model as it was, to the bit.
        assert_eq!(
            model.clone().with_weight_offload(&WeightOffload::NONE),
            Ok(model)
        );
    }
}

#[test]
fn blackbox_cannot_price_an_offload() {
    let model = LatencyModel::Blackbox(BlackboxCoefficients {
        alpha: [0.0; 3],
        beta: [1000.0, 1.0, 1.0],
    });
    let plan = WeightOffload::plan(&llama_8b(), &h100(), 1, 1.0).unwrap();
    let err = model.clone().with_weight_offload(&plan).unwrap_err();
    assert!(
        matches!(err, OffloadError::Unpriced { kind: "blackbox" }),
        "{err:?}"
    );
    assert_eq!(
        model.clone().with_weight_offload(&WeightOffload::NONE),
        Ok(model)
    );
}
