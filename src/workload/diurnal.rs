//! A diurnal rate curve: a sinusoid between a trough and a peak over a period (a day by
//! default), peaking at a given time of the period, turned into piecewise-constant stages
//! of `step_s` seconds, each at the curve's mean over its span (so the day's request count
//! is the curve's integral). Validation names `diurnal.*` fields. The field's type is the
//! spec's ([`Diurnal`] in `spec.rs`); its curve and stages are here.

use crate::workload::dist::check_positive;
use crate::workload::error::WorkloadError;
use crate::workload::spec::{Diurnal, STAGES_MAX, Stage};

impl Diurnal {
    /// The curve's rate at `t` seconds.
    pub fn rate_at(&self, t: f64) -> f64 {
        let peak_at = self.peak_at_s.unwrap_or(self.period_s * 14.0 / 24.0);
        let mid = 0.5 * (self.peak_rate + self.trough_rate);
        let amplitude = 0.5 * (self.peak_rate - self.trough_rate);
        let phase = 2.0 * std::f64::consts::PI * (t - peak_at) / self.period_s;
        mid + amplitude * phase.cos()
    }

    /// The curve as stages, each at its mean rate over the stage.
    pub fn stages(&self) -> Result<Vec<Stage>, WorkloadError> {
        check_positive("diurnal.trough_rate", self.trough_rate)?;
        check_positive("diurnal.peak_rate", self.peak_rate)?;
        check_positive("diurnal.period_s", self.period_s)?;
        check_positive("diurnal.step_s", self.step_s)?;
        if self.peak_rate < self.trough_rate {
            return Err(WorkloadError::invalid(
                "diurnal.peak_rate",
                "must be at least trough_rate",
            ));
        }
        if let Some(at) = self.peak_at_s
            && !(at.is_finite() && at >= 0.0)
        {
            return Err(WorkloadError::invalid(
                "diurnal.peak_at_s",
                "must be a non-negative number",
            ));
        }
        let duration = self.duration_s.unwrap_or(self.period_s);
        check_positive("diurnal.duration_s", duration)?;
        let count = (duration / self.step_s).ceil();
        if count > STAGES_MAX as f64 {
            return Err(WorkloadError::invalid(
                "diurnal.step_s",
                format!("{count} stages exceed {STAGES_MAX}: use a longer step"),
            ));
        }
        let mut stages = Vec::with_capacity(count as usize);
        let mut start = 0.0;
        while start < duration {
            let length = self.step_s.min(duration - start);
            // The mean over the stage: Simpson's rule on the sinusoid (exact enough at a
            // step well under the period).
            let mean = (self.rate_at(start)
                + 4.0 * self.rate_at(start + 0.5 * length)
                + self.rate_at(start + length))
                / 6.0;
            stages.push(Stage {
                rate: mean.max(self.trough_rate),
                duration_s: length,
            });
            start += length;
        }
        Ok(stages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_peaks_at_its_time_and_integrates_to_its_mean() {
        let curve = Diurnal {
            trough_rate: 5.0,
            peak_rate: 45.0,
            period_s: 86_400.0,
            peak_at_s: None,
            duration_s: None,
            step_s: 300.0,
        };
        assert!((curve.rate_at(50_400.0) - 45.0).abs() < 1e-9);
        assert!((curve.rate_at(50_400.0 - 43_200.0) - 5.0).abs() < 1e-9);
        let stages = curve.stages().unwrap();
        assert_eq!(stages.len(), 288);
        let requests: f64 = stages.iter().map(|s| s.rate * s.duration_s).sum();
        assert!((requests / 86_400.0 - 25.0).abs() < 1e-6, "{requests}");
        let bad = Diurnal {
            peak_rate: 1.0,
            ..curve
        };
        assert!(
            bad.stages()
                .unwrap_err()
                .to_string()
                .contains("diurnal.peak_rate")
        );
    }
}
