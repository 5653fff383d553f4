//! Late entry: putting a request into the wait queue after the fact, as if it had been
//! submitted earlier, and the record that says when doing so is exact.
//!
//! A request that waits in the queue without the scheduler reaching it changes nothing else:
//! phase 2 admits in queue order and stops before it. So a fork that adds a request at `now`
//! is identical, up to the first step whose phase 2 would reach it, to the fork without it; a
//! caller that has recorded the fork without it (the twin's baseline) can start the fork with
//! it from a copy taken just before that step and insert the request there. Each formed step
//! leaves an [`AdmissionReach`] saying which newcomers its phase 2 would have reached.

use super::Engine;
use super::drain::Drain;
use super::queue_key::queue_key;
use crate::sim::config::SchedulingPolicy;
use crate::sim::error::SimError;
use crate::sim::queue::QueueKey;
use crate::sim::request::RequestSpec;
use crate::sim::state::{Phase, RequestState};

/// How far phase 2 of a formed step walked the wait queue: which request, had it been
/// waiting in the queue already, the scheduler would have considered (peeked) in that step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AdmissionReach {
    /// Phase 2 did not run (a preemption) or stopped before its first request.
    #[default]
    Nothing,
    /// Under an ordered policy (priority, sjf), requests whose queue key is below this one;
    /// under fcfs, where a newcomer joins the back, none.
    Below(QueueKey),
    /// Every request: the queue ran out with budget and a seat to spare.
    Everything,
}

impl AdmissionReach {
    /// True if a request waiting with queue key `key` (a newcomer: at the back of an fcfs
    /// queue) would have been considered.
    pub fn reaches(&self, policy: SchedulingPolicy, key: QueueKey) -> bool {
        match *self {
            AdmissionReach::Nothing => false,
            AdmissionReach::Everything => true,
            AdmissionReach::Below(bound) => policy != SchedulingPolicy::Fcfs && key < bound,
        }
    }
}

impl Engine {
    /// What phase 2 of the last formed step reached.
    pub fn admission_reach(&self) -> AdmissionReach {
        self.reach
    }

    /// True while a step is in flight (an arrival then waits for it to end).
    pub fn step_pending(&self) -> bool {
        self.step_pending
    }

    /// The wait-queue key `spec` would get if submitted next.
    pub fn newcomer_queue_key(&self, spec: &RequestSpec) -> QueueKey {
        queue_key(
            self.config.scheduling_policy,
            &RequestState::new(spec.clone(), self.next_serial, self.config.block_size),
        )
    }

    /// False only if the next step's phase 2 cannot reach a newcomer waiting with queue key
    /// `key`: the requests ahead of it need the whole token budget even if every block they
    /// could share were a prefix hit and nothing else ran. Cheap and conservative (a caller
    /// keeps a copy of the engine before a step that may first reach a newcomer; a wrong
    /// "true" only costs that copy).
    pub fn may_reach(&self, key: QueueKey) -> bool {
        // Past this many requests ahead the walk stops and answers "maybe": it runs after
        // every event of a recording, and the caller bounds its copies.
        const WALK_MAX: usize = 256;
        let policy = self.config.scheduling_policy;
        let block_size = self.config.block_size;
        let threshold = self.config.long_prefill_token_threshold;
        let budget = u64::from(self.config.max_num_batched_tokens);
        let seats = self.config.max_num_seqs as usize;
        let mut needed = 0u64;
        for (ahead, slot) in self.waiting.iter().enumerate() {
            let state = self.state(slot);
            if policy != SchedulingPolicy::Fcfs && queue_key(policy, state) >= key {
                break;
            }
            // Every request ahead must be admitted, and a seat left for the newcomer.
            if ahead + 1 >= seats {
                return false;
            }
            if ahead == WALK_MAX {
                return true;
            }
            // A preempted request may hit its own private blocks too.
            let least = if state.timeline.preemptions > 0 {
                1
            } else {
                let shareable = state.shareable * block_size;
                state.num_tokens().saturating_sub(shareable).max(1)
            };
            let least = if threshold > 0 {
                least.min(threshold)
            } else {
                least
            };
            needed += u64::from(least);
            if needed >= budget {
                return false;
            }
        }
        true
    }

    /// True if `spec` fits the model length, so it would not be dropped at arrival.
    pub fn fits_model_len(&self, spec: &RequestSpec) -> bool {
        u64::from(spec.input_tokens) + u64::from(spec.max_tokens.max(1))
            <= u64::from(self.config.effective_max_model_len())
    }

    /// Puts `spec` into the wait queue as if it had been submitted before every event still
    /// pending, arrived at `spec.arrival_us` and entered the queue at `enqueue_us`: its
    /// record, and everything from the next event on, are those of that submission (the
    /// queue-depth peak is not back-dated). The caller must know that no event already
    /// processed at or after its arrival would have differed (see the module doc).
    ///
    /// Refused unless arrival <= `enqueue_us` <= the next event, a step is pending (else its
    /// enqueue would have formed one), and the request fits the model length.
    pub fn insert_waiting(&mut self, spec: RequestSpec, enqueue_us: u64) -> Result<(), SimError> {
        self.insert_waiting_slot(spec, enqueue_us).map(drop)
    }

    /// [`Engine::insert_waiting`], returning the request's slot.
    pub(super) fn insert_waiting_slot(
        &mut self,
        spec: RequestSpec,
        enqueue_us: u64,
    ) -> Result<u32, SimError> {
        let invalid = |field: &'static str, reason: String| SimError::InvalidRequest {
            id: spec.id,
            field,
            reason,
        };
        super::validate_request(&spec, spec.arrival_us)?;
        if spec.deadline_us.is_some() {
            return Err(invalid(
                "deadline_us",
                "a late entry cannot carry a deadline".to_owned(),
            ));
        }
        if enqueue_us < spec.arrival_us || self.next_event_us().is_some_and(|t| t < enqueue_us) {
            return Err(invalid(
                "arrival_us",
                format!(
                    "enqueue at {enqueue_us} must lie between the arrival {} and the next event",
                    spec.arrival_us
                ),
            ));
        }
        if !self.step_pending {
            return Err(invalid(
                "arrival_us",
                "no step is pending, so its enqueue would have formed one".to_owned(),
            ));
        }
        if !self.fits_model_len(&spec) {
            return Err(invalid(
                "max_tokens",
                "the request does not fit the model length".to_owned(),
            ));
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        let mut state = RequestState::new(spec, serial, self.config.block_size);
        state.phase = Phase::Waiting;
        state.timeline.enqueue_us = Some(enqueue_us);
        let key = queue_key(self.config.scheduling_policy, &state);
        let slot = self.insert_state(state);
        self.waiting.push_arrival(key, slot);
        self.counts.injected += 1;
        self.counts.queued += 1;
        self.now_us = self.now_us.max(enqueue_us);
        self.debug_check_counters();
        Ok(slot)
    }
}

/// One step formation, or one change of whether a step is pending, in a [`ReachLog`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ReachEntry {
    /// The event (1-based count since the log started) that did it.
    event: u64,
    time_us: u64,
    /// A step was formed (then `reach` is its phase 2's).
    formed: bool,
    reach: AdmissionReach,
    /// A step is pending after the event.
    pending_after: bool,
    /// A new arrival entered the wait queue in the event.
    enqueued: bool,
}

/// What a run did that decides where a request added to it would first matter: every step
/// formation with its [`AdmissionReach`], and every change of whether a step is pending.
/// Built by calling [`ReachLog::observe`] after each event of a run without the request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReachLog {
    entries: Vec<ReachEntry>,
    pending_at_start: bool,
    events: u64,
    last_steps: u64,
    last_pending: bool,
    last_enqueued: u64,
}

impl ReachLog {
    /// A log of the run `engine` is about to make.
    pub fn start(engine: &Engine) -> Self {
        Self {
            // Most recordings log tens of events before a drain ends them.
            entries: Vec::with_capacity(64),
            pending_at_start: engine.step_pending,
            events: 0,
            last_steps: engine.counts.steps,
            last_pending: engine.step_pending,
            last_enqueued: engine.enqueued,
        }
    }

    /// Notes the event `engine` just processed.
    pub fn observe(&mut self, engine: &Engine) {
        self.events += 1;
        let formed = engine.counts.steps != self.last_steps;
        let enqueued = engine.enqueued != self.last_enqueued;
        if formed || enqueued || engine.step_pending != self.last_pending {
            self.entries.push(ReachEntry {
                event: self.events,
                time_us: engine.now_us,
                formed,
                reach: if formed {
                    engine.reach
                } else {
                    AdmissionReach::Nothing
                },
                pending_after: engine.step_pending,
                enqueued,
            });
            self.last_steps = engine.counts.steps;
            self.last_pending = engine.step_pending;
            self.last_enqueued = engine.enqueued;
        }
    }

    /// Notes the step events of `drain`, a drain of `engine` (which then stays where it is:
    /// the run ends with the drain). Each drained step forms the next with nothing waiting,
    /// so its phase 2 reaches everything if budget and a seat are left; the last one leaves
    /// no step pending.
    pub fn observe_drain(&mut self, engine: &Engine, drain: &Drain) {
        let max_seqs = engine.config.max_num_seqs;
        let max_tokens = engine.config.max_num_batched_tokens;
        self.entries.reserve(drain.steps.len());
        for step in &drain.steps {
            self.events += 1;
            let running = step.running_after;
            let formed = running > 0;
            let reach = if formed && running < max_seqs && running < max_tokens {
                AdmissionReach::Everything
            } else {
                AdmissionReach::Nothing
            };
            self.entries.push(ReachEntry {
                event: self.events,
                time_us: step.end_us,
                formed,
                reach,
                pending_after: formed,
                enqueued: false,
            });
            self.last_steps += u64::from(formed);
            self.last_pending = formed;
        }
    }

    /// For a request submitted at `now_us` that enters the queue at `enqueue_us` with queue
    /// key `key`: how many of the logged events come before the first one it would change
    /// (a step formation that reaches it, or a step ending with nothing left to run), if
    /// that event is at or before `until_us`. A copy of the run after that many events, with
    /// the request put in by [`Engine::insert_waiting`], continues exactly as the run with
    /// the request submitted. `None` if the request would matter at once (no step pending
    /// when it enters the queue), not within the log, or (fcfs) if a later arrival enters
    /// the queue first (it would queue behind the request, but ahead of a late entry).
    pub fn events_before_reach(
        &self,
        now_us: u64,
        enqueue_us: u64,
        policy: SchedulingPolicy,
        key: QueueKey,
        until_us: u64,
    ) -> Option<u64> {
        // Events at or before `now` ran before the submission; later ones before its enqueue
        // too (a step event at the enqueue time comes after it).
        let before = |time_us: u64| time_us < enqueue_us || time_us <= now_us;
        let split = self.entries.partition_point(|entry| before(entry.time_us));
        let pending = self.entries[..split]
            .last()
            .map_or(self.pending_at_start, |entry| entry.pending_after);
        if !pending {
            return None;
        }
        let fcfs = policy == SchedulingPolicy::Fcfs;
        let entry = self.entries[split..].iter().find(|entry| {
            (fcfs && entry.enqueued)
                || !entry.pending_after
                || (entry.formed && entry.reach.reaches(policy, key))
        })?;
        (!(fcfs && entry.enqueued) && entry.time_us <= until_us).then(|| entry.event - 1)
    }

    /// Heap bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<ReachEntry>()
    }
}
