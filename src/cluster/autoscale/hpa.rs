//! The Kubernetes HorizontalPodAutoscaler's replica arithmetic (autoscaling/v2), as its
//! controller applies it at every sync: the metric's desired count under the tolerance,
//! the stabilization windows over past recommendations, the rate policies over past scale
//! events, and the min/max bounds. Written from the HPA controller's documented behaviour
//! (`pkg/controller/podautoscaler/horizontal.go`: `stabilizeRecommendationWithBehaviors`,
//! `convertDesiredReplicasWithBehaviorRate`, `calculateScaleUpLimitWithScalingRules`,
//! `calculateScaleDownLimitWithBehaviors`). Pure: times are the caller's microseconds.

use std::collections::VecDeque;

/// One rate policy: how much one direction may change within a period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RatePolicy {
    /// At most `pods` pods per `period_us`.
    Pods {
        /// Pods.
        pods: u32,
        /// Period (µs).
        period_us: u64,
    },
    /// At most `percent` % of the replicas at the period's start per `period_us`.
    Percent {
        /// Percent.
        percent: f64,
        /// Period (µs).
        period_us: u64,
    },
}

impl RatePolicy {
    fn period_us(&self) -> u64 {
        match *self {
            RatePolicy::Pods { period_us, .. } | RatePolicy::Percent { period_us, .. } => period_us,
        }
    }
}

/// Which policy wins when several apply (`selectPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectPolicy {
    /// The policy allowing the largest change (the default).
    Max,
    /// The policy allowing the smallest change.
    Min,
    /// No change in this direction.
    Disabled,
}

/// The rules of one direction (`behavior.scaleUp` or `behavior.scaleDown`).
#[derive(Clone, Debug, PartialEq)]
pub struct ScalingRules {
    /// Past recommendations considered (µs; `stabilizationWindowSeconds`).
    pub stabilization_us: u64,
    /// Rate policies.
    pub policies: Vec<RatePolicy>,
    /// How the policies combine.
    pub select: SelectPolicy,
}

/// The HPA's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct HpaConfig {
    /// Fewest replicas.
    pub min_replicas: u32,
    /// Most replicas.
    pub max_replicas: u32,
    /// A usage ratio within 1 ± tolerance changes nothing (the controller's 0.1).
    pub tolerance: f64,
    /// Scale-up rules.
    pub scale_up: ScalingRules,
    /// Scale-down rules.
    pub scale_down: ScalingRules,
}

impl HpaConfig {
    /// llm-d's guide behaviour (the chart's default): scale up after a 30 s window by
    /// max(100 %, 4 pods) per 60 s; scale down after a 180 s window by 1 pod per 120 s.
    pub fn llm_d_guide(min_replicas: u32, max_replicas: u32) -> Self {
        Self {
            min_replicas,
            max_replicas,
            tolerance: 0.1,
            scale_up: ScalingRules {
                stabilization_us: 30_000_000,
                policies: vec![
                    RatePolicy::Percent {
                        percent: 100.0,
                        period_us: 60_000_000,
                    },
                    RatePolicy::Pods {
                        pods: 4,
                        period_us: 60_000_000,
                    },
                ],
                select: SelectPolicy::Max,
            },
            scale_down: ScalingRules {
                stabilization_us: 180_000_000,
                policies: vec![RatePolicy::Pods {
                    pods: 1,
                    period_us: 120_000_000,
                }],
                select: SelectPolicy::Max,
            },
        }
    }
}

/// The HPA controller's memory: past recommendations and scale events.
#[derive(Clone, Debug)]
pub struct Hpa {
    config: HpaConfig,
    recommendations: VecDeque<(u64, u32)>,
    /// (time, replicas added (> 0) or removed (< 0)).
    events: VecDeque<(u64, i64)>,
}

impl Hpa {
    /// A controller with no history.
    pub fn new(config: HpaConfig) -> Self {
        Self {
            config,
            recommendations: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &HpaConfig {
        &self.config
    }

    /// The metric's desired count at `current` replicas for a metric of `value` against a
    /// per-replica `target` (`AverageValue`: ⌈value / target⌉), `current` when the usage
    /// ratio value / (target · current) is within the tolerance.
    pub fn metric_desired(&self, current: u32, value: f64, target: f64) -> u32 {
        if !(value.is_finite() && target > 0.0) {
            return current;
        }
        let value = value.max(0.0);
        if current > 0 {
            let ratio = value / (target * f64::from(current));
            if (ratio - 1.0).abs() <= self.config.tolerance {
                return current;
            }
        }
        (value / target).ceil().min(f64::from(u32::MAX)) as u32
    }

    /// One sync at `now_us`: from the metric's desired count and the current replicas, the
    /// replicas to set (stabilized, rate-limited, within min/max). Records the
    /// recommendation and, when the count changes, the scale event.
    pub fn sync(&mut self, now_us: u64, current: u32, desired: u32) -> u32 {
        let stabilized = self.stabilize(now_us, current, desired);
        let limited = self.rate_limit(now_us, current, stabilized);
        let next = limited.clamp(self.config.min_replicas, self.config.max_replicas);
        if next != current {
            self.events
                .push_back((now_us, i64::from(next) - i64::from(current)));
        }
        // Events older than the longest period are never read again.
        let longest = self
            .config
            .scale_up
            .policies
            .iter()
            .chain(&self.config.scale_down.policies)
            .map(RatePolicy::period_us)
            .max()
            .unwrap_or(0);
        while self
            .events
            .front()
            .is_some_and(|&(at, _)| at + longest < now_us)
        {
            self.events.pop_front();
        }
        next
    }

    fn stabilize(&mut self, now_us: u64, current: u32, desired: u32) -> u32 {
        let up_window = self.config.scale_up.stabilization_us;
        let down_window = self.config.scale_down.stabilization_us;
        let (mut up, mut down) = (desired, desired);
        for &(at, recommendation) in &self.recommendations {
            if at + up_window > now_us {
                up = up.min(recommendation);
            }
            if at + down_window > now_us {
                down = down.max(recommendation);
            }
        }
        let mut stabilized = current;
        if stabilized < up {
            stabilized = up;
        }
        if stabilized > down {
            stabilized = down;
        }
        self.recommendations.push_back((now_us, desired));
        let longest = up_window.max(down_window);
        while self
            .recommendations
            .front()
            .is_some_and(|&(at, _)| at + longest <= now_us)
        {
            self.recommendations.pop_front();
        }
        stabilized
    }

    fn rate_limit(&self, now_us: u64, current: u32, desired: u32) -> u32 {
        let current_i = i64::from(current);
        if desired > current {
            let rules = &self.config.scale_up;
            let limit = match rules.select {
                SelectPolicy::Disabled => current_i,
                select => {
                    let mut best: Option<i64> = None;
                    for policy in &rules.policies {
                        let added: i64 = self
                            .in_period(now_us, policy.period_us())
                            .filter(|&d| d > 0)
                            .sum();
                        let start = current_i - added;
                        let proposed = match *policy {
                            RatePolicy::Pods { pods, .. } => start + i64::from(pods),
                            RatePolicy::Percent { percent, .. } => {
                                (start as f64 * (1.0 + percent / 100.0)).ceil() as i64
                            }
                        };
                        best = Some(match (best, select) {
                            (None, _) => proposed,
                            (Some(b), SelectPolicy::Min) => b.min(proposed),
                            (Some(b), _) => b.max(proposed),
                        });
                    }
                    best.unwrap_or(current_i).max(current_i)
                }
            };
            desired.min(limit.clamp(0, i64::from(u32::MAX)) as u32)
        } else if desired < current {
            let rules = &self.config.scale_down;
            let limit = match rules.select {
                SelectPolicy::Disabled => current_i,
                select => {
                    let mut best: Option<i64> = None;
                    for policy in &rules.policies {
                        let removed: i64 = self
                            .in_period(now_us, policy.period_us())
                            .filter(|&d| d < 0)
                            .map(|d| -d)
                            .sum();
                        let start = current_i + removed;
                        let proposed = match *policy {
                            RatePolicy::Pods { pods, .. } => start - i64::from(pods),
                            RatePolicy::Percent { percent, .. } => {
                                (start as f64 * (1.0 - percent / 100.0)) as i64
                            }
                        };
                        // The largest change is the lowest count.
                        best = Some(match (best, select) {
                            (None, _) => proposed,
                            (Some(b), SelectPolicy::Min) => b.max(proposed),
                            (Some(b), _) => b.min(proposed),
                        });
                    }
                    best.unwrap_or(current_i).min(current_i)
                }
            };
            desired.max(limit.clamp(0, i64::from(u32::MAX)) as u32)
        } else {
            desired
        }
    }

    /// Scale events within `period_us` before `now_us`.
    fn in_period(&self, now_us: u64, period_us: u64) -> impl Iterator<Item = i64> + '_ {
        self.events
            .iter()
            .filter(move |&&(at, _)| at + period_us > now_us)
            .map(|&(_, delta)| delta)
    }
}

#[cfg(test)]
#[path = "hpa_tests.rs"]
mod tests;
