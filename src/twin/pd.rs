//! Routing questions over a prefill/decode pool (docs/disaggregation.md, "The twin").
//!
//! For each decode-serving candidate the `prefix-based-pd-decider` is asked, from the
//! prompt's blocks the decode pod holds, whether a separate prefill is worth it. Where it
//! says no, the candidate's ordinary answer (the monolithic fork, `fork.rs`) is its
//! "decode only" answer. Where it says yes, each (prefill, decode) pair among the candidates
//! is answered on a fork of the two pods as a disaggregated [`Cluster`] (`cluster::sim::pd`:
//! the same model as `ditto run`): the two engines restored as their monolithic forks are,
//! rolled forward to `now`, the request sent to the pinned pair, run to the horizon. A
//! baseline per pod (its fork without the request) measures the impact on each pod's other
//! requests.

use std::collections::BTreeMap;

use crate::catalog;
use crate::cluster::config::{AdmissionPolicy, ClusterConfig, InstanceRole, RoutingPolicy};
use crate::cluster::config::{InstanceConfig, StalenessConfig};
use crate::cluster::disagg::{DisaggConfig, InstanceKv, PdFaults, serves_decode, serves_prefill};
use crate::cluster::{Cluster, PdProgress};
use crate::sim::kv::hash::prompt_block_keys;
use crate::sim::{Engine, Outcome, RequestId};

use super::build::QUESTION_REQUEST_ID;
use super::error::TwinError;
use super::fork::{
    Call, alias_block_keys, candidate_engine, question_request, quiet_baseline, restored_base,
};
use super::outcome::{Forking, ReplicationOutcome, Treatment};
use super::question::{CandidatePrediction, DeciderChoice, PairPrediction};
use super::run::{EventBudget, ForkRun, run_fork, run_until_done};
use super::snapshot::MirrorSnapshot;
use super::summary::summarize;

/// True if questions on `snapshot` are answered for (prefill, decode) pairs: some pod has
/// role prefill, or the config carries a `disaggregation` section.
pub(super) fn is_disaggregated(snapshot: &MirrorSnapshot) -> bool {
    snapshot.settings.disaggregation.is_some()
        || snapshot
            .config
            .instances
            .iter()
            .any(|instance| instance.role == InstanceRole::Prefill)
}

/// What a P/D question asks beyond the monolithic candidates: the decider's choice on each
/// decode-serving candidate and the pairs to fork.
pub(super) struct PdPlan {
    /// Decider choices, in candidate order.
    pub(super) choices: Vec<DeciderChoice>,
    /// (prefill, decode) instance indices, decode pods in candidate order, then prefill pods.
    pub(super) pairs: Vec<(usize, usize)>,
    settings: DisaggConfig,
}

/// Whether a treated candidate is simulated at all.
fn usable(treatment: Treatment) -> bool {
    matches!(treatment, Treatment::RollForward | Treatment::UseLast)
}

/// The decider on each usable decode-serving candidate, and the pairs it asks for.
pub(super) fn plan(
    call: &Call<'_>,
    candidates: &[usize],
    treatments: &[Treatment],
) -> Result<PdPlan, TwinError> {
    let snapshot = call.snapshot;
    let question = call.question;
    let settings = super::transfer::configured(snapshot)?;
    let prompt = question.request.prompt_tokens;
    let mut choices = Vec::new();
    let mut pairs = Vec::new();
    for (position, &decode) in candidates.iter().enumerate() {
        let instance = &snapshot.config.instances[decode];
        if !serves_decode(instance.role) || !usable(treatments[position]) {
            continue;
        }
        let base = restored_base(call, decode, treatments[position])?;
        let mut spec = question_request(question, 0, question.now_us);
        alias_block_keys(&mut spec, &snapshot.instances[decode]);
        let block_size = instance.engine.block_size;
        let hits = if base.kv().prefix_caching() {
            prompt_block_keys(&spec, block_size)
                .iter()
                .take_while(|&&key| base.kv().contains_key(key))
                .count() as u32
        } else {
            0
        };
        let hit_tokens = hits.saturating_mul(block_size).min(prompt);
        let remote = settings.remote_prefill(prompt, hit_tokens);
        choices.push(DeciderChoice {
            decode_instance_id: instance.id.clone(),
            uncached_tokens: prompt - hit_tokens,
            remote_prefill: remote,
        });
        if !remote {
            continue;
        }
        for (other, &prefill) in candidates.iter().enumerate() {
            if prefill != decode
                && serves_prefill(snapshot.config.instances[prefill].role)
                && usable(treatments[other])
            {
                pairs.push((prefill, decode));
            }
        }
    }
    Ok(PdPlan {
        choices,
        pairs,
        settings,
    })
}

/// One replication of one pair, measured.
#[derive(Clone, Debug, Default)]
struct PairOutcome {
    client: ReplicationOutcome,
    prefill_ttft_ms: f64,
    transfer_ms: f64,
    handover_ms: f64,
    prefill_delta_ms: f64,
    decode_delta_ms: f64,
}

/// A pod's fork without the request (see `fork::quiet_baseline`).
type BaselineEnds = std::sync::Arc<super::memo::Baseline>;

/// Each pod's baseline by (pod, replication).
type PodBaselines = BTreeMap<(usize, u32), BaselineEnds>;

/// Answers the plan's pairs (in plan order) and returns the events they took.
pub(super) fn answer_pairs(
    call: &Call<'_>,
    plan: &PdPlan,
    treatment_of: &(dyn Fn(usize) -> Treatment + Sync),
) -> Result<(Vec<PairPrediction>, u64), TwinError> {
    if plan.pairs.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let replications = call.question.options.replications;
    let mut pods: Vec<usize> = plan.pairs.iter().flat_map(|&(p, d)| [p, d]).collect();
    pods.sort_unstable();
    pods.dedup();
    let kv = pods_kv(call.snapshot, &pods)?;
    let (base_of, mut events) = pod_baselines(call, &pods, treatment_of)?;
    let jobs: Vec<(usize, u32)> = (0..plan.pairs.len())
        .flat_map(|position| (0..replications).map(move |r| (position, r)))
        .collect();
    let results = super::parallel::map(&jobs, |&(position, replication)| {
        let (prefill, decode) = plan.pairs[position];
        let fork = PairFork {
            call,
            prefill,
            decode,
            replication,
            kv: [kv[&prefill], kv[&decode]],
            settings: &plan.settings,
            baselines: [
                &base_of[&(prefill, replication)],
                &base_of[&(decode, replication)],
            ],
        };
        fork.simulate(treatment_of(prefill), treatment_of(decode))
    });
    let results: Vec<(PairOutcome, u64)> = results.into_iter().collect::<Result<_, _>>()?;
    let mut answers = Vec::with_capacity(plan.pairs.len());
    for (position, &(prefill, decode)) in plan.pairs.iter().enumerate() {
        let reps =
            &results[position * replications as usize..(position + 1) * replications as usize];
        events += reps.iter().map(|(_, e)| e).sum::<u64>();
        answers.push(pair_prediction(call, prefill, decode, reps, treatment_of));
    }
    Ok((answers, events))
}

/// Each of `pods`' KV geometry, with one model config parse per distinct (model, TP, block
/// size): pods of a pool share it.
fn pods_kv(
    snapshot: &MirrorSnapshot,
    pods: &[usize],
) -> Result<BTreeMap<usize, InstanceKv>, TwinError> {
    let mut kv = BTreeMap::new();
    let mut geometry: Vec<(&InstanceConfig, InstanceKv)> = Vec::new();
    for &pod in pods {
        let instance = &snapshot.config.instances[pod];
        let known = geometry.iter().find(|(other, _)| {
            other.model == instance.model
                && other.model_config_json == instance.model_config_json
                && other.tp == instance.tp
                && other.engine.block_size == instance.engine.block_size
        });
        let pod_kv = match known {
            Some(&(_, pod_kv)) => pod_kv,
            None => {
                let pod_kv = instance_kv(instance, pod)?;
                geometry.push((instance, pod_kv));
                pod_kv
            }
        };
        kv.insert(pod, pod_kv);
    }
    Ok(kv)
}

/// Each pod's baseline per replication, shared by every pair it is in, and the events they
/// take up to the horizon.
fn pod_baselines(
    call: &Call<'_>,
    pods: &[usize],
    treatment_of: &(dyn Fn(usize) -> Treatment + Sync),
) -> Result<(PodBaselines, u64), TwinError> {
    let replications = call.question.options.replications;
    let jobs: Vec<(usize, u32)> = pods
        .iter()
        .flat_map(|&pod| (0..replications).map(move |r| (pod, r)))
        .collect();
    let baselines = super::parallel::map(&jobs, |&(pod, replication)| {
        quiet_baseline(call, pod, replication, treatment_of(pod))
    });
    let horizon_end = call
        .question
        .now_us
        .saturating_add(call.question.options.horizon_us);
    let mut base_of = PodBaselines::new();
    let mut events = 0;
    for (&job, result) in jobs.iter().zip(baselines) {
        let baseline = result?;
        // Counted whether recorded now or remembered: an answer's events do not depend on
        // what the memo held.
        events += baseline.events_until(horizon_end);
        base_of.insert(job, baseline);
    }
    Ok((base_of, events))
}

/// One pair's prediction from its replications: the client's distributions on the decode
/// pod, aged by the older pod's observation, and the means of the pair's own measures.
fn pair_prediction(
    call: &Call<'_>,
    prefill: usize,
    decode: usize,
    reps: &[(PairOutcome, u64)],
    treatment_of: &(dyn Fn(usize) -> Treatment + Sync),
) -> PairPrediction {
    let snapshot = call.snapshot;
    let clients: Vec<ReplicationOutcome> = reps.iter().map(|(o, _)| o.client.clone()).collect();
    let mut prediction = summarize(
        snapshot,
        call.question,
        decode,
        treatment_of(decode),
        &clients,
    );
    // The older of the two pods' observations.
    let prefill_age = super::fork::elapsed_us(
        snapshot.instances[prefill].observed_at_us,
        call.question.now_us,
    ) as f64
        / 1000.0;
    prediction.input_age_ms = prediction.input_age_ms.max(prefill_age);
    let mean = |f: fn(&PairOutcome) -> f64| {
        reps.iter().map(|(o, _)| f(o)).sum::<f64>() / reps.len().max(1) as f64
    };
    PairPrediction {
        prefill_instance_id: snapshot.config.instances[prefill].id.clone(),
        decode_instance_id: snapshot.config.instances[decode].id.clone(),
        prediction,
        prefill_ttft_ms: mean(|o| o.prefill_ttft_ms),
        transfer_ms: mean(|o| o.transfer_ms),
        handover_ms: mean(|o| o.handover_ms),
        prefill_others_delta_e2e_ms: mean(|o| o.prefill_delta_ms),
        decode_others_delta_e2e_ms: mean(|o| o.decode_delta_ms),
    }
}

/// The best answer the decider allows: on each decode pod, its pairs where it sends the
/// request to a remote prefill (decode only when no prefill pod is left), else its decode-only
/// answer; the highest SLO probability, then the lowest mean E2E, then the first. Returns
/// (decode pod, prefill pod if a pair).
pub(super) fn recommend(
    choices: &[DeciderChoice],
    decode_only: &[CandidatePrediction],
    pairs: &[PairPrediction],
) -> Option<(String, Option<String>)> {
    let mut options: Vec<(&CandidatePrediction, Option<&str>)> = Vec::new();
    for choice in choices {
        let own: Vec<&PairPrediction> = pairs
            .iter()
            .filter(|pair| pair.decode_instance_id == choice.decode_instance_id)
            .collect();
        if choice.remote_prefill && !own.is_empty() {
            options.extend(
                own.into_iter()
                    .map(|pair| (&pair.prediction, Some(pair.prefill_instance_id.as_str()))),
            );
        } else if let Some(local) = decode_only
            .iter()
            .find(|c| c.instance_id == choice.decode_instance_id)
        {
            options.push((local, None));
        }
    }
    let mut best: Option<(&CandidatePrediction, Option<&str>)> = None;
    for (prediction, prefill) in options.into_iter().filter(|(p, _)| p.valid) {
        let better = best.is_none_or(|(current, _)| {
            prediction.slo_probability > current.slo_probability
                || (prediction.slo_probability == current.slo_probability
                    && prediction.e2e_ms.mean < current.e2e_ms.mean)
        });
        if better {
            best = Some((prediction, prefill));
        }
    }
    best.map(|(prediction, prefill)| (prediction.instance_id.clone(), prefill.map(str::to_owned)))
}

/// An instance's KV geometry (what the transfer model reads), from its model's config.
fn instance_kv(instance: &InstanceConfig, index: usize) -> Result<InstanceKv, TwinError> {
    let arch = match &instance.model_config_json {
        Some(json) => catalog::parse_model_config(&instance.model, json),
        None => catalog::model(&instance.model),
    }
    .map_err(|err| {
        TwinError::Unsimulable(format!(
            "instances[{index}].model: a P/D pair needs the model's KV geometry: {err}"
        ))
    })?;
    Ok(InstanceKv {
        bytes_per_token_per_rank: arch.kv_bytes_per_token(instance.tp),
        layers: arch.num_layers,
        planes: if arch.is_mla() { 1 } else { 2 },
        tp: instance.tp,
        block_size: instance.engine.block_size,
    })
}

/// One pair's fork for one replication.
struct PairFork<'a> {
    call: &'a Call<'a>,
    prefill: usize,
    decode: usize,
    replication: u32,
    kv: [InstanceKv; 2],
    settings: &'a DisaggConfig,
    baselines: [&'a BaselineEnds; 2],
}

impl PairFork<'_> {
    fn simulate(
        &self,
        prefill: Treatment,
        decode: Treatment,
    ) -> Result<(PairOutcome, u64), TwinError> {
        let Call {
            snapshot,
            question,
            budget,
            ..
        } = *self.call;
        let now = question.now_us;
        let horizon_end = now.saturating_add(question.options.horizon_us);
        let mut events = 0;
        let mut engines = Vec::with_capacity(2);
        for (index, treatment) in [(self.prefill, prefill), (self.decode, decode)] {
            let mut engine = candidate_engine(self.call, index, self.replication, treatment)?;
            events += run_until_done(&mut engine, now, budget)?;
            engine.run_until(now);
            engines.push(engine);
        }
        let instances = &snapshot.config.instances;
        // Routing is pinned (`dispatch_pair`): the profiles are never asked, so the cheapest
        // policy stands in for them, and signals are live (no refresh events).
        let config = ClusterConfig {
            instances: vec![
                instances[self.prefill].clone(),
                instances[self.decode].clone(),
            ],
            routing: RoutingPolicy::RoundRobin,
            admission: AdmissionPolicy::Always,
            staleness: StalenessConfig::uniform(0),
        };
        // A pair's answer is its prediction when nothing fails: failure rates would make it
        // one random draw of the question's own request.
        // The pull priced as the decode pod measured its own (the catalog's until it has).
        let disagg = DisaggConfig {
            prefill_routing: RoutingPolicy::RoundRobin,
            faults: PdFaults::NONE,
            kv: self.kv.to_vec(),
            transfer: super::transfer::for_decode(snapshot, &self.settings.transfer, self.decode),
            ..self.settings.clone()
        };
        let mut cluster =
            Cluster::from_engines_disaggregated(config, engines, disagg, question.options.seed)
                .map_err(|err| TwinError::Unsimulable(format!("P/D pair fork: {err}")))?;
        let mut spec = question_request(question, self.replication, now);
        alias_block_keys(&mut spec, &snapshot.instances[self.prefill]);
        cluster
            .dispatch_pair(0, 1, spec)
            .map_err(|err| TwinError::invalid("request", err.to_string()))?;
        let id = RequestId(QUESTION_REQUEST_ID);
        events += drive(&mut cluster, horizon_end, budget)?;
        // From the pull's end (or the request's end) the two pods are independent: each runs
        // alone to the horizon, ending in closed form where the engine offers a drain.
        let progress = cluster.pd_progress(id);
        let mut engines = cluster.into_engines();
        let mut runs = Vec::with_capacity(2);
        for engine in &mut engines {
            let run = match self.call.forking {
                Forking::Shortcuts => run_fork(engine, id, horizon_end, budget)?,
                Forking::Plain => ForkRun {
                    events: run_until_done(engine, horizon_end, budget)?,
                    ..ForkRun::default()
                },
            };
            events += run.events;
            runs.push(run);
        }
        Ok((
            self.measure(&engines, &runs, progress, now, horizon_end),
            events,
        ))
    }

    fn measure(
        &self,
        engines: &[Engine],
        runs: &[ForkRun],
        progress: Option<PdProgress>,
        now: u64,
        horizon_end: u64,
    ) -> PairOutcome {
        let ms = |us: u64| us as f64 / 1000.0;
        let id = RequestId(QUESTION_REQUEST_ID);
        let find = |engine: usize| {
            engines[engine]
                .metrics()
                .records
                .iter()
                .find(|record| record.id == id)
                .or(runs[engine].question.as_ref())
        };
        let mut outcome = PairOutcome::default();
        let client = &mut outcome.client;
        let censored = ms(horizon_end.saturating_sub(now));
        match (find(1), progress) {
            (Some(record), _) if record.outcome == Outcome::Completed => {
                client.completed = true;
                client.ttft_known = true;
                client.ttft_ms = record
                    .first_token_us
                    .map_or(0.0, |t| ms(t.saturating_sub(now)));
                client.e2e_ms = ms(record.end_us.saturating_sub(now));
                client.tpot_ms = record.tpot_us().unwrap_or(0.0) / 1000.0;
                client.kv_usage_after = f64::from(record.used_blocks_at_schedule)
                    / f64::from(engines[1].kv().total_blocks());
            }
            (Some(record), _) if record.outcome == Outcome::Dropped => client.dropped = true,
            (_, Some(progress)) if progress.failed_on_prefill => client.dropped = true,
            _ => {
                client.ttft_ms = censored;
                client.e2e_ms = censored;
                client.tpot_ms = censored;
            }
        }
        if let Some(prefill) = find(0) {
            client.prefix_hit_tokens = f64::from(prefill.cached_tokens);
        }
        if let Some(progress) = progress {
            client.queue_wait_ms = progress
                .prefill_schedule_us
                .map_or(censored, |t| ms(t.saturating_sub(now)));
            let prefill_token = progress.prefill_first_token_us;
            outcome.prefill_ttft_ms = prefill_token.map_or(censored, |t| ms(t.saturating_sub(now)));
            if let (Some(start), Some(end)) = (progress.transfer_start_us, progress.transfer_end_us)
            {
                outcome.transfer_ms = ms(end.saturating_sub(start));
            }
            let decode_first = find(1).and_then(|record| record.first_token_us);
            if let (Some(from), Some(to)) = (prefill_token, decode_first) {
                outcome.handover_ms = ms(to.saturating_sub(from));
            }
        }
        let (prefill_delta, prefill_count) =
            delta(&engines[0], &runs[0], self.baselines[0], horizon_end);
        let (decode_delta, decode_count) =
            delta(&engines[1], &runs[1], self.baselines[1], horizon_end);
        let count = prefill_count + decode_count;
        client.others_delta_e2e_ms = if count == 0 {
            0.0
        } else {
            (prefill_delta * prefill_count as f64 + decode_delta * decode_count as f64)
                / count as f64
        };
        outcome.prefill_delta_ms = prefill_delta;
        outcome.decode_delta_ms = decode_delta;
        outcome
    }
}

/// Mean change of the other requests' end (ms) against the pod's baseline, over those that
/// completed in both (the drain's ends among them), and how many.
fn delta(
    engine: &Engine,
    run: &ForkRun,
    baseline: &super::memo::Baseline,
    horizon_end: u64,
) -> (f64, u64) {
    let completed = engine
        .metrics()
        .records
        .iter()
        .filter(|record| record.outcome == Outcome::Completed)
        .map(|record| (record.id, record.end_us));
    let drained = run.drained.iter().map(|end| (end.id, end.end_us));
    baseline.mean_end_shift(completed.chain(drained), horizon_end)
}

/// Events processed between budget charges.
const CHARGE_EVERY: u64 = 256;

/// Runs `cluster` until the question's request ended (on its decode pod, or failed on its
/// prefill pod) or its pull ended, nothing is pending or the next event is after `end_us`, within the call's
/// budget and deadline; returns the events processed.
fn drive(cluster: &mut Cluster, end_us: u64, budget: &EventBudget) -> Result<u64, TwinError> {
    let (mut events, mut unpaid) = (0, 0);
    let mut seen = [0usize; 2];
    while cluster.next_event_us().is_some_and(|t| t <= end_us) {
        cluster.process_next_event();
        events += 1;
        unpaid += 1;
        if unpaid == CHARGE_EVERY {
            budget.charge(unpaid, events)?;
            unpaid = 0;
        }
        if question_ended(cluster, &mut seen)
            || cluster
                .pd_progress(RequestId(QUESTION_REQUEST_ID))
                .is_some_and(|progress| progress.transfer_end_us.is_some())
        {
            break;
        }
    }
    budget.charge(unpaid, events)?;
    Ok(events)
}

/// True once the question's request has a record on the decode pod (engine 1) or an
/// unfinished one on the prefill pod (engine 0); `seen` is how many records were read.
fn question_ended(cluster: &Cluster, seen: &mut [usize; 2]) -> bool {
    let mut ended = false;
    for (engine, read) in seen.iter_mut().enumerate() {
        let records = &cluster.engines()[engine].metrics().records;
        ended |= records[*read..].iter().any(|record| {
            record.id.0 == QUESTION_REQUEST_ID
                && (engine == 1 || record.outcome != Outcome::Completed)
        });
        *read = records.len();
    }
    ended
}
