//! Small statistics over replications: means, interpolated quantiles, confidence intervals.

use crate::sim::metrics::interpolate_sorted;

use super::error::TwinError;
use super::question::{Distribution, QuantileValue};

/// Checks requested quantiles: each in (0, 1), at most 32.
pub fn validate_quantiles(quantiles: &[f64], path: &str) -> Result<(), TwinError> {
    if quantiles.len() > 32 {
        return Err(TwinError::invalid(path, "at most 32 quantiles"));
    }
    for (index, &q) in quantiles.iter().enumerate() {
        if !(q > 0.0 && q < 1.0) {
            return Err(TwinError::invalid(
                format!("{path}[{index}]"),
                format!("must be in (0, 1), got {}", super::error::short_num(q)),
            ));
        }
    }
    Ok(())
}

/// Mean and quantiles (linear interpolation) of `values`.
pub fn distribution(values: &[f64], quantiles: &[f64]) -> Distribution {
    if values.is_empty() {
        return Distribution {
            mean: 0.0,
            quantiles: quantiles
                .iter()
                .map(|&quantile| QuantileValue {
                    quantile,
                    value: 0.0,
                })
                .collect(),
        };
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Distribution {
        mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        quantiles: quantiles
            .iter()
            .map(|&quantile| QuantileValue {
                quantile,
                value: interpolate_sorted(&sorted, quantile * 100.0),
            })
            .collect(),
    }
}

/// Mean and a 95 % normal-approximation confidence interval of `values`, clamped to [0, 1].
pub fn mean_with_ci(values: &[f64]) -> (f64, (f64, f64)) {
    if values.is_empty() {
        return (0.0, (0.0, 0.0));
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() == 1 {
        return (mean, (mean, mean));
    }
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let half = 1.96 * (variance / n).sqrt();
    (mean, ((mean - half).max(0.0), (mean + half).min(1.0)))
}
