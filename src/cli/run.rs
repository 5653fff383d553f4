//! `ditto run`: resolve the flags into an engine, a latency model and a request stream,
//! simulate, and produce the JSON summary (and optional per-request lines).

use serde::Serialize;

use super::args::RunArgs;
use super::autoscale_report;
use super::autoscale_run::{self, AutoscaleReport};
use super::cluster_run;
use super::error::CliError;
use super::latency::resolve_latency;
use super::progress::{self, Progress};
use super::report::{RequestJson, SummaryJson};
use super::run_config::{engine_config, weight_offload};
pub use super::run_output::{RunInfo, RunOutput};
pub use super::run_source::requests;
use super::run_source::{Source, load_model, load_source};
use crate::catalog;
use crate::cluster::Cluster;
use crate::cluster::config::{InstanceConfig, InstanceRole};
use crate::sim::{Engine, EngineConfig, RequestSpec};

/// What was simulated: one engine, or a cluster.
#[derive(Debug)]
pub enum Simulated {
    /// A single instance.
    Engine(Box<Engine>),
    /// A cluster.
    Cluster(Box<Cluster>),
    /// An autoscaled pool under each policy (`autoscale_run`); `table` prints the
    /// comparison table instead of the JSON.
    Autoscaled {
        /// The comparison.
        report: Box<AutoscaleReport>,
        /// Print the table instead of the JSON.
        table: bool,
    },
}

/// What an autoscaled run prints as JSON.
#[derive(Serialize)]
struct AutoscaledOutput<'a> {
    autoscaling: &'a autoscale_run::AutoscaleJson,
    run: &'a RunInfo,
}

/// A finished run.
#[derive(Debug)]
pub struct RunResult {
    /// The printed output.
    pub output: RunOutput,
    /// The simulation at the end of the run (metrics, cache state; a single engine keeps
    /// per-request records only when `--per-request` was given).
    pub simulated: Simulated,
}

impl RunResult {
    /// The summary as pretty JSON with a trailing newline (byte-stable per input and seed).
    pub fn summary_json(&self) -> String {
        if let Simulated::Autoscaled { report, table } = &self.simulated {
            if *table {
                return autoscale_report::table(&report.json);
            }
            let output = AutoscaledOutput {
                autoscaling: &report.json,
                run: &self.output.run,
            };
            let mut text = serde_json::to_string_pretty(&output).unwrap_or_default();
            text.push('\n');
            return text;
        }
        let mut text = serde_json::to_string_pretty(&self.output).unwrap_or_default();
        text.push('\n');
        text
    }

    /// One JSON line per request, in the order requests left each instance (instances in
    /// config order, then rejected requests).
    pub fn per_request_jsonl(&self) -> String {
        let mut text = String::new();
        let mut push = |record: &crate::sim::RequestRecord, instance: Option<&str>| {
            let mut json = RequestJson::from(record);
            json.instance = instance.map(str::to_owned);
            text.push_str(&serde_json::to_string(&json).unwrap_or_default());
            text.push('\n');
        };
        match &self.simulated {
            Simulated::Engine(engine) => {
                for record in &engine.metrics().records {
                    push(record, None);
                }
            }
            Simulated::Cluster(cluster) => {
                for (engine, instance) in cluster.engines().iter().zip(&cluster.config().instances)
                {
                    for record in &engine.metrics().records {
                        push(record, Some(&instance.id));
                    }
                }
                for record in cluster.rejected_records() {
                    push(record, None);
                }
            }
            Simulated::Autoscaled { .. } => {}
        }
        text
    }

    /// Request accounting, steps and events of the run (for the stderr diagnostics).
    pub fn totals(&self) -> (crate::sim::metrics::Counts, u64) {
        match &self.simulated {
            Simulated::Engine(engine) => (engine.counts(), engine.events_processed()),
            Simulated::Cluster(cluster) => (cluster.counts(), cluster.events_processed()),
            Simulated::Autoscaled { report, .. } => {
                let mut counts = crate::sim::metrics::Counts::default();
                let mut events = 0;
                for outcome in &report.outcomes {
                    counts.add(&outcome.counts);
                    events += outcome.events;
                }
                (counts, events)
            }
        }
    }
}

/// The model simulated when neither `--model` nor a replay trace names one.
pub const DEFAULT_MODEL: &str = "llama-3.1-8b-instruct";

/// Runs `ditto run` with `args`.
pub fn execute(args: &RunArgs) -> Result<RunResult, CliError> {
    let source = load_source(args)?;
    let arch = match (&args.model, &source) {
        (Some(model), _) => load_model(model)?,
        (None, Source::Trace(_, _, _, Some(model_id))) => {
            catalog::model(model_id).or_else(|_| catalog::model(DEFAULT_MODEL))?
        }
        (None, _) => catalog::model(DEFAULT_MODEL)?,
    };
    let gpu = catalog::gpu(&args.gpu)?;
    let replay = match &source {
        Source::Trace(_, replay, _, _) => *replay,
        Source::Generated(..) => None,
    };
    let tp = args
        .tp
        .or(replay.map(|r| r.tensor_parallelism))
        .unwrap_or(1);
    if tp == 0 {
        return Err(CliError::flag("tp", "must be at least 1"));
    }
    let offload = weight_offload(args, &arch, &gpu, tp)?;
    let latency = resolve_latency(&args.latency_model, &arch, &gpu, tp)?
        .with_weight_offload(&offload)
        .map_err(|err| CliError::flag("cpu-offload-gb", err.to_string()))?;
    let config = engine_config(args, &arch, &gpu, tp, replay, &offload)?;
    let seed = match &source {
        Source::Generated(spec, _) => spec.seed,
        Source::Trace(..) => args.seed,
    };
    let workload_name = match &source {
        Source::Generated(_, name) | Source::Trace(_, _, name, _) => name.clone(),
    };
    let run = Resolved {
        source,
        workload: workload_name,
        seed,
    };
    if cluster_run::wanted(args) {
        let template = InstanceConfig {
            id: String::new(),
            model: arch.name.clone(),
            model_config_json: None,
            gpu: gpu.name.clone(),
            tp,
            role: InstanceRole::Both,
            engine: config,
            latency,
            cost_per_hour: 0.0,
        };
        return run_cluster(args, template, run);
    }
    let info = RunInfo {
        model: arch.name.clone(),
        gpu: gpu.name.clone(),
        tp,
        latency_model: args.latency_model.clone(),
        num_gpu_blocks: config.num_gpu_blocks,
        block_size: config.block_size,
        max_num_seqs: config.max_num_seqs,
        max_num_batched_tokens: config.max_num_batched_tokens,
        max_model_len: config.max_model_len,
        scheduling_policy: config.scheduling_policy.as_str(),
        workload: run.workload,
        seed,
        cluster: None,
    };
    run_engine(args, config, latency, run.source, info)
}

/// A run's requests, where they came from and its seed.
struct Resolved {
    source: Source,
    workload: String,
    seed: u64,
}

/// A cluster run (or, with an `autoscaler:` section, the autoscaling comparison) of
/// instances like `template`.
fn run_cluster(
    args: &RunArgs,
    template: InstanceConfig,
    run: Resolved,
) -> Result<RunResult, CliError> {
    let (cluster_config, disaggregation) = cluster_run::cluster_config(args, template)?;
    if let Some(autoscale) = autoscale_run::section(args)? {
        if disaggregation.is_some() {
            return Err(CliError::flag(
                "cluster",
                "an autoscaler section needs a cluster without disaggregation",
            ));
        }
        return run_autoscaled(args, &cluster_config, &autoscale, run);
    }
    if args.policies.is_some() || args.plot.is_some() || args.table {
        return Err(CliError::flag(
            "policies",
            "--policies, --plot and --table need a cluster file with an autoscaler section",
        ));
    }
    let mut cluster = match disaggregation {
        Some(disagg) => Cluster::new_disaggregated(cluster_config, disagg, run.seed)?,
        None => Cluster::new(cluster_config, run.seed)?,
    };
    match run.source {
        Source::Generated(spec, _) => cluster.run(spec.generator()?, args.max_events)?,
        Source::Trace(requests, ..) => cluster.run(requests, args.max_events)?,
    }
    let output = cluster_run::output(&cluster, run.workload, run.seed);
    Ok(RunResult {
        output,
        simulated: Simulated::Cluster(Box::new(cluster)),
    })
}

/// A single engine's run.
fn run_engine(
    args: &RunArgs,
    config: EngineConfig,
    latency: crate::sim::latency::LatencyModel,
    source: Source,
    info: RunInfo,
) -> Result<RunResult, CliError> {
    // Records only for the per-request output; the summary is the same without them.
    let config = EngineConfig {
        keep_request_records: args.per_request.is_some(),
        ..config
    };
    let mut engine = Engine::new(config, latency)?;
    // Requests fed to the engine, on stderr when it is a terminal (stdout is the JSON).
    let shown = progress::wanted(false);
    match source {
        Source::Generated(spec, _) => {
            let bar = Progress::new(shown, spec.num_requests.unwrap_or(0), "simulating");
            let requests = spec.generator()?.inspect(|_| bar.inc(1));
            engine.run(requests, args.max_events)?;
        }
        Source::Trace(requests, ..) => {
            let bar = Progress::new(shown, requests.len() as u64, "simulating");
            engine.run(
                requests.into_iter().inspect(|_| bar.inc(1)),
                args.max_events,
            )?;
        }
    }
    let summary = engine.summary();
    Ok(RunResult {
        output: RunOutput {
            summary: SummaryJson::from(&summary),
            rejected_requests: None,
            disaggregation: None,
            instances: None,
            run: info,
        },
        simulated: Simulated::Engine(Box::new(engine)),
    })
}

/// The autoscaling comparison: every policy on the same requests.
fn run_autoscaled(
    args: &RunArgs,
    base: &crate::cluster::ClusterConfig,
    autoscale: &crate::cluster::autoscale::AutoscaleConfig,
    run: Resolved,
) -> Result<RunResult, CliError> {
    let source = &run.source;
    let make = || -> Result<Box<dyn Iterator<Item = RequestSpec>>, CliError> {
        match source {
            Source::Generated(spec, _) => Ok(Box::new(spec.generator()?)),
            Source::Trace(requests, ..) => Ok(Box::new(requests.clone().into_iter())),
        }
    };
    let report =
        autoscale_run::execute(args, base, autoscale, make, run.workload.clone(), run.seed)?;
    eprint!("{}", autoscale_report::table(&report.json));
    let info = RunInfo::of_instance(&base.instances[0], run.workload, run.seed, None);
    Ok(RunResult {
        output: RunOutput {
            summary: SummaryJson::from(&crate::sim::metrics::Summary::default()),
            rejected_requests: None,
            instances: None,
            disaggregation: None,
            run: info,
        },
        simulated: Simulated::Autoscaled {
            report: Box::new(report),
            table: args.table,
        },
    })
}
