//! Fitting the calibrated model's coefficients to measured runs, by replaying them.
//!
//! The loss of a coefficient vector replays every target run with the calibrated model and
//! sums, over the whole run (weight 2) and each stage (weight 1), the squared log-ratios of
//! predicted to measured E2E mean and TPOT mean (weight 2), TTFT mean (weight 1) and E2E
//! and TTFT p90 (weight ½): the field's headline metrics first, the tails as a guide. Stages are scored
//! separately because each rate stage pins the step time at a different batch size. The
//! loss is minimised with a bounded Nelder-Mead over the free coefficients (each kept
//! non-negative by fitting its magnitude), so the fit sees the scheduler's real feedback
//! (a slower step grows the batch, which slows the step) instead of a linearised proxy.
//!
//! A summary-only run (no per-request truth; its arrivals and prompts are synthesised from
//! the workload description) counts [`SUMMARY_ONLY_WEIGHT`] of a replayed run: its error
//! mixes the step-time model's with the synthesis's, so it guides the fit without steering it.
//!
//! Warm calibration fits a run's first stage only ([`MeasuredRun::through_stage`]) and is
//! scored on the stages after it.

use crate::sim::EngineConfig;
use crate::sim::latency::calibrated::{COEFFICIENTS, idx};
use crate::sim::latency::fit::{NelderMeadOptions, nelder_mead};
use crate::sim::latency::{CalibratedCoefficients, CalibratedModel, GpuSpec, LatencyModel};

use super::FidelityError;
use super::measured::MeasuredRun;
use super::replay::{self, ReplayOptions};
use super::score::{self, Metrics};

/// One run to fit on, with its GPU and engine configuration resolved.
#[derive(Clone, Debug)]
pub struct Target {
    /// The measured run (possibly cut to its first stages).
    pub run: MeasuredRun,
    /// Its GPU.
    pub gpu: GpuSpec,
    /// Its engine configuration.
    pub config: EngineConfig,
}

impl Target {
    /// Resolves `run`'s GPU (or `gpu`) and engine configuration.
    pub fn new(run: MeasuredRun, gpu: Option<&str>) -> Result<Target, FidelityError> {
        let gpu = replay::resolve_gpu(&run, gpu)?;
        let config = replay::engine_config(&run, &gpu)?;
        Ok(Target { run, gpu, config })
    }
}

/// What to fit and how.
#[derive(Clone, Debug, PartialEq)]
pub struct FitSpec {
    /// Starting coefficients (the fixed ones keep these values).
    pub start: CalibratedCoefficients,
    /// Indices (see [`idx`]) of the coefficients to fit.
    pub free: Vec<usize>,
    /// Minimiser options.
    pub options: NelderMeadOptions,
    /// How to replay.
    pub replay: ReplayOptions,
}

impl FitSpec {
    /// The default offline fit: every step-time coefficient and the request overheads, from
    /// `start`.
    pub fn all(start: CalibratedCoefficients, replay: ReplayOptions) -> FitSpec {
        FitSpec {
            start,
            free: vec![
                idx::QUEUE_US,
                idx::POST_DECODE_US,
                idx::STEP_US,
                idx::SEQ_US,
                idx::ALLREDUCE_US,
                idx::WEIGHTS,
                idx::FLOPS,
                idx::KV,
                idx::FIRST_TOKEN_US_PER_SEQ,
                idx::LAYER_US,
                idx::MOE_FLOPS,
                idx::ALLREDUCE_LINK,
            ],
            options: NelderMeadOptions {
                evaluations_max: 600,
                step: 0.15,
                tolerance: 1e-6,
            },
            replay,
        }
    }
}

/// A fit's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct FitResult {
    /// The fitted coefficients.
    pub coefficients: CalibratedCoefficients,
    /// The loss at them.
    pub loss: f64,
}

/// Scale of a coefficient whose start value is 0 (its typical magnitude).
fn default_scale(index: usize) -> f64 {
    match index {
        idx::QUEUE_US => 10_000.0,
        idx::QUEUE_US_PER_TOKEN => 1.0,
        idx::OUTPUT_TOKEN_US | idx::SEQ_US | idx::LAYER_US | idx::ALLREDUCE_US => 10.0,
        idx::POST_DECODE_US | idx::STEP_US => 1_000.0,
        idx::FIRST_TOKEN_US_PER_SEQ => 100.0,
        // ALLREDUCE_LINK, like the efficiencies: 1 is the link's peak.
        _ => 1.0,
    }
}

/// Fits `spec.free` to `targets`. Each free coefficient is fitted as `scale · e^p` (so it
/// stays positive and steps are relative), in rounds of Nelder-Mead restarted from the best
/// point so far with a fresh simplex (the loss has cliffs where a run saturates, which
/// strand a single simplex), until `spec.options.evaluations_max` is spent.
pub fn fit(targets: &[Target], spec: &FitSpec) -> Result<FitResult, FidelityError> {
    fit_observed(targets, spec, &mut |_| {})
}

/// One evaluation of the loss during a fit, for a caller's progress display.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FitEvaluation {
    /// Evaluations so far (at most the spec's `evaluations_max`).
    pub evaluations: usize,
    /// The loss at this evaluation.
    pub loss: f64,
    /// The best loss so far.
    pub best: f64,
}

/// [`fit`], calling `observe` after every evaluation of the loss.
pub fn fit_observed(
    targets: &[Target],
    spec: &FitSpec,
    observe: &mut dyn FnMut(FitEvaluation),
) -> Result<FitResult, FidelityError> {
    const ROUNDS: usize = 4;
    let scales: Vec<f64> = spec
        .free
        .iter()
        .map(|&i| {
            let start = spec.start.values[i];
            if start > 0.0 {
                start
            } else {
                default_scale(i) * ZERO_START
            }
        })
        .collect();
    let at = |p: &[f64]| {
        let mut coefficients = spec.start.clone();
        for ((&i, scale), value) in spec.free.iter().zip(&scales).zip(p) {
            coefficients.values[i] = scale * value.clamp(-30.0, 30.0).exp();
        }
        coefficients
    };
    let mut failure = None;
    let mut best = vec![0.0; spec.free.len()];
    let mut best_loss = f64::INFINITY;
    let per_round = (spec.options.evaluations_max / ROUNDS).max(spec.free.len() + 2);
    let mut spent = 0;
    let mut round = 0;
    while spent < spec.options.evaluations_max {
        let options = NelderMeadOptions {
            evaluations_max: per_round.min(spec.options.evaluations_max - spent),
            // Later rounds search closer to the best point.
            step: spec.options.step / (1.0 + round as f64),
            ..spec.options
        };
        let mut evaluations = 0;
        let mut round_best = best_loss;
        let (point, value) = nelder_mead(&best, options, |p| {
            evaluations += 1;
            let result = loss(targets, &at(p), spec.replay);
            let value = match result {
                Ok(value) => value,
                Err(err) => {
                    failure.get_or_insert(err);
                    f64::INFINITY
                }
            };
            round_best = round_best.min(value);
            observe(FitEvaluation {
                evaluations: spent + evaluations,
                loss: value,
                best: round_best,
            });
            value
        });
        spent += evaluations.max(1);
        round += 1;
        let improved = value < best_loss;
        if improved {
            best = point;
            best_loss = value;
        }
        if round >= ROUNDS && !improved {
            break;
        }
    }
    if !best_loss.is_finite() {
        return Err(failure.unwrap_or(FidelityError::Missing {
            what: "fit",
            reason: "no coefficient vector gave a finite loss".into(),
        }));
    }
    Ok(FitResult {
        coefficients: at(&best),
        loss: best_loss,
    })
}

/// The weight of a summary-only run relative to a run with per-request ground truth.
pub const SUMMARY_ONLY_WEIGHT: f64 = 0.25;

/// A coefficient that starts at 0 starts at this fraction of its typical magnitude.
const ZERO_START: f64 = 0.05;

/// The loss of `coefficients` on `targets` (see the module doc).
pub fn loss(
    targets: &[Target],
    coefficients: &CalibratedCoefficients,
    options: ReplayOptions,
) -> Result<f64, FidelityError> {
    let mut total = 0.0;
    for target in targets {
        let latency = LatencyModel::Calibrated(CalibratedModel::new(
            &target.run.arch,
            &target.gpu,
            target.run.tp,
            coefficients,
        )?);
        let replayed = replay::replay(&target.run, &target.config, latency, options)?;
        let scored = score::score(&target.run, &replayed);
        let run_weight = if target.run.has_requests() {
            1.0
        } else {
            SUMMARY_ONLY_WEIGHT
        };
        for stage in &scored.stages {
            // The whole run counts as much as its stages together: it is what is judged.
            let weight = if stage.stage < 0 { 2.0 } else { 1.0 };
            total += run_weight * weight * stage_loss(&stage.predicted, &stage.measured);
        }
        // Overload: the fraction the client abandoned at its timeout should match the
        // measured fraction of failed requests (0 for a run that kept up).
        let measured_failed = scored.timed_out_measured.unwrap_or(0.0);
        total +=
            run_weight * TIMED_OUT_WEIGHT * (scored.timed_out_predicted - measured_failed).powi(2);
        // Requests that never finished for another reason (dropped) are a plain penalty.
        total += replayed.unfinished.saturating_sub(replayed.timed_out) as f64;
    }
    Ok(total)
}

/// Weight of the squared difference between the predicted and measured timed-out fractions
/// (a 10-point miss costs 1, about as much as every metric of a two-stage run 25% off).
pub const TIMED_OUT_WEIGHT: f64 = 100.0;

/// Weighted squared log-ratios of one stage's metrics.
fn stage_loss(predicted: &Metrics, measured: &Metrics) -> f64 {
    const WEIGHTS: [f64; 5] = [2.0, 0.5, 1.0, 0.5, 2.0];
    predicted
        .named()
        .iter()
        .zip(measured.named())
        .zip(WEIGHTS)
        .map(|(((_, p), (_, m)), w)| {
            if *p > 0.0 && m > 0.0 && p.is_finite() && m.is_finite() {
                w * (p / m).ln().powi(2)
            } else if m.is_finite() && m > 0.0 {
                w * 100.0
            } else {
                0.0
            }
        })
        .sum()
}

/// The number of coefficients (re-exported for callers that list them).
pub const COEFFICIENT_COUNT: usize = COEFFICIENTS;
