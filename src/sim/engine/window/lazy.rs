//! Lazy decode windows: steps in which the decoding requests each compute one token cost
//! O(1) for them plus the ones that cross a KV block boundary or finish, instead of a pass
//! over the whole batch. Requests still prefilling run beside the window, handled one by one.
//!
//! A window opens after a step when every running request either is decoding and emitted
//! its token in the step that just ended (a *member*), or is still prefilling (an *explicit*
//! request), at least one is a member, and the latency model prices decodes from (count,
//! total context). Inside it, a member's progress is derived from the window's step counter
//! (`lazy_base_step`), the members' total context is kept incrementally, and only the
//! members due for a KV call (a block fills up or a new block is needed) or for completion
//! are touched. Each step walks them and the explicit requests in batch order, exactly as
//! vLLM's phase 1 would, then admits waiting requests (phase 2) as explicit requests; an
//! explicit request that emits its first token joins the members. Arrivals and enqueues leave
//! the window open. A timeout, an allocation failure, or a token budget that would not reach
//! every running request closes it first: every member is brought up to date and the step in
//! flight, if any, is handed back as ordinary in-flight entries, so the step-by-step path
//! takes over (and preempts where it must).
//!
//! The reference stepper never opens a window; property tests check byte-identical results.

use std::cmp::Reverse;

use super::{LazyWindow, POSITION_SLACK, next_kv_step_of};
use crate::sim::engine::lifecycle::{first_token_delay, kv_after};
use crate::sim::engine::{Engine, InFlight, disagg};
use crate::sim::metrics::Outcome;
use crate::sim::state::RequestState;

impl Engine {
    /// Opens a window and forms its first step if the conditions hold (called after a step's
    /// effects, instead of forming the next). `None` if no window opened, or if its first step
    /// must be formed step by step (the caller then closes the window).
    pub(in crate::sim::engine) fn enter_lazy(&mut self) -> Option<u64> {
        if self.reference
            || self.config.record_token_gaps
            || self.offload.is_some()
            || self.running.is_empty()
            || self.running.len() > self.config.max_num_batched_tokens as usize
            || self.latency.step_with_decodes_us(&[], 1, 0).is_none()
        {
            return None;
        }
        let now = self.now_us;
        let mut members = 0usize;
        for &slot in &self.running {
            let state = self.state(slot);
            if state.is_decoding() {
                if state.timeline.last_emit_step_end_us != now {
                    return None;
                }
                members += 1;
            }
        }
        if members == 0 {
            return None;
        }
        // A power of two, so a bucket is found with a mask rather than a division.
        let ring_len = (self.config.block_size as usize + 2).next_power_of_two();
        let mut window = self.lazy_spare.0.take().unwrap_or_default();
        window.reset(now, ring_len, self.running.len() as u32);
        for position in 0..self.running.len() {
            let slot = self.running[position];
            if self.state(slot).is_decoding() {
                self.join_window(&mut window, position as u32, slot);
            } else {
                window.explicit.push((position as u32, slot));
            }
        }
        self.form_in(window)
    }

    /// Makes the decoding request in `slot` (at batch `position`, just emitted a token at the
    /// window's current step) a member.
    fn join_window(&mut self, window: &mut LazyWindow, position: u32, slot: u32) {
        let step = window.step;
        let ring_len = window.kv_ring.len() as u32;
        let (block_size, prefix_caching) =
            (self.config.block_size, self.config.enable_prefix_caching);
        let state = self.state_mut_internal(slot);
        debug_assert!(state.is_decoding(), "only decoding requests join a window");
        state.lazy_base_step = Some(step);
        let serial = state.serial;
        let index = position as usize;
        if window.by_position.len() <= index {
            window.by_position.resize(index + 1, (u32::MAX, 0));
        }
        window.by_position[index] = (slot, serial);
        let computed = state.num_computed;
        let remaining = state.target_tokens() - state.generated;
        window.members += 1;
        window.context_sum += u64::from(computed);
        let next = next_kv_step_of(state, step, computed, block_size, prefix_caching)
            .min(step + ring_len - 1);
        window
            .done_due
            .push(Reverse((step + remaining, position, slot)));
        window.kv_ring[(next & (ring_len - 1)) as usize].push(position);
    }

    /// Forms the next window step; `None` if the step-by-step path must form it instead (a
    /// KV allocation fails, or the token budget would not reach every running request). The
    /// caller then closes the window; allocations made here stand and are found in place.
    fn form_in(&mut self, mut window: Box<LazyWindow>) -> Option<u64> {
        let formed = self.lazy_form_in(&mut window);
        if formed.is_none() {
            self.in_flight.clear();
        }
        self.lazy = Some(window);
        formed
    }

    fn lazy_form_in(&mut self, window: &mut LazyWindow) -> Option<u64> {
        debug_assert!(
            self.in_flight.is_empty(),
            "a window step over one in flight"
        );
        if window.next_position as usize > 2 * self.running.len() + POSITION_SLACK {
            self.compact_positions(window);
        }
        let max_budget = u64::from(self.config.max_num_batched_tokens);
        // Phase 1's budget: each member takes one token; an explicit request takes a chunk
        // of what the requests ahead of it left.
        self.count_members_ahead(window);
        let mut explicit_tokens = 0u64;
        for index in 0..window.explicit.len() {
            let slot = window.explicit[index].1;
            let ahead = u64::from(window.members_ahead[index]);
            let left = max_budget.checked_sub(ahead + explicit_tokens)?;
            if left == 0 {
                return None;
            }
            let state = self.state(slot);
            let tokens = self.chunk(state.remaining_tokens(), left as u32);
            let serial = state.serial;
            explicit_tokens += u64::from(tokens);
            self.in_flight.push(InFlight {
                slot,
                serial,
                new_tokens: tokens,
            });
        }
        // Every running request must get its tokens (the last may take the budget to zero).
        let mut budget = max_budget.checked_sub(window.members + explicit_tokens)? as u32;
        self.window_kv_calls(window)?;
        // Phase 2: admissions become explicit requests.
        let admitted_from = self.running.len();
        let cpu_loads = self.admit_waiting(&mut budget);
        for index in admitted_from..self.running.len() {
            window
                .explicit
                .push((window.next_position, self.running[index]));
            window.next_position += 1;
        }
        // (Past admissions nothing may fail: the step-by-step path could not redo them.)
        let (members, context) = (window.members, window.context_sum);
        let step = if self.in_flight.is_empty() {
            // An all-decode step (most are): priced from the kept terms, nothing shaped.
            self.latency
                .decode_step_us(&mut window.decode_steps, members, context)
        } else {
            self.shape_in_flight();
            self.latency
                .step_with_decodes_us(&self.step_shape, members, context)
        };
        let duration = step
            .expect("windows open only for models pricing decodes from (count, context)")
            .saturating_add(self.host_us(cpu_loads));
        window.in_flight = true;
        self.counts.steps += 1;
        self.lazy_steps += 1;
        if !window.explicit.is_empty() {
            self.mixed_lazy_steps += 1;
        }
        Some(duration)
    }

    /// Fills `members_ahead`: for each explicit request, the members before it in the batch.
    /// Walks the batch from its end, where admissions join, only as far back as the first
    /// explicit request (the explicit ones are mostly the newest).
    fn count_members_ahead(&self, window: &mut LazyWindow) {
        let count = window.explicit.len();
        window.members_ahead.clear();
        window.members_ahead.resize(count, 0);
        // The explicit request to find next, going backwards, is `explicit[next - 1]`.
        let mut next = count;
        for (index, &slot) in self.running.iter().enumerate().rev() {
            if next == 0 {
                break;
            }
            if window.explicit[next - 1].1 == slot {
                next -= 1;
                // Before it: `index` requests, `next` of them explicit.
                window.members_ahead[next] = (index - next) as u32;
            }
        }
        debug_assert_eq!(next, 0, "explicit requests are running, in batch order");
    }

    /// Applies the window step that just ended and forms the next; `None` if there is no
    /// window, or the window has no members left or its next step must be formed step by
    /// step (the caller then closes it).
    pub(in crate::sim::engine) fn lazy_continue(&mut self) -> Option<u64> {
        let mut window = self.lazy.take()?;
        self.lazy_finish_in(&mut window);
        if window.members == 0 {
            self.lazy = Some(window);
            return None;
        }
        self.form_in(window)
    }

    /// Applies the window step that just ended: one token for every member, the explicit
    /// requests' chunks, and the requests that finish (in batch order).
    fn lazy_finish_in(&mut self, window: &mut LazyWindow) {
        let mut finished = self.advance_window_step(window);
        let members_done = finished.len();
        self.apply_explicit_chunks(window, &mut finished);
        if members_done < finished.len() && members_done > 0 {
            // Completions retire in batch order, members and explicit requests interleaved.
            finished.sort_unstable();
        }
        self.retire_window_finished(window, &finished);
        self.remove_finished_from_running(&finished);
        window.done_scratch = finished;
    }

    /// Moves the window one step on (every member emitted a token) and returns the members
    /// that finish at it, as (position, slot, member) in the window's reusable list.
    #[inline]
    fn advance_window_step(&mut self, window: &mut LazyWindow) -> Vec<(u32, u32, bool)> {
        let now = self.now_us;
        let token_us = self.latency.output_token_us();
        debug_assert!(window.in_flight, "a window step ended with none formed");
        window.in_flight = false;
        let gap = (now - window.prev_end_us).saturating_add(token_us);
        if window.members > 0 && self.count_gaps {
            *self.metrics.token_gap_counts.entry(gap).or_insert(0) += window.members;
        }
        window.step += 1;
        window.prev_end_us = now;
        window.context_sum += window.members;
        let step = window.step;
        let mut finished = std::mem::take(&mut window.done_scratch);
        finished.clear();
        while let Some(&Reverse((at, position, slot))) = window.done_due.peek() {
            if at != step {
                break;
            }
            window.done_due.pop();
            finished.push((position, slot, true));
        }
        finished
    }

    /// The explicit requests' chunks of the step that ended: tokens emitted, members joining,
    /// the ones that finish appended to `finished`.
    #[inline]
    fn apply_explicit_chunks(
        &mut self,
        window: &mut LazyWindow,
        finished: &mut Vec<(u32, u32, bool)>,
    ) {
        let now = self.now_us;
        let token_us = self.latency.output_token_us();
        let entries = std::mem::take(&mut self.in_flight);
        debug_assert_eq!(entries.len(), window.explicit.len(), "one entry each");
        debug_assert!(
            entries.is_empty() || self.step_shape.len() == entries.len(),
            "the explicit entries' shape"
        );
        // The step's sequences: every member (finished ones included) plus the explicit.
        let batch = window.members + entries.len() as u64;
        // The first-token delay, priced once the step has a first token (`first_token_delay`),
        // from the KV the step leaves: the members' (before explicit requests join them
        // below) and the explicit requests'.
        let mut first_delay_us = None;
        let members_kv = window.context_sum;
        let mut still_explicit = 0;
        for (index, entry) in entries.iter().enumerate() {
            let (position, slot) = window.explicit[index];
            debug_assert_eq!(entry.slot, slot, "entries follow the explicit requests");
            let state = self.slots[slot as usize]
                .as_mut()
                .expect("window requests are live");
            state.num_computed += entry.new_tokens;
            if state.num_computed < state.num_tokens() {
                window.explicit[still_explicit] = (position, slot);
                still_explicit += 1;
                continue; // a prefill chunk that emits nothing
            }
            let shape = &self.step_shape;
            let context = || members_kv + kv_after(shape);
            let delay_us =
                first_token_delay(&self.latency, &mut first_delay_us, batch, context, state);
            if let Some(gap) = state.emit_token(now, token_us, delay_us, false)
                && self.count_gaps
            {
                *self.metrics.token_gap_counts.entry(gap).or_insert(0) += 1;
            }
            if state.generated >= state.target_tokens() {
                finished.push((position, slot, false));
            } else {
                self.join_window(window, position, slot);
            }
        }
        window.explicit.truncate(still_explicit);
        self.in_flight = entries;
        self.in_flight.clear();
    }

    /// Retires the requests that finished at the window's step, in batch order (members
    /// brought up to date first).
    #[inline]
    fn retire_window_finished(&mut self, window: &mut LazyWindow, finished: &[(u32, u32, bool)]) {
        let post_us = self.latency.post_decode_us();
        for &(position, slot, member) in finished {
            if member {
                self.materialize(window, slot);
                let total = self.state(slot).num_computed;
                if self.state(slot).lagging_blocks {
                    self.leave_steady_ring(window, position, total);
                }
                self.catch_up_member(slot, total);
            }
            let state = self.slots[slot as usize]
                .as_mut()
                .expect("window requests are live");
            debug_assert_eq!(
                state.generated,
                state.target_tokens(),
                "finishing early or late"
            );
            let computed = u64::from(state.num_computed);
            state.timeline.last_token_us = state.timeline.last_token_us.saturating_add(post_us);
            disagg::release_finished(&mut self.kv, &mut self.disagg, state);
            self.counts.running -= 1;
            self.counts.completed += 1;
            self.retire(slot, Outcome::Completed);
            if member {
                window.members -= 1;
                window.context_sum -= computed;
            }
        }
    }

    /// Takes the retired requests out of the running batch (finished members' queued KV
    /// calls are skipped when their step comes).
    #[inline]
    fn remove_finished_from_running(&mut self, finished: &[(u32, u32, bool)]) {
        if finished.len() <= 2 {
            // Usually one: found by a scan that only compares, then removed in one move.
            for &(_, slot, _) in finished {
                let index = self
                    .running
                    .iter()
                    .position(|&running| running == slot)
                    .expect("finished requests were running");
                self.running.remove(index);
            }
        } else {
            let slots = &self.slots;
            self.running.retain(|&slot| slots[slot as usize].is_some());
        }
    }

    /// Brings one member's progress and timeline up to the window's current step.
    fn materialize(&mut self, window: &LazyWindow, slot: u32) {
        let (step, prev_end) = (window.step, window.prev_end_us);
        let token_us = self.latency.output_token_us();
        let state = self.state_mut_internal(slot);
        let Some(base) = state.lazy_base_step else {
            return;
        };
        let delta = step - base;
        if delta == 0 {
            return;
        }
        state.num_computed += delta;
        state.generated += delta;
        let gaps = (prev_end - state.timeline.last_emit_step_end_us)
            .saturating_add(u64::from(delta).saturating_mul(token_us));
        let timeline = &mut state.timeline;
        timeline.last_token_us = timeline.last_token_us.saturating_add(gaps);
        timeline.token_gap_sum_us = timeline.token_gap_sum_us.saturating_add(gaps);
        timeline.last_emit_step_end_us = prev_end;
        state.lazy_base_step = Some(step);
    }

    /// Closes the window: every member up to date, a pending window step handed back as
    /// ordinary in-flight entries (in batch order).
    pub(in crate::sim::engine) fn exit_lazy(&mut self) {
        let Some(window) = self.lazy.take() else {
            return;
        };
        let pending = u32::from(window.in_flight);
        for index in 0..self.running.len() {
            let slot = self.running[index];
            if self.state(slot).lazy_base_step.is_none() {
                continue; // explicit: always up to date
            }
            self.materialize(&window, slot);
            let state = self.state_mut_internal(slot);
            state.lazy_base_step = None;
            // Its table as the step-by-step path would have it by now (its pending token
            // included).
            let total = state.num_computed + pending;
            self.catch_up_member(slot, total);
        }
        if window.in_flight {
            let explicit = std::mem::take(&mut self.in_flight);
            self.in_flight = self.merge_window_batch(&explicit);
            // Described whole, as the step-by-step path leaves a step it formed (the window
            // shaped only the explicit entries; the first-token delay reads the shape).
            self.shape_in_flight();
        }
        self.lazy_spare.0 = Some(window);
    }

    /// The whole batch of a pending window step, in batch order: every running request,
    /// members with one token, explicit requests with their entries in `explicit`.
    fn merge_window_batch(&self, explicit: &[InFlight]) -> Vec<InFlight> {
        let mut next = 0;
        self.running
            .iter()
            .map(|&slot| {
                if next < explicit.len() && explicit[next].slot == slot {
                    next += 1;
                    explicit[next - 1]
                } else {
                    InFlight {
                        slot,
                        serial: self.state(slot).serial,
                        new_tokens: 1,
                    }
                }
            })
            .collect()
    }

    /// The step in flight as ordinary entries, whether or not a window formed it.
    pub(in crate::sim::engine) fn batch_entries(&self) -> Vec<InFlight> {
        if self.lazy_step_in_flight() {
            self.merge_window_batch(&self.in_flight)
        } else {
            self.in_flight.clone()
        }
    }

    /// Tokens a member has progressed in the open window beyond its stored fields (0 when no
    /// window is open, or for a request outside it).
    pub(in crate::sim::engine) fn lazy_delta(&self, slot: u32) -> u32 {
        match (&self.lazy, self.state(slot).lazy_base_step) {
            (Some(window), Some(base)) => window.step - base,
            _ => 0,
        }
    }

    /// True if a window step is formed and pending.
    pub(in crate::sim::engine) fn lazy_step_in_flight(&self) -> bool {
        self.lazy.as_ref().is_some_and(|window| window.in_flight)
    }

    fn state_mut_internal(&mut self, slot: u32) -> &mut RequestState {
        self.slots[slot as usize]
            .as_mut()
            .expect("window requests are live")
    }
}
