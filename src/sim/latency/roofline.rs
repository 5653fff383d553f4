//! Roofline latency model (placeholder: to be completed by the latency-model work).

use super::BatchEntry;

/// BLIS's roofline model.
#[derive(Clone, Debug, PartialEq)]
pub struct RooflineModel {}

impl RooflineModel {
    /// Step time in microseconds.
    pub fn step_us(&self, batch: &[BatchEntry]) -> u64 {
        batch.len() as u64
    }
}
