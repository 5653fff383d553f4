//! The mirror store: the synced cluster config, the twin settings and every instance's
//! observed state, published as immutable [`MirrorSnapshot`]s.
//!
//! Owns validation of updates against the config in force (unknown instances, token counts
//! that contradict the instance's limits, more cached blocks than exist) and applies each
//! update atomically: a rejected update leaves the mirror exactly as it was. Every accepted
//! change (config, state update, KV batch) makes a new generation; the last few snapshots are
//! kept so a caller can ask for one by generation.
//!
//! Publishing: a push RPC's write is published at once (its caller is told the generation
//! and may ask for it). A pulling edge's writes (the live mirror's scrapes and KV batches,
//! thousands a second over a hundred pods) are *staged* instead ([`Publish::Staged`]): they
//! change one unpublished snapshot in place, and [`MirrorStore::publish_staged`], called
//! once per tick, publishes them all as one generation. So the mirror copies its instance
//! list and reshapes its memo once per tick, not once per write.
//!
//! Concurrency: writers serialise on one mutex and publish by swapping an `Arc` under a
//! short write lock; readers only clone an `Arc`. No lock is held while anything slow or
//! asynchronous runs, and predictions never see a snapshot change under them. Knows nothing
//! about gRPC, tokio or the wall clock: times are the client's, passed in.

mod kv;
mod messages;
mod traffic;
mod update;

pub use messages::{
    InstanceUpdate, KvApplied, KvEvent, KvEventBatch, KvGap, RequestEvent, RequestLists,
    SyncOutcome, TimedRequestEvent,
};

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use crate::cluster::config::ClusterConfig;
use crate::twin::error::TwinError;
use crate::twin::snapshot::{InstanceState, MirrorSnapshot, TrafficStats, TwinSettings};

use kv::{apply_kv, check_kv_batch};
use update::{build_state, check_state};

/// Bounds on what the store keeps and accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// Snapshots kept for lookup by generation (at least 1).
    pub history_len: usize,
    /// Most instances in a synced config.
    pub max_instances: usize,
    /// Most requests (waiting + running) per instance.
    pub max_requests_per_instance: usize,
    /// Most lifecycle events in one state update.
    pub max_events_per_update: usize,
    /// Most events in one KV event batch.
    pub max_kv_events_per_batch: usize,
    /// Finished requests' lengths kept for sampling.
    pub recent_lengths_max: usize,
    /// Arrival times kept for the observed arrival rate.
    pub arrivals_max: usize,
    /// Window of the observed arrival rate (µs).
    pub arrivals_window_us: u64,
}

impl StoreLimits {
    /// Defaults sized for a sidecar mirroring a few hundred instances.
    pub const DEFAULT: StoreLimits = StoreLimits {
        history_len: 16,
        max_instances: 4096,
        max_requests_per_instance: 100_000,
        max_events_per_update: 100_000,
        max_kv_events_per_batch: 100_000,
        recent_lengths_max: 1024,
        arrivals_max: 100_000,
        arrivals_window_us: 60_000_000,
    };
}

/// A snapshot and the instance addresses of its config (index-aligned).
#[derive(Clone, Debug, PartialEq)]
pub struct StoredSnapshot {
    /// The snapshot.
    pub snapshot: Arc<MirrorSnapshot>,
    /// Instance addresses.
    pub addresses: Arc<[String]>,
}

/// The mirror of one cluster. See the module documentation.
#[derive(Debug)]
pub struct MirrorStore {
    limits: StoreLimits,
    writer: Mutex<Writer>,
    published: RwLock<VecDeque<StoredSnapshot>>,
}

/// When readers see a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publish {
    /// In a new generation published before the call returns (push RPCs).
    Now,
    /// At the next [`MirrorStore::publish_staged`], with every write staged before it, as one
    /// generation (the live mirror's pulling edge).
    Staged,
}

/// Writer-side state: the latest snapshot plus what is not part of snapshots.
#[derive(Debug, Default)]
struct Writer {
    /// The latest published snapshot.
    latest: Option<StoredSnapshot>,
    /// Writes not yet published, applied to a private copy of `latest` (its memo is taken
    /// over from `latest` when it is published).
    staged: Option<MirrorSnapshot>,
    /// Arrivals or finished lengths were recorded since the last publish (the traffic
    /// summary is rebuilt when the staged snapshot is published).
    traffic_changed: bool,
    generation: u64,
    index: HashMap<String, usize>,
    /// Arrival times (client µs) with their instance's pool id.
    arrivals: VecDeque<(u64, u32)>,
    pools: traffic::PoolRecords,
    first_arrival_us: Option<u64>,
    latest_arrival_us: u64,
    recent_lengths: VecDeque<(u32, u32)>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a half-applied update: updates are built
    // aside and published with one assignment.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn no_config() -> TwinError {
    TwinError::NotSynced
}

impl MirrorStore {
    /// An empty store (no config: every update and question fails until one is synced).
    pub fn new(limits: StoreLimits) -> Self {
        Self {
            limits: StoreLimits {
                history_len: limits.history_len.max(1),
                ..limits
            },
            writer: Mutex::new(Writer::default()),
            published: RwLock::new(VecDeque::new()),
        }
    }

    /// The store's limits.
    pub fn limits(&self) -> &StoreLimits {
        &self.limits
    }

    /// The latest snapshot, if a config has been synced.
    pub fn latest(&self) -> Option<StoredSnapshot> {
        let published = self
            .published
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        published.back().cloned()
    }

    /// The config in force, the index of instance `id` in it, and the instance's current
    /// state, staged writes included: what a pulling edge builds its next write on (the
    /// published snapshot may not show its last write yet). `NotSynced` before the first
    /// sync; `InvalidArgument` for an instance the config does not list.
    pub fn current_instance(
        &self,
        id: &str,
    ) -> Result<(Arc<ClusterConfig>, usize, Arc<InstanceState>), TwinError> {
        let writer = lock(&self.writer);
        let current = writer.current().ok_or_else(no_config)?;
        let index = instance_index(&writer, id)?;
        Ok((
            Arc::clone(&current.config),
            index,
            Arc::clone(&current.instances[index]),
        ))
    }

    /// The snapshot at `generation` (0: the latest). `FailedPrecondition` before the first
    /// sync; `NotFound` for a generation not kept (too old) or not yet reached.
    pub fn snapshot(&self, generation: u64) -> Result<StoredSnapshot, TwinError> {
        let published = self
            .published
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let latest = published.back().ok_or_else(no_config)?;
        if generation == 0 {
            return Ok(latest.clone());
        }
        published
            .iter()
            .find(|stored| stored.snapshot.generation == generation)
            .cloned()
            .ok_or_else(|| TwinError::NotFound {
                what: "generation",
                id: format!(
                    "{generation} (kept: {}..={})",
                    published
                        .front()
                        .map_or(0, |stored| stored.snapshot.generation),
                    latest.snapshot.generation
                ),
            })
    }

    /// Forgets the config and every instance (the state of a store that was never synced):
    /// questions and updates fail with `NotSynced` until the next sync. The live mirror calls
    /// it when its last pod is retired, so that no answer is simulated on pods that are gone.
    /// The generation counter keeps counting, so generations never repeat.
    pub fn clear(&self) {
        let mut writer = lock(&self.writer);
        let generation = writer.generation;
        *writer = Writer {
            generation,
            ..Writer::default()
        };
        self.published
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Replaces the config. Identical config, settings and addresses keep the generation.
    /// `addresses` is index-aligned with `cluster.instances` (empty: no addresses).
    /// Staged writes are published first.
    pub fn sync_config(
        &self,
        cluster: ClusterConfig,
        settings: TwinSettings,
        addresses: Vec<String>,
    ) -> Result<SyncOutcome, TwinError> {
        if cluster.instances.len() > self.limits.max_instances {
            return Err(TwinError::OverLimit(format!(
                "instances: {} instances exceed the limit of {}",
                cluster.instances.len(),
                self.limits.max_instances
            )));
        }
        validate_config(&cluster, &addresses)?;
        let addresses: Arc<[String]> = if addresses.is_empty() {
            vec![String::new(); cluster.instances.len()].into()
        } else {
            addresses.into()
        };
        let mut writer = lock(&self.writer);
        self.publish_staged_locked(&mut writer);
        if let Some(latest) = &writer.latest {
            let snapshot = &latest.snapshot;
            if *snapshot.config == cluster
                && *snapshot.settings == settings
                && latest.addresses == addresses
            {
                return Ok(SyncOutcome {
                    generation: snapshot.generation,
                    config_generation: snapshot.config_generation,
                    changed: false,
                    reset_instance_ids: Vec::new(),
                });
            }
        }
        let generation = writer.generation + 1;
        let mut instances = Vec::with_capacity(cluster.instances.len());
        let mut reset = Vec::new();
        for config in &cluster.instances {
            let kept = writer.latest.as_ref().and_then(|latest| {
                let old = *writer.index.get(&config.id)?;
                let state = latest.snapshot.instances.get(old)?;
                let fits = check_state(state, config, &self.limits).is_ok()
                    && state.cached_blocks.len() <= config.engine.num_gpu_blocks as usize;
                if !fits {
                    reset.push(config.id.clone());
                    return None;
                }
                Some(Arc::clone(state))
            });
            let state = kept.unwrap_or_else(|| {
                Arc::new(InstanceState {
                    instance_id: config.id.clone(),
                    ..InstanceState::default()
                })
            });
            instances.push(state);
        }
        let traffic = match &writer.latest {
            Some(latest) => Arc::clone(&latest.snapshot.traffic),
            None => Arc::new(TrafficStats::default()),
        };
        writer.pools.assign(&cluster, &settings);
        writer.index = cluster
            .instances
            .iter()
            .enumerate()
            .map(|(index, instance)| (instance.id.clone(), index))
            .collect();
        let snapshot = MirrorSnapshot {
            generation,
            config_generation: generation,
            config: Arc::new(cluster),
            settings: Arc::new(settings),
            instances,
            traffic,
            memo: Default::default(),
        };
        self.publish(&mut writer, snapshot, addresses);
        Ok(SyncOutcome {
            generation,
            config_generation: generation,
            changed: true,
            reset_instance_ids: reset,
        })
    }

    /// Applies one instance update atomically and publishes it; returns the new generation.
    pub fn apply_state(&self, update: InstanceUpdate) -> Result<u64, TwinError> {
        self.write_state(update, Publish::Now)
    }

    /// Applies one instance update atomically, published now or staged (see [`Publish`]);
    /// returns the generation it is (or will be) published in.
    pub fn write_state(&self, update: InstanceUpdate, publish: Publish) -> Result<u64, TwinError> {
        let mut writer = lock(&self.writer);
        let current = writer.current().ok_or_else(no_config)?;
        let index = instance_index(&writer, &update.instance_id)?;
        let config = &current.config.instances[index];
        let old = &current.instances[index];
        if update.events.len() > self.limits.max_events_per_update {
            return Err(TwinError::OverLimit(format!(
                "events: {} events in one update exceed the limit of {}",
                update.events.len(),
                self.limits.max_events_per_update
            )));
        }
        let applied = build_state(old, config, update, &self.limits)?;
        writer.record_traffic(index, &applied, &self.limits);
        self.commit(&mut writer, index, applied.state, publish)
    }

    /// Applies one KV event batch atomically; more cached blocks than the instance's
    /// `num_gpu_blocks` is an error.
    pub fn apply_kv_events(&self, batch: KvEventBatch) -> Result<KvApplied, TwinError> {
        self.apply_kv_batch(batch, false, Publish::Now)
    }

    /// Applies one KV event batch atomically, as a pulling edge does: more cached blocks
    /// than the instance's `num_gpu_blocks` (their removals were missed) evicts the least
    /// recently stored ones, as the pod's LRU would have (counted in
    /// [`KvApplied::evicted`]), instead of refusing the batch.
    /// Published now or staged (see [`Publish`]).
    pub fn apply_kv_events_capped(
        &self,
        batch: KvEventBatch,
        publish: Publish,
    ) -> Result<KvApplied, TwinError> {
        self.apply_kv_batch(batch, true, publish)
    }

    fn apply_kv_batch(
        &self,
        batch: KvEventBatch,
        cap: bool,
        publish: Publish,
    ) -> Result<KvApplied, TwinError> {
        let mut writer = lock(&self.writer);
        let current = writer.current().ok_or_else(no_config)?;
        let index = instance_index(&writer, &batch.instance_id)?;
        let config = &current.config.instances[index];
        let old = &current.instances[index];
        if batch.events.len() > self.limits.max_kv_events_per_batch {
            return Err(TwinError::OverLimit(format!(
                "events: {} events in one batch exceed the limit of {}",
                batch.events.len(),
                self.limits.max_kv_events_per_batch
            )));
        }
        let gap = check_kv_batch(old, config, &batch)?;
        // O(1): the blocks are persistent maps shared with the snapshots that hold them.
        let mut kv_index = old.cached_blocks.clone();
        apply_kv(&mut kv_index, &batch.events, config.engine.block_size);
        let capacity = config.engine.num_gpu_blocks as usize;
        let evicted = if cap {
            kv_index.evict_to(capacity) as u64
        } else {
            0
        };
        let cached = kv_index.len();
        if cached > capacity {
            return Err(TwinError::invalid(
                "events",
                format!(
                    "{cached} cached blocks after this batch exceed the instance's \
                     num_gpu_blocks {}",
                    config.engine.num_gpu_blocks
                ),
            ));
        }
        let mut state = (**old).clone();
        state.cached_blocks = kv_index;
        state.kv_events_at_us = batch.ts_us;
        state.kv_event_seq = batch.seq;
        if let Some(gap) = &gap {
            state.kv_event_gaps += gap.received_seq - gap.expected_seq;
        }
        let generation = self.commit(&mut writer, index, state, publish)?;
        Ok(KvApplied {
            generation,
            gap,
            evicted,
        })
    }

    /// Sets (or clears, with `None`) why the feeding edge holds `instance_id` stale; a new
    /// generation only when the reason changes. Returns the generation in force.
    pub fn set_stale_reason(
        &self,
        instance_id: &str,
        reason: Option<String>,
    ) -> Result<u64, TwinError> {
        self.set_note(instance_id, reason, Publish::Now, |state| {
            &mut state.stale_reason
        })
    }

    /// Sets (or clears, with `None`) what the feeding edge capped to the instance's limits
    /// in its last observation (e.g. `gauges.running 300 capped to max_num_seqs 256`); the
    /// instance is not stale for it. A new generation only when the note changes; staged
    /// (`Publish::Staged`) it is published with the next tick, beside the capped values.
    pub fn set_capped_note(
        &self,
        instance_id: &str,
        note: Option<String>,
        publish: Publish,
    ) -> Result<u64, TwinError> {
        self.set_note(instance_id, note, publish, |state| &mut state.capped)
    }

    fn set_note(
        &self,
        instance_id: &str,
        value: Option<String>,
        publish: Publish,
        slot: impl Fn(&mut InstanceState) -> &mut Option<String>,
    ) -> Result<u64, TwinError> {
        let mut writer = lock(&self.writer);
        let current = writer.current().ok_or_else(no_config)?;
        let index = instance_index(&writer, instance_id)?;
        let mut state = (*current.instances[index]).clone();
        if *slot(&mut state) == value {
            // Nothing to write; staged writes are published all the same when asked (the
            // caller expects what it reads next to be current).
            if publish == Publish::Now {
                self.publish_staged_locked(&mut writer);
            }
            return Ok(writer.generation);
        }
        *slot(&mut state) = value;
        self.commit(&mut writer, index, state, publish)
    }

    /// Publishes every staged write as one new generation; `None` when nothing was staged.
    pub fn publish_staged(&self) -> Option<u64> {
        let mut writer = lock(&self.writer);
        self.publish_staged_locked(&mut writer)
    }

    fn publish_staged_locked(&self, writer: &mut Writer) -> Option<u64> {
        let mut staged = writer.staged.take()?;
        if std::mem::take(&mut writer.traffic_changed) {
            staged.traffic = writer.traffic_stats(&self.limits, &staged.traffic);
        }
        let latest = writer.latest.as_ref()?;
        staged.inherit_memo(&latest.snapshot);
        let addresses = Arc::clone(&latest.addresses);
        let generation = staged.generation;
        self.publish(writer, staged, addresses);
        Some(generation)
    }

    /// Writes `state` for instance `index` into the staged snapshot, then publishes it if
    /// asked. Returns the generation the write is published in.
    fn commit(
        &self,
        writer: &mut Writer,
        index: usize,
        state: InstanceState,
        publish: Publish,
    ) -> Result<u64, TwinError> {
        let staged = writer.staged_mut().ok_or_else(no_config)?;
        staged.instances[index] = Arc::new(state);
        let generation = staged.generation;
        if publish == Publish::Now {
            self.publish_staged_locked(writer);
        }
        Ok(generation)
    }

    fn publish(&self, writer: &mut Writer, snapshot: MirrorSnapshot, addresses: Arc<[String]>) {
        writer.generation = snapshot.generation;
        let stored = StoredSnapshot {
            snapshot: Arc::new(snapshot),
            addresses,
        };
        writer.latest = Some(stored.clone());
        let mut published = self
            .published
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        published.push_back(stored);
        while published.len() > self.limits.history_len {
            published.pop_front();
        }
    }
}

impl Writer {
    /// The staged snapshot: a private copy of the latest, made by the first write after a
    /// publish (its memo is taken over when it is published). `None` before the first sync.
    fn staged_mut(&mut self) -> Option<&mut MirrorSnapshot> {
        if self.staged.is_none() {
            let latest = self.latest.as_ref()?;
            self.staged = Some(MirrorSnapshot {
                generation: self.generation + 1,
                memo: Default::default(),
                ..(*latest.snapshot).clone()
            });
        }
        self.staged.as_mut()
    }

    /// What the next write applies to: the staged snapshot, else the latest published.
    fn current(&self) -> Option<&MirrorSnapshot> {
        self.staged
            .as_ref()
            .or_else(|| self.latest.as_ref().map(|latest| &*latest.snapshot))
    }
}

fn instance_index(writer: &Writer, id: &str) -> Result<usize, TwinError> {
    writer
        .index
        .get(id)
        .copied()
        .ok_or_else(|| TwinError::invalid("instance_id", format!("unknown instance {id:?}")))
}

fn validate_config(cluster: &ClusterConfig, addresses: &[String]) -> Result<(), TwinError> {
    if cluster.instances.is_empty() {
        return Err(TwinError::invalid(
            "instances",
            "needs at least one instance",
        ));
    }
    if !addresses.is_empty() && addresses.len() != cluster.instances.len() {
        return Err(TwinError::invalid(
            "instances",
            format!(
                "{} addresses for {} instances",
                addresses.len(),
                cluster.instances.len()
            ),
        ));
    }
    let mut seen = HashSet::new();
    for (index, instance) in cluster.instances.iter().enumerate() {
        if instance.id.trim().is_empty() {
            return Err(TwinError::invalid(
                format!("instances[{index}].id"),
                "must not be empty",
            ));
        }
        if !seen.insert(instance.id.as_str()) {
            return Err(TwinError::invalid(
                format!("instances[{index}].id"),
                format!("duplicate instance id {:?}", instance.id),
            ));
        }
        instance.engine.validate().map_err(|err| {
            TwinError::invalid(
                format!("instances[{index}].engine.{}", err.field),
                err.reason,
            )
        })?;
    }
    Ok(())
}
