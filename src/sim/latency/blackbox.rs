//! The "blackbox" linear model: BLIS's per (model, GPU, TP) alpha/beta coefficients.
//!
//! `step_us = beta0 + beta1 * uncached prefill tokens in the step + beta2 * decode tokens`;
//! `queueing_us = alpha0 + alpha1 * input_len`; `alpha2` is added to TTFT and to every
//! inter-token gap.

use super::{BatchEntry, us_from_f64};

/// Linear coefficients (all microseconds, per token where it applies).
#[derive(Clone, Debug, PartialEq)]
pub struct BlackboxCoefficients {
    /// alpha0 (µs), alpha1 (µs per input token), alpha2 (µs per output token).
    pub alpha: [f64; 3],
    /// beta0 (µs per step), beta1 (µs per prefill token), beta2 (µs per decode token).
    pub beta: [f64; 3],
}

impl BlackboxCoefficients {
    /// Step time in microseconds.
    pub fn step_us(&self, batch: &[BatchEntry]) -> u64 {
        let mut prefill_tokens: u64 = 0;
        let mut decode_tokens: u64 = 0;
        for entry in batch {
            if entry.is_prefill {
                prefill_tokens += u64::from(entry.new_tokens);
            } else {
                decode_tokens += u64::from(entry.new_tokens);
            }
        }
        let micros = self.beta[0]
            + self.beta[1] * prefill_tokens as f64
            + self.beta[2] * decode_tokens as f64;
        us_from_f64(micros)
    }

    /// Queueing delay in microseconds.
    pub fn queueing_us(&self, input_tokens: u32) -> u64 {
        us_from_f64(self.alpha[0] + self.alpha[1] * f64::from(input_tokens))
    }

    /// Per-output-token overhead in microseconds.
    pub fn output_token_us(&self) -> u64 {
        us_from_f64(self.alpha[2])
    }
}
