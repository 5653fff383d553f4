//! Online calibration of simulated latencies against measured ones: per phase (TTFT, TPOT)
//! an additive overhead and a scale, `measured ≈ overhead + scale · simulated`, learnt one
//! sample at a time by least squares with forgetting and a ridge floor
//! (`fit::ForgettingLeastSquares`) in constant memory, numerically safe however many samples
//! arrive (the covariance-form update it replaces broke for good after ~17,000). TTFT
//! samples are weighted so that a spike pulls the fit no more than a typical sample
//! (`robust`: Huber weights against the median of recent measured/simulated ratios).
//!
//! Why both terms: the TTFT a router measures includes its own path (tokenization, gateway,
//! streaming), a fixed cost the engine never sees, while a slower or faster GPU than the
//! model's scales every step. Bad samples (non-finite, negative, absurdly large, or absurdly
//! far from the prediction once the fit has settled) are rejected and counted, never
//! absorbed. A fit that leaves the plausible range anyway (overhead beyond the phase's
//! ceiling, scale beyond [`MAX_SCALE`]) is reset to the identity with its reason counted
//! ([`PhaseCalibration::resets`]), and only a state that passes [`PhaseState::check`] is
//! ever persisted. A bounded window of absolute percentage errors (each measured before the sample
//! is absorbed, so it is an honest out-of-sample error) says how well the calibration does.
//!
//! A router that does not stream (llm-d's `streamingMode: false`) records end-to-end latency
//! as TTFT and trains no TPOT; [`OnlineCalibration::set_ttft_is_e2e`] switches the TTFT
//! phase to map simulated E2E to measured E2E for such a router.
//!
//! Pure: no I/O, no clock; callers persist [`CalibrationState`].

use std::collections::VecDeque;

use super::conformal::ConformalResiduals;
use super::fit::ForgettingLeastSquares;

mod robust;
mod state;

use robust::RatioReference;
pub use state::{
    CalibrationState, LOAD_FEATURES, LoadFeatures, MAX_LOAD_FEATURE, PhaseState, load_features,
};

/// Which latency a sample measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Time to first token (prefill).
    Ttft,
    /// Time per output token (decode).
    Tpot,
}

impl Phase {
    /// Lower-case name (`ttft`, `tpot`), for labels and files.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Ttft => "ttft",
            Phase::Tpot => "tpot",
        }
    }

    /// The largest plausible measurement, ms: anything above is a broken sample.
    pub fn ceiling_ms(self) -> f64 {
        match self {
            Phase::Ttft => 600_000.0,
            Phase::Tpot => 60_000.0,
        }
    }

    /// Which load feature the phase's fit corrects for: the prefill tokens in flight for
    /// TTFT (prompts ahead of the first token), the decode tokens in flight for TPOT (the
    /// batch a token waits on). The other feature's coefficient stays 0: the simulation
    /// prices the cross effects, and a fit free to use both learnt spurious ones from
    /// correlated features.
    pub fn load_feature(self) -> usize {
        match self {
            Phase::Ttft => 0,
            Phase::Tpot => 1,
        }
    }

    /// Whether the phase's samples are weighted against a slow reference (`robust`): TTFT,
    /// whose measurements carry spikes (stalls, cold paths) far beyond their usual spread.
    /// A TPOT is already a mean over a request's tokens; weighting it only discarded
    /// information (on llm-d's recorded ShareGPT trace its error rose from 3.1 to 3.3%).
    pub fn robust(self) -> bool {
        matches!(self, Phase::Ttft)
    }

    /// A typical simulated latency of the phase, ms: the point where the fit's prior and
    /// floor weigh a change of scale as much as the same change of overhead.
    fn reference_ms(self) -> f64 {
        match self {
            Phase::Ttft => 100.0,
            Phase::Tpot => 10.0,
        }
    }
}

/// Why a sample was not absorbed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rejection {
    /// NaN or infinite (measured or simulated).
    NotFinite,
    /// Below zero.
    Negative,
    /// Zero: nothing was measured (e.g. TPOT when the router does not stream).
    Missing,
    /// Above the phase's ceiling, or more than [`OUTLIER_RATIO`] times off the settled fit.
    Absurd,
}

impl Rejection {
    /// Lower-case name, for metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::NotFinite => "not_finite",
            Rejection::Negative => "negative",
            Rejection::Missing => "missing",
            Rejection::Absurd => "absurd",
        }
    }
}

/// Once this many samples are absorbed, a sample whose ratio to the prediction exceeds
/// this factor (either way) is an outlier.
pub const OUTLIER_RATIO: f64 = 20.0;
const SETTLED_AFTER: u64 = 20;
/// The smallest scale applied: a fit must never invert the order of two predictions.
pub const MIN_SCALE: f64 = 0.05;
/// The largest scale a persisted calibration may hold: a simulation 10 000 times too fast
/// is a misconfigured model, not something to calibrate away.
pub const MAX_SCALE: f64 = 1e4;
/// A restored fit weighs as much as this many samples at most (forgotten like samples).
const RESTORED_CONFIDENCE: u64 = 100;
/// The quantile the conformal layer steers for when none is set (the peer's default).
pub const DEFAULT_TARGET_QUANTILE: f64 = 0.9;
/// The constant ridge toward the anchor, in samples at the phase's reference latency: a
/// hundredth of one sample, negligible wherever samples vary, decisive only along what they
/// never tell apart (every sample at one simulated latency).
const FLOOR_SAMPLES: f64 = 0.01;

/// Why a phase's fit was reset to the identity by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResetReason {
    /// The fit left the plausible range (see [`PhaseState::check`]).
    Diverged,
}

impl ResetReason {
    /// Lower-case name, for metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ResetReason::Diverged => "diverged",
        }
    }
}

/// One phase's fit, counters and error window.
#[derive(Clone, Debug)]
pub struct PhaseCalibration {
    phase: Phase,
    fit: ForgettingLeastSquares,
    /// (overhead, scale, load coefficient) as answers apply them ([`Self::constrained`]).
    applied: [f64; 3],
    lambda: f64,
    samples: u64,
    rejected: u64,
    resets: u64,
    last_reset: Option<ResetReason>,
    conformal: ConformalResiduals,
    /// The slow reference each sample's weight is taken against (`robust`).
    reference: RatioReference,
    /// Σ λ^age · load features and Σ λ^age, for [`PhaseState::load_means`].
    load_sums: LoadFeatures,
    load_weight: f64,
    errors: VecDeque<f64>,
    window: usize,
}

impl PhaseCalibration {
    fn new(phase: Phase, state: PhaseState, lambda: f64, window: usize) -> Self {
        // A restored fit is as confident as the samples behind it (at most
        // RESTORED_CONFIDENCE), as if they had all been seen at the reference latency.
        // The load coefficients' prior and floor are per thousand tokens.
        let reference = phase.reference_ms();
        let confidence = state.samples.min(RESTORED_CONFIDENCE) as f64;
        let load_coefficient = state.load_coefficients[phase.load_feature()];
        let [m0, m1] = state.load_means;
        let fit = ForgettingLeastSquares::new(
            &[state.overhead_ms, state.scale, load_coefficient],
            &[confidence, confidence * reference * reference, confidence],
            &[
                FLOOR_SAMPLES,
                FLOOR_SAMPLES * reference * reference,
                FLOOR_SAMPLES,
            ],
            lambda,
        );
        Self {
            phase,
            applied: Self::constrained(&fit),
            fit,
            load_sums: [m0 * confidence, m1 * confidence],
            load_weight: confidence,
            lambda,
            samples: state.samples,
            rejected: 0,
            resets: 0,
            last_reset: None,
            conformal: ConformalResiduals::new(DEFAULT_TARGET_QUANTILE),
            reference: RatioReference::default(),
            errors: VecDeque::with_capacity(window),
            window: window.max(1),
        }
    }

    /// The calibrated latency for a simulated one at the recent mean load, ms (never
    /// negative).
    pub fn apply(&self, simulated_ms: f64) -> f64 {
        let (overhead, scale) = self.coefficients();
        (overhead + scale * simulated_ms).max(0.0)
    }

    /// The calibrated latency for a simulated one under `load`, ms (never negative).
    pub fn apply_at(&self, simulated_ms: f64, load: &LoadFeatures) -> f64 {
        let [overhead, scale, load_coefficient] = self.applied;
        let correction = load_coefficient * load[self.phase.load_feature()];
        (overhead + scale * simulated_ms + correction).max(0.0)
    }

    /// The fit's (overhead, scale, load coefficient), the scale at least [`MIN_SCALE`]: the
    /// free optimum when its scale is above the floor, else the optimum with the scale held
    /// at the floor (the others re-solved, so the floor costs the answers nothing it need
    /// not; flooring the scale alone shifted every answer by the dropped part).
    fn constrained(fit: &ForgettingLeastSquares) -> [f64; 3] {
        let theta = fit.theta();
        let free = [theta[0], theta[1], theta[2]];
        if theta[1] >= MIN_SCALE {
            return free;
        }
        match fit.theta_with_fixed(1, MIN_SCALE) {
            Some(held) if held.len() == 3 => [held[0], held[1], held[2]],
            _ => [free[0], MIN_SCALE, free[2]],
        }
    }

    /// The load features' recent means (zero before the first sample).
    pub fn load_means(&self) -> LoadFeatures {
        if self.load_weight > 0.0 {
            self.load_sums.map(|sum| sum / self.load_weight)
        } else {
            [0.0; LOAD_FEATURES]
        }
    }

    /// The scale applied to spreads (uncertainties, bound widths).
    pub fn scale(&self) -> f64 {
        self.coefficients().1
    }

    /// (overhead ms, scale) as applied at the recent mean load (the overhead includes the
    /// load terms at their means).
    pub fn coefficients(&self) -> (f64, f64) {
        let [overhead, scale, load_coefficient] = self.applied;
        let means = self.load_means();
        (
            overhead + load_coefficient * means[self.phase.load_feature()],
            scale,
        )
    }

    /// Absorbs one measured latency for the latency simulated on the same inputs, at the
    /// recent mean load, or says why not.
    pub fn observe(&mut self, simulated_ms: f64, measured_ms: f64) -> Result<(), Rejection> {
        let load = self.load_means();
        self.observe_at(simulated_ms, &load, measured_ms)
    }

    /// Absorbs one measured latency for the latency simulated on the same inputs under
    /// `load`, or says why not.
    pub fn observe_at(
        &mut self,
        simulated_ms: f64,
        load: &LoadFeatures,
        measured_ms: f64,
    ) -> Result<(), Rejection> {
        let mut verdict = self.check(simulated_ms, measured_ms);
        if load
            .iter()
            .any(|f| !f.is_finite() || !(0.0..=MAX_LOAD_FEATURE).contains(f))
        {
            verdict = Err(Rejection::Absurd);
        }
        if verdict.is_err() {
            self.rejected += 1;
            return verdict;
        }
        let predicted = self.apply_at(simulated_ms, load);
        if self.errors.len() == self.window {
            self.errors.pop_front();
        }
        self.errors
            .push_back((predicted - measured_ms).abs() / measured_ms);
        self.conformal.observe(predicted, measured_ms);
        let x = [1.0, simulated_ms, load[self.phase.load_feature()]];
        let weight = if self.phase.robust() {
            self.reference.weigh(simulated_ms, measured_ms)
        } else {
            1.0
        };
        if !self.fit.update(&x, measured_ms, weight) {
            self.rejected += 1;
            return Err(Rejection::NotFinite);
        }
        self.applied = Self::constrained(&self.fit);
        for (sum, f) in self.load_sums.iter_mut().zip(load) {
            *sum = self.lambda * *sum + f;
        }
        self.load_weight = self.lambda * self.load_weight + 1.0;
        self.samples += 1;
        if !self.healthy() {
            self.forget_fit();
            self.resets += 1;
            self.last_reset = Some(ResetReason::Diverged);
        }
        Ok(())
    }

    fn check(&self, simulated_ms: f64, measured_ms: f64) -> Result<(), Rejection> {
        if !measured_ms.is_finite() || !simulated_ms.is_finite() {
            return Err(Rejection::NotFinite);
        }
        if measured_ms < 0.0 || simulated_ms < 0.0 {
            return Err(Rejection::Negative);
        }
        if measured_ms == 0.0 {
            return Err(Rejection::Missing);
        }
        if measured_ms > self.phase.ceiling_ms() {
            return Err(Rejection::Absurd);
        }
        if self.samples >= SETTLED_AFTER {
            let predicted = self.apply(simulated_ms).max(1e-3);
            let ratio = measured_ms / predicted;
            if !(1.0 / OUTLIER_RATIO..=OUTLIER_RATIO).contains(&ratio) {
                return Err(Rejection::Absurd);
            }
        }
        Ok(())
    }

    /// Samples absorbed (including those behind a restored state).
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Samples rejected since start.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// The conformal residuals of this phase's calibrated predictions: what a predicted
    /// quantile adds to the calibrated centre, and its coverage.
    pub fn conformal(&self) -> &ConformalResiduals {
        &self.conformal
    }

    /// Times the fit was reset by itself since start (see [`ResetReason`]).
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// Why the fit was last reset by itself, if ever since start.
    pub fn last_reset(&self) -> Option<ResetReason> {
        self.last_reset
    }

    /// Whether the fit as it stands may be persisted ([`PhaseState::check`] on its state).
    pub fn healthy(&self) -> bool {
        self.state().check(self.phase).is_ok()
    }

    /// Mean absolute percentage error over the recent window (as a fraction), `None` before
    /// the first sample.
    pub fn rolling_ape(&self) -> Option<f64> {
        if self.errors.is_empty() {
            None
        } else {
            Some(self.errors.iter().sum::<f64>() / self.errors.len() as f64)
        }
    }

    /// The fit as answers apply it (the scale floored at [`MIN_SCALE`]).
    fn state(&self) -> PhaseState {
        let [overhead_ms, scale, load_coefficient] = self.applied;
        PhaseState {
            overhead_ms,
            scale,
            samples: self.samples,
            load_coefficients: {
                let mut coefficients = [0.0; LOAD_FEATURES];
                coefficients[self.phase.load_feature()] = load_coefficient;
                coefficients
            },
            load_means: self.load_means(),
        }
    }

    /// Forgets everything learnt (back to the identity; residuals measured against the old
    /// fit go too).
    fn reset(&mut self) {
        let target = self.conformal.target();
        *self = PhaseCalibration::new(self.phase, IDENTITY, self.lambda, self.window);
        self.conformal = ConformalResiduals::new(target);
    }

    /// Samples in the error window: each was scored against the calibrated prediction
    /// before it was absorbed (held-out data, as a test set is).
    pub fn evaluated(&self) -> usize {
        self.errors.len()
    }

    /// Forgets the fit (back to the identity, no samples), keeping the error window and the
    /// rejected and reset counts.
    fn forget_fit(&mut self) {
        let errors = std::mem::take(&mut self.errors);
        let (rejected, resets, last_reset) = (self.rejected, self.resets, self.last_reset);
        self.reset();
        self.errors = errors;
        self.rejected = rejected;
        self.resets = resets;
        self.last_reset = last_reset;
    }
}

const IDENTITY: PhaseState = PhaseState {
    overhead_ms: 0.0,
    scale: 1.0,
    samples: 0,
    load_coefficients: [0.0; LOAD_FEATURES],
    load_means: [0.0; LOAD_FEATURES],
};

/// Both phases' calibrations.
#[derive(Clone, Debug)]
pub struct OnlineCalibration {
    ttft: PhaseCalibration,
    tpot: PhaseCalibration,
    ttft_is_e2e: bool,
}

impl OnlineCalibration {
    /// The identity calibration (overhead 0, scale 1), forgetting factor `lambda` in (0, 1]
    /// and an error window of `window` samples.
    pub fn new(lambda: f64, window: usize) -> Self {
        Self::restore(
            CalibrationState {
                ttft: IDENTITY,
                tpot: IDENTITY,
                ttft_is_e2e: false,
            },
            lambda,
            window,
        )
    }

    /// A calibration continuing from `state` (as [`OnlineCalibration::state`] gave it).
    pub fn restore(state: CalibrationState, lambda: f64, window: usize) -> Self {
        Self {
            ttft: PhaseCalibration::new(Phase::Ttft, state.ttft, lambda, window),
            tpot: PhaseCalibration::new(Phase::Tpot, state.tpot, lambda, window),
            ttft_is_e2e: state.ttft_is_e2e,
        }
    }

    /// Steers both phases' conformal layer for quantile `target` (the predictor's
    /// `LATENCY_QUANTILE_ALPHA`), forgetting their residuals.
    pub fn with_target_quantile(mut self, target: f64) -> Self {
        self.ttft.conformal = ConformalResiduals::new(target);
        self.tpot.conformal = ConformalResiduals::new(target);
        self
    }

    /// Takes `other`'s fits and counters, keeping this calibration's conformal residuals and
    /// error windows: for a reload of the state this calibration itself persisted.
    pub fn replace_fit(&mut self, mut other: OnlineCalibration) {
        for (mine, theirs) in [
            (&mut self.ttft, &mut other.ttft),
            (&mut self.tpot, &mut other.tpot),
        ] {
            std::mem::swap(&mut theirs.conformal, &mut mine.conformal);
            std::mem::swap(&mut theirs.errors, &mut mine.errors);
        }
        *self = other;
    }

    /// Whether the TTFT phase learns (and answers) end-to-end latency.
    pub fn ttft_is_e2e(&self) -> bool {
        self.ttft_is_e2e
    }

    /// Switches what the TTFT samples measure. A switch forgets the TTFT fit: a map learnt
    /// from TTFTs says nothing about E2Es, and the reverse.
    pub fn set_ttft_is_e2e(&mut self, e2e: bool) {
        if e2e != self.ttft_is_e2e {
            self.ttft_is_e2e = e2e;
            self.ttft.reset();
        }
    }

    /// The phase's calibration.
    pub fn phase(&self, phase: Phase) -> &PhaseCalibration {
        match phase {
            Phase::Ttft => &self.ttft,
            Phase::Tpot => &self.tpot,
        }
    }

    /// Absorbs a sample of `phase` at the recent mean load, or says why not (and counts
    /// it).
    pub fn observe(
        &mut self,
        phase: Phase,
        simulated_ms: f64,
        measured_ms: f64,
    ) -> Result<(), Rejection> {
        self.phase_mut(phase).observe(simulated_ms, measured_ms)
    }

    /// Absorbs a sample of `phase` measured under `load`, or says why not (and counts it).
    pub fn observe_at(
        &mut self,
        phase: Phase,
        simulated_ms: f64,
        load: &LoadFeatures,
        measured_ms: f64,
    ) -> Result<(), Rejection> {
        self.phase_mut(phase)
            .observe_at(simulated_ms, load, measured_ms)
    }

    fn phase_mut(&mut self, phase: Phase) -> &mut PhaseCalibration {
        match phase {
            Phase::Ttft => &mut self.ttft,
            Phase::Tpot => &mut self.tpot,
        }
    }

    /// The state if both phases pass [`PhaseState::check`], else the first failure: a fit
    /// gone bad is never persisted.
    pub fn persistable_state(&self) -> Result<CalibrationState, String> {
        let state = self.state();
        state.ttft.check(Phase::Ttft)?;
        state.tpot.check(Phase::Tpot)?;
        Ok(state)
    }

    /// What to persist (see [`OnlineCalibration::persistable_state`]).
    pub fn state(&self) -> CalibrationState {
        CalibrationState {
            ttft: self.ttft.state(),
            tpot: self.tpot.state(),
            ttft_is_e2e: self.ttft_is_e2e,
        }
    }

    /// Forgets selectively: the fits (back to the identity, and to TTFT samples measuring
    /// TTFT), the error windows, the rejected counts.
    pub fn forget(&mut self, fits: bool, evaluations: bool, rejected: bool) {
        for phase in [&mut self.ttft, &mut self.tpot] {
            if fits {
                phase.forget_fit();
            }
            if evaluations {
                phase.errors.clear();
                phase.conformal.clear();
            }
            if rejected {
                phase.rejected = 0;
            }
        }
        if fits {
            self.ttft_is_e2e = false;
        }
    }

    /// Forgets everything learnt (back to TTFT samples measuring TTFT).
    pub fn reset(&mut self) {
        self.ttft.reset();
        self.tpot.reset();
        self.ttft_is_e2e = false;
    }
}

#[cfg(test)]
mod tests;
