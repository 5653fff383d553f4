//! The calibrated model's unloaded TTFT parts against the engine: one request on an idle
//! server gets exactly the TTFT the parts add up to, on every GPU and TP degree.
#![allow(clippy::unwrap_used)]

use ditto::catalog;
use ditto::sim::latency::{CalibratedModel, LatencyModel};
use ditto::sim::{Engine, EngineConfig, RequestId, RequestSpec};

#[test]
fn an_idle_servers_ttft_is_the_sum_of_its_parts() {
    // Goal: `CalibratedModel::unloaded_ttft` is what the engine simulates (front end,
    // scheduler step, prefill chunks, first token's streaming path), not a separate story.
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
