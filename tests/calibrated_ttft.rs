//! The calibrated model's unloaded TTFT parts against the engine: one request on an idle
//! server gets exactly the TTFT the parts add up to, on every GPU and TP degree.
#![allow(clippy::unwrap_used)]

use ditto::catalog;
use ditto::sim::latency::{BatchEntry, CalibratedModel, LatencyModel};
use ditto::sim::{Engine, EngineConfig, RequestId, RequestSpec};

#[test]
fn an_idle_servers_ttft_is_the_sum_of_its_parts() {
    // Goal: `CalibratedModel::unloaded_ttft` is what the engine simulates (front end,
    // scheduler step, prefill chunks, the first token's decode step and streaming path), not
    // a separate story.
    // Method: the shipped coefficients, one request per engine, prompts below and above the
    // chunk budget, TP 1 and 4, H100 and L40S (a PCIe GPU).
    let coefficients = catalog::calibrated_coefficients().unwrap();
    let arch = catalog::model("llama-2-7b-hf").unwrap();
    for (gpu, tp, prompt) in [("H100", 1, 600), ("H100", 4, 3000), ("L40S", 2, 600)] {
        let gpu_spec = catalog::gpu(gpu).unwrap();
        let model = CalibratedModel::new(&arch, &gpu_spec, tp, &coefficients).unwrap();
        let mut config = EngineConfig::vllm_defaults(10_000, 8192);
        config.kv_sample_interval_us = 0;
        let parts = model.unloaded_ttft(prompt, config.max_num_batched_tokens);
        let mut engine = Engine::new(config, LatencyModel::Calibrated(model)).unwrap();
        engine
            .run([RequestSpec::synthetic(0, 0, prompt, 4)], 1_000_000)
            .unwrap();
        let record = engine
            .metrics()
            .records
            .iter()
            .find(|r| r.id == RequestId(0))
            .unwrap();
        assert_eq!(
            record.ttft_us(),
            Some(parts.total_us()),
            "{gpu} tp {tp}: {parts:?}"
        );
        assert!(parts.front_end_us > 0 && parts.prefill_us > 0 && parts.scheduler_us > 0);
    }
}

#[test]
fn the_first_tokens_step_reads_the_whole_batchs_kv() {
    // Goal: the decode step a first token waits for is priced with the KV the step that
    // made it leaves behind (every sequence's context), not with the batch size alone: at
    // 90 sequences of Llama-2-7b's 0.5 MB a token that is half the step (docs/fidelity.md,
    // "Unloaded TTFT, part by part").
    // Method: three requests of 600 tokens arrive together and are prefilled in one step;
    // each sees front end + that step + the delay of a batch of three holding 1,800 tokens
    // + the per-token time, and that delay is dearer than the same batch's without context.
    let coefficients = catalog::calibrated_coefficients().unwrap();
    let arch = catalog::model("llama-2-7b-hf").unwrap();
    let gpu = catalog::gpu("H100").unwrap();
    let model = CalibratedModel::new(&arch, &gpu, 1, &coefficients).unwrap();
    let latency = LatencyModel::Calibrated(model.clone());
    let prefill = BatchEntry {
        context_tokens: 0,
        new_tokens: 600,
        prompt_tokens: 600,
        is_prefill: true,
    };
    let step = latency.step_us(&[prefill; 3]);
    let delay = model.first_token_delay_us(3, 1_800);
    assert!(delay > model.first_token_delay_us(3, 0) + 200, "{delay}");
    let expected = model.queueing_us(600) + step + delay + model.output_token_us();
    let mut config = EngineConfig::vllm_defaults(10_000, 8192);
    config.kv_sample_interval_us = 0;
    let mut engine = Engine::new(config, latency).unwrap();
    let requests = (0..3).map(|id| RequestSpec::synthetic(id, 0, 600, 4));
    engine.run(requests, 1_000_000).unwrap();
    let records = &engine.metrics().records;
    assert_eq!(records.len(), 3);
    for record in records {
        assert_eq!(record.ttft_us(), Some(expected), "{record:?}");
    }
}

#[test]
fn a_first_token_made_beside_a_decode_window_counts_the_windows_kv() {
    // Goal: a request whose first token is made in a lazy decode window's step (its prefill
    // beside the window's members) is delayed by the same decode step, members' KV included,
    // as the reference stepper prices it from the whole batch (docs/fidelity.md, "Unloaded
    // TTFT, part by part"). Method: two long decoders, then a newcomer arriving while they
    // decode in a window; the fast engine against the reference stepper, and the window
    // must have run a mixed step.
    let coefficients = catalog::calibrated_coefficients().unwrap();
    let arch = catalog::model("llama-2-7b-hf").unwrap();
    let gpu = catalog::gpu("H100").unwrap();
    let run = |reference: bool| {
        let model = CalibratedModel::new(&arch, &gpu, 1, &coefficients).unwrap();
        let mut config = EngineConfig::vllm_defaults(10_000, 8192);
        config.kv_sample_interval_us = 0;
        let mut engine = Engine::new(config, LatencyModel::Calibrated(model)).unwrap();
        engine.set_reference_stepper(reference);
        let requests = [
            RequestSpec::synthetic(0, 0, 1_500, 600),
            RequestSpec::synthetic(1, 0, 1_200, 600),
            RequestSpec::synthetic(2, 400_000, 300, 8),
        ];
        engine.run(requests, 10_000_000).unwrap();
        engine
    };
    let (fast, reference) = (run(false), run(true));
    assert!(
        fast.mixed_lazy_steps() > 0,
        "no first token beside a window"
    );
    let ttft = |engine: &Engine| {
        let records = &engine.metrics().records;
        records
            .iter()
            .find(|r| r.id == RequestId(2))
            .unwrap()
            .ttft_us()
    };
    assert_eq!(ttft(&fast), ttft(&reference));
    assert_eq!(fast.metrics().records, reference.metrics().records);
}

#[test]
fn the_first_token_waits_one_decode_step_of_the_model_at_hand() {
    // Goal: the part of an unloaded TTFT that grows with the model is that model's decode
    // step (docs/fidelity.md, "Unloaded TTFT, part by part"): the front end is the same for
    // every model, the first token's part is one decode step of the model and GPU at hand.
    // Method: the shipped coefficients; Llama-2-7b at TP 1 against Llama-2-70b at TP 4 on
    // H100, and Llama-2-7b on H100 against L40S (a third of H100's bandwidth).
    let coefficients = catalog::calibrated_coefficients().unwrap();
    let parts = |model: &str, gpu: &str, tp: u32| {
        let arch = catalog::model(model).unwrap();
        let gpu_spec = catalog::gpu(gpu).unwrap();
        let model = CalibratedModel::new(&arch, &gpu_spec, tp, &coefficients).unwrap();
        (
            model.unloaded_ttft(600, 2048),
            model.first_token_delay_us(1, 600),
        )
    };
    let (small, small_delay) = parts("llama-2-7b-hf", "H100", 1);
    let (large, large_delay) = parts("llama-2-70b-hf", "H100", 4);
    let (slow, _) = parts("llama-2-7b-hf", "L40S", 1);
    assert_eq!(small.front_end_us, large.front_end_us);
    assert_eq!(small.first_token_us, small_delay);
    assert_eq!(large.first_token_us, large_delay);
    // A decode step is a weight read: 13.5 GB on one H100 (~5 ms at peak), 34.5 GB per GPU
    // at TP 4 (~13 ms at peak).
    assert!((4_000..9_000).contains(&small.first_token_us), "{small:?}");
    assert!(
        large.first_token_us > 2 * small.first_token_us,
        "{small:?} {large:?}"
    );
    assert!(slow.first_token_us > 2 * small.first_token_us, "{slow:?}");
}
