//! `ditto run --cluster FILE` when the file has an `autoscaler:` section: every policy on
//! the same requests, one after another, and the comparison (docs/autoscaling.md).

use std::path::Path;

use super::args::RunArgs;
pub use super::autoscale_report::{AutoscaleJson, PolicyJson};
use super::error::CliError;
use crate::cluster::ClusterConfig;
use crate::cluster::autoscale::{
    self, AutoscaleConfig, AutoscaleError, Policy, PolicyOutcome, capacity,
};
use crate::sim::RequestSpec;

/// Requests whose lengths calibrate the predictive policy's per-replica capacity.
const LENGTH_SAMPLE: usize = 2_000;

impl From<&PolicyOutcome> for PolicyJson {
    fn from(o: &PolicyOutcome) -> Self {
        Self {
            policy: o.policy.clone(),
            slo_attainment: o.attainment(),
            replica_hours: o.replica_hours,
            cost: o.cost,
            mean_replicas: o.mean_replicas(),
            peak_replicas: o.peak_replicas,
            scale_ups: o.scale_ups,
            scale_downs: o.scale_downs,
            pods_added: o.pods_added,
            pods_removed: o.pods_removed,
            time_under_provisioned_s: o.time_over_slo_s,
            ttft_ms: o.ttft_ms,
            tpot_ms: o.tpot_ms,
            requests: o.requests,
            completed: o.completed,
            duration_s: o.duration_s,
            events: o.events,
        }
    }
}

/// A finished comparison.
#[derive(Clone, Debug)]
pub struct AutoscaleReport {
    /// The JSON.
    pub json: AutoscaleJson,
    /// Every policy's full outcome (timelines for the plot).
    pub outcomes: Vec<PolicyOutcome>,
}

/// The autoscaler section of `args.cluster`, if the file has one.
pub fn section(args: &RunArgs) -> Result<Option<AutoscaleConfig>, CliError> {
    let Some(path) = args.cluster.as_deref().filter(|p| *p != "default") else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|source| CliError::Io {
        path: Path::new(path).to_path_buf(),
        source,
    })?;
    let mut config =
        crate::cluster::spec::parse_autoscaler(&text).map_err(|err| CliError::BadFile {
            path: Path::new(path).to_path_buf(),
            reason: err.to_string(),
        })?;
    if let (Some(config), Some(list)) = (config.as_mut(), args.policies.as_deref()) {
        config.policies = policies_flag(list, config)?;
    }
    Ok(config)
}

fn policies_flag(list: &str, config: &AutoscaleConfig) -> Result<Vec<Policy>, CliError> {
    let names: Vec<String> = list
        .split(',')
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    if names.iter().any(|n| n == "all") {
        return Ok(Policy::NAMES
            .iter()
            .filter_map(|n| configured(n, config))
            .collect());
    }
    if names.is_empty() {
        return Err(CliError::flag("policies", "name at least one policy"));
    }
    names
        .iter()
        .map(|name| {
            configured(name, config).ok_or_else(|| {
                CliError::flag(
                    "policies",
                    format!(
                        "unknown policy {name:?}; expected {} or all",
                        Policy::NAMES.join(", ")
                    ),
                )
            })
        })
        .collect()
}

/// The section's own settings of policy `name` if it lists it, else its defaults.
fn configured(name: &str, config: &AutoscaleConfig) -> Option<Policy> {
    let default = Policy::by_name(name)?;
    let listed = config
        .policies
        .iter()
        .find(|p| p.name() == default.name())
        .cloned();
    Some(listed.unwrap_or(match default {
        Policy::Predictive {
            horizon_us,
            utilization,
        } => Policy::Predictive {
            horizon_us: horizon_us.max(config.warm_up.max_us),
            utilization,
        },
        other => other,
    }))
}

/// Refuses a `--plot` path that cannot be written before any policy runs: one naming a
/// directory, or one in a directory that does not exist.
fn check_plot_path(path: &Path) -> Result<(), CliError> {
    if path.is_dir() {
        return Err(CliError::flag(
            "plot",
            format!("{} is a directory, not a file", path.display()),
        ));
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(CliError::flag(
            "plot",
            format!("directory {} does not exist", parent.display()),
        ));
    }
    Ok(())
}

/// Runs every policy of `config` on the requests `make` yields (the same each call).
pub fn execute(
    args: &RunArgs,
    base: &ClusterConfig,
    config: &AutoscaleConfig,
    mut make: impl FnMut() -> Result<Box<dyn Iterator<Item = RequestSpec>>, CliError>,
    workload: String,
    seed: u64,
) -> Result<AutoscaleReport, CliError> {
    if args.per_request.is_some() {
        return Err(CliError::flag(
            "per-request",
            "not available with an autoscaler (the comparison reports per policy)",
        ));
    }
    if let Some(path) = &args.plot {
        check_plot_path(path)?;
    }
    let first = &base.instances[0];
    if base
        .instances
        .iter()
        .any(|i| i.model != first.model || i.gpu != first.gpu || i.tp != first.tp)
    {
        return Err(CliError::flag(
            "cluster",
            "an autoscaled cluster needs one pool (its replicas are what scales)",
        ));
    }
    let needs_capacity = config
        .policies
        .iter()
        .any(|p| matches!(p, Policy::Predictive { .. }));
    let capacity = if needs_capacity {
        let lengths: Vec<(u32, u32)> = make()?
            .take(LENGTH_SAMPLE)
            .map(|r| (r.input_tokens, r.output_tokens))
            .collect();
        capacity::calibrate(
            first,
            &lengths,
            config.objectives,
            config.capacity_attainment,
            seed,
        )?
    } else {
        0.0
    };
    let mut outcomes = Vec::with_capacity(config.policies.len());
    for policy in &config.policies {
        let started = std::time::Instant::now();
        let run = autoscale::PolicyRun {
            base,
            config,
            policy,
            capacity,
            seed,
            max_events: args.max_events,
        };
        let outcome =
            autoscale::run_policy(&run, make()?, &mut |_, _| {}).map_err(|err| match err {
                AutoscaleError::Sim(err) => CliError::from(err),
                AutoscaleError::EventBudget(_) => CliError::flag("max-events", err.to_string()),
            })?;
        eprintln!(
            "ditto run: policy {} done in {:.1} s wall ({} requests)",
            policy.name(),
            started.elapsed().as_secs_f64(),
            outcome.requests
        );
        outcomes.push(outcome);
    }
    let json = AutoscaleJson {
        pool: format!("{} on {} TP {}", first.model, first.gpu, first.tp),
        workload,
        seed,
        ttft_slo_ms: config.objectives.ttft_us / 1e3,
        tpot_slo_ms: config.objectives.tpot_us / 1e3,
        min_replicas: config.hpa.min_replicas,
        max_replicas: config.hpa.max_replicas,
        warm_up_s: [
            config.warm_up.min_us as f64 / 1e6,
            config.warm_up.max_us as f64 / 1e6,
        ],
        capacity_per_replica: capacity,
        policies: outcomes.iter().map(PolicyJson::from).collect(),
    };
    if let Some(path) = &args.plot {
        let svg = super::autoscale_report::svg(&json, &outcomes);
        std::fs::write(path, svg).map_err(|source| CliError::Io {
            path: path.clone(),
            source,
        })?;
    }
    Ok(AutoscaleReport { json, outcomes })
}
