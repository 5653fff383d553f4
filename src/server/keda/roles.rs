//! One role of a prefill/decode (P/D) pool per trigger (`scalerMetadata.role`): llm-d runs a
//! P/D pool as two Deployments, prefill and decode, so each gets its own ScaledObject, and
//! both read one split forecast (docs/autoscaling.md, "Per role").
//!
//! A trigger with a role resolves to the P/D pair its pool takes part in (`load`); the
//! forecast searches the pair's split (`twin::forecast`: each role grown on its own
//! objective from one of each until the split meets the target, then each role trimmed to
//! the fewest pods that still meet it) under the pool's load forecast, and each role
//! answers its count of the split. A role on a pool whose pods serve
//! both roles, a role the pool has no pods of, or a role with no partner of the other role
//! is refused naming `scalerMetadata.role`; so is a trigger without a role on a P/D pool
//! (one count for two Deployments would scale neither right).

use crate::cluster::config::InstanceRole;
use crate::twin::TwinError;
use crate::twin::desired::{
    DesiredSettings, Variant, desired_split, observed_lengths, split_question_for,
};
use crate::twin::forecast::forecast_capacity;
use crate::twin::limits::Limits;
use crate::twin::snapshot::MirrorSnapshot;
use crate::workload::Stage;

use super::cache::{Computed, RoleCounts};
use super::load::PoolLoad;
use super::metadata::{ForecastKey, ScalerQuery, role_name};

/// What a trigger scales.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// The whole pool (no role asked, the pool's pods serve both roles).
    Pool,
    /// One role of a P/D pair.
    Split {
        /// The pair: its (prefill, decode) variants.
        pair: Box<(Variant, Variant)>,
        /// The role asked.
        role: InstanceRole,
    },
}

impl Target {
    /// The cache key of the forecast behind `query` on this target.
    pub fn forecast_key(&self, query: &ScalerQuery) -> ForecastKey {
        match self {
            Self::Pool => query.forecast_key(),
            Self::Split { pair, .. } => {
                let (prefill, decode) = pair.as_ref();
                query.split_key(&prefill.namespace, &prefill.name, &decode.name)
            }
        }
    }

    /// The recently finished requests' lengths the forecast of this target on the pool of
    /// `variant` samples (a pair's: its decode pool's, else its prefill pool's).
    pub fn observed_lengths<'a>(
        &'a self,
        snapshot: &'a MirrorSnapshot,
        variant: &'a Variant,
    ) -> &'a [(u32, u32)] {
        match self {
            Self::Pool => observed_lengths(snapshot, &[variant], ""),
            Self::Split { pair, .. } => observed_lengths(snapshot, &[&pair.1, &pair.0], ""),
        }
    }

    /// The replicas this target's metric reports from a forecast.
    pub fn replicas(&self, computed: &Computed) -> u32 {
        match (self, computed.split) {
            (
                Self::Split {
                    role: InstanceRole::Prefill,
                    ..
                },
                Some(counts),
            ) => counts.prefill,
            (Self::Split { .. }, Some(counts)) => counts.decode,
            _ => computed.desired,
        }
    }
}

fn invalid(reason: String) -> TwinError {
    TwinError::invalid("scalerMetadata.role", reason)
}

fn roles_text(roles: &[InstanceRole]) -> String {
    let names: Vec<&str> = roles.iter().map(|&r| role_name(r)).collect();
    names.join(", ")
}

/// What `query` scales on the pool `load`; INVALID_ARGUMENT naming `scalerMetadata.role`
/// when the role does not fit the pool.
pub fn target(query: &ScalerQuery, load: &PoolLoad) -> Result<Target, TwinError> {
    let pool = &query.pool;
    let disaggregated = load.roles.iter().any(|&r| r != InstanceRole::Both);
    let Some(role) = query.role else {
        if disaggregated {
            return Err(invalid(format!(
                "required for pool {pool:?}: its pods are disaggregated (roles {}); name the \
                 role this trigger's workload serves, prefill or decode",
                roles_text(&load.roles)
            )));
        }
        return Ok(Target::Pool);
    };
    if !disaggregated {
        return Err(invalid(format!(
            "pool {pool:?} is not disaggregated (its pods serve both prefill and decode): \
             drop role to scale the whole pool"
        )));
    }
    if !load.roles.contains(&role) {
        return Err(invalid(format!(
            "pool {pool:?} has no {} pods (its roles: {})",
            role_name(role),
            roles_text(&load.roles)
        )));
    }
    let Some(pair) = load.split.clone() else {
        let other = match role {
            InstanceRole::Prefill => "decode",
            _ => "prefill",
        };
        return Err(invalid(format!(
            "pool {pool:?}'s {} pods have no {other} pods of the same model and namespace to \
             pair with in the mirror",
            role_name(role)
        )));
    };
    Ok(Target::Split {
        pair: Box::new(pair),
        role,
    })
}

/// The split forecast of a P/D pair under `stages`: both counts searched together, then
/// each role trimmed to the fewest pods that still meet the target (`twin::forecast`, the
/// same answer ForecastCapacity gives for the pair). No arrivals forecast: nothing, or one of
/// each role while requests are in flight.
pub fn split_forecast(
    snapshot: &MirrorSnapshot,
    (prefill, decode): (&Variant, &Variant),
    settings: &DesiredSettings,
    stages: Vec<Stage>,
    now_us: u64,
    limits: &Limits,
    in_flight: u64,
) -> Result<Computed, TwinError> {
    let asked = split_question_for(snapshot, prefill, decode, settings, stages, now_us);
    let answer = asked
        .as_ref()
        .map(|asked| forecast_capacity(snapshot, asked, limits))
        .transpose()?;
    if answer.is_none() && in_flight == 0 {
        return Ok(Computed {
            desired: 0,
            attainment: 1.0,
            split: Some(RoleCounts {
                prefill: 0,
                decode: 0,
            }),
        });
    }
    let [p, d] = desired_split(prefill, decode, answer.as_ref());
    Ok(Computed {
        desired: p.desired + d.desired,
        attainment: p.attainment,
        split: Some(RoleCounts {
            prefill: p.desired,
            decode: d.desired,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::keda::metadata::parse;
    use crate::workload::load_forecast::{LoadForecastSettings, LoadForecaster};
    use std::collections::HashMap;

    fn variant(name: &str, role: InstanceRole) -> Variant {
        Variant {
            name: name.to_owned(),
            namespace: "ns".to_owned(),
            model: "m".to_owned(),
            template_id: format!("{name}-{}", role_name(role)),
            current: 1,
            role,
        }
    }

    fn load(roles: &[InstanceRole], split: bool) -> PoolLoad {
        PoolLoad {
            variant: variant("vllm", roles[0]),
            roles: roles.to_vec(),
            split: split.then(|| {
                (
                    variant("vllm", InstanceRole::Prefill),
                    variant("vllm", InstanceRole::Decode),
                )
            }),
            forecaster: LoadForecaster::new(LoadForecastSettings::for_step(1.0)),
            in_flight: 0,
            quiet: Default::default(),
        }
    }

    fn query(role: Option<&str>) -> ScalerQuery {
        let mut metadata: HashMap<String, String> = [("pool", "vllm"), ("ttftMs", "100")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        if let Some(role) = role {
            metadata.insert("role".to_owned(), role.to_owned());
        }
        parse(&metadata, 8).expect("valid")
    }

    fn refused(result: Result<Target, TwinError>) -> String {
        match result {
            Err(TwinError::InvalidField { path, why }) => {
                assert_eq!(path, "scalerMetadata.role");
                why
            }
            other => panic!("not refused naming role: {other:?}"),
        }
    }

    #[test]
    fn a_role_fits_only_a_disaggregated_pool_with_that_role_and_a_partner() {
        use InstanceRole::{Both, Decode, Prefill};
        let pd = load(&[Prefill, Decode], true);
        assert_eq!(
            target(&query(None), &load(&[Both], false)),
            Ok(Target::Pool)
        );
        let Ok(Target::Split { role, .. }) = target(&query(Some("decode")), &pd) else {
            panic!("decode of a P/D pool");
        };
        assert_eq!(role, Decode);
        assert!(
            refused(target(&query(Some("prefill")), &load(&[Both], false)))
                .contains("not disaggregated")
        );
        assert!(refused(target(&query(None), &pd)).contains("required"));
        assert!(
            refused(target(&query(Some("decode")), &load(&[Prefill], true)))
                .contains("no decode pods")
        );
        assert!(
            refused(target(&query(Some("prefill")), &load(&[Prefill], false))).contains("pair")
        );
    }

    #[test]
    fn each_role_reads_its_count_of_one_split() {
        let computed = Computed {
            desired: 5,
            attainment: 0.97,
            split: Some(RoleCounts {
                prefill: 3,
                decode: 2,
            }),
        };
        let split = |role| Target::Split {
            pair: Box::new((
                variant("vllm", InstanceRole::Prefill),
                variant("vllm", InstanceRole::Decode),
            )),
            role,
        };
        assert_eq!(split(InstanceRole::Prefill).replicas(&computed), 3);
        assert_eq!(split(InstanceRole::Decode).replicas(&computed), 2);
        assert_eq!(Target::Pool.replicas(&computed), 5);
        let key = split(InstanceRole::Prefill).forecast_key(&query(Some("prefill")));
        assert_eq!(
            key,
            split(InstanceRole::Decode).forecast_key(&query(Some("decode")))
        );
        assert_ne!(key, Target::Pool.forecast_key(&query(None)));
    }
}
