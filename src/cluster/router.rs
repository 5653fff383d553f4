//! The router: picks an instance for each admitted request.
//!
//! Policies: round-robin, random, least-loaded (queue + running + router in-flight), vLLM's
//! data-parallel balancer (4 · waiting + running as last reported, plus 4 a request sent
//! since), and
//! weighted scoring with llm-d's scorer formulas, each in [0, 1], combined as a weighted
//! mean and picked by max score (seeded random tie-break) or weighted random. All randomness
//! comes from the router's own named stream. The approximate prefix index (what llm-d's
//! `approx-prefix-cache-producer` remembers: the blocks it sent to each pod, per-pod LRU)
//! lives here because it is router-side state.

use rand_core::Rng;

use super::config::{Picker, PrefixMode, RoutingPolicy, Scorer};
use super::signals::SignalView;
use crate::sim::kv::LruKeySet;
use crate::sim::kv::hash::PromptKeys;
use crate::sim::rng::SimRng;

/// Everything a routing decision reads, one entry per instance.
#[derive(Clone, Copy, Debug)]
pub struct RoutingContext<'a> {
    /// Signal views (live or stale).
    pub views: &'a [SignalView],
    /// Router-local in-flight requests (always fresh).
    pub in_flight: &'a [u64],
    /// Requests sent to each instance since its queue-depth signal last refreshed (0 when
    /// the queue depth is read live: it already counts them).
    pub sent_since_refresh: &'a [u64],
    /// Fraction of the prompt's full blocks each instance is believed to hold (leading
    /// blocks matched / prompt blocks, 0 for a prompt shorter than a block).
    pub prefix_fraction: &'a [f64],
}

/// Router state: policy, round-robin cursor, approximate prefix index, random stream.
#[derive(Clone, Debug)]
pub struct Router {
    policy: RoutingPolicy,
    next_round_robin: usize,
    approximate_index: Vec<LruKeySet>,
    rng: SimRng,
    scores: Vec<f64>,
}

impl Router {
    /// A router over `instances` instances drawing randomness from `rng`.
    pub fn new(policy: RoutingPolicy, instances: usize, rng: SimRng) -> Self {
        let approximate_index = match prefix_mode(&policy) {
            Some(PrefixMode::Approximate {
                blocks_per_instance,
            }) => (0..instances)
                .map(|_| LruKeySet::new(blocks_per_instance))
                .collect(),
            _ => Vec::new(),
        };
        Self {
            policy,
            next_round_robin: 0,
            approximate_index,
            rng,
            scores: Vec::with_capacity(instances),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &RoutingPolicy {
        &self.policy
    }

    /// How the policy tracks prefixes, if it scores them.
    pub fn prefix_mode(&self) -> Option<PrefixMode> {
        prefix_mode(&self.policy)
    }

    /// Leading `keys` the approximate index believes `instance` holds.
    pub fn approximate_match(&self, instance: usize, keys: &[u64]) -> usize {
        match self.approximate_index.get(instance) {
            Some(index) => keys.iter().take_while(|key| index.contains(**key)).count(),
            None => 0,
        }
    }

    /// Leading blocks of a prompt the approximate index believes `instance` holds: the same
    /// as [`Router::approximate_match`] over every key, the private ones matched by seed and
    /// index without hashing them.
    pub fn approximate_match_prompt(&self, instance: usize, keys: &PromptKeys) -> usize {
        let Some(index) = self.approximate_index.get(instance) else {
            return 0;
        };
        let shareable = keys.shareable();
        let matched = shareable
            .iter()
            .take_while(|key| index.contains(**key))
            .count();
        if matched < shareable.len() {
            return matched;
        }
        let seed = keys.seed();
        matched
            + keys
                .private_range()
                .take_while(|&i| index.contains_private(seed, i))
                .count()
    }

    /// Remembers that a prompt's blocks were sent to `instance`: the same as
    /// [`Router::record_dispatch`] over every key, the private ones stored as one run.
    pub fn record_dispatch_prompt(&mut self, instance: usize, keys: &PromptKeys) {
        if let Some(index) = self.approximate_index.get_mut(instance) {
            for &key in keys.shareable() {
                index.insert(key);
            }
            index.insert_private_run(keys.seed(), keys.private_range());
        }
    }

    /// Remembers that `keys` were sent to `instance` (approximate prefix tracking).
    pub fn record_dispatch(&mut self, instance: usize, keys: &[u64]) {
        if let Some(index) = self.approximate_index.get_mut(instance) {
            for &key in keys {
                index.insert(key);
            }
        }
    }

    /// Forgets every key sent to `instance` (its pod was replaced: llm-d's EPP drops a
    /// deleted pod's entries, and a new pod starts with an empty cache).
    pub fn forget(&mut self, instance: usize) {
        if let Some(index) = self.approximate_index.get_mut(instance) {
            index.clear();
        }
    }

    /// Picks an instance index (there is at least one instance).
    pub fn pick(&mut self, context: &RoutingContext<'_>) -> usize {
        let count = context.views.len();
        debug_assert!(count > 0, "routing over no instances");
        debug_assert_eq!(
            context.in_flight.len(),
            count,
            "in-flight counts per instance"
        );
        match &self.policy {
            RoutingPolicy::RoundRobin => {
                let pick = self.next_round_robin % count;
                self.next_round_robin = (pick + 1) % count;
                pick
            }
            RoutingPolicy::Random => below(&mut self.rng, count),
            RoutingPolicy::VllmDataParallel => {
                let score = |i: usize| {
                    let view = &context.views[i];
                    4 * (view.queue_depth + context.sent_since_refresh[i]) + view.running
                };
                // The first minimum: ties go to the lowest index, as vLLM's loop does.
                (0..count).min_by_key(|&i| score(i)).unwrap_or(0)
            }
            RoutingPolicy::LeastLoaded => {
                self.scores.clear();
                self.scores.extend((0..count).map(|i| {
                    let view = &context.views[i];
                    -((view.queue_depth + view.running + context.in_flight[i]) as f64)
                }));
                pick_max(&self.scores, &mut self.rng)
            }
            RoutingPolicy::Weighted { scorers, picker } => {
                let total_weight: f64 = scorers.iter().map(|s| s.weight).sum();
                self.scores.clear();
                self.scores.resize(count, 0.0);
                for weighted in scorers {
                    for (instance, score) in self.scores.iter_mut().enumerate() {
                        let raw = score_of(weighted.scorer, instance, context).clamp(0.0, 1.0);
                        *score += weighted.weight * raw / total_weight;
                    }
                }
                match picker {
                    Picker::MaxScore => pick_max(&self.scores, &mut self.rng),
                    Picker::WeightedRandom => pick_weighted(&self.scores, &mut self.rng),
                }
            }
        }
    }
}

fn prefix_mode(policy: &RoutingPolicy) -> Option<PrefixMode> {
    match policy {
        RoutingPolicy::Weighted { scorers, .. } => scorers.iter().find_map(|s| match s.scorer {
            Scorer::PrefixCache(mode) => Some(mode),
            _ => None,
        }),
        _ => None,
    }
}

/// One scorer's value for one instance, by llm-d's formulas.
fn score_of(scorer: Scorer, instance: usize, context: &RoutingContext<'_>) -> f64 {
    let views = context.views;
    match scorer {
        Scorer::QueueDepth => min_max_inverted(
            views.iter().map(|v| v.queue_depth),
            views[instance].queue_depth,
        ),
        Scorer::RunningRequests => {
            min_max_inverted(views.iter().map(|v| v.running), views[instance].running)
        }
        Scorer::KvCacheUtilization => 1.0 - views[instance].kv_usage,
        Scorer::LoadAware { threshold } => {
            let queue = views[instance].queue_depth.min(u64::from(threshold));
            0.5 * (1.0 - queue as f64 / f64::from(threshold))
        }
        Scorer::ActiveRequests => {
            let max = context.in_flight.iter().copied().max().unwrap_or(0);
            if max == 0 {
                1.0
            } else {
                (max - context.in_flight[instance]) as f64 / max as f64
            }
        }
        Scorer::PrefixCache(_) => context.prefix_fraction[instance],
    }
}

/// `(max − x) / (max − min)`; 1 when all are equal.
fn min_max_inverted(values: impl Iterator<Item = u64> + Clone, value: u64) -> f64 {
    let max = values.clone().max().unwrap_or(0);
    let min = values.min().unwrap_or(0);
    if max == min {
        1.0
    } else {
        (max - value) as f64 / (max - min) as f64
    }
}

/// Uniform index below `n` (n > 0), without modulo bias.
fn below(rng: &mut SimRng, n: usize) -> usize {
    let n = n as u64;
    let zone = u64::MAX - (u64::MAX % n);
    loop {
        let draw = rng.next_u64();
        if draw < zone {
            return (draw % n) as usize;
        }
    }
}

/// Index of the highest score; exact ties are broken uniformly at random (one draw only
/// when there is a tie).
fn pick_max(scores: &[f64], rng: &mut SimRng) -> usize {
    let best = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let tied = scores.iter().filter(|&&s| s == best).count();
    let nth = if tied > 1 { below(rng, tied) } else { 0 };
    scores
        .iter()
        .enumerate()
        .filter(|&(_, &s)| s == best)
        .nth(nth)
        .map_or(0, |(index, _)| index)
}

/// Index drawn with probability proportional to score (uniform if every score is 0).
fn pick_weighted(scores: &[f64], rng: &mut SimRng) -> usize {
    let total: f64 = scores.iter().sum();
    if total <= 0.0 {
        return below(rng, scores.len());
    }
    let unit = crate::sim::rng::unit(rng);
    let mut target = unit * total;
    for (index, &score) in scores.iter().enumerate() {
        if target < score {
            return index;
        }
        target -= score;
    }
    scores.iter().rposition(|&s| s > 0.0).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::rng::RngStreams;

    fn views(queues: &[u64]) -> Vec<SignalView> {
        queues
            .iter()
            .map(|&queue_depth| SignalView {
                queue_depth,
                ..SignalView::default()
            })
            .collect()
    }

    #[test]
    fn queue_scorer_is_min_max_inverted() {
        let v = views(&[2, 6, 10]);
        let context = RoutingContext {
            views: &v,
            in_flight: &[0, 0, 0],
            sent_since_refresh: &[0, 0, 0],
            prefix_fraction: &[0.0, 0.0, 0.0],
        };
        assert_eq!(score_of(Scorer::QueueDepth, 0, &context), 1.0);
        assert_eq!(score_of(Scorer::QueueDepth, 1, &context), 0.5);
        assert_eq!(score_of(Scorer::QueueDepth, 2, &context), 0.0);
        assert_eq!(
            score_of(Scorer::LoadAware { threshold: 128 }, 1, &context),
            0.5 * (1.0 - 6.0 / 128.0)
        );
    }

    #[test]
    fn vllm_data_parallel_counts_waiting_four_times_and_ties_to_the_first() {
        // vLLM's DPLBAsyncMPClient: score = 4 · waiting + running, +4 per request sent since
        // the last report, the first minimum wins.
        let rng = RngStreams::new(1).stream("router");
        let mut router = Router::new(RoutingPolicy::VllmDataParallel, 3, rng);
        let mut pick = |queues: [u64; 3], running: [u64; 3], sent: [u64; 3]| {
            let v: Vec<SignalView> = (0..3)
                .map(|i| SignalView {
                    queue_depth: queues[i],
                    running: running[i],
                    ..SignalView::default()
                })
                .collect();
            router.pick(&RoutingContext {
                views: &v,
                // Ignored by this policy (least-loaded would pick instance 0 here).
                in_flight: &[0, 9, 9],
                sent_since_refresh: &sent,
                prefix_fraction: &[0.0; 3],
            })
        };
        assert_eq!(
            pick([0, 0, 0], [0, 0, 0], [0, 0, 0]),
            0,
            "ties to the first"
        );
        assert_eq!(pick([0, 0, 0], [5, 3, 4], [0, 0, 0]), 1);
        // One waiting outweighs three running: 4 vs 3.
        assert_eq!(pick([1, 0, 0], [0, 3, 5], [0, 0, 0]), 1);
        // A request sent since the report counts as waiting: 0+4 vs 3 vs 5.
        assert_eq!(pick([0, 0, 0], [0, 3, 5], [1, 0, 0]), 1);
        assert_eq!(pick([0, 0, 0], [0, 3, 5], [2, 1, 0]), 2); // 8, 7, 5
    }

    #[test]
    fn max_score_ties_are_random_but_seeded() {
        let scores = [0.5, 0.9, 0.9, 0.1];
        let mut rng = RngStreams::new(1).stream("router");
        let picks: Vec<usize> = (0..50).map(|_| pick_max(&scores, &mut rng)).collect();
        assert!(picks.iter().all(|&p| p == 1 || p == 2));
        assert!(picks.contains(&1) && picks.contains(&2));
        let mut again = RngStreams::new(1).stream("router");
        let repeat: Vec<usize> = (0..50).map(|_| pick_max(&scores, &mut again)).collect();
        assert_eq!(picks, repeat);
    }

    #[test]
    fn weighted_random_follows_scores() {
        let scores = [0.0, 3.0, 1.0];
        let mut rng = RngStreams::new(9).stream("router");
        let mut counts = [0u32; 3];
        for _ in 0..4000 {
            counts[pick_weighted(&scores, &mut rng)] += 1;
        }
        assert_eq!(counts[0], 0);
        assert!(
            (counts[1] as f64 / 4000.0 - 0.75).abs() < 0.03,
            "{counts:?}"
        );
    }
}
