//! The offline case: the BLIS reference run (llama-3.1-8b-instruct on one H100, TP1,
//! roofline, Poisson 20 req/s, prompts and outputs gaussian 512 ± 256 in [2, 7000], 26,312
//! GPU blocks), its engine and requests shared with the criterion bench `sim_reference`,
//! and the case that times it at each size.

use std::fmt::Write as _;
use std::time::Instant;

use super::BenchError;
use super::process::peak_rss_mb;
use crate::catalog;
use crate::sim::latency::LatencyKind;
use crate::sim::{Engine, EngineConfig, SimError};
use crate::workload::{ArrivalProcess, LengthDist, WorkloadError, WorkloadGenerator, WorkloadSpec};

/// GPU blocks of llama-3.1-8b-instruct on one H100 at 0.9 utilisation.
pub const REFERENCE_BLOCKS: u32 = 26_312;

/// The reference run's requests (seed 42); the workload's own validation error if it
/// refuses `num_requests`.
pub fn reference_requests(num_requests: u64) -> Result<WorkloadGenerator, WorkloadError> {
    let spec = WorkloadSpec::single_client(
        42,
        num_requests,
        20.0,
        ArrivalProcess::Poisson,
        LengthDist::gaussian(512.0, 256.0, 2, 7000),
        LengthDist::gaussian(512.0, 256.0, 2, 7000),
    );
    spec.generator()
}

/// The reference run's engine: llama-3.1-8b-instruct, H100, TP1, roofline, vLLM defaults,
/// keeping a record per request.
pub fn reference_engine() -> Result<Engine, SimError> {
    reference_engine_keeping(true)
}

/// [`reference_engine`] as `ditto run` runs it without per-request output: keeping only the
/// summary's samples (what the offline bench measures).
pub fn offline_reference_engine() -> Result<Engine, SimError> {
    reference_engine_keeping(false)
}

fn reference_engine_keeping(records: bool) -> Result<Engine, SimError> {
    let arch = catalog::model("llama-3.1-8b-instruct").map_err(config_error)?;
    let gpu = catalog::gpu("H100").map_err(config_error)?;
    let latency =
        catalog::latency_model(LatencyKind::Roofline, &arch, &gpu, 1).map_err(config_error)?;
    let mut config = EngineConfig::vllm_defaults(REFERENCE_BLOCKS, arch.max_position_embeddings);
    config.kv_sample_interval_us = 0;
    config.keep_request_records = records;
    Engine::new(config, latency)
}

fn config_error(err: impl std::fmt::Display) -> SimError {
    SimError::InvalidState {
        field: "catalog",
        reason: err.to_string(),
    }
}

/// The offline case: the reference run at each of `sizes` (each at least 1), after an
/// untimed warm-up, with per-request, per-event and per-step costs.
pub(super) fn offline_case(out: &mut String, sizes: &[u64]) -> Result<(), BenchError> {
    let _ = writeln!(
        out,
        "\n== offline: BLIS reference run (llama-3.1-8b-instruct, H100, TP1, roofline, 20 req/s), after an untimed warm-up run"
    );
    let _ = writeln!(
        out,
        "{:>10} {:>9} {:>12} {:>12} {:>13} {:>11} {:>9} {:>9} {:>12}",
        "requests",
        "wall s",
        "req/s",
        "steps/s",
        "events/s",
        "µs/request",
        "µs/event",
        "µs/step",
        "peak RSS MB"
    );
    // One untimed run first: the first simulation in a process pays one-time costs (page
    // faults of fresh memory, the embedded catalog's parse) that are not per-request work.
    let warm_up = sizes.first().map_or(10_000, |&size| size.min(10_000));
    offline_reference_engine()?.run(reference_requests(warm_up)?, u64::MAX)?;
    let mut per_request = Vec::new();
    for &size in sizes {
        let mut engine = offline_reference_engine()?;
        let started = Instant::now();
        engine.run(reference_requests(size)?, u64::MAX)?;
        let wall = started.elapsed().as_secs_f64();
        let counts = engine.counts();
        let us_per_request = wall * 1e6 / size as f64;
        per_request.push(us_per_request);
        let events = engine.events_processed().max(1) as f64;
        let steps = counts.steps.max(1) as f64;
        let _ = writeln!(
            out,
            "{size:>10} {wall:>9.3} {:>12.0} {:>12.0} {:>13.0} {us_per_request:>11.2} {:>9.3} {:>9.3} {:>12}",
            size as f64 / wall,
            counts.steps as f64 / wall,
            engine.events_processed() as f64 / wall,
            wall * 1e6 / events,
            wall * 1e6 / steps,
            peak_rss_mb().map_or("n/a".to_owned(), |mb| format!("{mb:.0}"))
        );
    }
    if let (Some(first), Some(last)) = (per_request.first(), per_request.last()) {
        let _ = writeln!(
            out,
            "per-request cost, largest run / smallest run: {:.2}x",
            last / first
        );
    }
    Ok(())
}
