//! The driver loop shared by one engine and a whole cluster.
//!
//! Anything that holds timed events and accepts requests ([`EventDriven`]) is driven the same
//! way: process events before a time, up to a time, or feed a stream of arrivals and run until
//! nothing is pending within an event budget. Keeping the loop in one place keeps the tie
//! rule (an arrival is submitted before events at its own time are processed) identical for
//! engines and clusters.

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
    for spec in requests {
        while sim.next_event_us().is_some_and(|t| t < spec.arrival_us) {
            step_within(sim, max_events)?;
        }
        sim.submit(spec)?;
    }
    while sim.next_event_us().is_some() {
        step_within(sim, max_events)?;
    }
    Ok(())
}

fn step_within<S: EventDriven + ?Sized>(sim: &mut S, max_events: u64) -> Result<(), SimError> {
    if sim.events_processed() >= max_events {
        return Err(SimError::EventBudgetExhausted {
            budget: max_events,
            now_us: sim.now_us(),
        });
    }
    sim.process_next_event();
    Ok(())
}
