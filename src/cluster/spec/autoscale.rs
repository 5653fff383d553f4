//! The cluster YAML's `autoscaler:` section (docs/autoscaling.md): bounds, warm-up, the
//! HPA's sync period, tolerance and behaviour, the objectives, and the policies to run.
//! Errors name the field path (`autoscaler.scale_up.policies[0].period_s: ...`).

use serde::Deserialize;

use super::{ClusterSpecError, invalid};
use crate::cluster::autoscale::{
    AutoscaleConfig, Objectives, Policy, RatePolicy, ScalingRules, SelectPolicy, WarmUp,
};

/// The section as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscalerSpec {
    /// Fewest replicas (default 1).
    #[serde(default)]
    pub min_replicas: Option<u32>,
    /// Most replicas (required).
    pub max_replicas: u32,
    /// Replicas ready at the start (default `min_replicas`).
    #[serde(default)]
    pub initial_replicas: Option<u32>,
    /// Shortest warm-up, s (default 100, llm-d's measured range).
    #[serde(default)]
    pub warm_up_min_s: Option<f64>,
    /// Longest warm-up, s (default 135).
    #[serde(default)]
    pub warm_up_max_s: Option<f64>,
    /// HPA sync period, s (default 15).
    #[serde(default)]
    pub sync_period_s: Option<f64>,
    /// HPA tolerance (default 0.1).
    #[serde(default)]
    pub tolerance: Option<f64>,
    /// TTFT objective, ms (required).
    pub ttft_ms: f64,
    /// TPOT objective, ms (required).
    pub tpot_ms: f64,
    /// Attainment a replica's calibrated capacity keeps (default 0.95).
    #[serde(default)]
    pub capacity_attainment: Option<f64>,
    /// Scale-up behaviour (default: the llm-d guide's).
    #[serde(default)]
    pub scale_up: Option<RulesSpec>,
    /// Scale-down behaviour (default: the llm-d guide's).
    #[serde(default)]
    pub scale_down: Option<RulesSpec>,
    /// Policies to run (default all five).
    #[serde(default)]
    pub policies: Option<Vec<PolicySpec>>,
}

/// One direction's behaviour.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesSpec {
    /// Stabilization window, s.
    #[serde(default)]
    pub stabilization_s: f64,
    /// `max` (default), `min` or `disabled`.
    #[serde(default)]
    pub select: Option<String>,
    /// Rate policies.
    #[serde(default)]
    pub policies: Vec<RateSpec>,
}

/// One rate policy.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateSpec {
    /// `pods` or `percent`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Pods or percent per period.
    pub value: f64,
    /// Period, s.
    pub period_s: f64,
}

/// One policy, by name with optional overrides of its defaults.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// static, slo-aware, queue-depth, saturation or predictive.
    pub name: String,
    /// static: replicas (default the maximum).
    #[serde(default)]
    pub replicas: Option<u32>,
    /// slo-aware: scale-up threshold.
    #[serde(default)]
    pub up: Option<f64>,
    /// slo-aware: scale-down threshold.
    #[serde(default)]
    pub down: Option<f64>,
    /// queue-depth: waiting requests per pod.
    #[serde(default)]
    pub target: Option<f64>,
    /// predictive: forecast horizon, s (at least the longest warm-up).
    #[serde(default)]
    pub horizon_s: Option<f64>,
    /// predictive: share of the calibrated capacity planned per replica.
    #[serde(default)]
    pub utilization: Option<f64>,
}

fn seconds(value: f64, field: &str) -> Result<u64, ClusterSpecError> {
    if value.is_finite() && (0.0..=86_400.0 * 365.0).contains(&value) {
        Ok((value * 1e6).round() as u64)
    } else {
        Err(invalid(
            field,
            "must be a number of seconds in [0, 31536000]",
        ))
    }
}

fn positive(value: f64, field: &str) -> Result<f64, ClusterSpecError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(invalid(field, "must be a positive number"))
    }
}

/// Resolves the section; `None` fields take their defaults.
pub fn resolve_autoscaler(spec: &AutoscalerSpec) -> Result<AutoscaleConfig, ClusterSpecError> {
    let p = "autoscaler";
    let min = spec.min_replicas.unwrap_or(1);
    let max = spec.max_replicas;
    if min == 0 {
        return Err(invalid(format!("{p}.min_replicas"), "must be at least 1"));
    }
    if max < min || max > 1024 {
        return Err(invalid(
            format!("{p}.max_replicas"),
            format!("must be in {min}..=1024 (at least min_replicas)"),
        ));
    }
    let objectives = Objectives {
        ttft_us: positive(spec.ttft_ms, &format!("{p}.ttft_ms"))? * 1e3,
        tpot_us: positive(spec.tpot_ms, &format!("{p}.tpot_ms"))? * 1e3,
    };
    let mut config = AutoscaleConfig::with_defaults(min, max, objectives);
    if let Some(initial) = spec.initial_replicas {
        if !(min..=max).contains(&initial) {
            return Err(invalid(
                format!("{p}.initial_replicas"),
                format!("must be in {min}..={max}"),
            ));
        }
        config.initial_replicas = initial;
    }
    let warm_min = seconds(
        spec.warm_up_min_s.unwrap_or(100.0),
        &format!("{p}.warm_up_min_s"),
    )?;
    let warm_max = match (spec.warm_up_min_s, spec.warm_up_max_s) {
        (_, Some(max_s)) => seconds(max_s, &format!("{p}.warm_up_max_s"))?,
        (Some(_), None) => warm_min,
        (None, None) => WarmUp::LLM_D.max_us,
    };
    if warm_max < warm_min {
        return Err(invalid(
            format!("{p}.warm_up_max_s"),
            "must be at least warm_up_min_s",
        ));
    }
    config.warm_up = WarmUp {
        min_us: warm_min,
        max_us: warm_max,
    };
    if let Some(period) = spec.sync_period_s {
        let period_us = seconds(period, &format!("{p}.sync_period_s"))?;
        if period_us < 1_000_000 {
            return Err(invalid(
                format!("{p}.sync_period_s"),
                "must be at least 1 s",
            ));
        }
        config.sync_period_us = period_us;
    }
    if let Some(tolerance) = spec.tolerance {
        if !(tolerance.is_finite() && (0.0..1.0).contains(&tolerance)) {
            return Err(invalid(format!("{p}.tolerance"), "must be in [0, 1)"));
        }
        config.hpa.tolerance = tolerance;
    }
    if let Some(share) = spec.capacity_attainment {
        if !(share.is_finite() && share > 0.0 && share <= 1.0) {
            return Err(invalid(
                format!("{p}.capacity_attainment"),
                "must be in (0, 1]",
            ));
        }
        config.capacity_attainment = share;
    }
    if let Some(rules) = &spec.scale_up {
        config.hpa.scale_up = resolve_rules(rules, &format!("{p}.scale_up"))?;
    }
    if let Some(rules) = &spec.scale_down {
        config.hpa.scale_down = resolve_rules(rules, &format!("{p}.scale_down"))?;
    }
    if let Some(policies) = &spec.policies {
        if policies.is_empty() {
            return Err(invalid(format!("{p}.policies"), "must not be empty"));
        }
        config.policies = policies
            .iter()
            .enumerate()
            .map(|(i, policy)| resolve_policy(policy, &format!("{p}.policies[{i}]"), &config))
            .collect::<Result<_, _>>()?;
    }
    Ok(config)
}

fn resolve_rules(spec: &RulesSpec, path: &str) -> Result<ScalingRules, ClusterSpecError> {
    let select = match spec.select.as_deref().map(str::trim) {
        None | Some("max") | Some("Max") => SelectPolicy::Max,
        Some("min") | Some("Min") => SelectPolicy::Min,
        Some("disabled") | Some("Disabled") => SelectPolicy::Disabled,
        Some(other) => {
            return Err(invalid(
                format!("{path}.select"),
                format!("unknown {other:?}; expected max, min or disabled"),
            ));
        }
    };
    let policies = spec
        .policies
        .iter()
        .enumerate()
        .map(|(i, rate)| {
            let at = format!("{path}.policies[{i}]");
            let period_us = seconds(rate.period_s, &format!("{at}.period_s"))?;
            if period_us == 0 {
                return Err(invalid(format!("{at}.period_s"), "must be above 0"));
            }
            let value = positive(rate.value, &format!("{at}.value"))?;
            match rate.kind.trim().to_ascii_lowercase().as_str() {
                "pods" if value.fract() == 0.0 && value <= 1024.0 => Ok(RatePolicy::Pods {
                    pods: value as u32,
                    period_us,
                }),
                "pods" => Err(invalid(
                    format!("{at}.value"),
                    "pods must be a whole number up to 1024",
                )),
                "percent" => Ok(RatePolicy::Percent {
                    percent: value,
                    period_us,
                }),
                other => Err(invalid(
                    format!("{at}.type"),
                    format!("unknown {other:?}; expected pods or percent"),
                )),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ScalingRules {
        stabilization_us: seconds(spec.stabilization_s, &format!("{path}.stabilization_s"))?,
        policies,
        select,
    })
}

fn resolve_policy(
    spec: &PolicySpec,
    path: &str,
    config: &AutoscaleConfig,
) -> Result<Policy, ClusterSpecError> {
    let name = spec.name.trim().to_ascii_lowercase();
    let mut policy = Policy::by_name(&name).ok_or_else(|| {
        invalid(
            format!("{path}.name"),
            format!(
                "unknown policy {name:?}; expected one of {}",
                Policy::NAMES.join(", ")
            ),
        )
    })?;
    let unused = |field: &str, set: bool| -> Result<(), ClusterSpecError> {
        if set {
            Err(invalid(
                format!("{path}.{field}"),
                format!("not a setting of the {name} policy"),
            ))
        } else {
            Ok(())
        }
    };
    let is_static = matches!(policy, Policy::Static { .. });
    let is_slo = matches!(policy, Policy::SloAware { .. });
    let is_queue = matches!(policy, Policy::QueueDepth { .. });
    let is_predictive = matches!(policy, Policy::Predictive { .. });
    unused("replicas", spec.replicas.is_some() && !is_static)?;
    unused("up", spec.up.is_some() && !is_slo)?;
    unused("down", spec.down.is_some() && !is_slo)?;
    unused("target", spec.target.is_some() && !is_queue)?;
    unused("horizon_s", spec.horizon_s.is_some() && !is_predictive)?;
    unused("utilization", spec.utilization.is_some() && !is_predictive)?;
    match &mut policy {
        Policy::Static { replicas } => {
            if let Some(count) = spec.replicas {
                let (min, max) = (config.hpa.min_replicas, config.hpa.max_replicas);
                if !(min..=max).contains(&count) {
                    return Err(invalid(
                        format!("{path}.replicas"),
                        format!("must be in {min}..={max}"),
                    ));
                }
                *replicas = Some(count);
            }
        }
        Policy::SloAware { up, down, .. } => {
            if let Some(value) = spec.up {
                *up = positive(value, &format!("{path}.up"))?;
            }
            if let Some(value) = spec.down {
                *down = positive(value, &format!("{path}.down"))?;
            }
            if *down >= *up {
                return Err(invalid(format!("{path}.down"), "must be below up"));
            }
        }
        Policy::QueueDepth { target } => {
            if let Some(value) = spec.target {
                *target = positive(value, &format!("{path}.target"))?;
            }
        }
        Policy::Saturation { .. } => {}
        Policy::Predictive {
            horizon_us,
            utilization,
        } => {
            match spec.horizon_s {
                Some(value) => {
                    *horizon_us = seconds(value, &format!("{path}.horizon_s"))?;
                    if *horizon_us < config.warm_up.max_us {
                        return Err(invalid(
                            format!("{path}.horizon_s"),
                            "must be at least the longest warm-up (warm_up_max_s)",
                        ));
                    }
                }
                None => *horizon_us = (*horizon_us).max(config.warm_up.max_us),
            }
            if let Some(value) = spec.utilization {
                if !(value.is_finite() && value > 0.0 && value <= 1.0) {
                    return Err(invalid(format!("{path}.utilization"), "must be in (0, 1]"));
                }
                *utilization = value;
            }
        }
    }
    Ok(policy)
}

/// The `autoscaler:` section of a cluster YAML document, resolved, if it has one.
pub fn parse_autoscaler(text: &str) -> Result<Option<AutoscaleConfig>, ClusterSpecError> {
    #[derive(Deserialize)]
    struct Top {
        #[serde(default)]
        autoscaler: Option<AutoscalerSpec>,
    }
    let top: Top =
        serde_saphyr::from_str(text).map_err(|err| ClusterSpecError::Yaml(err.to_string()))?;
    top.autoscaler.as_ref().map(resolve_autoscaler).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_takes_the_guide_defaults_and_names_bad_fields() {
        let text = "pools: [{name: a}]\nautoscaler: {min_replicas: 3, max_replicas: 8, ttft_ms: 2000, tpot_ms: 80}\n";
        let config = parse_autoscaler(text).unwrap().unwrap();
        assert_eq!(config.initial_replicas, 3);
        assert_eq!(config.warm_up, WarmUp::LLM_D);
        assert_eq!(config.sync_period_us, 15_000_000);
        assert_eq!(config.hpa.scale_down.stabilization_us, 180_000_000);
        assert_eq!(config.policies.len(), 5);
        assert_eq!(parse_autoscaler("pools: [{name: a}]\n").unwrap(), None);
        let error = |section: &str| {
            parse_autoscaler(&format!("autoscaler: {section}\n"))
                .unwrap_err()
                .to_string()
        };
        assert!(
            error("{max_replicas: 2, min_replicas: 3, ttft_ms: 1, tpot_ms: 1}")
                .starts_with("autoscaler.max_replicas:")
        );
        assert!(
            error("{max_replicas: 2, ttft_ms: 0, tpot_ms: 1}").starts_with("autoscaler.ttft_ms:")
        );
        assert!(error(
            "{max_replicas: 2, ttft_ms: 1, tpot_ms: 1, policies: [{name: predictive, horizon_s: 60}]}"
        )
        .starts_with("autoscaler.policies[0].horizon_s:"));
        assert!(
            error(
                "{max_replicas: 2, ttft_ms: 1, tpot_ms: 1, policies: [{name: static, target: 3}]}"
            )
            .starts_with("autoscaler.policies[0].target:")
        );
        assert!(error(
            "{max_replicas: 2, ttft_ms: 1, tpot_ms: 1, scale_up: {policies: [{type: pods, value: 1.5, period_s: 60}]}}"
        )
        .starts_with("autoscaler.scale_up.policies[0].value:"));
        assert!(error("{max_replicas: 2, ttft_ms: 1, tpot_ms: 1, warmup: 3}").contains("warmup"));
    }
}
