//! Online conformal quantiles of a calibrated latency: what to add to the calibrated centre
//! so that a predicted quantile covers the measured latencies as often as it says.
//!
//! Why: a predicted p90 is the 90th percentile over the simulation's replications, which
//! spread only as far as the simulation's own randomness (the lengths it draws). What the
//! simulation does not model (network, tokenizer, a noisy neighbour) widens the measured
//! spread, so the replications' p90 covered 58% of actual TTFTs in the peer suite's quantile
//! test (issue 36). Split conformal prediction fixes the level empirically: keep the signed
//! residuals `measured − calibrated centre` of recent samples, each taken before the sample
//! was absorbed (out of sample), and answer `centre + the residuals' q-quantile`.
//!
//! Adaptive conformal inference (Gibbs & Candès, 2021) then steers the level actually used
//! for the target quantile q: the miscoverage level α_t moves by γ(α − err_t) after each
//! sample (err_t = 1 when the measured latency was above the predicted quantile), so the
//! long-run miss rate converges to α = 1 − q whatever the data does, drift included.
//! Coverage over the recent window is reported so an operator can see it hold.
//!
//! Residuals are additive (ms), as the peer's own conformal layer uses them; a window of
//! them is the marginal distribution over the traffic seen, not one conditional on the
//! pod's state (the simulation's spread still tells candidates apart).
//!
//! Pure: no I/O, no clock.

use std::collections::VecDeque;

/// Residuals kept (the newest).
pub const WINDOW: usize = 2_000;
/// Residuals needed before quantiles are conformal (fewer: the simulation's spread).
pub const MIN_RESIDUALS: usize = 50;
/// ACI's step size γ: a miss raises the level by γ·q, a hit lowers it by γ·(1 − q).
pub const GAMMA: f64 = 0.005;

/// The residual window, its sorted copy, the adapted level for one target quantile, and the
/// recent coverage of that quantile.
#[derive(Clone, Debug, PartialEq)]
pub struct ConformalResiduals {
    /// Residuals in arrival order (the oldest leaves first).
    arrivals: VecDeque<f64>,
    /// The same residuals sorted ascending (quantiles in O(1)).
    sorted: Vec<f64>,
    /// The target quantile q.
    target: f64,
    /// The level used for the target, 1 − α_t, steered by ACI.
    level: f64,
    /// Whether each recent sample was at or under its predicted target quantile.
    covered: VecDeque<bool>,
}

impl ConformalResiduals {
    /// An empty window for target quantile `target` (clamped into (0, 1)).
    pub fn new(target: f64) -> Self {
        let target = if target.is_finite() {
            target.clamp(1e-3, 1.0 - 1e-3)
        } else {
            0.9
        };
        Self {
            arrivals: VecDeque::with_capacity(WINDOW),
            sorted: Vec::with_capacity(WINDOW),
            target,
            level: target,
            covered: VecDeque::with_capacity(WINDOW),
        }
    }

    /// The target quantile.
    pub fn target(&self) -> f64 {
        self.target
    }

    /// The level used for the target now (ACI's 1 − α_t).
    pub fn adapted_level(&self) -> f64 {
        self.level
    }

    /// Whether enough residuals are kept for conformal quantiles.
    pub fn ready(&self) -> bool {
        self.sorted.len() >= MIN_RESIDUALS
    }

    /// Residuals kept.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Whether no residual is kept.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// What to add to the calibrated centre for quantile `q`, ms (the target quantile uses
    /// the adapted level); `None` until [`ConformalResiduals::ready`].
    pub fn offset(&self, q: f64) -> Option<f64> {
        if !self.ready() {
            return None;
        }
        let level = if (q - self.target).abs() < 1e-9 {
            self.level
        } else {
            q
        };
        Some(self.empirical(level))
    }

    /// The finite-sample conformal quantile at `level`: the ⌈(n + 1)·level⌉-th smallest
    /// residual, clamped to the window.
    fn empirical(&self, level: f64) -> f64 {
        let n = self.sorted.len();
        let rank = ((n as f64 + 1.0) * level.clamp(0.0, 1.0)).ceil() as usize;
        self.sorted[rank.clamp(1, n) - 1]
    }

    /// Records one sample: `centre` is the calibrated prediction before the sample is
    /// absorbed, `measured` what was measured. Scores the target quantile predicted for it
    /// (coverage, ACI's step) when ready, then keeps the residual.
    pub fn observe(&mut self, centre: f64, measured: f64) {
        let residual = measured - centre;
        if !residual.is_finite() {
            return;
        }
        if let Some(offset) = self.offset(self.target) {
            let hit = measured <= centre + offset;
            if self.covered.len() == WINDOW {
                self.covered.pop_front();
            }
            self.covered.push_back(hit);
            let miss = if hit { 0.0 } else { 1.0 };
            // α_{t+1} = α_t + γ(α − err_t), and level = 1 − α.
            self.level = (self.level + GAMMA * (miss - (1.0 - self.target))).clamp(0.0, 1.0);
        }
        if self.arrivals.len() == WINDOW
            && let Some(oldest) = self.arrivals.pop_front()
        {
            let at = self.sorted.partition_point(|&v| v < oldest);
            self.sorted.remove(at);
        }
        self.arrivals.push_back(residual);
        let at = self.sorted.partition_point(|&v| v < residual);
        self.sorted.insert(at, residual);
    }

    /// Fraction of the recent samples at or under their predicted target quantile, `None`
    /// before the first scored sample.
    pub fn coverage(&self) -> Option<f64> {
        (!self.covered.is_empty()).then(|| {
            self.covered.iter().filter(|&&hit| hit).count() as f64 / self.covered.len() as f64
        })
    }

    /// Forgets every residual, the adapted level and the coverage.
    pub fn clear(&mut self) {
        *self = Self::new(self.target);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*, uniform in [0, 1).
    struct Uniform(u64);

    impl Uniform {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
        }

        /// A standard normal draw (Box-Muller).
        fn normal(&mut self) -> f64 {
            let u = self.next().max(1e-12);
            let v = self.next();
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        }
    }

    #[test]
    fn no_offset_until_enough_residuals() {
        let mut conformal = ConformalResiduals::new(0.9);
        for i in 0..MIN_RESIDUALS - 1 {
            conformal.observe(100.0, 100.0 + i as f64);
            assert_eq!(conformal.offset(0.9), None);
        }
        conformal.observe(100.0, 100.0);
        assert!(conformal.offset(0.9).is_some());
    }

    #[test]
    fn the_target_quantile_covers_normal_noise_as_it_says() {
        // Centre right, noise sd 30 ms: the 0.9 offset is ~1.28 sd, coverage ~0.9.
        let mut conformal = ConformalResiduals::new(0.9);
        let mut rng = Uniform(13);
        for _ in 0..20_000 {
            conformal.observe(600.0, 600.0 + 30.0 * rng.normal());
        }
        // The window's own 0.9 quantile is 1.28 sd; the adapted level wanders around it.
        let plain = conformal.empirical(0.9);
        assert!((plain - 38.4).abs() < 3.0, "{plain}");
        let offset = conformal.offset(0.9).expect("ready");
        assert!((offset - 38.4).abs() < 10.0, "{offset}");
        let coverage = conformal.coverage().expect("scored");
        assert!((coverage - 0.9).abs() < 0.02, "{coverage}");
        // Other quantiles read the window as it is.
        let median = conformal.offset(0.5).expect("ready");
        assert!(median.abs() < 4.0, "{median}");
    }

    #[test]
    fn the_adapted_level_recovers_coverage_after_the_noise_widens() {
        // ACI: the noise triples halfway; the window catches up in time, and the level
        // moves so that the miss rate over the second half stays near 10%.
        let mut conformal = ConformalResiduals::new(0.9);
        let mut rng = Uniform(5);
        for _ in 0..5_000 {
            conformal.observe(0.0, 10.0 * rng.normal());
        }
        let (mut hits, mut scored) = (0u32, 0u32);
        for _ in 0..5_000 {
            let measured = 30.0 * rng.normal();
            let predicted = conformal.offset(0.9).expect("ready");
            scored += 1;
            hits += u32::from(measured <= predicted);
            conformal.observe(0.0, measured);
        }
        let coverage = f64::from(hits) / f64::from(scored);
        assert!((coverage - 0.9).abs() < 0.03, "{coverage}");
    }

    #[test]
    fn the_sorted_copy_follows_the_window() {
        let mut conformal = ConformalResiduals::new(0.5);
        let mut rng = Uniform(3);
        for _ in 0..WINDOW + 500 {
            conformal.observe(0.0, rng.next());
        }
        let mut expected: Vec<f64> = conformal.arrivals.iter().copied().collect();
        expected.sort_by(f64::total_cmp);
        assert_eq!(conformal.sorted, expected);
        assert_eq!(conformal.len(), WINDOW);
    }
}
