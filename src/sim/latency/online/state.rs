//! What a calibration persists: each phase's fit ([`PhaseState`], checked before it is
//! written or restored) and the load features a sample carries.

use super::{MAX_SCALE, MIN_SCALE, Phase};

/// The load a sample was measured under, beside its simulated latency: the pod's prefill
/// and decode tokens in flight, in thousands (the predictor API's `prefill_tokens_in_flight`
/// and `decode_tokens_in_flight`).
pub type LoadFeatures = [f64; LOAD_FEATURES];
/// How many load features the fit carries.
pub const LOAD_FEATURES: usize = 2;

/// The load features of a pod's aggregates.
pub fn load_features(prefill_tokens_in_flight: u64, decode_tokens_in_flight: u64) -> LoadFeatures {
    [
        prefill_tokens_in_flight as f64 / 1000.0,
        decode_tokens_in_flight as f64 / 1000.0,
    ]
}

/// The persisted part of one phase's calibration:
/// `measured ≈ overhead + scale · simulated + Σ load_coefficients · load`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PhaseState {
    /// Additive overhead, ms (at zero load features).
    pub overhead_ms: f64,
    /// Multiplicative scale.
    pub scale: f64,
    /// Samples absorbed.
    pub samples: u64,
    /// ms per thousand prefill and decode tokens in flight: what the simulation misses of
    /// the load (0 when it prices the load right).
    pub load_coefficients: LoadFeatures,
    /// The load features' recent means (forgotten like samples): the load assumed for an
    /// answer that does not say its own (PredictRouting).
    pub load_means: LoadFeatures,
}

impl PhaseState {
    /// Whether this state is plausible enough to persist and restore: the scale in
    /// [[`MIN_SCALE`], [`MAX_SCALE`]] and the overhead within ± the phase's ceiling, both
    /// finite. Errors name the field (`ttft.scale`).
    pub fn check(&self, phase: Phase) -> Result<(), String> {
        let name = phase.as_str();
        let ceiling = phase.ceiling_ms();
        if !self.scale.is_finite() || !(MIN_SCALE..=MAX_SCALE).contains(&self.scale) {
            return Err(format!(
                "{name}.scale: {} is outside [{MIN_SCALE}, {MAX_SCALE}]",
                self.scale
            ));
        }
        if !self.overhead_ms.is_finite() || self.overhead_ms.abs() > ceiling {
            return Err(format!(
                "{name}.overhead_ms: {} is outside [-{ceiling}, {ceiling}]",
                self.overhead_ms
            ));
        }
        for (i, (&coefficient, &mean)) in self
            .load_coefficients
            .iter()
            .zip(&self.load_means)
            .enumerate()
        {
            if !coefficient.is_finite() || coefficient.abs() > ceiling {
                return Err(format!(
                    "{name}.load_coefficients[{i}]: {coefficient} is outside [-{ceiling}, {ceiling}]"
                ));
            }
            if !mean.is_finite() || !(0.0..=MAX_LOAD_FEATURE).contains(&mean) {
                return Err(format!(
                    "{name}.load_means[{i}]: {mean} is outside [0, {MAX_LOAD_FEATURE}]"
                ));
            }
        }
        Ok(())
    }
}

/// The largest load feature accepted (a million thousand tokens in flight).
pub const MAX_LOAD_FEATURE: f64 = 1e6;

/// The persisted part of a calibration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CalibrationState {
    /// TTFT.
    pub ttft: PhaseState,
    /// TPOT.
    pub tpot: PhaseState,
    /// The TTFT samples measure end-to-end latency: a router that does not stream
    /// (llm-d's `streamingMode: false`) records E2E as TTFT and trains no TPOT. The TTFT
    /// phase then maps simulated E2E to measured E2E, and answers are E2E too.
    pub ttft_is_e2e: bool,
}

impl CalibrationState {
    /// Whether `other` is this state as read back from a file: every number equal to a
    /// relative 1e-9 (a decimal round trip may move the last bit), the rest equal.
    pub fn same_fit(&self, other: &CalibrationState) -> bool {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-9);
        let phase = |a: &PhaseState, b: &PhaseState| {
            a.samples == b.samples
                && close(a.overhead_ms, b.overhead_ms)
                && close(a.scale, b.scale)
                && a.load_coefficients
                    .iter()
                    .chain(&a.load_means)
                    .zip(b.load_coefficients.iter().chain(&b.load_means))
                    .all(|(&x, &y)| close(x, y))
        };
        self.ttft_is_e2e == other.ttft_is_e2e
            && phase(&self.ttft, &other.ttft)
            && phase(&self.tpot, &other.tpot)
    }
}
