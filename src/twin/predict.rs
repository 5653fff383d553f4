//! Routing predictions: fork the mirrored cluster once per candidate and replication.
//! (Being built: answers `FailedPrecondition` until the prediction engine lands.)

use super::error::TwinError;
use super::limits::Limits;
use super::question::{RoutingAnswer, RoutingQuestion};
use super::snapshot::MirrorSnapshot;

/// Answers `question` on `snapshot` within `limits`.
pub fn predict_routing(
    snapshot: &MirrorSnapshot,
    question: &RoutingQuestion,
    limits: &Limits,
) -> Result<RoutingAnswer, TwinError> {
    let _ = (snapshot, question, limits);
    Err(TwinError::FailedPrecondition(
        "routing predictions are not implemented yet".to_owned(),
    ))
}
