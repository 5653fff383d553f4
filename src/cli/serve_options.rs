//! `ditto serve`'s flags resolved into the server's options: the cluster file read and
//! checked, the live sources, the limits, the listeners; every error names its flag or the
//! file's field. Shared by `ditto serve` and `--check-config`.

use std::path::PathBuf;
use std::time::Duration;

use super::error::ServeCommandError;
use super::serve_args::ServeArgs;
use crate::cluster::ClusterConfig;
use crate::cluster::spec::{default_cluster, parse_cluster_yaml_with};
use crate::server::{InitialConfig, ServerOptions};
use crate::twin::limits::Limits;
use crate::twin::snapshot::{PdSettings, TwinSettings};
use crate::twin::store::StoreLimits;

fn positive<T: PartialEq + Default>(value: T, flag: &'static str) -> Result<T, ServeCommandError> {
    if value == T::default() {
        return Err(ServeCommandError::BadFlag {
            flag,
            reason: "must be at least 1".to_owned(),
        });
    }
    Ok(value)
}

/// What `--config` holds: the cluster, the file's text (the live sources read their own
/// section of it) and its `disaggregation:` section.
struct ClusterFile {
    cluster: ClusterConfig,
    yaml: Option<String>,
    disaggregation: Option<PdSettings>,
}

/// Reads and checks `--config` (the embedded default cluster without one).
fn cluster_file(args: &ServeArgs) -> Result<ClusterFile, ServeCommandError> {
    let Some(path) = &args.config else {
        return Ok(ClusterFile {
            cluster: default_cluster(),
            yaml: None,
            disaggregation: None,
        });
    };
    let config_error = |reason: String| ServeCommandError::BadConfig {
        path: path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|err| config_error(err.to_string()))?;
    let files = crate::cli::model_files::FsModelFiles::new(args.model_dir.as_deref());
    let cluster = parse_cluster_yaml_with(&text, Some(&files))
        .map_err(|err| config_error(err.to_string()))?;
    let disaggregation = crate::cluster::spec::disaggregation_section(&text)
        .and_then(|section| section.as_ref().map(PdSettings::resolve).transpose())
        .map_err(|err| config_error(err.to_string()))?;
    Ok(ClusterFile {
        cluster,
        yaml: Some(text),
        disaggregation,
    })
}

/// The question, call and store limits the flags set.
fn limits(args: &ServeArgs, options: &mut ServerOptions) -> Result<(), ServeCommandError> {
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
    Ok(())
}

/// The optional loops, security, the HTTP listener's bounds and the metrics listener.
fn serving(args: &ServeArgs, options: &mut ServerOptions) -> Result<(), ServeCommandError> {
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
    Ok(())
}

/// Resolves the flags into server options (reads and validates the cluster file).
pub fn options(args: &ServeArgs) -> Result<ServerOptions, ServeCommandError> {
    let ClusterFile {
        cluster,
        yaml,
        disaggregation,
    } = cluster_file(args)?;
    let config_path = |field: &str| -> Option<PathBuf> {
        args.config.clone().filter(|_| field.starts_with("sources"))
    };
    let mut live = crate::cli::serve_live::live_config(
        &args.live,
        &cluster,
        yaml.as_deref(),
        args.model_dir.as_deref(),
    )
    .map_err(|(field, reason)| match config_path(&field) {
        Some(path) => ServeCommandError::BadConfig {
            path,
            reason: format!("{field}: {reason}"),
        },
        None => ServeCommandError::BadLiveFlag {
            flag: field,
            reason,
        },
    })?;
    let mut options = ServerOptions::new(args.grpc_addr, args.http_addr);
    limits(args, &mut options)?;
    serving(args, &mut options)?;
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
