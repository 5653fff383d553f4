//! Trained-physics latency model (placeholder: to be completed by the latency-model work).

use super::BatchEntry;

/// Global trained-physics coefficients.
#[derive(Clone, Debug, PartialEq)]
pub struct PhysicsCoefficients {
    /// Alpha coefficients.
    pub alpha: [f64; 3],
}

/// The trained-physics model.
#[derive(Clone, Debug, PartialEq)]
pub struct PhysicsModel {}

impl PhysicsModel {
    /// Step time in microseconds.
    pub fn step_us(&self, batch: &[BatchEntry]) -> u64 {
        batch.len() as u64
    }
    /// Queueing delay.
    pub fn queueing_us(&self, _input_tokens: u32) -> u64 {
        0
    }
    /// Per-token overhead.
    pub fn output_token_us(&self) -> u64 {
        0
    }
    /// Post-decode overhead.
    pub fn post_decode_us(&self) -> u64 {
        0
    }
}
