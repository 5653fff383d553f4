//! Batch formation, as vLLM v1's scheduler does it.
//!
//! Phase 1 walks the running requests in order, giving each its next tokens (one for a
//! decode, a chunk for a prefill, bounded by the remaining budget and
//! `long_prefill_token_threshold`) and allocating their KV blocks; when blocks run out it
//! preempts (the batch tail under `fcfs`/`sjf`, the least urgent request under `priority`)
//! until the allocation fits or the request preempts itself. Phase 2, only if nothing was
//! preempted, admits waiting requests while seats, budget and blocks last, taking prefix-cache
//! hits first. The result is the step's duration from the latency model.

use super::queue_key::{local_queue_key, queue_key};
use super::{AdmissionReach, Engine, InFlight};
use crate::sim::config::SchedulingPolicy;
use crate::sim::kv::PrefixHit;
use crate::sim::latency::BatchEntry;
use crate::sim::queue::QueueKey;
use crate::sim::state::{PdMode, Phase};

impl Engine {
    /// Forms the next batch into `in_flight`; returns its duration, or `None` if empty.
    pub(super) fn form_batch(&mut self) -> Option<u64> {
        debug_assert!(
            self.in_flight.is_empty(),
            "forming a batch over one in flight"
        );
        let mut budget = self.config.max_num_batched_tokens;
        let preempted = self.schedule_running(&mut budget);
        let mut cpu_loads = 0u64;
        if preempted {
            self.reach = AdmissionReach::Nothing;
        } else {
            cpu_loads = self.admit_waiting(&mut budget);
        }
        if self.in_flight.is_empty() {
            return None;
        }
        self.shape_in_flight();
        let step = self.latency.step_us(&self.step_shape);
        let step = step.saturating_add(self.host_us(cpu_loads));
        Some(step.max(self.store_offloads()))
    }

    /// The host's share of a step formed now, beside the latency model's price of its batch:
    /// the waiting queue's cost (`LatencyModel::waiting_us` of the requests left waiting) and
    /// the step's `cpu_loads` CPU-tier block loads. One place for both step paths.
    pub(super) fn host_us(&self, cpu_loads: u64) -> u64 {
        let waiting = self.latency.waiting_us(self.waiting.len() as u64);
        waiting.saturating_add(cpu_loads.saturating_mul(self.config.cpu_block_load_us))
    }

    /// Describes the entries of `in_flight`, in order, into `step_shape` for pricing.
    #[inline]
    pub(super) fn shape_in_flight(&mut self) {
        self.step_shape.clear();
        for index in 0..self.in_flight.len() {
            let entry = self.in_flight[index];
            let state = self.state(entry.slot);
            let context_tokens = state.num_computed;
            let prompt_tokens = state.num_tokens();
            let is_prefill = !state.is_decoding();
            self.step_shape.push(BatchEntry {
                context_tokens,
                new_tokens: entry.new_tokens,
                prompt_tokens,
                is_prefill,
            });
        }
    }

    /// Phase 1. Returns true if any request was preempted.
    fn schedule_running(&mut self, budget: &mut u32) -> bool {
        let reference = self.reference;
        let block_size = self.config.block_size;
        let prefix_caching = self.config.enable_prefix_caching;
        let mut preempted = false;
        let mut index = 0;
        while index < self.running.len() && *budget > 0 {
            let slot = self.running[index];
            let new_tokens = self.chunk(self.state(slot).remaining_tokens(), *budget);
            debug_assert!(new_tokens > 0, "a running request with nothing to compute");
            let scheduled = loop {
                let state = self.slots[slot as usize]
                    .as_mut()
                    .expect("a running slot holds a live request");
                let total = state.num_computed + new_tokens;
                // Fast path: the tokens fit the blocks held and no block fills up.
                if !reference
                    && total <= state.blocks.len() * block_size
                    && (!prefix_caching || total < (state.blocks.num_keyed + 1) * block_size)
                {
                    break true;
                }
                if prefix_caching {
                    state.ensure_keys(total / block_size, block_size);
                }
                if state.allocate_blocks(&mut self.kv, PrefixHit::default(), total, block_size) {
                    break true;
                }
                let victim_index = self.pick_victim();
                let victim = self.running.remove(victim_index);
                if victim_index < index {
                    // Already scheduled this step: give its tokens back.
                    let position = self
                        .in_flight
                        .iter()
                        .position(|entry| entry.slot == victim)
                        .expect("requests before the cursor are in the batch");
                    *budget += self.in_flight.remove(position).new_tokens;
                    index -= 1;
                }
                self.preempt(victim);
                preempted = true;
                if victim == slot {
                    break false;
                }
            };
            if !scheduled {
                break;
            }
            let serial = self.state(slot).serial;
            self.in_flight.push(InFlight {
                slot,
                serial,
                new_tokens,
            });
            *budget -= new_tokens;
            index += 1;
        }
        preempted
    }

    /// Phase 2. Returns the number of blocks reloaded from the CPU tier; leaves how far it
    /// walked the queue in `reach`. (Inlined: most steps find the queue empty, and say so
    /// without a call.)
    #[inline]
    pub(super) fn admit_waiting(&mut self, budget: &mut u32) -> u64 {
        if self.waiting.is_empty() {
            // What the walk would conclude at its first stop.
            let seated = *budget == 0 || self.running.len() >= self.config.max_num_seqs as usize;
            self.reach = if seated {
                AdmissionReach::Nothing
            } else {
                AdmissionReach::Everything
            };
            return 0;
        }
        self.admit_from_queue(budget)
    }

    /// [`Self::admit_waiting`] with requests waiting.
    #[inline(never)]
    fn admit_from_queue(&mut self, budget: &mut u32) -> u64 {
        let block_size = self.config.block_size;
        let prefix_caching = self.config.enable_prefix_caching;
        let max_seqs = self.config.max_num_seqs as usize;
        let chunked = self.config.enable_chunked_prefill;
        let now = self.now_us;
        let policy = self.config.scheduling_policy;
        let mut cpu_loads = 0u64;
        // The key of the last request admitted: a newcomer below it would have come first.
        let mut last_admitted = None;
        self.reach = loop {
            if *budget == 0 || self.running.len() >= max_seqs {
                break last_admitted.map_or(AdmissionReach::Nothing, AdmissionReach::Below);
            }
            let Some(slot) = self.waiting.peek() else {
                break AdmissionReach::Everything;
            };
            let mut state = self.slots[slot as usize]
                .as_mut()
                .expect("a waiting slot holds a live request");
            if state.pd != PdMode::Local {
                match self.admit_half(slot, budget) {
                    HalfAdmission::Admitted(key) => {
                        last_admitted = Some(key);
                        continue;
                    }
                    HalfAdmission::Waits(key) => break AdmissionReach::Below(key),
                    HalfAdmission::AsLocal => {}
                }
                state = self.slots[slot as usize]
                    .as_mut()
                    .expect("a waiting slot holds a live request");
            }
            debug_assert_eq!(
                state.num_computed, 0,
                "a waiting request holds computed tokens"
            );
            let num_tokens = state.num_tokens();
            let hit = if prefix_caching {
                state.ensure_keys(num_tokens / block_size, block_size);
                // At least one token is always computed, so a full hit leaves the last block.
                self.kv
                    .lookup(state.block_keys(block_size), (num_tokens - 1) / block_size)
            } else {
                PrefixHit::default()
            };
            let cached = hit.blocks() * block_size;
            let wanted = num_tokens - cached;
            let key = local_queue_key(policy, state);
            if !chunked && wanted > *budget {
                break AdmissionReach::Below(key);
            }
            let new_tokens = self.chunk(wanted, *budget);
            let state = self.slots[slot as usize]
                .as_mut()
                .expect("a waiting slot holds a live request");
            if !state.allocate_blocks(&mut self.kv, hit, cached + new_tokens, block_size) {
                break AdmissionReach::Below(key);
            }
            if prefix_caching {
                self.kv.record_lookup(num_tokens, cached);
            }
            state.num_computed = cached;
            state.phase = Phase::Running;
            if state.timeline.schedule_us.is_none() {
                state.timeline.schedule_us = Some(now);
                state.timeline.cached_tokens = cached;
            }
            let serial = state.serial;
            if state.timeline.used_blocks_at_schedule == 0 {
                state.timeline.used_blocks_at_schedule = self.kv.used_blocks();
            }
            self.waiting.pop();
            self.running.push(slot);
            self.counts.queued -= 1;
            self.counts.running += 1;
            cpu_loads += u64::from(hit.cpu_blocks);
            self.in_flight.push(InFlight {
                slot,
                serial,
                new_tokens,
            });
            *budget -= new_tokens;
            last_admitted = Some(key);
        };
        cpu_loads
    }

    /// Phase 2 for the head of the queue when it is a disaggregated half: a decode half
    /// reserves its blocks and starts its pull, or enters with its pulled blocks; anything
    /// else (a prefill half, a pulled half since preempted) is admitted as a local request.
    /// Out of line: a plain run never comes here.
    #[inline(never)]
    fn admit_half(&mut self, slot: u32, budget: &mut u32) -> HalfAdmission {
        let policy = self.config.scheduling_policy;
        let state = self.slots[slot as usize]
            .as_ref()
            .expect("a waiting slot holds a live request");
        let key = queue_key(policy, state);
        let admitted = match state.pd {
            PdMode::RemoteKv { pulled: false } => self.reserve_transfer(slot),
            PdMode::RemoteKv { pulled: true } if !state.blocks.is_empty() => {
                self.admit_pulled(slot, budget)
            }
            _ => return HalfAdmission::AsLocal,
        };
        if admitted {
            HalfAdmission::Admitted(key)
        } else {
            HalfAdmission::Waits(key)
        }
    }

    /// Admits a decode half holding its reserved blocks after its pull: the prompt but its
    /// last token computed (the step computes that token, which emits the first output
    /// token), or nothing computed if the pull failed (it computes its prompt in chunks as
    /// any request). False, changing nothing, if the budget or the blocks for it run out
    /// (it stays first in the queue).
    fn admit_pulled(&mut self, slot: u32, budget: &mut u32) -> bool {
        let block_size = self.config.block_size;
        let prefix_caching = self.config.enable_prefix_caching;
        let state = self.state(slot);
        let total = state.num_tokens();
        let wanted = total - state.num_computed;
        if !self.config.enable_chunked_prefill && wanted > *budget {
            return false;
        }
        let new_tokens = self.chunk(wanted, *budget);
        let state = self.slots[slot as usize]
            .as_mut()
            .expect("a waiting slot holds a live request");
        let upto = state.num_computed + new_tokens;
        if prefix_caching {
            state.ensure_keys(upto / block_size, block_size);
        }
        if !state.allocate_blocks(&mut self.kv, PrefixHit::default(), upto, block_size) {
            return false;
        }
        state.phase = Phase::Running;
        let serial = state.serial;
        self.waiting.pop();
        self.running.push(slot);
        self.counts.queued -= 1;
        self.counts.running += 1;
        self.in_flight.push(InFlight {
            slot,
            serial,
            new_tokens,
        });
        *budget -= new_tokens;
        true
    }

    /// Tokens to compute this step out of `wanted`, given the budget left.
    pub(super) fn chunk(&self, wanted: u32, budget: u32) -> u32 {
        let threshold = self.config.long_prefill_token_threshold;
        let capped = if threshold > 0 && wanted > threshold {
            threshold
        } else {
            wanted
        };
        capped.min(budget)
    }

    /// Index in `running` of the request to preempt.
    fn pick_victim(&self) -> usize {
        debug_assert!(!self.running.is_empty(), "preemption with nothing running");
        match self.config.scheduling_policy {
            SchedulingPolicy::Fcfs | SchedulingPolicy::Sjf => self.running.len() - 1,
            SchedulingPolicy::Priority => {
                let mut best = 0;
                let mut best_key = None;
                for (index, &slot) in self.running.iter().enumerate() {
                    let spec = &self.state(slot).spec;
                    let key = (spec.priority, spec.arrival_us, spec.id.0);
                    if best_key.is_none_or(|current| key > current) {
                        best = index;
                        best_key = Some(key);
                    }
                }
                best
            }
        }
    }
}

/// What phase 2 did with a disaggregated half at the head of the queue.
enum HalfAdmission {
    /// Reserved (pull started) or admitted with its pulled blocks; its queue key.
    Admitted(QueueKey),
    /// Its blocks do not fit: it waits, and so does everything below its key.
    Waits(QueueKey),
    /// Admitted like a local request by the caller.
    AsLocal,
}
