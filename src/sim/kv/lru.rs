//! A fixed-capacity LRU set of block keys.
//!
//! Used as the KV cache's CPU offload tier (full blocks evicted from the GPU are copied here
//! and reloaded on a later GPU prefix miss) and as the router's approximate prefix index,
//! which inserts every dispatched prompt block: the hot path of an autoscaled day.
//!
//! An index-linked recency list over a slab of nodes, found through an open-addressing
//! table of (key, node) pairs: linear probing from a Fibonacci hash of the key, at most half
//! full, with backward-shift deletion (no tombstones, so lookups never slow down). Each node
//! knows its bucket, so an eviction needs no lookup. Every operation is O(1) and
//! allocation-free once full (an insert that evicts: one probe, one shift, usually no second
//! probe), and the set clones as plain data.
//!
//! A request's private prompt keys (see [`super::hash::shareable_blocks`]) can go in as one
//! *run* node ([`LruKeySet::insert_private_run`], `runs.rs`): the keys of one seed's
//! consecutive indices, in recency order by index, evicted from their low end by arithmetic.
//! The set's contents, order and evictions stay exactly those of inserting each key alone.

mod runs;

use std::collections::HashMap;

use super::hash::{latent_of_key, private_key_of_latent};
use super::key_hasher::IdentityBuildHasher;
use runs::RunKeys;

const NIL: u32 = u32::MAX;

/// Fewest table buckets (a power of two, so the hash's shift stays below 64).
const MIN_BUCKETS: usize = 16;

/// Fibonacci hashing's multiplier (2^64 / φ): spreads client-given keys (vLLM block hashes)
/// as well as our own mixed ones.
const FIBONACCI: u64 = 0x9e37_79b9_7f4a_7c15;

/// One held key: its neighbours in recency order and its table bucket (where its key is), or
/// a run of private keys (`bucket == NIL`, its keys in `runs`).
#[derive(Clone, Copy, Debug)]
struct Node {
    prev: u32,
    next: u32,
    bucket: u32,
}

/// One table bucket: a key and its node, or vacant (`node == NIL`).
#[derive(Clone, Copy, Debug)]
struct Bucket {
    key: u64,
    node: u32,
}

const VACANT: Bucket = Bucket { key: 0, node: NIL };

/// An LRU set of block keys with a fixed capacity.
#[derive(Clone, Debug)]
pub struct LruKeySet {
    capacity: u32,
    /// Keys held (a run node holds several).
    held: u32,
    /// Nodes holding one key each (the keys in `table`).
    singles: u32,
    nodes: Vec<Node>,
    /// Nodes out of the list (a run evicted or split into single keys), for reuse.
    free: Vec<u32>,
    /// A run node's keys, by node (grown when the first run is made).
    runs: Vec<RunKeys>,
    /// The run node of each zone (a latent key's top 32 bits) that holds one: at most one.
    zones: HashMap<u64, u32, IdentityBuildHasher>,
    /// Open-addressing table, a power of two long, at most half full.
    table: Vec<Bucket>,
    /// `64 - log2(table.len())`: a key's home bucket is its Fibonacci hash's top bits.
    shift: u32,
    /// The table's final length (it grows up to this as keys arrive).
    max_buckets: usize,
    /// Least recently used end.
    head: u32,
    /// Most recently used end.
    tail: u32,
}

impl LruKeySet {
    /// An empty tier holding at most `capacity` blocks (`capacity > 0`).
    pub fn new(capacity: u32) -> Self {
        debug_assert!(capacity > 0, "an LRU set needs capacity > 0");
        let max_buckets = (2 * capacity as usize).next_power_of_two().max(MIN_BUCKETS);
        let buckets = max_buckets.min(1024);
        Self {
            capacity,
            held: 0,
            singles: 0,
            nodes: Vec::new(),
            free: Vec::new(),
            runs: Vec::new(),
            zones: HashMap::with_hasher(IdentityBuildHasher),
            table: vec![VACANT; buckets],
            shift: 64 - buckets.trailing_zeros(),
            max_buckets,
            head: NIL,
            tail: NIL,
        }
    }

    /// Number of blocks held.
    pub fn len(&self) -> u32 {
        self.held
    }

    /// True if no block is held.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// True if `key` is held (does not change recency).
    #[inline]
    pub fn contains(&self, key: u64) -> bool {
        self.probe(key).1
            || (!self.zones.is_empty() && self.run_holding(latent_of_key(key)).is_some())
    }

    /// Marks `key` most recently used, if held.
    pub fn touch(&mut self, key: u64) {
        let (at, found) = self.probe(key);
        if found {
            let node = self.table[at].node;
            self.unlink(node);
            self.push_tail(node);
        } else if !self.zones.is_empty() && self.split_holder(key) {
            self.touch(key);
        }
    }

    /// Forgets every key (the table keeps its size).
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.free.clear();
        self.runs.clear();
        self.zones.clear();
        self.held = 0;
        self.singles = 0;
        self.table.fill(VACANT);
        self.head = NIL;
        self.tail = NIL;
    }

    /// Heap bytes held (capacity-based estimate).
    pub fn memory_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.table.capacity() * std::mem::size_of::<Bucket>()
            + self.free.capacity() * std::mem::size_of::<u32>()
            + self.runs.capacity() * std::mem::size_of::<RunKeys>()
            + self.zones.capacity() * 2 * std::mem::size_of::<u64>()
    }

    /// Keys held, least recently used first (for tests and snapshots).
    pub fn keys_lru_first(&self) -> Vec<u64> {
        let mut keys = Vec::with_capacity(self.held as usize);
        let mut cursor = self.head;
        while cursor != NIL {
            let node = &self.nodes[cursor as usize];
            if node.bucket == NIL {
                let run = self.runs[cursor as usize];
                keys.extend(
                    (run.lo..run.hi).map(|i| private_key_of_latent(run.seed ^ u64::from(i))),
                );
            } else {
                keys.push(self.table[node.bucket as usize].key);
            }
            cursor = node.next;
        }
        keys
    }

    /// Stores `key` as most recently used, evicting the least recently used key when full.
    pub fn insert(&mut self, key: u64) {
        let (at, found) = self.probe(key);
        if found {
            let node = self.table[at].node;
            self.unlink(node);
            self.push_tail(node);
            return;
        }
        if !self.zones.is_empty() && self.split_holder(key) {
            // Now a single key of its own: found, moved to the tail.
            self.insert(key);
            return;
        }
        self.insert_new(key, at);
    }

    /// Stores `key`, held nowhere, whose probe ended at vacant bucket `at`.
    fn insert_new(&mut self, key: u64, mut at: usize) {
        if self.held == self.capacity {
            let victim = self.head;
            debug_assert!(victim != NIL, "a full tier has a head");
            if self.nodes[victim as usize].bucket != NIL {
                self.unlink(victim);
                let vacated = self.erase(self.nodes[victim as usize].bucket as usize);
                // The shift leaves one bucket vacant, all others as occupied as before: if it
                // lies on the new key's probe path ahead of `at`, the key goes there instead.
                let mask = self.table.len() - 1;
                let home = self.home(key);
                if vacated.wrapping_sub(home) & mask < at.wrapping_sub(home) & mask {
                    at = vacated;
                }
                self.nodes[victim as usize].bucket = at as u32;
                self.table[at] = Bucket { key, node: victim };
                self.push_tail(victim);
                return;
            }
            // The oldest key is a run's first: it goes by arithmetic (the table unchanged).
            self.evict_front(1);
        }
        at = self.room_for_single(key, at);
        let node = self.alloc_node(at as u32);
        self.table[at] = Bucket { key, node };
        self.push_tail(node);
        self.held += 1;
        self.singles += 1;
        debug_assert!(self.len() <= self.capacity, "LRU set over capacity");
    }

    /// Grows the table if one more single key would fill it over half; returns where `key`
    /// (not held) goes, `at` unless the table grew.
    #[inline]
    fn room_for_single(&mut self, key: u64, at: usize) -> usize {
        if 2 * (self.singles as usize + 1) > self.table.len() && self.table.len() < self.max_buckets
        {
            self.grow();
            return self.probe(key).0;
        }
        at
    }

    /// A node out of the free list (or a new one) with bucket `bucket`, linked nowhere.
    #[inline]
    fn alloc_node(&mut self, bucket: u32) -> u32 {
        let fresh = Node {
            prev: NIL,
            next: NIL,
            bucket,
        };
        match self.free.pop() {
            Some(node) => {
                self.nodes[node as usize] = fresh;
                node
            }
            None => {
                self.nodes.push(fresh);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// The key's home bucket.
    #[inline]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(FIBONACCI) >> self.shift) as usize
    }

    /// The bucket holding `key` (true), or the vacant bucket where it would go (false).
    #[inline]
    fn probe(&self, key: u64) -> (usize, bool) {
        let mask = self.table.len() - 1;
        let mut at = self.home(key);
        loop {
            let bucket = self.table[at];
            if bucket.node == NIL {
                return (at, false);
            }
            if bucket.key == key {
                return (at, true);
            }
            at = (at + 1) & mask;
        }
    }

    /// Vacates bucket `hole`, shifting back the entries after it whose probe passed it;
    /// returns the bucket left vacant.
    #[inline]
    fn erase(&mut self, mut hole: usize) -> usize {
        let mask = self.table.len() - 1;
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let bucket = self.table[at];
            if bucket.node == NIL {
                break;
            }
            let home = self.home(bucket.key);
            // It may fill the hole if the hole lies on its probe path (home ..= at).
            if at.wrapping_sub(home) & mask >= at.wrapping_sub(hole) & mask {
                self.table[hole] = bucket;
                self.nodes[bucket.node as usize].bucket = hole as u32;
                hole = at;
            }
        }
        self.table[hole] = VACANT;
        hole
    }

    /// Doubles the table and places every single key again.
    fn grow(&mut self) {
        let buckets = self.table.len() * 2;
        let old = std::mem::replace(&mut self.table, vec![VACANT; buckets]);
        self.shift = 64 - buckets.trailing_zeros();
        for bucket in old.into_iter().filter(|bucket| bucket.node != NIL) {
            let (at, _) = self.probe(bucket.key);
            self.table[at] = bucket;
            self.nodes[bucket.node as usize].bucket = at as u32;
        }
    }

    #[inline]
    fn unlink(&mut self, node: u32) {
        let Node { prev, next, .. } = self.nodes[node as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    /// Links `node` right after `prev` (at the head if `prev` is `NIL`).
    fn link_after(&mut self, prev: u32, node: u32) {
        let next = if prev == NIL {
            self.head
        } else {
            self.nodes[prev as usize].next
        };
        let entry = &mut self.nodes[node as usize];
        entry.prev = prev;
        entry.next = next;
        if prev == NIL {
            self.head = node;
        } else {
            self.nodes[prev as usize].next = node;
        }
        if next == NIL {
            self.tail = node;
        } else {
            self.nodes[next as usize].prev = node;
        }
    }

    #[inline]
    fn push_tail(&mut self, node: u32) {
        let tail = self.tail;
        let entry = &mut self.nodes[node as usize];
        entry.prev = tail;
        entry.next = NIL;
        if tail == NIL {
            self.head = node;
        } else {
            self.nodes[tail as usize].next = node;
        }
        self.tail = node;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    #[test]
    fn evicts_least_recently_used() {
        let mut tier = LruKeySet::new(2);
        tier.insert(1);
        tier.insert(2);
        tier.touch(1);
        tier.insert(3);
        assert!(tier.contains(1));
        assert!(!tier.contains(2));
        assert!(tier.contains(3));
        assert_eq!(tier.len(), 2);
    }

    /// The set against a plain recency list (most recent at the back), over seeded random
    /// inserts, touches and lookups with many repeats, through table growth and evictions,
    /// with keys crowding few home buckets (multiples of a large power of two) as well as
    /// spread ones.
    #[test]
    fn matches_a_plain_recency_list() {
        for (capacity, spread) in [(1, 4), (7, 20), (100, 300), (3000, 5000)] {
            for crowded in [false, true] {
                let mut tier = LruKeySet::new(capacity);
                let mut model: VecDeque<u64> = VecDeque::new();
                let mut state = 0x1234_5678_u64 ^ u64::from(capacity);
                for _ in 0..20_000 {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let draw = state >> 33;
                    let raw = draw % spread;
                    let key = if crowded { raw << 40 } else { raw };
                    let held = model.iter().position(|&k| k == key);
                    assert_eq!(tier.contains(key), held.is_some(), "key {key}");
                    match draw % 5 {
                        0 => {
                            tier.touch(key);
                            if let Some(at) = held {
                                model.remove(at);
                                model.push_back(key);
                            }
                        }
                        _ => {
                            tier.insert(key);
                            if let Some(at) = held {
                                model.remove(at);
                            } else if model.len() == capacity as usize {
                                model.pop_front();
                            }
                            model.push_back(key);
                        }
                    }
                    assert_eq!(tier.len() as usize, model.len());
                }
                assert_eq!(tier.keys_lru_first(), Vec::from(model.clone()));
                if capacity == 100 && !crowded {
                    tier.clear();
                    assert!(tier.is_empty() && tier.keys_lru_first().is_empty());
                    assert!((0..spread).all(|key| !tier.contains(key)));
                    tier.insert(5);
                    assert_eq!(tier.keys_lru_first(), vec![5]);
                    continue;
                }
                for key in 0..spread {
                    let key = if crowded { key << 40 } else { key };
                    assert_eq!(tier.contains(key), model.contains(&key), "key {key}");
                }
            }
        }
    }
}
