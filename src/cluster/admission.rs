//! Admission: which requests the gateway lets through.
//!
//! `always`; `token-bucket` (each request costs its prompt tokens; the bucket refills
//! continuously and starts full); saturation shedding as the gateway's legacy flow control
//! does it: while the pool's mean saturation `max(queue / q_thr, kv / kv_thr)` (over the
//! router's possibly stale views) is at least 1, `sheddable` and `background` requests are
//! rejected.

use super::config::AdmissionPolicy;
use super::signals::SignalView;
use crate::sim::{RequestSpec, SloClass};

/// Admission state.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    policy: AdmissionPolicy,
    tokens: f64,
    last_refill_us: u64,
}

impl Admission {
    /// A fresh admission controller (a token bucket starts full).
    pub fn new(policy: AdmissionPolicy) -> Self {
        let tokens = match policy {
            AdmissionPolicy::TokenBucket {
                capacity_tokens, ..
            } => capacity_tokens,
            _ => 0.0,
        };
        Self {
            policy,
            tokens,
            last_refill_us: 0,
        }
    }

    /// Decides whether `spec`, arriving at `now_us`, is admitted.
    pub fn admit(&mut self, spec: &RequestSpec, now_us: u64, views: &[SignalView]) -> bool {
        match self.policy {
            AdmissionPolicy::Always => true,
            AdmissionPolicy::TokenBucket {
                capacity_tokens,
                refill_tokens_per_s,
            } => {
                let elapsed_s = now_us.saturating_sub(self.last_refill_us) as f64 / 1e6;
                self.tokens = (self.tokens + refill_tokens_per_s * elapsed_s).min(capacity_tokens);
                self.last_refill_us = now_us;
                let cost = f64::from(spec.input_tokens);
                if self.tokens >= cost {
                    self.tokens -= cost;
                    true
                } else {
                    false
                }
            }
            AdmissionPolicy::SaturationShedding {
                queue_threshold,
                kv_threshold,
            } => {
                let sheddable =
                    matches!(spec.slo_class, SloClass::Sheddable | SloClass::Background);
                !(sheddable && mean_saturation(views, queue_threshold, kv_threshold) >= 1.0)
            }
        }
    }
}

/// Mean over instances of `max(queue / queue_threshold, kv / kv_threshold)`.
pub fn mean_saturation(views: &[SignalView], queue_threshold: f64, kv_threshold: f64) -> f64 {
    if views.is_empty() {
        return 0.0;
    }
    let total: f64 = views
        .iter()
        .map(|v| (v.queue_depth as f64 / queue_threshold).max(v.kv_usage / kv_threshold))
        .sum();
    total / views.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_bucket_refills_continuously() {
        let mut admission = Admission::new(AdmissionPolicy::TokenBucket {
            capacity_tokens: 1000.0,
            refill_tokens_per_s: 100.0,
        });
        let spec = RequestSpec::synthetic(0, 0, 600, 1);
        assert!(admission.admit(&spec, 0, &[]));
        assert!(!admission.admit(&spec, 1_000_000, &[]), "400 + 100 < 600");
        assert!(admission.admit(&spec, 2_000_000, &[]), "500 + 100 >= 600");
    }

    #[test]
    fn saturation_sheds_only_sheddable_classes() {
        let mut admission = Admission::new(AdmissionPolicy::SaturationShedding {
            queue_threshold: 5.0,
            kv_threshold: 0.8,
        });
        let busy = [SignalView {
            queue_depth: 5,
            running: 0,
            kv_usage: 0.1,
        }];
        let calm = [SignalView {
            queue_depth: 4,
            running: 0,
            kv_usage: 0.79,
        }];
        let shed = RequestSpec::synthetic(0, 0, 10, 1).with_class(SloClass::Sheddable);
        let critical = RequestSpec::synthetic(1, 0, 10, 1).with_class(SloClass::Critical);
        assert!(!admission.admit(&shed, 0, &busy));
        assert!(admission.admit(&critical, 0, &busy));
        assert!(admission.admit(&shed, 0, &calm));
    }
}
