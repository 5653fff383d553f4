//! The observed traffic the store summarises for forecasts: arrival times within a window of
//! client time and the lengths of recently finished requests, recorded as updates are
//! applied (or counted by a pulling edge, [`MirrorStore::record_arrivals`]) and summarised
//! into a snapshot's [`TrafficStats`] when it is published.

use std::sync::Arc;

use super::update::AppliedUpdate;
use super::{MirrorStore, StoreLimits, Writer, lock, no_config};
use crate::twin::error::TwinError;
use crate::twin::snapshot::TrafficStats;

impl MirrorStore {
    /// Records arrivals a pulling edge counted without seeing the requests (the live mirror
    /// reads them from a pod's finished-request counter: see docs/live.md), at the given
    /// client times (µs). Only the traffic record changes: no instance state, no new
    /// generation now; the summary is rebuilt when the staged writes are next published
    /// ([`MirrorStore::publish_staged`]). At most `arrivals_max` of them are kept (the
    /// latest). Fails only when no config is synced.
    pub fn record_arrivals(&self, arrivals: &[u64]) -> Result<(), TwinError> {
        let mut writer = lock(&self.writer);
        writer.current().ok_or_else(no_config)?;
        let kept = &arrivals[arrivals.len().saturating_sub(self.limits.arrivals_max)..];
        writer.record(kept, &[], &self.limits);
        Ok(())
    }
}

impl Writer {
    /// Records an update's new arrivals and finished lengths (bounded by `limits`).
    pub(super) fn record_traffic(&mut self, applied: &AppliedUpdate, limits: &StoreLimits) {
        self.record(&applied.arrivals, &applied.finished, limits);
    }

    /// Records arrival times and finished lengths (bounded by `limits`).
    fn record(&mut self, arrivals: &[u64], finished: &[(u32, u32)], limits: &StoreLimits) {
        if arrivals.is_empty() && finished.is_empty() {
            return;
        }
        self.traffic_changed = true;
        for &arrival in arrivals {
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
        for &lengths in finished {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::twin::snapshot::TwinSettings;
    use crate::twin::store::Publish;

    fn synced(limits: StoreLimits) -> MirrorStore {
        let store = MirrorStore::new(limits);
        let cluster = crate::cluster::spec::default_cluster();
        store
            .sync_config(cluster, TwinSettings::defaults(), Vec::new())
            .expect("the default cluster syncs");
        store
    }

    #[test]
    fn recorded_arrivals_make_the_rate_at_the_next_publish() {
        assert_eq!(
            MirrorStore::new(StoreLimits::DEFAULT).record_arrivals(&[1]),
            Err(TwinError::NotSynced)
        );
        let store = synced(StoreLimits::DEFAULT);
        let arrivals: Vec<u64> = (1..=50).map(|i| 1_000_000 + i * 200_000).collect();
        store.record_arrivals(&arrivals).expect("synced");
        // Staged: nothing published until a staged write is.
        let rate = |store: &MirrorStore| {
            store
                .latest()
                .map(|stored| stored.snapshot.traffic.arrivals_per_s)
        };
        assert_eq!(rate(&store), Some(0.0));
        let id = crate::cluster::spec::default_cluster().instances[0]
            .id
            .clone();
        store
            .set_capped_note(&id, Some("note".to_owned()), Publish::Staged)
            .expect("known instance");
        store.publish_staged().expect("a staged write");
        // 50 arrivals over 9.8 s of client time.
        let observed = rate(&store).expect("published");
        assert!((observed - 50.0 / 9.8).abs() < 1e-9, "{observed}");
    }

    #[test]
    fn at_most_arrivals_max_are_kept() {
        let limits = StoreLimits {
            arrivals_max: 10,
            ..StoreLimits::DEFAULT
        };
        let store = synced(limits);
        let arrivals: Vec<u64> = (1..=1000).collect();
        store.record_arrivals(&arrivals).expect("synced");
        let writer = lock(&store.writer);
        assert_eq!(writer.arrivals.len(), 10);
        assert_eq!(writer.arrivals.front(), Some(&991), "the latest kept");
    }
}
