//! Building an engine from externally observed state instead of an empty start.
//!
//! The twin mirrors live instances: requests mid-prefill or mid-decode, KV blocks already
//! cached with their keys, possibly a step in flight. [`Engine::restore`] rebuilds exactly
//! that: cached blocks go onto the free list (keyed, least recently used first, behind the
//! never-used blocks), running requests take their blocks (sharing cached prefix blocks),
//! waiting requests join the queue in order, and a step in flight is re-armed to end when it
//! would have. Inconsistent input (more blocks than exist, progress past the sequence) is an
//! error naming the field, never a panic.

use super::{Engine, EventKind, InFlight};
use crate::sim::config::EngineConfig;
use crate::sim::error::SimError;
use crate::sim::kv::PrefixHit;
use crate::sim::latency::LatencyModel;
use crate::sim::request::RequestSpec;
use crate::sim::state::{Phase, RequestState};

/// One in-flight request as observed.
#[derive(Clone, Debug, PartialEq)]
pub struct RestoredRequest {
    /// The request; `output_tokens` is its (known or sampled) final length and must exceed
    /// `generated`.
    pub spec: RequestSpec,
    /// Tokens whose KV is computed (< prompt + generated).
    pub computed_tokens: u32,
    /// Output tokens already generated.
    pub generated: u32,
    /// Prompt tokens served from the prefix cache at its first admission.
    pub cached_tokens: u32,
    /// Tokens it computes in the step in flight (running requests; 0 if not in that step).
    pub scheduled_tokens: u32,
    /// How far the client's view of its tokens lags the engine's (the latency model's
    /// first-token and streaming delays, which later tokens inherit), for a request that has
    /// generated; 0 when unknown (a mirrored pod does not publish it).
    pub client_lag_us: u64,
}

/// The observed state of one instance at `now_us`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RestoreState {
    /// The observation time: the restored engine's clock.
    pub now_us: u64,
    /// Keys of cached blocks (free ones least recently used first; blocks running requests
    /// hold may be listed too, in any order).
    pub cached_keys: Vec<u64>,
    /// Running requests, in batch order.
    pub running: Vec<RestoredRequest>,
    /// Waiting requests, in queue order.
    pub waiting: Vec<RestoredRequest>,
    /// End of the step in flight, if one is (must be after `now_us`).
    pub step_end_us: Option<u64>,
}

fn invalid(spec: &RequestSpec, field: &'static str, reason: String) -> SimError {
    SimError::InvalidRequest {
        id: spec.id,
        field,
        reason,
    }
}

impl Engine {
    /// The engine's state as an observer of a live vLLM would report it: the inverse of
    /// [`Engine::restore`]. Requests still in their queueing delay are reported as waiting.
    pub fn observe(&self) -> RestoreState {
        let batch = self.batch_entries();
        let scheduled = |slot: u32| -> u32 {
            batch
                .iter()
                .filter(|entry| entry.slot == slot)
                .map(|entry| entry.new_tokens)
                .sum()
        };
        let lazy_step = self.lazy_step_in_flight();
        let describe = |slot: u32| -> RestoredRequest {
            let state = self.state(slot);
            // Inside a lazy decode window the stored progress lags by the window's steps.
            let delta = if state.phase == Phase::Running {
                self.lazy_delta(slot)
            } else {
                0
            };
            RestoredRequest {
                spec: state.spec.clone(),
                computed_tokens: state.num_computed + delta,
                generated: state.generated + delta,
                cached_tokens: state.timeline.cached_tokens,
                scheduled_tokens: scheduled(slot),
                client_lag_us: if state.generated > 0 {
                    state
                        .timeline
                        .last_token_us
                        .saturating_sub(state.timeline.last_emit_step_end_us)
                } else {
                    0
                },
            }
        };
        let mut cached_keys = self.kv.free_keys_lru_first();
        for &slot in &self.running {
            let state = self.state(slot);
            // (Including the private blocks whose keying a window deferred.)
            let keys = state.block_keys(self.config.block_size);
            cached_keys.extend((0..self.observed_keyed_blocks(slot)).map(|index| keys.get(index)));
        }
        let mut waiting: Vec<RestoredRequest> = self.waiting.iter().map(describe).collect();
        for (slot, state) in self.slots.iter().enumerate() {
            if let Some(state) = state
                && state.phase == Phase::Arriving
                && state.spec.arrival_us <= self.now_us
            {
                waiting.push(describe(slot as u32));
            }
        }
        let step_end_us = if self.in_flight.is_empty() && !lazy_step {
            None
        } else {
            self.events.step_end_us()
        };
        RestoreState {
            now_us: self.now_us,
            cached_keys,
            running: self.running.iter().map(|&slot| describe(slot)).collect(),
            waiting,
            step_end_us,
        }
    }

    /// An engine in exactly the observed `state`.
    pub fn restore(
        config: EngineConfig,
        latency: LatencyModel,
        state: RestoreState,
    ) -> Result<Engine, SimError> {
        let mut engine = Engine::new(config, latency)?;
        engine.now_us = state.now_us;
        engine.metrics.kv_usage = crate::sim::metrics::KvUsageTrack::starting_at(state.now_us);
        // Forks of a restored engine each count hundreds of distinct gaps: room up front, so
        // no fork rehashes (the room is cloned with the engine).
        engine.metrics.token_gap_counts.reserve(1024);
        if state.cached_keys.len() as u64 > u64::from(engine.kv.total_blocks()) {
            return Err(SimError::InvalidState {
                field: "cached_blocks",
                reason: format!(
                    "{} cached blocks but the cache has {}",
                    state.cached_keys.len(),
                    engine.kv.total_blocks()
                ),
            });
        }
        if engine.config.enable_prefix_caching {
            for &key in &state.cached_keys {
                engine.kv.seed_cached(key);
            }
        }
        for request in &state.running {
            engine.restore_running(request, state.now_us)?;
        }
        for request in &state.waiting {
            engine.restore_waiting(request, state.now_us)?;
        }
        if engine.running.len() > engine.config.max_num_seqs as usize {
            return Err(SimError::InvalidState {
                field: "running",
                reason: format!(
                    "{} running requests exceed max_num_seqs {}",
                    engine.running.len(),
                    engine.config.max_num_seqs
                ),
            });
        }
        match state.step_end_us {
            Some(end) if !engine.in_flight.is_empty() => {
                if end <= state.now_us {
                    return Err(SimError::InvalidState {
                        field: "step_end_us",
                        reason: format!("{end} is not after the observation time {}", state.now_us),
                    });
                }
                engine.step_pending = true;
                engine.counts.steps += 1;
                // Described as a step formed here would be (the first-token delay reads it).
                engine.shape_in_flight();
                engine.push_event(end, EventKind::Step, 0, 0);
            }
            _ => {
                // No step known to be in flight: scheduled tokens are not in progress.
                engine.in_flight.clear();
                if !(engine.waiting.is_empty() && engine.running.is_empty()) {
                    engine.step_pending = true;
                    let now = engine.now_us;
                    engine.push_event(now, EventKind::Step, 0, 0);
                }
            }
        }
        engine.track_kv_usage();
        engine.debug_check_counters();
        Ok(engine)
    }

    fn restore_common(
        &mut self,
        request: &RestoredRequest,
        now_us: u64,
    ) -> Result<RequestState, SimError> {
        let spec = &request.spec;
        super::validate_request(spec, 0)?;
        if spec.arrival_us > now_us {
            return Err(invalid(
                spec,
                "arrival_us",
                format!("{} is after the observation time {now_us}", spec.arrival_us),
            ));
        }
        check_final_length(spec, request.generated)?;
        let num_tokens = spec.input_tokens + request.generated;
        if request.computed_tokens >= num_tokens {
            return Err(invalid(
                spec,
                "computed_tokens",
                format!(
                    "{} must be below prompt + generated = {num_tokens}",
                    request.computed_tokens
                ),
            ));
        }
        if request.cached_tokens > spec.input_tokens {
            return Err(invalid(
                spec,
                "cached_tokens",
                format!("{} exceeds the prompt", request.cached_tokens),
            ));
        }
        check_fits(spec, self.config.effective_max_model_len())?;
        let serial = self.next_serial;
        self.next_serial += 1;
        let mut state = RequestState::new(spec.clone(), serial, self.config.block_size);
        state.generated = request.generated;
        state.timeline.enqueue_us = Some(spec.arrival_us);
        state.timeline.cached_tokens = request.cached_tokens;
        if request.generated > 0 {
            state.timeline.first_token_us = Some(now_us);
            state.timeline.last_token_us = now_us.saturating_add(request.client_lag_us);
            state.timeline.last_emit_step_end_us = now_us;
        }
        self.counts.injected += 1;
        Ok(state)
    }

    fn restore_running(&mut self, request: &RestoredRequest, now_us: u64) -> Result<(), SimError> {
        let mut state = self.restore_common(request, now_us)?;
        let block_size = self.config.block_size;
        let computed = request.computed_tokens;
        let scheduled = request.scheduled_tokens;
        if computed + scheduled > state.num_tokens() {
            return Err(invalid(
                &request.spec,
                "scheduled_tokens",
                format!("computed {computed} + scheduled {scheduled} exceed the sequence"),
            ));
        }
        let total = computed + scheduled;
        if self.config.enable_prefix_caching {
            state.ensure_keys(total / block_size, block_size);
        }
        // Its computed prefix blocks are the cached blocks with its keys, where they exist.
        let hit = if self.config.enable_prefix_caching {
            let mut hit = self
                .kv
                .lookup(state.block_keys(block_size), total / block_size);
            hit.cpu_blocks = 0;
            hit
        } else {
            PrefixHit::default()
        };
        if !state.allocate_blocks(&mut self.kv, hit, total.max(1), block_size) {
            return Err(SimError::InvalidState {
                field: "running",
                reason: format!(
                    "request {:?} needs more KV blocks than are free",
                    request.spec.id
                ),
            });
        }
        state.num_computed = computed;
        state.phase = Phase::Running;
        state.timeline.schedule_us = Some(now_us);
        let slot = self.insert_state(state);
        self.running.push(slot);
        self.counts.running += 1;
        if scheduled > 0 {
            let serial = self.state(slot).serial;
            self.in_flight.push(InFlight {
                slot,
                serial,
                new_tokens: scheduled,
            });
        }
        Ok(())
    }

    fn restore_waiting(&mut self, request: &RestoredRequest, now_us: u64) -> Result<(), SimError> {
        if request.computed_tokens > 0 || request.scheduled_tokens > 0 {
            return Err(invalid(
                &request.spec,
                "computed_tokens",
                "a waiting request holds no computed tokens".to_owned(),
            ));
        }
        let mut state = self.restore_common(request, now_us)?;
        let enqueue_us = request
            .spec
            .arrival_us
            .saturating_add(self.latency.queueing_us(request.spec.input_tokens));
        if enqueue_us > now_us && request.generated == 0 {
            // Still on its way to the scheduler's queue (the latency model's queueing delay:
            // HTTP, tokenization): it joins the queue when it would have, as on arrival.
            state.phase = Phase::Arriving;
            state.timeline.enqueue_us = None;
            let serial = state.serial;
            let slot = self.insert_state(state);
            self.counts.queued += 1;
            self.push_event(enqueue_us, EventKind::Enqueue, slot, serial);
            return Ok(());
        }
        state.phase = Phase::Waiting;
        let policy = self.config.scheduling_policy;
        let key = super::queue_key::queue_key(policy, &state);
        let slot = self.insert_state(state);
        self.waiting.push_arrival(key, slot);
        self.counts.queued += 1;
        Ok(())
    }

    /// Sets the final output length and `max_tokens` of every restored request, given in
    /// restore order (running, then waiting), with the checks [`Engine::restore`] applies to
    /// them. A caller restores once (with any valid lengths) and draws lengths per replication
    /// on clones: restoring never reads the lengths, so the result equals restoring with
    /// them. Refused once the engine has processed an event. After an error the engine is
    /// partly updated: discard it.
    pub fn set_final_lengths(&mut self, lengths: &[(u32, u32)]) -> Result<(), SimError> {
        if self.events_processed > 0 || lengths.len() != self.slots.len() {
            return Err(SimError::InvalidState {
                field: "output_tokens",
                reason: format!(
                    "final lengths apply to a just-restored engine: {} given for {} requests after {} events",
                    lengths.len(),
                    self.slots.len(),
                    self.events_processed
                ),
            });
        }
        let max_len = self.config.effective_max_model_len();
        for (slot, &(output_tokens, max_tokens)) in lengths.iter().enumerate() {
            let state = self.slots[slot]
                .as_mut()
                .ok_or_else(|| SimError::InvalidState {
                    field: "output_tokens",
                    reason: format!("slot {slot} holds no restored request"),
                })?;
            state.spec.output_tokens = output_tokens;
            state.spec.max_tokens = max_tokens;
            if max_tokens < output_tokens {
                return Err(invalid(
                    &state.spec,
                    "max_tokens",
                    format!("{max_tokens} is below output_tokens {output_tokens}"),
                ));
            }
            check_final_length(&state.spec, state.generated)?;
            check_fits(&state.spec, max_len)?;
        }
        Ok(())
    }

    /// Puts `state` in a free slot (or a new one) and returns the slot.
    pub(super) fn insert_state(&mut self, state: RequestState) -> u32 {
        self.insert_state_with(|| state)
    }

    /// [`Engine::insert_state`] with the state built by `make` where it will live (a state
    /// built first and passed by value is copied into the slot: a submission's hot path).
    #[inline(always)]
    pub(super) fn insert_state_with(&mut self, make: impl FnOnce() -> RequestState) -> u32 {
        match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(make());
                slot
            }
            None => {
                self.slots.push(Some(make()));
                (self.slots.len() - 1) as u32
            }
        }
    }
}

/// A restored request's final length must exceed what it has generated.
fn check_final_length(spec: &RequestSpec, generated: u32) -> Result<(), SimError> {
    if generated >= spec.generated_tokens() {
        return Err(invalid(
            spec,
            "output_tokens",
            format!(
                "final length {} must exceed the {generated} tokens already generated",
                spec.generated_tokens()
            ),
        ));
    }
    Ok(())
}

/// Prompt plus `max_tokens` must fit the instance's model length.
fn check_fits(spec: &RequestSpec, max_model_len: u32) -> Result<(), SimError> {
    let needed = u64::from(spec.input_tokens) + u64::from(spec.max_tokens.max(1));
    if needed > u64::from(max_model_len) {
        return Err(invalid(
            spec,
            "max_tokens",
            format!("prompt + max_tokens = {needed} exceeds what the instance holds"),
        ));
    }
    Ok(())
}
