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
use super::question::{RoutingAnswer, RoutingQuestion, StalePolicy};
use super::run::EventBudget;
use super::sampling::output_draw;
use super::snapshot::MirrorSnapshot;
use super::summary::{recommend, summarize};
use super::valid::ValidRouting;

/// One replication's outcome on one candidate.
#[derive(Clone, Debug, Default)]
pub(super) struct Outcome1 {
    pub(super) ttft_ms: f64,
    pub(super) tpot_ms: f64,
    pub(super) e2e_ms: f64,
    pub(super) completed: bool,
    pub(super) ttft_known: bool,
    pub(super) dropped: bool,
    pub(super) queue_wait_ms: f64,
    pub(super) prefix_hit_tokens: f64,
    pub(super) kv_usage_after: f64,
    pub(super) others_delta_e2e_ms: f64,
    pub(super) events: u64,
}

/// How one candidate is treated given its signal age and the stale policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Treatment {
    /// Restore at the observation time and simulate forward to `now` first.
    RollForward,
    /// Pretend the observed state is the state at `now`.
    UseLast,
    /// Report invalid (saturated), never recommend.
    Saturated,
    /// Leave out.
    Excluded,
}

/// How a question's forks are run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forking {
    /// With shortcuts (the default: same answers, less work): each fork starts where the
    /// request would first be reached, from a remembered checkpoint when there is one
    /// (`sim::engine::ReachLog`), and ends in closed form once only time can change its batch
    /// (`sim::engine::Drain`).
    Shortcuts,
    /// Plainly: roll forward from the observation, submit the request at `now` and step to the
    /// end. The path the shortcuts are checked against.
    Plain,
}

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
    let results = super::parallel::map(&jobs, |&(position, replication)| {
        match treatments[position] {
            Treatment::Excluded | Treatment::Saturated => Ok(Outcome1::default()),
            treatment => simulate(&call, candidates[position], replication, treatment),
        }
    });
    debug_assert_eq!(results.len(), candidates.len() * replications as usize);
    let results: Vec<Outcome1> = results.into_iter().collect::<Result<_, _>>()?;
    let mut predictions = Vec::with_capacity(candidates.len());
    let mut events = 0;
    for (position, &index) in candidates.iter().enumerate() {
        let reps =
            &results[position * replications as usize..(position + 1) * replications as usize];
        events += reps.iter().map(|r| r.events).sum::<u64>();
        predictions.push(summarize(
            snapshot,
            question,
            index,
            treatments[position],
            reps,
        ));
    }
    let recommended = recommend(&predictions);
    Ok(RoutingAnswer {
        candidates: predictions,
        recommended_instance_id: recommended,
        generation: snapshot.generation,
        seed: question.options.seed,
        events,
    })
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
