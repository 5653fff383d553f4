//! Many instances behind one router on one global clock.
//!
//! Cluster events (signal refreshes, then arrivals) come before instance events at the same
//! time; among instances the lowest index goes first. An arrival is admitted or rejected,
//! routed, and dispatched at once: the chosen instance receives the request at the same
//! instant (its own arrival is processed immediately, so live signals see it). Router
//! in-flight counts rise on dispatch and fall when the instance's record of the request
//! appears (completed, dropped or timed out). The whole cluster is plain data: `Clone`
//! forks it.

use std::collections::VecDeque;

use super::admission::Admission;
use super::config::{ClusterConfig, PrefixMode};
use super::router::Router;
use super::signals::{self, CapturedSignals, RefreshTick, SignalView};
use crate::sim::driver::{self, EventDriven};
use crate::sim::engine::validate_request;
use crate::sim::metrics::{Counts, RequestRecord, Summary};
use crate::sim::rng::RngStreams;
use crate::sim::{Engine, EngineConfig, RequestSpec, SimError};

mod arrivals;
mod pd;
mod slots;

pub use pd::PdProgress;
pub use slots::Slots;

/// A simulated cluster.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub(super) config: ClusterConfig,
    pub(super) engines: Vec<Engine>,
    pub(super) router: Router,
    pub(super) admission: Admission,
    pub(super) captured: Vec<CapturedSignals>,
    pub(super) ticks: Vec<RefreshTick>,
    pub(super) in_flight: Vec<u64>,
    /// Requests sent to each instance since its queue-depth signal last refreshed (what
    /// vLLM's data-parallel balancer adds to the counts it was last sent); always 0 when
    /// the queue depth is read live.
    pub(super) sent_since_refresh: Vec<u64>,
    pub(super) records_seen: Vec<usize>,
    pub(super) pending: VecDeque<RequestSpec>,
    pub(super) now_us: u64,
    pub(super) rejected: Vec<RequestRecord>,
    pub(super) routed_to: Vec<u32>,
    pub(super) events_processed: u64,
    pub(super) scratch_views: Vec<SignalView>,
    pub(super) scratch_fraction: Vec<f64>,
    /// Prefill/decode disaggregation, when configured (`pd/`).
    pub(super) pd: Option<Box<pd::PdRuntime>>,
    /// Autoscaled replicas: which instances the router may pick, and the accounting of
    /// replaced ones (`slots.rs`).
    pub(super) scale: Option<Box<Slots>>,
}

/// An instance with no next event, in `run_while`'s times.
const NONE: u64 = u64::MAX;

/// The earlier of two optional times.
#[inline]
fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// What an instance is sent: a whole request, or one half of a disaggregated one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Half {
    /// Served whole (the monolithic path, and decode-only requests).
    Whole,
    /// The prefill half (`max_tokens = 1`), its KV held until pulled.
    Prefill,
    /// The decode half, its prompt KV pulled.
    Decode,
}

/// What happened to one arrival at the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// Refused by admission.
    Rejected,
    /// Sent to the instance with this index.
    Routed(usize),
}

/// The aggregate outcome of a cluster run.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSummary {
    /// The whole cluster, with the same fields as one instance's summary.
    pub total: Summary,
    /// Each instance's own summary, in config order.
    pub instances: Vec<(String, Summary)>,
    /// Per-role metrics, for a disaggregated cluster.
    pub disaggregation: Option<super::disagg::PdSummary>,
}

impl Cluster {
    /// A cluster of idle instances at time 0; randomness derives from `seed`.
    pub fn new(config: ClusterConfig, seed: u64) -> Result<Self, SimError> {
        let engines = config
            .instances
            .iter()
            .map(|instance| {
                // The cluster's summary and routing feedback read every instance's records.
                let config = EngineConfig {
                    keep_request_records: true,
                    ..instance.engine.clone()
                };
                Engine::new(config, instance.latency.clone())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::from_engines(config, engines, seed))
    }

    /// A cluster over already-built engines (e.g. restored from a snapshot), one per
    /// instance of `config`, all at the same time.
    pub fn from_engines(config: ClusterConfig, engines: Vec<Engine>, seed: u64) -> Self {
        debug_assert_eq!(
            engines.len(),
            config.instances.len(),
            "one engine per instance"
        );
        debug_assert!(
            engines
                .iter()
                .all(|engine| engine.config().keep_request_records),
            "the cluster's summary and routing feedback read every instance's records"
        );
        let count = engines.len();
        let now_us = engines.iter().map(Engine::now_us).max().unwrap_or(0);
        let router = Router::new(
            config.routing.clone(),
            count,
            RngStreams::new(seed).stream("router"),
        );
        let precise = router.prefix_mode() == Some(PrefixMode::Precise);
        let mut ticks = signals::refresh_ticks(&config.staleness, precise);
        for tick in &mut ticks {
            tick.next_us = Some(now_us.div_ceil(tick.interval_us) * tick.interval_us);
        }
        let mut cluster = Self {
            admission: Admission::new(config.admission),
            captured: vec![CapturedSignals::default(); count],
            // Requests already on restored instances count as in flight for the router.
            in_flight: engines
                .iter()
                .map(|e| e.counts().queued + e.counts().running)
                .collect(),
            sent_since_refresh: vec![0; count],
            records_seen: engines.iter().map(|e| e.metrics().records.len()).collect(),
            engines,
            router,
            ticks,
            pending: VecDeque::new(),
            now_us,
            rejected: Vec::new(),
            routed_to: vec![0; count],
            events_processed: 0,
            scratch_views: Vec::with_capacity(count),
            scratch_fraction: Vec::with_capacity(count),
            pd: None,
            scale: None,
            config,
        };
        // Captures start from the instances' state at the start time.
        for index in 0..count {
            for signal in signals::SIGNALS {
                if signal != super::config::Signal::PrefixCache || precise {
                    cluster.captured[index].refresh(signal, &cluster.engines[index], now_us);
                }
            }
        }
        cluster
    }

    /// Switches every instance's reference stepper on or off (`Engine::set_reference_stepper`:
    /// no shortcut; property tests compare the two).
    pub fn set_reference_stepper(&mut self, on: bool) {
        for engine in &mut self.engines {
            engine.set_reference_stepper(on);
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The instances' engines, in config order.
    pub fn engines(&self) -> &[Engine] {
        &self.engines
    }

    /// The instances' engines, in config order, taking the cluster apart (a replay reads
    /// their records once the run is over).
    pub fn into_engines(self) -> Vec<Engine> {
        self.engines
    }

    /// Current time (µs).
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// Router in-flight requests per instance.
    pub fn in_flight(&self) -> &[u64] {
        &self.in_flight
    }

    /// Requests routed to each instance so far.
    pub fn routed_counts(&self) -> &[u32] {
        &self.routed_to
    }

    /// Records of requests rejected at admission.
    pub fn rejected_records(&self) -> &[RequestRecord] {
        &self.rejected
    }

    /// The signals the router would see now, per instance.
    pub fn signal_views(&self) -> Vec<SignalView> {
        (0..self.engines.len())
            .map(|i| {
                signals::current_view(&self.captured[i], &self.engines[i], &self.config.staleness)
            })
            .collect()
    }

    /// When instance `index`'s `signal` was last refreshed.
    pub fn refreshed_at(&self, index: usize, signal: super::config::Signal) -> u64 {
        self.captured[index].refreshed_at(signal)
    }

    /// Events processed so far (cluster and instance events).
    pub fn events_processed(&self) -> u64 {
        self.events_processed
    }

    /// Request accounting over the whole cluster.
    pub fn counts(&self) -> Counts {
        let mut counts = Counts::default();
        for engine in &self.engines {
            counts.add(&engine.counts());
        }
        counts.injected += self.rejected.len() as u64;
        counts.rejected = self.rejected.len() as u64;
        if let Some(pd) = &self.pd {
            pd.correct_counts(&mut counts);
        }
        if let Some(scale) = &self.scale {
            counts.add(scale.retired_counts());
        }
        counts
    }

    /// Queues a request to arrive at `spec.arrival_us` (non-decreasing across calls, not in
    /// the past).
    pub fn submit(&mut self, spec: RequestSpec) -> Result<(), SimError> {
        validate_request(&spec, self.now_us)?;
        let last = self.pending.back().map_or(self.now_us, |s| s.arrival_us);
        if spec.arrival_us < last {
            return Err(SimError::InvalidRequest {
                id: spec.id,
                field: "arrival_us",
                reason: format!(
                    "{} is before {last}: submit in arrival order",
                    spec.arrival_us
                ),
            });
        }
        self.pending.push_back(spec);
        Ok(())
    }

    /// Time of the next event, if any.
    pub fn next_event_us(&self) -> Option<u64> {
        [
            self.next_cluster_event(),
            self.next_instance_event().map(|(t, _)| t),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// True if nothing is pending anywhere.
    pub fn is_idle(&self) -> bool {
        self.next_event_us().is_none()
    }

    /// Processes the next event; returns its time.
    pub fn process_next_event(&mut self) -> Option<u64> {
        let cluster = self.next_cluster_event();
        let instance = self.next_instance_event();
        let time = match (cluster, instance) {
            (None, None) => return None,
            (Some(c), Some((i, _))) if c <= i => self.process_cluster_event(c),
            (Some(c), None) => self.process_cluster_event(c),
            (_, Some((time, index))) => {
                self.now_us = time;
                self.engines[index].process_next_event();
                self.collect_finished(index);
                time
            }
        };
        self.events_processed += 1;
        Some(time)
    }

    /// Processes every event strictly before `time_us`.
    pub fn run_before(&mut self, time_us: u64) {
        self.run_while(|t| t < time_us);
    }

    /// Processes every event at or before `time_us`, then sets the clock to `time_us`.
    pub fn run_until(&mut self, time_us: u64) {
        self.run_while(|t| t <= time_us);
        self.now_us = self.now_us.max(time_us);
    }

    /// Processes events while the next one's time passes `go`, in the order
    /// [`Cluster::process_next_event`] takes them (`driver::run_until`'s loop), reading each
    /// instance's next event time once per change instead of scanning every instance twice
    /// per event: an instance event changes only its own instance (and, disaggregated, may
    /// start pulls elsewhere), a cluster event may dispatch anywhere, so both rescan then.
    fn run_while(&mut self, go: impl Fn(u64) -> bool) {
        // `NONE` for an instance with no event (an event at `u64::MAX` itself is looked up
        // the slow way: see `earliest_instance`).
        let mut times: Vec<u64> = Vec::with_capacity(self.engines.len());
        Self::rescan(&mut times, &self.engines);
        loop {
            let cluster = self.next_cluster_event();
            let instance = self.earliest_instance(&times);
            let next = match (cluster, instance) {
                (None, None) => return,
                (Some(c), Some((i, _))) => c.min(i),
                (Some(c), None) => c,
                (None, Some((i, _))) => i,
            };
            if !go(next) {
                return;
            }
            match (cluster, instance) {
                (Some(c), Some((i, _))) if c <= i => {
                    self.process_cluster_event(c);
                    Self::rescan(&mut times, &self.engines);
                }
                (Some(c), None) => {
                    self.process_cluster_event(c);
                    Self::rescan(&mut times, &self.engines);
                }
                (_, Some((time, index))) => {
                    self.now_us = time;
                    self.engines[index].process_next_event();
                    self.collect_finished(index);
                    if self.pd.is_some() {
                        Self::rescan(&mut times, &self.engines);
                    } else {
                        times[index] = self.engines[index].next_event_us().unwrap_or(NONE);
                    }
                }
                (None, None) => return,
            }
            self.events_processed += 1;
        }
    }

    fn rescan(times: &mut Vec<u64>, engines: &[Engine]) {
        times.clear();
        times.extend(engines.iter().map(|e| e.next_event_us().unwrap_or(NONE)));
    }

    /// (time, index) of the earliest of `times` (lowest index on ties, as
    /// `next_instance_event`): one compare per instance; only when every entry reads `NONE`
    /// are the engines asked again, in case one has an event at `u64::MAX` itself.
    #[inline]
    fn earliest_instance(&self, times: &[u64]) -> Option<(u64, usize)> {
        let mut best = (NONE, usize::MAX);
        for (index, &time) in times.iter().enumerate() {
            if time < best.0 {
                best = (time, index);
            }
        }
        if best.1 == usize::MAX {
            self.next_instance_event()
        } else {
            Some(best)
        }
    }

    /// Feeds `requests` (arrival order) and runs until nothing is pending, failing after
    /// `max_events` events.
    pub fn run<I>(&mut self, requests: I, max_events: u64) -> Result<(), SimError>
    where
        I: IntoIterator<Item = RequestSpec>,
    {
        driver::run(self, requests, max_events)
    }

    /// The aggregate outcome so far.
    pub fn summary(&self) -> ClusterSummary {
        let mut records: Vec<RequestRecord> = Vec::new();
        let mut gaps = crate::sim::metrics::GapCounts::default();
        let (mut queries, mut hits) = (0u64, 0u64);
        let (mut kv_mean, mut kv_peak) = (0.0, 0.0f64);
        let mut instances = Vec::with_capacity(self.engines.len());
        for (index, (engine, instance)) in
            self.engines.iter().zip(&self.config.instances).enumerate()
        {
            match &self.pd {
                None => records.extend(engine.metrics().records.iter().cloned()),
                Some(pd) => pd.client_records(index, &engine.metrics().records, &mut records),
            }
            for (&gap, &count) in &engine.metrics().token_gap_counts {
                *gaps.entry(gap).or_insert(0) += count;
            }
            let stats = engine.kv().stats();
            queries += stats.query_tokens;
            hits += stats.hit_tokens;
            let summary = engine.summary();
            kv_mean += summary.kv_usage_mean;
            kv_peak = kv_peak.max(summary.kv_usage_peak);
            instances.push((instance.id.clone(), summary));
        }
        records.extend(self.rejected.iter().cloned());
        let hit_rate = if queries == 0 {
            0.0
        } else {
            hits as f64 / queries as f64
        };
        let mut total = Summary::build(&records, &gaps, self.counts(), self.now_us, hit_rate);
        total.kv_usage_mean = kv_mean / self.engines.len().max(1) as f64;
        total.kv_usage_peak = kv_peak;
        let disaggregation = self.pd.as_ref().map(|pd| pd.summary(&self.engines));
        ClusterSummary {
            total,
            instances,
            disaggregation,
        }
    }

    /// Audits every instance's invariants and cluster conservation.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (index, engine) in self.engines.iter().enumerate() {
            engine
                .check_invariants()
                .map_err(|err| format!("instance {index}: {err}"))?;
        }
        let counts = self.counts();
        if !counts.is_conserved() {
            return Err(format!("cluster conservation broken: {counts:?}"));
        }
        if let Some(pd) = &self.pd {
            pd.check(&self.engines, &self.config)?;
        }
        Ok(())
    }

    #[inline]
    fn next_cluster_event(&self) -> Option<u64> {
        let mut next = self.pending.front().map(|s| s.arrival_us);
        for tick in &self.ticks {
            next = earliest(next, tick.next_us);
        }
        if let Some(pd) = &self.pd {
            next = earliest(next, pd.next_event_us());
        }
        next
    }

    /// (time, index) of the earliest instance event; lowest index on ties.
    fn next_instance_event(&self) -> Option<(u64, usize)> {
        self.engines
            .iter()
            .enumerate()
            .filter_map(|(index, engine)| engine.next_event_us().map(|t| (t, index)))
            .min()
    }

    fn process_cluster_event(&mut self, time: u64) -> u64 {
        debug_assert!(time >= self.now_us, "cluster clock went back");
        self.now_us = time;
        // Refreshes come before arrivals at the same time (the poll result is there first).
        if let Some(tick_index) = self.ticks.iter().position(|t| t.next_us == Some(time)) {
            self.refresh(tick_index);
        } else if self
            .pd
            .as_ref()
            .and_then(|pd| pd.next_event_us())
            .is_some_and(|at| at == time)
        {
            self.process_pd_event();
        } else if let Some(spec) = self.pending.pop_front() {
            debug_assert_eq!(spec.arrival_us, time, "arrival out of order");
            // Ticks stopped while every instance was idle; the captures taken then are still
            // exact. Restart them now that work arrives.
            self.resume_ticks();
            self.arrive(spec);
        }
        time
    }

    fn refresh(&mut self, tick_index: usize) {
        let now = self.now_us;
        let signals = self.ticks[tick_index].signals.clone();
        for (captured, engine) in self.captured.iter_mut().zip(&self.engines) {
            for &signal in &signals {
                captured.refresh(signal, engine, now);
            }
        }
        if signals.contains(&super::config::Signal::QueueDepth) {
            self.sent_since_refresh.fill(0);
        }
        // Nothing changes while every instance is idle: stop until the next arrival.
        let active = self.engines.iter().any(|e| !e.is_idle())
            || self
                .pd
                .as_ref()
                .is_some_and(|pd| pd.next_event_us().is_some());
        let tick = &mut self.ticks[tick_index];
        tick.next_us = active.then(|| now + tick.interval_us);
    }

    /// Restarts stopped refresh ticks at their next multiple after now.
    fn resume_ticks(&mut self) {
        let now = self.now_us;
        for tick in &mut self.ticks {
            if tick.next_us.is_none() {
                tick.next_us = Some((now / tick.interval_us + 1) * tick.interval_us);
            }
        }
    }
}

impl EventDriven for Cluster {
    fn next_event_us(&self) -> Option<u64> {
        Cluster::next_event_us(self)
    }
    fn process_next_event(&mut self) -> Option<u64> {
        Cluster::process_next_event(self)
    }
    fn submit(&mut self, spec: RequestSpec) -> Result<(), SimError> {
        Cluster::submit(self, spec)
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
