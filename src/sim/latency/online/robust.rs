//! The weight a sample gets in a phase's fit: 1 for a sample as far from the recent samples'
//! typical ratio as they usually are, less for a spike (a stall, a cold path) far beyond
//! that spread, so that its pull on the fit is bounded (Huber's).
//!
//! Why: the fit is least squares, a mean, while the error the predictor is judged by (and
//! the latency a router acts on) is typical, not average. With short prompts the simulated
//! latencies barely vary and a few measured spikes (a TTFT of 5 s among 65 ms ones) set the
//! scale. Weights taken against the fit itself lock a wrong early fit in (the samples that
//! would correct it are the ones discounted), so the reference here is a slower one that
//! the weights never touch: the median `c` of the last [`WINDOW`] ratios of measured to
//! simulated latency. A sample's relative residual against it is `e = ratio / c - 1`, its
//! distance `|e| / s` where `s` is the window's spread (the median of `|e|`, in standard
//! deviations of a normal); past [`HUBER_Z`] the weight is `HUBER_Z / distance`, so the
//! sample pulls the fit no more than one at that distance would. Where the simulated latency
//! tracks the measured one loosely (ratios spread wide, as under heavy load where the fit's
//! load term carries the answer) the spread is wide and nearly every weight is 1.

use std::collections::VecDeque;

/// Ratios kept for the reference (about a few minutes of a busy router's samples).
pub const WINDOW: usize = 256;
/// Ratios needed before any weight is below 1.
pub const MIN_RATIOS: usize = 32;
/// Distance (in robust standard deviations of the relative residual) past which the weight
/// falls.
pub const HUBER_Z: f64 = 1.0;
/// The smallest spread assumed, relative (5%): identical ratios must not make every small
/// deviation an outlier.
const MIN_SPREAD: f64 = 0.05;
/// The median absolute deviation of a normal distribution, in standard deviations.
const MAD_PER_SIGMA: f64 = 0.6745;

/// The recent ratios of measured to simulated latency.
#[derive(Clone, Debug, Default)]
pub struct RatioReference {
    ratios: VecDeque<f64>,
}

impl RatioReference {
    /// The weight of a sample of `measured_ms` for `simulated_ms` (both positive), against
    /// the ratios seen before it; then remembers its ratio.
    pub fn weigh(&mut self, simulated_ms: f64, measured_ms: f64) -> f64 {
        if !(simulated_ms > 0.0 && measured_ms > 0.0) {
            return 1.0;
        }
        let ratio = measured_ms / simulated_ms;
        if !ratio.is_finite() {
            return 1.0;
        }
        let weight = self.weight_of(ratio);
        if self.ratios.len() == WINDOW {
            self.ratios.pop_front();
        }
        self.ratios.push_back(ratio);
        weight
    }

    fn weight_of(&self, ratio: f64) -> f64 {
        if self.ratios.len() < MIN_RATIOS {
            return 1.0;
        }
        let mut sorted: Vec<f64> = self.ratios.iter().copied().collect();
        let centre = median(&mut sorted);
        if centre <= 0.0 {
            return 1.0;
        }
        let mut deviations: Vec<f64> = sorted.iter().map(|x| (x / centre - 1.0).abs()).collect();
        let spread = (median(&mut deviations) / MAD_PER_SIGMA).max(MIN_SPREAD);
        let distance = (ratio / centre - 1.0).abs() / spread;
        if distance <= HUBER_Z {
            1.0
        } else {
            HUBER_Z / distance
        }
    }
}

/// The median of `values` (sorted in place; 0 when empty).
fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spike far beyond the recent ratios' spread weighs little; a sample within it, 1.
    #[test]
    fn a_spike_beyond_the_spread_weighs_less_than_a_typical_sample() {
        let mut reference = RatioReference::default();
        for i in 0..100u32 {
            // Ratios between 1.1 and 1.3.
            let measured = 55.0 * (1.1 + 0.2 * f64::from(i % 5) / 4.0);
            let weight = reference.weigh(55.0, measured);
            if (i as usize) < MIN_RATIOS {
                assert_eq!(weight, 1.0, "before the reference has ratios enough");
            }
        }
        let typical = reference.weigh(55.0, 66.0);
        let spike = reference.weigh(55.0, 5_000.0);
        assert_eq!(typical, 1.0);
        assert!(spike < 0.1, "spike weight {spike}");
    }

    /// Ratios spread wide (a simulation that tracks loosely) leave a large deviation at
    /// full weight.
    #[test]
    fn a_wide_spread_keeps_large_deviations_at_full_weight() {
        let mut reference = RatioReference::default();
        for i in 0..100 {
            let ratio = [0.2, 1.0, 5.0][i % 3];
            reference.weigh(100.0, 100.0 * ratio);
        }
        // Twice the typical ratio: within the spread.
        assert_eq!(reference.weigh(100.0, 200.0), 1.0);
    }

    /// Until MIN_RATIOS ratios are held every weight is 1.
    #[test]
    fn a_young_reference_weighs_everything_fully() {
        let mut reference = RatioReference::default();
        for _ in 0..MIN_RATIOS {
            assert_eq!(reference.weigh(10.0, 10.0), 1.0);
        }
        assert!(reference.weigh(10.0, 1_000.0) < 1.0);
        let mut fresh = RatioReference::default();
        assert_eq!(fresh.weigh(10.0, 1_000.0), 1.0);
    }
}
