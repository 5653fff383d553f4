//! The flags of `ditto serve` (every one with a `DITTO_*` environment equivalent), shared by
//! the command itself (`cli::serve`), their resolution (`cli::serve_options`) and
//! `--check-config` (`cli::check_config`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::server::run::{DEFAULT_GRPC_ADDR, DEFAULT_HTTP_ADDR};
use crate::twin::limits::Limits;
use crate::twin::store::StoreLimits;

/// Flags of `ditto serve`.
#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// A cluster YAML (see data/clusters/default.yaml); default: the embedded default.
    #[arg(long, env = "DITTO_CONFIG")]
    pub config: Option<PathBuf>,
    /// Model configs for pools whose `model:` is not embedded: `DIR/<name>/config.json`
    /// (HF config.json; `Qwen/Qwen3-32B` is looked up as `DIR/qwen3-32b/config.json`).
    #[arg(long, env = "DITTO_MODEL_DIR")]
    pub model_dir: Option<PathBuf>,
    /// Validate this cluster YAML (with every other flag) as serve would, then exit: 0 when
    /// it would serve, 2 naming the field when not. Nothing binds.
    #[arg(long, value_name = "FILE")]
    pub check_config: Option<PathBuf>,
    /// gRPC listen address.
    #[arg(long, env = "DITTO_GRPC_ADDR", default_value = DEFAULT_GRPC_ADDR)]
    pub grpc_addr: SocketAddr,
    /// HTTP listen address: the latency predictor API, /metrics, /healthz, /readyz. In the
    /// EPP's pod, 127.0.0.1:9011 keeps the API (and its writes) inside the pod.
    #[arg(long, env = "DITTO_HTTP_ADDR", default_value = DEFAULT_HTTP_ADDR)]
    pub http_addr: SocketAddr,
    /// A second HTTP listener serving only /metrics, /healthz and /readyz, with its own
    /// connection cap (--metrics-max-connections), for the kubelet's probes and Prometheus
    /// (e.g. 0.0.0.0:9012). Default: none, everything on --http-addr.
    #[arg(long, env = "DITTO_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Most candidates per routing question.
    #[arg(long, env = "DITTO_MAX_CANDIDATES", default_value_t = Limits::DEFAULT.max_candidates)]
    pub max_candidates: u32,
    /// Most replications per candidate.
    #[arg(long, env = "DITTO_MAX_REPLICATIONS", default_value_t = Limits::DEFAULT.max_replications)]
    pub max_replications: u32,
    /// Longest simulated horizon of a question, seconds.
    #[arg(long, env = "DITTO_MAX_HORIZON_S", default_value_t = Limits::DEFAULT.max_horizon_us / 1_000_000)]
    pub max_horizon_s: u64,
    /// Most simulation events per call.
    #[arg(long, env = "DITTO_MAX_EVENTS_PER_CALL", default_value_t = Limits::DEFAULT.max_events_per_call)]
    pub max_events_per_call: u64,
    /// Most replica-count combinations per capacity forecast.
    #[arg(long, env = "DITTO_MAX_FORECAST_CANDIDATES", default_value_t = Limits::DEFAULT.max_forecast_candidates)]
    pub max_forecast_candidates: u32,
    /// Longest a prediction or forecast may run when the client's grpc-timeout is longer or
    /// absent, milliseconds.
    #[arg(long, env = "DITTO_MAX_CALL_MS", default_value_t = 30_000)]
    pub max_call_ms: u64,
    /// Simulations running at once (0: one per CPU).
    #[arg(long, env = "DITTO_MAX_CONCURRENT_SIMULATIONS", default_value_t = 0)]
    pub max_concurrent_simulations: usize,
    /// Calls waiting for a simulation slot at once; beyond, RESOURCE_EXHAUSTED at once.
    #[arg(long, env = "DITTO_MAX_QUEUED_SIMULATIONS", default_value_t = crate::server::run::DEFAULT_MAX_QUEUED_SIMULATIONS)]
    pub max_queued_simulations: usize,
    /// Most instances in a synced config.
    #[arg(long, env = "DITTO_MAX_INSTANCES", default_value_t = StoreLimits::DEFAULT.max_instances)]
    pub max_instances: usize,
    /// Questions of one PredictRoutingStream answered at once.
    #[arg(long, env = "DITTO_STREAM_IN_FLIGHT", default_value_t = 8)]
    pub stream_in_flight: usize,
    /// Most requests (waiting + running) mirrored per instance.
    #[arg(long, env = "DITTO_MAX_REQUESTS_PER_INSTANCE", default_value_t = StoreLimits::DEFAULT.max_requests_per_instance)]
    pub max_requests_per_instance: usize,
    /// Most lifecycle events in one state update.
    #[arg(long, env = "DITTO_MAX_EVENTS_PER_UPDATE", default_value_t = StoreLimits::DEFAULT.max_events_per_update)]
    pub max_events_per_update: usize,
    /// Most events in one KV event batch.
    #[arg(long, env = "DITTO_MAX_KV_EVENTS_PER_BATCH", default_value_t = StoreLimits::DEFAULT.max_kv_events_per_batch)]
    pub max_kv_events_per_batch: usize,
    /// Snapshots kept for GetSnapshot by generation.
    #[arg(long, env = "DITTO_SNAPSHOT_HISTORY", default_value_t = StoreLimits::DEFAULT.history_len)]
    pub snapshot_history: usize,
    /// Largest gRPC message, bytes.
    #[arg(long, env = "DITTO_MAX_MESSAGE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_message_bytes: usize,
    /// Longest the shutdown waits for in-flight calls, milliseconds (default: --max-call-ms
    /// plus 5000, so a call accepted before SIGTERM is never cut). Keep Kubernetes'
    /// terminationGracePeriodSeconds above it.
    #[arg(long, env = "DITTO_DRAIN_MS")]
    pub drain_ms: Option<u64>,
    /// Seconds between load samples (the KEDA scaler's load forecast, docs/autoscaling.md).
    #[arg(long, env = "DITTO_LOAD_FORECAST_STEP_S", default_value_t = 10.0)]
    pub load_forecast_step_s: f64,
    /// The optional forecast loop exporting ditto_desired_replicas.
    #[command(flatten)]
    pub forecast_loop: crate::cli::forecast_loop::ForecastLoopArgs,
    /// The live mirror: pods to pull state from (see docs/live.md).
    #[command(flatten)]
    pub live: crate::cli::serve_live::LiveArgs,
    /// The latency predictor HTTP API (llm-d's prediction and training servers).
    #[command(flatten)]
    pub predictor: crate::cli::predictor_args::PredictorArgs,
    /// Authentication (and transport security) flags.
    #[command(flatten)]
    pub security: crate::cli::security::SecurityArgs,
    /// Bounds of the HTTP listener (slow clients, connections, bodies).
    #[command(flatten)]
    pub http: crate::cli::http_args::HttpArgs,
    /// Log filter (tracing EnvFilter syntax), logs go to stderr.
    #[arg(long, env = "DITTO_LOG", default_value = "info")]
    pub log: String,
}
