//! The closed loop: a cluster of replica slots under one policy and the HPA. Every sync
//! period the policy reads the pool and the HPA sets the replica count; a new replica
//! becomes routable after its warm-up, a removed one stops receiving requests at once and
//! leaves after it drains (its requests finish where they are: none is lost). Finished
//! requests are read as they leave, once each, into the attainment, the latency window and
//! the timeline; per sync the work is O(replicas) plus the requests that finished.

use std::collections::VecDeque;

use rand_core::Rng;

use super::capacity::meets;
use super::config::{AutoscaleConfig, Policy};
use super::hpa::Hpa;
use super::outcome::{PolicyOutcome, Sample, SlotChange, SlotState};
use super::policy::{Observation, PodLoad, PolicyState};
use crate::cluster::Cluster;
use crate::cluster::config::ClusterConfig;
use crate::sim::metrics::Outcome;
use crate::sim::rng::{RngStreams, SimRng};
use crate::sim::{Engine, EngineConfig, RequestRecord, RequestSpec, SimError};

/// Why an autoscaled run could not run.
#[derive(Debug, thiserror::Error)]
pub enum AutoscaleError {
    /// The simulation refused a request or a config.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// The run needs more events than allowed.
    #[error("autoscaled run exceeded {0} events")]
    EventBudget(u64),
}

/// A finished request, as the loop hands it to an observer: the slot it ran on.
pub type Observer<'a> = dyn FnMut(usize, &RequestRecord) + 'a;

struct Loop<'a> {
    cluster: Cluster,
    config: &'a AutoscaleConfig,
    states: Vec<SlotState>,
    rejected_seen: usize,
    warm_rng: SimRng,
    /// (end µs, ttft µs, tpot µs or NaN) of requests finished within the quantile window.
    window: VecDeque<(u64, f64, f64)>,
    window_us: u64,
    ttft_ms: Vec<f32>,
    tpot_ms: Vec<f32>,
    outcome: PolicyOutcome,
    billed_since_us: u64,
    scratch: Vec<f64>,
}

/// One policy's run: the pool (`base`'s first instance is the replica template), the
/// autoscaler, the policy, the predictive policy's per-replica capacity (req/s), the seed
/// and the event budget.
#[derive(Clone, Copy, Debug)]
pub struct PolicyRun<'a> {
    /// The cluster whose first instance is replicated (routing, admission, staleness kept).
    pub base: &'a ClusterConfig,
    /// The autoscaler.
    pub config: &'a AutoscaleConfig,
    /// The policy.
    pub policy: &'a Policy,
    /// Requests per second one replica serves (predictive policy).
    pub capacity: f64,
    /// Seed of the router and warm-up streams.
    pub seed: u64,
    /// Most events.
    pub max_events: u64,
}

/// Runs `requests` (arrival order) through `run`'s pool; `observer` sees every finished
/// request once with its slot (`usize::MAX` for a rejected one).
pub fn run_policy<I>(
    run: &PolicyRun<'_>,
    requests: I,
    observer: &mut Observer<'_>,
) -> Result<PolicyOutcome, AutoscaleError>
where
    I: IntoIterator<Item = RequestSpec>,
{
    let PolicyRun {
        base,
        config,
        policy,
        capacity,
        seed,
        max_events,
    } = *run;
    let hpa_config = config.hpa.clone();
    let (min, max) = (hpa_config.min_replicas, hpa_config.max_replicas);
    let initial = match policy {
        Policy::Static { replicas } => replicas.unwrap_or(max).clamp(min, max),
        _ => config.initial_replicas.clamp(min, max),
    };
    let cluster = slot_cluster(base, max, initial, seed)?;
    let mut state = Loop::start(cluster, run, initial);
    let mut hpa = Hpa::new(hpa_config);
    let period = config.sync_period_us.max(1);
    let mut policy_state = PolicyState::new(
        policy.clone(),
        config.objectives,
        period as f64 / 1e6,
        capacity,
    );
    let mut requests = requests.into_iter().peekable();
    let mut next_sync = period;
    let mut arrivals_in_period = 0u64;
    loop {
        let ready_next = state
            .states
            .iter()
            .filter_map(|s| match s {
                SlotState::Warming { ready_at_us } => Some(*ready_at_us),
                _ => None,
            })
            .min();
        let stop = ready_next.map_or(next_sync, |t| t.min(next_sync));
        while let Some(spec) = requests.next_if(|s| s.arrival_us <= stop) {
            arrivals_in_period += 1;
            state.outcome.requests += 1;
            state.cluster.submit(spec)?;
        }
        state.cluster.run_until(stop);
        if state.cluster.events_processed() > max_events {
            return Err(AutoscaleError::EventBudget(max_events));
        }
        state.bill(stop);
        state.collect(observer);
        state.settle(stop);
        if stop == next_sync {
            let rate = arrivals_in_period as f64 / (period as f64 / 1e6);
            arrivals_in_period = 0;
            state.sync(stop, rate, &mut hpa, &mut policy_state);
            next_sync += period;
        }
        let done = requests.peek().is_none() && state.cluster.is_idle();
        if done {
            state.bill(state.cluster.now_us());
            break;
        }
    }
    Ok(state.finish())
}

/// The pool as a cluster of replica slots: `base`'s first instance copied into twice
/// `max` slots (room for draining replicas beside a full pool), keeping request records, the
/// first `initial` routable.
fn slot_cluster(
    base: &ClusterConfig,
    max: u32,
    initial: u32,
    seed: u64,
) -> Result<Cluster, AutoscaleError> {
    let slots = (2 * max as usize).max(1);
    let template = base.instances[0].clone();
    let mut cluster_config = base.clone();
    cluster_config.instances = (0..slots)
        .map(|index| {
            let mut instance = template.clone();
            instance.id = format!("replica-{index}");
            instance.engine = EngineConfig {
                keep_request_records: true,
                kv_sample_interval_us: 0,
                ..template.engine.clone()
            };
            instance
        })
        .collect();
    let mut cluster = Cluster::new(cluster_config, seed)?;
    cluster.enable_scaling((0..slots).map(|i| i < initial as usize).collect());
    Ok(cluster)
}

impl<'a> Loop<'a> {
    /// The loop at time 0 over `cluster`'s slots, the first `initial` ready.
    fn start(cluster: Cluster, run: &PolicyRun<'a>, initial: u32) -> Self {
        let mut outcome = PolicyOutcome::new(run.policy.name());
        let mut states = vec![SlotState::Off; cluster.config().instances.len()];
        for (index, state) in states.iter_mut().enumerate().take(initial as usize) {
            *state = SlotState::Ready;
            outcome.changes.push(SlotChange {
                at_us: 0,
                slot: index,
                state: SlotState::Ready,
            });
        }
        Loop {
            cluster,
            config: run.config,
            states,
            rejected_seen: 0,
            warm_rng: RngStreams::new(run.seed).stream("autoscale-warmup"),
            window: VecDeque::new(),
            window_us: match run.policy {
                Policy::SloAware {
                    quantile_window_us, ..
                } => *quantile_window_us,
                _ => 60_000_000,
            },
            ttft_ms: Vec::new(),
            tpot_ms: Vec::new(),
            outcome,
            billed_since_us: 0,
            scratch: Vec::new(),
        }
    }
}

impl Loop<'_> {
    /// Replica-time since the last call, for every slot that holds a pod.
    fn bill(&mut self, now_us: u64) {
        let pods = self
            .states
            .iter()
            .filter(|s| !matches!(s, SlotState::Off))
            .count() as f64;
        let elapsed = now_us.saturating_sub(self.billed_since_us) as f64 / 3.6e9;
        self.outcome.replica_hours += pods * elapsed;
        self.billed_since_us = self.billed_since_us.max(now_us);
    }

    /// Reads every request that left since the last call.
    fn collect(&mut self, observer: &mut Observer<'_>) {
        let objectives = self.config.objectives;
        for slot in 0..self.states.len() {
            let Self {
                cluster,
                outcome,
                window,
                ttft_ms,
                tpot_ms,
                ..
            } = self;
            cluster.drain_records(slot, |record| {
                observer(slot, record);
                tally(outcome, window, ttft_ms, tpot_ms, record, objectives);
            });
        }
        let rejected = self.cluster.rejected_records();
        for record in &rejected[self.rejected_seen..] {
            observer(usize::MAX, record);
            self.outcome.finished += 1;
        }
        self.rejected_seen = rejected.len();
    }

    /// Warm-ups that ended become routable; drained replicas leave.
    fn settle(&mut self, now_us: u64) {
        for slot in 0..self.states.len() {
            let next = match self.states[slot] {
                SlotState::Warming { ready_at_us } if ready_at_us <= now_us => SlotState::Ready,
                SlotState::Draining if self.cluster.is_drained(slot) => SlotState::Off,
                _ => continue,
            };
            self.cluster.set_routable(slot, next == SlotState::Ready);
            self.change(now_us, slot, next);
        }
    }

    fn change(&mut self, at_us: u64, slot: usize, state: SlotState) {
        self.states[slot] = state;
        self.outcome.changes.push(SlotChange { at_us, slot, state });
    }

    fn count(&self, wanted: fn(&SlotState) -> bool) -> u32 {
        self.states.iter().filter(|s| wanted(s)).count() as u32
    }

    /// One HPA sync: observe, decide, act, and sample the timeline.
    fn sync(&mut self, now_us: u64, rate: f64, hpa: &mut Hpa, policy: &mut PolicyState) {
        while self
            .window
            .front()
            .is_some_and(|&(end, _, _)| end + self.window_us <= now_us)
        {
            self.window.pop_front();
        }
        let p90_ttft = self.window_p90(|&(_, ttft, _)| ttft);
        let p90_tpot = self.window_p90(|&(_, _, tpot)| tpot);
        let pods: Vec<PodLoad> = (0..self.states.len())
            .filter(|&i| self.states[i] == SlotState::Ready)
            .map(|i| {
                let engine = &self.cluster.engines()[i];
                PodLoad {
                    waiting: engine.counts().queued,
                    kv_usage: engine.kv().usage(),
                }
            })
            .collect();
        let ready = pods.len() as u32;
        let current = self.count(|s| matches!(s, SlotState::Ready | SlotState::Warming { .. }));
        let observation = Observation {
            current,
            ready,
            pods: &pods,
            p90_ttft_us: p90_ttft,
            p90_tpot_us: p90_tpot,
            arrival_rate: rate,
        };
        let signal = policy.signal(now_us, &observation);
        let desired = PolicyState::desired(hpa, current, signal);
        let target = hpa.sync(now_us, current, desired);
        if target > current {
            self.outcome.scale_ups += 1;
            self.add(now_us, target - current);
        } else if target < current {
            self.outcome.scale_downs += 1;
            self.remove(now_us, current - target);
        }
        let objectives = self.config.objectives;
        let over = p90_ttft.is_some_and(|t| t > objectives.ttft_us)
            || p90_tpot.is_some_and(|t| t > objectives.tpot_us);
        if over {
            self.outcome.time_over_slo_s += self.config.sync_period_us as f64 / 1e6;
        }
        let billed = self.count(|s| !matches!(s, SlotState::Off));
        self.outcome.timeline.push(Sample {
            at_s: now_us as f64 / 1e6,
            arrival_rate: rate,
            ready: self.count(|s| *s == SlotState::Ready),
            desired: target,
            billed,
            p90_ttft_ms: p90_ttft.map(|t| t / 1e3),
            p90_tpot_ms: p90_tpot.map(|t| t / 1e3),
        });
        self.outcome.peak_replicas = self.outcome.peak_replicas.max(billed);
    }

    fn window_p90(&mut self, pick: fn(&(u64, f64, f64)) -> f64) -> Option<f64> {
        self.scratch.clear();
        self.scratch
            .extend(self.window.iter().map(pick).filter(|v| v.is_finite()));
        if self.scratch.is_empty() {
            return None;
        }
        let rank = ((self.scratch.len() as f64 * 0.9).ceil() as usize).clamp(1, self.scratch.len());
        let (_, value, _) = self
            .scratch
            .select_nth_unstable_by(rank - 1, |a, b| a.total_cmp(b));
        Some(*value)
    }

    /// Starts `count` new replicas in stopped slots, each warming for a drawn time.
    fn add(&mut self, now_us: u64, count: u32) {
        let warm = self.config.warm_up;
        let mut left = count;
        for slot in 0..self.states.len() {
            if left == 0 {
                break;
            }
            if self.states[slot] != SlotState::Off {
                continue;
            }
            let template = &self.cluster.config().instances[slot];
            let Ok(engine) = Engine::new(template.engine.clone(), template.latency.clone()) else {
                continue;
            };
            if !self.cluster.replace_engine(slot, engine) {
                continue;
            }
            let span = warm.max_us.saturating_sub(warm.min_us);
            let draw = if span == 0 {
                0
            } else {
                self.warm_rng.next_u64() % (span + 1)
            };
            let ready_at_us = now_us + warm.min_us + draw;
            self.outcome.pods_added += 1;
            self.change(now_us, slot, SlotState::Warming { ready_at_us });
            left -= 1;
        }
    }

    /// Stops `count` replicas: warming ones first (the last to be ready first), then the
    /// ready ones holding the fewest requests, which drain before they leave.
    fn remove(&mut self, now_us: u64, count: u32) {
        for _ in 0..count {
            let warming = (0..self.states.len())
                .filter_map(|i| match self.states[i] {
                    SlotState::Warming { ready_at_us } => Some((ready_at_us, i)),
                    _ => None,
                })
                .max();
            if let Some((_, slot)) = warming {
                self.outcome.pods_removed += 1;
                self.change(now_us, slot, SlotState::Off);
                continue;
            }
            let ready = (0..self.states.len())
                .filter(|&i| self.states[i] == SlotState::Ready)
                .min_by_key(|&i| (self.cluster.in_flight()[i], std::cmp::Reverse(i)));
            let Some(slot) = ready else {
                return;
            };
            self.cluster.set_routable(slot, false);
            self.outcome.pods_removed += 1;
            let next = if self.cluster.is_drained(slot) {
                SlotState::Off
            } else {
                SlotState::Draining
            };
            self.change(now_us, slot, next);
        }
    }

    fn finish(mut self) -> PolicyOutcome {
        let counts = self.cluster.counts();
        let outcome = &mut self.outcome;
        outcome.counts = counts;
        outcome.duration_s = self.cluster.now_us() as f64 / 1e6;
        outcome.events = self.cluster.events_processed();
        outcome.cost = outcome.replica_hours * self.cluster.config().instances[0].cost_per_hour;
        outcome.set_latencies(&mut self.ttft_ms, &mut self.tpot_ms);
        self.outcome
    }
}

/// Counts one finished request into the outcome and the latency window.
fn tally(
    outcome: &mut PolicyOutcome,
    window: &mut VecDeque<(u64, f64, f64)>,
    ttft_ms: &mut Vec<f32>,
    tpot_ms: &mut Vec<f32>,
    record: &RequestRecord,
    objectives: super::config::Objectives,
) {
    outcome.finished += 1;
    if record.outcome != Outcome::Completed {
        return;
    }
    outcome.completed += 1;
    if meets(record, objectives) {
        outcome.met += 1;
    }
    let ttft = record.ttft_us().map_or(f64::NAN, |t| t as f64);
    let tpot = record.tpot_us().unwrap_or(f64::NAN);
    ttft_ms.push((ttft / 1e3) as f32);
    if tpot.is_finite() {
        tpot_ms.push((tpot / 1e3) as f32);
    }
    window.push_back((record.end_us, ttft, tpot));
}
