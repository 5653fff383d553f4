//! Arrival processes and the per-client arrival clock.
//!
//! An [`ArrivalProcess`] says how gaps between one client's requests are shaped (Poisson,
//! gamma with a coefficient of variation, or constant spacing); the rate comes from the
//! spec's piecewise-constant [`RateSegment`] schedule times the client's share.
//! [`ArrivalClock`] walks that schedule, one arrival at a time, in integer microseconds.
//!
//! Stage boundaries: a segment covers the half-open interval `(start_us, end_us]`. When a
//! candidate arrival falls past the end of its segment, it is discarded and the clock
//! restarts at the next segment's start with a fresh gap drawn at the new rate. For Poisson
//! arrivals this is exact (memorylessness); for constant arrivals it means each stage
//! yields arrivals at `start + k/rate`, `k = 1, 2, ...`, so a stage of rate `r` and length
//! `d` yields `floor(r·d)` arrivals, up to the µs rounding of `k/rate`.
//!
//! Knows nothing about token lengths, request ids or the other clients.

use rand_distr::{Distribution, Exp1, Gamma};
use serde::Deserialize;

use crate::sim::rng::SimRng;
use crate::workload::dist::check_positive;
use crate::workload::error::WorkloadError;

/// Largest accepted coefficient of variation for gamma arrivals (beyond it the shape
/// `1/cv²` is so small that almost all requests arrive in a handful of bursts).
pub const GAMMA_CV_MAX: f64 = 100.0;

/// Microseconds per second, for rate and duration conversions.
const US_PER_S: f64 = 1_000_000.0;

/// How the gaps between one client's arrivals are distributed (`process:` selects it).
///
/// YAML: `{process: poisson}`, `{process: gamma, cv: 2.0}` or `{process: constant}`; any
/// other key is rejected (read through `RawArrival`, because serde ignores
/// `deny_unknown_fields` on the unit variants of an internally tagged enum).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(try_from = "RawArrival")]
pub enum ArrivalProcess {
    /// Exponential gaps with mean `1/rate` (a Poisson process).
    Poisson,
    /// Gamma gaps with mean `1/rate` and coefficient of variation `cv` (`cv > 1` is burstier
    /// than Poisson, `cv < 1` smoother; `cv = 1` is Poisson).
    Gamma {
        /// Coefficient of variation of the gaps (in `(0, GAMMA_CV_MAX]`).
        cv: f64,
    },
    /// Gaps of exactly `1/rate` (rounded to whole microseconds without drift).
    Constant,
}

/// The YAML shape of an arrival process, before the `process`/`cv` pairing is checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawArrival {
    process: ProcessName,
    #[serde(default)]
    cv: Option<f64>,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ProcessName {
    Poisson,
    Gamma,
    Constant,
}

impl TryFrom<RawArrival> for ArrivalProcess {
    type Error = String;

    fn try_from(raw: RawArrival) -> Result<Self, String> {
        match (raw.process, raw.cv) {
            (ProcessName::Gamma, Some(cv)) => Ok(ArrivalProcess::Gamma { cv }),
            (ProcessName::Gamma, None) => Err("`process: gamma` needs `cv`".to_owned()),
            (_, Some(_)) => Err("`cv` applies only to `process: gamma`".to_owned()),
            (ProcessName::Poisson, None) => Ok(ArrivalProcess::Poisson),
            (ProcessName::Constant, None) => Ok(ArrivalProcess::Constant),
        }
    }
}

impl ArrivalProcess {
    /// Checks the process's parameters; `path` names the field in errors.
    pub fn validate(&self, path: &str) -> Result<(), WorkloadError> {
        if let ArrivalProcess::Gamma { cv } = self {
            let path = format!("{path}.cv");
            check_positive(&path, *cv)?;
            if *cv > GAMMA_CV_MAX {
                return Err(WorkloadError::invalid(
                    path,
                    format!("must be <= {GAMMA_CV_MAX} (got {cv})"),
                ));
            }
        }
        Ok(())
    }

    fn gap_sampler(&self, path: &str) -> Result<GapSampler, WorkloadError> {
        self.validate(path)?;
        Ok(match self {
            ArrivalProcess::Poisson => GapSampler::Exponential,
            ArrivalProcess::Gamma { cv } => {
                // Unit mean: shape k = 1/cv², scale = cv², so k·scale = 1 and cv = 1/sqrt(k).
                let cv_sq = cv * cv;
                let gamma = Gamma::new(1.0 / cv_sq, cv_sq)
                    .map_err(|err| WorkloadError::invalid(path, err.to_string()))?;
                GapSampler::Gamma(gamma)
            }
            ArrivalProcess::Constant => GapSampler::Constant,
        })
    }
}

/// One piece of the rate schedule: the aggregate rate over `(start_us, end_us]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RateSegment {
    /// Exclusive start of the segment.
    pub(crate) start_us: u64,
    /// Inclusive end; `None` means the segment never ends.
    pub(crate) end_us: Option<u64>,
    /// Aggregate arrival rate over all clients, requests per second (finite, above 0).
    pub(crate) rate_per_s: f64,
}

/// Unit-mean gap shapes.
#[derive(Clone, Debug)]
enum GapSampler {
    Exponential,
    Gamma(Gamma<f64>),
    Constant,
}

/// One client's position in the arrival schedule.
#[derive(Clone, Debug)]
pub(crate) struct ArrivalClock {
    sampler: GapSampler,
    rng: SimRng,
    /// The client's share of the aggregate rate (in `(0, 1]`).
    fraction: f64,
    segment_index: usize,
    /// Arrivals already produced in the current segment.
    arrivals_in_segment: u64,
    last_us: u64,
}

impl ArrivalClock {
    /// A clock at time 0 drawing from `rng`, for a client with share `fraction` of the rate.
    pub(crate) fn new(
        process: &ArrivalProcess,
        path: &str,
        rng: SimRng,
        fraction: f64,
    ) -> Result<Self, WorkloadError> {
        debug_assert!(
            fraction > 0.0 && fraction <= 1.0,
            "rate fraction {fraction} out of (0, 1]"
        );
        Ok(Self {
            sampler: process.gap_sampler(path)?,
            rng,
            fraction,
            segment_index: 0,
            arrivals_in_segment: 0,
            last_us: 0,
        })
    }

    /// The client's next arrival, strictly after the previous one, or `None` once the
    /// schedule is over.
    pub(crate) fn next_arrival(&mut self, schedule: &[RateSegment]) -> Option<u64> {
        // Each pass either returns or moves to the next segment: bounded by its length.
        while let Some(segment) = schedule.get(self.segment_index) {
            let rate_per_s = segment.rate_per_s * self.fraction;
            debug_assert!(rate_per_s > 0.0, "rate {rate_per_s} must be positive");
            let mean_gap_us = US_PER_S / rate_per_s;
            let candidate = match &self.sampler {
                GapSampler::Constant => {
                    // From the segment start, so rounding never accumulates.
                    let steps = (self.arrivals_in_segment + 1) as f64;
                    let offset_us = ((steps * mean_gap_us).round() as u64).max(1);
                    segment.start_us.saturating_add(offset_us)
                }
                GapSampler::Exponential => {
                    let unit: f64 = Exp1.sample(&mut self.rng);
                    self.last_us.saturating_add(gap_us(unit * mean_gap_us))
                }
                GapSampler::Gamma(gamma) => {
                    let unit = gamma.sample(&mut self.rng);
                    self.last_us.saturating_add(gap_us(unit * mean_gap_us))
                }
            };
            if segment.end_us.is_none_or(|end_us| candidate <= end_us) {
                debug_assert!(
                    candidate > self.last_us || self.last_us == u64::MAX,
                    "arrival {candidate} not after {}",
                    self.last_us
                );
                self.arrivals_in_segment += 1;
                self.last_us = candidate;
                return Some(candidate);
            }
            self.segment_index += 1;
            self.arrivals_in_segment = 0;
            if let Some(next) = schedule.get(self.segment_index) {
                self.last_us = next.start_us;
            }
        }
        None
    }
}

/// A gap in whole microseconds: rounded, at least 1 (as BLIS), saturating on overflow.
fn gap_us(gap: f64) -> u64 {
    (gap.round() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::rng::RngStreams;

    fn clock(process: ArrivalProcess) -> ArrivalClock {
        ArrivalClock::new(&process, "arrival", RngStreams::new(3).stream("a"), 1.0).unwrap()
    }

    #[test]
    fn constant_spacing_has_no_drift() {
        // 3 req/s is 333,333.3 µs: rounding each multiple keeps the 1000th arrival exact.
        let schedule = [RateSegment {
            start_us: 0,
            end_us: None,
            rate_per_s: 3.0,
        }];
        let mut clock = clock(ArrivalProcess::Constant);
        let arrivals: Vec<u64> = (0..1000)
            .map(|_| clock.next_arrival(&schedule).unwrap())
            .collect();
        assert_eq!(arrivals[0], 333_333);
        assert_eq!(arrivals[2], 1_000_000);
        assert_eq!(arrivals[999], 333_333_333);
    }

    #[test]
    fn segments_restart_at_their_start() {
        let schedule = [
            RateSegment {
                start_us: 0,
                end_us: Some(1_000_000),
                rate_per_s: 4.0,
            },
            RateSegment {
                start_us: 1_000_000,
                end_us: Some(2_000_000),
                rate_per_s: 10.0,
            },
        ];
        let mut clock = clock(ArrivalProcess::Constant);
        let arrivals: Vec<u64> = std::iter::from_fn(|| clock.next_arrival(&schedule)).collect();
        let mut expected: Vec<u64> = (1..=4).map(|k| k * 250_000).collect();
        expected.extend((1..=10).map(|k| 1_000_000 + k * 100_000));
        assert_eq!(arrivals, expected);
    }

    #[test]
    fn gamma_gaps_have_requested_mean_and_cv() {
        let schedule = [RateSegment {
            start_us: 0,
            end_us: None,
            rate_per_s: 100.0,
        }];
        let mut clock = clock(ArrivalProcess::Gamma { cv: 2.0 });
        let mut previous = 0;
        let gaps: Vec<f64> = (0..50_000)
            .map(|_| {
                let now = clock.next_arrival(&schedule).unwrap();
                let gap = (now - previous) as f64;
                previous = now;
                gap
            })
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((mean - 10_000.0).abs() < 400.0, "mean {mean}");
        assert!((cv - 2.0).abs() < 0.15, "cv {cv}");
    }

    #[test]
    fn gamma_cv_is_validated() {
        for cv in [0.0, -1.0, f64::NAN, 1e9] {
            let err = ArrivalProcess::Gamma { cv }
                .validate("arrival")
                .unwrap_err();
            assert!(
                matches!(&err, WorkloadError::Invalid { path, .. } if path == "arrival.cv"),
                "{err}"
            );
        }
    }
}
