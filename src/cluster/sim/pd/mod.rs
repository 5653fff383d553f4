//! Disaggregated serving inside a [`Cluster`]: llm-d's `disagg-profile-handler` routing,
//! the hand-over of a finished prefill to its decode pod, the KV pulls, and the accounting
//! that makes two engine-side halves one client request.
//!
//! A request the decider sends to a prefill pod lives as two halves: the prefill half (the
//! prompt with `max_tokens = 1`, its KV held after it finishes) and, from the moment the
//! prefill's response reaches the decode pod's sidecar (the prefill record's end), the decode
//! half, which reserves blocks, pulls the KV (a cluster event `transfer_us` later), and
//! decodes. The pull's completion frees the prefill's held blocks. Cluster events at one time
//! run refreshes, then these hand-overs and pull completions (in the order they were
//! scheduled), then arrivals.

use std::collections::BTreeMap;

use super::{Cluster, Dispatch, Half};
use crate::cluster::config::{ClusterConfig, PrefixMode};
use crate::cluster::disagg::{DisaggConfig, StageOrder, serves_decode, serves_prefill};
use crate::cluster::router::{Router, RoutingContext};
use crate::cluster::signals;

mod audit;
mod faults;
mod pair;
use crate::sim::kv::hash::{PromptKeys, prompt_block_keys};
use crate::sim::metrics::{Outcome, RequestRecord};
use crate::sim::rng::RngStreams;
use crate::sim::{RequestId, RequestSpec, SimError};
pub use pair::PdProgress;

/// Where a disaggregated request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Its prefill half is on the prefill pod.
    Prefill,
    /// The prefill attempt failed; the sidecar waits its backoff to retry.
    RetryWait,
    /// The last prefill attempt failed: the error went to the client, the request ended at
    /// the decode pod's sidecar without reaching either engine.
    PrefillError,
    /// The prefill finished; the response is on its way to the decode pod.
    Handoff,
    /// Its decode half is on the decode pod.
    Decode,
    /// Its prefill half ended without finishing (dropped or timed out): the request ends
    /// there.
    FailedOnPrefill,
}

/// One disaggregated request.
#[derive(Clone, Debug)]
struct PdRequest {
    arrival_us: u64,
    prefill: usize,
    decode: usize,
    stage: Stage,
    spec: RequestSpec,
    /// The prefill half's record, once it finished.
    prefill_record: Option<RequestRecord>,
    decode_arrival_us: Option<u64>,
    transfer_start_us: Option<u64>,
    transfer_end_us: Option<u64>,
    /// The prefill pod's held blocks were freed.
    released: bool,
    /// They were freed by the hold's timeout, before the pull completed: the pull fails.
    expired: bool,
    /// The pull fails in transport (the prefill pod, not notified, holds the KV until its
    /// hold expires).
    transfer_failed: bool,
    /// Prefill attempts that failed so far.
    failed_attempts: u32,
}

impl PdRequest {
    /// A request just sent to `prefill` for its prefill half, to end on `decode`.
    fn new(spec: RequestSpec, prefill: usize, decode: usize) -> Self {
        Self {
            arrival_us: spec.arrival_us,
            prefill,
            decode,
            stage: Stage::Prefill,
            spec,
            prefill_record: None,
            decode_arrival_us: None,
            transfer_start_us: None,
            transfer_end_us: None,
            released: false,
            expired: false,
            transfer_failed: false,
            failed_attempts: 0,
        }
    }

    /// The prefill half of `spec`: the prompt with one output token, as the decode pod's
    /// routing sidecar sends it (`max_tokens = 1`).
    fn prefill_half(spec: &RequestSpec) -> RequestSpec {
        let mut half = spec.clone();
        half.output_tokens = 1;
        half.max_tokens = 1;
        half
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PdEvent {
    PrefillRetry(RequestId),
    Handoff(RequestId),
    TransferDone(RequestId),
    HoldExpired(RequestId),
}

/// The cluster's disaggregation state.
#[derive(Clone, Debug)]
pub(crate) struct PdRuntime {
    config: DisaggConfig,
    prefill_router: Router,
    requests: BTreeMap<RequestId, PdRequest>,
    events: BTreeMap<(u64, u64), PdEvent>,
    next_seq: u64,
    /// Prefill halves finished: injected and completed on their pod, not yet client ends.
    prefill_done: u64,
    /// Hand-overs on their way (counted as queued).
    handoffs_pending: u64,
    decode_only: u64,
    decode_candidates: Vec<usize>,
    prefill_candidates: Vec<usize>,
    faults: faults::FaultState,
}

impl Cluster {
    /// A disaggregated cluster: `config.routing` is the decode profile, `disagg` the
    /// decider, the prefill profile and the transfer model.
    pub fn new_disaggregated(
        config: ClusterConfig,
        disagg: DisaggConfig,
        seed: u64,
    ) -> Result<Self, SimError> {
        let runtime = PdRuntime::new(&config, disagg, seed)?;
        let mut cluster = Cluster::new(config, seed)?;
        cluster.pd = Some(Box::new(runtime));
        Ok(cluster)
    }

    /// The disaggregation settings, if the cluster is disaggregated.
    pub fn disaggregation(&self) -> Option<&DisaggConfig> {
        self.pd.as_ref().map(|pd| &pd.config)
    }

    /// Every finished request once, as its client saw it (the records the cluster summary
    /// builds on): a disaggregated request's decode half stamped with its arrival at the
    /// gateway, finished prefill halves left out; a monolithic cluster's records as they are.
    pub fn client_records(&self) -> Vec<RequestRecord> {
        let mut out = Vec::new();
        for (index, engine) in self.engines().iter().enumerate() {
            match &self.pd {
                None => out.extend(engine.metrics().records.iter().cloned()),
                Some(pd) => pd.client_records(index, &engine.metrics().records, &mut out),
            }
        }
        out
    }

    /// Routing of one admitted arrival, disaggregated. Decode-first: the decode profile picks
    /// a decode pod; the decider says from its believed prefix hit whether to prefill
    /// remotely; if so the prefill profile picks a prefill pod. Prefill-first: the prefill
    /// profile picks a prefill pod for every request, then the decode profile a decode pod. `keys_by_size` holds the prompt's block
    /// keys per block size when the decode profile scores prefixes; the scratch views and
    /// fractions are filled for every instance.
    pub(super) fn arrive_disaggregated(
        &mut self,
        spec: RequestSpec,
        keys_by_size: &[(u32, PromptKeys)],
    ) -> Dispatch {
        let Some(mut pd) = self.pd.take() else {
            return Dispatch::Rejected;
        };
        let (decode, prefill) = match pd.config.stage_order {
            StageOrder::DecodeFirst => {
                let decode = self.pick_decode(&pd, keys_by_size);
                let block_size = self.config.instances[decode].engine.block_size;
                let keys_len = keys_by_size
                    .iter()
                    .find(|(size, _)| *size == block_size)
                    .map_or(0, |(_, keys)| keys.len());
                let matched = (self.scratch_fraction[decode] * keys_len as f64).round() as u32;
                let hit_tokens = matched * block_size;
                let remote = pd.config.remote_prefill(spec.input_tokens, hit_tokens)
                    && !pd.prefill_candidates.is_empty();
                let prefill = remote.then(|| self.pick_prefill(&mut pd, &spec));
                (decode, prefill)
            }
            StageOrder::PrefillFirst => {
                // No decider: the prefill profile runs for every request, then the decode
                // profile.
                let prefill =
                    (!pd.prefill_candidates.is_empty()).then(|| self.pick_prefill(&mut pd, &spec));
                (self.pick_decode(&pd, keys_by_size), prefill)
            }
        };
        // The prefill profile picking the decode pod itself (a `both` pod): decode-only.
        let prefill = prefill.filter(|&chosen| chosen != decode);
        let Some(prefill) = prefill else {
            pd.decode_only += 1;
            self.pd = Some(pd);
            self.dispatch_as(decode, spec, Half::Whole);
            return Dispatch::Routed(decode);
        };
        let id = spec.id;
        pd.requests
            .insert(spec.id, PdRequest::new(spec, prefill, decode));
        self.pd = Some(pd);
        self.send_prefill(id);
        Dispatch::Routed(decode)
    }

    /// The decode profile's pick among the decode-serving pods (the prompt's keys recorded in
    /// its approximate index for the chosen pod).
    fn pick_decode(&mut self, pd: &PdRuntime, keys_by_size: &[(u32, PromptKeys)]) -> usize {
        let decode = self.pick_among(&pd.decode_candidates, None);
        let block_size = self.config.instances[decode].engine.block_size;
        if let Some((_, keys)) = keys_by_size.iter().find(|(size, _)| *size == block_size) {
            self.router.record_dispatch_prompt(decode, keys);
        }
        decode
    }

    /// The decode profile's pick among `candidates` (instance indices), from the scratch
    /// views and fractions.
    fn pick_among(&mut self, candidates: &[usize], fractions: Option<&[f64]>) -> usize {
        let fractions = fractions.unwrap_or(&self.scratch_fraction);
        let signals = Signals {
            views: &self.scratch_views,
            in_flight: &self.in_flight,
            sent_since_refresh: &self.sent_since_refresh,
        };
        pick_with(&mut self.router, &signals, candidates, fractions)
    }

    /// The prefill profile's pick, with its own prefix view (and the prompt's keys recorded
    /// in its approximate index for the chosen pod).
    fn pick_prefill(&mut self, pd: &mut PdRuntime, spec: &RequestSpec) -> usize {
        let mode = pd.prefill_router.prefix_mode();
        let count = self.engines.len();
        let mut fractions = vec![0.0; count];
        let mut keys_of: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for &index in &pd.prefill_candidates {
            let block_size = self.config.instances[index].engine.block_size;
            let keys = keys_of
                .entry(block_size)
                .or_insert_with(|| prompt_block_keys(spec, block_size));
            if keys.is_empty() {
                continue;
            }
            let matched = match mode {
                Some(PrefixMode::Approximate { .. }) => {
                    pd.prefill_router.approximate_match(index, keys)
                }
                Some(PrefixMode::Precise) => signals::precise_prefix_match(
                    keys,
                    &self.captured[index],
                    &self.engines[index],
                    &self.config.staleness,
                ),
                None => 0,
            };
            fractions[index] = matched as f64 / keys.len() as f64;
        }
        let signals = Signals {
            views: &self.scratch_views,
            in_flight: &self.in_flight,
            sent_since_refresh: &self.sent_since_refresh,
        };
        let chosen = pick_with(
            &mut pd.prefill_router,
            &signals,
            &pd.prefill_candidates,
            &fractions,
        );
        let block_size = self.config.instances[chosen].engine.block_size;
        if let Some(keys) = keys_of.get(&block_size) {
            pd.prefill_router.record_dispatch(chosen, keys);
        }
        chosen
    }

    /// After instance `index` changed: finished prefill halves are handed over (or end the
    /// request), decode halves that ended before their pull release the prefill's blocks,
    /// and pulls that started are timed. `seen` is how many records were read before.
    pub(super) fn collect_disaggregated(&mut self, index: usize, seen: usize) {
        let Some(mut pd) = self.pd.take() else {
            return;
        };
        let now = self.now_us;
        let records = &self.engines[index].metrics().records;
        let mut release = Vec::new();
        for record in &records[seen..] {
            let Some(request) = pd.requests.get_mut(&record.id) else {
                continue;
            };
            if request.prefill == index && request.stage == Stage::Prefill {
                if record.outcome == Outcome::Completed {
                    request.stage = Stage::Handoff;
                    request.prefill_record = Some(record.clone());
                    let at = record.end_us.max(now);
                    pd.prefill_done += 1;
                    pd.handoffs_pending += 1;
                    pd.push(at, PdEvent::Handoff(record.id));
                    let expiry = now.saturating_add(pd.config.hold_timeout_us);
                    pd.push(expiry, PdEvent::HoldExpired(record.id));
                } else {
                    request.stage = Stage::FailedOnPrefill;
                }
            } else if request.decode == index
                && request.stage == Stage::Decode
                && request.transfer_start_us.is_none()
                && !request.released
            {
                // Ended (timed out, dropped) before its pull started.
                request.released = true;
                release.push((request.prefill, record.id));
            }
        }
        if self.engines[index].has_transfer_starts() {
            for start in self.engines[index].take_transfer_starts() {
                let Some(request) = pd.requests.get_mut(&start.id) else {
                    debug_assert!(false, "a pull for a request the cluster did not split");
                    continue;
                };
                request.transfer_start_us = Some(start.at_us);
                request.transfer_failed = pd
                    .faults
                    .transfer_fails(pd.config.faults.transfer_failure_rate);
                let transfer = pd.config.transfer.transfer_us(
                    &pd.config.kv[request.prefill],
                    &pd.config.kv[index],
                    start.tokens,
                );
                pd.push(
                    start.at_us.saturating_add(transfer),
                    PdEvent::TransferDone(start.id),
                );
            }
        }
        self.pd = Some(pd);
        for (prefill, id) in release {
            self.engines[prefill].run_before(now);
            let released = self.engines[prefill].release_held(id, now);
            debug_assert!(released.is_some(), "the prefill held no blocks for {id:?}");
        }
    }

    /// Processes the earliest hand-over or pull completion.
    pub(super) fn process_pd_event(&mut self) {
        let Some(pd) = self.pd.as_mut() else {
            return;
        };
        let Some((_, event)) = pd.events.pop_first() else {
            return;
        };
        let now = self.now_us;
        match event {
            PdEvent::PrefillRetry(id) => self.retry_prefill(id),
            PdEvent::Handoff(id) => {
                pd.handoffs_pending -= 1;
                let Some(request) = pd.requests.get_mut(&id) else {
                    return;
                };
                request.stage = Stage::Decode;
                request.decode_arrival_us = Some(now);
                let decode = request.decode;
                let mut spec = request.spec.clone();
                spec.arrival_us = now;
                self.dispatch_as(decode, spec, Half::Decode);
            }
            PdEvent::HoldExpired(id) => {
                let Some(request) = pd.requests.get_mut(&id) else {
                    return;
                };
                if request.released {
                    return;
                }
                request.released = true;
                request.expired = true;
                let prefill = request.prefill;
                self.engines[prefill].run_before(now);
                let released = self.engines[prefill].release_held(id, now);
                debug_assert!(released.is_some(), "the prefill held no blocks for {id:?}");
                self.collect_finished(prefill);
            }
            PdEvent::TransferDone(id) => {
                let Some(request) = pd.requests.get_mut(&id) else {
                    return;
                };
                request.transfer_end_us = Some(now);
                let (prefill, decode) = (request.prefill, request.decode);
                // A pull failed in transport sends the prefill pod no notification: it
                // holds the KV until its hold expires.
                let release = !request.released && !request.transfer_failed;
                let failed = request.expired || request.transfer_failed;
                request.released |= release;
                self.engines[decode].run_before(now);
                if failed {
                    self.engines[decode].fail_transfer(id, now);
                } else {
                    self.engines[decode].complete_transfer(id, now);
                }
                self.collect_finished(decode);
                if release {
                    self.engines[prefill].run_before(now);
                    let released = self.engines[prefill].release_held(id, now);
                    debug_assert!(released.is_some(), "the prefill held no blocks for {id:?}");
                    self.collect_finished(prefill);
                }
            }
        }
    }
}

impl PdRuntime {
    /// The disaggregation state of a cluster of `config`'s instances.
    fn new(config: &ClusterConfig, disagg: DisaggConfig, seed: u64) -> Result<Self, SimError> {
        let invalid = |reason: String| SimError::InvalidState {
            field: "disaggregation",
            reason,
        };
        if disagg.kv.len() != config.instances.len() {
            return Err(invalid(format!(
                "KV geometry for {} instances, the cluster has {}",
                disagg.kv.len(),
                config.instances.len()
            )));
        }
        let decode_candidates: Vec<usize> = (0..config.instances.len())
            .filter(|&i| serves_decode(config.instances[i].role))
            .collect();
        let prefill_candidates: Vec<usize> = (0..config.instances.len())
            .filter(|&i| serves_prefill(config.instances[i].role))
            .collect();
        if decode_candidates.is_empty() {
            return Err(invalid(
                "no instance serves decode (role decode or both)".to_owned(),
            ));
        }
        let prefill_router = Router::new(
            disagg.prefill_routing.clone(),
            config.instances.len(),
            RngStreams::new(seed).stream("router-prefill"),
        );
        Ok(PdRuntime {
            config: disagg,
            prefill_router,
            requests: BTreeMap::new(),
            events: BTreeMap::new(),
            next_seq: 0,
            prefill_done: 0,
            handoffs_pending: 0,
            decode_only: 0,
            decode_candidates,
            prefill_candidates,
            faults: faults::FaultState::new(seed),
        })
    }

    fn push(&mut self, at_us: u64, event: PdEvent) {
        self.events.insert((at_us, self.next_seq), event);
        self.next_seq += 1;
    }

    /// Time of the next hand-over or pull completion.
    pub(super) fn next_event_us(&self) -> Option<u64> {
        self.events.first_key_value().map(|(&(at, _), _)| at)
    }
}

/// What a profile routes on, per instance: the cluster's scratch views and counts.
struct Signals<'a> {
    views: &'a [signals::SignalView],
    in_flight: &'a [u64],
    sent_since_refresh: &'a [u64],
}

/// `router`'s pick among `candidates` (instance indices) from `signals` and the instances'
/// prefix `fractions` (indexed by instance): the decode profile and the prefill profile
/// route the same way, each with its own router.
fn pick_with(
    router: &mut Router,
    signals: &Signals<'_>,
    candidates: &[usize],
    fractions: &[f64],
) -> usize {
    let views: Vec<_> = candidates
        .iter()
        .map(|&i| signals.views[i].clone())
        .collect();
    let in_flight: Vec<u64> = candidates.iter().map(|&i| signals.in_flight[i]).collect();
    let sent: Vec<u64> = candidates
        .iter()
        .map(|&i| signals.sent_since_refresh[i])
        .collect();
    let fraction: Vec<f64> = candidates.iter().map(|&i| fractions[i]).collect();
    let context = RoutingContext {
        views: &views,
        in_flight: &in_flight,
        sent_since_refresh: &sent,
        prefix_fraction: &fraction,
    };
    candidates[router.pick(&context)]
}
