//! Capacity forecasts: simulate candidate replica counts under an arrival forecast.
//! (Being built: answers `FailedPrecondition` until the forecast engine lands.)

use super::error::TwinError;
use super::limits::Limits;
use super::question::{ForecastAnswer, ForecastQuestion};
use super::snapshot::MirrorSnapshot;

/// Answers `question` on `snapshot` (or from empty instances) within `limits`.
pub fn forecast_capacity(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
    limits: &Limits,
) -> Result<ForecastAnswer, TwinError> {
    let _ = (snapshot, question, limits);
    Err(TwinError::FailedPrecondition(
        "capacity forecasts are not implemented yet".to_owned(),
    ))
}
