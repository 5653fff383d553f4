//! The `ditto serve` flags of the latency predictor HTTP API (`server::predictor`). The
//! objective flags read the peer's own environment variables (`LATENCY_OBJECTIVE_TYPE`,
//! `LATENCY_QUANTILE_ALPHA`), so the router chart's predictor config carries over.

use std::path::PathBuf;

use clap::Args;

use super::error::ServeCommandError;
use crate::server::predictor::PredictorOptions;
use crate::server::predictor::calibration::load;
use crate::twin::aggregate::Objective;

/// Flags of the latency predictor API.
#[derive(Clone, Debug, Args)]
pub struct PredictorArgs {
    /// `mean` or `quantile`: what /predict answers over the replications.
    #[arg(long, env = "LATENCY_OBJECTIVE_TYPE", default_value = "quantile")]
    pub latency_objective_type: String,
    /// The quantile answered when the objective is `quantile`, in (0, 1).
    #[arg(long, env = "LATENCY_QUANTILE_ALPHA", default_value_t = 0.9)]
    pub latency_quantile_alpha: f64,
    /// Simulations per predictor entry (their spread gives the uncertainty and bounds).
    #[arg(long, env = "DITTO_PREDICTOR_REPLICATIONS", default_value_t = 8)]
    pub predictor_replications: u32,
    /// Most simulations per predictor call: a bulk call of n entries simulates each
    /// clamp(this / n, 2, --predictor-replications) times.
    #[arg(long, env = "DITTO_PREDICTOR_FORKS_PER_CALL", default_value_t = 256)]
    pub predictor_forks_per_call: usize,
    /// Expected output length of the request being routed, tokens.
    #[arg(long, env = "DITTO_PREDICTOR_OUTPUT_TOKENS", default_value_t = 256)]
    pub predictor_output_tokens: u32,
    /// Most entries in one bulk predictor or training call (more: HTTP 413).
    #[arg(long, env = "DITTO_PREDICTOR_MAX_BULK", default_value_t = 10_000)]
    pub predictor_max_bulk: usize,
    /// Where the online calibration is kept: read at start if it exists, rewritten after
    /// every training call that changed it.
    #[arg(long, env = "DITTO_CALIBRATION_FILE")]
    pub calibration_file: Option<PathBuf>,
}

fn flag_error(flag: &'static str, reason: impl Into<String>) -> ServeCommandError {
    ServeCommandError::BadFlag {
        flag,
        reason: reason.into(),
    }
}

impl PredictorArgs {
    /// The predictor options (reads the calibration file if it exists).
    pub fn options(&self) -> Result<PredictorOptions, ServeCommandError> {
        let alpha = self.latency_quantile_alpha;
        if !(alpha > 0.0 && alpha < 1.0) {
            return Err(flag_error(
                "latency-quantile-alpha",
                format!("must be in (0, 1), got {alpha}"),
            ));
        }
        let objective = match self.latency_objective_type.as_str() {
            "mean" => Objective::Mean,
            "quantile" => Objective::Quantile(alpha),
            other => {
                return Err(flag_error(
                    "latency-objective-type",
                    format!("{other:?}: expected mean or quantile"),
                ));
            }
        };
        if self.predictor_replications == 0 {
            return Err(flag_error("predictor-replications", "must be at least 1"));
        }
        if self.predictor_forks_per_call == 0 {
            return Err(flag_error("predictor-forks-per-call", "must be at least 1"));
        }
        if self.predictor_output_tokens == 0 {
            return Err(flag_error("predictor-output-tokens", "must be at least 1"));
        }
        if self.predictor_max_bulk == 0 {
            return Err(flag_error("predictor-max-bulk", "must be at least 1"));
        }
        let initial_calibration = match &self.calibration_file {
            Some(path) => {
                load(path).map_err(|err| flag_error("calibration-file", err.to_string()))?
            }
            None => None,
        };
        Ok(PredictorOptions {
            objective,
            quantile: alpha,
            replications: self.predictor_replications,
            forks_per_call: self.predictor_forks_per_call,
            output_tokens: self.predictor_output_tokens,
            max_bulk_entries: self.predictor_max_bulk,
            calibration_file: self.calibration_file.clone(),
            initial_calibration,
            ..PredictorOptions::default()
        })
    }
}
