//! The server's online calibration: the pure [`OnlineCalibration`] behind a mutex, its
//! Prometheus export, and its file (JSON, written atomically after every training call that
//! changed it, read at startup).
//!
//! One calibration per server, for the pool predictions are simulated on: the entries the
//! router posts carry no pod or pool id. TTFT learns from entries of monolithic and prefill
//! pods, TPOT from monolithic and decode pods (`pod_type`).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use prometheus::{GaugeVec, IntCounterVec, Opts};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::sim::latency::online::{
    CalibrationState, OnlineCalibration, Phase, PhaseState, Rejection,
};
use crate::telemetry::Metrics;
use crate::twin::question::{Distribution, RoutingAnswer};

/// Forgetting factor: a sample's weight halves after about 700 newer ones.
pub const LAMBDA: f64 = 0.999;
/// Samples in the rolling error window.
pub const ERROR_WINDOW: usize = 200;

/// Why the calibration file cannot be used.
#[derive(Debug, Error)]
pub enum CalibrationFileError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The content is not a calibration.
    #[error("{path}: not a ditto calibration file: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PhaseFile {
    overhead_ms: f64,
    scale: f64,
    samples: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CalibrationFile {
    version: u32,
    ttft: PhaseFile,
    tpot: PhaseFile,
    /// Whether the TTFT samples measured E2E (absent in older files: false).
    #[serde(default)]
    ttft_is_e2e: bool,
}

fn to_file(state: &CalibrationState) -> CalibrationFile {
    let phase = |p: &PhaseState| PhaseFile {
        overhead_ms: p.overhead_ms,
        scale: p.scale,
        samples: p.samples,
    };
    CalibrationFile {
        version: 1,
        ttft: phase(&state.ttft),
        tpot: phase(&state.tpot),
        ttft_is_e2e: state.ttft_is_e2e,
    }
}

/// Reads a calibration file; `Ok(None)` when it does not exist yet.
pub fn load(path: &Path) -> Result<Option<CalibrationState>, CalibrationFileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CalibrationFileError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let bad = |reason: String| CalibrationFileError::Format {
        path: path.to_owned(),
        reason,
    };
    let file: CalibrationFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if file.version != 1 {
        return Err(bad(format!("version {} (expected 1)", file.version)));
    }
    let phase = |name: &str, p: PhaseFile| {
        if p.overhead_ms.is_finite() && p.scale.is_finite() {
            Ok(PhaseState {
                overhead_ms: p.overhead_ms,
                scale: p.scale,
                samples: p.samples,
            })
        } else {
            Err(bad(format!("{name}: coefficients must be finite")))
        }
    };
    Ok(Some(CalibrationState {
        ttft: phase("ttft", file.ttft)?,
        tpot: phase("tpot", file.tpot)?,
        ttft_is_e2e: file.ttft_is_e2e,
    }))
}

fn save(path: &Path, state: &CalibrationState) -> Result<(), CalibrationFileError> {
    let io = |source| CalibrationFileError::Io {
        path: path.to_owned(),
        source,
    };
    let text = serde_json::to_string_pretty(&to_file(state)).map_err(|e| {
        CalibrationFileError::Format {
            path: path.to_owned(),
            reason: e.to_string(),
        }
    })?;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    std::fs::write(&temporary, text).map_err(io)?;
    std::fs::rename(&temporary, path).map_err(io)
}

/// The calibration metrics.
#[derive(Clone, Debug)]
struct CalibrationMetrics {
    ttft_is_e2e: prometheus::Gauge,
    samples: GaugeVec,
    rejected: IntCounterVec,
    coefficient: GaugeVec,
    ape: GaugeVec,
}

impl CalibrationMetrics {
    fn register(metrics: &Metrics) -> Result<Self, prometheus::Error> {
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
        let ttft_is_e2e = prometheus::Gauge::new(
            "ditto_calibration_ttft_is_e2e",
            "1 when the router's TTFT samples measure end-to-end latency (it does not stream: \
             no TPOT in its samples), so TTFT answers are calibrated E2E; else 0.",
        )?;
        metrics.register(Box::new(ttft_is_e2e.clone()))?;
        metrics.register(Box::new(samples.clone()))?;
        metrics.register(Box::new(rejected.clone()))?;
        metrics.register(Box::new(coefficient.clone()))?;
        metrics.register(Box::new(ape.clone()))?;
        Ok(Self {
            ttft_is_e2e,
            samples,
            rejected,
            coefficient,
            ape,
        })
    }
}

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

/// The server's calibration.
#[derive(Debug)]
pub struct Calibrator {
    inner: Mutex<OnlineCalibration>,
    path: Option<PathBuf>,
    metrics: CalibrationMetrics,
}

impl Calibrator {
    /// A calibrator starting from `initial` (identity when `None`), persisting to `path`.
    pub fn new(
        initial: Option<CalibrationState>,
        path: Option<PathBuf>,
        metrics: &Metrics,
    ) -> Result<Self, prometheus::Error> {
        let calibration = match initial {
            Some(state) => OnlineCalibration::restore(state, LAMBDA, ERROR_WINDOW),
            None => OnlineCalibration::new(LAMBDA, ERROR_WINDOW),
        };
        let calibrator = Self {
            inner: Mutex::new(calibration),
            path,
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

    /// Absorbs samples in order: `(phase, simulated ms, measured ms)`; persists if changed.
    /// `ttft_is_e2e` says what this call's TTFT samples measure (the router either streams
    /// or not); a change of mode forgets the TTFT fit first.
    pub fn absorb(&self, samples: &[(Phase, f64, f64)], ttft_is_e2e: bool) -> Absorbed {
        let mut absorbed = Absorbed::default();
        let state = {
            let mut calibration = self.lock();
            if samples.iter().any(|(phase, ..)| *phase == Phase::Ttft) {
                calibration.set_ttft_is_e2e(ttft_is_e2e);
            }
            for &(phase, simulated, measured) in samples {
                match calibration.observe(phase, simulated, measured) {
                    Ok(()) => absorbed.accepted += 1,
                    Err(why) => {
                        absorbed.rejected += 1;
                        self.count_rejected(phase.as_str(), why);
                    }
                }
            }
            self.export(&calibration);
            calibration.state()
        };
        if absorbed.accepted > 0 {
            self.persist(&state);
        }
        absorbed
    }

    /// Maps a routing answer's TTFT and TPOT distributions (means and quantiles) through the
    /// calibration, as the predictor's own answers are (when the TTFT samples measured E2E,
    /// the E2E distribution takes the TTFT map and TTFT stays the simulation's). SLO
    /// probabilities stay the simulation's.
    pub fn calibrate_routing(&self, answer: &mut RoutingAnswer) {
        let Coefficients {
            ttft,
            tpot,
            ttft_is_e2e: e2e,
        } = self.coefficients();
        let map = |distribution: &mut Distribution, (overhead, scale): (f64, f64)| {
            let apply = |v: f64| (overhead + scale * v).max(0.0);
            distribution.mean = apply(distribution.mean);
            for (_, value) in &mut distribution.quantiles {
                *value = apply(*value);
            }
        };
        for candidate in answer.candidates.iter_mut().filter(|c| c.valid) {
            if e2e {
                map(&mut candidate.e2e_ms, ttft);
            } else {
                map(&mut candidate.ttft_ms, ttft);
            }
            map(&mut candidate.tpot_ms, tpot);
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

    /// Forgets everything learnt (and persists the identity); returns the samples dropped.
    pub fn reset(&self) -> u64 {
        let (dropped, state) = {
            let mut calibration = self.lock();
            let dropped =
                calibration.phase(Phase::Ttft).samples() + calibration.phase(Phase::Tpot).samples();
            calibration.reset();
            self.export(&calibration);
            (dropped, calibration.state())
        };
        self.persist(&state);
        dropped
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
        *calibration = OnlineCalibration::restore(state, LAMBDA, ERROR_WINDOW);
        self.export(&calibration);
        Ok(true)
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
        }
    }

    fn persist(&self, state: &CalibrationState) {
        if let Some(path) = &self.path
            && let Err(err) = save(path, state)
        {
            tracing::warn!(%err, "cannot persist the calibration");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ditto-calibration-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir.join("calibration.json")
    }

    fn file_text(ttft: (f64, f64), tpot: (f64, f64)) -> String {
        serde_json::json!({
            "version": 1,
            "ttft": {"overhead_ms": ttft.0, "scale": ttft.1, "samples": 3},
            "tpot": {"overhead_ms": tpot.0, "scale": tpot.1, "samples": 3},
        })
        .to_string()
    }

    #[test]
    fn concurrent_training_never_leaves_a_torn_file() {
        // D2: eight trainers persisting at once while a reader reads the file: every read
        // is a whole calibration file.
        let path = scratch("torn");
        let metrics = Metrics::new().expect("metrics");
        let calibrator = Arc::new(
            Calibrator::new(None, Some(path.clone()), &metrics).expect("calibrator"),
        );
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (path, done) = (path.clone(), Arc::clone(&done));
            std::thread::spawn(move || {
                let (mut reads, mut torn) = (0u64, Vec::new());
                while !done.load(Ordering::Relaxed) {
                    if let Ok(text) = std::fs::read_to_string(&path) {
                        reads += 1;
                        if serde_json::from_str::<CalibrationFile>(&text).is_err() {
                            torn.push(text);
                        }
                    }
                }
                (reads, torn)
            })
        };
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let calibrator = Arc::clone(&calibrator);
                std::thread::spawn(move || {
                    for i in 0..150 {
                        let simulated = 10.0 + f64::from(w * 150 + i % 97);
                        calibrator.absorb(
                            &[
                                (Phase::Ttft, simulated, 1.3 * simulated),
                                (Phase::Tpot, simulated / 10.0, simulated / 8.0),
                            ],
                            false,
                        );
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().expect("writer");
        }
        done.store(true, Ordering::Relaxed);
        let (reads, torn) = reader.join().expect("reader");
        assert!(reads > 0);
        assert!(
            torn.is_empty(),
            "{} of {reads} reads were not a calibration, e.g. {:?}",
            torn.len(),
            torn.first()
        );
        // The file holds the last state, and no temporary file is left behind.
        let loaded = load(&path).expect("loads").expect("exists");
        assert_eq!(loaded.ttft.samples, 8 * 150);
        let dir = path.parent().expect("dir");
        let names: Vec<_> = std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("calibration.json")]);
    }

    #[test]
    fn absurd_coefficients_are_refused_naming_the_field() {
        // D3: finite but absurd values, each named with its phase.
        let path = scratch("absurd");
        for (text, field) in [
            (file_text((0.0, 1e308), (0.0, 1.0)), "ttft.scale"),
            (file_text((-1e300, 1.0), (0.0, 1.0)), "ttft.overhead_ms"),
            (file_text((0.0, 1.0), (0.0, -5.0)), "tpot.scale"),
            (file_text((0.0, 1.0), (0.0, 0.0)), "tpot.scale"),
            (file_text((0.0, 1.0), (1e9, 1.0)), "tpot.overhead_ms"),
        ] {
            std::fs::write(&path, &text).expect("write");
            let err = load(&path).expect_err(&text).to_string();
            assert!(err.contains(field), "{err} should name {field}");
            assert!(err.contains(&path.display().to_string()), "{err}");
        }
        std::fs::write(&path, file_text((12.0, 1.3), (-0.5, 0.9))).expect("write");
        let state = load(&path).expect("in range").expect("exists");
        assert_eq!((state.ttft.overhead_ms, state.ttft.scale), (12.0, 1.3));
    }

    #[test]
    fn what_the_server_writes_it_can_read_back() {
        // A fit driven out of the accepted range (anti-correlated samples drive the raw
        // scale negative) is persisted clamped, so a restart never refuses the server's own
        // file.
        let path = scratch("roundtrip");
        let metrics = Metrics::new().expect("metrics");
        let calibrator =
            Calibrator::new(None, Some(path.clone()), &metrics).expect("calibrator");
        let samples: Vec<_> = (0..20)
            .map(|i| {
                let simulated = 10.0 + f64::from(i);
                (Phase::Ttft, simulated, 200.0 - 5.0 * simulated)
            })
            .collect();
        calibrator.absorb(&samples, false);
        let state = load(&path).expect("readable").expect("exists");
        assert!(state.ttft.scale > 0.0, "{state:?}");
    }
}
