//! Command-line flags (clap). Names follow vLLM's engine arguments where vLLM has the
//! concept. Flags whose default depends on other inputs (GPU blocks, max model length, or
//! a replay trace's recorded server settings) are `Option`s resolved in `cli::run`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// ditto: a deterministic digital twin of an LLM serving cluster.
#[derive(Debug, Parser)]
#[command(name = "ditto", version, about)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Simulate one vLLM instance offline and print a JSON summary on stdout.
    Run(Box<RunArgs>),
    /// Serve the twin's gRPC API (and /metrics, /healthz, /readyz) until SIGTERM/SIGINT.
    Serve(Box<crate::cli::serve_args::ServeArgs>),
    /// Ask a running `ditto serve` where to route a request and print a table.
    Predict(Box<crate::cli::predict::PredictArgs>),
    /// Measure every performance case (offline runs, what-if latency, memory) and print them.
    Bench(Box<crate::cli::bench::BenchArgs>),
    /// Replay measured vLLM runs and print ditto's errors against them.
    Validate(Box<crate::cli::validate::ValidateArgs>),
    /// Fit the calibrated step-time model to measured runs and write its coefficients.
    Calibrate(Box<crate::cli::calibrate::CalibrateArgs>),
}

/// Flags of `ditto run`.
#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    /// Model: an embedded model name (data/model_configs/) or a path to a HF config.json
    /// (default: the replay trace's model if embedded, else llama-3.1-8b-instruct).
    #[arg(long)]
    pub model: Option<String>,
    /// GPU: an embedded GPU name (H100, A100-80, L40S, ...).
    #[arg(long, default_value = "H100")]
    pub gpu: String,
    /// Tensor-parallel degree (default 1, or the replay trace's).
    #[arg(long)]
    pub tp: Option<u32>,
    /// Step-time model: calibrated (fitted on measured vLLM runs, docs/fidelity.md),
    /// physics, roofline, blackbox, or a coefficients file written by `ditto calibrate`.
    #[arg(long, default_value = "calibrated")]
    pub latency_model: String,
    /// Requests to generate.
    #[arg(long, default_value_t = 1000)]
    pub num_requests: u64,
    /// Arrival rate in requests per second.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Arrival process: poisson or constant.
    #[arg(long, default_value = "poisson")]
    pub arrival: String,
    /// Prompt lengths: gaussian MEAN,STDEV,MIN,MAX (clamped).
    #[arg(long, default_value = "512,256,2,7000")]
    pub input_tokens: String,
    /// Output lengths: gaussian MEAN,STDEV,MIN,MAX (clamped).
    #[arg(long, default_value = "512,256,2,7000")]
    pub output_tokens: String,
    /// Seed of every random stream.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// vLLM --max-num-seqs (default 256, or the replay trace's).
    #[arg(long)]
    pub max_num_seqs: Option<u32>,
    /// vLLM --max-num-batched-tokens (default 2048, or the replay trace's).
    #[arg(long)]
    pub max_num_batched_tokens: Option<u32>,
    /// vLLM --max-model-len (default: the model's max_position_embeddings).
    #[arg(long)]
    pub max_model_len: Option<u32>,
    /// vLLM --long-prefill-token-threshold (0: no cap beyond the budget).
    #[arg(long, default_value_t = 0)]
    pub long_prefill_token_threshold: u32,
    /// vLLM --block-size (default 16, or the replay trace's).
    #[arg(long)]
    pub block_size: Option<u32>,
    /// GPU KV blocks (default: derived from GPU memory, or the replay trace's).
    #[arg(long)]
    pub num_gpu_blocks: Option<u32>,
    /// vLLM --gpu-memory-utilization, used to derive the GPU blocks.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// CPU offload tier size in blocks (0: off).
    #[arg(long, default_value_t = 0)]
    pub num_cpu_blocks: u32,
    /// Host-to-GPU bandwidth for CPU-tier reloads, in GB/s.
    #[arg(long, default_value_t = 25.0)]
    pub cpu_offload_bandwidth_gbps: f64,
    /// vLLM --cpu-offload-gb: GiB of weights per GPU held in host memory (0: none). Frees
    /// that much GPU memory for KV blocks; every step reads them over the host link.
    #[arg(long, default_value_t = 0.0)]
    pub cpu_offload_gb: f64,
    /// vLLM's native KV-offload connector with this many bytes of CPU tier (its
    /// `--kv-transfer-config` `OffloadingConnector` `cpu_bytes_to_use`; absent: none). Its
    /// scheduler's failed stores walk the whole tier; that host time bounds the step.
    #[arg(long)]
    pub kv_offload_cpu_bytes: Option<u64>,
    /// Disable chunked prefill (a prefill must then fit one step's budget).
    #[arg(long)]
    pub no_enable_chunked_prefill: bool,
    /// Disable prefix caching.
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    /// Scheduling policy: fcfs, priority or sjf.
    #[arg(long, default_value = "fcfs")]
    pub scheduling_policy: String,
    /// A YAML workload spec (see docs/workload.md); replaces the generator flags.
    #[arg(long, conflicts_with = "trace")]
    pub workload: Option<PathBuf>,
    /// A trace to replay: .csv, .jsonl or replay_requests.json.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write one JSON line per request (with every inter-token gap) to this file.
    #[arg(long)]
    pub per_request: Option<PathBuf>,
    /// Stop with an error after this many simulation events.
    #[arg(long, default_value_t = 1_000_000_000)]
    pub max_events: u64,
    /// Simulate a cluster from this YAML file (see docs/cluster.md), or `default` for the
    /// embedded 4 x llama-3.1-8b-instruct/H100 cluster.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Simulate a cluster of N copies of the instance the flags describe.
    #[arg(long, conflicts_with = "cluster")]
    pub instances: Option<u32>,
    /// Routing policy of the cluster: round-robin, random, least-loaded, vllm-dp (vLLM's
    /// data-parallel balancer; pair it with --refresh-interval-ms 100, vLLM's publishing
    /// period) or weighted (llm-d's default profile).
    #[arg(long)]
    pub routing: Option<String>,
    /// Refresh interval of every router signal in ms (0: live); default the cluster's (50).
    #[arg(long)]
    pub refresh_interval_ms: Option<f64>,
    /// Interval of the KV-usage timeline in the summary, in seconds (0: no timeline).
    #[arg(long, default_value_t = 10.0)]
    pub kv_sample_interval_s: f64,
    /// With a cluster file's `autoscaler:` section: the policies to compare on the same load
    /// (comma-separated: static, slo-aware, queue-depth, saturation, predictive, or `all`);
    /// default the section's `policies` (all five unless listed).
    #[arg(long)]
    pub policies: Option<String>,
    /// With an autoscaler: write an SVG plot of load, replicas and P90 latency over time.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// With an autoscaler: print the comparison table on stdout instead of the JSON.
    #[arg(long)]
    pub table: bool,
    /// P:D ratio sweep of a P/D cluster file: `PREFILL:DECODE` replica ranges (e.g.
    /// `4-12:1-3`); prints SLO attainment and GPUs per split (docs/disaggregation.md).
    #[arg(long, requires = "cluster")]
    pub pd_sweep: Option<String>,
    /// The sweep's objectives: `ttft_ms=N,tpot_ms=N,attainment=F` (each optional;
    /// attainment defaults to 0.9).
    #[arg(long, requires = "pd_sweep")]
    pub pd_sweep_slo: Option<String>,
}
