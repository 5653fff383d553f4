//! The calibrated model's waiting-queue term against the engine: every step, whether the
//! step-by-step path or a lazy decode window forms it, costs `waiting_us` per request left
//! waiting in the queue (up to `waiting_cap`), and nothing when nobody waits.
#![allow(clippy::unwrap_used)]

use ditto::catalog;
use ditto::sim::latency::calibrated::idx;
use ditto::sim::latency::{CalibratedCoefficients, CalibratedModel, LatencyModel};
use ditto::sim::{Engine, EngineConfig, RequestSpec};

const WAITING_US: f64 = 50.0;

/// Ends of `requests` (by id) on Llama-2-7b / H100 with one seat, the shipped coefficients
/// and the waiting term set to (`waiting_us`, `cap`); with the reference stepper or not.
fn ends(requests: &[RequestSpec], waiting_us: f64, cap: f64, reference: bool) -> Vec<u64> {
    let mut coefficients: CalibratedCoefficients = catalog::calibrated_coefficients().unwrap();
    coefficients.values[idx::WAITING_US] = waiting_us;
    coefficients.values[idx::WAITING_CAP] = cap;
    let arch = catalog::model("llama-2-7b-hf").unwrap();
    let gpu = catalog::gpu("H100").unwrap();
    let model = CalibratedModel::new(&arch, &gpu, 1, &coefficients).unwrap();
    let mut config = EngineConfig::vllm_defaults(10_000, 8192);
    config.kv_sample_interval_us = 0;
    config.max_num_seqs = 1;
    let mut engine = Engine::new(config, LatencyModel::Calibrated(model)).unwrap();
    engine.set_reference_stepper(reference);
    engine.run(requests.iter().cloned(), 1_000_000).unwrap();
    let mut records: Vec<_> = engine.metrics().records.iter().collect();
    records.sort_by_key(|record| record.id);
    records.iter().map(|record| record.end_us).collect()
}

#[test]
fn every_step_pays_for_the_requests_left_waiting() {
    // Goal: the engine adds `waiting_us · min(waiting, cap)` to each step, counting the
    // requests still in the queue once the step is formed, on the lazy path as on the
    // reference stepper. Method: five requests at once, one seat: request k runs its four
    // steps (a prefill and three decodes) while 4 − k wait; with the cap at 3 each of its
    // steps costs 50·min(4 − k, 3) µs more, so the ends shift by the running sums.
    let burst: Vec<RequestSpec> = (0..5)
        .map(|id| RequestSpec::synthetic(id, 0, 100, 4))
        .collect();
    let off = ends(&burst, 0.0, 0.0, false);
    let on = ends(&burst, WAITING_US, 3.0, false);
    let shift: Vec<u64> = off.iter().zip(&on).map(|(a, b)| b - a).collect();
    let per_step = |waiting: u64| 4 * 50 * waiting.min(3);
    let mut expected = Vec::new();
    let mut sum = 0;
    for k in 0..5u64 {
        sum += per_step(4 - k);
        expected.push(sum);
    }
    assert_eq!(shift, expected);
    assert_eq!(on, ends(&burst, WAITING_US, 3.0, true), "lazy vs reference");
    assert_eq!(off, ends(&burst, WAITING_US, 0.0, false), "cap 0 is off");
}

#[test]
fn nothing_changes_without_a_queue() {
    // Goal: an unloaded server (each request done before the next arrives) is priced as
    // without the term. Method: five requests one second apart.
    let spaced: Vec<RequestSpec> = (0..5)
        .map(|id| RequestSpec::synthetic(id, id * 1_000_000, 100, 4))
        .collect();
    assert_eq!(
        ends(&spaced, 0.0, 0.0, false),
        ends(&spaced, WAITING_US, 1000.0, false)
    );
}
