//! `ditto run`: resolve the flags into an engine, a latency model and a request stream,
//! simulate, and produce the JSON summary (and optional per-request lines).

use std::path::Path;

use serde::Serialize;

use super::args::RunArgs;
use super::autoscale_report;
use super::autoscale_run::{self, AutoscaleReport};
use super::cluster_run::{self, ClusterInfo, InstanceJson};
use super::error::CliError;
use super::latency::resolve_latency;
use super::progress::{self, Progress};
use super::report::{RequestJson, SummaryJson};
use crate::catalog;
use crate::cluster::Cluster;
use crate::cluster::config::{InstanceConfig, InstanceRole};
use crate::sim::capacity;
use crate::sim::latency::{GpuSpec, ModelArch};
use crate::sim::{Engine, EngineConfig, RequestSpec, SchedulingPolicy};
use crate::workload::{ArrivalProcess, LengthDist, ReplayConfig, TraceFormat, WorkloadSpec};

/// The resolved settings of a run, echoed in the output so any result can be reproduced.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunInfo {
    /// Model name.
    pub model: String,
    /// GPU name.
    pub gpu: String,
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Latency model.
    pub latency_model: String,
    /// GPU KV blocks.
    pub num_gpu_blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Running-request limit.
    pub max_num_seqs: u32,
    /// Step token budget.
    pub max_num_batched_tokens: u32,
    /// Longest accepted sequence.
    pub max_model_len: u32,
    /// Scheduling policy.
    pub scheduling_policy: &'static str,
    /// Where requests came from: `flags`, a workload file or a trace file.
    pub workload: String,
    /// Seed of the random streams.
    pub seed: u64,
    /// Cluster settings (cluster runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterInfo>,
}

/// What `ditto run` prints: the summary fields, then (for a cluster) the rejected count and
/// each instance's summary, then the resolved settings.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunOutput {
    /// The run's aggregate outcome.
    #[serde(flatten)]
    pub summary: SummaryJson,
    /// Requests refused at admission (cluster runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_requests: Option<u64>,
    /// Per-instance summaries (cluster runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<InstanceJson>>,
    /// Per-role metrics (disaggregated cluster runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disaggregation: Option<cluster_run::DisaggJson>,
    /// The resolved settings.
    pub run: RunInfo,
}

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

/// Where the run's requests come from.
enum Source {
    Generated(Box<WorkloadSpec>, String),
    /// Requests, the replay file's server settings, the file name, its model id.
    Trace(
        Vec<RequestSpec>,
        Option<ReplayConfig>,
        String,
        Option<String>,
    ),
}

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
    let latency = resolve_latency(&args.latency_model, &arch, &gpu, tp)?;
    let config = engine_config(args, &arch, &gpu, tp, replay)?;
    let seed = match &source {
        Source::Generated(spec, _) => spec.seed,
        Source::Trace(..) => args.seed,
    };
    let workload_name = match &source {
        Source::Generated(_, name) | Source::Trace(_, _, name, _) => name.clone(),
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
        let (cluster_config, disaggregation) = cluster_run::cluster_config(args, template)?;
        if let Some(autoscale) = autoscale_run::section(args)? {
            if disaggregation.is_some() {
                return Err(CliError::flag(
                    "cluster",
                    "an autoscaler section needs a cluster without disaggregation",
                ));
            }
            return run_autoscaled(
                args,
                &cluster_config,
                &autoscale,
                source,
                workload_name,
                seed,
            );
        }
        if args.policies.is_some() || args.plot.is_some() || args.table {
            return Err(CliError::flag(
                "policies",
                "--policies, --plot and --table need a cluster file with an autoscaler section",
            ));
        }
        let mut cluster = match disaggregation {
            Some(disagg) => Cluster::new_disaggregated(cluster_config, disagg, seed)?,
            None => Cluster::new(cluster_config, seed)?,
        };
        match source {
            Source::Generated(spec, _) => cluster.run(spec.generator()?, args.max_events)?,
            Source::Trace(requests, ..) => cluster.run(requests, args.max_events)?,
        }
        let output = cluster_run::output(&cluster, workload_name, seed);
        return Ok(RunResult {
            output,
            simulated: Simulated::Cluster(Box::new(cluster)),
        });
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
        workload: workload_name,
        seed,
        cluster: None,
    };
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
    source: Source,
    workload: String,
    seed: u64,
) -> Result<RunResult, CliError> {
    let make = || -> Result<Box<dyn Iterator<Item = RequestSpec>>, CliError> {
        match &source {
            Source::Generated(spec, _) => Ok(Box::new(spec.generator()?)),
            Source::Trace(requests, ..) => Ok(Box::new(requests.clone().into_iter())),
        }
    };
    let report = autoscale_run::execute(args, base, autoscale, make, workload.clone(), seed)?;
    eprint!("{}", autoscale_report::table(&report.json));
    let first = &base.instances[0];
    let run = RunInfo {
        model: first.model.clone(),
        gpu: first.gpu.clone(),
        tp: first.tp,
        latency_model: first.latency.kind().as_str().to_owned(),
        num_gpu_blocks: first.engine.num_gpu_blocks,
        block_size: first.engine.block_size,
        max_num_seqs: first.engine.max_num_seqs,
        max_num_batched_tokens: first.engine.max_num_batched_tokens,
        max_model_len: first.engine.max_model_len,
        scheduling_policy: first.engine.scheduling_policy.as_str(),
        workload,
        seed,
        cluster: None,
    };
    Ok(RunResult {
        output: RunOutput {
            summary: SummaryJson::from(&crate::sim::metrics::Summary::default()),
            rejected_requests: None,
            instances: None,
            disaggregation: None,
            run,
        },
        simulated: Simulated::Autoscaled {
            report: Box::new(report),
            table: args.table,
        },
    })
}

fn load_model(model: &str) -> Result<ModelArch, CliError> {
    let path = Path::new(model);
    if model.ends_with(".json") || path.is_file() {
        let text = read(path)?;
        let name = path
            .parent()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .filter(|n| !n.is_empty())
            .unwrap_or(model);
        return catalog::parse_model_config(name, &text).map_err(|err| CliError::BadFile {
            path: path.to_path_buf(),
            reason: err.to_string(),
        });
    }
    Ok(catalog::model(model)?)
}

fn load_source(args: &RunArgs) -> Result<Source, CliError> {
    if let Some(path) = &args.trace {
        let format = TraceFormat::from_path(path).map_err(|err| CliError::BadFile {
            path: path.clone(),
            reason: err.to_string(),
        })?;
        let trace = format
            .parse(&read(path)?)
            .map_err(|err| CliError::BadFile {
                path: path.clone(),
                reason: err.to_string(),
            })?;
        // Traces may carry absolute (e.g. Unix) times: the run starts at the first arrival.
        let mut requests = trace.requests;
        let origin = requests.first().map_or(0, |r| r.arrival_us);
        for request in &mut requests {
            request.arrival_us -= origin;
            request.deadline_us = request.deadline_us.map(|d| d.saturating_sub(origin));
        }
        return Ok(Source::Trace(
            requests,
            trace.replay_config,
            path.display().to_string(),
            trace.model_id,
        ));
    }
    if let Some(path) = &args.workload {
        let spec = WorkloadSpec::from_yaml(&read(path)?).map_err(|err| CliError::BadFile {
            path: path.clone(),
            reason: err.to_string(),
        })?;
        return Ok(Source::Generated(
            Box::new(spec),
            path.display().to_string(),
        ));
    }
    let arrival = match args.arrival.trim().to_ascii_lowercase().as_str() {
        "poisson" => ArrivalProcess::Poisson,
        "constant" => ArrivalProcess::Constant,
        other => {
            return Err(CliError::flag(
                "arrival",
                format!("unknown process {other:?}; expected poisson or constant"),
            ));
        }
    };
    if !(args.rate.is_finite() && args.rate > 0.0) {
        return Err(CliError::flag(
            "rate",
            format!("must be a positive number (got {})", args.rate),
        ));
    }
    if args.num_requests == 0 {
        return Err(CliError::flag("num-requests", "must be at least 1"));
    }
    let input = gaussian_flag("input-tokens", &args.input_tokens)?;
    let output = gaussian_flag("output-tokens", &args.output_tokens)?;
    let spec = WorkloadSpec::single_client(
        args.seed,
        args.num_requests,
        args.rate,
        arrival,
        input,
        output,
    );
    spec.validate()
        .map_err(|err| CliError::flag("rate", err.to_string()))?;
    Ok(Source::Generated(Box::new(spec), "flags".to_owned()))
}

/// The run's requests (trace, workload file or generator flags), in arrival order, and the
/// seed: what `--pd-sweep` replays on every split.
pub fn requests(args: &RunArgs) -> Result<(Vec<RequestSpec>, u64), CliError> {
    match load_source(args)? {
        Source::Generated(spec, _) => Ok((spec.generator()?.collect(), spec.seed)),
        Source::Trace(requests, ..) => Ok((requests, args.seed)),
    }
}

/// Parses `MEAN,STDEV,MIN,MAX` into a clamped gaussian.
fn gaussian_flag(flag: &'static str, text: &str) -> Result<LengthDist, CliError> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.len() != 4 {
        return Err(CliError::flag(
            flag,
            format!("expected MEAN,STDEV,MIN,MAX, got {text:?}"),
        ));
    }
    let number = |index: usize, name: &str| -> Result<f64, CliError> {
        parts[index]
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| {
                CliError::flag(
                    flag,
                    format!(
                        "{name} must be a non-negative number, got {:?}",
                        parts[index]
                    ),
                )
            })
    };
    let (mean, stdev) = (number(0, "MEAN")?, number(1, "STDEV")?);
    let (min, max) = (number(2, "MIN")?, number(3, "MAX")?);
    if min < 1.0
        || max > f64::from(u32::MAX)
        || min > max
        || min.fract() != 0.0
        || max.fract() != 0.0
    {
        return Err(CliError::flag(
            flag,
            format!("MIN and MAX must be whole numbers with 1 <= MIN <= MAX, got {min} and {max}"),
        ));
    }
    Ok(LengthDist::gaussian(mean, stdev, min as u32, max as u32))
}

fn engine_config(
    args: &RunArgs,
    arch: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
    replay: Option<ReplayConfig>,
) -> Result<EngineConfig, CliError> {
    let block_size = args
        .block_size
        .or(replay.map(|r| r.block_size))
        .unwrap_or(16);
    if block_size == 0 {
        return Err(CliError::flag("block-size", "must be at least 1"));
    }
    let num_gpu_blocks = match args.num_gpu_blocks {
        Some(0) => return Err(CliError::flag("num-gpu-blocks", "must be at least 1")),
        Some(blocks) => blocks,
        None => match replay.map(|r| r.kv_blocks_total_gpu).filter(|&b| b > 0) {
            Some(blocks) => u32::try_from(blocks).map_err(|_| {
                CliError::flag(
                    "trace",
                    format!("kv_blocks_total_gpu {blocks} is too large"),
                )
            })?,
            None => {
                let utilization = args.gpu_memory_utilization;
                if !(utilization > 0.0 && utilization <= 1.0) {
                    return Err(CliError::flag(
                        "gpu-memory-utilization",
                        format!("must be in (0, 1], got {utilization}"),
                    ));
                }
                capacity::num_gpu_blocks(arch, gpu, tp, utilization, block_size)?
            }
        },
    };
    let max_model_len = args.max_model_len.unwrap_or(arch.max_position_embeddings);
    let scheduling_policy = SchedulingPolicy::parse(&args.scheduling_policy).ok_or_else(|| {
        CliError::flag(
            "scheduling-policy",
            format!(
                "unknown policy {:?}; expected fcfs, priority or sjf",
                args.scheduling_policy
            ),
        )
    })?;
    if !(args.cpu_offload_bandwidth_gbps.is_finite() && args.cpu_offload_bandwidth_gbps > 0.0) {
        return Err(CliError::flag(
            "cpu-offload-bandwidth-gbps",
            "must be a positive number",
        ));
    }
    if !(args.kv_sample_interval_s.is_finite() && args.kv_sample_interval_s >= 0.0) {
        return Err(CliError::flag(
            "kv-sample-interval-s",
            "must be a non-negative number",
        ));
    }
    let block_bytes = arch.kv_bytes_per_block(tp, block_size);
    let cpu_block_load_us =
        (block_bytes as f64 / (args.cpu_offload_bandwidth_gbps * 1e3)).ceil() as u64;
    let mut config = EngineConfig::vllm_defaults(num_gpu_blocks, max_model_len);
    config.block_size = block_size;
    config.max_num_seqs = args
        .max_num_seqs
        .or(replay.map(|r| r.max_num_seqs))
        .unwrap_or(256);
    config.max_num_batched_tokens = args
        .max_num_batched_tokens
        .or(replay.map(|r| r.max_num_batched_tokens))
        .unwrap_or(2048);
    config.long_prefill_token_threshold = args.long_prefill_token_threshold;
    config.enable_chunked_prefill = !args.no_enable_chunked_prefill;
    config.enable_prefix_caching = !args.no_enable_prefix_caching;
    config.num_cpu_blocks = args.num_cpu_blocks;
    config.cpu_block_load_us = cpu_block_load_us;
    config.scheduling_policy = scheduling_policy;
    config.kv_sample_interval_us = (args.kv_sample_interval_s * 1e6).round() as u64;
    config.record_token_gaps = args.per_request.is_some();
    config.validate().map_err(|err| CliError::BadFlag {
        flag: flag_of_field(err.field),
        reason: err.reason.clone(),
    })?;
    Ok(config)
}

/// The CLI flag that sets an engine config field.
fn flag_of_field(field: &str) -> &'static str {
    match field {
        "block_size" => "block-size",
        "num_gpu_blocks" => "num-gpu-blocks",
        "num_cpu_blocks" => "num-cpu-blocks",
        "max_num_seqs" => "max-num-seqs",
        "max_num_batched_tokens" => "max-num-batched-tokens",
        "max_model_len" => "max-model-len",
        _ => "config",
    }
}

fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|source| CliError::Io {
        path: path.to_path_buf(),
        source,
    })
}
