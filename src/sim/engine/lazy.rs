//! Lazy decode windows: steps in which every running request decodes one token and nothing
//! else can happen cost O(1) plus the requests that cross a KV block boundary or finish,
//! instead of a pass over the whole batch.
//!
//! A window opens after a step when the wait queue is empty, every running request is
//! decoding, emitted its token in the step that just ended, and fits the token budget, and
//! the latency model prices a decode-only batch from (count, total context). Inside it, a
//! request's progress is derived from the window's step counter (`lazy_base_step`), the
//! batch's total context is kept incrementally, and only the requests due for a KV call
//! (a block fills up or a new block is needed) or for completion are touched, in batch
//! order, exactly as the step-by-step path would. Any other event (arrival, enqueue,
//! timeout) or an allocation failure closes the window first: every request is brought up
//! to date and the step in flight, if any, is handed back as ordinary in-flight entries.
//! The reference stepper never opens a window; property tests check byte-identical results.

use crate::sim::kv::hash::shareable_blocks;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{Engine, InFlight};
use crate::sim::kv::PrefixHit;
use crate::sim::metrics::Outcome;

/// (window step, batch position, slot): an event due for one request.
type Due = Reverse<(u32, u32, u32)>;

/// The state of an open lazy decode window.
#[derive(Clone, Debug, Default)]
pub(super) struct LazyWindow {
    /// Window steps completed.
    step: u32,
    /// End time of the last completed window step (the window's start at step 0).
    prev_end_us: u64,
    /// Requests in the window (the running batch).
    members: u64,
    /// Total context of the members before the next step.
    context_sum: u64,
    /// Requests due for a KV call, by step: a ring of buckets indexed by `step % len` (a
    /// request is never due more than `block_size + 1` steps ahead), each holding
    /// (batch position, slot).
    kv_ring: Vec<Vec<(u32, u32)>>,
    /// Scratch for the bucket being processed (reused: no allocation per step).
    kv_scratch: Vec<(u32, u32)>,
    /// Requests finishing at a step.
    done_due: BinaryHeap<Due>,
    /// Scratch for the requests finishing at a step (reused).
    done_scratch: Vec<u32>,
    /// A window step is formed and pending.
    in_flight: bool,
}

impl Engine {
    /// Opens a window if the conditions hold (called after a step's effects, before forming
    /// the next). Returns true if a window is now open.
    pub(super) fn try_enter_lazy(&mut self) -> bool {
        if self.reference
            || self.config.record_token_gaps
            || !self.waiting.is_empty()
            || self.running.is_empty()
            || self.running.len() > self.config.max_num_batched_tokens as usize
            || self.latency.decode_step_us(1, 0).is_none()
        {
            return false;
        }
        let now = self.now_us;
        let eligible = self.running.iter().all(|&slot| {
            let state = self.state(slot);
            state.is_decoding() && state.timeline.last_emit_step_end_us == now
        });
        if !eligible {
            return false;
        }
        let ring_len = self.config.block_size as usize + 2;
        let mut window = LazyWindow {
            prev_end_us: now,
            members: self.running.len() as u64,
            kv_ring: vec![Vec::new(); ring_len],
            ..LazyWindow::default()
        };
        for position in 0..self.running.len() {
            let slot = self.running[position];
            let state = self.state_mut_internal(slot);
            state.lazy_base_step = 0;
            let computed = state.num_computed;
            let remaining = state.target_tokens() - state.generated;
            window.context_sum += u64::from(computed);
            window
                .done_due
                .push(Reverse((remaining, position as u32, slot)));
            let next = self
                .next_kv_step(slot, 0, computed)
                .min(ring_len as u32 - 1);
            let bucket = next as usize % ring_len;
            window.kv_ring[bucket].push((position as u32, slot));
        }
        self.lazy = Some(Box::new(window));
        true
    }

    /// The first window step after `step` (at which the request has computed `computed`
    /// tokens before it) whose token needs a KV call: a new block, or a block filling up.
    fn next_kv_step(&self, slot: u32, step: u32, computed: u32) -> u32 {
        let state = self.state(slot);
        let block_size = self.config.block_size;
        let held = state.blocks.len() * block_size + 1;
        let threshold = if self.config.enable_prefix_caching {
            held.min((state.blocks.num_keyed + 1) * block_size)
        } else {
            held
        };
        // At window step s the token computed is number computed + (s - step) + 1.
        let total_next = computed + 1;
        step + 1 + threshold.saturating_sub(total_next)
    }

    /// Forms the next window step; `None` if a KV allocation fails (the caller closes the
    /// window and lets the step-by-step path preempt).
    pub(super) fn lazy_form(&mut self) -> Option<u64> {
        let block_size = self.config.block_size;
        let prefix_caching = self.config.enable_prefix_caching;
        let window = self.lazy.as_mut().expect("a window is open");
        let step = window.step + 1;
        let ring_len = window.kv_ring.len();
        let mut due = std::mem::take(&mut window.kv_scratch);
        due.clear();
        due.append(&mut window.kv_ring[step as usize % ring_len]);
        // Batch order, as the step-by-step path allocates.
        due.sort_unstable();
        let window_step = step - 1;
        for index in 0..due.len() {
            let (position, slot) = due[index];
            let Some(state) = self.slots[slot as usize].as_mut() else {
                continue; // finished earlier in the window
            };
            let computed = state.num_computed + (window_step - state.lazy_base_step);
            let total = computed + 1;
            if prefix_caching {
                state.ensure_keys(total / block_size, block_size);
            }
            if !self.kv.allocate(
                &mut state.blocks,
                &state.keys,
                PrefixHit::default(),
                total,
                shareable_blocks(&state.spec, block_size),
            ) {
                // The window closes; the step-by-step path redoes this step (the calls made
                // above stand: it finds their blocks in place).
                let window = self.lazy.as_mut().expect("a window is open");
                window.kv_ring[step as usize % ring_len].extend_from_slice(&due[index..]);
                window.kv_scratch = due;
                return None;
            }
            // A call earlier than needed is harmless (it finds nothing to do and reschedules),
            // so a far one is clamped to the ring.
            let next = self
                .next_kv_step(slot, step, total)
                .min(step + ring_len as u32 - 1);
            let window = self.lazy.as_mut().expect("a window is open");
            window.kv_ring[next as usize % ring_len].push((position, slot));
        }
        let window = self.lazy.as_mut().expect("a window is open");
        window.kv_scratch = due;
        let window = self.lazy.as_mut().expect("a window is open");
        window.in_flight = true;
        let duration = self
            .latency
            .decode_step_us(window.members, window.context_sum)
            .expect("windows open only for models pricing decode batches");
        self.counts.steps += 1;
        self.lazy_steps += 1;
        Some(duration)
    }

    /// Applies the window step that just ended: one token for every member, one gap each,
    /// and the members that finish.
    pub(super) fn lazy_finish(&mut self) {
        let now = self.now_us;
        let token_us = self.latency.output_token_us();
        let post_us = self.latency.post_decode_us();
        let window = self.lazy.as_mut().expect("a window is open");
        debug_assert!(window.in_flight, "a window step ended with none formed");
        window.in_flight = false;
        let gap = (now - window.prev_end_us).saturating_add(token_us);
        *self.metrics.token_gap_counts.entry(gap).or_insert(0) += window.members;
        window.step += 1;
        window.prev_end_us = now;
        window.context_sum += window.members;
        let step = window.step;
        let mut finished = std::mem::take(&mut window.done_scratch);
        finished.clear();
        while let Some(&Reverse((at, _, slot))) = window.done_due.peek() {
            if at != step {
                break;
            }
            window.done_due.pop();
            finished.push(slot);
        }
        for &slot in &finished {
            self.materialize(slot);
            let state = self.state_mut_internal(slot);
            debug_assert_eq!(
                state.generated,
                state.target_tokens(),
                "finishing early or late"
            );
            let computed = u64::from(state.num_computed);
            state.timeline.last_token_us = state.timeline.last_token_us.saturating_add(post_us);
            self.kv
                .free(&mut self.slots[slot as usize].as_mut().expect("member").blocks);
            self.counts.running -= 1;
            self.counts.completed += 1;
            self.retire(slot, Outcome::Completed);
            let window = self.lazy.as_mut().expect("a window is open");
            window.members -= 1;
            window.context_sum -= computed;
        }
        if !finished.is_empty() {
            // (Finished members' queued KV calls are skipped when their step comes.)
            let slots = &self.slots;
            self.running.retain(|&slot| slots[slot as usize].is_some());
        }
        if let Some(window) = self.lazy.as_mut() {
            window.done_scratch = finished;
        }
    }

    /// Brings one member's progress and timeline up to the window's current step.
    fn materialize(&mut self, slot: u32) {
        let Some(window) = self.lazy.as_ref() else {
            return;
        };
        let (step, prev_end) = (window.step, window.prev_end_us);
        let token_us = self.latency.output_token_us();
        let state = self.state_mut_internal(slot);
        let delta = step - state.lazy_base_step;
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
        state.lazy_base_step = step;
    }

    /// Closes the window: every member up to date, a pending window step handed back as
    /// ordinary in-flight entries.
    pub(super) fn exit_lazy(&mut self) {
        let Some(window) = self.lazy.as_ref() else {
            return;
        };
        let in_flight = window.in_flight;
        for index in 0..self.running.len() {
            let slot = self.running[index];
            self.materialize(slot);
        }
        self.lazy = None;
        if in_flight {
            debug_assert!(
                self.in_flight.is_empty(),
                "window steps keep no in-flight entries"
            );
            for index in 0..self.running.len() {
                let slot = self.running[index];
                let serial = self.state(slot).serial;
                self.in_flight.push(InFlight {
                    slot,
                    serial,
                    new_tokens: 1,
                });
            }
        }
    }

    /// Tokens a member has progressed in the open window beyond its stored fields (0 when no
    /// window is open).
    pub(super) fn lazy_delta(&self, slot: u32) -> u32 {
        match &self.lazy {
            Some(window) => window.step - self.state(slot).lazy_base_step,
            None => 0,
        }
    }

    /// True if a window step is formed and pending.
    pub(super) fn lazy_step_in_flight(&self) -> bool {
        self.lazy.as_ref().is_some_and(|window| window.in_flight)
    }

    fn state_mut_internal(&mut self, slot: u32) -> &mut crate::sim::state::RequestState {
        self.slots[slot as usize]
            .as_mut()
            .expect("window members are live requests")
    }
}
