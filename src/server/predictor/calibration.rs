//! The server's online calibration: the pure [`OnlineCalibration`] behind a mutex, its
//! Prometheus export, and its persistence (`calibration_file`: written after every training
//! call that changed it, read at startup).
//!
//! One calibration per server, for the pool predictions are simulated on: the entries the
//! router posts carry no pod or pool id. TTFT learns from entries of monolithic and prefill
//! pods, TPOT from monolithic and decode pods (`pod_type`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use serde::Serialize;

pub use super::calibration_file::{CalibrationFileError, load};
use super::calibration_file::{phase_file, remove_stale_temporaries, save};
use metrics::CalibrationMetrics;

use super::training::TrainingSample;
use crate::sim::latency::online::{
    CalibrationState, LoadFeatures, OnlineCalibration, Phase, PhaseCalibration, Rejection,
    load_features,
};
use crate::telemetry::Metrics;
use crate::twin::aggregate::{AggregatePrediction, Estimate, Objective, PodAggregates};
use crate::twin::question::{Distribution, RoutingAnswer};

/// Forgetting factor: a sample's weight halves after about 700 newer ones.
pub const LAMBDA: f64 = 0.999;
/// Samples in the rolling error window.
pub const ERROR_WINDOW: usize = 200;

/// The calibration an answer applies: (overhead ms, scale) per phase, and whether the TTFT
/// phase maps end-to-end latency.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Coefficients {
    /// TTFT (or E2E, see `ttft_is_e2e`).
    pub ttft: (f64, f64),
    /// TPOT.
    pub tpot: (f64, f64),
    /// The TTFT samples measure end-to-end latency.
    pub ttft_is_e2e: bool,
}

/// Counts of one training call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Absorbed {
    /// Samples absorbed (TTFT + TPOT).
    pub accepted: u64,
    /// Samples rejected.
    pub rejected: u64,
}

/// What a flush forgot (the peer's `/flush` answer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    /// TTFT samples behind the forgotten fit.
    pub ttft_training: u64,
    /// TPOT samples behind the forgotten fit.
    pub tpot_training: u64,
    /// TTFT samples dropped from the error window.
    pub ttft_test: u64,
    /// TPOT samples dropped from the error window.
    pub tpot_test: u64,
}

/// What to flush: the peer's `FlushRequest` mapped onto the calibration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushRequest {
    /// The fits (back to the identity).
    pub training: bool,
    /// The error windows (the held-out scores behind the rolling APE).
    pub test: bool,
    /// The per-phase rejected counts of `/data/status` (Prometheus counters never reset).
    pub metrics: bool,
}

/// One phase of the calibration described as the peer's model files are
/// (`/models/list`, `/model/{name}/info`).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelFile {
    /// Bytes of the phase's part of the calibration file.
    pub size_bytes: u64,
    /// Unix µs of the last change (absorb, flush, reload), else of the start.
    pub last_modified_us: u64,
}

/// The server's calibration.
#[derive(Debug)]
pub struct Calibrator {
    inner: Mutex<OnlineCalibration>,
    path: Option<PathBuf>,
    /// Serialises file writes: each write takes the state under it, so the last write
    /// holds the latest state.
    writing: Mutex<()>,
    /// Unix µs of the last change.
    changed_at_us: AtomicU64,
    /// Unix µs of the last absorbed sample (0: none since start).
    trained_at_us: AtomicU64,
    metrics: CalibrationMetrics,
}

impl Calibrator {
    /// A calibrator starting from `initial` (identity when `None`), persisting to `path`,
    /// its conformal layer steering the quantile `target_quantile` (the predictor's).
    pub fn new(
        initial: Option<CalibrationState>,
        path: Option<PathBuf>,
        target_quantile: f64,
        metrics: &Metrics,
    ) -> Result<Self, prometheus::Error> {
        if let Some(path) = &path {
            let removed = remove_stale_temporaries(path);
            if removed > 0 {
                tracing::info!(removed, file = %path.display(), "removed temporary files of an interrupted save");
            }
        }
        let calibration = match initial {
            Some(state) => OnlineCalibration::restore(state, LAMBDA, ERROR_WINDOW),
            None => OnlineCalibration::new(LAMBDA, ERROR_WINDOW),
        }
        .with_target_quantile(target_quantile);
        let calibrator = Self {
            inner: Mutex::new(calibration),
            path,
            writing: Mutex::new(()),
            changed_at_us: AtomicU64::new(crate::server::deadline::wall_now_us()),
            trained_at_us: AtomicU64::new(0),
            metrics: CalibrationMetrics::register(metrics)?,
        };
        calibrator.export(&calibrator.lock());
        Ok(calibrator)
    }

    fn lock(&self) -> MutexGuard<'_, OnlineCalibration> {
        // A panic while holding the lock cannot leave the calibration half-updated (RLS
        // updates assign whole vectors), so a poisoned lock is still usable.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Calibrated (TTFT, TPOT) scale and offset applied to a simulated value.
    pub fn apply(&self, phase: Phase, simulated_ms: f64) -> f64 {
        self.lock().phase(phase).apply(simulated_ms)
    }

    /// The (overhead, scale) of both phases and whether TTFT means E2E, read under one lock
    /// (an answer applies a consistent calibration).
    pub fn coefficients(&self) -> Coefficients {
        let calibration = self.lock();
        Coefficients {
            ttft: calibration.phase(Phase::Ttft).coefficients(),
            tpot: calibration.phase(Phase::Tpot).coefficients(),
            ttft_is_e2e: calibration.ttft_is_e2e(),
        }
    }

    /// Whether TTFT samples (and answers) are end-to-end latency.
    pub fn ttft_is_e2e(&self) -> bool {
        self.lock().ttft_is_e2e()
    }

    /// Absorbs samples in order; persists if changed.
    /// `ttft_is_e2e` says what this call's TTFT samples measure (the router either streams
    /// or not); a change of mode forgets the TTFT fit first.
    pub fn absorb(&self, samples: &[TrainingSample], ttft_is_e2e: bool) -> Absorbed {
        let mut absorbed = Absorbed::default();
        {
            let mut calibration = self.lock();
            if samples.iter().any(|sample| sample.phase == Phase::Ttft) {
                calibration.set_ttft_is_e2e(ttft_is_e2e);
            }
            let resets_before = [Phase::Ttft, Phase::Tpot].map(|p| calibration.phase(p).resets());
            for sample in samples {
                let phase = sample.phase;
                match calibration.observe_at(
                    phase,
                    sample.simulated_ms,
                    &sample.load,
                    sample.measured_ms,
                ) {
                    Ok(()) => absorbed.accepted += 1,
                    Err(why) => {
                        absorbed.rejected += 1;
                        self.count_rejected(phase.as_str(), why);
                    }
                }
            }
            for (phase, before) in [Phase::Ttft, Phase::Tpot].into_iter().zip(resets_before) {
                let c = calibration.phase(phase);
                if let Some(reason) = c.last_reset().filter(|_| c.resets() > before) {
                    tracing::warn!(
                        phase = phase.as_str(),
                        reason = reason.as_str(),
                        "the online calibration left the plausible range and was reset"
                    );
                    self.metrics
                        .resets
                        .with_label_values(&[phase.as_str(), reason.as_str()])
                        .inc_by(c.resets() - before);
                }
            }
            self.export(&calibration);
        }
        if absorbed.accepted > 0 {
            let now = crate::server::deadline::wall_now_us();
            self.trained_at_us.store(now, Ordering::Relaxed);
            self.changed_at_us.store(now, Ordering::Relaxed);
            self.persist();
        }
        absorbed
    }

    /// A prediction's (TTFT, TPOT) estimates for a pod of `aggregates` through the
    /// calibration, under one lock: when the router does not stream, TTFT is the end-to-end
    /// estimate for `output_tokens` (what its samples measured). See [`calibrated_estimate`]
    /// for what each becomes.
    pub fn calibrate_prediction(
        &self,
        prediction: &AggregatePrediction,
        aggregates: &PodAggregates,
        output_tokens: u32,
        objective: Objective,
    ) -> (Estimate, Estimate) {
        let load = load_features(
            aggregates.prefill_tokens_in_flight,
            aggregates.decode_tokens_in_flight,
        );
        let calibration = self.lock();
        let ttft_raw = if calibration.ttft_is_e2e() {
            super::training::e2e_estimate(prediction, output_tokens)
        } else {
            prediction.ttft
        };
        let ttft = calibrated_estimate(calibration.phase(Phase::Ttft), ttft_raw, &load, objective);
        // A pod that does not decode keeps its neutral TPOT (`PodType::neutralise`).
        let tpot = if aggregates.pod_type.carries_tpot() {
            calibrated_estimate(
                calibration.phase(Phase::Tpot),
                prediction.tpot,
                &load,
                objective,
            )
        } else {
            prediction.tpot
        };
        (ttft, tpot)
    }

    /// Maps a routing answer's TTFT and TPOT distributions (means and quantiles) through the
    /// calibration, as the predictor's own answers are (when the TTFT samples measured E2E,
    /// the E2E distribution takes the TTFT map and TTFT stays the simulation's): the mean
    /// by the fit, each quantile conformally once the phase has residuals enough
    /// ([`calibrated_distribution`]). SLO probabilities stay the simulation's.
    pub fn calibrate_routing(&self, answer: &mut RoutingAnswer) {
        let calibration = self.lock();
        let (ttft, tpot) = (
            calibration.phase(Phase::Ttft),
            calibration.phase(Phase::Tpot),
        );
        for candidate in answer.candidates.iter_mut().filter(|c| c.valid) {
            if calibration.ttft_is_e2e() {
                calibrated_distribution(ttft, &mut candidate.e2e_ms);
            } else {
                calibrated_distribution(ttft, &mut candidate.ttft_ms);
            }
            calibrated_distribution(tpot, &mut candidate.tpot_ms);
        }
    }

    /// Counts a rejected sample that never reached the calibration (a malformed entry).
    pub fn count_malformed(&self, entries: u64) {
        self.metrics
            .rejected
            .with_label_values(&["entry", "invalid"])
            .inc_by(entries);
    }

    fn count_rejected(&self, phase: &str, why: Rejection) {
        self.metrics
            .rejected
            .with_label_values(&[phase, why.as_str()])
            .inc();
    }

    /// Forgets what `request` says (persisting the result); returns what was forgotten.
    pub fn flush(&self, request: FlushRequest) -> Flushed {
        let flushed = {
            let mut calibration = self.lock();
            let (ttft, tpot) = (
                calibration.phase(Phase::Ttft),
                calibration.phase(Phase::Tpot),
            );
            let flushed = Flushed {
                ttft_training: if request.training { ttft.samples() } else { 0 },
                tpot_training: if request.training { tpot.samples() } else { 0 },
                ttft_test: if request.test {
                    ttft.evaluated() as u64
                } else {
                    0
                },
                tpot_test: if request.test {
                    tpot.evaluated() as u64
                } else {
                    0
                },
            };
            calibration.forget(request.training, request.test, request.metrics);
            self.export(&calibration);
            flushed
        };
        self.changed_at_us
            .store(crate::server::deadline::wall_now_us(), Ordering::Relaxed);
        if request.training {
            self.persist();
        }
        flushed
    }

    /// Re-reads the file (if one is configured and exists); true when it was loaded.
    pub fn reload(&self) -> Result<bool, CalibrationFileError> {
        let Some(path) = &self.path else {
            return Ok(false);
        };
        let Some(state) = load(path)? else {
            return Ok(false);
        };
        let mut calibration = self.lock();
        let target = calibration.phase(Phase::Ttft).conformal().target();
        let restored =
            OnlineCalibration::restore(state, LAMBDA, ERROR_WINDOW).with_target_quantile(target);
        // The file this server wrote last: its residuals were measured against this very
        // fit, so they stay (the peer's clients reload after every training round).
        if calibration
            .persistable_state()
            .is_ok_and(|current| current.same_fit(&state))
        {
            calibration.replace_fit(restored);
        } else {
            *calibration = restored;
        }
        self.export(&calibration);
        self.changed_at_us
            .store(crate::server::deadline::wall_now_us(), Ordering::Relaxed);
        Ok(true)
    }

    /// Unix µs of the last absorbed sample, `None` before the first since start.
    pub fn trained_at_us(&self) -> Option<u64> {
        match self.trained_at_us.load(Ordering::Relaxed) {
            0 => None,
            at => Some(at),
        }
    }

    /// The phase's calibration described as a model file.
    pub fn model_file(&self, phase: Phase) -> ModelFile {
        let state = self.lock().state();
        let phase_state = match phase {
            Phase::Ttft => state.ttft,
            Phase::Tpot => state.tpot,
        };
        let size_bytes =
            serde_json::to_vec(&phase_file(&phase_state)).map_or(0, |bytes| bytes.len() as u64);
        ModelFile {
            size_bytes,
            last_modified_us: self.changed_at_us.load(Ordering::Relaxed),
        }
    }

    /// Samples behind each phase's fit and in each phase's error window:
    /// `((ttft, tpot) absorbed, (ttft, tpot) evaluated)`.
    pub fn sample_counts(&self) -> ((u64, u64), (u64, u64)) {
        let calibration = self.lock();
        let (ttft, tpot) = (
            calibration.phase(Phase::Ttft),
            calibration.phase(Phase::Tpot),
        );
        (
            (ttft.samples(), tpot.samples()),
            (ttft.evaluated() as u64, tpot.evaluated() as u64),
        )
    }

    /// A JSON summary for `/data/status` and `/status`.
    pub fn summary(&self) -> serde_json::Value {
        let calibration = self.lock();
        let phase = |p: Phase| {
            let c = calibration.phase(p);
            let (overhead, scale) = c.coefficients();
            serde_json::json!({
                "samples": c.samples(),
                "rejected": c.rejected(),
                "resets": c.resets(),
                "healthy": c.healthy(),
                "conformal_residuals": c.conformal().len(),
                "quantile_coverage": c.conformal().coverage(),
                "overhead_ms": overhead,
                "scale": scale,
                "rolling_ape": c.rolling_ape(),
            })
        };
        serde_json::json!({
            "ttft": phase(Phase::Ttft),
            "tpot": phase(Phase::Tpot),
            "ttft_is_e2e": calibration.ttft_is_e2e(),
            "file": self.path.as_ref().map(|p| p.display().to_string()),
        })
    }

    fn export(&self, calibration: &OnlineCalibration) {
        self.metrics
            .ttft_is_e2e
            .set(if calibration.ttft_is_e2e() { 1.0 } else { 0.0 });
        for phase in [Phase::Ttft, Phase::Tpot] {
            let c = calibration.phase(phase);
            let name = phase.as_str();
            let (overhead, scale) = c.coefficients();
            self.metrics
                .samples
                .with_label_values(&[name])
                .set(c.samples() as f64);
            self.metrics
                .peer_samples
                .with_label_values(&[name])
                .set(c.samples() as f64);
            self.metrics
                .coefficient
                .with_label_values(&[name, "overhead_ms"])
                .set(overhead);
            self.metrics
                .coefficient
                .with_label_values(&[name, "scale"])
                .set(scale);
            self.metrics
                .ape
                .with_label_values(&[name])
                .set(c.rolling_ape().unwrap_or(0.0));
            self.metrics
                .healthy
                .with_label_values(&[name])
                .set(if c.healthy() { 1.0 } else { 0.0 });
            self.metrics
                .coverage
                .with_label_values(&[name])
                .set(c.conformal().coverage().unwrap_or(f64::NAN));
            self.metrics
                .level
                .with_label_values(&[name])
                .set(c.conformal().adapted_level());
        }
    }

    /// Writes the current state to the file, if one is configured. Writes are serialised
    /// and each takes the state under the write lock, so the file ends with the latest.
    fn persist(&self) {
        let Some(path) = &self.path else {
            return;
        };
        let _writing = self
            .writing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let state = match self.lock().persistable_state() {
            Ok(state) => state,
            Err(reason) => {
                tracing::warn!(%reason, "the calibration is out of range: not persisted");
                return;
            }
        };
        if let Err(err) = save(path, &state) {
            tracing::warn!(%err, "cannot persist the calibration");
        }
    }
}

/// A simulated estimate through a phase's calibration under `load`. The centre is the fit
/// applied to the replications' mean. Until the phase has conformal residuals enough, the value and
/// bounds are the fit applied to the simulation's, the spread scaled. Then a quantile is the
/// centre plus the residuals' quantile (the target quantile at ACI's adapted level), and so
/// are the bounds (5th and 95th) and the spread (16th to 84th): what the simulation does not
/// model widens them to what was measured.
pub fn calibrated_estimate(
    phase: &PhaseCalibration,
    raw: Estimate,
    load: &LoadFeatures,
    objective: Objective,
) -> Estimate {
    let (_, scale) = phase.coefficients();
    let centre = phase.apply_at(raw.mean, load);
    let conformal = phase.conformal();
    let offsets = [0.05, 0.16, 0.84, 0.95].map(|q| conformal.offset(q));
    let [Some(p05), Some(p16), Some(p84), Some(p95)] = offsets else {
        return Estimate {
            value: phase.apply_at(raw.value, load),
            mean: centre,
            uncertainty: raw.uncertainty * scale,
            bounds: (
                phase.apply_at(raw.bounds.0, load),
                phase.apply_at(raw.bounds.1, load),
            ),
        };
    };
    let at = |offset: f64| (centre + offset).max(0.0);
    let value = match objective {
        Objective::Mean => centre,
        Objective::Quantile(q) => conformal.offset(q).map_or(centre, at),
    };
    Estimate {
        value,
        mean: centre,
        uncertainty: ((p84 - p16) / 2.0).max(0.0),
        bounds: (at(p05), at(p95)),
    }
}

/// A routing answer's distribution through a phase's calibration: the mean by the fit;
/// each quantile the fitted mean plus the residuals' quantile once the phase has residuals
/// enough, else the fit applied to the simulated quantile.
pub fn calibrated_distribution(phase: &PhaseCalibration, distribution: &mut Distribution) {
    let centre = phase.apply(distribution.mean);
    for quantile in &mut distribution.quantiles {
        quantile.value = match phase.conformal().offset(quantile.quantile) {
            Some(offset) => (centre + offset).max(0.0),
            None => phase.apply(quantile.value),
        };
    }
    distribution.mean = centre;
}

mod metrics;

#[cfg(test)]
mod tests;
