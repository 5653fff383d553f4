//! Mean and exact percentiles of one metric: from samples (sorted, or only the ranks read
//! selected) or from a value -> count map, interpolated at rank `p/100 * (n-1)` as BLIS and
//! numpy do.

use std::collections::HashMap;

/// The percentiles [`LatencyStats`] reports.
const PERCENTILES: [f64; 4] = [50.0, 90.0, 95.0, 99.0];

/// Mean and percentiles of one metric, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencyStats {
    /// Number of samples.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl LatencyStats {
    /// Stats of microsecond samples (sorted in place), reported in milliseconds.
    pub fn from_us(values: &mut [f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        // (Unstable is exact here: values equal under `total_cmp` are the same bits. Without
        // a sign bit set, `total_cmp` orders values as their bits do, a cheaper comparison.)
        if values.iter().all(|v| v.is_sign_positive()) {
            values.sort_unstable_by_key(|v| v.to_bits());
        } else {
            values.sort_unstable_by(f64::total_cmp);
        }
        let sum: f64 = values.iter().sum();
        Self::of(values.len() as u64, sum, |p| interpolate_sorted(values, p))
    }

    /// [`LatencyStats::from_us`] for whole, non-negative microsecond samples: only the ranks
    /// the percentiles read are selected, not the whole slice sorted, with the same result
    /// (while their total is below 2^53 every partial sum is exact, so the order of summing
    /// cannot matter; above it, the sorted path is taken). `values` ends partially ordered.
    pub fn from_whole_us(values: &mut [f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        debug_assert!(
            values.iter().all(|v| v.fract() == 0.0 && *v >= 0.0),
            "whole, non-negative microseconds"
        );
        // (`as u64` saturates: a value past it makes the total too large, so the check below
        // still falls back. It is much cheaper than converting to `u128`.)
        let total: u128 = values.iter().map(|&v| u128::from(v as u64)).sum();
        if total >= 1 << f64::MANTISSA_DIGITS || values.iter().any(|v| v.is_sign_negative()) {
            return Self::from_us(values);
        }
        let sum = total as f64;
        // Every rank a percentile interpolates between, ascending: each selection leaves the
        // larger values after its rank, so the next one searches only those.
        let last = (values.len() - 1) as f64;
        let mut ranks: Vec<usize> = PERCENTILES
            .iter()
            .flat_map(|p| {
                let rank = p / 100.0 * last;
                [rank.floor() as usize, rank.ceil() as usize]
            })
            .collect();
        ranks.dedup();
        let mut start = 0;
        for &rank in &ranks {
            if rank >= start {
                // (Non-negative values: their bits order them as `total_cmp` does.)
                values[start..].select_nth_unstable_by_key(rank - start, |v| v.to_bits());
                start = rank + 1;
            }
        }
        Self::of(values.len() as u64, sum, |p| interpolate_sorted(values, p))
    }

    /// Stats of a value -> count map of microsecond samples, reported in milliseconds.
    pub fn from_counts<S: std::hash::BuildHasher>(counts: &HashMap<u64, u64, S>) -> Self {
        let mut pairs: Vec<(u64, u64)> = counts.iter().map(|(&v, &c)| (v, c)).collect();
        pairs.sort_unstable();
        let total: u64 = pairs.iter().map(|&(_, c)| c).sum();
        if total == 0 {
            return Self::default();
        }
        let sum: f64 = pairs.iter().map(|&(v, c)| v as f64 * c as f64).sum();
        Self::of(total, sum, |p| interpolate_counts(&pairs, total, p))
    }

    /// The stats of `count` samples summing to `sum` µs whose percentile `p` (0..=100) is
    /// `percentile_us(p)`, in milliseconds.
    fn of(count: u64, sum: f64, percentile_us: impl Fn(f64) -> f64) -> Self {
        let [p50, p90, p95, p99] = PERCENTILES.map(|p| percentile_us(p) / 1000.0);
        Self {
            count,
            mean: sum / count as f64 / 1000.0,
            p50,
            p90,
            p95,
            p99,
        }
    }
}

/// Linear-interpolated percentile `p` (0..=100) of sorted, non-empty `values`.
pub fn interpolate_sorted(values: &[f64], p: f64) -> f64 {
    let rank = p / 100.0 * (values.len() - 1) as f64;
    let lower = rank.floor() as usize;
    let upper = rank.ceil() as usize;
    let fraction = rank - lower as f64;
    values[lower] + (values[upper] - values[lower]) * fraction
}

/// Linear-interpolated percentile `p` (0..=100) of the samples in a value -> count map
/// (0 when empty).
pub fn percentile_of_counts<S: std::hash::BuildHasher>(
    counts: &HashMap<u64, u64, S>,
    p: f64,
) -> f64 {
    let mut pairs: Vec<(u64, u64)> = counts.iter().map(|(&v, &c)| (v, c)).collect();
    pairs.sort_unstable();
    let total: u64 = pairs.iter().map(|&(_, c)| c).sum();
    if total == 0 {
        return 0.0;
    }
    interpolate_counts(&pairs, total, p)
}

/// The same percentile over sorted (value, count) pairs holding `total` samples.
fn interpolate_counts(pairs: &[(u64, u64)], total: u64, p: f64) -> f64 {
    let rank = p / 100.0 * (total - 1) as f64;
    let lower = rank.floor() as u64;
    let fraction = rank - lower as f64;
    let at = |index: u64| -> f64 {
        let mut seen = 0;
        for &(value, count) in pairs {
            seen += count;
            if index < seen {
                return value as f64;
            }
        }
        pairs.last().map_or(0.0, |&(value, _)| value as f64)
    };
    let low = at(lower);
    if fraction == 0.0 {
        return low;
    }
    low + (at(lower + 1) - low) * fraction
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let mut values = vec![4000.0, 1000.0, 3000.0, 2000.0];
        let stats = LatencyStats::from_us(&mut values);
        assert_eq!(stats.p50, 2.5);
        assert!((stats.p90 - 3.7).abs() < 1e-12);
        assert_eq!(stats.mean, 2.5);
    }

    /// `from_us` sorts non-negative values by their bits: the order, and so every stat
    /// (the mean is summed in sorted order), is `total_cmp`'s, with or without a sign.
    #[test]
    fn the_bit_order_sort_gives_total_cmps_stats() {
        let reference = |values: &[f64]| {
            let mut sorted = values.to_vec();
            sorted.sort_by(f64::total_cmp);
            let sum: f64 = sorted.iter().sum();
            let quantile = |p: f64| interpolate_sorted(&sorted, p) / 1000.0;
            LatencyStats {
                count: sorted.len() as u64,
                mean: sum / sorted.len() as f64 / 1000.0,
                p50: quantile(50.0),
                p90: quantile(90.0),
                p95: quantile(95.0),
                p99: quantile(99.0),
            }
        };
        let positive: Vec<f64> = (1..2_000u64)
            .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20) as f64 / 7.0)
            .collect();
        let mut signed = positive.clone();
        signed.extend([-3.5, -0.0, 0.0, 1e-300]);
        for values in [positive, signed] {
            let mut sorted = values.clone();
            assert_eq!(LatencyStats::from_us(&mut sorted), reference(&values));
        }
        // Whole values with a negative zero take the sorted path.
        let mut whole = vec![3.0, -0.0, 0.0, 2.0];
        assert_eq!(
            LatencyStats::from_whole_us(&mut whole),
            reference(&[3.0, -0.0, 0.0, 2.0])
        );
    }

    #[test]
    fn selected_ranks_give_the_sorted_stats() {
        // Sizes around the ranks' edges, repeated values, and a total past 2^53.
        for len in [1usize, 2, 3, 4, 5, 10, 11, 99, 100, 101, 1_000, 4_099] {
            let values: Vec<f64> = (0..len as u64)
                .map(|i| ((i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) % 5_000) as f64)
                .collect();
            let mut sorted = values.clone();
            let mut selected = values.clone();
            assert_eq!(
                LatencyStats::from_whole_us(&mut selected),
                LatencyStats::from_us(&mut sorted),
                "{len} values"
            );
        }
        let mut huge = vec![2f64.powi(52), 2f64.powi(52), 3.0, 1.0];
        let mut sorted = huge.clone();
        assert_eq!(
            LatencyStats::from_whole_us(&mut huge),
            LatencyStats::from_us(&mut sorted)
        );
    }

    #[test]
    fn count_map_percentiles_match_sorted_values() {
        let samples = [5u64, 5, 7, 9, 9, 9, 12, 40];
        let mut counts = HashMap::new();
        for &s in &samples {
            *counts.entry(s).or_insert(0) += 1;
        }
        let mut floats: Vec<f64> = samples.iter().map(|&v| v as f64).collect();
        let a = LatencyStats::from_counts(&counts);
        let b = LatencyStats::from_us(&mut floats);
        assert_eq!(a, b);
    }
}
