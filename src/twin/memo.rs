//! Memo of baseline forks and restored engines, per snapshot.
//!
//! A routing prediction runs each candidate twice: with the question's request and without
//! it (to measure the impact on the requests already there). The fork without it (the
//! baseline) depends only on the snapshot, the candidate, the replication's seed, the
//! background traffic and the stale-policy treatment, not on the question's request, so every
//! question asked on the same snapshot can share it. Without background traffic and rolled
//! forward from the observation, it does not depend on the question's "now" either: it is the
//! continuation of the observed state, run from the observation and recorded with the time of
//! every event and completion, so a question at any later "now" and horizon reads its part
//! exactly (a gateway asks at a new "now" every time). Each snapshot carries its own memo, which is why
//! cloning a snapshot (to derive a new generation or a modified copy) starts an empty one;
//! the store then hands a new generation what stays valid of its predecessor's memo (see
//! [`BaselineMemo::inherit`]): an update changes one instance, and the others keep theirs.
//! Bounded: the memo is emptied when it reaches [`BASELINE_MEMO_MAX`] entries.
//!
//! It also keeps each candidate's restored engine before any length is drawn (see
//! `twin::build::restore_base`): every replication of every question clones it instead of
//! restoring from the mirrored state again. And it keeps *checkpoints*: a baseline's engine
//! after a given number of events, from which a question's fork starts when its request would
//! wait unreached in the queue until then (see `sim::engine::ReachLog`), so later questions
//! skip that stretch. Restored engines and checkpoints together are bounded by
//! [`RESTORED_MEMO_MAX_BYTES`]: past it, they are rebuilt per fork as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::sim::Engine;
use crate::sim::engine::ReachLog;
use crate::sim::kv::IdentityBuildHasher;

/// Most baselines one snapshot remembers.
pub const BASELINE_MEMO_MAX: usize = 4096;

/// Most bytes of restored engines one snapshot remembers.
pub const RESTORED_MEMO_MAX_BYTES: usize = 256 << 20;

/// What identifies a restored engine on one snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RestoredKey {
    /// Candidate instance index.
    pub instance: usize,
    /// `Some(now)` when the observation is taken as the state at `now` (the use-last stale
    /// policy shifts it), `None` when restored at its observation time.
    pub shifted_to_us: Option<u64>,
}

/// What identifies a checkpoint on one snapshot: a continuation baseline's engine (one
/// candidate, seed and replication) after `events` events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CheckpointKey {
    /// Candidate instance index.
    pub instance: usize,
    /// The question's seed.
    pub seed: u64,
    /// Replication index.
    pub replication: u32,
    /// Events processed since the observation.
    pub events: u64,
}

/// What identifies a baseline fork on one snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BaselineKey {
    /// Candidate instance index.
    pub instance: usize,
    /// The question's "now" (µs), when the baseline depends on it (background traffic or the
    /// use-last treatment start there); `None` when it is the observation's continuation.
    pub now_us: Option<u64>,
    /// The question's seed.
    pub seed: u64,
    /// Replication index.
    pub replication: u32,
    /// Background traffic on (1) or off (0).
    pub background: u8,
    /// With background traffic, the question's prompt length (background requests take it
    /// when no finished request has been observed); 0 without.
    pub background_prompt_tokens: u32,
    /// Stale-policy treatment (0 roll forward, 1 use last).
    pub treatment: u8,
}

/// The outcome of a fork without the question's request, recorded so that any question
/// whose window `(now, horizon end]` lies within `(start, covers_until]` reads its part.
#[derive(Clone, Debug, Default)]
pub struct Baseline {
    /// Of every request that finished: (end time, time of the event that finished it), by
    /// engine id (hashed with one multiply: a recording inserts every request, a question
    /// looks each one up; the map is never iterated, so its order cannot reach output).
    pub ends: HashMap<u64, (u64, u64), IdentityBuildHasher>,
    /// Time of every event the fork processed, in order.
    pub event_times: Vec<u64>,
    /// The fork ran every event at or before this time.
    pub covers_until_us: u64,
    /// Its step formations and queue reach, to find where a question's request would first
    /// change it (continuation baselines only).
    pub reach: ReachLog,
}

impl Baseline {
    /// Events the fork processed after `from_us` and at or before `to_us`.
    pub fn events_between(&self, from_us: u64, to_us: u64) -> u64 {
        let after = self.event_times.partition_point(|&t| t <= from_us);
        let through = self.event_times.partition_point(|&t| t <= to_us);
        through.saturating_sub(after) as u64
    }

    /// Events the fork processed at or before `to_us`.
    pub fn events_until(&self, to_us: u64) -> u64 {
        self.event_times.partition_point(|&t| t <= to_us) as u64
    }

    /// Mean change (ms) of the end times `ends` against this baseline, over the requests that
    /// finished by `to_us` in both (the question's own request left out), and how many: a
    /// fork's impact on the requests already there.
    pub fn mean_end_shift(
        &self,
        ends: impl Iterator<Item = (crate::sim::RequestId, u64)>,
        to_us: u64,
    ) -> (f64, u64) {
        let (mut sum, mut count) = (0i128, 0u64);
        for (id, end_us) in ends {
            if id.0 == super::question::QUESTION_REQUEST_ID {
                continue;
            }
            if let Some(end) = self.end_by(id.0, to_us) {
                sum += i128::from(end_us) - i128::from(end);
                count += 1;
            }
        }
        if count == 0 {
            (0.0, 0)
        } else {
            (sum as f64 / count as f64 / 1000.0, count)
        }
    }

    /// End time of request `id`, if a fork cut at `to_us` saw it finish.
    pub fn end_by(&self, id: u64, to_us: u64) -> Option<u64> {
        self.ends
            .get(&id)
            .and_then(|&(end, at)| (at <= to_us).then_some(end))
    }
}

/// A snapshot's memo of baselines and restored engines (shared by concurrent questions on
/// that snapshot).
#[derive(Default)]
pub struct BaselineMemo {
    entries: Arc<Mutex<HashMap<BaselineKey, Arc<Baseline>>>>,
    restored: Arc<Mutex<RestoredEngines>>,
}

/// What identifies a remembered engine: a restored one or a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum EngineKey {
    Restored(RestoredKey),
    Checkpoint(CheckpointKey),
}

impl EngineKey {
    fn instance(&self) -> usize {
        match self {
            EngineKey::Restored(key) => key.instance,
            EngineKey::Checkpoint(key) => key.instance,
        }
    }
}

/// Restored engines and checkpoints, and the bytes they hold.
#[derive(Default)]
struct RestoredEngines {
    engines: HashMap<EngineKey, Arc<Engine>>,
    bytes: usize,
}

impl BaselineMemo {
    /// The baseline for `key`, if computed.
    pub fn get(&self, key: &BaselineKey) -> Option<Arc<Baseline>> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.get(key).cloned()
    }

    /// Remembers `baseline` for `key` (emptying the memo first when full).
    pub fn insert(&self, key: BaselineKey, baseline: Arc<Baseline>) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= BASELINE_MEMO_MAX {
            entries.clear();
        }
        entries.insert(key, baseline);
    }

    /// The restored engine for `key`, if remembered.
    pub fn restored(&self, key: &RestoredKey) -> Option<Arc<Engine>> {
        self.engine(&EngineKey::Restored(*key))
    }

    /// Remembers `engine` for `key`, unless that would pass [`RESTORED_MEMO_MAX_BYTES`].
    pub fn insert_restored(&self, key: RestoredKey, engine: Arc<Engine>) {
        self.insert_engine(EngineKey::Restored(key), engine);
    }

    /// The checkpoint for `key`, if remembered.
    pub fn checkpoint(&self, key: &CheckpointKey) -> Option<Arc<Engine>> {
        self.engine(&EngineKey::Checkpoint(*key))
    }

    /// Remembers checkpoint `engine` for `key`, unless that would pass
    /// [`RESTORED_MEMO_MAX_BYTES`].
    pub fn insert_checkpoint(&self, key: CheckpointKey, engine: Arc<Engine>) {
        self.insert_engine(EngineKey::Checkpoint(key), engine);
    }

    /// Checkpoints remembered.
    pub fn checkpoints(&self) -> usize {
        let restored = self.restored.lock().unwrap_or_else(PoisonError::into_inner);
        restored
            .engines
            .keys()
            .filter(|key| matches!(key, EngineKey::Checkpoint(_)))
            .count()
    }

    fn engine(&self, key: &EngineKey) -> Option<Arc<Engine>> {
        let restored = self.restored.lock().unwrap_or_else(PoisonError::into_inner);
        restored.engines.get(key).cloned()
    }

    fn insert_engine(&self, key: EngineKey, engine: Arc<Engine>) {
        let bytes = engine.memory_bytes();
        let mut restored = self.restored.lock().unwrap_or_else(PoisonError::into_inner);
        if restored.bytes + bytes <= RESTORED_MEMO_MAX_BYTES
            && restored.engines.insert(key, engine).is_none()
        {
            restored.bytes += bytes;
        }
    }

    /// Baselines remembered.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// True if nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl BaselineMemo {
    /// A memo holding what of this one stays valid for a snapshot whose instances `keep`
    /// says are unchanged (same state, same config): their restored engines, and, if
    /// `lengths_unchanged` (the same output-length distribution), their baselines without
    /// background traffic and their checkpoints. Entries are shared, not copied.
    pub fn inherit(&self, keep: impl Fn(usize) -> bool, lengths_unchanged: bool) -> Self {
        let baselines: HashMap<BaselineKey, Arc<Baseline>> = if lengths_unchanged {
            let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
            entries
                .iter()
                .filter(|(key, _)| key.background == 0 && keep(key.instance))
                .map(|(key, baseline)| (*key, Arc::clone(baseline)))
                .collect()
        } else {
            HashMap::new()
        };
        let restored = self.restored.lock().unwrap_or_else(PoisonError::into_inner);
        let engines: HashMap<EngineKey, Arc<Engine>> = restored
            .engines
            .iter()
            .filter(|(key, _)| {
                keep(key.instance()) && (lengths_unchanged || matches!(key, EngineKey::Restored(_)))
            })
            .map(|(key, engine)| (*key, Arc::clone(engine)))
            .collect();
        let bytes = engines.values().map(|engine| engine.memory_bytes()).sum();
        Self {
            entries: Arc::new(Mutex::new(baselines)),
            restored: Arc::new(Mutex::new(RestoredEngines { engines, bytes })),
        }
    }
}

impl Clone for BaselineMemo {
    /// A copied snapshot is a different snapshot: it starts with an empty memo.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for BaselineMemo {
    /// Memos are caches: they never make two snapshots different.
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for BaselineMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BaselineMemo({} entries)", self.len())
    }
}
