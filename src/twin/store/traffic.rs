//! The observed traffic the store summarises for forecasts: arrival times within a window of
//! client time and the lengths of recently finished requests, recorded as updates are
//! applied (or counted by a pulling edge, [`MirrorStore::record_arrivals`]) and summarised
//! into a snapshot's [`TrafficStats`] when it is published: for the whole mirror, and per
//! pool ([`PoolTraffic`]: the instances of one name, namespace and role, named as
//! `twin::desired::pool_name` names them), so each pool's forecast reads its own load.
//!
//! Each recorded arrival carries its instance's pool; one window of client time (ending at
//! the latest arrival of any pool) and one bound on arrivals kept serve every pool, so the
//! pools' rates add up to the mirror's. Finished lengths are kept per pool too, each pool's
//! bounded like the mirror's.

use std::collections::VecDeque;
use std::sync::Arc;

use super::update::AppliedUpdate;
use super::{MirrorStore, StoreLimits, Writer, instance_index, lock, no_config};
use crate::cluster::config::{ClusterConfig, InstanceRole};
use crate::twin::desired::pool_name;
use crate::twin::error::TwinError;
use crate::twin::snapshot::{PoolTraffic, TrafficStats, TwinSettings};

/// A pool as the traffic record keys it: (the namespace its ids carry, else empty; its name;
/// its role).
pub(super) type PoolKey = (String, String, InstanceRole);

/// Where the pools' traffic is recorded (the writer's; index = pool id).
#[derive(Debug, Default)]
pub(super) struct PoolRecords {
    /// Every pool seen since the store was created or cleared, by pool id.
    keys: Vec<PoolKey>,
    /// Each pool's recent finished lengths, by pool id.
    lengths: Vec<VecDeque<(u32, u32)>>,
    /// The pool id of each instance of the config in force (index-aligned).
    of_instance: Vec<u32>,
}

impl PoolRecords {
    /// Assigns each instance of `cluster` its pool (new pools are added; pools no instance
    /// is in any more keep their record until it ages out of the window).
    pub(super) fn assign(&mut self, cluster: &ClusterConfig, settings: &TwinSettings) {
        let mut of_instance = Vec::with_capacity(cluster.instances.len());
        for instance in &cluster.instances {
            let (namespace, name) = pool_name(&instance.id, settings);
            let key = (
                namespace.unwrap_or_default().to_owned(),
                name.to_owned(),
                instance.role,
            );
            let id = match self.keys.iter().position(|known| *known == key) {
                Some(id) => id,
                None => {
                    self.keys.push(key);
                    self.lengths.push(VecDeque::new());
                    self.keys.len() - 1
                }
            };
            of_instance.push(u32::try_from(id).unwrap_or(u32::MAX));
        }
        self.of_instance = of_instance;
    }

    /// The pool id of instance `index` of the config in force.
    fn of(&self, index: usize) -> u32 {
        self.of_instance.get(index).copied().unwrap_or(u32::MAX)
    }
}

impl MirrorStore {
    /// Records arrivals a pulling edge counted on `instance_id` without seeing the requests
    /// (the live mirror reads them from a pod's finished-request counter: see docs/live.md),
    /// at the given client times (µs). Only the traffic record changes: no instance state, no
    /// new generation now; the summary is rebuilt when the staged writes are next published
    /// ([`MirrorStore::publish_staged`]). At most `arrivals_max` of them are kept (the
    /// latest). Fails when no config is synced or the instance is unknown.
    pub fn record_arrivals(&self, instance_id: &str, arrivals: &[u64]) -> Result<(), TwinError> {
        let mut writer = lock(&self.writer);
        writer.current().ok_or_else(no_config)?;
        let index = instance_index(&writer, instance_id)?;
        let kept = &arrivals[arrivals.len().saturating_sub(self.limits.arrivals_max)..];
        writer.record(index, kept, &[], &self.limits);
        Ok(())
    }
}

impl Writer {
    /// Records an update's new arrivals and finished lengths on instance `index` (bounded by
    /// `limits`).
    pub(super) fn record_traffic(
        &mut self,
        index: usize,
        applied: &AppliedUpdate,
        limits: &StoreLimits,
    ) {
        self.record(index, &applied.arrivals, &applied.finished, limits);
    }

    /// Records arrival times and finished lengths of instance `index` (bounded by `limits`).
    fn record(
        &mut self,
        index: usize,
        arrivals: &[u64],
        finished: &[(u32, u32)],
        limits: &StoreLimits,
    ) {
        if arrivals.is_empty() && finished.is_empty() {
            return;
        }
        self.traffic_changed = true;
        let pool = self.pools.of(index);
        for &arrival in arrivals {
            self.first_arrival_us = Some(self.first_arrival_us.map_or(arrival, |f| f.min(arrival)));
            self.latest_arrival_us = self.latest_arrival_us.max(arrival);
            self.arrivals.push_back((arrival, pool));
        }
        let horizon = self
            .latest_arrival_us
            .saturating_sub(limits.arrivals_window_us);
        while self.arrivals.len() > limits.arrivals_max
            || self
                .arrivals
                .front()
                .is_some_and(|&(front, _)| front < horizon)
        {
            self.arrivals.pop_front();
        }
        let mut pool_lengths = self.pools.lengths.get_mut(pool as usize);
        for &lengths in finished {
            self.recent_lengths.push_back(lengths);
            if let Some(kept) = pool_lengths.as_deref_mut() {
                kept.push_back(lengths);
            }
        }
        while self.recent_lengths.len() > limits.recent_lengths_max {
            self.recent_lengths.pop_front();
        }
        if let Some(kept) = pool_lengths {
            while kept.len() > limits.recent_lengths_max {
                kept.pop_front();
            }
        }
    }

    /// Arrivals in the last window of client time over the window (shorter at first, at
    /// least 1 s), for the mirror and per pool; reuses `old` when nothing changed.
    pub(super) fn traffic_stats(
        &self,
        limits: &StoreLimits,
        old: &Arc<TrafficStats>,
    ) -> Arc<TrafficStats> {
        let first = self.first_arrival_us;
        let horizon = self
            .latest_arrival_us
            .saturating_sub(limits.arrivals_window_us);
        let span_s = first.map_or(1.0, |first| {
            (self.latest_arrival_us - first)
                .min(limits.arrivals_window_us)
                .max(1_000_000) as f64
                / 1e6
        });
        let pools = &self.pools;
        let mut counts = vec![0u64; pools.keys.len()];
        let mut seen = vec![false; pools.keys.len()];
        let mut count = 0u64;
        for &(at, pool) in &self.arrivals {
            let pool = pool as usize;
            if let Some(seen) = seen.get_mut(pool) {
                *seen = true;
            }
            if at >= horizon {
                count += 1;
                if let Some(counted) = counts.get_mut(pool) {
                    *counted += 1;
                }
            }
        }
        let per_pool = pools
            .keys
            .iter()
            .enumerate()
            .filter(|&(id, _)| seen[id] || !pools.lengths[id].is_empty())
            .map(|(id, (namespace, name, role))| PoolTraffic {
                namespace: namespace.clone(),
                name: name.clone(),
                role: *role,
                arrivals_per_s: counts[id] as f64 / span_s,
                recent_lengths: pools.lengths[id].iter().copied().collect(),
            })
            .collect();
        let stats = TrafficStats {
            arrivals_per_s: if first.is_some() {
                count as f64 / span_s
            } else {
                old.arrivals_per_s
            },
            recent_lengths: self.recent_lengths.iter().copied().collect(),
            pools: per_pool,
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
    use crate::twin::snapshot::ObservedRequest;
    use crate::twin::store::{InstanceUpdate, Publish, RequestEvent, TimedRequestEvent};

    fn synced(limits: StoreLimits) -> MirrorStore {
        let store = MirrorStore::new(limits);
        let cluster = crate::cluster::spec::default_cluster();
        store
            .sync_config(cluster, TwinSettings::defaults(), Vec::new())
            .expect("the default cluster syncs");
        store
    }

    fn first_id() -> String {
        crate::cluster::spec::default_cluster().instances[0]
            .id
            .clone()
    }

    #[test]
    fn recorded_arrivals_make_the_rate_at_the_next_publish() {
        assert_eq!(
            MirrorStore::new(StoreLimits::DEFAULT).record_arrivals("x", &[1]),
            Err(TwinError::NotSynced)
        );
        let store = synced(StoreLimits::DEFAULT);
        let id = first_id();
        assert!(matches!(
            store.record_arrivals("nobody", &[1]),
            Err(TwinError::InvalidField { path, .. }) if path == "instance_id"
        ));
        let arrivals: Vec<u64> = (1..=50).map(|i| 1_000_000 + i * 200_000).collect();
        store.record_arrivals(&id, &arrivals).expect("synced");
        // Staged: nothing published until a staged write is.
        let rate = |store: &MirrorStore| {
            store
                .latest()
                .map(|stored| stored.snapshot.traffic.arrivals_per_s)
        };
        assert_eq!(rate(&store), Some(0.0));
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
        store
            .record_arrivals(&first_id(), &arrivals)
            .expect("synced");
        let writer = lock(&store.writer);
        assert_eq!(writer.arrivals.len(), 10);
        assert_eq!(writer.arrivals.front(), Some(&(991, 0)), "the latest kept");
    }

    /// A store over two pools of the default cluster's instance: `blue` (two pods, one named
    /// by the live mirror's pool record) and `green`, and a prefill pod `blue` (the same name,
    /// another role).
    fn two_pools(limits: StoreLimits) -> MirrorStore {
        let mut cluster = crate::cluster::spec::default_cluster();
        let template = cluster.instances[0].clone();
        cluster.instances = ["ns/blue-0:8000", "10.0.0.9:8000", "green-0", "ns/blue-p-0"]
            .iter()
            .map(|id| {
                let mut instance = template.clone();
                instance.id = (*id).to_owned();
                instance
            })
            .collect();
        cluster.instances[3].role = InstanceRole::Prefill;
        let mut settings = TwinSettings::defaults();
        settings
            .variants
            .insert("10.0.0.9:8000".to_owned(), "blue".to_owned());
        settings
            .variants
            .insert("ns/blue-p-0".to_owned(), "blue".to_owned());
        let store = MirrorStore::new(limits);
        store
            .sync_config(cluster, settings, Vec::new())
            .expect("two pools sync");
        store
    }

    /// `count` requests routed to `id` over (start, start + 1 s], each finished at once with
    /// `lengths`.
    fn served(store: &MirrorStore, id: &str, start_us: u64, count: u64, lengths: (u32, u32)) {
        let mut events = Vec::new();
        for n in 0..count {
            let at = start_us + (n + 1) * 1_000_000 / count;
            let request = ObservedRequest {
                request_id: format!("{id}-{start_us}-{n}"),
                arrival_us: at,
                prompt_tokens: lengths.0,
                computed_tokens: 0,
                cached_tokens: 0,
                output_tokens: 0,
                max_tokens: lengths.1,
                known_output_tokens: None,
                priority: 0,
                slo_class: crate::sim::SloClass::default(),
                scheduled_tokens: 0,
                block_hashes: Vec::new(),
                token_ids: None,
            };
            events.push(TimedRequestEvent {
                at_us: at,
                event: RequestEvent::Routed(request),
            });
            events.push(TimedRequestEvent {
                at_us: at,
                event: RequestEvent::Finished {
                    request_id: format!("{id}-{start_us}-{n}"),
                    output_tokens: lengths.1,
                },
            });
        }
        store
            .apply_state(InstanceUpdate {
                instance_id: id.to_owned(),
                observed_at_us: start_us + 1_000_000,
                requests: None,
                gauges: None,
                events,
                counts_arrivals: true,
            })
            .expect("a valid update");
    }

    fn pool<'a>(traffic: &'a TrafficStats, name: &str, role: InstanceRole) -> &'a PoolTraffic {
        traffic
            .pools
            .iter()
            .find(|p| p.name == name && p.role == role)
            .unwrap_or_else(|| panic!("no pool {name} {role:?} in {traffic:?}"))
    }

    #[test]
    fn each_pool_sees_only_its_own_instances_arrivals_and_lengths() {
        let store = two_pools(StoreLimits::DEFAULT);
        // 10 s of client time: blue's two pods 30 and 10 a second, green 5, blue's prefill
        // pod 2; blue's pods finish 100/400-token requests, green's 2000/20.
        for second in 0..10 {
            let start = 1_000_000 + second * 1_000_000;
            served(&store, "ns/blue-0:8000", start, 30, (100, 400));
            served(&store, "10.0.0.9:8000", start, 10, (100, 400));
            served(&store, "green-0", start, 5, (2000, 20));
            served(&store, "ns/blue-p-0", start, 2, (100, 1));
        }
        store
            .record_arrivals("green-0", &[10_500_000, 10_600_000, 10_700_000, 10_800_000])
            .expect("known");
        served(&store, "green-0", 11_000_000, 1, (2000, 20));
        let stored = store.latest().expect("synced");
        let traffic = &stored.snapshot.traffic;
        // One window (from the first arrival, at 1.033333 s, to the last, at 12 s) for every
        // pool.
        let span_s = (12_000_000 - 1_033_333) as f64 / 1e6;
        let blue = pool(traffic, "blue", InstanceRole::Both);
        assert_eq!(
            blue.namespace, "ns",
            "the first id's namespace keys the pool"
        );
        let rate = |pool: &PoolTraffic| (pool.arrivals_per_s * span_s).round();
        assert_eq!(rate(blue), 400.0 - 100.0, "30 a second from ns/blue-0 only");
        let blue_pod = traffic
            .pools
            .iter()
            .find(|p| p.name == "blue" && p.namespace.is_empty())
            .expect("the live pod's pool, without a namespace");
        assert_eq!(rate(blue_pod), 100.0);
        assert_eq!(
            rate(pool(traffic, "green", InstanceRole::Both)),
            50.0 + 4.0 + 1.0
        );
        assert_eq!(rate(pool(traffic, "blue", InstanceRole::Prefill)), 20.0);
        // The pools' rates add up to the mirror's.
        let sum: f64 = traffic.pools.iter().map(|p| p.arrivals_per_s).sum();
        assert!((sum - traffic.arrivals_per_s).abs() < 1e-9);
        assert!(blue.recent_lengths.iter().all(|&l| l == (100, 400)));
        let green = pool(traffic, "green", InstanceRole::Both);
        assert_eq!(green.recent_lengths.len(), 51);
        assert!(green.recent_lengths.iter().all(|&l| l == (2000, 20)));
        assert!(
            pool(traffic, "blue", InstanceRole::Prefill)
                .recent_lengths
                .iter()
                .all(|&l| l == (100, 1))
        );
    }

    #[test]
    fn a_pool_s_lengths_are_bounded_and_a_quiet_pool_falls_out_of_the_window() {
        let limits = StoreLimits {
            recent_lengths_max: 8,
            arrivals_window_us: 5_000_000,
            ..StoreLimits::DEFAULT
        };
        let store = two_pools(limits);
        served(&store, "green-0", 1_000_000, 20, (7, 7));
        for second in 2..12 {
            served(&store, "ns/blue-0:8000", second * 1_000_000, 4, (100, 400));
        }
        let traffic = Arc::clone(&store.latest().expect("synced").snapshot.traffic);
        let green = pool(&traffic, "green", InstanceRole::Both);
        assert_eq!(
            green.arrivals_per_s, 0.0,
            "its arrivals are older than the window"
        );
        assert_eq!(green.recent_lengths.len(), 8);
        let blue = pool(&traffic, "blue", InstanceRole::Both);
        assert!(
            (blue.arrivals_per_s - 4.0).abs() < 0.3,
            "{}",
            blue.arrivals_per_s
        );
    }

    /// Request lists of `count` requests `live-r<i>` arriving at `at_us`.
    fn rebuilt(id: &str, at_us: u64, count: usize, counts_arrivals: bool) -> InstanceUpdate {
        let request = |i: usize| ObservedRequest {
            request_id: format!("live-r{i}"),
            arrival_us: at_us,
            prompt_tokens: 10,
            computed_tokens: 10,
            cached_tokens: 0,
            output_tokens: 1,
            max_tokens: 100,
            known_output_tokens: None,
            priority: 0,
            slo_class: crate::sim::SloClass::default(),
            scheduled_tokens: 0,
            block_hashes: Vec::new(),
            token_ids: None,
        };
        InstanceUpdate {
            instance_id: id.to_owned(),
            observed_at_us: at_us,
            requests: Some(crate::twin::store::RequestLists {
                waiting: Vec::new(),
                running: (0..count).map(request).collect(),
                step_end_us: None,
            }),
            gauges: None,
            events: Vec::new(),
            counts_arrivals,
        }
    }

    #[test]
    fn an_update_that_does_not_count_arrivals_leaves_them_to_its_feeder() {
        let store = two_pools(StoreLimits::DEFAULT);
        let arrivals = |store: &MirrorStore| lock(&store.writer).arrivals.len();
        // Counted: the ids new to the instance (3, then the 2 more).
        store
            .apply_state(rebuilt("green-0", 1_000_000, 3, true))
            .expect("valid");
        store
            .apply_state(rebuilt("green-0", 2_000_000, 5, true))
            .expect("valid");
        assert_eq!(arrivals(&store), 5);
        // Not counted: a feeder counting its own (the live mirror's rebuilt lists), whatever
        // the lists hold; what it records is all there is.
        store
            .apply_state(rebuilt("ns/blue-0:8000", 1_000_000, 4, false))
            .expect("valid");
        store
            .apply_state(rebuilt("ns/blue-0:8000", 2_000_000, 9, false))
            .expect("valid");
        assert_eq!(arrivals(&store), 5);
        store
            .record_arrivals("ns/blue-0:8000", &[2_500_000, 2_600_000])
            .expect("known");
        assert_eq!(arrivals(&store), 7);
        // The lists were applied all the same.
        let stored = store.latest().expect("synced");
        assert_eq!(stored.snapshot.instances[0].running.len(), 9);
    }
}
