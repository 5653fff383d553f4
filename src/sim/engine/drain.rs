//! Closed-form drains: when nothing but time can change the batch again, the end of every
//! running request follows from the step times alone, without stepping the engine.
//!
//! That holds once every running request is a member of a lazy decode window with its step
//! in flight, nothing waits or is due to arrive, no other event is pending, and the free KV
//! blocks cover what every member still needs to finish: then no allocation can fail (so no
//! preemption), no prefix lookup will ever happen again (so the cache's contents no longer
//! matter), and each step is priced from (members, total context) alone. The arithmetic is
//! the window's own (`window::lazy`'s `lazy_finish_in`, `materialize`), so the ends are exactly those a
//! run would record; property tests check this against running to the end.

use super::Engine;
use super::lifecycle::record_of;
use crate::sim::metrics::{Outcome, RequestRecord};
use crate::sim::request::RequestId;

/// When and how a running request ends in a drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainEnd {
    /// The request.
    pub id: RequestId,
    /// Its end time, as its record would say (last token seen by the client).
    pub end_us: u64,
    /// The end of the step that finishes it (the event that would retire it).
    pub finished_at_us: u64,
    /// Its record's sum of inter-token gaps.
    pub token_gap_sum_us: u64,
}

/// A drain's outcome up to a time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drain {
    /// The running requests that finish at a step ending at or before that time, in
    /// finishing order.
    pub ends: Vec<DrainEnd>,
    /// Every step event at or before that time, in order.
    pub steps: Vec<DrainStep>,
}

/// Most steps a drain reserves room for up front (a longer one grows as it goes).
const DRAIN_STEPS_RESERVED_MAX: u64 = 4096;

/// One step event of a drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainStep {
    /// When the step ends (the event's time).
    pub end_us: u64,
    /// Requests still running after it (0: the drain is over and no step is pending).
    pub running_after: u32,
}

/// A member's progress at the drain's start, as the window stores it.
struct Member {
    /// Steps (from the one in flight, counted 1) until it finishes.
    steps_left: u32,
    id: RequestId,
    /// Tokens computed once the step in flight ends.
    computed_next: u64,
    last_token_us: u64,
    last_emit_step_end_us: u64,
    token_gap_sum_us: u64,
    /// Tokens emitted since the stored timeline, once the step in flight ends.
    emitted_next: u64,
}

impl Engine {
    /// True if the batch has a drain's shape: every running request a member of a lazy
    /// window with its step in flight, nothing waiting, no other event pending. O(1); a drain
    /// also needs the free KV blocks to suffice, which [`Engine::drain`] checks.
    pub fn drain_shaped(&self) -> bool {
        self.lazy.as_ref().is_some_and(|window| {
            window.in_flight
                && window.explicit.is_empty()
                && self.waiting.is_empty()
                && self.events.len() == 1
                && self.running.len() == window.members as usize
        })
    }

    /// The drain from here to `until_us`, if nothing but time can change the batch again (see
    /// the module doc); `None` otherwise. A pure query: the engine is not advanced.
    pub fn drain(&self, until_us: u64) -> Option<Drain> {
        if !self.drain_shaped() {
            return None;
        }
        let window = self.lazy.as_ref()?;
        let step_end = self.next_event_us()?;
        let block_size = u64::from(self.config.block_size);
        let mut blocks_needed = 0u64;
        let mut members = Vec::with_capacity(self.running.len());
        for &slot in &self.running {
            let state = self.state(slot);
            let base = state.lazy_base_step?;
            let behind = window.step - base;
            let emitted = state.generated + behind;
            let target = state.target_tokens();
            // Tokens held when it finishes, at most: its whole sequence.
            let total = u64::from(state.spec.input_tokens) + u64::from(target);
            let computed_next = state.num_computed + behind + 1;
            blocks_needed += total
                .div_ceil(block_size)
                .saturating_sub(u64::from(self.held_blocks(state, computed_next)));
            members.push(Member {
                steps_left: target - emitted,
                id: state.spec.id,
                computed_next: u64::from(state.num_computed + behind) + 1,
                last_token_us: state.timeline.last_token_us,
                last_emit_step_end_us: state.timeline.last_emit_step_end_us,
                token_gap_sum_us: state.timeline.token_gap_sum_us,
                emitted_next: u64::from(behind) + 1,
            });
        }
        if blocks_needed > u64::from(self.kv.free_blocks()) {
            return None;
        }
        // Finishing order: by steps left, then batch order (as the window retires them):
        // (steps left, batch position) packed in one word, sorted unstably (the keys are
        // distinct, so the order is the stable sort's) without moving the members.
        let mut order: Vec<u64> = members
            .iter()
            .enumerate()
            .map(|(position, member)| (u64::from(member.steps_left) << 32) | position as u64)
            .collect();
        order.sort_unstable();
        let member_at = |next: usize| &members[(order[next] & u64::from(u32::MAX)) as usize];
        let token_us = self.latency.output_token_us();
        let post_us = self.latency.post_decode_us();
        // Room for every end and (up to a bound) every step: no growth while draining.
        let longest = order.last().map_or(0, |&packed| packed >> 32);
        let mut drain = Drain {
            ends: Vec::with_capacity(members.len()),
            steps: Vec::with_capacity(longest.min(DRAIN_STEPS_RESERVED_MAX) as usize),
        };
        let mut count = window.members;
        let mut context = window.context_sum;
        let mut now = step_end;
        let mut next = 0;
        let mut step = 1u32;
        // The price's terms fixed by the batch size, kept while no member finishes.
        let mut kept = None;
        loop {
            if now > until_us {
                return Some(drain);
            }
            context += count;
            while next < order.len() && member_at(next).steps_left == step {
                let member = member_at(next);
                let extra = u64::from(step - 1);
                let emitted = member.emitted_next + extra;
                let gaps = (now - member.last_emit_step_end_us)
                    .saturating_add(emitted.saturating_mul(token_us));
                drain.ends.push(DrainEnd {
                    id: member.id,
                    end_us: member
                        .last_token_us
                        .saturating_add(gaps)
                        .saturating_add(post_us),
                    finished_at_us: now,
                    token_gap_sum_us: member.token_gap_sum_us.saturating_add(gaps),
                });
                context -= member.computed_next + extra;
                count -= 1;
                next += 1;
            }
            drain.steps.push(DrainStep {
                end_us: now,
                running_after: count as u32,
            });
            if count == 0 {
                return Some(drain);
            }
            let duration = self.latency.decode_step_us(&mut kept, count, context)?;
            now = now.saturating_add(duration);
            step += 1;
        }
    }

    /// The record the running request `end.id` leaves when a drain of this engine finishes it
    /// as `end` says: what a run would record, built without running. `None` if it is not
    /// running.
    pub fn drained_record(&self, end: &DrainEnd) -> Option<RequestRecord> {
        let slot = *self
            .running
            .iter()
            .find(|&&slot| self.state(slot).spec.id == end.id)?;
        let mut state = self.state(slot).clone();
        state.generated = state.target_tokens();
        state.timeline.token_gap_sum_us = end.token_gap_sum_us;
        Some(record_of(&mut state, Outcome::Completed, end.end_us))
    }
}
