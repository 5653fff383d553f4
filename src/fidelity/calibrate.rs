//! Fitting the calibrated model's coefficients to measured runs, by replaying them.
//!
//! The loss of a coefficient vector replays every target run with the calibrated model and
//! sums, over the whole run (weight 2) and each stage (weight 1), a robust penalty of the
//! log-ratios of predicted to measured E2E mean and TPOT mean (weight 2), TTFT mean
//! (weight 1) and E2E and TTFT p90 (weight ½): the field's headline metrics first, the tails
//! as a guide. Stages are scored separately because each rate stage pins the step time at a
//! different batch size. The penalty ([`robust`]) is the squared log-ratio for errors of a
//! few percent and grows only linearly past [`LOG_SCALE`], so one run far off (a run past
//! its knee, where a few percent of step time moves a queue by half) cannot outweigh the
//! runs that are close: the fit aims at the median run, as the goal does.
//!
//! An overloaded run (at least [`OVERLOAD_FRACTION`] of its measured requests failed at the
//! client's timeout) is scored on its TPOT and its timed-out fraction only: its survivors'
//! E2E and TTFT are a queue of minutes that says how far past the knee the run was, which
//! the timed-out fraction already says, while their TPOT is the decode step at a full batch
//! of long contexts, which no other run measures. Every run adds the robust penalty of its
//! timed-out fraction's miss (predicted − measured, 0 for a run that kept up) times
//! [`TIMED_OUT_WEIGHT`]. A per-request shared-prefix run adds the penalty of its first round
//! of prompts' lower-quartile TTFT times [`FIRST_ROUND_WEIGHT`]: the load generator sends a
//! fixed set of prompts in turn, so after the first round vLLM's prefix cache serves nearly
//! every prompt, and the first round is where the runs measure a whole prefill
//! ([`crate::fidelity::rounds`]). The loss is minimised with a bounded Nelder-Mead over the free
//! coefficients (each kept non-negative by fitting its magnitude), so the fit sees the
//! scheduler's real feedback (a slower step grows the batch, which slows the step) instead
//! of a linearised proxy. The runs of one evaluation replay in parallel (rayon); their
//! losses add in a fixed order, so the fit is deterministic.
//!
//! A summary-only run (no per-request truth; its arrivals and prompts are synthesised from
//! the workload description) counts [`SUMMARY_ONLY_WEIGHT`] of a replayed run: its error
//! mixes the step-time model's with the synthesis's (Poisson arrivals, prompts drawn from
//! the workload; the campaign's load generator drew them the same way), and since issue 36
//! such runs are the only ones of five model families, FP8, TP 8 and the engine-setting
//! sweep, so they count half.
//!
//! Warm calibration fits a run's first stage only ([`MeasuredRun::through_stage`]) and is
//! scored on the stages after it.

use crate::sim::EngineConfig;
use crate::sim::latency::calibrated::{COEFFICIENTS, idx};
use crate::sim::latency::fit::{NelderMeadOptions, nelder_mead};
use crate::sim::latency::{CalibratedCoefficients, CalibratedModel, GpuSpec, LatencyModel};

use super::FidelityError;
use super::replay::{self, ReplayOptions};
use super::run::MeasuredRun;
use super::score::{self, Metrics, RunScore};

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
                // Not FIRST_TOKEN_STEPS: one step is structural (docs/fidelity.md); a
                // fit may free it with `--free`.
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
        idx::WAITING_US | idx::ALLREDUCE_PEER_US => 10.0,
        idx::WAITING_CAP => 1_000.0,
        // Passes over a sequence's fp32 logits (vLLM's sampler: several elementwise passes
        // and a sort of the vocabulary for top-p / top-k).
        idx::SAMPLER_PASSES => 100.0,
        idx::TOKEN_US => 1.0,
        // Peers beyond the base a custom all-reduce's latency grows with (TP 8: 6).
        idx::ALLREDUCE_PEER_CAP => 4.0,
        // ALLREDUCE_LINK, like the efficiencies: 1 is the link's peak; FIRST_TOKEN_STEPS:
        // one decode step.
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
pub const SUMMARY_ONLY_WEIGHT: f64 = 0.5;

/// A coefficient that starts at 0 starts at this fraction of its typical magnitude.
const ZERO_START: f64 = 0.05;

/// The loss of `coefficients` on `targets` (see the module doc).
pub fn loss(
    targets: &[Target],
    coefficients: &CalibratedCoefficients,
    options: ReplayOptions,
) -> Result<f64, FidelityError> {
    use rayon::prelude::*;
    let losses: Vec<Result<f64, FidelityError>> = targets
        .par_iter()
        .map(|target| target_loss(target, coefficients, options))
        .collect();
    // Summed in the targets' order whatever order they finished in: deterministic.
    let mut total = 0.0;
    for one in losses {
        total += one?;
    }
    Ok(total)
}

/// One run's share of [`loss`].
fn target_loss(
    target: &Target,
    coefficients: &CalibratedCoefficients,
    options: ReplayOptions,
) -> Result<f64, FidelityError> {
    let latency = LatencyModel::Calibrated(CalibratedModel::new(
        &target.run.arch,
        &target.gpu,
        target.run.tp,
        coefficients,
    )?);
    let replayed = replay::replay(&target.run, &target.config, latency, options)?;
    let scored = score::score(&target.run, &replayed);
    Ok(score_loss(
        &scored,
        target.run.has_requests(),
        replayed.unfinished.saturating_sub(replayed.timed_out),
    ))
}

/// The loss of one scored run (`per_request`: it has per-request truth; `dropped`: requests
/// the simulation neither completed nor timed out).
pub fn score_loss(scored: &RunScore, per_request: bool, dropped: u64) -> f64 {
    let run_weight = if per_request {
        1.0
    } else {
        SUMMARY_ONLY_WEIGHT
    };
    let measured_failed = scored.timed_out_measured.unwrap_or(0.0);
    let overloaded = measured_failed >= OVERLOAD_FRACTION;
    let mut total = 0.0;
    for stage in &scored.stages {
        // The whole run counts as much as its stages together: it is what is judged.
        let weight = if stage.stage < 0 { 2.0 } else { 1.0 };
        let metrics = if overloaded {
            tpot_loss(&stage.predicted, &stage.measured)
        } else {
            stage_loss(&stage.predicted, &stage.measured)
        };
        total += run_weight * weight * metrics;
    }
    // Overload: the fraction the client abandoned at its timeout should match the measured
    // fraction of failed requests (0 for a run that kept up).
    total += run_weight
        * TIMED_OUT_WEIGHT
        * robust(
            scored.timed_out_predicted - measured_failed,
            TIMED_OUT_SCALE,
        );
    // A shared-prefix run's first round of prompts (new to the server) prices the prefill
    // that the cached later rounds skip ([`crate::fidelity::rounds`]).
    if let Some(rounds) = &scored.prompt_rounds {
        total += run_weight
            * FIRST_ROUND_WEIGHT
            * metric_loss(rounds.first.predicted_ms, rounds.first.measured_ms);
    }
    // Requests that never finished for another reason (dropped) are a plain penalty.
    total + dropped as f64
}

/// A run is overloaded, and scored on TPOT and its timed-out fraction only, when at least
/// this fraction of its measured requests failed.
pub const OVERLOAD_FRACTION: f64 = 0.05;

/// Weight of a run's first round of prompts (its lower-quartile TTFT), as much as a
/// headline metric: in the measured runs it is the one figure that prices a whole prefill.
pub const FIRST_ROUND_WEIGHT: f64 = 2.0;

/// Weight of the timed-out fraction's miss (a 10-point miss costs about as much as a
/// two-stage run's every metric 6% off; a 33-point miss as its TPOT 25% off).
pub const TIMED_OUT_WEIGHT: f64 = 8.0;

/// Scale of the timed-out fraction's robust penalty (10 points).
const TIMED_OUT_SCALE: f64 = 0.1;

/// Scale of the metrics' robust penalty: log-ratios below it (about 10%) cost their square,
/// larger ones grow linearly.
pub const LOG_SCALE: f64 = 0.1;

/// Pseudo-Huber penalty of `residual` at `scale`: `residual²` for small residuals,
/// `2·scale·|residual|` for large ones, smooth in between (the minimiser needs no kinks).
pub fn robust(residual: f64, scale: f64) -> f64 {
    2.0 * scale * scale * ((1.0 + (residual / scale).powi(2)).sqrt() - 1.0)
}

/// Penalty of one metric: the robust log-ratio, or a large constant when the prediction is
/// missing (a stage the simulation completed nothing of); 0 when nothing was measured.
fn metric_loss(predicted: f64, measured: f64) -> f64 {
    if predicted > 0.0 && measured > 0.0 && predicted.is_finite() && measured.is_finite() {
        robust((predicted / measured).ln(), LOG_SCALE)
    } else if measured.is_finite() && measured > 0.0 {
        MISSING_PENALTY
    } else {
        0.0
    }
}

/// Penalty of a metric the simulation could not produce (about a 10× miss).
const MISSING_PENALTY: f64 = 1.0;

/// Weighted robust log-ratios of one stage's metrics.
fn stage_loss(predicted: &Metrics, measured: &Metrics) -> f64 {
    const WEIGHTS: [f64; 5] = [2.0, 0.5, 1.0, 0.5, 2.0];
    predicted
        .named()
        .iter()
        .zip(measured.named())
        .zip(WEIGHTS)
        .map(|(((_, p), (_, m)), w)| w * metric_loss(*p, m))
        .sum()
}

/// An overloaded run's stage: its TPOT only (weight 2, as in [`stage_loss`]).
fn tpot_loss(predicted: &Metrics, measured: &Metrics) -> f64 {
    2.0 * metric_loss(predicted.tpot_mean, measured.tpot_mean)
}

/// The number of coefficients (re-exported for callers that list them).
pub const COEFFICIENT_COUNT: usize = COEFFICIENTS;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fidelity::score::StageScore;

    fn metrics(e2e: f64, ttft: f64, tpot: f64) -> Metrics {
        Metrics {
            e2e_mean: e2e,
            e2e_p90: e2e * 1.2,
            ttft_mean: ttft,
            ttft_p90: ttft * 1.5,
            tpot_mean: tpot,
        }
    }

    fn run(predicted: Metrics, measured: Metrics, timed_out: (f64, f64)) -> RunScore {
        let stage = |stage| StageScore {
            stage,
            count: 10,
            predicted,
            measured,
            ape: predicted.ape(&measured),
            ks_ttft: None,
            ks_e2e: None,
        };
        RunScore {
            name: "r".into(),
            stages: vec![stage(-1), stage(0)],
            unfinished: 0,
            timed_out_predicted: timed_out.0,
            timed_out_measured: Some(timed_out.1),
            prompt_rounds: None,
        }
    }

    #[test]
    fn robust_penalty_is_quadratic_near_zero_and_linear_far_out() {
        let small = robust(0.01, LOG_SCALE);
        assert!((small - 0.0001).abs() < 1e-6, "{small}");
        // Far out it grows like 2·scale·|r|: doubling the residual doubles the penalty.
        let (far, farther) = (robust(3.0, LOG_SCALE), robust(6.0, LOG_SCALE));
        assert!((farther / far - 2.0).abs() < 0.05, "{far} {farther}");
        assert!(farther < 6.0 * 6.0 / 10.0);
        assert_eq!(robust(0.0, LOG_SCALE), 0.0);
        assert_eq!(robust(-0.5, LOG_SCALE), robust(0.5, LOG_SCALE));
    }

    #[test]
    fn an_overloaded_run_is_scored_on_tpot_and_its_timed_out_fraction_only() {
        // Goal: survivors' E2E and TTFT of a run past its knee (a queue of minutes) do not
        // steer the fit; its TPOT and the timed-out fraction do.
        let measured = metrics(100_000.0, 60_000.0, 30.0);
        // Same TPOT and timed-out fraction, E2E and TTFT 60% off: no loss at all.
        let queue_off = run(metrics(40_000.0, 24_000.0, 30.0), measured, (0.5, 0.5));
        assert_eq!(score_loss(&queue_off, true, 0), 0.0);
        // TPOT 20% off costs; so does a timed-out fraction 30 points off.
        let tpot_off = run(metrics(100_000.0, 60_000.0, 24.0), measured, (0.5, 0.5));
        assert!(score_loss(&tpot_off, true, 0) > 0.01);
        let fewer = run(metrics(100_000.0, 60_000.0, 30.0), measured, (0.2, 0.5));
        assert!(score_loss(&fewer, true, 0) > 0.1);
        // A run that kept up (no failures) is scored on every metric.
        let kept_up = run(metrics(40_000.0, 24_000.0, 30.0), measured, (0.0, 0.0));
        assert!(score_loss(&kept_up, true, 0) > 0.1);
        // A summary-only run counts half; dropped requests are a plain penalty.
        let quarter = score_loss(&kept_up, false, 0) / score_loss(&kept_up, true, 0);
        assert!((quarter - SUMMARY_ONLY_WEIGHT).abs() < 1e-12);
        assert_eq!(score_loss(&queue_off, true, 3), 3.0);
    }

    #[test]
    fn a_first_round_of_prompts_priced_wrong_costs_as_a_headline_metric() {
        // Goal: the fit sees the one figure that prices a whole prefill. Method: a run exact
        // on every metric loses nothing; the same run with its first round's TTFT 30% short
        // loses what a headline metric 30% off loses.
        use crate::fidelity::rounds::{PromptRounds, RoundTtft};
        let measured = metrics(2_000.0, 30.0, 8.0);
        let round = |predicted_ms, measured_ms| RoundTtft {
            count: 90,
            predicted_ms,
            measured_ms,
        };
        let mut exact = run(measured, measured, (0.0, 0.0));
        exact.prompt_rounds = Some(PromptRounds {
            first: round(32.0, 32.0),
            second: round(26.0, 26.0),
        });
        assert_eq!(score_loss(&exact, true, 0), 0.0);
        let mut short = exact.clone();
        short.prompt_rounds = Some(PromptRounds {
            first: round(22.4, 32.0),
            second: round(26.0, 26.0),
        });
        let expected = FIRST_ROUND_WEIGHT * robust((22.4f64 / 32.0).ln(), LOG_SCALE);
        assert!((score_loss(&short, true, 0) - expected).abs() < 1e-12);
        assert!(expected > 0.03);
    }
}
