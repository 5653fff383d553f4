//! The observed traffic the store summarises for forecasts: arrival times within a window of
//! client time and the lengths of recently finished requests, recorded as updates are
//! applied and summarised into a snapshot's [`TrafficStats`] when it is published.

use std::sync::Arc;

use super::update::AppliedUpdate;
use super::{StoreLimits, Writer};
use crate::twin::snapshot::TrafficStats;

impl Writer {
    /// Records an update's new arrivals and finished lengths (bounded by `limits`).
    pub(super) fn record_traffic(&mut self, applied: &AppliedUpdate, limits: &StoreLimits) {
        if applied.arrivals.is_empty() && applied.finished.is_empty() {
            return;
        }
        self.traffic_changed = true;
        for &arrival in &applied.arrivals {
            self.first_arrival_us = Some(self.first_arrival_us.map_or(arrival, |f| f.min(arrival)));
            self.latest_arrival_us = self.latest_arrival_us.max(arrival);
            self.arrivals.push_back(arrival);
        }
        let horizon = self
            .latest_arrival_us
            .saturating_sub(limits.arrivals_window_us);
        while self.arrivals.len() > limits.arrivals_max
            || self.arrivals.front().is_some_and(|&front| front < horizon)
        {
            self.arrivals.pop_front();
        }
        for &lengths in &applied.finished {
            self.recent_lengths.push_back(lengths);
        }
        while self.recent_lengths.len() > limits.recent_lengths_max {
            self.recent_lengths.pop_front();
        }
    }

    /// Arrivals in the last window of client time over the window (shorter at first, at
    /// least 1 s); reuses `old` when nothing changed.
    pub(super) fn traffic_stats(
        &self,
        limits: &StoreLimits,
        old: &Arc<TrafficStats>,
    ) -> Arc<TrafficStats> {
        let Some(first) = self.first_arrival_us else {
            return Arc::clone(old);
        };
        let horizon = self
            .latest_arrival_us
            .saturating_sub(limits.arrivals_window_us);
        let count = self.arrivals.iter().filter(|&&t| t >= horizon).count();
        let span_us = (self.latest_arrival_us - first)
            .min(limits.arrivals_window_us)
            .max(1_000_000);
        let stats = TrafficStats {
            arrivals_per_s: count as f64 / (span_us as f64 / 1e6),
            recent_lengths: self.recent_lengths.iter().copied().collect(),
        };
        if **old == stats {
            Arc::clone(old)
        } else {
            Arc::new(stats)
        }
    }
}
