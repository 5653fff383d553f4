//! The driver loop shared by one engine and a whole cluster.
//!
//! Anything that holds timed events and accepts requests ([`EventDriven`]) is driven the same
//! way: process events before a time, up to a time, or feed a stream of arrivals and run until
//! nothing is pending within an event budget. Keeping the loop in one place ([`drive`]) keeps
//! the tie rule (an arrival is submitted before events at its own time are processed)
//! identical for engines, clusters and every caller that bounds a run by a budget, a deadline
//! or a cancellation flag (the twin's forks and forecasts: see [`Supervisor`]).

use crate::sim::error::SimError;
use crate::sim::request::RequestSpec;

/// A simulation that processes timed events and accepts requests.
pub trait EventDriven {
    /// Time of the next pending event, if any.
    fn next_event_us(&self) -> Option<u64>;
    /// Processes the next event; returns its time.
    fn process_next_event(&mut self) -> Option<u64>;
    /// Accepts a request arriving at `spec.arrival_us` (not in the past).
    fn submit(&mut self, spec: RequestSpec) -> Result<(), SimError>;
    /// Events processed so far.
    fn events_processed(&self) -> u64;
    /// Current time.
    fn now_us(&self) -> u64;
    /// Moves the clock forward to `time_us` (no event is pending before it).
    fn advance_clock_to(&mut self, time_us: u64);
}

/// What bounds and watches a [`drive`]: checked every [`Supervisor::CHECK_EVERY`] events
/// (before the first) and every as many arrivals, told of each event, and asked what a
/// refused arrival means. Its errors stop the run: an event budget, a deadline, a
/// cancellation flag.
pub trait Supervisor<S: ?Sized> {
    /// Why a run stopped early.
    type Error;
    /// Events (and arrivals) between checks.
    const CHECK_EVERY: u64;
    /// Before events `processed .. processed + CHECK_EVERY`: may charge a budget and stop the
    /// run.
    fn check_events(&mut self, processed: u64) -> Result<(), Self::Error>;
    /// After `CHECK_EVERY` more arrivals were submitted (`processed` events so far): submitting
    /// is work too (routing, queueing), so a deadline or a cancellation is seen between
    /// bursts of arrivals.
    fn check_arrivals(&mut self, processed: u64) -> Result<(), Self::Error> {
        let _ = processed;
        Ok(())
    }
    /// After each event; true stops the run there.
    fn after_event(&mut self, sim: &S) -> bool {
        let _ = sim;
        false
    }
    /// An arrival `sim` refused.
    fn refused(&mut self, err: SimError) -> Self::Error;
}

/// Feeds `arrivals` (in non-decreasing arrival order; one arriving after `end_us` is not
/// submitted) as their times come, an arrival before any event at its own time, and
/// processes every event at or before `end_us` but no more than `max_events`, under
/// `supervisor`; returns the events processed.
pub fn drive<S, I, V>(
    sim: &mut S,
    arrivals: I,
    end_us: u64,
    max_events: u64,
    supervisor: &mut V,
) -> Result<u64, V::Error>
where
    S: EventDriven + ?Sized,
    I: IntoIterator<Item = RequestSpec>,
    V: Supervisor<S> + ?Sized,
{
    let mut processed = 0u64;
    let mut submitted = 0u64;
    let mut pending = arrivals
        .into_iter()
        .take_while(|spec| spec.arrival_us <= end_us)
        .peekable();
    loop {
        let next = sim.next_event_us();
        // (Peeked in place: `next_if` would move the spec out and back on every refusal.)
        let due = pending
            .peek()
            .is_some_and(|spec| next.is_none_or(|t| spec.arrival_us <= t));
        if let Some(spec) = due.then(|| pending.next()).flatten() {
            sim.submit(spec).map_err(|err| supervisor.refused(err))?;
            submitted += 1;
            if submitted.is_multiple_of(V::CHECK_EVERY) {
                supervisor.check_arrivals(processed)?;
            }
            continue;
        }
        if next.is_none_or(|t| t > end_us) || processed == max_events {
            return Ok(processed);
        }
        if processed.is_multiple_of(V::CHECK_EVERY) {
            supervisor.check_events(processed)?;
        }
        sim.process_next_event();
        processed += 1;
        if supervisor.after_event(sim) {
            return Ok(processed);
        }
    }
}

/// Processes every event strictly before `time_us`.
pub fn run_before<S: EventDriven + ?Sized>(sim: &mut S, time_us: u64) {
    while sim.next_event_us().is_some_and(|t| t < time_us) {
        sim.process_next_event();
    }
}

/// Processes every event at or before `time_us`, then sets the clock to `time_us`.
pub fn run_until<S: EventDriven + ?Sized>(sim: &mut S, time_us: u64) {
    while sim.next_event_us().is_some_and(|t| t <= time_us) {
        sim.process_next_event();
    }
    sim.advance_clock_to(time_us);
}

/// Feeds `requests` (in non-decreasing arrival order) and runs until nothing is pending,
/// failing with [`SimError::EventBudgetExhausted`] once `max_events` events were processed.
pub fn run<S, I>(sim: &mut S, requests: I, max_events: u64) -> Result<(), SimError>
where
    S: EventDriven + ?Sized,
    I: IntoIterator<Item = RequestSpec>,
{
    let mut budget = Budget {
        max_events,
        already: sim.events_processed(),
    };
    let left = max_events.saturating_sub(budget.already);
    drive(sim, requests, u64::MAX, left, &mut budget)?;
    if sim.next_event_us().is_some() {
        return Err(SimError::EventBudgetExhausted {
            budget: max_events,
            now_us: sim.now_us(),
        });
    }
    Ok(())
}

/// [`run`]'s supervisor: the budget is enforced by `drive`'s event cap; arrivals are
/// never refused silently.
struct Budget {
    max_events: u64,
    already: u64,
}

impl<S: EventDriven + ?Sized> Supervisor<S> for Budget {
    type Error = SimError;
    const CHECK_EVERY: u64 = u64::MAX;
    fn check_events(&mut self, _processed: u64) -> Result<(), SimError> {
        debug_assert!(self.already <= self.max_events);
        Ok(())
    }
    fn refused(&mut self, err: SimError) -> SimError {
        err
    }
}
