//! Conversions between the gRPC messages (`server::proto`) and the domain types, by hand.
//!
//! Decoding validates everything that can be checked without the mirror (ranges, required
//! fields, enum values, limits) and names the offending field by its path in the request
//! message (`instances[2].engine.block_size`, `request.prompt_tokens`). Checks that need the
//! config in force (unknown instance ids, limits of an instance) live in `twin::store` and in
//! `service`, with the same paths. Encoding is total. Units change here and only here: µs
//! integers inside, ms doubles on the wire for durations.

pub mod config;
pub mod forecast;
pub mod question;
pub mod state;

use crate::twin::TwinError;
use crate::twin::question::StalePolicy;
use crate::workload::LengthDist;

use super::proto;

/// Largest token count accepted anywhere (a sequence longer than this is absurd).
pub const TOKENS_MAX: u32 = 16 * 1024 * 1024;

/// Joins a field path and a child name (`""` + `x` = `x`).
pub(crate) fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

/// A token count in `0..=TOKENS_MAX`.
pub(crate) fn tokens(value: i64, path: &str) -> Result<u32, TwinError> {
    if value < 0 {
        return Err(TwinError::invalid(
            path,
            format!("{value} must not be negative"),
        ));
    }
    if value > i64::from(TOKENS_MAX) {
        return Err(TwinError::invalid(
            path,
            format!("{value} is absurdly large (at most {TOKENS_MAX})"),
        ));
    }
    Ok(value as u32)
}

/// A count in `1..=max`.
pub(crate) fn count_in(value: i64, max: u32, path: &str) -> Result<u32, TwinError> {
    if value < 1 || value > i64::from(max) {
        return Err(TwinError::invalid(
            path,
            format!("{value} must be in 1..={max}"),
        ));
    }
    Ok(value as u32)
}

/// A timestamp on the client's clock, µs, not negative.
pub(crate) fn time_us(value: i64, path: &str) -> Result<u64, TwinError> {
    u64::try_from(value)
        .map_err(|_| TwinError::invalid(path, format!("{value} must not be negative")))
}

/// A finite number `>= 0`.
pub(crate) fn non_negative(value: f64, path: &str) -> Result<f64, TwinError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(TwinError::invalid(
            path,
            format!("{value} must be a finite number >= 0"),
        ))
    }
}

/// A finite number `> 0`.
pub(crate) fn positive(value: f64, path: &str) -> Result<f64, TwinError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(TwinError::invalid(
            path,
            format!("{value} must be a finite number > 0"),
        ))
    }
}

/// Milliseconds (finite, `>= 0`, at most a year) to whole microseconds.
pub(crate) fn ms_to_us(ms: f64, path: &str) -> Result<u64, TwinError> {
    const YEAR_MS: f64 = 365.0 * 24.0 * 3600.0 * 1000.0;
    let ms = non_negative(ms, path)?;
    if ms > YEAR_MS {
        return Err(TwinError::invalid(
            path,
            format!("{ms} ms is absurdly long"),
        ));
    }
    Ok((ms * 1000.0).round() as u64)
}

/// Microseconds to milliseconds.
pub(crate) fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// A stale policy from the wire; `UNSPECIFIED` is `None`.
pub(crate) fn stale_policy_from(value: i32, path: &str) -> Result<Option<StalePolicy>, TwinError> {
    match proto::StalePolicy::try_from(value) {
        Ok(proto::StalePolicy::Unspecified) => Ok(None),
        Ok(proto::StalePolicy::UseLast) => Ok(Some(StalePolicy::UseLast)),
        Ok(proto::StalePolicy::Exclude) => Ok(Some(StalePolicy::Exclude)),
        Ok(proto::StalePolicy::TreatSaturated) => Ok(Some(StalePolicy::TreatSaturated)),
        Ok(proto::StalePolicy::RollForward) => Ok(Some(StalePolicy::RollForward)),
        Err(_) => Err(TwinError::invalid(
            path,
            format!("unknown stale policy {value}"),
        )),
    }
}

/// A stale policy to the wire.
pub(crate) fn stale_policy_to(policy: Option<StalePolicy>) -> i32 {
    let value = match policy {
        None => proto::StalePolicy::Unspecified,
        Some(StalePolicy::UseLast) => proto::StalePolicy::UseLast,
        Some(StalePolicy::Exclude) => proto::StalePolicy::Exclude,
        Some(StalePolicy::TreatSaturated) => proto::StalePolicy::TreatSaturated,
        Some(StalePolicy::RollForward) => proto::StalePolicy::RollForward,
    };
    value as i32
}

/// A length distribution from the wire, validated (`path` names the field).
pub(crate) fn length_dist_from(
    message: Option<&proto::LengthDistribution>,
    path: &str,
) -> Result<LengthDist, TwinError> {
    use proto::length_distribution::Dist;
    let dist = message
        .and_then(|message| message.dist.as_ref())
        .ok_or_else(|| TwinError::invalid(path, "required"))?;
    let clamp = |value: i64, field: &str| -> Result<Option<u32>, TwinError> {
        let value = tokens(value, &join(path, field))?;
        Ok((value > 0).then_some(value))
    };
    let dist = match dist {
        Dist::Constant(value) => LengthDist::constant(tokens(*value, &join(path, "constant"))?),
        Dist::Uniform(uniform) => LengthDist::uniform(
            tokens(uniform.min, &join(path, "uniform.min"))?,
            tokens(uniform.max, &join(path, "uniform.max"))?,
        ),
        Dist::Gaussian(gaussian) => LengthDist::Gaussian {
            mean: gaussian.mean,
            stdev: gaussian.stdev,
            min: clamp(gaussian.min, "gaussian.min")?,
            max: clamp(gaussian.max, "gaussian.max")?,
        },
        Dist::ExponentialMean(mean) => LengthDist::exponential(*mean),
        Dist::Lognormal(lognormal) => LengthDist::lognormal(lognormal.mu, lognormal.sigma),
        Dist::Empirical(empirical) => {
            let values = empirical
                .values
                .iter()
                .enumerate()
                .map(|(index, value)| tokens(*value, &format!("{path}.empirical.values[{index}]")))
                .collect::<Result<Vec<_>, _>>()?;
            let weights = (!empirical.weights.is_empty()).then(|| empirical.weights.clone());
            LengthDist::empirical(values, weights)
        }
    };
    dist.validate(path)
        .map_err(|err| TwinError::invalid(path, err.to_string()))?;
    Ok(dist)
}

/// A length distribution to the wire.
pub(crate) fn length_dist_to(dist: &LengthDist) -> proto::LengthDistribution {
    use proto::length_distribution::Dist;
    let dist = match dist {
        LengthDist::Constant { value } => Dist::Constant(i64::from(*value)),
        LengthDist::Uniform { min, max } => Dist::Uniform(proto::UniformLength {
            min: i64::from(*min),
            max: i64::from(*max),
        }),
        LengthDist::Gaussian {
            mean,
            stdev,
            min,
            max,
        } => Dist::Gaussian(proto::GaussianLength {
            mean: *mean,
            stdev: *stdev,
            min: min.map_or(0, i64::from),
            max: max.map_or(0, i64::from),
        }),
        LengthDist::Exponential { mean, .. } => Dist::ExponentialMean(*mean),
        LengthDist::Lognormal { mu, sigma, .. } => Dist::Lognormal(proto::LognormalLength {
            mu: mu.unwrap_or(0.0),
            sigma: sigma.unwrap_or(0.0),
        }),
        LengthDist::Empirical { values, weights } => Dist::Empirical(proto::EmpiricalLength {
            values: values.iter().map(|v| i64::from(*v)).collect(),
            weights: weights.clone().unwrap_or_default(),
        }),
    };
    proto::LengthDistribution { dist: Some(dist) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_reject_negative_and_absurd_values() {
        assert_eq!(tokens(5, "x").unwrap(), 5);
        let err = tokens(-1, "request.prompt_tokens").unwrap_err();
        assert!(
            err.to_string().starts_with("request.prompt_tokens: "),
            "{err}"
        );
        assert!(tokens(i64::from(TOKENS_MAX) + 1, "x").is_err());
        assert!(count_in(0, 4, "x").is_err());
        assert!(time_us(-5, "x").is_err());
        assert_eq!(ms_to_us(1.5, "x").unwrap(), 1500);
        assert!(ms_to_us(f64::NAN, "x").is_err());
    }

    #[test]
    fn length_distributions_round_trip() {
        let dists = [
            LengthDist::constant(7),
            LengthDist::uniform(1, 9),
            LengthDist::gaussian(256.0, 128.0, 1, 4096),
            LengthDist::empirical(vec![1, 5], Some(vec![0.5, 0.5])),
        ];
        for dist in dists {
            let wire = length_dist_to(&dist);
            assert_eq!(length_dist_from(Some(&wire), "d").unwrap(), dist);
        }
        let err = length_dist_from(None, "twin.output_tokens").unwrap_err();
        assert_eq!(err.to_string(), "twin.output_tokens: required");
    }
}
