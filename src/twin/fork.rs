//! One candidate's fork pair for a routing question: the fork without the request (the
//! baseline, memoised per snapshot) and the fork with it, started by late entry from a
//! checkpoint where that is exact and ended by a closed-form drain where that is exact (see
//! `sim::engine::ReachLog` and `sim::engine::Drain`), then measured against each other.

use std::cell::OnceCell;
use std::sync::Arc;

use crate::sim::{Engine, Outcome, RequestId, RequestSpec};

use super::build::{
    BACKGROUND_ARRIVALS_MAX, QUESTION_REQUEST_ID, final_lengths, prompt_content, restore_base,
    set_lengths,
};
use super::error::TwinError;
use super::memo::{Baseline, BaselineKey, CheckpointKey, RestoredKey};
use super::outcome::{Forking, ReplicationOutcome, Treatment};
use super::question::{Background, OutputLength, RoutingQuestion};
use super::run::{
    EventBudget, ForkRun, Newcomer, run_events, run_fork, run_recorded, run_recorded_for,
    run_until_done, run_with_arrivals,
};
use super::sampling::stream;
use super::snapshot::MirrorSnapshot;

/// A question naming the publisher's block hashes meets the blocks this instance keeps under
/// their token keys (see `twin::cached`): each hash the instance knows is replaced by its key.
pub(super) fn alias_block_keys(
    spec: &mut RequestSpec,
    state: &crate::twin::snapshot::InstanceState,
) {
    if !state.cached_blocks.has_aliases() {
        return;
    }
    if let crate::sim::PromptContent::BlockKeys(keys) = &spec.content {
        let aliased: Vec<u64> = keys
            .iter()
            .map(|&key| state.cached_blocks.key_for(key))
            .collect();
        spec.content = crate::sim::PromptContent::BlockKeys(aliased.into());
    }
}

/// The question's request as an engine request arriving at `now`.
pub(super) fn question_request(
    question: &RoutingQuestion,
    replication: u32,
    arrival_us: u64,
) -> RequestSpec {
    let request = &question.request;
    let output = match &request.output {
        OutputLength::Point(tokens) => *tokens,
        OutputLength::Histogram(bins) => {
            let mut rng = stream(question.options.seed, replication, "twin/question-output");
            let total: f64 = bins.iter().map(|&(_, w)| w).sum();
            let unit = crate::sim::rng::unit(&mut rng);
            let mut target = unit * total;
            let mut chosen = bins[bins.len() - 1].0;
            for &(value, weight) in bins {
                if target < weight {
                    chosen = value;
                    break;
                }
                target -= weight;
            }
            chosen
        }
    };
    let output = if request.max_tokens > 0 {
        output.min(request.max_tokens)
    } else {
        output
    };
    let content = prompt_content(&request.block_hashes, request.token_ids.as_ref());
    RequestSpec {
        id: RequestId(QUESTION_REQUEST_ID),
        arrival_us,
        input_tokens: request.prompt_tokens,
        output_tokens: output,
        max_tokens: request.max_tokens.max(output),
        slo_class: request.slo_class,
        priority: request.priority,
        deadline_us: None,
        content,
    }
}

/// What every fork of one call shares.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    pub(super) snapshot: &'a MirrorSnapshot,
    pub(super) question: &'a RoutingQuestion,
    pub(super) outputs: &'a crate::workload::LengthDraw,
    pub(super) budget: &'a EventBudget,
    pub(super) forking: Forking,
}

/// One replication of one candidate: its fork pair, measured.
pub(super) fn simulate(
    call: &Call<'_>,
    index: usize,
    replication: u32,
    treatment: Treatment,
) -> Result<ReplicationOutcome, TwinError> {
    let Call {
        snapshot,
        question,
        outputs,
        budget,
        forking,
    } = *call;
    let forks = Forks {
        call,
        index,
        replication,
        base: restored_base(call, index, treatment)?,
        lengths: OnceCell::new(),
    };
    let now = question.now_us;
    let horizon_end = now.saturating_add(question.options.horizon_us);
    let background = background_arrivals(snapshot, question, index, replication, outputs)?;
    // Without background traffic, a rolled-forward baseline is the observation's own
    // continuation: one recording serves every "now" (see `memo`).
    let continuation =
        treatment == Treatment::RollForward && question.options.background == Background::None;
    let key = BaselineKey {
        instance: index,
        now_us: (!continuation).then_some(now),
        seed: question.options.seed,
        replication,
        background: u8::from(question.options.background != Background::None),
        background_prompt_tokens: if question.options.background == Background::None {
            0
        } else {
            question.request.prompt_tokens
        },
        treatment: u8::from(treatment == Treatment::UseLast),
    };
    let cached = snapshot
        .memo
        .get(&key)
        .filter(|baseline| baseline.covers_until_us >= horizon_end);
    let mut spec = question_request(question, replication, now);
    alias_block_keys(&mut spec, &snapshot.instances[index]);
    if continuation {
        return continuation_pair(&forks, key, cached, spec, horizon_end);
    }
    // Roll forward to `now` (by the state's age) within the call's budget and deadline; the
    // baseline starts there.
    let mut engine = forks.fork()?;
    let rolled = run_until_done(&mut engine, now, budget)?;
    engine.run_until(now);
    let baseline = match cached {
        Some(baseline) => baseline,
        None => {
            let mut without = engine.clone();
            let baseline = Arc::new(run_recorded(
                &mut without,
                &background,
                horizon_end,
                budget,
                forking == Forking::Shortcuts,
            )?);
            snapshot.memo.insert(key, Arc::clone(&baseline));
            baseline
        }
    };
    submit_question(&mut engine, spec)?;
    let mut run = run_question(&mut engine, &background, horizon_end, budget, forking)?;
    // (The baseline starts at `now`; it may have been recorded for a longer horizon.)
    run.events += rolled + baseline.events_until(horizon_end);
    Ok(measure(&engine, &run, &baseline, now, horizon_end))
}

/// The candidate's engine as observed (or, under use-last, as if observed at `now`), before
/// any length is drawn: restored once per snapshot and remembered.
pub(super) fn restored_base(
    call: &Call<'_>,
    index: usize,
    treatment: Treatment,
) -> Result<Arc<Engine>, TwinError> {
    let Call {
        snapshot, question, ..
    } = *call;
    let restored_key = RestoredKey {
        instance: index,
        shifted_to_us: (treatment == Treatment::UseLast).then_some(question.now_us),
    };
    if let Some(base) = snapshot.memo.restored(&restored_key) {
        return Ok(base);
    }
    let instance = &snapshot.config.instances[index];
    let state = &snapshot.instances[index];
    let path = format!("instances[{index}]");
    let base = if treatment == Treatment::UseLast {
        // Take the old observation as the state at `now`.
        let mut shifted = (**state).clone();
        // (`predict::validate` refuses a "now" before the observation.)
        let shift = elapsed_us(shifted.observed_at_us, question.now_us);
        shifted.observed_at_us = question.now_us;
        shifted.step_end_us = shifted.step_end_us.map(|end| end + shift);
        restore_base(instance, &shifted, index, &path)?
    } else {
        restore_base(instance, state, index, &path)?
    };
    let mut base = base;
    // The answer reads only the records: no fork counts inter-token gaps.
    base.skip_token_gaps();
    let base = Arc::new(base);
    snapshot
        .memo
        .insert_restored(restored_key, Arc::clone(&base));
    Ok(base)
}

/// Candidate `index`'s engine for `replication` as its forks start (restored as `treatment`
/// says, this replication's lengths drawn), before any roll forward: the P/D pair forks
/// start from the same engines as the monolithic ones.
pub(super) fn candidate_engine(
    call: &Call<'_>,
    index: usize,
    replication: u32,
    treatment: Treatment,
) -> Result<Engine, TwinError> {
    Forks {
        call,
        index,
        replication,
        base: restored_base(call, index, treatment)?,
        lengths: OnceCell::new(),
    }
    .fork()
}

/// Candidate `index`'s fork without any request and without background traffic, to the
/// horizon: what a P/D pair fork compares the pod's other requests with. The observation's
/// continuation is the monolithic path's own baseline (shared through the memo); otherwise it
/// starts at `now`. Remembered per snapshot either way.
pub(super) fn quiet_baseline(
    call: &Call<'_>,
    index: usize,
    replication: u32,
    treatment: Treatment,
) -> Result<Arc<Baseline>, TwinError> {
    let Call {
        snapshot,
        question,
        budget,
        forking,
        ..
    } = *call;
    let now = question.now_us;
    let horizon_end = now.saturating_add(question.options.horizon_us);
    let continuation = treatment == Treatment::RollForward;
    let key = BaselineKey {
        instance: index,
        now_us: (!continuation).then_some(now),
        seed: question.options.seed,
        replication,
        background: 0,
        background_prompt_tokens: 0,
        treatment: u8::from(treatment == Treatment::UseLast),
    };
    if let Some(baseline) = snapshot
        .memo
        .get(&key)
        .filter(|baseline| baseline.covers_until_us >= horizon_end)
    {
        return Ok(baseline);
    }
    let mut engine = candidate_engine(call, index, replication, treatment)?;
    let drains = forking == Forking::Shortcuts;
    let baseline = if continuation {
        let until = horizon_end.saturating_add(question.options.horizon_us);
        run_recorded(&mut engine, &[], until, budget, drains)?
    } else {
        run_until_done(&mut engine, now, budget)?;
        engine.run_until(now);
        run_recorded(&mut engine, &[], horizon_end, budget, drains)?
    };
    let baseline = Arc::new(baseline);
    snapshot.memo.insert(key, Arc::clone(&baseline));
    Ok(baseline)
}

/// What one candidate's forks for one replication start from.
struct Forks<'a> {
    call: &'a Call<'a>,
    index: usize,
    replication: u32,
    base: Arc<Engine>,
    /// The replication's final lengths, drawn once for both forks.
    lengths: OnceCell<Vec<(u32, u32)>>,
}

impl Forks<'_> {
    /// A fork: the restored engine with this replication's lengths.
    fn fork(&self) -> Result<Engine, TwinError> {
        let Call {
            snapshot,
            question,
            outputs,
            ..
        } = *self.call;
        let index = self.index;
        let state = &snapshot.instances[index];
        let lengths = self.lengths.get_or_init(|| {
            let instance = &snapshot.config.instances[index];
            let mut rng = stream(
                question.options.seed,
                self.replication,
                &format!("twin/outputs/{}", instance.id),
            );
            final_lengths(state, outputs, &mut rng)
        });
        let mut engine = (*self.base).clone();
        set_lengths(
            &mut engine,
            lengths,
            state,
            index,
            &format!("instances[{index}]"),
        )?;
        Ok(engine)
    }
}

/// The fork pair of a rolled-forward candidate without background traffic: the baseline is
/// the observation's continuation (`cached`, or recorded now under `key`), and the fork with
/// the request starts by late entry where that applies.
fn continuation_pair(
    forks: &Forks<'_>,
    key: BaselineKey,
    cached: Option<Arc<Baseline>>,
    spec: RequestSpec,
    horizon_end: u64,
) -> Result<ReplicationOutcome, TwinError> {
    let Call {
        snapshot,
        question,
        budget,
        forking,
        ..
    } = *forks.call;
    let now = question.now_us;
    // Late entry is exact only when a request that waits unreached changes nothing, which a
    // model pricing the waiting queue breaks (`LatencyModel::prices_waiting`).
    let late_entry = forking == Forking::Shortcuts && !forks.base.latency().prices_waiting();
    let newcomer = late_entry
        .then(|| newcomer(&forks.base, &spec, now, horizon_end))
        .flatten();
    // Recorded from the observation, past this horizon for later questions; on the way, a
    // copy from where the request would first be reached is kept when cheap.
    let mut captured = None;
    let baseline = match cached {
        Some(baseline) => baseline,
        None => {
            let until = horizon_end.saturating_add(question.options.horizon_us);
            let drains = forking == Forking::Shortcuts;
            let (baseline, copy) =
                run_recorded_for(&mut forks.fork()?, &[], until, budget, drains, newcomer)?;
            captured = copy;
            let baseline = Arc::new(baseline);
            snapshot.memo.insert(key, Arc::clone(&baseline));
            baseline
        }
    };
    let reached = newcomer.and_then(|newcomer| {
        let policy = forks.base.config().scheduling_policy;
        baseline
            .reach
            .events_before_reach(now, newcomer.enqueue_us, policy, newcomer.key, horizon_end)
            .map(|skip| (skip, newcomer.enqueue_us))
    });
    let Some((skip, enqueue_us)) = reached else {
        let mut engine = forks.fork()?;
        let rolled = run_until_done(&mut engine, now, budget)?;
        engine.run_until(now);
        submit_question(&mut engine, spec)?;
        let mut run = run_question(&mut engine, &[], horizon_end, budget, forking)?;
        run.events += rolled + baseline.events_between(now, horizon_end);
        return Ok(measure(&engine, &run, &baseline, now, horizon_end));
    };
    // The request waits unreached until event `skip + 1`: start from the baseline there
    // (remembered for later questions when that skips real work).
    let checkpoint_key = CheckpointKey {
        instance: forks.index,
        seed: question.options.seed,
        replication: forks.replication,
        events: skip,
    };
    let mut engine = match (snapshot.memo.checkpoint(&checkpoint_key), captured) {
        (Some(checkpoint), _) => (*checkpoint).clone(),
        // The recording just made kept the copy: use it as is. (Remembering it would cost a
        // clone on the snapshot's first question, the one that counts in serving; a later
        // question on this snapshot remembers its replayed checkpoint below.)
        (None, Some((events, copy))) if events == skip => copy,
        (None, _) => {
            let mut engine = forks.fork()?;
            run_events(&mut engine, skip, budget)?;
            if skip > baseline.events_until(now) + CHECKPOINT_MIN_EVENTS {
                snapshot
                    .memo
                    .insert_checkpoint(checkpoint_key, Arc::new(engine.clone()));
            }
            engine
        }
    };
    engine
        .insert_waiting_watched(spec, enqueue_us)
        .map_err(|err| TwinError::invalid("request", err.to_string()))?;
    let mut run = run_question(&mut engine, &[], horizon_end, budget, forking)?;
    // Its arrival and enqueue count as the events they would have been.
    run.events += skip + 2 + baseline.events_between(now, horizon_end);
    Ok(measure(&engine, &run, &baseline, now, horizon_end))
}

/// Runs the fork with the question's request to `end_us`: with a closed-form drain at the
/// end when shortcuts are on and no arrival is left to feed.
fn run_question(
    engine: &mut Engine,
    arrivals: &[RequestSpec],
    end_us: u64,
    budget: &EventBudget,
    forking: Forking,
) -> Result<ForkRun, TwinError> {
    if forking == Forking::Shortcuts && arrivals.is_empty() {
        return run_fork(engine, RequestId(QUESTION_REQUEST_ID), end_us, budget);
    }
    let events = run_with_arrivals(engine, arrivals, end_us, budget)?;
    Ok(ForkRun {
        events,
        ..ForkRun::default()
    })
}

/// Least events a checkpoint must skip past `now` to be remembered (below it, cloning it
/// costs about what replaying those events does).
const CHECKPOINT_MIN_EVENTS: u64 = 8;

/// The question's request `spec`, submitted at `now` to a copy of `engine` (the observed
/// state), as a late entry sees it: when it enters the queue and with what key. `None` if it
/// would be dropped at arrival (the plain path records that).
fn newcomer(engine: &Engine, spec: &RequestSpec, now: u64, horizon_end: u64) -> Option<Newcomer> {
    engine.fits_model_len(spec).then(|| Newcomer {
        now_us: now,
        enqueue_us: now.saturating_add(engine.latency().queueing_us(spec.input_tokens)),
        key: engine.newcomer_queue_key(spec),
        until_us: horizon_end,
    })
}

fn submit_question(engine: &mut Engine, spec: RequestSpec) -> Result<(), TwinError> {
    engine
        .submit_watched(spec)
        .map_err(|err| TwinError::invalid("request", err.to_string()))
}

/// Poisson arrivals at this instance's share of the observed rate over the horizon, with
/// (prompt, output) pairs drawn from recently finished requests (or the question's prompt
/// and the output distribution when none were observed). Ids start at 1.
fn background_arrivals(
    snapshot: &MirrorSnapshot,
    question: &RoutingQuestion,
    index: usize,
    replication: u32,
    outputs: &crate::workload::LengthDraw,
) -> Result<Vec<RequestSpec>, TwinError> {
    if question.options.background == Background::None {
        return Ok(Vec::new());
    }
    let instances = snapshot.config.instances.len().max(1) as f64;
    let rate_per_us = snapshot.traffic.arrivals_per_s / instances / 1e6;
    if rate_per_us.is_nan() || rate_per_us <= 0.0 {
        return Ok(Vec::new());
    }
    let expected = rate_per_us * question.options.horizon_us as f64;
    if expected > BACKGROUND_ARRIVALS_MAX as f64 {
        return Err(TwinError::OverLimit(format!(
            "about {expected:.0} background arrivals per fork exceed the limit of {BACKGROUND_ARRIVALS_MAX}; shorten the horizon"
        )));
    }
    let instance = &snapshot.config.instances[index];
    let mut rng = stream(
        question.options.seed,
        replication,
        &format!("twin/background/{}", instance.id),
    );
    let lengths = &snapshot.traffic.recent_lengths;
    let mut arrivals = Vec::new();
    let mut time = question.now_us as f64;
    let end = (question.now_us + question.options.horizon_us) as f64;
    loop {
        let unit = crate::sim::rng::unit(&mut rng);
        time += -(1.0 - unit).ln() / rate_per_us;
        if time > end {
            break;
        }
        let (prompt, output) = if lengths.is_empty() {
            (question.request.prompt_tokens, outputs.sample(&mut rng))
        } else {
            let pick = (rand_core::Rng::next_u64(&mut rng) % lengths.len() as u64) as usize;
            lengths[pick]
        };
        let id = arrivals.len() as u64 + 1;
        arrivals.push(RequestSpec::synthetic(
            id,
            time.ceil() as u64,
            prompt.max(1),
            output.max(1),
        ));
    }
    Ok(arrivals)
}

/// Microseconds from `from_us` to `to_us`, which the twin's causality guarantees is not
/// earlier (a question's "now" is at or after the observation, a horizon ends after "now",
/// and the question's request sees its first token after it arrives at "now"): asserted in
/// debug builds, clamped at zero otherwise.
pub(super) fn elapsed_us(from_us: u64, to_us: u64) -> u64 {
    debug_assert!(
        from_us <= to_us,
        "twin causality: {to_us} µs precedes {from_us} µs"
    );
    to_us.saturating_sub(from_us)
}

fn measure(
    with: &Engine,
    run: &ForkRun,
    baseline: &Baseline,
    now: u64,
    horizon_end: u64,
) -> ReplicationOutcome {
    let events = run.events;
    let records = &with.metrics().records;
    // (The question's request is watched: a drain's closed form reports it when the engine
    // did not get to retire it.)
    let mine = with.watched_record().or(run.question.as_ref());
    let ms = |us: u64| us as f64 / 1000.0;
    let mut outcome = ReplicationOutcome {
        events,
        ..ReplicationOutcome::default()
    };
    match mine {
        Some(record) if record.outcome == Outcome::Completed => {
            outcome.completed = true;
            outcome.ttft_known = true;
            outcome.ttft_ms = record.ttft_us().map_or(0.0, ms);
            outcome.e2e_ms = record.e2e_us().map_or(0.0, ms);
            outcome.tpot_ms = record.tpot_us().unwrap_or(0.0) / 1000.0;
            outcome.queue_wait_ms = record.scheduling_delay_us().map_or(0.0, ms);
            outcome.prefix_hit_tokens = f64::from(record.cached_tokens);
            outcome.kv_usage_after =
                f64::from(record.used_blocks_at_schedule) / f64::from(with.kv().total_blocks());
        }
        Some(record) if record.outcome == Outcome::Dropped => outcome.dropped = true,
        _ => {
            // Not finished within the horizon: E2E and TPOT are censored at the horizon; the
            // first token may still have come.
            let censored = ms(elapsed_us(now, horizon_end));
            let first = with.watched_first_token_us();
            outcome.ttft_known = first.is_some();
            outcome.ttft_ms = first.map_or(censored, |t| ms(elapsed_us(now, t)));
            outcome.e2e_ms = censored;
            outcome.tpot_ms = censored;
            outcome.queue_wait_ms = censored;
        }
    }
    // Impact on the requests that were already there: mean change of their end time, over
    // those finishing within the horizon in both forks (a drain's ends among them).
    let completed = records
        .iter()
        .filter(|record| record.outcome == Outcome::Completed)
        .map(|record| (record.id, record.end_us));
    let drained = run.drained.iter().map(|end| (end.id, end.end_us));
    outcome.others_delta_e2e_ms = baseline
        .mean_end_shift(completed.chain(drained), horizon_end)
        .0;
    outcome
}
