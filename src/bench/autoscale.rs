//! The autoscaling bench case: a simulated day at 45 req/s on average (a diurnal curve from
//! 15 to 75 req/s, peak at 14:00, 60 s stages, ~3.9 M requests) through an autoscaled pool
//! of llama-3.1-8b-instruct replicas on H100 (roofline), llm-d's default routing, ditto's
//! predictive policy with a fixed per-replica capacity (the calibration is not the case's
//! work), the llm-d guide's HPA behaviour, replicas 1 to 8; shared with the autoscale
//! tests, and timed whole by [`autoscale_case`].

use std::fmt::Write as _;
use std::time::Instant;

use super::BenchError;
use crate::catalog;
use crate::cluster::autoscale::{
    AutoscaleConfig, AutoscaleError, Objectives, Policy, PolicyRun, run_policy,
};
use crate::cluster::config::{
    AdmissionPolicy, ClusterConfig, InstanceConfig, InstanceRole, RoutingPolicy, StalenessConfig,
};
use crate::sim::latency::LatencyKind;
use crate::sim::{EngineConfig, SimError};
use crate::workload::{Diurnal, LengthDist, WorkloadGenerator, WorkloadSpec};

/// Requests per second one replica serves in the case: `capacity::calibrate`'s figure for
/// these lengths and objectives (60.00 req/s), fixed so that the case times the day alone.
pub const DAY_CAPACITY_PER_REPLICA: f64 = 60.0;

/// The case's pool, autoscaler and policy.
pub fn autoscale_day() -> Result<(ClusterConfig, AutoscaleConfig, Policy), SimError> {
    let error = |err: String| SimError::InvalidState {
        field: "catalog",
        reason: err,
    };
    let arch = catalog::model("llama-3.1-8b-instruct").map_err(|e| error(e.to_string()))?;
    let gpu = catalog::gpu("H100").map_err(|e| error(e.to_string()))?;
    let latency = catalog::latency_model(LatencyKind::Roofline, &arch, &gpu, 1)
        .map_err(|e| error(e.to_string()))?;
    let mut engine =
        EngineConfig::vllm_defaults(super::REFERENCE_BLOCKS, arch.max_position_embeddings);
    engine.kv_sample_interval_us = 0;
    let instance = InstanceConfig {
        id: "vllm-0".into(),
        model: arch.name.clone(),
        model_config_json: None,
        gpu: gpu.name.clone(),
        tp: 1,
        role: InstanceRole::Both,
        engine,
        latency,
        cost_per_hour: 4.0,
    };
    let base = ClusterConfig {
        instances: vec![instance],
        routing: RoutingPolicy::llm_d_default(),
        admission: AdmissionPolicy::Always,
        staleness: StalenessConfig::uniform(50_000),
    };
    let objectives = Objectives {
        ttft_us: 500_000.0,
        tpot_us: 50_000.0,
    };
    let mut config = AutoscaleConfig::with_defaults(1, 8, objectives);
    config.initial_replicas = 2;
    let policy = Policy::Predictive {
        horizon_us: 150_000_000,
        utilization: 0.9,
    };
    config.policies = vec![policy.clone()];
    Ok((base, config, policy))
}

/// The day's requests (seed 42; prompts 512 ± 256, outputs 128 ± 64); `duration_s` cuts the day
/// short (the quick bench's half hour), `None` runs it whole.
pub fn autoscale_day_requests(
    duration_s: Option<f64>,
) -> Result<WorkloadGenerator, crate::workload::WorkloadError> {
    let mut spec = WorkloadSpec::single_client(
        42,
        1,
        1.0,
        crate::workload::ArrivalProcess::Poisson,
        LengthDist::gaussian(512.0, 256.0, 2, 7000),
        LengthDist::gaussian(128.0, 64.0, 2, 2048),
    );
    spec.num_requests = None;
    spec.rate = None;
    spec.diurnal = Some(Diurnal {
        trough_rate: 15.0,
        peak_rate: 75.0,
        period_s: 86_400.0,
        peak_at_s: None,
        duration_s,
        step_s: 60.0,
    });
    spec.generator()
}

/// The span a quick run simulates instead of the day: its first half hour (a smoke run).
const QUICK_SPAN_S: f64 = 1_800.0;

/// Runs the day (with `quick`, its first half hour) and appends its row.
pub(super) fn autoscale_case(out: &mut String, quick: bool) -> Result<(), BenchError> {
    let span = if quick {
        "the first half hour of a simulated day"
    } else {
        "a simulated day"
    };
    let _ = writeln!(
        out,
        "\n== autoscale: {span}, diurnal 15-75 req/s (mean 45), llama-3.1-8b-instruct H100 roofline, predictive policy, replicas 1-8 (goal for the day < 10 s)"
    );
    let (base, config, policy) = autoscale_day()?;
    let requests = autoscale_day_requests(quick.then_some(QUICK_SPAN_S))?;
    let started = Instant::now();
    let run = PolicyRun {
        base: &base,
        config: &config,
        policy: &policy,
        capacity: DAY_CAPACITY_PER_REPLICA,
        seed: 42,
        max_events: u64::MAX,
    };
    let outcome = run_policy(&run, requests, &mut |_, _| {}).map_err(|err| match err {
        AutoscaleError::Sim(err) => BenchError::Sim(err),
        AutoscaleError::EventBudget(_) => BenchError::EventBudget(err.to_string()),
    })?;
    let wall = started.elapsed().as_secs_f64();
    let _ = writeln!(
        out,
        "{:>10} {:>9} {:>12} {:>13} {:>11} {:>10} {:>8}",
        "requests", "wall s", "req/s", "events/s", "SLO att.", "replica-h", "up/down"
    );
    let _ = writeln!(
        out,
        "{:>10} {wall:>9.3} {:>12.0} {:>13.0} {:>10.2}% {:>10.1} {:>8}",
        outcome.requests,
        outcome.requests as f64 / wall,
        outcome.events as f64 / wall,
        100.0 * outcome.attainment(),
        outcome.replica_hours,
        format!("{}/{}", outcome.scale_ups, outcome.scale_downs)
    );
    Ok(())
}
