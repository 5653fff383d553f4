//! vLLM's KV-offload connector as its scheduler keeps it: which blocks the CPU tier holds,
//! which of them may be evicted, and how many tier entries each step's stores walk.
//!
//! What vLLM 0.15.1 does (`OffloadingConnectorScheduler._get_reqs_to_store` in
//! `distributed/kv_transfer/kv_connector/v1/offloading_connector.py`, `LRUOffloadingManager`
//! in `v1/kv_offload/lru_manager.py`), every step, for every scheduled request:
//! - Its full blocks once the step is computed, `(computed + scheduled) / block_size`, past
//!   the ones it has stored so far, are offered to `prepare_store`, which drops those the tier
//!   already holds.
//! - If the rest exceed the free entries, it walks the tier from the least recently used end
//!   for entries with `ref_cnt == 0`. A walk that finds enough evicts them; one that does not
//!   has visited **every entry** and the store fails: the request logs
//!   `"cannot store"`, keeps its index, and asks again next step.
//! - A stored block enters not ready (`ref_cnt = -1`: not evictable) and turns ready only
//!   when its request's stores are reported finished, which the worker does once the request
//!   has finished (or been preempted). After a successful store every block of the request is
//!   touched (moved to the most recent end), the first block last.
//!
//! So once running requests' own blocks fill the tier, each of them that fills a block fails
//! its store every step, each failure a walk of the whole tier: the scheduler's host work
//! grows as (failing requests) × (tier entries). That is the cost [`OffloadStore::store`]
//! counts; the engine prices it (`docs/fidelity/knee-tp2.md` section 5 has the reading).
//! Loads from the tier (a GPU prefix miss that the tier hits) are not modelled here.

use std::collections::{BTreeMap, HashMap};

use super::key_hasher::IdentityBuildHasher;

/// One tier entry: its place in recency order and whether it may be evicted.
#[derive(Clone, Copy, Debug)]
struct Entry {
    stamp: u64,
    ready: bool,
}

/// What a request has stored so far.
///
/// Its private blocks (keys no other request has) are touched by it alone, so a touch does
/// not restamp the ones still pending: it records its stamps (`touch_base`, `touch_len`:
/// block `i` takes `touch_base + touch_len - 1 - i`, the order vLLM's reversed `touch`
/// leaves), and they are set when the blocks turn ready. The stamps are those an eager
/// touch gives, so the tier's order is the same; a touch costs a lookup per shared block
/// only.
#[derive(Clone, Debug, Default)]
struct Progress {
    /// Blocks below this index were stored (or found stored).
    next_block: u32,
    /// Keys (with their block index) this request stored that are not ready yet.
    pending: Vec<(u64, u32)>,
    /// Blocks from this index on are private.
    private_from: u32,
    /// Private blocks below this index are ready (a preemption completed their stores).
    readied_upto: u32,
    /// The first stamp of the request's last touch.
    touch_base: u64,
    /// Blocks its last touch covered.
    touch_len: u32,
}

/// One store attempt's outcome, as the host pays for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreWork {
    /// Tier entries the eviction walk visited.
    pub walked: u64,
    /// True if the store failed (the tier had too few evictable entries).
    pub failed: bool,
}

/// The connector's CPU tier: LRU over block keys, with not-ready entries pinned.
///
/// Recency is kept lazily: a touch only restamps the entry; `ready_order` holds each ready
/// entry under the stamp it had when it last entered the order, and an eviction that finds
/// a stale stamp at the front files the entry again under its current one. The victims are
/// exactly the least recently used ready entries.
#[derive(Clone, Debug)]
pub struct OffloadStore {
    capacity: u32,
    /// Ready entries by (possibly stale) stamp, least recent first: stamp -> key.
    ready_order: BTreeMap<u64, u64>,
    entries: HashMap<u64, Entry, IdentityBuildHasher>,
    /// Entries that may be evicted (`ref_cnt == 0`).
    ready: u32,
    next_stamp: u64,
    requests: HashMap<u64, Progress, IdentityBuildHasher>,
    /// Scratch: the keys (with their block index) a store offers that the tier does not hold.
    fresh: Vec<(u64, u32)>,
}

impl OffloadStore {
    /// An empty tier of `capacity` blocks.
    pub fn new(capacity: u32) -> Self {
        OffloadStore {
            capacity,
            ready_order: BTreeMap::new(),
            entries: HashMap::with_hasher(IdentityBuildHasher),
            ready: 0,
            next_stamp: 0,
            requests: HashMap::with_hasher(IdentityBuildHasher),
            fresh: Vec::new(),
        }
    }

    /// Entries held (ready or not).
    pub fn len(&self) -> u32 {
        self.entries.len() as u32
    }

    /// True if the tier holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries that may be evicted.
    pub fn ready(&self) -> u32 {
        self.ready
    }

    /// Request `request` has `full_blocks` full blocks once the step being formed is
    /// computed; `key_of(i)` is block `i`'s key, and the blocks from `private_from` on are
    /// private (keys only this request produces: see [`super::hash::shareable_blocks`]).
    /// Stores its new ones as vLLM's connector does and returns what the attempt walked.
    pub fn store(
        &mut self,
        request: u64,
        full_blocks: u32,
        private_from: u32,
        key_of: impl Fn(u32) -> u64,
    ) -> StoreWork {
        let progress = self.requests.entry(request).or_default();
        let start = progress.next_block;
        if full_blocks <= start {
            return StoreWork::default();
        }
        // The private blocks past the index were never stored (no one else has their keys):
        // when they alone outnumber the room a walk could make, the store fails without
        // looking its shareable keys up.
        let private_new = full_blocks - start.max(private_from).min(full_blocks);
        if private_new > self.capacity - self.len() + self.ready {
            return StoreWork {
                walked: u64::from(self.len()),
                failed: true,
            };
        }
        let mut fresh = std::mem::take(&mut self.fresh);
        fresh.clear();
        let shared_end = full_blocks.min(private_from.max(start));
        fresh.extend(
            (start..shared_end)
                .map(|index| (key_of(index), index))
                .filter(|(key, _)| !self.entries.contains_key(key)),
        );
        // Private blocks past the index were never stored: fresh without a lookup.
        fresh.extend((shared_end..full_blocks).map(|index| (key_of(index), index)));
        let free = self.capacity - self.len();
        let mut work = StoreWork::default();
        if fresh.len() as u32 > free {
            let to_evict = fresh.len() as u32 - free;
            if self.ready < to_evict {
                self.fresh = fresh;
                return StoreWork {
                    walked: u64::from(self.len()),
                    failed: true,
                };
            }
            work.walked = self.evict(to_evict);
        }
        for &(key, _) in &fresh {
            let stamp = self.stamp();
            self.entries.insert(
                key,
                Entry {
                    stamp,
                    ready: false,
                },
            );
        }
        let progress = self.requests.entry(request).or_default();
        progress.next_block = full_blocks;
        progress.private_from = private_from;
        progress.pending.extend_from_slice(&fresh);
        if !fresh.is_empty() {
            self.touch_all(request, full_blocks, key_of);
        }
        self.fresh = fresh;
        work
    }

    /// vLLM's `touch` of the request's first `full_blocks` blocks, last first: every one
    /// takes the next stamp. Shared blocks and ready private ones are restamped now; the
    /// pending private ones when they turn ready ([`Progress`]).
    fn touch_all(&mut self, request: u64, full_blocks: u32, key_of: impl Fn(u32) -> u64) {
        let base = self.next_stamp + 1;
        self.next_stamp += u64::from(full_blocks);
        let Some(progress) = self.requests.get_mut(&request) else {
            return;
        };
        progress.touch_base = base;
        progress.touch_len = full_blocks;
        let eager = progress
            .private_from
            .max(progress.readied_upto)
            .min(full_blocks);
        for index in 0..eager {
            let stamp = base + u64::from(full_blocks - 1 - index);
            if let Some(entry) = self.entries.get_mut(&key_of(index)) {
                entry.stamp = stamp;
            }
        }
    }

    /// Request `request` has finished: its stores complete, its blocks turn evictable.
    pub fn finish(&mut self, request: u64) {
        if let Some(progress) = self.requests.remove(&request) {
            self.make_ready(&progress);
        }
    }

    /// Request `request` was preempted: its stores so far complete (vLLM completes them at
    /// the preemption), and it keeps its index.
    pub fn preempted(&mut self, request: u64) {
        if let Some(mut progress) = self.requests.remove(&request) {
            self.make_ready(&progress);
            progress.pending.clear();
            progress.readied_upto = progress.next_block;
            self.requests.insert(request, progress);
        }
    }

    /// Completes `progress`'s pending stores: each entry turns evictable, a private one
    /// with the stamp its request's last touch gave it.
    fn make_ready(&mut self, progress: &Progress) {
        for &(key, index) in &progress.pending {
            if let Some(entry) = self.entries.get_mut(&key)
                && !entry.ready
            {
                if index >= progress.private_from && index < progress.touch_len {
                    entry.stamp = progress.touch_base + u64::from(progress.touch_len - 1 - index);
                }
                entry.ready = true;
                self.ready += 1;
                self.ready_order.insert(entry.stamp, key);
            }
        }
    }

    /// Evicts the `count` least recently used ready entries (there are at least that many);
    /// returns the entries vLLM's walk visits to find them, counted as the victims alone.
    /// The walk also visits the not-ready entries older than its last victim; those are the
    /// blocks of running requests, recent unless the request's stores keep failing, and
    /// then its failures' walks (every entry, counted exactly) are the cost that shows.
    fn evict(&mut self, count: u32) -> u64 {
        let mut evicted = 0u32;
        while evicted < count {
            let Some((stamp, key)) = self.ready_order.pop_first() else {
                debug_assert!(false, "fewer ready entries than counted");
                break;
            };
            match self.entries.get(&key) {
                Some(entry) if entry.ready && entry.stamp != stamp => {
                    self.ready_order.insert(entry.stamp, key);
                }
                Some(entry) if entry.ready => {
                    self.entries.remove(&key);
                    self.ready -= 1;
                    evicted += 1;
                }
                _ => debug_assert!(false, "a ready entry filed under no live key"),
            }
        }
        u64::from(evicted)
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Request `r`'s block `i`: unique to the request.
    fn key(r: u64, i: u32) -> u64 {
        (r << 32) | u64::from(i) | (1 << 63)
    }

    #[test]
    fn stores_fill_the_tier_and_a_store_past_it_walks_every_entry_and_fails() {
        let mut tier = OffloadStore::new(8);
        assert_eq!(tier.store(1, 5, 0, |i| key(1, i)), StoreWork::default());
        assert_eq!(tier.store(2, 3, 0, |i| key(2, i)), StoreWork::default());
        assert_eq!((tier.len(), tier.ready()), (8, 0));
        // Request 1 fills a sixth block: nothing is evictable while 1 and 2 run.
        let failed = tier.store(1, 6, 0, |i| key(1, i));
        assert_eq!(
            failed,
            StoreWork {
                walked: 8,
                failed: true
            }
        );
        // It asks again next step, for the same block, and fails the same way.
        assert!(tier.store(1, 6, 0, |i| key(1, i)).failed);
        // Request 2 ends: its three blocks turn evictable; request 1's store now evicts the
        // least recent of them.
        tier.finish(2);
        assert_eq!(tier.ready(), 3);
        let stored = tier.store(1, 6, 0, |i| key(1, i));
        assert!(!stored.failed);
        assert_eq!(stored.walked, 1);
        assert_eq!((tier.len(), tier.ready()), (8, 2));
    }

    #[test]
    fn blocks_the_tier_holds_are_not_stored_twice() {
        let mut tier = OffloadStore::new(4);
        let shared = |i: u32| 100 + u64::from(i);
        tier.store(1, 3, 3, shared);
        tier.finish(1);
        // A second request with the same three blocks stores none of them, so it needs no
        // room and walks nothing even though one entry alone is free.
        assert_eq!(tier.store(2, 3, 3, shared), StoreWork::default());
        assert_eq!((tier.len(), tier.ready()), (3, 3));
    }

    #[test]
    fn a_preempted_request_s_stores_complete_and_it_keeps_its_index() {
        let mut tier = OffloadStore::new(4);
        tier.store(1, 2, 0, |i| key(1, i));
        tier.preempted(1);
        assert_eq!(tier.ready(), 2);
        // Coming back, its first two blocks are behind its index: not offered again.
        assert_eq!(tier.store(1, 2, 0, |i| key(1, i)), StoreWork::default());
        assert_eq!(tier.len(), 2);
    }
}
