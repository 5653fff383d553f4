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
pub mod pd;
mod prediction;
pub mod question;
pub mod state;

use crate::twin::TwinError;
use crate::twin::question::StalePolicy;
use crate::workload::LengthDist;

use super::proto;

/// Largest token count accepted anywhere (a sequence longer than this is absurd).
pub const TOKENS_MAX: u32 = 16 * 1024 * 1024;

/// Longest id or label accepted (instance ids, addresses, request ids), bytes: ids end up
/// in snapshots, metrics labels and error messages, so they are bounded at the boundary.
pub const ID_BYTES_MAX: usize = 256;

/// Checks an id or label: at most [`ID_BYTES_MAX`] bytes of printable ASCII without spaces
/// (letters, digits and punctuation such as `ns/vllm-0:8000` or `cmpl-1f2e-0`); empty is
/// left to the caller (optional fields). The message does not echo the value.
pub(crate) fn id(value: &str, path: &str) -> Result<(), TwinError> {
    if value.len() > ID_BYTES_MAX {
        return Err(TwinError::invalid(
            path,
            format!("{} bytes is too long (at most {ID_BYTES_MAX})", value.len()),
        ));
    }
    if let Some(position) = value.bytes().position(|b| !b.is_ascii_graphic()) {
        return Err(TwinError::invalid(
            path,
            format!(
                "byte {position} is not printable ASCII (ids are letters, digits and punctuation, \
                 no spaces)"
            ),
        ));
    }
    Ok(())
}

pub(crate) use crate::twin::error::short_num as num;

/// Largest log-normal sigma accepted (the spread of the underlying normal, in nats).
pub const LOGNORMAL_SIGMA_MAX: f64 = 8.0;

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
            format!("{} must be a finite number >= 0", num(value)),
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
            format!("{} must be a finite number > 0", num(value)),
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
            format!("{} ms is absurdly long", num(ms)),
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
    // Continuous draws are clamped to TOKENS_MAX when no lower max is given, and their
    // parameters must put the bulk of the mass below it: a request of billions of tokens
    // would make one simulation step allocate gigabytes.
    let bounded = |value: f64, low: f64, high: f64, field: &str| -> Result<f64, TwinError> {
        if value.is_finite() && (low..=high).contains(&value) {
            Ok(value)
        } else {
            Err(TwinError::invalid(
                join(path, field),
                format!("{} must be in [{}, {}]", num(value), num(low), num(high)),
            ))
        }
    };
    let tokens_max = f64::from(TOKENS_MAX);
    let dist = match dist {
        Dist::Constant(value) => LengthDist::constant(tokens(*value, &join(path, "constant"))?),
        Dist::Uniform(uniform) => LengthDist::uniform(
            tokens(uniform.min, &join(path, "uniform.min"))?,
            tokens(uniform.max, &join(path, "uniform.max"))?,
        ),
        Dist::Gaussian(gaussian) => LengthDist::Gaussian {
            mean: bounded(gaussian.mean, -tokens_max, tokens_max, "gaussian.mean")?,
            stdev: bounded(gaussian.stdev, 0.0, tokens_max, "gaussian.stdev")?,
            min: clamp(gaussian.min, "gaussian.min")?,
            max: clamp(gaussian.max, "gaussian.max")?.or(Some(TOKENS_MAX)),
        },
        Dist::ExponentialMean(mean) => LengthDist::Exponential {
            mean: bounded(*mean, 1e-3, tokens_max, "exponential_mean")?,
            min: None,
            max: Some(TOKENS_MAX),
        },
        Dist::Lognormal(lognormal) => LengthDist::Lognormal {
            mu: Some(bounded(
                lognormal.mu,
                -tokens_max.ln(),
                tokens_max.ln(),
                "lognormal.mu",
            )?),
            sigma: Some(bounded(
                lognormal.sigma,
                0.0,
                LOGNORMAL_SIGMA_MAX,
                "lognormal.sigma",
            )?),
            mean: None,
            stdev: None,
            min: None,
            max: Some(TOKENS_MAX),
        },
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
    fn ids_are_bounded_printable_ascii() {
        assert!(id("ns/vllm-0:8000", "x").is_ok());
        assert!(id("cmpl-1f2e_3.4@5+6=7", "x").is_ok());
        assert!(id(&"a".repeat(ID_BYTES_MAX), "x").is_ok());
        let err = id(&"a".repeat(ID_BYTES_MAX + 1), "instances[0].id").unwrap_err();
        assert!(
            err.to_string().starts_with("instances[0].id: 257 bytes"),
            "{err}"
        );
        for bad in ["a b", "a\nb", "é", "a\0"] {
            let err = id(bad, "request_id").unwrap_err().to_string();
            assert!(err.starts_with("request_id: byte "), "{err}");
        }
    }

    #[test]
    fn numbers_in_messages_stay_short() {
        assert_eq!(num(1.5), "1.5");
        assert_eq!(num(1e300), "1e300");
        assert_eq!(num(-1e-300), "-1e-300");
        assert_eq!(num(0.0), "0");
        let err = ms_to_us(1e300, "options.horizon_ms")
            .unwrap_err()
            .to_string();
        assert!(err.len() < 80, "{err}");
        let err = positive(-1e300, "stages[0].duration_s")
            .unwrap_err()
            .to_string();
        assert!(err.len() < 80, "{err}");
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
        let wire = |dist| proto::LengthDistribution { dist: Some(dist) };
        use proto::length_distribution::Dist;
        let huge = [
            (
                Dist::Lognormal(proto::LognormalLength {
                    mu: 1e6,
                    sigma: 1.0,
                }),
                "input_tokens.lognormal.mu",
            ),
            (
                Dist::Lognormal(proto::LognormalLength {
                    mu: 5.0,
                    sigma: 1e6,
                }),
                "input_tokens.lognormal.sigma",
            ),
            (Dist::ExponentialMean(1e9), "input_tokens.exponential_mean"),
            (
                Dist::Gaussian(proto::GaussianLength {
                    mean: 1e12,
                    ..Default::default()
                }),
                "input_tokens.gaussian.mean",
            ),
        ];
        for (dist, field) in huge {
            let err = length_dist_from(Some(&wire(dist)), "input_tokens").unwrap_err();
            let text = err.to_string();
            assert!(text.starts_with(&format!("{field}: ")), "{text}");
            assert!(text.len() < 100, "{text}");
        }
        let err = length_dist_from(None, "twin.output_tokens").unwrap_err();
        assert_eq!(err.to_string(), "twin.output_tokens: required");
    }
}
