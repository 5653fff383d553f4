//! The calibration's Prometheus series: samples, rejections, the fit's terms, its rolling
//! error, resets, health and the conformal layer's coverage, by phase.

use prometheus::{GaugeVec, IntCounterVec, Opts};

use crate::telemetry::Metrics;

/// The calibration metrics.
#[derive(Clone, Debug)]
pub(super) struct CalibrationMetrics {
    /// Whether TTFT samples measure E2E.
    pub(super) ttft_is_e2e: prometheus::Gauge,
    /// The peer's `training_samples_count{model}` (its per-bucket series summed: ditto does
    /// not bucket).
    pub(super) peer_samples: GaugeVec,
    /// Samples absorbed, by phase.
    pub(super) samples: GaugeVec,
    /// Samples rejected, by phase and reason.
    pub(super) rejected: IntCounterVec,
    /// The fit's overhead and scale, by phase.
    pub(super) coefficient: GaugeVec,
    /// The rolling absolute percentage error, by phase.
    pub(super) ape: GaugeVec,
    /// Resets of a diverged fit, by phase and reason.
    pub(super) resets: IntCounterVec,
    /// Whether the fit may be persisted, by phase.
    pub(super) healthy: GaugeVec,
    /// The conformal quantile's coverage, by phase.
    pub(super) coverage: GaugeVec,
    /// ACI's adapted residual level, by phase.
    pub(super) level: GaugeVec,
}

impl CalibrationMetrics {
    /// The metrics, registered in `metrics`.
    pub(super) fn register(metrics: &Metrics) -> Result<Self, prometheus::Error> {
        let samples = GaugeVec::new(
            Opts::new(
                "ditto_calibration_samples",
                "Measured latencies absorbed by the online calibration, by phase.",
            ),
            &["phase"],
        )?;
        let rejected = IntCounterVec::new(
            Opts::new(
                "ditto_calibration_rejected_samples_total",
                "Training samples rejected, by phase and reason (entry: a malformed entry or body).",
            ),
            &["phase", "reason"],
        )?;
        let coefficient = GaugeVec::new(
            Opts::new(
                "ditto_calibration_coefficient",
                "Current calibration: measured = overhead_ms + scale * simulated, by phase.",
            ),
            &["phase", "term"],
        )?;
        let ape = GaugeVec::new(
            Opts::new(
                "ditto_calibration_rolling_ape",
                "Mean absolute percentage error (fraction) of calibrated predictions against the \
                 last measured latencies, each measured before it was absorbed, by phase.",
            ),
            &["phase"],
        )?;
        let resets = IntCounterVec::new(
            Opts::new(
                "ditto_calibration_resets_total",
                "Times a phase's fit left the plausible range and was reset to the identity, \
                 by phase and reason.",
            ),
            &["phase", "reason"],
        )?;
        let healthy = GaugeVec::new(
            Opts::new(
                "ditto_calibration_healthy",
                "1 when the phase's fit is within the plausible range (scale in [0.05, 1e4], \
                 overhead within the phase's ceiling) and so may be persisted; else 0.",
            ),
            &["phase"],
        )?;
        let coverage = GaugeVec::new(
            Opts::new(
                "ditto_calibration_quantile_coverage",
                "Fraction of the last training samples (up to 2,000) measured at or under the \
                 quantile predicted for them before they were absorbed, by phase: should be \
                 the target quantile (LATENCY_QUANTILE_ALPHA); NaN before conformal \
                 quantiles start (50 samples).",
            ),
            &["phase"],
        )?;
        let level = GaugeVec::new(
            Opts::new(
                "ditto_calibration_quantile_level",
                "The residual quantile level adaptive conformal inference uses for the target \
                 quantile now, by phase (the target when the residuals are exchangeable).",
            ),
            &["phase"],
        )?;
        let ttft_is_e2e = prometheus::Gauge::new(
            "ditto_calibration_ttft_is_e2e",
            "1 when the router's TTFT samples measure end-to-end latency (it does not stream: \
             no TPOT in its samples), so TTFT answers are calibrated E2E; else 0.",
        )?;
        let peer_samples = GaugeVec::new(
            Opts::new(
                "training_samples_count",
                "llm-d latency predictor compatibility: training samples held, by model \
                 (ttft, tpot); ditto's are the samples its calibration absorbed.",
            ),
            &["model"],
        )?;
        metrics.register(Box::new(peer_samples.clone()))?;
        metrics.register(Box::new(ttft_is_e2e.clone()))?;
        metrics.register(Box::new(samples.clone()))?;
        metrics.register(Box::new(rejected.clone()))?;
        metrics.register(Box::new(coefficient.clone()))?;
        metrics.register(Box::new(ape.clone()))?;
        metrics.register(Box::new(resets.clone()))?;
        metrics.register(Box::new(healthy.clone()))?;
        metrics.register(Box::new(coverage.clone()))?;
        metrics.register(Box::new(level.clone()))?;
        Ok(Self {
            ttft_is_e2e,
            peer_samples,
            samples,
            rejected,
            coefficient,
            ape,
            resets,
            healthy,
            coverage,
            level,
        })
    }
}
