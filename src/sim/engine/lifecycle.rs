//! Request lifecycle transitions: arrival, enqueue, step completion, preemption, timeout,
//! and the record each request leaves behind.

use super::queue_key::{local_queue_key, queue_key};
use super::{Engine, EventKind, disagg};
use crate::sim::latency::{BatchEntry, LatencyModel};
use crate::sim::metrics::{Outcome, RequestRecord};
use crate::sim::state::{Phase, RequestState};

impl Engine {
    pub(super) fn on_arrival(&mut self, slot: u32, serial: u64) {
        let now = self.now_us;
        let max_len = u64::from(self.config.effective_max_model_len());
        let Some(state) = self.live_mut(slot, serial) else {
            return;
        };
        let input = state.spec.input_tokens;
        let needed = u64::from(input) + u64::from(state.spec.max_tokens.max(1));
        self.counts.injected += 1;
        if needed > max_len {
            self.counts.dropped += 1;
            self.retire(slot, Outcome::Dropped);
            return;
        }
        self.counts.queued += 1;
        self.metrics.queue_depth_peak = self.metrics.queue_depth_peak.max(self.counts.queued);
        let delay = self.latency.queueing_us(input);
        self.push_event(now.saturating_add(delay), EventKind::Enqueue, slot, serial);
    }

    pub(super) fn on_enqueue(&mut self, slot: u32, serial: u64) {
        let now = self.now_us;
        let policy = self.config.scheduling_policy;
        let Some(state) = self.live_mut(slot, serial) else {
            return;
        };
        debug_assert_eq!(
            state.phase,
            Phase::Arriving,
            "enqueue of a request not arriving"
        );
        state.phase = Phase::Waiting;
        state.timeline.enqueue_us = Some(now);
        let key = local_queue_key(policy, state);
        self.waiting.push_arrival(key, slot);
        self.enqueued += 1;
        self.ensure_step_scheduled();
    }

    pub(super) fn on_timeout(&mut self, slot: u32, serial: u64) {
        let policy = self.config.scheduling_policy;
        let Some(state) = self.live_mut(slot, serial) else {
            return;
        };
        let phase = state.phase;
        let key = queue_key(policy, state);
        match phase {
            Phase::Arriving => {}
            Phase::Waiting => {
                let removed = self.waiting.remove(key, slot);
                debug_assert!(removed, "timed-out waiting request missing from the queue");
                // Only a disaggregated decode half whose KV arrived waits holding blocks.
                let state = self.slots[slot as usize]
                    .as_mut()
                    .expect("live_mut found this slot");
                if !state.blocks.is_empty() {
                    self.kv.free(&mut state.blocks);
                    self.track_kv_usage();
                }
            }
            Phase::Transferring => self.abandon_transfer(slot),
            Phase::Running => {
                self.running.retain(|&s| s != slot);
                self.leave_step_in_flight(slot, serial);
                let state = self.slots[slot as usize]
                    .as_mut()
                    .expect("live_mut found this slot");
                self.kv.free(&mut state.blocks);
                self.counts.running -= 1;
                self.counts.queued += 1; // balanced by the decrement below
                self.track_kv_usage();
            }
        }
        self.counts.queued -= 1;
        self.counts.timed_out += 1;
        self.retire(slot, Outcome::TimedOut);
    }

    /// Takes the request in `slot` out of the step in flight, if it is in it: the work that
    /// step does for it is already priced, but the batch it leaves behind (the first-token
    /// delay's sequences and KV) no longer holds it, as an observation taken now would not
    /// (`Engine::observe` lists running requests only). Called only outside a lazy window
    /// (a timeout closes the window first), where `step_shape` runs beside `in_flight`.
    /// Out of line: timeouts are rare, and inlined it grows the event loop's hot code.
    #[inline(never)]
    fn leave_step_in_flight(&mut self, slot: u32, serial: u64) {
        let found = self
            .in_flight
            .iter()
            .position(|entry| entry.slot == slot && entry.serial == serial);
        if let Some(index) = found {
            self.in_flight.remove(index);
            debug_assert_eq!(self.step_shape.len(), self.in_flight.len() + 1);
            self.step_shape.remove(index);
        }
    }

    /// Ends the step in flight at `now`, then forms and schedules the next one.
    pub(super) fn on_step(&mut self) {
        debug_assert!(self.step_pending, "a step event fired with none pending");
        self.step_pending = false;
        if self.lazy.is_some() {
            if let Some(duration) = self.lazy_continue() {
                self.schedule_step_after(duration);
                return;
            }
            self.exit_lazy();
        } else {
            self.finish_in_flight();
        }
        if let Some(duration) = self.enter_lazy() {
            self.schedule_step_after(duration);
            return;
        }
        self.exit_lazy();
        // A step can come out empty when its first request preempts itself (priority
        // policy); vLLM's loop then schedules again at once. Bounded: every retry freed
        // blocks by preempting a running request.
        let mut attempts = 0;
        while !(self.waiting.is_empty() && self.running.is_empty()) {
            if let Some(duration) = self.form_batch() {
                self.counts.steps += 1;
                self.step_pending = true;
                let end = self.now_us.saturating_add(duration);
                self.push_event(end, EventKind::Step, 0, 0);
                break;
            }
            attempts += 1;
            if self.running.is_empty() && self.waits_on_cluster() {
                // Blocks held for a pull or reserved for one: the cluster's report of the
                // transfer schedules the next step.
                break;
            }
            if attempts > self.running.len() + 1 {
                debug_assert!(
                    false,
                    "no schedulable work: {} waiting, {} running, {} free blocks",
                    self.waiting.len(),
                    self.running.len(),
                    self.kv.free_blocks()
                );
                break;
            }
        }
        self.track_kv_usage();
    }

    /// Schedules the end of a (lazy) step formed now, `duration` from now.
    fn schedule_step_after(&mut self, duration: u64) {
        self.step_pending = true;
        let end = self.now_us.saturating_add(duration);
        self.push_event(end, EventKind::Step, 0, 0);
        self.track_kv_usage();
    }

    /// Schedules a step now if none is pending (work conservation).
    pub(super) fn ensure_step_scheduled(&mut self) {
        if !self.step_pending {
            self.step_pending = true;
            let now = self.now_us;
            self.push_event(now, EventKind::Step, 0, 0);
        }
    }

    /// Applies the finished step: computed tokens, emitted tokens, completions.
    fn finish_in_flight(&mut self) {
        if self.in_flight.is_empty() {
            return;
        }
        let now = self.now_us;
        let token_us = self.latency.output_token_us();
        let post_us = self.latency.post_decode_us();
        let record_gaps = self.config.record_token_gaps;
        let mut any_finished = false;
        // Gaps of one step mostly share one value: count runs locally, merge once.
        let mut run_gap = u64::MAX;
        let mut run_count = 0u64;
        let in_flight = std::mem::take(&mut self.in_flight);
        debug_assert_eq!(self.step_shape.len(), in_flight.len(), "the step's shape");
        // The first-token delay, priced once the step has a first token (`first_token_delay`).
        let batch = in_flight.len() as u64;
        let mut first_delay_us = None;
        for entry in &in_flight {
            let Some(state) = self
                .slots
                .get_mut(entry.slot as usize)
                .and_then(Option::as_mut)
                .filter(|state| state.serial == entry.serial)
            else {
                // A request that times out leaves the step (`leave_step_in_flight`).
                debug_assert!(false, "an in-flight entry outlived its request");
                continue;
            };
            debug_assert_eq!(state.phase, Phase::Running, "in-flight request not running");
            state.num_computed += entry.new_tokens;
            debug_assert!(
                state.num_computed <= state.num_tokens(),
                "computed past the sequence"
            );
            if state.num_computed < state.num_tokens() {
                continue; // a prefill chunk that emits nothing
            }
            let shape = &self.step_shape;
            let context = || kv_after(shape);
            let delay_us =
                first_token_delay(&self.latency, &mut first_delay_us, batch, context, state);
            if let Some(gap) = state.emit_token(now, token_us, delay_us, record_gaps) {
                if self.reference {
                    if self.count_gaps {
                        *self.metrics.token_gap_counts.entry(gap).or_insert(0) += 1;
                    }
                } else if gap != run_gap {
                    if run_count > 0 && self.count_gaps {
                        *self.metrics.token_gap_counts.entry(run_gap).or_insert(0) += run_count;
                    }
                    run_gap = gap;
                    run_count = 1;
                } else {
                    run_count += 1;
                }
            }
            if state.generated >= state.target_tokens() {
                let state = self.slots[entry.slot as usize]
                    .as_mut()
                    .expect("live_mut found this slot");
                state.timeline.last_token_us = state.timeline.last_token_us.saturating_add(post_us);
                disagg::release_finished(&mut self.kv, &mut self.disagg, state);
                self.counts.running -= 1;
                self.counts.completed += 1;
                self.retire(entry.slot, Outcome::Completed);
                any_finished = true;
            }
        }
        if run_count > 0 && self.count_gaps {
            *self.metrics.token_gap_counts.entry(run_gap).or_insert(0) += run_count;
        }
        self.in_flight = in_flight;
        self.in_flight.clear();
        if any_finished {
            let slots = &self.slots;
            self.running.retain(|&slot| slots[slot as usize].is_some());
        }
    }

    /// Preempts the running request in `slot` (already removed from `running`): frees its
    /// blocks, resets its progress and returns it to the wait queue.
    pub(super) fn preempt(&mut self, slot: u32) {
        let policy = self.config.scheduling_policy;
        let state = self.slots[slot as usize]
            .as_mut()
            .expect("a running slot holds a live request");
        debug_assert_eq!(
            state.phase,
            Phase::Running,
            "preempting a request not running"
        );
        self.kv.free_preempted(&mut state.blocks);
        if self.offload.is_some() {
            let id = state.spec.id.0;
            super::offload::preempted(&mut self.offload, id);
        }
        state.num_computed = 0;
        state.phase = Phase::Waiting;
        state.timeline.preemptions += 1;
        let key = queue_key(policy, state);
        self.waiting.push_preempted(key, slot);
        self.counts.preemptions += 1;
        self.counts.running -= 1;
        self.counts.queued += 1;
    }

    /// Removes the request in `slot` from the engine, leaving its record.
    pub(super) fn retire(&mut self, slot: u32, outcome: Outcome) {
        let now = self.now_us;
        // The record is read from the state where it lies, which is then dropped in place
        // (taking the state out first would copy it whole).
        let state = self.slots[slot as usize]
            .as_mut()
            .expect("retiring a live request");
        debug_assert!(
            state.blocks.is_empty(),
            "retired request still holds blocks"
        );
        let end_us = match outcome {
            Outcome::Completed => state.timeline.last_token_us,
            Outcome::Dropped | Outcome::TimedOut | Outcome::Rejected => now,
        };
        let serial = state.serial;
        if self.offload.is_some() {
            let id = state.spec.id.0;
            super::offload::finished(&mut self.offload, id);
        }
        let record = record_of(state, outcome, end_us);
        self.slots[slot as usize] = None;
        self.free_slots.push(slot);
        self.note_retired(slot, serial);
        debug_assert_causal(&record);
        if self.config.keep_request_records {
            self.metrics.records.push(record);
        } else {
            self.metrics.samples.push(&record);
        }
    }
}

/// The first-token delivery delay to hand [`RequestState::emit_token`] for `state`'s next
/// token in a step of `batch` sequences holding `context()` tokens of KV once it has run:
/// priced at most once per step (`memo`), and only when that token is the request's first
/// (the only time `emit_token` reads it; most steps emit none); `context` is summed only
/// for a model that prices it.
pub(super) fn first_token_delay(
    latency: &LatencyModel,
    memo: &mut Option<u64>,
    batch: u64,
    context: impl FnOnce() -> u64,
    state: &RequestState,
) -> u64 {
    if state.timeline.first_token_us.is_some() {
        return 0;
    }
    *memo.get_or_insert_with(|| latency.first_token_delay_us(batch, context))
}

/// Tokens of KV the sequences of the step `shape` describes hold once it has run: the
/// context the step after it reads (the first-token delay prices that step).
pub(super) fn kv_after(shape: &[BatchEntry]) -> u64 {
    shape
        .iter()
        .map(|entry| u64::from(entry.context_tokens) + u64::from(entry.new_tokens))
        .sum()
}

/// The record `state` leaves when it ends with `outcome` at `end_us`.
pub(super) fn record_of(state: &mut RequestState, outcome: Outcome, end_us: u64) -> RequestRecord {
    let timeline = &mut state.timeline;
    RequestRecord {
        id: state.spec.id,
        slo_class: state.spec.slo_class,
        outcome,
        arrival_us: state.spec.arrival_us,
        enqueue_us: timeline.enqueue_us,
        schedule_us: timeline.schedule_us,
        first_token_us: timeline.first_token_us,
        end_us,
        input_tokens: state.spec.input_tokens,
        output_tokens: state.generated,
        cached_tokens: timeline.cached_tokens,
        used_blocks_at_schedule: timeline.used_blocks_at_schedule,
        preemptions: timeline.preemptions,
        token_gap_sum_us: timeline.token_gap_sum_us,
        token_gaps_us: std::mem::take(&mut timeline.token_gaps_us),
    }
}

/// Causality: arrival <= enqueue <= schedule <= first token <= end.
fn debug_assert_causal(record: &RequestRecord) {
    let mut last = record.arrival_us;
    for (name, stamp) in [
        ("enqueue", record.enqueue_us),
        ("schedule", record.schedule_us),
        ("first_token", record.first_token_us),
    ] {
        if let Some(t) = stamp {
            debug_assert!(
                t >= last,
                "request {:?}: {name} {t} before {last}",
                record.id
            );
            last = t;
        }
    }
    if record.outcome == Outcome::Completed {
        debug_assert!(
            record.end_us >= last,
            "request {:?}: end before {last}",
            record.id
        );
    }
}
