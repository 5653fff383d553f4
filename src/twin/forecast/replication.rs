//! One candidate replication of a capacity forecast: its workload, the cluster run under
//! the event budget, and what it measured; the summaries over replications.

use crate::cluster::Cluster;
use crate::cluster::config::{ClusterConfig, InstanceConfig};
use crate::sim::driver::{self, Supervisor};
use crate::sim::engine::RestoreState;
use crate::sim::metrics::{LatencyStats, Outcome, RequestRecord, percentile_of_counts};
use crate::sim::{Engine, RequestSpec};
use crate::workload::{ArrivalProcess, LengthDraw, WorkloadSpec};

use crate::twin::build::{MIRRORED_ID_BASE, restore_instance};
use crate::twin::error::TwinError;
use crate::twin::question::{
    Distribution, ForecastCandidate, ForecastQuestion, ForecastStart, QuantileValue, SloTargets,
};
use crate::twin::run::{EventBudget, run_until_done};
use crate::twin::sampling::{output_draw, replication_seed, stream};
use crate::twin::snapshot::MirrorSnapshot;
use crate::twin::stats::{distribution, mean_with_ci};

/// Most replicas of one variant a forecast may evaluate.
pub const REPLICAS_MAX: u32 = 512;

/// One replication's measurements.
#[derive(Clone, Debug, Default)]
pub(super) struct Replication {
    ttft_ms: Vec<f64>,
    e2e_ms: Vec<f64>,
    gaps_us: std::collections::HashMap<u64, u64>,
    attainment: f64,
    /// Fraction of requests meeting the TTFT objective (the prefill side of a P/D split).
    pub(super) ttft_attainment: f64,
    /// Fraction meeting the TPOT and end-to-end objectives (the decode side).
    pub(super) decode_attainment: f64,
    max_queue_depth: u64,
    kv_usage_mean: f64,
    throughput_rps: f64,
}

/// Runs every replication of each of `batch`'s candidates (in parallel); their
/// replications, candidate by candidate.
pub(super) fn evaluate(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
    templates: &[usize],
    batch: &[Vec<u32>],
    budget: &EventBudget,
) -> Result<Vec<Vec<Replication>>, TwinError> {
    let jobs: Vec<(usize, u32)> = (0..batch.len())
        .flat_map(|c| (0..question.replications).map(move |r| (c, r)))
        .collect();
    let results = crate::twin::parallel::map(&jobs, |&(c, r)| {
        run_replication(snapshot, question, templates, &batch[c], r, budget)
    });
    let mut results = results.into_iter();
    let mut out = Vec::with_capacity(batch.len());
    for _ in batch {
        let reps: Vec<Replication> = results
            .by_ref()
            .take(question.replications as usize)
            .collect::<Result<_, _>>()?;
        out.push(reps);
    }
    Ok(out)
}

fn run_replication(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
    templates: &[usize],
    counts: &[u32],
    replication: u32,
    budget: &EventBudget,
) -> Result<Replication, TwinError> {
    if super::pd_cluster::is_disaggregated(snapshot, templates) {
        let seed = replication_seed(question.seed, replication);
        let mut cluster = super::pd_cluster::idle_cluster(snapshot, templates, counts, seed)?;
        // From idle instances at time 0 (the mirrored clock would make the cluster tick
        // through every refresh interval since the epoch).
        run_cluster(&mut cluster, forecast_workload(question, seed)?, budget)?;
        return Ok(measure(&cluster, &question.slo, 0));
    }
    let now = question.now_us;
    let outputs = output_draw(snapshot)?;
    let mut instances = Vec::new();
    let mut engines = Vec::new();
    let mut rerouted: Vec<RequestSpec> = Vec::new();
    for (variant, (&template, &count)) in templates.iter().zip(counts).enumerate() {
        let template_config = &snapshot.config.instances[template];
        let existing: Vec<usize> = match question.start {
            ForecastStart::Empty => Vec::new(),
            ForecastStart::Snapshot => (0..snapshot.config.instances.len())
                .filter(|&i| same_variant(&snapshot.config.instances[i], template_config))
                .collect(),
        };
        for k in 0..count as usize {
            let mut config = template_config.clone();
            config.id = format!("{}#{k}", template_config.id);
            config.engine.kv_sample_interval_us = 0;
            let engine = match existing.get(k) {
                Some(&index) => {
                    let mut engine = restored(
                        snapshot,
                        &config,
                        index,
                        &outputs,
                        question.seed,
                        replication,
                    )?;
                    // Roll forward to `now` within the call's budget and deadline.
                    run_until_done(&mut engine, now, budget)?;
                    engine.run_until(now);
                    engine
                }
                None => Engine::restore(
                    config.engine.clone(),
                    config.latency.clone(),
                    RestoreState {
                        now_us: now,
                        ..RestoreState::default()
                    },
                )
                .map_err(|err| {
                    TwinError::invalid(format!("variants[{variant}]"), err.to_string())
                })?,
            };
            instances.push(config);
            engines.push(engine);
        }
        for &index in existing.iter().skip(count as usize) {
            let engine = restored(
                snapshot,
                template_config,
                index,
                &outputs,
                question.seed,
                replication,
            )?;
            let observed = engine.observe();
            for request in observed.running.into_iter().chain(observed.waiting) {
                let mut spec = request.spec;
                spec.arrival_us = now;
                spec.output_tokens = spec.output_tokens.saturating_sub(request.generated).max(1);
                rerouted.push(spec);
            }
        }
    }
    let config = ClusterConfig {
        instances,
        routing: snapshot.config.routing.clone(),
        admission: snapshot.config.admission,
        staleness: snapshot.config.staleness,
    };
    let seed = replication_seed(question.seed, replication);
    let mut cluster = Cluster::from_engines(config, engines, seed);
    let workload = forecast_workload(question, seed)?;
    let arrivals = rerouted.into_iter().chain(workload.map(move |mut spec| {
        spec.arrival_us += now;
        spec
    }));
    run_cluster(&mut cluster, arrivals, budget)?;
    Ok(measure(&cluster, &question.slo, now))
}

/// Mirrored instance `index` restored as `config` says, its unknown output lengths drawn
/// from the replication's stream for that instance.
fn restored(
    snapshot: &MirrorSnapshot,
    config: &InstanceConfig,
    index: usize,
    outputs: &LengthDraw,
    seed: u64,
    replication: u32,
) -> Result<Engine, TwinError> {
    let mut rng = stream(seed, replication, &format!("twin/forecast/outputs/{index}"));
    restore_instance(
        config,
        &snapshot.instances[index],
        index,
        outputs,
        &mut rng,
        &format!("instances[{index}]"),
    )
}

fn forecast_workload(
    question: &ForecastQuestion,
    seed: u64,
) -> Result<crate::workload::WorkloadGenerator, TwinError> {
    let mut spec = WorkloadSpec::single_client(
        seed,
        1,
        1.0,
        ArrivalProcess::Poisson,
        question.input_tokens.clone(),
        question.output_tokens.clone(),
    );
    spec.num_requests = None;
    spec.rate = None;
    spec.stages = Some(question.stages.clone());
    spec.generator()
        .map_err(|err| TwinError::invalid("stages", err.to_string()))
}

/// Cluster events (or arrivals) between budget, deadline and cancellation checks: a cluster
/// event can be slow under a deep queue, so the checks come often enough that a cancelled
/// forecast stops within milliseconds.
const CLUSTER_CHUNK_EVENTS: u64 = 512;

/// Runs a cluster over `arrivals` until idle, within the call's budget and deadline.
fn run_cluster(
    cluster: &mut Cluster,
    arrivals: impl Iterator<Item = RequestSpec>,
    budget: &EventBudget,
) -> Result<(), TwinError> {
    driver::drive(
        cluster,
        arrivals,
        u64::MAX,
        u64::MAX,
        &mut ClusterSupervisor { budget },
    )?;
    Ok(())
}

/// A forecast replication's cluster run under its call's [`EventBudget`].
struct ClusterSupervisor<'a> {
    budget: &'a EventBudget,
}

impl Supervisor<Cluster> for ClusterSupervisor<'_> {
    type Error = TwinError;
    const CHECK_EVERY: u64 = CLUSTER_CHUNK_EVENTS;

    fn check_events(&mut self, processed: u64) -> Result<(), TwinError> {
        self.budget.charge(CLUSTER_CHUNK_EVENTS, processed)
    }

    fn check_arrivals(&mut self, processed: u64) -> Result<(), TwinError> {
        self.budget.check(processed)
    }

    fn refused(&mut self, err: crate::sim::SimError) -> TwinError {
        TwinError::invalid("workload", err.to_string())
    }
}

fn measure(cluster: &Cluster, slo: &SloTargets, now: u64) -> Replication {
    let records = cluster.client_records();
    let mut window: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.id.0 < MIRRORED_ID_BASE)
        .collect();
    window.extend(
        cluster
            .rejected_records()
            .iter()
            .filter(|r| r.id.0 < MIRRORED_ID_BASE),
    );
    let ms = |us: u64| us as f64 / 1000.0;
    let mut replication = Replication::default();
    let mut met = 0usize;
    let (mut ttft_met, mut decode_met) = (0usize, 0usize);
    let mut completed = 0usize;
    for record in &window {
        if record.outcome != Outcome::Completed {
            continue;
        }
        completed += 1;
        let ttft = record.ttft_us().map_or(0.0, ms);
        let e2e = record.e2e_us().map_or(0.0, ms);
        let tpot = record.tpot_us().unwrap_or(0.0) / 1000.0;
        replication.ttft_ms.push(ttft);
        replication.e2e_ms.push(e2e);
        let ttft_ok = slo.ttft_ms.is_none_or(|t| ttft <= t);
        let decode_ok =
            slo.tpot_ms.is_none_or(|t| tpot <= t) && slo.e2e_ms.is_none_or(|t| e2e <= t);
        met += usize::from(ttft_ok && decode_ok);
        ttft_met += usize::from(ttft_ok);
        decode_met += usize::from(decode_ok);
    }
    let share = |n: usize| {
        if window.is_empty() {
            1.0
        } else {
            n as f64 / window.len() as f64
        }
    };
    replication.attainment = share(met);
    replication.ttft_attainment = share(ttft_met);
    replication.decode_attainment = share(decode_met);
    for engine in cluster.engines() {
        for (&gap, &count) in &engine.metrics().token_gap_counts {
            *replication.gaps_us.entry(gap).or_insert(0u64) += count;
        }
        replication.max_queue_depth = replication
            .max_queue_depth
            .max(engine.metrics().queue_depth_peak);
        replication.kv_usage_mean += engine.metrics().kv_usage.mean(cluster.now_us());
    }
    replication.kv_usage_mean /= cluster.engines().len().max(1) as f64;
    let span_s = cluster.now_us().saturating_sub(now) as f64 / 1e6;
    replication.throughput_rps = if span_s > 0.0 {
        completed as f64 / span_s
    } else {
        0.0
    };
    replication
}

pub(super) fn summarize(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
    templates: &[usize],
    counts: &[u32],
    reps: &[Replication],
) -> ForecastCandidate {
    let pooled = |f: fn(&Replication) -> &Vec<f64>| -> Vec<f64> {
        reps.iter().flat_map(|r| f(r).iter().copied()).collect()
    };
    let attainments: Vec<f64> = reps.iter().map(|r| r.attainment).collect();
    let (attainment, ci) = mean_with_ci(&attainments);
    let n = reps.len().max(1) as f64;
    let replicas: Vec<(String, u32)> = templates
        .iter()
        .zip(counts)
        .map(|(&t, &c)| (snapshot.config.instances[t].id.clone(), c))
        .collect();
    let cost = templates
        .iter()
        .zip(counts)
        .map(|(&t, &c)| f64::from(c) * snapshot.config.instances[t].cost_per_hour)
        .sum();
    let mut gaps = std::collections::HashMap::new();
    for rep in reps {
        for (&gap, &count) in &rep.gaps_us {
            *gaps.entry(gap).or_insert(0u64) += count;
        }
    }
    let itl = Distribution {
        mean: LatencyStats::from_counts(&gaps).mean,
        quantiles: question
            .quantiles
            .iter()
            .map(|&quantile| QuantileValue {
                quantile,
                value: percentile_of_counts(&gaps, quantile * 100.0) / 1000.0,
            })
            .collect(),
    };
    ForecastCandidate {
        replicas,
        ttft_ms: distribution(&pooled(|r| &r.ttft_ms), &question.quantiles),
        itl_ms: itl,
        e2e_ms: distribution(&pooled(|r| &r.e2e_ms), &question.quantiles),
        slo_attainment: attainment,
        slo_attainment_ci: ci,
        max_queue_depth: reps.iter().map(|r| r.max_queue_depth).max().unwrap_or(0),
        kv_usage_mean: reps.iter().map(|r| r.kv_usage_mean).sum::<f64>() / n,
        throughput_rps: reps.iter().map(|r| r.throughput_rps).sum::<f64>() / n,
        cost_per_hour: cost,
    }
}

/// True if `instance` is configured like `template` (same variant).
pub(super) fn same_variant(instance: &InstanceConfig, template: &InstanceConfig) -> bool {
    instance.role == template.role
        && instance.model == template.model
        && instance.gpu == template.gpu
        && instance.tp == template.tp
        && instance.engine == template.engine
        && instance.latency == template.latency
}
