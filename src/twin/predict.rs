//! Routing predictions: for each candidate instance and replication, restore the instance
//! from the snapshot, add the question's request at `now`, and simulate; a second fork
//! without the request measures the impact on the requests already there.
//!
//! Each pair of forks is built and measured in `fork.rs`. Without background traffic, the
//! fork with the request starts where the request would first be reached (late entry, from a
//! checkpoint of the baseline remembered per snapshot) and ends in closed form once only time
//! can change its batch (a drain); both are exact, and [`Forking::Plain`] turns them off for
//! comparison.
//!
//! Forks run in parallel across cores and never change the snapshot's mirrored state; the
//! only thing they write is its memo (`memo`: baselines, restored engines and checkpoints
//! shared by questions on the same snapshot, behind its own lock). Each replication draws
//! unknown output lengths from its own seeded stream, so an answer is reproducible from the
//! snapshot generation and seed it reports. Work is bounded by the call's limits (events,
//! horizon) and deadline.

use super::error::TwinError;
use super::fork::{Call, simulate};
use super::limits::Limits;
pub use super::outcome::Forking;
use super::outcome::{ReplicationOutcome, Treatment};
use super::question::{CandidatePrediction, RoutingAnswer, RoutingQuestion, StalePolicy};
use super::run::EventBudget;
use super::sampling::output_draw;
use super::snapshot::MirrorSnapshot;
use super::summary::{recommend, summarize};
use super::valid::ValidRouting;
use crate::cluster::disagg::serves_decode;

/// Checks `question` against `snapshot` ([`ValidRouting::new`]) and answers it within
/// `limits`.
pub fn predict_routing(
    snapshot: &MirrorSnapshot,
    question: &RoutingQuestion,
    limits: &Limits,
) -> Result<RoutingAnswer, TwinError> {
    predict_routing_with(snapshot, question, limits, Forking::Shortcuts)
}

/// [`predict_routing`] with forks started as `forking` says (tests compare the two).
pub fn predict_routing_with(
    snapshot: &MirrorSnapshot,
    question: &RoutingQuestion,
    limits: &Limits,
    forking: Forking,
) -> Result<RoutingAnswer, TwinError> {
    let valid = ValidRouting::new(question.clone(), snapshot, limits)?;
    answer(snapshot, &valid, limits, forking)
}

/// Answers a checked question on the snapshot it was checked against, within `limits`.
pub fn predict_valid(
    snapshot: &MirrorSnapshot,
    valid: &ValidRouting,
    limits: &Limits,
) -> Result<RoutingAnswer, TwinError> {
    answer(snapshot, valid, limits, Forking::Shortcuts)
}

/// The answer to a checked question, its forks started as `forking` says.
fn answer(
    snapshot: &MirrorSnapshot,
    valid: &ValidRouting,
    limits: &Limits,
    forking: Forking,
) -> Result<RoutingAnswer, TwinError> {
    if valid.generation() != snapshot.generation {
        return Err(TwinError::invalid(
            "snapshot_generation",
            format!(
                "the question was checked against generation {}, not {}: it runs on the \
                 snapshot it was checked against",
                valid.generation(),
                snapshot.generation
            ),
        ));
    }
    let question = valid.question();
    let candidates = valid.candidates();
    let replications = question.options.replications;
    // (position among the candidates, replication): results come back in this order.
    let jobs: Vec<(usize, u32)> = (0..candidates.len())
        .flat_map(|position| (0..replications).map(move |r| (position, r)))
        .collect();
    let budget = EventBudget::for_call(limits);
    let outputs = output_draw(snapshot)?;
    let treatments: Vec<Treatment> = candidates
        .iter()
        .map(|&i| treatment(snapshot, valid, i))
        .collect();
    let call = Call {
        snapshot,
        question,
        outputs: &outputs,
        budget: &budget,
        forking,
    };
    // A P/D pool: prefill-only pods take no whole request (answered in pairs instead).
    let disaggregated = super::pd::is_disaggregated(snapshot);
    let prefill_only: Vec<bool> = candidates
        .iter()
        .map(|&i| disaggregated && !serves_decode(snapshot.config.instances[i].role))
        .collect();
    let results = super::parallel::map(&jobs, |&(position, replication)| {
        match treatments[position] {
            _ if prefill_only[position] => Ok(ReplicationOutcome::default()),
            Treatment::Excluded | Treatment::Saturated => Ok(ReplicationOutcome::default()),
            treatment => simulate(&call, candidates[position], replication, treatment),
        }
    });
    debug_assert_eq!(results.len(), candidates.len() * replications as usize);
    let results: Vec<ReplicationOutcome> = results.into_iter().collect::<Result<_, _>>()?;
    let mut predictions = Vec::with_capacity(candidates.len());
    let mut events = 0;
    for (position, &index) in candidates.iter().enumerate() {
        let reps =
            &results[position * replications as usize..(position + 1) * replications as usize];
        events += reps.iter().map(|r| r.events).sum::<u64>();
        let mut prediction = summarize(snapshot, question, index, treatments[position], reps);
        if prefill_only[position] {
            prediction = prefill_only_prediction(prediction);
        }
        predictions.push(prediction);
    }
    let mut answer = RoutingAnswer {
        recommended_instance_id: recommend(&predictions),
        candidates: predictions,
        generation: snapshot.generation,
        seed: question.options.seed,
        events,
        pairs: Vec::new(),
        recommended_prefill_instance_id: None,
        decider: Vec::new(),
    };
    if disaggregated {
        let plan = super::pd::plan(&call, candidates, &treatments)?;
        let treatment_of = |index: usize| {
            candidates
                .iter()
                .position(|&c| c == index)
                .map_or(Treatment::Excluded, |position| treatments[position])
        };
        let (pairs, pair_events) = super::pd::answer_pairs(&call, &plan, &treatment_of)?;
        let best = super::pd::recommend(&plan.choices, &answer.candidates, &pairs);
        answer.recommended_instance_id = best.as_ref().map(|(decode, _)| decode.clone());
        answer.recommended_prefill_instance_id = best.and_then(|(_, prefill)| prefill);
        answer.events += pair_events;
        answer.pairs = pairs;
        answer.decider = plan.choices;
    }
    Ok(answer)
}

/// A prefill-only pod's place among the candidates of a P/D question: not a target for the
/// whole request (llm-d's decode filter leaves it out); its answers are the pairs'.
fn prefill_only_prediction(mut prediction: CandidatePrediction) -> CandidatePrediction {
    prediction.valid = false;
    prediction.invalid_reason =
        "role prefill: serves a request's prefill only (see the pair answers)".to_owned();
    prediction.ttft_ms = Default::default();
    prediction.tpot_ms = Default::default();
    prediction.e2e_ms = Default::default();
    prediction.slo_probability = 0.0;
    prediction.ttft_slo_probability = 0.0;
    prediction.tpot_slo_probability = 0.0;
    prediction.queue_wait_ms = 0.0;
    prediction.others_delta_e2e_ms = 0.0;
    prediction
}

fn treatment(snapshot: &MirrorSnapshot, valid: &ValidRouting, index: usize) -> Treatment {
    let question = valid.question();
    let state = &snapshot.instances[index];
    let age = super::fork::elapsed_us(state.observed_at_us, question.now_us);
    let limit = valid.max_signal_age_us();
    if age <= limit && state.stale_reason.is_none() {
        return Treatment::RollForward;
    }
    match question
        .options
        .stale_policy
        .unwrap_or(snapshot.settings.default_stale_policy)
    {
        StalePolicy::RollForward => Treatment::RollForward,
        StalePolicy::UseLast => Treatment::UseLast,
        StalePolicy::TreatSaturated => Treatment::Saturated,
        StalePolicy::Exclude => Treatment::Excluded,
    }
}
