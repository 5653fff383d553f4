//! Running a fork within the call's bounds: a share of the event budget per fork and the
//! wall-clock deadline, checked between chunks of events.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::sim::Engine;

use super::error::TwinError;

/// Events processed between deadline checks.
const CHUNK_EVENTS: u64 = 2048;

/// The events all forks of one call may use, and its deadline.
#[derive(Debug)]
pub struct EventBudget {
    remaining: AtomicU64,
    deadline: Option<Instant>,
}

impl EventBudget {
    /// A budget of `total` events shared by every fork of a call.
    pub fn new(total: u64, deadline: Option<Instant>) -> Self {
        Self {
            remaining: AtomicU64::new(total),
            deadline,
        }
    }

    /// Charges `events` more events and checks the deadline; `done` is reported in errors.
    pub fn charge(&self, events: u64, done: u64) -> Result<(), TwinError> {
        self.check_deadline(done)?;
        if self.take(events) {
            Ok(())
        } else {
            Err(TwinError::ResourceExhausted(format!(
                "the simulation event budget of this call ran out after {done} events"
            )))
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

    fn check_deadline(&self, events: u64) -> Result<(), TwinError> {
        match self.deadline {
            Some(deadline) if Instant::now() >= deadline => {
                Err(TwinError::DeadlineExceeded { events })
            }
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
    let mut processed = 0u64;
    for spec in arrivals.iter().filter(|s| s.arrival_us <= end_us) {
        loop {
            match engine.next_event_us() {
                Some(t) if t < spec.arrival_us => {
                    if processed.is_multiple_of(CHUNK_EVENTS) {
                        budget.charge(CHUNK_EVENTS, processed)?;
                    }
                    engine.process_next_event();
                    processed += 1;
                }
                _ => break,
            }
        }
        engine
            .submit(spec.clone())
            .map_err(|err| TwinError::invalid("background", err.to_string()))?;
    }
    Ok(processed + run_until_done(engine, end_us, budget)?)
}

/// Runs `engine` until nothing is pending or the next event is after `end_us`; returns the
/// events processed.
pub fn run_until_done(
    engine: &mut Engine,
    end_us: u64,
    budget: &EventBudget,
) -> Result<u64, TwinError> {
    let mut processed = 0u64;
    loop {
        budget.check_deadline(processed)?;
        if !budget.take(CHUNK_EVENTS) {
            return Err(TwinError::ResourceExhausted(format!(
                "the simulation event budget of this call ran out after {processed} events in this fork"
            )));
        }
        let mut chunk = 0;
        while chunk < CHUNK_EVENTS {
            match engine.next_event_us() {
                Some(t) if t <= end_us => {
                    engine.process_next_event();
                    chunk += 1;
                }
                _ => return Ok(processed + chunk),
            }
        }
        processed += chunk;
    }
}
