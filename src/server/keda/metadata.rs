//! A ScaledObject trigger's `metadata` (KEDA's `scalerMetadata`) → what ditto is asked:
//! the pool (and, for a prefill/decode pool, the role the trigger scales), the objectives,
//! the horizon and what to return. Every bad value is
//! INVALID_ARGUMENT naming its key (`scalerMetadata.ttftMs: ...`); unknown keys are refused
//! too (a typo would otherwise be a silently ignored objective), except KEDA's own keys for
//! reaching the scaler, which KEDA passes along in the same map.

use std::collections::HashMap;

use crate::cluster::config::InstanceRole;
use crate::twin::TwinError;
use crate::twin::question::SloTargets;

/// KEDA's keys of an external trigger, passed to the scaler with ours and ignored here.
pub const KEDA_KEYS: [&str; 7] = [
    "scalerAddress",
    "caCert",
    "tlsCertFile",
    "tlsClientCert",
    "tlsClientKey",
    "unsafeSsl",
    "enableTLS",
];

/// Our keys.
pub const KEYS: [&str; 11] = [
    "pool",
    "namespace",
    "role",
    "ttftMs",
    "tpotMs",
    "horizonSeconds",
    "warmUpSeconds",
    "targetAttainment",
    "replications",
    "metric",
    "arrivalRatePerReplica",
];

/// Default forecast horizon, seconds (longer than llm-d's measured warm-up range's top).
pub const DEFAULT_HORIZON_S: f64 = 150.0;
/// Default warm-up of a new pod, seconds (llm-d measured 100 s to 2 min 15 s).
pub const DEFAULT_WARM_UP_S: f64 = 120.0;
/// Longest horizon accepted, seconds.
pub const HORIZON_MAX_S: f64 = 3_600.0;

/// What GetMetrics returns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MetricKind {
    /// The replicas the forecast needs (target 1 as AverageValue: HPA's desired count).
    DesiredReplicas,
    /// The peak forecast arrival rate over the horizon (target: the rate one replica takes).
    ArrivalRate {
        /// Requests per second one replica is meant to take.
        per_replica: f64,
    },
}

/// One trigger's question, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalerQuery {
    /// The pool (variant) name.
    pub pool: String,
    /// Its namespace when the trigger names one (else any).
    pub namespace: Option<String>,
    /// The role the trigger scales on a prefill/decode pool (`Prefill` or `Decode`); None:
    /// the whole pool.
    pub role: Option<InstanceRole>,
    /// The objectives.
    pub slo: SloTargets,
    /// Forecast horizon, seconds (at least the warm-up).
    pub horizon_s: f64,
    /// Fraction of requests that must meet every objective.
    pub target_attainment: f64,
    /// Replications per candidate count.
    pub replications: u32,
    /// What to return.
    pub metric: MetricKind,
}

impl ScalerQuery {
    /// The metric's name: `ditto-<metric>-<pool>`, then `-<role>` when the trigger names
    /// one; lower case, `[a-z0-9-]` only.
    pub fn metric_name(&self) -> String {
        let kind = match self.metric {
            MetricKind::DesiredReplicas => "desired-replicas",
            MetricKind::ArrivalRate { .. } => "arrival-rate",
        };
        let pool: String = self
            .pool
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        match self.role {
            Some(role) => format!("ditto-{kind}-{pool}-{}", role_name(role)),
            None => format!("ditto-{kind}-{pool}"),
        }
    }

    /// The target the HPA divides the metric by (AverageValue).
    pub fn target(&self) -> f64 {
        match self.metric {
            MetricKind::DesiredReplicas => 1.0,
            MetricKind::ArrivalRate { per_replica } => per_replica,
        }
    }

    /// The cache key of the forecast behind this query (the metric kind does not change it).
    pub fn forecast_key(&self) -> ForecastKey {
        ForecastKey {
            pool: self.pool.clone(),
            namespace: self.namespace.clone(),
            ttft_bits: self.slo.ttft_ms.map(f64::to_bits),
            tpot_bits: self.slo.tpot_ms.map(f64::to_bits),
            horizon_bits: self.horizon_s.to_bits(),
            attainment_bits: self.target_attainment.to_bits(),
            replications: self.replications,
            split: None,
        }
    }

    /// The cache key of a P/D split forecast: the pair's variants (in `namespace`) instead of
    /// the pool named, so both roles' triggers (whichever pool name each gives) share it.
    pub fn split_key(&self, namespace: &str, prefill: &str, decode: &str) -> ForecastKey {
        ForecastKey {
            pool: String::new(),
            namespace: Some(namespace.to_owned()),
            split: Some((prefill.to_owned(), decode.to_owned())),
            ..self.forecast_key()
        }
    }
}

/// A role's name in the metadata and the metric name.
pub fn role_name(role: InstanceRole) -> &'static str {
    match role {
        InstanceRole::Prefill => "prefill",
        InstanceRole::Decode => "decode",
        InstanceRole::Both => "both",
    }
}

/// What identifies a cached forecast: pool (or P/D pair), objectives, horizon, target,
/// replications.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ForecastKey {
    pool: String,
    namespace: Option<String>,
    ttft_bits: Option<u64>,
    tpot_bits: Option<u64>,
    horizon_bits: u64,
    attainment_bits: u64,
    replications: u32,
    split: Option<(String, String)>,
}

fn invalid(key: &str, reason: impl Into<String>) -> TwinError {
    TwinError::invalid(format!("scalerMetadata.{key}"), reason)
}

fn number(
    metadata: &HashMap<String, String>,
    key: &str,
    default: Option<f64>,
) -> Result<Option<f64>, TwinError> {
    match metadata.get(key) {
        None => Ok(default),
        Some(text) => match text.trim().parse::<f64>() {
            Ok(value) if value.is_finite() => Ok(Some(value)),
            _ => Err(invalid(key, format!("{text:?} is not a finite number"))),
        },
    }
}

fn objective(metadata: &HashMap<String, String>, key: &str) -> Result<Option<f64>, TwinError> {
    match number(metadata, key, None)? {
        Some(value) if value < 0.0 => Err(invalid(key, "must be at least 0 ms")),
        Some(value) if value > 0.0 => Ok(Some(value)),
        _ => Ok(None),
    }
}

/// Parses a trigger's metadata; `max_replications` is the server's bound.
pub fn parse(
    metadata: &HashMap<String, String>,
    max_replications: u32,
) -> Result<ScalerQuery, TwinError> {
    let mut unknown: Vec<&str> = metadata
        .keys()
        .map(String::as_str)
        .filter(|key| !KEYS.contains(key) && !KEDA_KEYS.contains(key))
        .collect();
    unknown.sort_unstable();
    if let Some(key) = unknown.first() {
        return Err(invalid(
            key,
            format!("unknown key; ditto reads {}", KEYS.join(", ")),
        ));
    }
    let pool = metadata.get("pool").map_or("", |p| p.trim());
    if pool.is_empty() {
        return Err(invalid("pool", "required: the pool (variant) to forecast"));
    }
    let namespace = metadata
        .get("namespace")
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty());
    let role = role(metadata)?;
    let slo = SloTargets {
        ttft_ms: objective(metadata, "ttftMs")?,
        tpot_ms: objective(metadata, "tpotMs")?,
        e2e_ms: None,
    };
    if slo.ttft_ms.is_none() && slo.tpot_ms.is_none() {
        return Err(invalid(
            "ttftMs",
            "the forecast needs an objective: set ttftMs or tpotMs above 0",
        ));
    }
    let horizon_s = horizon(metadata)?;
    let target_attainment = number(metadata, "targetAttainment", Some(0.95))?.unwrap_or(0.95);
    if !(target_attainment > 0.0 && target_attainment <= 1.0) {
        return Err(invalid("targetAttainment", "must be in (0, 1]"));
    }
    let replications = replications(metadata, max_replications)?;
    let metric = metric(metadata)?;
    Ok(ScalerQuery {
        pool: pool.to_owned(),
        namespace,
        role,
        slo,
        horizon_s,
        target_attainment,
        replications,
        metric,
    })
}

/// `role`: absent (the whole pool), `prefill` or `decode`.
fn role(metadata: &HashMap<String, String>) -> Result<Option<InstanceRole>, TwinError> {
    Ok(match metadata.get("role").map(|r| r.trim()) {
        None | Some("") => None,
        Some("prefill") => Some(InstanceRole::Prefill),
        Some("decode") => Some(InstanceRole::Decode),
        Some(other) => {
            return Err(invalid(
                "role",
                format!(
                    "{other:?}: expected prefill or decode (the role of a P/D pool this \
                     trigger scales), or no role for the whole pool"
                ),
            ));
        }
    })
}

/// `horizonSeconds`, checked against `warmUpSeconds` (a replica asked for now serves only
/// after its warm-up).
fn horizon(metadata: &HashMap<String, String>) -> Result<f64, TwinError> {
    let warm_up =
        number(metadata, "warmUpSeconds", Some(DEFAULT_WARM_UP_S))?.unwrap_or(DEFAULT_WARM_UP_S);
    if !(0.0..=HORIZON_MAX_S).contains(&warm_up) {
        return Err(invalid(
            "warmUpSeconds",
            format!("must be in [0, {HORIZON_MAX_S}] seconds"),
        ));
    }
    let horizon_s = number(
        metadata,
        "horizonSeconds",
        Some(DEFAULT_HORIZON_S.max(warm_up)),
    )?
    .unwrap_or(DEFAULT_HORIZON_S);
    if !(horizon_s > 0.0 && horizon_s <= HORIZON_MAX_S) {
        return Err(invalid(
            "horizonSeconds",
            format!("must be in (0, {HORIZON_MAX_S}] seconds"),
        ));
    }
    if horizon_s < warm_up {
        return Err(invalid(
            "horizonSeconds",
            format!(
                "{horizon_s} s is shorter than warmUpSeconds {warm_up} s: a replica asked for \
                 now serves only after its warm-up, so the forecast must reach past it"
            ),
        ));
    }
    Ok(horizon_s)
}

/// `replications`: 2 (within the server's limit) when absent.
fn replications(
    metadata: &HashMap<String, String>,
    max_replications: u32,
) -> Result<u32, TwinError> {
    Ok(match metadata.get("replications") {
        None => 2.min(max_replications.max(1)),
        Some(text) => match text.trim().parse::<u32>() {
            Ok(n) if (1..=max_replications).contains(&n) => n,
            _ => {
                return Err(invalid(
                    "replications",
                    format!("{text:?} is not an integer in [1, {max_replications}]"),
                ));
            }
        },
    })
}

/// `metric`: the desired replicas (default) or an arrival rate per replica.
fn metric(metadata: &HashMap<String, String>) -> Result<MetricKind, TwinError> {
    Ok(match metadata.get("metric").map(|m| m.trim()) {
        None | Some("") | Some("desiredReplicas") => MetricKind::DesiredReplicas,
        Some("arrivalRate") => {
            let per_replica = number(metadata, "arrivalRatePerReplica", None)?.ok_or_else(|| {
                invalid(
                    "arrivalRatePerReplica",
                    "required with metric arrivalRate: the requests per second one replica takes",
                )
            })?;
            if per_replica <= 0.0 {
                return Err(invalid("arrivalRatePerReplica", "must be above 0"));
            }
            MetricKind::ArrivalRate { per_replica }
        }
        Some(other) => {
            return Err(invalid(
                "metric",
                format!("{other:?}: expected desiredReplicas or arrivalRate"),
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn field(err: TwinError) -> String {
        match err {
            TwinError::InvalidField { path, .. } => path,
            other => panic!("not a field error: {other}"),
        }
    }

    #[test]
    fn defaults_and_keda_s_own_keys() {
        let query = parse(
            &map(&[
                ("pool", "vllm"),
                ("ttftMs", "500"),
                ("scalerAddress", "x:9010"),
            ]),
            64,
        )
        .expect("valid");
        assert_eq!(query.horizon_s, DEFAULT_HORIZON_S);
        assert_eq!(query.slo.ttft_ms, Some(500.0));
        assert_eq!(query.slo.tpot_ms, None);
        assert_eq!(query.metric, MetricKind::DesiredReplicas);
        assert_eq!(query.metric_name(), "ditto-desired-replicas-vllm");
        assert_eq!(query.target(), 1.0);
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases: [(&[(&str, &str)], &str); 8] = [
            (&[("ttftMs", "1")], "scalerMetadata.pool"),
            (&[("pool", "p")], "scalerMetadata.ttftMs"),
            (
                &[("pool", "p"), ("ttftMs", "fast")],
                "scalerMetadata.ttftMs",
            ),
            (&[("pool", "p"), ("tpotMs", "-1")], "scalerMetadata.tpotMs"),
            (
                &[("pool", "p"), ("ttftMs", "1"), ("horizonSeconds", "60")],
                "scalerMetadata.horizonSeconds",
            ),
            (
                &[("pool", "p"), ("ttftMs", "1"), ("replications", "0")],
                "scalerMetadata.replications",
            ),
            (
                &[("pool", "p"), ("ttftMs", "1"), ("metric", "arrivalRate")],
                "scalerMetadata.arrivalRatePerReplica",
            ),
            (
                &[("pool", "p"), ("ttftMs", "1"), ("ttft", "1")],
                "scalerMetadata.ttft",
            ),
        ];
        for (pairs, key) in cases {
            let err = parse(&map(pairs), 8).expect_err("invalid");
            assert_eq!(field(err), key, "{pairs:?}");
        }
    }

    #[test]
    fn the_horizon_may_shrink_with_the_warm_up_and_the_key_ignores_the_metric() {
        let short = parse(
            &map(&[
                ("pool", "p"),
                ("tpotMs", "50"),
                ("horizonSeconds", "20"),
                ("warmUpSeconds", "10"),
                ("metric", "arrivalRate"),
                ("arrivalRatePerReplica", "4"),
            ]),
            8,
        )
        .expect("valid");
        assert_eq!(short.horizon_s, 20.0);
        assert_eq!(short.target(), 4.0);
        assert_eq!(short.metric_name(), "ditto-arrival-rate-p");
        let replicas = ScalerQuery {
            metric: MetricKind::DesiredReplicas,
            ..short.clone()
        };
        assert_eq!(short.forecast_key(), replicas.forecast_key());
    }

    #[test]
    fn a_role_names_the_metric_and_leaves_the_split_key_shared() {
        let whole = parse(&map(&[("pool", "vllm"), ("ttftMs", "500")]), 8).expect("valid");
        assert_eq!(whole.role, None);
        let prefill = parse(
            &map(&[("pool", "vllm"), ("ttftMs", "500"), ("role", "prefill")]),
            8,
        )
        .expect("valid");
        let decode = parse(
            &map(&[("pool", "vllm"), ("ttftMs", "500"), ("role", " decode ")]),
            8,
        )
        .expect("valid");
        assert_eq!(prefill.role, Some(InstanceRole::Prefill));
        assert_eq!(decode.role, Some(InstanceRole::Decode));
        assert_eq!(whole.metric_name(), "ditto-desired-replicas-vllm");
        assert_eq!(prefill.metric_name(), "ditto-desired-replicas-vllm-prefill");
        assert_eq!(decode.metric_name(), "ditto-desired-replicas-vllm-decode");
        // Both roles (even named by different pool names) share the pair's split key; it is
        // not the whole pool's.
        let other_name = ScalerQuery {
            pool: "decode".to_owned(),
            ..decode.clone()
        };
        let key = prefill.split_key("ns", "p", "d");
        assert_eq!(key, other_name.split_key("ns", "p", "d"));
        assert_ne!(key, prefill.forecast_key());
        assert_ne!(key, prefill.split_key("ns", "p", "d2"));
        for bad in ["both", "Prefill", "encode"] {
            let err = parse(&map(&[("pool", "p"), ("ttftMs", "1"), ("role", bad)]), 8)
                .expect_err("invalid role");
            assert_eq!(field(err), "scalerMetadata.role", "{bad}");
        }
    }
}
