//! A replica's capacity for the predictive policy: the highest Poisson arrival rate one
//! instance serves with the objectives met for the target share of requests, found by a
//! short calibration simulation per candidate rate (doubling, then bisection). Bounded:
//! at most [`CALIBRATION_RUNS`] runs of [`CALIBRATION_S`] simulated seconds each.

use rand_core::Rng;

use super::config::Objectives;
use crate::cluster::config::InstanceConfig;
use crate::sim::metrics::Outcome;
use crate::sim::rng::RngStreams;
use crate::sim::{Engine, EngineConfig, RequestSpec, SimError};

/// Simulated seconds of each calibration run.
pub const CALIBRATION_S: f64 = 180.0;
/// Most calibration runs.
pub const CALIBRATION_RUNS: usize = 24;
/// Highest rate tried, req/s.
const RATE_MAX: f64 = 2_000.0;

/// The share of requests meeting `objectives` on one `instance` under Poisson arrivals at
/// `rate` for [`CALIBRATION_S`] seconds, lengths cycling through `lengths`; the requests of
/// the first fifth of the run (the cold start) are not judged.
pub fn attainment_at(
    instance: &InstanceConfig,
    lengths: &[(u32, u32)],
    objectives: Objectives,
    rate: f64,
    seed: u64,
) -> Result<f64, SimError> {
    let config = EngineConfig {
        keep_request_records: true,
        kv_sample_interval_us: 0,
        ..instance.engine.clone()
    };
    let mut engine = Engine::new(config, instance.latency.clone())?;
    let mut rng = RngStreams::new(seed).stream("autoscale-capacity");
    let end_us = (CALIBRATION_S * 1e6) as u64;
    let mut requests = Vec::new();
    let mut at = 0.0f64;
    let mut id = 0u64;
    if lengths.is_empty() {
        return Ok(1.0);
    }
    loop {
        let unit = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        at += -unit.ln() / rate * 1e6;
        if at >= end_us as f64 {
            break;
        }
        let (input, output) = lengths[id as usize % lengths.len()];
        requests.push(RequestSpec::synthetic(id, at as u64, input, output));
        id += 1;
    }
    engine.run(requests, u64::MAX)?;
    let judged_from = end_us / 5;
    let (mut judged, mut met) = (0u64, 0u64);
    for record in &engine.metrics().records {
        if record.arrival_us < judged_from {
            continue;
        }
        judged += 1;
        if record.outcome == Outcome::Completed && meets(record, objectives) {
            met += 1;
        }
    }
    Ok(if judged == 0 {
        1.0
    } else {
        met as f64 / judged as f64
    })
}

/// Whether a completed record meets the objectives (TPOT is not judged for one token).
pub fn meets(record: &crate::sim::RequestRecord, objectives: Objectives) -> bool {
    let ttft_ok = record
        .ttft_us()
        .is_some_and(|t| t as f64 <= objectives.ttft_us);
    let tpot_ok = record.tpot_us().is_none_or(|t| t <= objectives.tpot_us);
    ttft_ok && tpot_ok
}

/// The highest rate (req/s) at which one instance's attainment is at least `target`.
pub fn calibrate(
    instance: &InstanceConfig,
    lengths: &[(u32, u32)],
    objectives: Objectives,
    target: f64,
    seed: u64,
) -> Result<f64, SimError> {
    let mut runs = 0usize;
    let ok = |rate: f64, runs: &mut usize| -> Result<bool, SimError> {
        *runs += 1;
        Ok(attainment_at(instance, lengths, objectives, rate, seed)? >= target)
    };
    let (mut low, mut high) = (0.0f64, 0.5f64);
    while high < RATE_MAX && runs < CALIBRATION_RUNS / 2 {
        if !ok(high, &mut runs)? {
            break;
        }
        low = high;
        high *= 2.0;
    }
    while runs < CALIBRATION_RUNS && high - low > 0.02 * high.max(0.1) {
        let mid = 0.5 * (low + high);
        if ok(mid, &mut runs)? {
            low = mid;
        } else {
            high = mid;
        }
    }
    Ok(low.max(0.01))
}
