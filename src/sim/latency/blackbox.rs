//! The "blackbox" linear model: BLIS's per (model, GPU, TP) alpha/beta coefficients.
//!
//! `step_us = beta0 + beta1 * uncached prefill tokens in the step + beta2 * decode tokens`;
//! `queueing_us = alpha0 + alpha1 * input_len`; `alpha2` is added to TTFT and to every
//! inter-token gap. Knows nothing about where the coefficients come from (the catalog looks
//! them up) nor about model architecture.

use super::{BatchEntry, LatencyError, check_coefficients, us_trunc_from_f64};

/// Linear coefficients (all microseconds, per token where it applies).
#[derive(Clone, Debug, PartialEq)]
pub struct BlackboxCoefficients {
    /// alpha0 (µs), alpha1 (µs per input token), alpha2 (µs per output token).
    pub alpha: [f64; 3],
    /// beta0 (µs per step), beta1 (µs per prefill token), beta2 (µs per decode token).
    pub beta: [f64; 3],
}

impl BlackboxCoefficients {
    /// Builds coefficients from BLIS's lists, validating them as BLIS does: at least three
    /// alphas and three betas, every value finite and non-negative. Extra values are ignored
    /// (BLIS reads only the first three of each).
    pub fn new(alpha: &[f64], beta: &[f64]) -> Result<Self, LatencyError> {
        check_coefficients("blackbox alpha", alpha, 3)?;
        check_coefficients("blackbox beta", beta, 3)?;
        Ok(BlackboxCoefficients {
            alpha: [alpha[0], alpha[1], alpha[2]],
            beta: [beta[0], beta[1], beta[2]],
        })
    }

    /// Step time in microseconds (truncated, as BLIS's `int64`; the caller clamps to >= 1).
    pub fn step_us(&self, batch: &[BatchEntry]) -> u64 {
        self.step_with_decodes_us(batch, 0)
    }

    /// Step time of `batch` plus `decodes` more decode requests (exactly
    /// [`BlackboxCoefficients::step_us`] of the batch with them added).
    pub fn step_with_decodes_us(&self, batch: &[BatchEntry], decodes: u64) -> u64 {
        let mut prefill_tokens: u64 = 0;
        let mut decode_tokens: u64 = decodes;
        for entry in batch {
            if entry.is_prefill {
                prefill_tokens += u64::from(entry.new_tokens);
            } else {
                decode_tokens += u64::from(entry.new_tokens);
            }
        }
        self.step_from_counts(prefill_tokens, decode_tokens)
    }

    fn step_from_counts(&self, prefill_tokens: u64, decode_tokens: u64) -> u64 {
        let micros = self.beta[0]
            + self.beta[1] * prefill_tokens as f64
            + self.beta[2] * decode_tokens as f64;
        us_trunc_from_f64(micros)
    }

    /// Queueing delay in microseconds: `alpha0 + alpha1 * input_tokens`, truncated.
    pub fn queueing_us(&self, input_tokens: u32) -> u64 {
        us_trunc_from_f64(self.alpha[0] + self.alpha[1] * f64::from(input_tokens))
    }

    /// Per-output-token overhead in microseconds: `alpha2`, truncated.
    pub fn output_token_us(&self) -> u64 {
        us_trunc_from_f64(self.alpha[2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(new_tokens: u32, is_prefill: bool) -> BatchEntry {
        BatchEntry {
            context_tokens: 0,
            new_tokens,
            prompt_tokens: new_tokens,
            is_prefill,
        }
    }

    #[test]
    fn step_is_linear_in_prefill_and_decode_tokens() {
        // Goal: step = b0 + b1*P + b2*D exactly. Method: integer coefficients, mixed batch.
        let coeffs = BlackboxCoefficients::new(&[0.0, 0.0, 0.0], &[100.0, 2.0, 7.0]).unwrap();
        assert_eq!(coeffs.step_us(&[]), 100);
        assert_eq!(coeffs.step_us(&[entry(10, true)]), 120);
        assert_eq!(coeffs.step_us(&[entry(1, false), entry(1, false)]), 114);
        let mixed = [entry(10, true), entry(5, true), entry(1, false)];
        assert_eq!(coeffs.step_us(&mixed), 100 + 2 * 15 + 7);
        // Doubling the tokens adds exactly the marginal cost again.
        let doubled = [
            entry(20, true),
            entry(10, true),
            entry(1, false),
            entry(1, false),
        ];
        assert_eq!(
            coeffs.step_us(&doubled) - coeffs.step_us(&mixed),
            2 * 15 + 7
        );
    }

    #[test]
    fn conversions_truncate_like_blis() {
        let coeffs = BlackboxCoefficients::new(&[10.9, 0.5, 3.99], &[0.7, 0.0, 0.0]).unwrap();
        assert_eq!(coeffs.queueing_us(3), 12); // 10.9 + 1.5 = 12.4
        assert_eq!(coeffs.output_token_us(), 3);
        assert_eq!(coeffs.step_us(&[]), 0); // LatencyModel clamps this to 1
    }

    #[test]
    fn validation_rejects_short_negative_and_non_finite_lists() {
        assert!(BlackboxCoefficients::new(&[1.0, 2.0], &[1.0, 2.0, 3.0]).is_err());
        assert!(BlackboxCoefficients::new(&[1.0, 2.0, 3.0], &[1.0, -2.0, 3.0]).is_err());
        assert!(BlackboxCoefficients::new(&[1.0, f64::INFINITY, 3.0], &[1.0, 2.0, 3.0]).is_err());
        let extra = BlackboxCoefficients::new(&[1.0, 2.0, 3.0, 9.0], &[4.0, 5.0, 6.0]).unwrap();
        assert_eq!(extra.alpha, [1.0, 2.0, 3.0]);
    }
}
