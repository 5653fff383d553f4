//! Each policy's signal at a sync: what it reads from the pool and the metric it hands the
//! HPA (a value against a per-replica target). O(replicas) per sync, plus the forecaster's
//! O(horizon steps).

use std::collections::VecDeque;

use super::config::{Objectives, Policy};
use super::hpa::Hpa;
use crate::workload::load_forecast::{LoadForecastSettings, LoadForecaster};

/// One ready replica as a metrics scrape sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PodLoad {
    /// Requests waiting.
    pub waiting: u64,
    /// KV-cache usage in [0, 1].
    pub kv_usage: f64,
}

/// What the pool looks like at a sync.
#[derive(Clone, Debug, Default)]
pub struct Observation<'a> {
    /// Replicas asked for (warming + ready), the HPA's current count.
    pub current: u32,
    /// Ready replicas.
    pub ready: u32,
    /// The ready replicas' loads.
    pub pods: &'a [PodLoad],
    /// P90 TTFT (µs) of the requests that finished in the SLO-aware rule's window, if any.
    pub p90_ttft_us: Option<f64>,
    /// P90 TPOT (µs) over the same requests.
    pub p90_tpot_us: Option<f64>,
    /// Arrivals per second over the last sync period.
    pub arrival_rate: f64,
}

/// A policy with its memory (the SLO-aware rule's smoothing, the predictive forecaster).
#[derive(Clone, Debug)]
pub struct PolicyState {
    policy: Policy,
    objectives: Objectives,
    /// (time, clamped ratio) samples within the smoothing window.
    ratios: VecDeque<(u64, f64)>,
    forecaster: Option<LoadForecaster>,
    /// Requests per second one replica serves within the objectives (predictive only).
    capacity_per_replica: f64,
}

/// The HPA's input from a policy at one sync.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Signal {
    /// Hold at this count (bypasses the metric arithmetic: static).
    Fixed(u32),
    /// A metric value against a per-replica target.
    Metric {
        /// The value.
        value: f64,
        /// The per-replica target.
        target: f64,
    },
    /// A desired count computed by the policy itself.
    Desired(u32),
}

impl PolicyState {
    /// `policy` with no history; `sync_period_s` is the forecaster's step and
    /// `capacity_per_replica` the predictive policy's per-replica rate.
    pub fn new(
        policy: Policy,
        objectives: Objectives,
        sync_period_s: f64,
        capacity_per_replica: f64,
    ) -> Self {
        let forecaster = matches!(policy, Policy::Predictive { .. })
            .then(|| LoadForecaster::new(LoadForecastSettings::for_step(sync_period_s)));
        Self {
            policy,
            objectives,
            ratios: VecDeque::new(),
            forecaster,
            capacity_per_replica,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The last smoothed SLO ratio (SLO-aware only; 0 otherwise).
    pub fn smoothed_ratio(&self) -> f64 {
        if self.ratios.is_empty() {
            return 0.0;
        }
        self.ratios.iter().map(|&(_, r)| r).sum::<f64>() / self.ratios.len() as f64
    }

    /// The policy's signal at `now_us`.
    pub fn signal(&mut self, now_us: u64, observation: &Observation<'_>) -> Signal {
        match self.policy.clone() {
            Policy::Static { replicas } => Signal::Fixed(replicas.unwrap_or(observation.current)),
            Policy::SloAware {
                up,
                down,
                clamp,
                smoothing_us,
                ..
            } => {
                let ratio = |p90: Option<f64>, slo: f64| match p90 {
                    Some(value) if slo > 0.0 && value.is_finite() => value / slo,
                    _ => 0.0,
                };
                let raw = ratio(observation.p90_ttft_us, self.objectives.ttft_us)
                    .max(ratio(observation.p90_tpot_us, self.objectives.tpot_us))
                    .clamp(0.0, clamp);
                self.ratios.push_back((now_us, raw));
                while self
                    .ratios
                    .front()
                    .is_some_and(|&(at, _)| at + smoothing_us <= now_us)
                {
                    self.ratios.pop_front();
                }
                let s = self.smoothed_ratio();
                let n = f64::from(observation.current);
                let desired = if s > up {
                    // While a scale-up is in flight, only the ready share counts.
                    let c = if observation.current == 0 {
                        1.0
                    } else {
                        f64::from(observation.ready) / n
                    };
                    let grow = (n * (s * c / up - 1.0)).ceil().max(0.0);
                    n + grow
                } else if s < down {
                    n - (n * (1.0 - s / down)).floor()
                } else {
                    n
                };
                Signal::Desired(desired.max(0.0) as u32)
            }
            Policy::QueueDepth { target } => Signal::Metric {
                value: observation.pods.iter().map(|p| p.waiting as f64).sum(),
                target,
            },
            Policy::Saturation {
                kv_threshold,
                queue_threshold,
                kv_spare,
                queue_spare,
            } => Signal::Desired(saturation_desired(
                observation,
                kv_threshold,
                queue_threshold,
                kv_spare,
                queue_spare,
            )),
            Policy::Predictive {
                horizon_us,
                utilization,
            } => {
                let Some(forecaster) = self.forecaster.as_mut() else {
                    return Signal::Fixed(observation.current);
                };
                forecaster.observe(observation.arrival_rate);
                let peak = forecaster
                    .peak_within(horizon_us as f64 / 1e6)
                    .max(observation.arrival_rate);
                let per_replica = (self.capacity_per_replica * utilization).max(1e-9);
                Signal::Metric {
                    value: peak / per_replica,
                    target: 1.0,
                }
            }
        }
    }

    /// The metric's desired count for `signal` (before stabilization and rate limits).
    pub fn desired(hpa: &Hpa, current: u32, signal: Signal) -> u32 {
        match signal {
            Signal::Fixed(count) | Signal::Desired(count) => count,
            Signal::Metric { value, target } => hpa.metric_desired(current, value, target),
        }
    }
}

/// WVA's saturation decision: one more replica when the non-saturated pods' mean spare
/// capacity is under a trigger (and no replica is still warming), one fewer when the load
/// spread over one pod fewer keeps both spares, else hold.
fn saturation_desired(
    observation: &Observation<'_>,
    kv_threshold: f64,
    queue_threshold: f64,
    kv_spare: f64,
    queue_spare: f64,
) -> u32 {
    let current = observation.current;
    let pods = observation.pods;
    let warming = observation.current > observation.ready;
    let free: Vec<&PodLoad> = pods
        .iter()
        .filter(|p| p.kv_usage < kv_threshold && (p.waiting as f64) < queue_threshold)
        .collect();
    let up = if free.is_empty() {
        !pods.is_empty()
    } else {
        let n = free.len() as f64;
        let spare_kv = free.iter().map(|p| kv_threshold - p.kv_usage).sum::<f64>() / n;
        let spare_queue = free
            .iter()
            .map(|p| queue_threshold - p.waiting as f64)
            .sum::<f64>()
            / n;
        spare_kv < kv_spare || spare_queue < queue_spare
    };
    if up {
        return if warming { current } else { current + 1 };
    }
    if pods.len() > 1 && !warming {
        let fewer = (pods.len() - 1) as f64;
        let kv = pods.iter().map(|p| p.kv_usage).sum::<f64>() / fewer;
        let queue = pods.iter().map(|p| p.waiting as f64).sum::<f64>() / fewer;
        if kv_threshold - kv >= kv_spare && queue_threshold - queue >= queue_spare {
            return current.saturating_sub(1);
        }
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objectives() -> Objectives {
        Objectives {
            ttft_us: 1_000_000.0,
            tpot_us: 50_000.0,
        }
    }

    #[test]
    fn slo_aware_scales_up_by_the_ready_share_and_down_by_the_floor() {
        let policy = Policy::by_name("slo-aware").unwrap();
        let mut state = PolicyState::new(policy, objectives(), 15.0, 0.0);
        let observe = |ttft: f64, current: u32, ready: u32| Observation {
            current,
            ready,
            p90_ttft_us: Some(ttft),
            p90_tpot_us: Some(4_000.0),
            ..Observation::default()
        };
        // s = 1.1 (TTFT 1.1 s over 1 s): 4 ready of 4 → 4 + ⌈4·(1.1/0.55 − 1)⌉ = 8.
        assert_eq!(
            state.signal(0, &observe(1_100_000.0, 4, 4)),
            Signal::Desired(8)
        );
        // A fresh state: s clamped at 2; 2 ready of 4 → 4 + ⌈4·(2·0.5/0.55 − 1)⌉ = 8.
        let mut state = PolicyState::new(
            Policy::by_name("slo-aware").unwrap(),
            objectives(),
            15.0,
            0.0,
        );
        assert_eq!(
            state.signal(0, &observe(9_000_000.0, 4, 2)),
            Signal::Desired(8)
        );
        // s = 0.1 → 8 − ⌊8·(1 − 0.25)⌋ = 2 once the window holds only low samples.
        let mut state = PolicyState::new(
            Policy::by_name("slo-aware").unwrap(),
            objectives(),
            15.0,
            0.0,
        );
        assert_eq!(
            state.signal(0, &observe(100_000.0, 8, 8)),
            Signal::Desired(2)
        );
        // Between the thresholds: hold. The 45 s mean of 0.1 and 0.9 is 0.5.
        assert_eq!(
            state.signal(15_000_000, &observe(900_000.0, 8, 8)),
            Signal::Desired(8)
        );
        // The first sample leaves the window at 45 s: s = (0.9 + 0.9 + 0.9) / 3.
        state.signal(30_000_000, &observe(900_000.0, 8, 8));
        assert!((state.smoothed_ratio() - (0.1 + 0.9 + 0.9) / 3.0).abs() < 1e-12);
        state.signal(45_000_000, &observe(900_000.0, 8, 8));
        assert!((state.smoothed_ratio() - 0.9).abs() < 1e-12);
    }

    #[test]
    fn saturation_adds_one_when_spare_is_short_and_removes_one_when_it_stays() {
        let busy = [
            PodLoad {
                waiting: 3,
                kv_usage: 0.5,
            },
            PodLoad {
                waiting: 1,
                kv_usage: 0.5,
            },
        ];
        // Mean spare queue (2 + 4) / 2 = 3 is not under 3; spare KV 0.3: hold, and one
        // pod fewer would hold 4 waiting: hold.
        let obs = Observation {
            current: 2,
            ready: 2,
            pods: &busy,
            ..Observation::default()
        };
        assert_eq!(saturation_desired(&obs, 0.8, 5.0, 0.1, 3.0), 2);
        let hot = [PodLoad {
            waiting: 0,
            kv_usage: 0.75,
        }];
        let obs = Observation {
            current: 1,
            ready: 1,
            pods: &hot,
            ..Observation::default()
        };
        assert_eq!(saturation_desired(&obs, 0.8, 5.0, 0.1, 3.0), 2);
        // While a replica warms, no second scale-up.
        let obs = Observation {
            current: 2,
            ready: 1,
            pods: &hot,
            ..Observation::default()
        };
        assert_eq!(saturation_desired(&obs, 0.8, 5.0, 0.1, 3.0), 2);
        let idle = [PodLoad::default(); 3];
        let obs = Observation {
            current: 3,
            ready: 3,
            pods: &idle,
            ..Observation::default()
        };
        assert_eq!(saturation_desired(&obs, 0.8, 5.0, 0.1, 3.0), 2);
    }
}
