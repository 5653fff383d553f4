//! The KV transfer model fitted online to what the decode pods measure (docs/disaggregation.md,
//! "Fitted from the pods").
//!
//! vLLM's NIXL connector exports, per engine, histograms of every finished pull: its duration
//! (`vllm:nixl_xfer_time_seconds`), bytes (`vllm:nixl_bytes_transferred`) and descriptors
//! (`vllm:nixl_num_descriptors`), and a counter of failed transfers
//! (`vllm:nixl_num_failed_transfers`) (vLLM `kv_connector/v1/nixl_connector.py`,
//! `NixlPromMetrics`). Their `_sum` and `_count` between two scrapes give the totals of the
//! pulls that finished in between: `n` transfers moving `B` bytes in `D` descriptors over `T`
//! seconds. The catalog's model prices the same pulls at `n × setup + B / bandwidth + D ×
//! descriptor` ([`TransferModel`]); the fit is the ratio of the two over the recent pulls
//! (their totals decayed, priced when asked), and the model the twin forks with is the
//! catalog's scaled by it.
//!
//! One scale, not three parameters: at a pod's fixed block size bytes and descriptors grow
//! together, so sums cannot tell the bandwidth from the descriptor cost; the catalog keeps
//! their proportion (sourced), the pods set the level. Pure: fed counters, no clock.

use super::disagg::TransferModel;

/// A pod's cumulative NIXL counters, as its `/metrics` page shows them (summed over engines).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct TransferCounters {
    /// Finished pulls (`vllm:nixl_xfer_time_seconds_count`).
    pub transfers: f64,
    /// Their total duration, seconds (`vllm:nixl_xfer_time_seconds_sum`).
    pub seconds: f64,
    /// Their total bytes (`vllm:nixl_bytes_transferred_sum`).
    pub bytes: f64,
    /// Their total descriptors (`vllm:nixl_num_descriptors_sum`).
    pub descriptors: f64,
    /// Failed transfers (`vllm:nixl_num_failed_transfers_total`).
    pub failed: f64,
}

impl TransferCounters {
    /// Why these counters cannot be taken (a field not finite or negative), naming it.
    pub fn invalid_field(&self) -> Option<&'static str> {
        [
            ("transfers", self.transfers),
            ("seconds", self.seconds),
            ("bytes", self.bytes),
            ("descriptors", self.descriptors),
            ("failed", self.failed),
        ]
        .into_iter()
        .find(|(_, value)| !(value.is_finite() && *value >= 0.0))
        .map(|(name, _)| name)
    }

    /// What finished between `before` and `self`, or `None` when a counter went back (the
    /// pod restarted: Prometheus's reset rule) or nothing finished.
    pub fn since(&self, before: &TransferCounters) -> Option<TransferCounters> {
        let delta = TransferCounters {
            transfers: self.transfers - before.transfers,
            seconds: self.seconds - before.seconds,
            bytes: self.bytes - before.bytes,
            descriptors: self.descriptors - before.descriptors,
            failed: self.failed - before.failed,
        };
        let reset = [
            delta.transfers,
            delta.seconds,
            delta.bytes,
            delta.descriptors,
            delta.failed,
        ]
        .iter()
        .any(|value| *value < 0.0);
        (!reset && (delta.transfers > 0.0 || delta.failed > 0.0)).then_some(delta)
    }
}

/// Pulls the fit must have seen before the twin uses it (below, the catalog's model alone).
pub const MIN_TRANSFERS: f64 = 20.0;

/// Weight an old pull keeps after this many newer ones: 1/2 (the fit follows a link that
/// slows down within a few hundred pulls, and does not chase one slow pull).
pub const HALF_LIFE_TRANSFERS: f64 = 500.0;

/// The scale is kept within these bounds: past them the counters describe something other
/// than the link the catalog names (a misconfigured connector), said on GetSnapshot.
pub const SCALE_BOUNDS: (f64, f64) = (0.05, 50.0);

/// What one decode pod's recent pulls measured: their totals, decayed by
/// [`HALF_LIFE_TRANSFERS`] so the fit follows the link. Priced against a model only when
/// asked ([`Self::scale`]), so a changed catalog link or override applies at once.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct TransferFit {
    /// The recent pulls' totals (decayed); `failed` counts failed transfers.
    recent: TransferCounters,
    /// Pulls seen in all, not decayed (for reporting).
    total_transfers: f64,
}

impl TransferFit {
    /// Folds in what finished between two scrapes.
    pub fn observe(&mut self, delta: &TransferCounters) {
        if delta.transfers <= 0.0 && delta.failed <= 0.0 {
            return;
        }
        let keep = 0.5f64.powf(delta.transfers.max(0.0) / HALF_LIFE_TRANSFERS);
        let recent = &mut self.recent;
        recent.transfers = recent.transfers * keep + delta.transfers;
        recent.seconds = recent.seconds * keep + delta.seconds;
        recent.bytes = recent.bytes * keep + delta.bytes;
        recent.descriptors = recent.descriptors * keep + delta.descriptors;
        recent.failed = recent.failed * keep + delta.failed;
        self.total_transfers += delta.transfers;
    }

    /// Pulls observed in all.
    pub fn total_transfers(&self) -> f64 {
        self.total_transfers
    }

    /// Measured over `model`'s time for the recent pulls, unclamped; `None` before
    /// [`MIN_TRANSFERS`] pulls or when the model prices them at nothing.
    pub fn raw_scale(&self, model: &TransferModel) -> Option<f64> {
        let recent = &self.recent;
        let modelled_us = recent.transfers * model.setup_us as f64
            + recent.bytes / (model.bandwidth_gb_s * 1e3)
            + recent.descriptors * model.descriptor_us;
        (recent.transfers >= MIN_TRANSFERS && modelled_us > 0.0)
            .then(|| recent.seconds * 1e6 / modelled_us)
            .filter(|scale| scale.is_finite())
    }

    /// The scale the twin applies: [`Self::raw_scale`] within [`SCALE_BOUNDS`].
    pub fn scale(&self, model: &TransferModel) -> Option<f64> {
        self.raw_scale(model)
            .map(|scale| scale.clamp(SCALE_BOUNDS.0, SCALE_BOUNDS.1))
    }

    /// Failed over attempted transfers of the recent pulls; `None` before [`MIN_TRANSFERS`].
    pub fn failure_ratio(&self) -> Option<f64> {
        let attempts = self.recent.transfers + self.recent.failed;
        (attempts >= MIN_TRANSFERS).then(|| self.recent.failed / attempts)
    }

    /// `model` with every cost scaled by the fit (unchanged before it has evidence).
    pub fn apply(&self, model: &TransferModel) -> TransferModel {
        match self.scale(model) {
            None => *model,
            Some(scale) => TransferModel {
                bandwidth_gb_s: model.bandwidth_gb_s / scale,
                descriptor_us: model.descriptor_us * scale,
                setup_us: (model.setup_us as f64 * scale).round() as u64,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> TransferModel {
        TransferModel {
            bandwidth_gb_s: 50.0,
            descriptor_us: 0.5,
            setup_us: 1_000,
        }
    }

    /// Totals of `n` pulls of `bytes` and `descriptors` each, priced by `truth`.
    fn pulls(n: f64, bytes: f64, descriptors: f64, truth: &TransferModel) -> TransferCounters {
        let one_us = truth.setup_us as f64
            + bytes / (truth.bandwidth_gb_s * 1e3)
            + descriptors * truth.descriptor_us;
        TransferCounters {
            transfers: n,
            seconds: n * one_us / 1e6,
            bytes: n * bytes,
            descriptors: n * descriptors,
            failed: 0.0,
        }
    }

    #[test]
    fn a_link_twice_as_slow_as_the_catalog_is_fitted_at_scale_two() {
        let slow = TransferModel {
            bandwidth_gb_s: 25.0,
            descriptor_us: 1.0,
            setup_us: 2_000,
        };
        let mut fit = TransferFit::default();
        fit.observe(&pulls(100.0, 300e6, 20_000.0, &slow));
        let scale = fit.scale(&catalog()).expect("enough pulls");
        assert!((scale - 2.0).abs() < 1e-6, "{scale}");
        let fitted = fit.apply(&catalog());
        let kv = super::super::disagg::InstanceKv {
            bytes_per_token_per_rank: 65_536.0,
            layers: 32,
            planes: 2,
            tp: 1,
            block_size: 16,
        };
        let want = slow.transfer_us(&kv, &kv, 5_000) as f64;
        let got = fitted.transfer_us(&kv, &kv, 5_000) as f64;
        assert!((got - want).abs() / want < 1e-3, "{got} vs {want}");
    }

    #[test]
    fn too_few_pulls_leave_the_catalog_model() {
        let mut fit = TransferFit::default();
        fit.observe(&pulls(5.0, 1e6, 100.0, &catalog()));
        assert_eq!(fit.scale(&catalog()), None);
        assert_eq!(fit.apply(&catalog()), catalog());
    }

    #[test]
    fn the_fit_follows_a_link_that_slows_down() {
        let slow = TransferModel {
            bandwidth_gb_s: 10.0,
            descriptor_us: 2.5,
            setup_us: 5_000,
        };
        let mut fit = TransferFit::default();
        for _ in 0..20 {
            fit.observe(&pulls(100.0, 1e7, 1_000.0, &catalog()));
        }
        assert!((fit.scale(&catalog()).unwrap() - 1.0).abs() < 1e-9);
        for _ in 0..30 {
            fit.observe(&pulls(100.0, 1e7, 1_000.0, &slow));
        }
        // 3,000 slow pulls after 2,000 at the catalog's level: the old ones weigh 1/64.
        let scale = fit.scale(&catalog()).unwrap();
        assert!(scale > 4.8 && scale < 5.0, "{scale}");
    }

    #[test]
    fn failures_are_a_ratio_of_attempts() {
        let mut fit = TransferFit::default();
        let mut delta = pulls(90.0, 1e6, 100.0, &catalog());
        delta.failed = 10.0;
        fit.observe(&delta);
        let ratio = fit.failure_ratio().unwrap();
        assert!((ratio - 0.1).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn a_counter_that_goes_back_is_a_restart_not_a_delta() {
        let before = pulls(100.0, 1e6, 100.0, &catalog());
        let after = pulls(10.0, 1e6, 100.0, &catalog());
        assert_eq!(after.since(&before), None);
        assert_eq!(before.since(&before), None, "nothing finished");
        let later = pulls(150.0, 1e6, 100.0, &catalog());
        let delta = later.since(&before).unwrap();
        assert!((delta.transfers - 50.0).abs() < 1e-9);
    }

    #[test]
    fn bad_counters_name_their_field() {
        let counters = TransferCounters {
            bytes: f64::NAN,
            ..TransferCounters::default()
        };
        assert_eq!(counters.invalid_field(), Some("bytes"));
        let counters = TransferCounters {
            failed: -1.0,
            ..TransferCounters::default()
        };
        assert_eq!(counters.invalid_field(), Some("failed"));
        assert_eq!(TransferCounters::default().invalid_field(), None);
    }

    #[test]
    fn an_absurd_level_is_clamped_but_reported() {
        let mut fit = TransferFit::default();
        let mut delta = pulls(100.0, 1e6, 100.0, &catalog());
        delta.seconds *= 1_000.0;
        fit.observe(&delta);
        assert!(fit.raw_scale(&catalog()).unwrap() > 900.0);
        assert_eq!(fit.scale(&catalog()), Some(SCALE_BOUNDS.1));
    }
}
