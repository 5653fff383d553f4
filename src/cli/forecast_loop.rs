//! Flags of `ditto serve`'s optional forecast loop (`--forecast-interval`, off by default),
//! which exports `ditto_desired_replicas` for an HPA (see `server::forecast_loop`).

use std::time::Duration;

use clap::Args;

use super::error::ServeCommandError;
use crate::server::forecast_loop::ForecastLoopOptions;
use crate::twin::desired::DesiredSettings;
use crate::twin::question::SloTargets;

/// The forecast loop's flags (flattened into `ditto serve`).
#[derive(Clone, Debug, Args)]
pub struct ForecastLoopArgs {
    /// Seconds between forecast rounds exporting ditto_desired_replicas (0: no loop).
    #[arg(long, env = "DITTO_FORECAST_INTERVAL", default_value_t = 0.0)]
    pub forecast_interval: f64,
    /// Simulated horizon of each forecast, seconds.
    #[arg(long, env = "DITTO_FORECAST_HORIZON_S", default_value_t = 120)]
    pub forecast_horizon_s: u64,
    /// Replications per candidate replica count.
    #[arg(long, env = "DITTO_FORECAST_REPLICATIONS", default_value_t = 2)]
    pub forecast_replications: u32,
    /// TTFT objective of the forecast, ms (0: none).
    #[arg(long, env = "DITTO_FORECAST_SLO_TTFT_MS", default_value_t = 1000.0)]
    pub forecast_slo_ttft_ms: f64,
    /// TPOT objective of the forecast, ms (0: none).
    #[arg(long, env = "DITTO_FORECAST_SLO_TPOT_MS", default_value_t = 100.0)]
    pub forecast_slo_tpot_ms: f64,
    /// Fraction of requests that must meet every objective.
    #[arg(long, env = "DITTO_FORECAST_TARGET_ATTAINMENT", default_value_t = 0.95)]
    pub forecast_target_attainment: f64,
    /// Namespace label of instances whose id has no `namespace/` prefix.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub forecast_namespace: String,
}

fn flag_error(flag: &'static str, reason: &str) -> ServeCommandError {
    ServeCommandError::BadFlag {
        flag,
        reason: reason.to_owned(),
    }
}

fn objective(value: f64, flag: &'static str) -> Result<Option<f64>, ServeCommandError> {
    if !(value.is_finite() && value >= 0.0) {
        return Err(flag_error(
            flag,
            "must be a finite number of ms, at least 0",
        ));
    }
    Ok((value > 0.0).then_some(value))
}

impl ForecastLoopArgs {
    /// The loop's options, None when `--forecast-interval` is 0.
    pub fn options(&self) -> Result<Option<ForecastLoopOptions>, ServeCommandError> {
        let interval = self.forecast_interval;
        if !(interval.is_finite() && (0.0..=86_400.0).contains(&interval)) {
            return Err(flag_error(
                "forecast-interval",
                "must be in [0, 86400] seconds",
            ));
        }
        if interval == 0.0 {
            return Ok(None);
        }
        if self.forecast_horizon_s == 0 {
            return Err(flag_error("forecast-horizon-s", "must be at least 1"));
        }
        if self.forecast_replications == 0 {
            return Err(flag_error("forecast-replications", "must be at least 1"));
        }
        let target = self.forecast_target_attainment;
        if !(target > 0.0 && target <= 1.0) {
            return Err(flag_error(
                "forecast-target-attainment",
                "must be in (0, 1]",
            ));
        }
        let slo = SloTargets {
            ttft_ms: objective(self.forecast_slo_ttft_ms, "forecast-slo-ttft-ms")?,
            tpot_ms: objective(self.forecast_slo_tpot_ms, "forecast-slo-tpot-ms")?,
            e2e_ms: None,
        };
        if slo.ttft_ms.is_none() && slo.tpot_ms.is_none() {
            return Err(flag_error(
                "forecast-slo-ttft-ms",
                "the forecast needs an objective: set it or --forecast-slo-tpot-ms above 0",
            ));
        }
        Ok(Some(ForecastLoopOptions {
            interval: Duration::from_secs_f64(interval.max(0.001)),
            settings: DesiredSettings {
                horizon_s: self.forecast_horizon_s as f64,
                replications: self.forecast_replications,
                slo,
                target_attainment: target,
                namespace: self.forecast_namespace.clone(),
                seed: 0,
            },
        }))
    }
}
