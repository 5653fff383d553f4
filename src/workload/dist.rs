//! Token-length distributions: what a spec says (`LengthDist`) and how it is sampled.
//!
//! A [`LengthDist`] is the YAML-facing description of a prompt or output length. It is
//! validated once ([`LengthDist::validate`]) and then compiled into a [`LengthSampler`]
//! that draws from a caller-supplied seeded stream. Every sample is an integer of at least
//! one token: continuous draws are clamped to `[min, max]` and rounded, the rule BLIS uses
//! (`round(clamp(x, min, max))`, minimum 1).
//!
//! Knows nothing about clients, arrivals or requests; it only turns random numbers into
//! lengths.

use rand_distr::{Distribution, Exp1, LogNormal, Normal, StandardUniform, Uniform};
use serde::Deserialize;

use crate::sim::rng::SimRng;
use crate::workload::error::WorkloadError;

/// Most distinct values an `empirical` distribution may list (a bound, not a tuning knob).
pub const EMPIRICAL_VALUES_MAX: usize = 1_000_000;

/// A distribution of token lengths, as written in a workload spec (`type:` selects it).
///
/// Every sample is at least 1. Bounds `min`/`max` are inclusive token counts; `min`
/// defaults to 1 and `max` to unbounded (`u32::MAX`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum LengthDist {
    /// Always `value` tokens.
    Constant {
        /// The length (at least 1).
        value: u32,
    },
    /// Uniform over the integers `min..=max`.
    Uniform {
        /// Smallest length (at least 1).
        min: u32,
        /// Largest length (at least `min`).
        max: u32,
    },
    /// Normal with the given mean and standard deviation, clamped to `[min, max]`, rounded.
    Gaussian {
        /// Mean in tokens (finite).
        mean: f64,
        /// Standard deviation in tokens (finite, at least 0).
        stdev: f64,
        /// Lower clamp (default 1).
        #[serde(default)]
        min: Option<u32>,
        /// Upper clamp (default unbounded).
        #[serde(default)]
        max: Option<u32>,
    },
    /// Exponential with the given mean, clamped to `[min, max]`, rounded.
    Exponential {
        /// Mean in tokens (finite, above 0).
        mean: f64,
        /// Lower clamp (default 1).
        #[serde(default)]
        min: Option<u32>,
        /// Upper clamp (default unbounded).
        #[serde(default)]
        max: Option<u32>,
    },
    /// Log-normal, given either as the underlying normal's `mu`/`sigma` or as the
    /// distribution's own `mean`/`stdev` (exactly one pair); clamped and rounded.
    Lognormal {
        /// Mean of the underlying normal (natural log of tokens).
        #[serde(default)]
        mu: Option<f64>,
        /// Standard deviation of the underlying normal (at least 0).
        #[serde(default)]
        sigma: Option<f64>,
        /// Mean of the lengths themselves (above 0).
        #[serde(default)]
        mean: Option<f64>,
        /// Standard deviation of the lengths themselves (at least 0).
        #[serde(default)]
        stdev: Option<f64>,
        /// Lower clamp (default 1).
        #[serde(default)]
        min: Option<u32>,
        /// Upper clamp (default unbounded).
        #[serde(default)]
        max: Option<u32>,
    },
    /// One of `values`, chosen with probability proportional to `weights` (default equal).
    Empirical {
        /// The possible lengths (each at least 1, at most [`EMPIRICAL_VALUES_MAX`] of them).
        values: Vec<u32>,
        /// Relative weights, one per value (finite, at least 0, positive sum).
        #[serde(default)]
        weights: Option<Vec<f64>>,
    },
}

impl LengthDist {
    /// Always `value` tokens.
    pub fn constant(value: u32) -> Self {
        LengthDist::Constant { value }
    }

    /// Uniform over `min..=max`.
    pub fn uniform(min: u32, max: u32) -> Self {
        LengthDist::Uniform { min, max }
    }

    /// Normal(`mean`, `stdev`) clamped to `[min, max]` and rounded (the BLIS rule).
    pub fn gaussian(mean: f64, stdev: f64, min: u32, max: u32) -> Self {
        LengthDist::Gaussian {
            mean,
            stdev,
            min: Some(min),
            max: Some(max),
        }
    }

    /// Exponential with mean `mean`, at least 1, unbounded above.
    pub fn exponential(mean: f64) -> Self {
        LengthDist::Exponential {
            mean,
            min: None,
            max: None,
        }
    }

    /// Log-normal from the underlying normal's `mu` and `sigma`, at least 1.
    pub fn lognormal(mu: f64, sigma: f64) -> Self {
        LengthDist::Lognormal {
            mu: Some(mu),
            sigma: Some(sigma),
            mean: None,
            stdev: None,
            min: None,
            max: None,
        }
    }

    /// One of `values` with probabilities proportional to `weights` (equal if `None`).
    pub fn empirical(values: Vec<u32>, weights: Option<Vec<f64>>) -> Self {
        LengthDist::Empirical { values, weights }
    }

    /// Checks every parameter; `path` is the field path used in error messages
    /// (e.g. `clients[1].input_tokens`).
    pub fn validate(&self, path: &str) -> Result<(), WorkloadError> {
        match self {
            LengthDist::Constant { value } => check_length(&format!("{path}.value"), *value),
            LengthDist::Uniform { min, max } => check_bounds(path, Some(*min), Some(*max)),
            LengthDist::Gaussian {
                mean,
                stdev,
                min,
                max,
            } => {
                check_finite(&format!("{path}.mean"), *mean)?;
                check_non_negative(&format!("{path}.stdev"), *stdev)?;
                check_bounds(path, *min, *max)
            }
            LengthDist::Exponential { mean, min, max } => {
                check_positive(&format!("{path}.mean"), *mean)?;
                check_bounds(path, *min, *max)
            }
            LengthDist::Lognormal { min, max, .. } => {
                self.lognormal_params(path)?;
                check_bounds(path, *min, *max)
            }
            LengthDist::Empirical { values, weights } => {
                check_empirical(path, values, weights.as_deref())
            }
        }
    }

    /// The underlying normal's `(mu, sigma)` of a log-normal, from whichever pair was given.
    fn lognormal_params(&self, path: &str) -> Result<(f64, f64), WorkloadError> {
        let LengthDist::Lognormal {
            mu,
            sigma,
            mean,
            stdev,
            ..
        } = self
        else {
            return Err(WorkloadError::invalid(path, "not a lognormal distribution"));
        };
        match (*mu, *sigma, *mean, *stdev) {
            (Some(mu), Some(sigma), None, None) => {
                check_finite(&format!("{path}.mu"), mu)?;
                check_non_negative(&format!("{path}.sigma"), sigma)?;
                Ok((mu, sigma))
            }
            (None, None, Some(mean), Some(stdev)) => {
                check_positive(&format!("{path}.mean"), mean)?;
                check_non_negative(&format!("{path}.stdev"), stdev)?;
                // Moment matching: E = exp(mu + sigma²/2), Var = (exp(sigma²) - 1) E².
                let sigma_sq = (1.0 + (stdev / mean).powi(2)).ln();
                Ok((mean.ln() - sigma_sq / 2.0, sigma_sq.sqrt()))
            }
            _ => Err(WorkloadError::invalid(
                path,
                "give exactly one pair: `mu` and `sigma`, or `mean` and `stdev`",
            )),
        }
    }

    /// Validates and compiles the distribution into a sampler.
    pub(crate) fn sampler(&self, path: &str) -> Result<LengthSampler, WorkloadError> {
        self.validate(path)?;
        let sampler = match self {
            LengthDist::Constant { value } => LengthSampler::Constant(*value),
            LengthDist::Uniform { min, max } => LengthSampler::Uniform(
                Uniform::new_inclusive(*min, *max)
                    .map_err(|err| WorkloadError::invalid(path, err.to_string()))?,
            ),
            LengthDist::Gaussian {
                mean,
                stdev,
                min,
                max,
            } => {
                let normal = Normal::new(*mean, *stdev)
                    .map_err(|err| WorkloadError::invalid(path, err.to_string()))?;
                LengthSampler::clamped(Continuous::Normal(normal), *min, *max)
            }
            LengthDist::Exponential { mean, min, max } => {
                LengthSampler::clamped(Continuous::Exponential { mean: *mean }, *min, *max)
            }
            LengthDist::Lognormal { min, max, .. } => {
                let (mu, sigma) = self.lognormal_params(path)?;
                let lognormal = LogNormal::new(mu, sigma)
                    .map_err(|err| WorkloadError::invalid(path, err.to_string()))?;
                LengthSampler::clamped(Continuous::LogNormal(lognormal), *min, *max)
            }
            LengthDist::Empirical { values, weights } => {
                LengthSampler::empirical(values, weights.as_deref())
            }
        };
        Ok(sampler)
    }
}

/// A compiled length distribution, ready to draw from (for callers outside the workload
/// generator, e.g. the twin sampling output lengths).
#[derive(Clone, Debug)]
pub struct LengthDraw(LengthSampler);

impl LengthDraw {
    /// Draws one length (at least 1) from `rng`.
    pub fn sample(&self, rng: &mut SimRng) -> u32 {
        self.0.sample(rng)
    }
}

impl LengthDist {
    /// Validates the distribution and compiles it for drawing; `path` names it in errors.
    pub fn compile(&self, path: &str) -> Result<LengthDraw, WorkloadError> {
        Ok(LengthDraw(self.sampler(path)?))
    }
}

/// A validated, ready-to-draw length distribution.
#[derive(Clone, Debug)]
pub(crate) enum LengthSampler {
    Constant(u32),
    Uniform(Uniform<u32>),
    Clamped {
        continuous: Continuous,
        min: f64,
        max: f64,
    },
    Empirical {
        values: Vec<u32>,
        /// Running sums of the weights; the last entry is the total (above 0).
        cumulative: Vec<f64>,
    },
}

/// The real-valued distribution under a clamped length.
#[derive(Clone, Debug)]
pub(crate) enum Continuous {
    Normal(Normal<f64>),
    Exponential { mean: f64 },
    LogNormal(LogNormal<f64>),
}

impl LengthSampler {
    fn clamped(continuous: Continuous, min: Option<u32>, max: Option<u32>) -> Self {
        LengthSampler::Clamped {
            continuous,
            min: f64::from(min.unwrap_or(1).max(1)),
            max: f64::from(max.unwrap_or(u32::MAX)),
        }
    }

    fn empirical(values: &[u32], weights: Option<&[f64]>) -> Self {
        let mut total = 0.0;
        let cumulative = (0..values.len())
            .map(|index| {
                total += weights.map_or(1.0, |weights| weights[index]);
                total
            })
            .collect();
        LengthSampler::Empirical {
            values: values.to_vec(),
            cumulative,
        }
    }

    /// Draws one length (at least 1) from `rng`.
    pub(crate) fn sample(&self, rng: &mut SimRng) -> u32 {
        let length = match self {
            LengthSampler::Constant(value) => *value,
            LengthSampler::Uniform(uniform) => uniform.sample(rng),
            LengthSampler::Clamped {
                continuous,
                min,
                max,
            } => {
                let raw = match continuous {
                    Continuous::Normal(normal) => normal.sample(rng),
                    Continuous::Exponential { mean } => {
                        let unit: f64 = Exp1.sample(rng);
                        unit * mean
                    }
                    Continuous::LogNormal(lognormal) => lognormal.sample(rng),
                };
                // `max`/`min` rather than `clamp`: a NaN draw lands on `min` instead of
                // panicking. The `as` cast saturates and the value is within u32 anyway.
                raw.max(*min).min(*max).round() as u32
            }
            LengthSampler::Empirical { values, cumulative } => {
                let total = cumulative.last().copied().unwrap_or(1.0);
                let unit: f64 = StandardUniform.sample(rng);
                let target = unit * total;
                let index = cumulative.partition_point(|&sum| sum <= target);
                values[index.min(values.len() - 1)]
            }
        };
        length.max(1)
    }
}

fn check_length(path: &str, value: u32) -> Result<(), WorkloadError> {
    if value == 0 {
        return Err(WorkloadError::invalid(
            path,
            "must be >= 1 (lengths are at least one token)",
        ));
    }
    Ok(())
}

fn check_bounds(path: &str, min: Option<u32>, max: Option<u32>) -> Result<(), WorkloadError> {
    if let Some(min) = min {
        check_length(&format!("{path}.min"), min)?;
    }
    if let Some(max) = max {
        check_length(&format!("{path}.max"), max)?;
    }
    if let (Some(min), Some(max)) = (min, max)
        && min > max
    {
        return Err(WorkloadError::invalid(
            format!("{path}.min"),
            format!("must be <= max ({min} > {max})"),
        ));
    }
    Ok(())
}

/// Rejects NaN and infinities.
pub(crate) fn check_finite(path: &str, value: f64) -> Result<(), WorkloadError> {
    if !value.is_finite() {
        return Err(WorkloadError::invalid(
            path,
            format!("must be a finite number (got {value})"),
        ));
    }
    Ok(())
}

/// Requires a finite value `>= 0`.
pub(crate) fn check_non_negative(path: &str, value: f64) -> Result<(), WorkloadError> {
    check_finite(path, value)?;
    if value < 0.0 {
        return Err(WorkloadError::invalid(
            path,
            format!("must be >= 0 (got {value})"),
        ));
    }
    Ok(())
}

/// Requires a finite value `> 0`.
pub(crate) fn check_positive(path: &str, value: f64) -> Result<(), WorkloadError> {
    check_finite(path, value)?;
    if value <= 0.0 {
        return Err(WorkloadError::invalid(
            path,
            format!("must be > 0 (got {value})"),
        ));
    }
    Ok(())
}

fn check_empirical(
    path: &str,
    values: &[u32],
    weights: Option<&[f64]>,
) -> Result<(), WorkloadError> {
    if values.is_empty() {
        return Err(WorkloadError::invalid(
            format!("{path}.values"),
            "must not be empty",
        ));
    }
    if values.len() > EMPIRICAL_VALUES_MAX {
        return Err(WorkloadError::invalid(
            format!("{path}.values"),
            format!("at most {EMPIRICAL_VALUES_MAX} values"),
        ));
    }
    for (index, value) in values.iter().enumerate() {
        check_length(&format!("{path}.values[{index}]"), *value)?;
    }
    let Some(weights) = weights else {
        return Ok(());
    };
    if weights.len() != values.len() {
        return Err(WorkloadError::invalid(
            format!("{path}.weights"),
            format!(
                "must have one weight per value ({} weights, {} values)",
                weights.len(),
                values.len()
            ),
        ));
    }
    for (index, weight) in weights.iter().enumerate() {
        check_non_negative(&format!("{path}.weights[{index}]"), *weight)?;
    }
    let total: f64 = weights.iter().sum();
    if !(total > 0.0 && total.is_finite()) {
        return Err(WorkloadError::invalid(
            format!("{path}.weights"),
            "must have a positive, finite sum",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::rng::RngStreams;

    fn draws(dist: &LengthDist, count: usize) -> Vec<u32> {
        let sampler = dist.sampler("test").unwrap();
        let mut rng = RngStreams::new(7).stream("test");
        (0..count).map(|_| sampler.sample(&mut rng)).collect()
    }

    #[test]
    fn gaussian_is_clamped_and_rounded() {
        // A wide normal must never escape its bounds.
        let values = draws(&LengthDist::gaussian(100.0, 400.0, 50, 150), 5_000);
        assert!(values.iter().all(|&v| (50..=150).contains(&v)));
        assert!(values.contains(&50));
        assert!(values.contains(&150));
    }

    #[test]
    fn zero_stdev_gaussian_is_its_rounded_mean() {
        let values = draws(&LengthDist::gaussian(99.6, 0.0, 1, 1000), 10);
        assert!(values.iter().all(|&v| v == 100));
    }

    #[test]
    fn lognormal_moment_form_matches_mean() {
        let dist = LengthDist::Lognormal {
            mu: None,
            sigma: None,
            mean: Some(500.0),
            stdev: Some(200.0),
            min: None,
            max: None,
        };
        let values = draws(&dist, 20_000);
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / 20_000.0;
        assert!((mean - 500.0).abs() < 10.0, "mean {mean}");
    }

    #[test]
    fn exponential_mean_and_floor() {
        let values = draws(&LengthDist::exponential(50.0), 20_000);
        assert!(values.iter().all(|&v| v >= 1));
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / 20_000.0;
        assert!((mean - 50.0).abs() < 2.0, "mean {mean}");
    }

    #[test]
    fn empirical_respects_weights() {
        let dist = LengthDist::empirical(vec![10, 20, 30], Some(vec![0.0, 1.0, 3.0]));
        let values = draws(&dist, 8_000);
        assert!(!values.contains(&10));
        let thirties = values.iter().filter(|&&v| v == 30).count();
        assert!((5_700..6_300).contains(&thirties), "{thirties}");
    }

    #[test]
    fn uniform_covers_its_range() {
        let values = draws(&LengthDist::uniform(3, 5), 1_000);
        assert!(values.iter().all(|&v| (3..=5).contains(&v)));
        assert!(values.contains(&3) && values.contains(&5));
    }

    #[test]
    fn bad_parameters_name_their_field() {
        let cases = [
            (LengthDist::gaussian(10.0, -1.0, 1, 5), "x.stdev"),
            (LengthDist::gaussian(f64::NAN, 1.0, 1, 5), "x.mean"),
            (LengthDist::gaussian(10.0, 1.0, 6, 5), "x.min"),
            (LengthDist::constant(0), "x.value"),
            (LengthDist::exponential(0.0), "x.mean"),
            (LengthDist::empirical(vec![], None), "x.values"),
            (LengthDist::empirical(vec![1, 0], None), "x.values[1]"),
            (
                LengthDist::empirical(vec![1], Some(vec![1.0, 2.0])),
                "x.weights",
            ),
            (
                LengthDist::empirical(vec![1, 2], Some(vec![0.0, 0.0])),
                "x.weights",
            ),
            (LengthDist::lognormal(1.0, -0.5), "x.sigma"),
        ];
        for (dist, path) in cases {
            match dist.validate("x") {
                Err(WorkloadError::Invalid { path: got, .. }) => assert_eq!(got, path),
                other => panic!("{dist:?}: expected error at {path}, got {other:?}"),
            }
        }
    }

    #[test]
    fn lognormal_needs_exactly_one_pair() {
        let dist = LengthDist::Lognormal {
            mu: Some(1.0),
            sigma: None,
            mean: Some(3.0),
            stdev: None,
            min: None,
            max: None,
        };
        assert!(
            matches!(dist.validate("x"), Err(WorkloadError::Invalid { path, .. }) if path == "x")
        );
    }
}
