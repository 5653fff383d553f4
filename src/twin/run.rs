//! Running a fork within the call's bounds: a share of the event budget per fork, the
//! wall-clock deadline and the call's cancellation flag, checked between chunks of events.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::sim::driver::{self, Supervisor};
use crate::sim::engine::{Drain, DrainEnd, ReachLog};
use crate::sim::metrics::RequestRecord;
use crate::sim::queue::QueueKey;
use crate::sim::{Engine, Outcome, RequestId, SchedulingPolicy};

use super::error::TwinError;
use super::limits::{CancelFlag, Limits};
use super::memo::Baseline;

/// Events processed between deadline checks.
const CHUNK_EVENTS: u64 = 2048;

/// The events all forks of one call may use, its deadline and its cancellation flag.
#[derive(Debug)]
pub struct EventBudget {
    remaining: AtomicU64,
    deadline: Option<Instant>,
    cancel: Option<CancelFlag>,
}

impl EventBudget {
    /// A budget of `total` events shared by every fork of a call.
    pub fn new(total: u64, deadline: Option<Instant>) -> Self {
        Self {
            remaining: AtomicU64::new(total),
            deadline,
            cancel: None,
        }
    }

    /// The budget of a call under `limits`: its events, deadline and cancellation flag.
    pub fn for_call(limits: &Limits) -> Self {
        Self {
            cancel: limits.cancel.clone(),
            ..Self::new(limits.max_events_per_call, limits.deadline)
        }
    }

    /// Charges `events` more events and checks the cancellation flag and the deadline; `done`
    /// is reported in errors.
    pub fn charge(&self, events: u64, done: u64) -> Result<(), TwinError> {
        self.check(done)?;
        if self.take(events) {
            Ok(())
        } else {
            Err(TwinError::EventBudget { events: done })
        }
    }

    /// Takes up to `events` events; false if the budget is spent.
    fn take(&self, events: u64) -> bool {
        self.remaining
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(events)
            })
            .is_ok()
    }

    /// Checks the cancellation flag and the deadline without charging (for work that is not
    /// an event, such as submitting arrivals); `done` is reported in errors.
    pub fn check(&self, done: u64) -> Result<(), TwinError> {
        if self.cancel.as_ref().is_some_and(CancelFlag::is_cancelled) {
            return Err(TwinError::Cancelled { events: done });
        }
        self.check_deadline(done)
    }

    fn check_deadline(&self, events: u64) -> Result<(), TwinError> {
        match self.deadline {
            Some(deadline) if Instant::now() >= deadline => Err(TwinError::Deadline { events }),
            _ => Ok(()),
        }
    }
}

/// Runs `engine` until nothing is pending or the next event is after `end_us`, feeding
/// `arrivals` (in arrival order, none after `end_us` matters) as their times come; returns
/// the events processed.
pub fn run_with_arrivals(
    engine: &mut Engine,
    arrivals: &[crate::sim::RequestSpec],
    end_us: u64,
    budget: &EventBudget,
) -> Result<u64, TwinError> {
    drive(engine, arrivals, end_us, u64::MAX, budget, |_| false)
}

/// A question's fork run to its end: the events it took and what a closed-form drain
/// finished (see [`run_fork`]).
#[derive(Debug, Default)]
pub struct ForkRun {
    /// Events processed, drained steps included.
    pub events: u64,
    /// Requests the drain finished (they have no record in the engine).
    pub drained: Vec<DrainEnd>,
    /// The question's record, if the drain finished it.
    pub question: Option<RequestRecord>,
}

/// Runs a question's fork to `end_us` like [`run_with_arrivals`] without arrivals, except that
/// once the engine offers a closed-form drain (see `sim::engine::Drain`), the rest is read
/// from it instead of stepped: the fork only needs the ends from there, and the record of
/// request `question`.
pub fn run_fork(
    engine: &mut Engine,
    question: RequestId,
    end_us: u64,
    budget: &EventBudget,
) -> Result<ForkRun, TwinError> {
    let mut watch = DrainWatch::default();
    let mut drain = None;
    let events = drive(engine, &[], end_us, u64::MAX, budget, |engine| {
        drain = watch.try_drain(engine, end_us);
        drain.is_some()
    })?;
    let drain = drain.unwrap_or_default();
    let steps = drain.steps.len() as u64;
    let question = drain
        .ends
        .iter()
        .find(|end| end.id == question)
        .and_then(|end| engine.drained_record(end));
    Ok(ForkRun {
        events: events + steps,
        drained: drain.ends,
        question,
    })
}

/// Asks an engine for a drain after each event, cheaply: only when the batch has a drain's
/// shape, and not again while the free blocks last fell short for the same batch (the same
/// completions, arrivals and preemptions: only those change the blocks free and needed).
#[derive(Debug, Default)]
struct DrainWatch {
    /// (completed, injected, preemptions) when a drain was last refused.
    refused_at: Option<(u64, u64, u64)>,
}

impl DrainWatch {
    fn try_drain(&mut self, engine: &Engine, until_us: u64) -> Option<Drain> {
        let counts = engine.counts();
        let batch = (counts.completed, counts.injected, counts.preemptions);
        if !engine.drain_shaped() || self.refused_at == Some(batch) {
            return None;
        }
        let drain = engine.drain(until_us);
        if drain.is_none() {
            self.refused_at = Some(batch);
        }
        drain
    }
}

/// A request a recording is made for (see `sim::engine::ReachLog`): submitted at `now_us`,
/// entering the queue at `enqueue_us` with queue key `key`, asked about up to `until_us`.
#[derive(Clone, Copy, Debug)]
pub struct Newcomer {
    /// When it is submitted.
    pub now_us: u64,
    /// When it enters the wait queue.
    pub enqueue_us: u64,
    /// Its wait-queue key.
    pub key: QueueKey,
    /// The end of the horizon it is asked about.
    pub until_us: u64,
}

/// Most copies a recording keeps while looking for the step that first reaches a newcomer.
const CAPTURE_COPIES_MAX: u32 = 8;

/// Runs `engine` like [`run_with_arrivals`], recording the time of every event and of every
/// completion (requests completed before the run count as completed at its start): a
/// baseline any question inside `(start, end_us]` can read.
///
/// With `drains` (and no arrivals), the recording ends in closed form once the engine offers
/// a drain, with the same event times, ends and reach log as stepping would give.
pub fn run_recorded(
    engine: &mut Engine,
    arrivals: &[crate::sim::RequestSpec],
    end_us: u64,
    budget: &EventBudget,
    drains: bool,
) -> Result<Baseline, TwinError> {
    Ok(run_recorded_for(engine, arrivals, end_us, budget, drains, None)?.0)
}

/// [`run_recorded`], also keeping, for `newcomer`, a copy of the engine just before the
/// event that first reaches it, with the number of events before it (the start of its late
/// entry, had it been submitted), if the copy was made: copies are kept only before steps
/// that [`Engine::may_reach`] it, at most [`CAPTURE_COPIES_MAX`] of them.
pub fn run_recorded_for(
    engine: &mut Engine,
    arrivals: &[crate::sim::RequestSpec],
    end_us: u64,
    budget: &EventBudget,
    drains: bool,
    newcomer: Option<Newcomer>,
) -> Result<(Baseline, Option<(u64, Engine)>), TwinError> {
    let mut baseline = Baseline {
        covers_until_us: end_us,
        reach: ReachLog::start(engine),
        ..Baseline::default()
    };
    // Room for every request present and arriving, so recording never rehashes.
    let counts = engine.counts();
    baseline.event_times.reserve(64);
    baseline.ends.reserve(
        usize::try_from(counts.queued + counts.running + counts.completed)
            .unwrap_or(0)
            .saturating_add(arrivals.len()),
    );
    let mut seen = 0;
    record_completions(engine, &mut seen, &mut baseline);
    let drains = drains && arrivals.is_empty();
    let mut watch = DrainWatch::default();
    let policy = engine.config().scheduling_policy;
    let mut capture = newcomer.map(|newcomer| Capture {
        newcomer,
        copy: None,
        copies: 0,
        found: None,
    });
    if let Some(capture) = &mut capture {
        capture.keep_if_may_reach(engine, 0);
    }
    drive(engine, arrivals, end_us, u64::MAX, budget, |engine| {
        baseline.event_times.push(engine.now_us());
        baseline.reach.observe(engine);
        record_completions(engine, &mut seen, &mut baseline);
        if let Some(capture) = &mut capture {
            let events = baseline.event_times.len() as u64;
            capture.after_event(engine, &baseline.reach, policy, events);
        }
        if !drains {
            return false;
        }
        let Some(drain) = watch.try_drain(engine, end_us) else {
            return false;
        };
        baseline
            .event_times
            .extend(drain.steps.iter().map(|step| step.end_us));
        baseline.reach.observe_drain(engine, &drain);
        for end in &drain.ends {
            baseline
                .ends
                .insert(end.id.0, (end.end_us, end.finished_at_us));
        }
        true
    })?;
    Ok((baseline, capture.and_then(|capture| capture.found)))
}

/// The copies a recording keeps for a newcomer.
struct Capture {
    newcomer: Newcomer,
    /// A copy made after this many events, before the next.
    copy: Option<(u64, Engine)>,
    copies: u32,
    /// The copy from just before the event that first reached the newcomer.
    found: Option<(u64, Engine)>,
}

impl Capture {
    /// After event number `events`: keeps the copy made before it if that event first reached
    /// the newcomer, else maybe makes one before the next.
    fn after_event(
        &mut self,
        engine: &Engine,
        log: &ReachLog,
        policy: SchedulingPolicy,
        events: u64,
    ) {
        if self.found.is_some() {
            return;
        }
        if let Some((before, copy)) = self.copy.take() {
            let newcomer = &self.newcomer;
            let first_reach = log.events_before_reach(
                newcomer.now_us,
                newcomer.enqueue_us,
                policy,
                newcomer.key,
                newcomer.until_us,
            );
            if first_reach == Some(before) {
                self.found = Some((before, copy));
                return;
            }
        }
        self.keep_if_may_reach(engine, events);
    }

    /// Copies `engine` (after `events` events) if its next event may first reach the
    /// newcomer.
    fn keep_if_may_reach(&mut self, engine: &Engine, events: u64) {
        let newcomer = &self.newcomer;
        let next_may_matter = engine
            .next_event_us()
            .is_some_and(|t| t >= newcomer.enqueue_us && t > newcomer.now_us);
        if self.copies < CAPTURE_COPIES_MAX
            && next_may_matter
            && engine.step_pending()
            && engine.may_reach(newcomer.key)
        {
            self.copy = Some((events, engine.clone()));
            self.copies += 1;
        }
    }
}

/// Adds the completions among `engine`'s records from index `seen` on, as finished now.
fn record_completions(engine: &Engine, seen: &mut usize, baseline: &mut Baseline) {
    let records = &engine.metrics().records;
    for record in &records[*seen..] {
        if record.outcome == Outcome::Completed {
            baseline
                .ends
                .insert(record.id.0, (record.end_us, engine.now_us()));
        }
    }
    *seen = records.len();
}

/// Runs `engine` until nothing is pending or the next event is after `end_us`; returns the
/// events processed.
pub fn run_until_done(
    engine: &mut Engine,
    end_us: u64,
    budget: &EventBudget,
) -> Result<u64, TwinError> {
    drive(engine, &[], end_us, u64::MAX, budget, |_| false)
}

/// Processes exactly the next `count` events (fewer if the engine runs out), within the
/// budget and deadline; returns the events processed.
pub fn run_events(engine: &mut Engine, count: u64, budget: &EventBudget) -> Result<u64, TwinError> {
    drive(engine, &[], u64::MAX, count, budget, |_| false)
}

/// The one loop behind the runners: `sim::driver::drive` (and its tie rule) under the call's
/// budget, deadline and cancellation flag, charged once per chunk of events, calling
/// `after_event` after each event (stopping when it says so); returns the events processed.
fn drive(
    engine: &mut Engine,
    arrivals: &[crate::sim::RequestSpec],
    end_us: u64,
    max_events: u64,
    budget: &EventBudget,
    after_event: impl FnMut(&Engine) -> bool,
) -> Result<u64, TwinError> {
    let mut supervisor = ForkSupervisor {
        budget,
        after_event,
    };
    driver::drive(
        engine,
        arrivals.iter().cloned(),
        end_us,
        max_events,
        &mut supervisor,
    )
}

/// A fork's run under its call's [`EventBudget`].
struct ForkSupervisor<'a, F> {
    budget: &'a EventBudget,
    after_event: F,
}

impl<F: FnMut(&Engine) -> bool> Supervisor<Engine> for ForkSupervisor<'_, F> {
    type Error = TwinError;
    const CHECK_EVERY: u64 = CHUNK_EVENTS;

    fn check_events(&mut self, processed: u64) -> Result<(), TwinError> {
        self.budget.charge(CHUNK_EVENTS, processed)
    }

    fn after_event(&mut self, engine: &Engine) -> bool {
        (self.after_event)(engine)
    }

    fn refused(&mut self, err: crate::sim::SimError) -> TwinError {
        TwinError::invalid("background", err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{WHATIF_NOW_US, whatif_snapshot};
    use crate::sim::RequestSpec;
    use crate::twin::build::restore_instance;
    use crate::twin::sampling::{output_draw, stream};

    /// A recording made for a request keeps the copy its late entry starts from (the busy
    /// what-if instance: the request waits behind 64 others), and that copy is the engine a
    /// replay to the same point gives: continued with the request put in, both end alike.
    #[test]
    fn a_cancelled_call_stops_at_its_next_check() {
        let cancel = CancelFlag::new();
        let limits = Limits {
            cancel: Some(cancel.clone()),
            ..Limits::DEFAULT
        };
        let budget = EventBudget::for_call(&limits);
        assert!(budget.charge(10, 0).is_ok());
        cancel.cancel();
        assert_eq!(
            budget.charge(10, 10),
            Err(TwinError::Cancelled { events: 10 })
        );
        assert_eq!(budget.check(10), Err(TwinError::Cancelled { events: 10 }));
        let snapshot = whatif_snapshot(true);
        let mut engine = restore_instance(
            &snapshot.config.instances[0],
            &snapshot.instances[0],
            0,
            &output_draw(&snapshot).unwrap(),
            &mut stream(1, 0, "test"),
            "instances[0]",
        )
        .unwrap();
        assert!(matches!(
            run_until_done(&mut engine, u64::MAX, &budget),
            Err(TwinError::Cancelled { .. })
        ));
    }

    #[test]
    fn a_recording_keeps_the_copy_a_late_entry_starts_from() {
        let snapshot = whatif_snapshot(true);
        let outputs = output_draw(&snapshot).unwrap();
        let observed = restore_instance(
            &snapshot.config.instances[0],
            &snapshot.instances[0],
            0,
            &outputs,
            &mut stream(1, 0, "test"),
            "instances[0]",
        )
        .unwrap();
        let now = WHATIF_NOW_US + 30_000;
        let spec = RequestSpec::synthetic(0, now, 2_000, 256);
        let newcomer = Newcomer {
            now_us: now,
            enqueue_us: now + observed.latency().queueing_us(spec.input_tokens),
            key: observed.newcomer_queue_key(&spec),
            until_us: now + 60_000_000,
        };
        let budget = EventBudget::new(u64::MAX, None);
        let (baseline, copy) = run_recorded_for(
            &mut observed.clone(),
            &[],
            newcomer.until_us,
            &budget,
            true,
            Some(newcomer),
        )
        .unwrap();
        let (events, mut copy) = copy.expect("the copy before the first reach was kept");
        let policy = observed.config().scheduling_policy;
        let first_reach = baseline.reach.events_before_reach(
            now,
            newcomer.enqueue_us,
            policy,
            newcomer.key,
            newcomer.until_us,
        );
        assert_eq!(Some(events), first_reach);
        assert!(events > 10, "the request waits behind the queue");
        let mut replay = observed.clone();
        run_events(&mut replay, events, &budget).unwrap();
        assert_eq!(copy.observe(), replay.observe());
        for engine in [&mut copy, &mut replay] {
            engine
                .insert_waiting(spec.clone(), newcomer.enqueue_us)
                .unwrap();
            run_until_done(engine, u64::MAX, &budget).unwrap();
        }
        assert_eq!(copy.metrics().records, replay.metrics().records);
    }
}
