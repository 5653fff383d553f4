//! Scoring a replay the way the field does.
//!
//! Per stage and for the whole run (stage -1): E2E mean and p90, TTFT mean and p90 (ms), and
//! TPOT mean = (E2E mean − TTFT mean) / (mean client-counted output tokens − 1), each as an
//! absolute % error against the measurement. The TPOT denominator is the measured run's
//! mean recount for both sides, so the TPOT error is the error of the mean decode time (what
//! the published `itl_mean` rows hold). Per-request runs add the two-sample
//! Kolmogorov-Smirnov distance between predicted and measured TTFT, and E2E, distributions.
//! Percentiles interpolate linearly (numpy's default, as inference-perf reports them).
//!
//! Which requests are scored: as the field does, those that succeeded in the measurement
//! (the measured side: all of them; the predicted side: those of them the simulation also
//! completed). Failed ones (the client's timeout in the overloaded runs) are replayed but
//! not scored; the fraction that timed out is reported beside, predicted and measured.

use crate::sim::metrics::interpolate_sorted;

use super::replay::Replayed;
use super::rounds::{PromptRounds, prompt_rounds};
use super::run::MeasuredRun;

/// The five summary metrics (ms).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Mean E2E.
    pub e2e_mean: f64,
    /// p90 E2E.
    pub e2e_p90: f64,
    /// Mean TTFT.
    pub ttft_mean: f64,
    /// p90 TTFT.
    pub ttft_p90: f64,
    /// Mean TPOT by the field's convention.
    pub tpot_mean: f64,
}

impl Metrics {
    /// The metrics as (name, value) pairs in report order.
    pub fn named(&self) -> [(&'static str, f64); 5] {
        [
            ("e2e_mean", self.e2e_mean),
            ("e2e_p90", self.e2e_p90),
            ("ttft_mean", self.ttft_mean),
            ("ttft_p90", self.ttft_p90),
            ("tpot_mean", self.tpot_mean),
        ]
    }

    /// Absolute % error of `self` (predicted) against `actual`, metric by metric.
    pub fn ape(&self, actual: &Metrics) -> Metrics {
        let ape = |p: f64, a: f64| {
            if a.abs() > 0.0 {
                (p - a).abs() / a.abs() * 100.0
            } else {
                f64::NAN
            }
        };
        Metrics {
            e2e_mean: ape(self.e2e_mean, actual.e2e_mean),
            e2e_p90: ape(self.e2e_p90, actual.e2e_p90),
            ttft_mean: ape(self.ttft_mean, actual.ttft_mean),
            ttft_p90: ape(self.ttft_p90, actual.ttft_p90),
            tpot_mean: ape(self.tpot_mean, actual.tpot_mean),
        }
    }
}

/// One stage's (or the whole run's) comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct StageScore {
    /// Stage index, -1 for the whole run.
    pub stage: i32,
    /// Predicted requests scored.
    pub count: usize,
    /// What ditto predicts.
    pub predicted: Metrics,
    /// What was measured.
    pub measured: Metrics,
    /// Absolute % errors.
    pub ape: Metrics,
    /// KS distance between predicted and measured per-request TTFT (per-request runs).
    pub ks_ttft: Option<f64>,
    /// KS distance between predicted and measured per-request E2E (per-request runs).
    pub ks_e2e: Option<f64>,
}

/// A run's scores: the whole run first, then each stage.
#[derive(Clone, Debug, PartialEq)]
pub struct RunScore {
    /// Run name.
    pub name: String,
    /// Whole run (stage -1) then stages 0, 1, ...
    pub stages: Vec<StageScore>,
    /// Requests the simulation did not complete.
    pub unfinished: u64,
    /// Fraction of the replayed requests the simulated client abandoned at its timeout.
    pub timed_out_predicted: f64,
    /// Fraction of the measured requests that failed (per-request runs).
    pub timed_out_measured: Option<f64>,
    /// A shared-prefix run's first round of prompts against its second (per-request runs).
    pub prompt_rounds: Option<PromptRounds>,
}

impl RunScore {
    /// The whole-run score.
    pub fn overall(&self) -> &StageScore {
        &self.stages[0]
    }
}

/// Scores `replayed` against `run`'s measurements.
pub fn score(run: &MeasuredRun, replayed: &Replayed) -> RunScore {
    let mut stages = Vec::new();
    let stage_ids: Vec<i32> = std::iter::once(-1)
        .chain(
            (0..run.stages.len() as i32)
                .filter(|&s| replayed.requests.iter().any(|r| r.stage as i32 == s)),
        )
        .collect();
    let per_request = run.has_requests();
    for stage in stage_ids {
        let in_stage = |s: usize| stage < 0 || s as i32 == stage;
        // Per-request runs score the requests that succeeded in the measurement.
        let members: Vec<_> = replayed
            .requests
            .iter()
            .filter(|r| in_stage(r.stage) && (r.measured.is_some() || !per_request))
            .collect();
        let mut ttft: Vec<f64> = members.iter().map(|r| r.ttft_us / 1e3).collect();
        let mut e2e: Vec<f64> = members.iter().map(|r| r.e2e_us / 1e3).collect();
        let truth: Vec<_> = run
            .requests
            .iter()
            .filter(|r| in_stage(run.stage_of(r.arrival_us)))
            .collect();
        let (measured, ks_ttft, ks_e2e) = if per_request && !truth.is_empty() {
            let mut m_ttft: Vec<f64> = truth.iter().map(|r| r.ttft_us / 1e3).collect();
            let mut m_e2e: Vec<f64> = truth.iter().map(|r| r.e2e_us / 1e3).collect();
            let recount = mean(
                &truth
                    .iter()
                    .map(|r| f64::from(r.output_recount))
                    .collect::<Vec<_>>(),
            );
            let measured = metrics(&mut m_ttft, &mut m_e2e, recount);
            let ks_t = ks_distance(&mut ttft, &mut m_ttft);
            let ks_e = ks_distance(&mut e2e, &mut m_e2e);
            (measured, Some(ks_t), Some(ks_e))
        } else {
            (summary_actuals(run, stage), None, None)
        };
        let recount = recount_of(&measured);
        let predicted = metrics(&mut ttft, &mut e2e, recount);
        stages.push(StageScore {
            stage,
            count: members.len(),
            ape: predicted.ape(&measured),
            predicted,
            measured,
            ks_ttft,
            ks_e2e,
        });
    }
    RunScore {
        name: run.name.clone(),
        stages,
        unfinished: replayed.unfinished,
        timed_out_predicted: if replayed.total > 0 {
            replayed.timed_out as f64 / replayed.total as f64
        } else {
            0.0
        },
        timed_out_measured: run.failed_fraction(),
        prompt_rounds: prompt_rounds(run, replayed),
    }
}

/// The output-token count the measured TPOT implies: 1 + (E2E − TTFT)/TPOT.
fn recount_of(measured: &Metrics) -> f64 {
    if measured.tpot_mean > 0.0 {
        1.0 + (measured.e2e_mean - measured.ttft_mean) / measured.tpot_mean
    } else {
        f64::NAN
    }
}

/// Summary metrics of TTFT and E2E samples (ms; sorted in place) with mean recount `recount`.
fn metrics(ttft: &mut [f64], e2e: &mut [f64], recount: f64) -> Metrics {
    ttft.sort_by(f64::total_cmp);
    e2e.sort_by(f64::total_cmp);
    let p90 = |values: &[f64]| {
        if values.is_empty() {
            f64::NAN
        } else {
            interpolate_sorted(values, 90.0)
        }
    };
    let e2e_mean = mean(e2e);
    let ttft_mean = mean(ttft);
    Metrics {
        e2e_mean,
        e2e_p90: p90(e2e),
        ttft_mean,
        ttft_p90: p90(ttft),
        tpot_mean: (e2e_mean - ttft_mean) / (recount - 1.0),
    }
}

/// The published summary actuals of `stage` (`itl_mean` holds the field's TPOT).
fn summary_actuals(run: &MeasuredRun, stage: i32) -> Metrics {
    let get = |metric: &str| {
        run.actuals
            .get(&(stage, metric.to_string()))
            .copied()
            .unwrap_or(f64::NAN)
    };
    Metrics {
        e2e_mean: get("e2e_mean"),
        e2e_p90: get("e2e_p90"),
        ttft_mean: get("ttft_mean"),
        ttft_p90: get("ttft_p90"),
        tpot_mean: get("itl_mean"),
    }
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

/// Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs
/// (both sorted in place). 0 for identical samples, 1 for disjoint ones.
pub fn ks_distance(a: &mut [f64], b: &mut [f64]) -> f64 {
    if a.is_empty() || b.is_empty() {
        return f64::NAN;
    }
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (n, m) = (a.len() as f64, b.len() as f64);
    let (mut i, mut j, mut gap) = (0usize, 0usize, 0.0f64);
    while i < a.len() && j < b.len() {
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        gap = gap.max((i as f64 / n - j as f64 / m).abs());
    }
    gap
}

/// Median of the finite values (NaN when none).
pub fn median(values: &[f64]) -> f64 {
    let mut finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return f64::NAN;
    }
    finite.sort_by(f64::total_cmp);
    let mid = finite.len() / 2;
    if finite.len() % 2 == 1 {
        finite[mid]
    } else {
        (finite[mid - 1] + finite[mid]) / 2.0
    }
}

/// Median across runs of each whole-run absolute % error.
pub fn median_ape(scores: &[RunScore]) -> Metrics {
    let pick = |f: fn(&Metrics) -> f64| {
        median(
            &scores
                .iter()
                .map(|s| f(&s.overall().ape))
                .collect::<Vec<_>>(),
        )
    };
    Metrics {
        e2e_mean: pick(|m| m.e2e_mean),
        e2e_p90: pick(|m| m.e2e_p90),
        ttft_mean: pick(|m| m.ttft_mean),
        ttft_p90: pick(|m| m.ttft_p90),
        tpot_mean: pick(|m| m.tpot_mean),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ks_distance_of_identical_and_disjoint_samples() {
        let mut a = vec![3.0, 1.0, 2.0];
        let mut b = vec![1.0, 2.0, 3.0];
        assert_eq!(ks_distance(&mut a, &mut b), 0.0);
        let mut c = vec![10.0, 11.0];
        assert_eq!(ks_distance(&mut a, &mut c), 1.0);
        let mut d = vec![1.0, 2.0, 30.0, 40.0];
        // F_a(2) = 2/3... F_a(3) = 1 vs F_d(3) = 1/2 → 0.5.
        assert!((ks_distance(&mut a, &mut d) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn ape_and_median() {
        let p = Metrics {
            e2e_mean: 110.0,
            ..Metrics::default()
        };
        let a = Metrics {
            e2e_mean: 100.0,
            ..Metrics::default()
        };
        assert!((p.ape(&a).e2e_mean - 10.0).abs() < 1e-12);
        assert!(p.ape(&a).ttft_mean.is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[f64::NAN]).is_nan());
    }
}
