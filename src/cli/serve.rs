//! `ditto serve`: runs the twin's gRPC server (and its HTTP metrics/health side) until
//! SIGTERM or SIGINT.
//!
//! With no flags it serves the embedded default cluster (4 x llama-3.1-8b-instruct on H100)
//! on 0.0.0.0:9010 (gRPC) and 0.0.0.0:9011 (HTTP), ready at once. Every flag has a
//! `DITTO_*` environment equivalent. Exit codes: 0 after a graceful shutdown, 2 for a bad
//! flag, cluster file, model config, kubeconfig, TLS or calibration file (checked before
//! anything binds, the message naming the flag or field, as every other ditto command and
//! clap itself do), 1 when the server cannot start or fails. With `--check-config FILE` it only
//! validates (see `cli::check_config`): exit 0, or 2 naming the field.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

pub use super::error::ServeCommandError;
use crate::cluster::spec::{default_cluster, parse_cluster_yaml_with};
use crate::server::run::{DEFAULT_GRPC_ADDR, DEFAULT_HTTP_ADDR};
use crate::server::{InitialConfig, ServerOptions, serve_until_signal};
use crate::twin::limits::Limits;
use crate::twin::snapshot::TwinSettings;
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

fn positive<T: PartialEq + Default>(value: T, flag: &'static str) -> Result<T, ServeCommandError> {
    if value == T::default() {
        return Err(ServeCommandError::BadFlag {
            flag,
            reason: "must be at least 1".to_owned(),
        });
    }
    Ok(value)
}

/// Resolves the flags into server options (reads and validates the cluster file).
pub fn options(args: &ServeArgs) -> Result<ServerOptions, ServeCommandError> {
    let mut yaml = None;
    let mut disaggregation = None;
    let cluster = match &args.config {
        None => default_cluster(),
        Some(path) => {
            let bad = |reason: String| ServeCommandError::BadConfig {
                path: path.clone(),
                reason,
            };
            let text = std::fs::read_to_string(path).map_err(|err| bad(err.to_string()))?;
            let files = crate::cli::model_files::FsModelFiles::new(args.model_dir.as_deref());
            let cluster =
                parse_cluster_yaml_with(&text, Some(&files)).map_err(|err| bad(err.to_string()))?;
            disaggregation = crate::cluster::spec::disaggregation_section(&text)
                .and_then(|section| {
                    section
                        .as_ref()
                        .map(crate::twin::snapshot::PdSettings::resolve)
                        .transpose()
                })
                .map_err(|err| bad(err.to_string()))?;
            yaml = Some(text);
            cluster
        }
    };
    let mut live = crate::cli::serve_live::live_config(
        &args.live,
        &cluster,
        yaml.as_deref(),
        args.model_dir.as_deref(),
    )
    .map_err(|(field, reason)| match &args.config {
        Some(path) if field.starts_with("sources") => ServeCommandError::BadConfig {
            path: path.clone(),
            reason: format!("{field}: {reason}"),
        },
        _ => ServeCommandError::BadLiveFlag {
            flag: field,
            reason,
        },
    })?;
    let mut options = ServerOptions::new(args.grpc_addr, args.http_addr);
    options.service.twin = Limits {
        max_candidates: positive(args.max_candidates, "max-candidates")?,
        max_replications: positive(args.max_replications, "max-replications")?,
        max_horizon_us: positive(args.max_horizon_s, "max-horizon-s")?.saturating_mul(1_000_000),
        max_events_per_call: positive(args.max_events_per_call, "max-events-per-call")?,
        max_forecast_candidates: positive(args.max_forecast_candidates, "max-forecast-candidates")?,
        deadline: None,
        cancel: None,
    };
    options.service.max_call = Duration::from_millis(positive(args.max_call_ms, "max-call-ms")?);
    if args.max_concurrent_simulations > 0 {
        options.service.max_concurrent_simulations = args.max_concurrent_simulations;
    }
    options.service.stream_in_flight = positive(args.stream_in_flight, "stream-in-flight")?;
    options.service.max_queued_simulations = args.max_queued_simulations;
    options.store = StoreLimits {
        history_len: positive(args.snapshot_history, "snapshot-history")?,
        max_instances: positive(args.max_instances, "max-instances")?,
        max_requests_per_instance: positive(
            args.max_requests_per_instance,
            "max-requests-per-instance",
        )?,
        max_events_per_update: positive(args.max_events_per_update, "max-events-per-update")?,
        max_kv_events_per_batch: positive(args.max_kv_events_per_batch, "max-kv-events-per-batch")?,
        ..StoreLimits::DEFAULT
    };
    options.max_message_bytes = positive(args.max_message_bytes, "max-message-bytes")?;
    options.drain = args.drain_ms.map_or(
        options.service.max_call + crate::server::run::DRAIN_MARGIN,
        Duration::from_millis,
    );
    options.forecast_loop = args.forecast_loop.options()?;
    let step = args.load_forecast_step_s;
    if !(step.is_finite() && (0.05..=3_600.0).contains(&step)) {
        return Err(ServeCommandError::BadFlag {
            flag: "load-forecast-step-s",
            reason: "must be in [0.05, 3600] seconds".to_owned(),
        });
    }
    options.load_forecast_step = Duration::from_secs_f64(step);
    options.auth = args.security.auth()?;
    options.tls = args.security.tls()?;
    options.predictor = args.predictor.options()?;
    options.http = args.http.limits()?;
    options.metrics_max_connections = args.http.metrics_max_connections()?;
    options.grpc = args.http.grpc_limits()?;
    options.metrics_addr = args.metrics_addr;
    if let Some(metrics) = args.metrics_addr
        && metrics.port() != 0
    {
        for (flag, addr) in [("http-addr", args.http_addr), ("grpc-addr", args.grpc_addr)] {
            if addr.port() == metrics.port()
                && (addr.ip() == metrics.ip()
                    || addr.ip().is_unspecified()
                    || metrics.ip().is_unspecified())
            {
                return Err(ServeCommandError::BadFlag {
                    flag: "metrics-addr",
                    reason: format!("{metrics} overlaps --{flag} {addr}: use another port"),
                });
            }
        }
    }
    // The YAML's `disaggregation:` section rides in the twin settings (docs/disaggregation.md).
    if let Some(live) = live.as_mut() {
        live.settings.disaggregation = disaggregation.clone();
    }
    // With live sources the instance set comes from them (synced when the server starts).
    options.initial_config = live.is_none().then(|| InitialConfig {
        cluster,
        settings: TwinSettings {
            disaggregation,
            ..TwinSettings::defaults()
        },
    });
    options.live = live;
    Ok(options)
}

/// Writes a diagnostic line to stderr; a closed stderr must not turn a clean stop into a
/// panic.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Runs `ditto serve` and returns the process exit code.
pub fn main(args: &ServeArgs) -> ExitCode {
    if let Some(file) = &args.check_config {
        return crate::cli::check_config::main(args, file);
    }
    let tracing_setup = crate::telemetry::init_logs_and_traces(&args.log);
    if !tracing_setup.logging {
        say(&format!(
            "warning: --log {:?} is not a valid filter; logging is off",
            args.log
        ));
    }
    if let Some(err) = &tracing_setup.traces_error {
        say(&format!("warning: {err}; traces are off"));
    }
    let outcome = options(args).and_then(|options| {
        serve_until_signal(options, |grpc, http, metrics| {
            let metrics = metrics.map_or_else(String::new, |addr| format!(", metrics on {addr}"));
            say(&format!(
                "ditto serve: gRPC on {grpc}, HTTP on {http}{metrics} (ready)"
            ));
        })
        .map_err(ServeCommandError::from)
    });
    // The server stopped: flush the last spans (blocks briefly, outside any runtime).
    drop(tracing_setup);
    match outcome {
        Ok(()) => {
            say("ditto serve: stopped");
            ExitCode::SUCCESS
        }
        Err(err) => {
            say(&format!("error: {err}"));
            ExitCode::from(err.exit_code())
        }
    }
}
