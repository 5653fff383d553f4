//! Fidelity: replaying measured vLLM runs and scoring ditto's predictions against them.
//!
//! A measured run is a directory in the format of the published inference-sim ground truth
//! (`replay_requests.json`, `replay_ground_truth.json`, `exp-config.yaml`, `profile.yaml`,
//! `model_config.json`, `s2r_error_records.csv`; or, for summary-only runs, a workload
//! description `workload_*.json` plus the summary actuals in `s2r_error_records.csv`).
//!
//! - [`blocks`]: the GPU KV block count of a run that did not record it, as the measured
//!   servers sized theirs;
//! - [`deployment`]: how the measured server was deployed (data-parallel degree, weight
//!   precision) and the published run names;
//! - [`run`]: a measured run as data, [`MeasuredRun`]: engine limits, model, GPU, requests
//!   with their measured TTFT and E2E, rate stages, summary actuals;
//! - [`measured`]: the run's files (text in, no I/O) → a [`MeasuredRun`];
//! - [`replay`](mod@replay): a run plus a latency model → simulated per-request TTFT and E2E;
//! - [`score`]: predicted vs. measured → the field's metrics (E2E/TTFT mean and p90, TPOT
//!   mean), per stage and overall, absolute % errors, KS distances, medians across runs;
//! - [`scraped`]: a run known only from two scrapes of vLLM's own `/metrics` → a
//!   summary-only [`MeasuredRun`];
//! - [`calibrate`]: fits the calibrated step-time model's coefficients to runs by replaying
//!   them (simulation in the loop), and the warm per-run calibration.
//!
//! Pure like the engine: callers (the CLI) read the files and pass their text.

pub mod blocks;
pub mod calibrate;
pub mod deployment;
pub mod measured;
pub mod prompts;
pub mod replay;
pub mod rounds;
pub mod run;
mod s2r;
pub mod score;
pub mod scraped;

pub use measured::RunFiles;
pub use replay::{Replayed, replay};
pub use run::{FailedRequest, MeasuredRun, Stage};
pub use score::{RunScore, StageScore};

/// Why a measured run could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FidelityError {
    /// A file of the run is missing or malformed.
    #[error("{file}: {reason}")]
    BadFile {
        /// Which file (name inside the run directory).
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// The run needs a setting it does not record.
    #[error("{what}: {reason}")]
    Missing {
        /// The setting.
        what: &'static str,
        /// Why it is needed and how to give it.
        reason: String,
    },
    /// The model or GPU is unknown, or the latency model cannot be built.
    #[error(transparent)]
    Catalog(#[from] crate::catalog::CatalogError),
    /// KV capacity cannot be derived.
    #[error("KV capacity: {0}")]
    Capacity(#[from] crate::sim::capacity::CapacityError),
    /// The simulation refused the replay.
    #[error("simulation: {0}")]
    Sim(#[from] crate::sim::SimError),
    /// The latency model cannot be built.
    #[error("latency model: {0}")]
    Latency(#[from] crate::sim::latency::LatencyError),
}

/// A malformed `file` of a run, and what is wrong with it.
fn bad_file(file: &str, reason: impl Into<String>) -> FidelityError {
    FidelityError::BadFile {
        file: file.into(),
        reason: reason.into(),
    }
}
