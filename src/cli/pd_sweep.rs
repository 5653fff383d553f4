//! `ditto run --cluster FILE --pd-sweep P1-P2:D1-D2`: the capacity planner's P:D ratio
//! sweep (docs/disaggregation.md). Every split of the ranges runs the file's P/D cluster
//! with its first prefill pool and first decode pool at those replica counts, on the same
//! requests and seed; the report gives, per split, the GPUs, the cost, TTFT and TPOT, and
//! the SLO attainment (the fraction of requests meeting every objective given), and names
//! the split meeting the target with the fewest GPUs (then the lowest cost).

use std::path::Path;

use serde::Serialize;

use super::args::RunArgs;
use super::error::CliError;
use super::report::StatsJson;
use crate::cluster::Cluster;
use crate::cluster::config::{InstanceConfig, InstanceRole};
use crate::cluster::disagg::{DisaggConfig, InstanceKv};
use crate::cluster::spec;
use crate::sim::metrics::Outcome;

/// Most splits one sweep runs.
pub const SPLITS_MAX: usize = 400;
/// Target attainment when `--pd-sweep-slo` names none.
pub const DEFAULT_ATTAINMENT: f64 = 0.9;

/// The sweep's report (printed as JSON).
#[derive(Clone, Debug, Serialize)]
pub struct SweepReport {
    /// TTFT objective, ms.
    pub slo_ttft_ms: Option<f64>,
    /// TPOT objective, ms.
    pub slo_tpot_ms: Option<f64>,
    /// Fraction of requests that must meet every objective.
    pub target_attainment: f64,
    /// Requests per split.
    pub requests: usize,
    /// Every split, prefill count major.
    pub splits: Vec<SplitRow>,
    /// The split meeting the target with the fewest GPUs (then the lowest cost); None if
    /// none does.
    pub best: Option<SplitRow>,
}

/// One split's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct SplitRow {
    /// Prefill replicas.
    pub prefill: u32,
    /// Decode replicas.
    pub decode: u32,
    /// GPUs: replicas times TP, both roles.
    pub gpus: u32,
    /// Cost per hour (the pools' `cost_per_hour`).
    pub cost_per_hour: f64,
    /// Completed requests.
    pub completed: u64,
    /// Time to first token, ms.
    pub ttft_ms: StatsJson,
    /// Time per output token, ms.
    pub tpot_ms: StatsJson,
    /// Fraction of the requests meeting every objective (unfinished ones count as missed).
    pub slo_attainment: f64,
    /// Whether the attainment reaches the target.
    pub meets_target: bool,
}

/// The objectives of `--pd-sweep-slo`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Objectives {
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    attainment: f64,
}

/// Runs the sweep `args` asks for; the report as pretty JSON.
pub fn execute(args: &RunArgs) -> Result<String, CliError> {
    let ranges = args.pd_sweep.as_deref().unwrap_or_default();
    let (prefill_range, decode_range) = parse_ranges(ranges)?;
    let objectives = parse_objectives(args.pd_sweep_slo.as_deref().unwrap_or(""))?;
    let path = args
        .cluster
        .as_deref()
        .ok_or_else(|| CliError::flag("pd-sweep", "needs --cluster FILE"))?;
    let text = std::fs::read_to_string(path).map_err(|source| CliError::Io {
        path: Path::new(path).to_path_buf(),
        source,
    })?;
    let bad_file = |reason: String| CliError::BadFile {
        path: Path::new(path).to_path_buf(),
        reason,
    };
    let file = spec::parse_cluster_file(&text, None).map_err(|err| bad_file(err.to_string()))?;
    let disagg = file.disaggregation.ok_or_else(|| {
        bad_file("--pd-sweep needs a `disaggregation:` section (a P/D cluster)".to_owned())
    })?;
    let templates = Templates::find(&file.config.instances, &disagg)
        .ok_or_else(|| bad_file("--pd-sweep needs a prefill pool and a decode pool".to_owned()))?;
    let (requests, seed) = super::run::requests(args)?;
    let mut splits = Vec::new();
    for prefill in prefill_range.0..=prefill_range.1 {
        for decode in decode_range.0..=decode_range.1 {
            let mut cluster = templates.cluster(&file.config, &disagg, prefill, decode, seed)?;
            cluster.run(requests.iter().cloned(), args.max_events)?;
            splits.push(templates.row(&cluster, prefill, decode, &objectives, requests.len()));
        }
    }
    let best = splits
        .iter()
        .filter(|row| row.meets_target)
        .min_by(|a, b| {
            a.gpus
                .cmp(&b.gpus)
                .then(a.cost_per_hour.total_cmp(&b.cost_per_hour))
        })
        .cloned();
    let report = SweepReport {
        slo_ttft_ms: objectives.ttft_ms,
        slo_tpot_ms: objectives.tpot_ms,
        target_attainment: objectives.attainment,
        requests: requests.len(),
        splits,
        best,
    };
    let mut json = serde_json::to_string_pretty(&report).unwrap_or_default();
    json.push('\n');
    Ok(json)
}

/// The prefill and decode pools' first instances and KV geometry.
struct Templates {
    prefill: (InstanceConfig, InstanceKv),
    decode: (InstanceConfig, InstanceKv),
}

impl Templates {
    fn find(instances: &[InstanceConfig], disagg: &DisaggConfig) -> Option<Self> {
        let first = |role: InstanceRole| {
            let index = instances.iter().position(|i| i.role == role)?;
            Some((instances[index].clone(), *disagg.kv.get(index)?))
        };
        Some(Self {
            prefill: first(InstanceRole::Prefill)?,
            decode: first(InstanceRole::Decode)?,
        })
    }

    /// The file's cluster with `prefill` and `decode` replicas of the templates (ids
    /// `<template>#k`).
    fn cluster(
        &self,
        base: &crate::cluster::config::ClusterConfig,
        disagg: &DisaggConfig,
        prefill: u32,
        decode: u32,
        seed: u64,
    ) -> Result<Cluster, CliError> {
        let mut config = base.clone();
        let mut disagg = disagg.clone();
        config.instances.clear();
        disagg.kv.clear();
        for ((template, kv), count) in [(&self.prefill, prefill), (&self.decode, decode)] {
            for k in 0..count {
                let mut instance = template.clone();
                instance.id = format!("{}#{k}", template.id);
                config.instances.push(instance);
                disagg.kv.push(*kv);
            }
        }
        Ok(Cluster::new_disaggregated(config, disagg, seed)?)
    }

    fn row(
        &self,
        cluster: &Cluster,
        prefill: u32,
        decode: u32,
        objectives: &Objectives,
        requests: usize,
    ) -> SplitRow {
        let summary = cluster.summary();
        let mut met = 0usize;
        for record in cluster.client_records() {
            if record.outcome != Outcome::Completed {
                continue;
            }
            let ttft = record.ttft_us().map_or(f64::INFINITY, |us| us as f64 / 1e3);
            let tpot = record.tpot_us().unwrap_or(0.0) / 1e3;
            let ok = objectives.ttft_ms.is_none_or(|t| ttft <= t)
                && objectives.tpot_ms.is_none_or(|t| tpot <= t);
            met += usize::from(ok);
        }
        let attainment = if requests == 0 {
            1.0
        } else {
            met as f64 / requests as f64
        };
        let (p, d) = (&self.prefill.0, &self.decode.0);
        SplitRow {
            prefill,
            decode,
            gpus: prefill * p.tp + decode * d.tp,
            cost_per_hour: f64::from(prefill) * p.cost_per_hour
                + f64::from(decode) * d.cost_per_hour,
            completed: summary.total.counts.completed,
            ttft_ms: (&summary.total.ttft).into(),
            tpot_ms: (&summary.total.tpot).into(),
            slo_attainment: attainment,
            meets_target: attainment >= objectives.attainment,
        }
    }
}

/// An inclusive replica range (low, high).
type Range = (u32, u32);

/// Parses `P1-P2:D1-D2` (a single number is a one-value range).
fn parse_ranges(text: &str) -> Result<(Range, Range), CliError> {
    let flag_error = |reason: String| CliError::flag("pd-sweep", reason);
    let (prefill, decode) = text.split_once(':').ok_or_else(|| {
        flag_error(format!(
            "expected PREFILL:DECODE ranges like 4-12:1-3, got {text:?}"
        ))
    })?;
    let range = |part: &str, role: &str| -> Result<Range, CliError> {
        let (low, high) = part.split_once('-').unwrap_or((part, part));
        let number = |s: &str| {
            s.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=spec::INSTANCES_MAX).contains(n))
        };
        match (number(low), number(high)) {
            (Some(low), Some(high)) if low <= high => Ok((low, high)),
            _ => Err(flag_error(format!(
                "{role} range {part:?}: expected N or LOW-HIGH with 1 <= LOW <= HIGH <= {}",
                spec::INSTANCES_MAX
            ))),
        }
    };
    let prefill = range(prefill, "prefill")?;
    let decode = range(decode, "decode")?;
    let splits = (prefill.1 - prefill.0 + 1) as usize * (decode.1 - decode.0 + 1) as usize;
    if splits > SPLITS_MAX {
        return Err(flag_error(format!(
            "{splits} splits; at most {SPLITS_MAX} per sweep"
        )));
    }
    Ok((prefill, decode))
}

/// Parses `ttft_ms=N,tpot_ms=N,attainment=F`.
fn parse_objectives(text: &str) -> Result<Objectives, CliError> {
    let flag_error = |reason: String| CliError::flag("pd-sweep-slo", reason);
    let mut objectives = Objectives {
        ttft_ms: None,
        tpot_ms: None,
        attainment: DEFAULT_ATTAINMENT,
    };
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| flag_error(format!("expected KEY=VALUE, got {part:?}")))?;
        let value: f64 = value
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v > 0.0)
            .ok_or_else(|| {
                flag_error(format!("{key}: expected a positive number, got {value:?}"))
            })?;
        match key.trim() {
            "ttft_ms" => objectives.ttft_ms = Some(value),
            "tpot_ms" => objectives.tpot_ms = Some(value),
            "attainment" if value <= 1.0 => objectives.attainment = value,
            "attainment" => {
                return Err(flag_error(format!(
                    "attainment must be in (0, 1], got {value}"
                )));
            }
            other => {
                return Err(flag_error(format!(
                    "unknown objective {other:?}; expected ttft_ms, tpot_ms or attainment"
                )));
            }
        }
    }
    Ok(objectives)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_objectives_parse_and_name_their_flag() {
        assert_eq!(parse_ranges("4-12:1-3").unwrap(), ((4, 12), (1, 3)));
        assert_eq!(parse_ranges("8:2").unwrap(), ((8, 8), (2, 2)));
        for bad in ["8", "0-2:1", "3-2:1", "1:x", "1-100:1-100"] {
            let err = parse_ranges(bad).unwrap_err().to_string();
            assert!(err.contains("--pd-sweep"), "{bad}: {err}");
        }
        let objectives = parse_objectives("ttft_ms=1500, tpot_ms=10,attainment=0.95").unwrap();
        assert_eq!(
            objectives,
            Objectives {
                ttft_ms: Some(1500.0),
                tpot_ms: Some(10.0),
                attainment: 0.95
            }
        );
        assert_eq!(parse_objectives("").unwrap().attainment, DEFAULT_ATTAINMENT);
        for bad in ["ttft=1", "ttft_ms=-1", "attainment=2", "tpot_ms"] {
            let err = parse_objectives(bad).unwrap_err().to_string();
            assert!(err.contains("--pd-sweep-slo"), "{bad}: {err}");
        }
    }
}
