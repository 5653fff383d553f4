//! One simulated vLLM v1 instance: the event loop, its clock and its state.
//!
//! The engine is a discrete-event state machine on integer microseconds. Events sit in a
//! queue (`events.rs`) ordered by (time, kind, sequence): at equal times arrivals come
//! first, then enqueues, then the step, then timeouts, and equal kinds keep submission
//! order, so every run is deterministic. At most one step is pending; a step is scheduled whenever work waits
//! (work conservation). A step's effects (tokens, completions) apply when it ends, and the
//! next batch is formed at that moment, as vLLM's engine loop does.
//!
//! The whole engine is plain data: `Clone` forks it, and the copy continues identically.
//! Knows nothing about workloads, clusters, wall-clock time or I/O.

mod disagg;
mod drain;
mod events;
mod invariants;
mod late_entry;
mod lifecycle;
mod offload;
mod queue_key;
mod records;
mod restore;
mod schedule;
mod watch;
mod window;

pub use disagg::TransferStart;
pub use drain::{Drain, DrainEnd, DrainStep};
pub use late_entry::{AdmissionReach, ReachLog};
pub use restore::{RestoreState, RestoredRequest};

use events::{Event, EventQueue};

use crate::sim::config::EngineConfig;
use crate::sim::driver::{self, EventDriven};
use crate::sim::error::SimError;
use crate::sim::kv::{KvCache, OffloadStore};
use crate::sim::latency::{BatchEntry, LatencyModel};
use crate::sim::metrics::{Counts, Metrics, Summary};
use crate::sim::queue::WaitQueue;
use crate::sim::request::{RequestId, RequestSpec};
use crate::sim::state::RequestState;

/// Kinds of engine events, in tie-break order at equal times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// A request reaches the API server.
    Arrival = 0,
    /// A request enters the wait queue after its queueing delay.
    Enqueue = 1,
    /// The running step ends and the next one is formed.
    Step = 2,
    /// A request's deadline.
    Timeout = 3,
}

/// One request's part of the step in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InFlight {
    slot: u32,
    serial: u64,
    new_tokens: u32,
}

/// Most records [`Engine::run`] reserves room for ahead (from its requests' size hint).
const RECORDS_RESERVE_MAX: usize = 1 << 22;

/// Most requests' summary samples [`Engine::run`] reserves room for ahead, when the engine
/// keeps no records (32 bytes each: 512 MB).
const SAMPLES_RESERVE_MAX: usize = 1 << 24;

/// How a lazy window's steady members' block crossings were counted (a diagnostic for tests
/// and benchmarks; see `sim/engine/window/steady.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteadyCounts {
    /// Counted in batches, their tables left behind.
    pub batched: u64,
    /// Taken one by one, their tables caught up first (a batch without room for them),
    /// whether or not the call then succeeded.
    pub singly: u64,
    /// Counted in a batch in a step whose forming then failed (the window closed), their
    /// lagging tables caught up at once (a table the one-by-one path made exact is not
    /// counted).
    pub caught_up_on_close: u64,
}

/// A simulated vLLM v1 instance.
#[derive(Clone, Debug)]
pub struct Engine {
    config: EngineConfig,
    latency: LatencyModel,
    now_us: u64,
    events: EventQueue,
    next_seq: u64,
    slots: Vec<Option<RequestState>>,
    free_slots: Vec<u32>,
    next_serial: u64,
    waiting: WaitQueue,
    running: Vec<u32>,
    kv: KvCache,
    step_pending: bool,
    in_flight: Vec<InFlight>,
    /// The step in flight described for pricing, one entry per `in_flight` entry in order
    /// (`shape_in_flight`); read again when the step ends (the first-token delay prices the
    /// next decode step from its KV). Inside an open lazy window it describes only the
    /// window's explicit requests; the window closing reshapes it whole.
    step_shape: Vec<BatchEntry>,
    metrics: Metrics,
    counts: Counts,
    events_processed: u64,
    reference: bool,
    lazy: Option<Box<window::LazyWindow>>,
    lazy_spare: window::WindowSpare,
    lazy_steps: u64,
    mixed_lazy_steps: u64,
    steady_crossings: SteadyCounts,
    reach: AdmissionReach,
    enqueued: u64,
    /// Whether inter-token gaps are counted into `metrics.token_gap_counts`.
    count_gaps: bool,
    /// The request whose fate is reported in O(1) (see `watch`).
    watched: Option<watch::Watched>,
    /// Prefill/decode disaggregation: held prefill KV and transfers (`disagg.rs`).
    disagg: disagg::DisaggState,
    /// The KV-offload connector's CPU tier, if configured (`offload.rs`).
    offload: Option<OffloadStore>,
}

impl Engine {
    /// An idle instance at time 0 with an empty cache.
    pub fn new(config: EngineConfig, latency: LatencyModel) -> Result<Self, SimError> {
        config.validate()?;
        let kv = KvCache::new(
            config.num_gpu_blocks,
            config.block_size,
            config.enable_prefix_caching,
            config.num_cpu_blocks,
        );
        let offload = config
            .offload_connector
            .map(|connector| OffloadStore::new(connector.cpu_blocks));
        let mut engine = Self {
            waiting: WaitQueue::new(config.scheduling_policy),
            config,
            latency,
            now_us: 0,
            events: EventQueue::default(),
            next_seq: 0,
            slots: Vec::new(),
            free_slots: Vec::new(),
            next_serial: 0,
            running: Vec::new(),
            kv,
            step_pending: false,
            in_flight: Vec::new(),
            step_shape: Vec::new(),
            metrics: Metrics::default(),
            counts: Counts::default(),
            events_processed: 0,
            reference: false,
            lazy: None,
            lazy_spare: window::WindowSpare::default(),
            lazy_steps: 0,
            mixed_lazy_steps: 0,
            steady_crossings: SteadyCounts::default(),
            reach: AdmissionReach::Nothing,
            enqueued: 0,
            count_gaps: true,
            watched: None,
            disagg: disagg::DisaggState::default(),
            offload,
        };
        engine.track_kv_usage();
        Ok(engine)
    }

    /// Switches the reference stepper on or off. The reference stepper takes no shortcut:
    /// every running request goes through the KV allocator every step and every token gap is
    /// counted one by one. It exists to check, by property test, that the fast paths give
    /// byte-identical results.
    pub fn set_reference_stepper(&mut self, on: bool) {
        self.exit_lazy();
        self.reference = on;
    }

    /// Steps taken inside lazy decode windows so far (a diagnostic: how often the fast path
    /// applied).
    pub fn lazy_steps(&self) -> u64 {
        self.lazy_steps
    }

    /// Of [`Engine::lazy_steps`], the steps that also carried prefill chunks or admissions
    /// beside the window's decodes (a diagnostic for tests and benchmarks).
    pub fn mixed_lazy_steps(&self) -> u64 {
        self.mixed_lazy_steps
    }

    /// How the crossings of steady window members (whose tables lag) were counted so far (a
    /// diagnostic for tests: every path must be reached).
    pub fn steady_crossings(&self) -> SteadyCounts {
        self.steady_crossings
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The latency model.
    pub fn latency(&self) -> &LatencyModel {
        &self.latency
    }

    /// Current simulated time (µs).
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// The KV cache (read-only).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Request accounting right now.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Measurements so far.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Requests waiting to be admitted (wait queue only).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests in the running batch.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// The step in flight: each scheduled request's id and the tokens it computes.
    pub fn batch_in_flight(&self) -> Vec<(RequestId, u32)> {
        self.batch_entries()
            .iter()
            .filter_map(|entry| {
                let state = self.slots.get(entry.slot as usize)?.as_ref()?;
                (state.serial == entry.serial).then_some((state.spec.id, entry.new_tokens))
            })
            .collect()
    }

    /// When a request still in the engine saw its first token, if it has. Walks every slot:
    /// a caller asking about one request it submits watches it instead
    /// ([`Engine::submit_watched`], [`Engine::watched_first_token_us`]).
    pub fn live_first_token_us(&self, id: RequestId) -> Option<u64> {
        self.slots
            .iter()
            .flatten()
            .find(|state| state.spec.id == id)
            .and_then(|state| state.timeline.first_token_us)
    }

    /// Ids of the requests in the running batch, in batch order.
    pub fn running_ids(&self) -> Vec<RequestId> {
        self.running
            .iter()
            .map(|&slot| self.state(slot).spec.id)
            .collect()
    }

    /// Ids of the waiting requests, in admission order.
    pub fn waiting_ids(&self) -> Vec<RequestId> {
        self.waiting
            .iter()
            .map(|slot| self.state(slot).spec.id)
            .collect()
    }

    /// Heap and inline bytes of the engine's state (capacity-based estimate): what one fork
    /// or one mirrored instance costs.
    pub fn memory_bytes(&self) -> usize {
        let requests: usize = self
            .slots
            .iter()
            .flatten()
            .map(|state| {
                std::mem::size_of::<RequestState>()
                    + state.keys.len() * 8
                    + state.blocks.memory_bytes()
                    + state.timeline.token_gaps_us.capacity() * 8
            })
            .sum();
        std::mem::size_of::<Engine>()
            + self.slots.capacity() * std::mem::size_of::<Option<RequestState>>()
            + requests
            + self.kv.memory_bytes()
            + self.events.memory_bytes()
            + (self.running.capacity() + self.free_slots.capacity()) * 4
            + self.waiting.len() * 32
            + self.in_flight.capacity() * std::mem::size_of::<InFlight>()
            + self.step_shape.capacity() * std::mem::size_of::<BatchEntry>()
            + self.metrics.records.capacity() * std::mem::size_of::<crate::sim::RequestRecord>()
            + self.metrics.samples.memory_bytes()
            + self.metrics.token_gap_counts.capacity() * 17
    }

    /// Stops counting inter-token gaps and frees the count map's room: for forks whose
    /// answers read only the records (a routing question's), so that copying one does not
    /// copy the map and no step updates it. Everything else is unchanged; only the ITL
    /// aggregates of [`Engine::summary`] come out empty.
    pub fn skip_token_gaps(&mut self) {
        self.count_gaps = false;
        self.metrics.token_gap_counts = Default::default();
    }

    /// Events processed so far.
    pub fn events_processed(&self) -> u64 {
        self.events_processed
    }

    /// Time of the next pending event, if any.
    pub fn next_event_us(&self) -> Option<u64> {
        self.events.peek().map(|event| event.time_us)
    }

    /// True if no event is pending (nothing more will happen without new submissions).
    pub fn is_idle(&self) -> bool {
        self.events.is_empty()
    }

    /// Submits a request; it arrives at `spec.arrival_us`, which must not be in the past.
    pub fn submit(&mut self, spec: RequestSpec) -> Result<(), SimError> {
        self.submit_slot(spec).map(drop)
    }

    /// [`Engine::submit`], returning the request's slot.
    fn submit_slot(&mut self, spec: RequestSpec) -> Result<u32, SimError> {
        validate_request(&spec, self.now_us)?;
        let serial = self.next_serial;
        self.next_serial += 1;
        let arrival_us = spec.arrival_us;
        let deadline_us = spec.deadline_us;
        let block_size = self.config.block_size;
        let slot = self.insert_state_with(|| RequestState::new(spec, serial, block_size));
        self.push_event(arrival_us, EventKind::Arrival, slot, serial);
        if let Some(deadline) = deadline_us {
            self.push_event(deadline.max(arrival_us), EventKind::Timeout, slot, serial);
        }
        Ok(slot)
    }

    /// Processes the next event; returns its time, or `None` if nothing is pending.
    pub fn process_next_event(&mut self) -> Option<u64> {
        let event = self.events.pop()?;
        debug_assert!(
            event.time_us >= self.now_us,
            "clock would go back from {} to {}",
            self.now_us,
            event.time_us
        );
        self.now_us = event.time_us;
        self.events_processed += 1;
        if event.kind == EventKind::Timeout {
            // A timeout may take a request out of the batch: bring a lazy window up to date
            // first. (Arrivals and enqueues only add to the wait queue: the window stays.)
            self.exit_lazy();
        }
        match event.kind {
            EventKind::Arrival => self.on_arrival(event.slot, event.serial),
            EventKind::Enqueue => self.on_enqueue(event.slot, event.serial),
            EventKind::Step => self.on_step(),
            EventKind::Timeout => self.on_timeout(event.slot, event.serial),
        }
        self.debug_check_counters();
        Some(event.time_us)
    }

    /// Processes every event strictly before `time_us`.
    pub fn run_before(&mut self, time_us: u64) {
        driver::run_before(self, time_us);
    }

    /// Processes every event at or before `time_us`, then sets the clock to `time_us`.
    pub fn run_until(&mut self, time_us: u64) {
        driver::run_until(self, time_us);
    }

    /// Feeds `requests` (in non-decreasing arrival order) and runs until nothing is pending,
    /// stopping with an error after `max_events` events.
    pub fn run<I>(&mut self, requests: I, max_events: u64) -> Result<(), SimError>
    where
        I: IntoIterator<Item = RequestSpec>,
    {
        let requests = requests.into_iter();
        // One record per request: room reserved when the count is known, so the records
        // never move while growing (bounded, in case a hint is wild).
        let (low, high) = requests.size_hint();
        let expected = high.unwrap_or(low);
        if self.config.keep_request_records {
            self.metrics
                .records
                .reserve(expected.min(RECORDS_RESERVE_MAX));
        } else {
            self.metrics
                .samples
                .reserve(expected.min(SAMPLES_RESERVE_MAX));
        }
        driver::run(self, requests, max_events)
    }

    /// The aggregate outcome so far.
    pub fn summary(&self) -> Summary {
        let stats = self.kv.stats();
        let hit_rate = if stats.query_tokens == 0 {
            0.0
        } else {
            stats.hit_tokens as f64 / stats.query_tokens as f64
        };
        let mut summary = if self.config.keep_request_records {
            Summary::build(
                &self.metrics.records,
                &self.metrics.token_gap_counts,
                self.counts,
                self.now_us,
                hit_rate,
            )
        } else {
            Summary::from_samples(
                &self.metrics.samples,
                &self.metrics.token_gap_counts,
                self.counts,
                self.now_us,
                hit_rate,
            )
        };
        summary.kv_usage_mean = self.metrics.kv_usage.mean(self.now_us);
        summary.kv_usage_peak = self.metrics.kv_usage.peak;
        summary.kv_usage_timeline = self.metrics.kv_usage.timeline.clone();
        summary
    }

    fn push_event(&mut self, time_us: u64, kind: EventKind, slot: u32, serial: u64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.events.push(Event {
            time_us,
            kind,
            seq,
            slot,
            serial,
        });
    }

    /// The live request in `slot` if it is still the submission `serial`.
    fn live_mut(&mut self, slot: u32, serial: u64) -> Option<&mut RequestState> {
        self.slots
            .get_mut(slot as usize)
            .and_then(Option::as_mut)
            .filter(|state| state.serial == serial)
    }

    fn state(&self, slot: u32) -> &RequestState {
        self.slots[slot as usize]
            .as_ref()
            .expect("queued and running slots always hold a live request")
    }

    fn track_kv_usage(&mut self) {
        let usage = self.kv.usage();
        let interval = self.config.kv_sample_interval_us;
        self.metrics.kv_usage.update(self.now_us, usage, interval);
    }
}

/// Checks that `spec` is well formed and does not arrive before `now_us`.
pub fn validate_request(spec: &RequestSpec, now_us: u64) -> Result<(), SimError> {
    let invalid = |field: &'static str, reason: String| SimError::InvalidRequest {
        id: spec.id,
        field,
        reason,
    };
    if spec.input_tokens == 0 {
        return Err(invalid("input_tokens", "must be at least 1".to_owned()));
    }
    if spec.max_tokens < spec.output_tokens {
        return Err(invalid(
            "max_tokens",
            format!(
                "{} is below output_tokens {}",
                spec.max_tokens, spec.output_tokens
            ),
        ));
    }
    if spec.arrival_us < now_us {
        return Err(invalid(
            "arrival_us",
            format!("{} is before the engine clock {now_us}", spec.arrival_us),
        ));
    }
    if let crate::sim::request::PromptContent::Tokens(tokens) = &spec.content
        && tokens.len() != spec.input_tokens as usize
    {
        return Err(invalid(
            "content",
            format!(
                "{} token ids for input_tokens {}",
                tokens.len(),
                spec.input_tokens
            ),
        ));
    }
    if let crate::sim::request::PromptContent::BlockKeys(keys) = &spec.content {
        if keys.len() > spec.input_tokens as usize {
            return Err(invalid(
                "content",
                format!(
                    "{} block keys for a {}-token prompt",
                    keys.len(),
                    spec.input_tokens
                ),
            ));
        }
        let mut seen = std::collections::HashSet::with_capacity(keys.len());
        if let Some(duplicate) = keys.iter().find(|key| !seen.insert(**key)) {
            return Err(invalid(
                "content",
                format!("block key {duplicate} appears twice"),
            ));
        }
    }
    Ok(())
}

impl EventDriven for Engine {
    fn next_event_us(&self) -> Option<u64> {
        Engine::next_event_us(self)
    }
    fn process_next_event(&mut self) -> Option<u64> {
        Engine::process_next_event(self)
    }
    fn submit(&mut self, spec: RequestSpec) -> Result<(), SimError> {
        Engine::submit(self, spec)
    }
    fn events_processed(&self) -> u64 {
        self.events_processed
    }
    fn now_us(&self) -> u64 {
        self.now_us
    }
    fn advance_clock_to(&mut self, time_us: u64) {
        self.now_us = self.now_us.max(time_us);
    }
}

#[cfg(test)]
mod tests {
    use crate::sim::latency::{BlackboxCoefficients, LatencyModel};
    use crate::sim::{Engine, EngineConfig, RequestSpec};

    /// Skipping the gap counts changes nothing but the counts, on the fast path (windows) and
    /// on the reference stepper alike.
    #[test]
    fn skipping_token_gaps_leaves_every_record_alone() {
        let mut config = EngineConfig::vllm_defaults(2_000, 8192);
        config.kv_sample_interval_us = 0;
        let model = LatencyModel::Blackbox(BlackboxCoefficients {
            alpha: [0.0, 0.0, 0.0],
            beta: [1_000.0, 1.0, 10.0],
        });
        let requests: Vec<RequestSpec> = (0..200u64)
            .map(|i| {
                RequestSpec::synthetic(
                    i,
                    i * 3_000,
                    50 + (i as u32 * 37) % 400,
                    1 + (i as u32 * 13) % 90,
                )
            })
            .collect();
        for reference in [false, true] {
            let mut counted = Engine::new(config.clone(), model.clone()).unwrap();
            counted.set_reference_stepper(reference);
            let mut skipped = counted.clone();
            skipped.skip_token_gaps();
            counted.run(requests.clone(), u64::MAX).unwrap();
            skipped.run(requests.clone(), u64::MAX).unwrap();
            assert_eq!(counted.metrics().records, skipped.metrics().records);
            assert_eq!(counted.kv().stats(), skipped.kv().stats());
            assert!(!counted.metrics().token_gap_counts.is_empty());
            assert!(skipped.metrics().token_gap_counts.is_empty());
        }
    }
}
