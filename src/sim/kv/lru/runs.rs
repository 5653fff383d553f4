//! Runs of private keys in the LRU key set: one node for a request's private prompt keys.
//!
//! A private key is `private_key_of_latent(seed ^ index)` for its request's seed (see
//! [`crate::sim::kv::hash::private_seed`]). Inserting indices `lo..hi` one by one would put
//! them at the recency list's tail in index order; a run node holds them as `(seed, lo, hi)`
//! in that place, and eviction takes its lowest indices first (`lo += n`). Nothing else
//! changes: the set's keys, their recency order and every eviction are those of inserting
//! each key alone (tested against a plain recency list below).
//!
//! A run's latent keys share their top 32 bits with its seed (indices are `u32`), its
//! *zone*; the set keeps at most one run per zone, so a key is found in a run by inverting
//! the mix (`latent_of_key`) and one zone lookup. A run goes in as a run only when no key
//! of it can be held already: its zone holds no run and no single key equals one of its
//! keys. Otherwise its keys go in one by one, and a key found inside a run splits that run
//! into single keys in place first (the same request dispatched twice, or two seeds with
//! the same top 32 bits: both rare), so the set stays exact in every case.

use super::{LruKeySet, NIL, private_key_of_latent};

/// A run node's keys: `private_key_of_latent(seed ^ i)` for `i` in `lo..hi`, oldest first.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RunKeys {
    pub(super) seed: u64,
    pub(super) lo: u32,
    pub(super) hi: u32,
}

impl LruKeySet {
    /// Stores the private keys of `seed`'s indices `range` (`private_key_of_latent(seed ^ i)`),
    /// exactly as inserting each in index order would: most recently used last, evicting the
    /// least recently used keys when full.
    pub fn insert_private_run(&mut self, seed: u64, range: std::ops::Range<u32>) {
        if range.is_empty() {
            return;
        }
        let zone = seed >> 32;
        let clash = self.zones.contains_key(&zone)
            || (self.singles > 0
                && range
                    .clone()
                    .any(|i| self.probe(private_key_of_latent(seed ^ u64::from(i))).1));
        if clash {
            for i in range {
                self.insert(private_key_of_latent(seed ^ u64::from(i)));
            }
            return;
        }
        // Every key is new: the oldest keys beyond capacity go first (with more keys than the
        // capacity, only the run's last `capacity` keys stay, as one by one).
        let keep = (range.end - range.start).min(self.capacity);
        // In u64: a capacity near `u32::MAX` must not wrap.
        let over =
            (u64::from(self.held) + u64::from(keep)).saturating_sub(u64::from(self.capacity));
        self.evict_front(over as u32);
        let node = self.alloc_node(NIL);
        if self.runs.len() < self.nodes.len() {
            self.runs.resize(self.nodes.len(), RunKeys::default());
        }
        self.runs[node as usize] = RunKeys {
            seed,
            lo: range.end - keep,
            hi: range.end,
        };
        self.zones.insert(zone, node);
        self.push_tail(node);
        self.held += keep;
    }

    /// True if `private_key_of_latent(seed ^ index)` is held (what [`LruKeySet::contains`]
    /// says of that key, without hashing it when no single key is held).
    #[inline]
    pub fn contains_private(&self, seed: u64, index: u32) -> bool {
        let latent = seed ^ u64::from(index);
        (!self.zones.is_empty() && self.run_holding(latent).is_some())
            || (self.singles > 0 && self.probe(private_key_of_latent(latent)).1)
    }

    /// The run node holding the private key whose latent form is `latent`, if any.
    #[inline]
    pub(super) fn run_holding(&self, latent: u64) -> Option<u32> {
        let node = *self.zones.get(&(latent >> 32))?;
        let run = self.runs[node as usize];
        let index = latent ^ run.seed;
        (index >= u64::from(run.lo) && index < u64::from(run.hi)).then_some(node)
    }

    /// If a run holds `key`, splits it into single keys in its place (same order) and returns
    /// true.
    pub(super) fn split_holder(&mut self, key: u64) -> bool {
        let Some(node) = self.run_holding(super::latent_of_key(key)) else {
            return false;
        };
        let run = self.runs[node as usize];
        let mut prev = self.nodes[node as usize].prev;
        self.unlink(node);
        self.zones.remove(&(run.seed >> 32));
        self.free.push(node);
        for i in run.lo..run.hi {
            let key = private_key_of_latent(run.seed ^ u64::from(i));
            let (at, found) = self.probe(key);
            debug_assert!(!found, "a run's key is held once");
            let at = self.room_for_single(key, at);
            let single = self.alloc_node(at as u32);
            self.table[at] = super::Bucket { key, node: single };
            self.link_after(prev, single);
            prev = single;
            self.singles += 1;
        }
        true
    }

    /// Evicts the `count` least recently used keys (a run loses its lowest indices).
    pub(super) fn evict_front(&mut self, mut count: u32) {
        while count > 0 {
            let head = self.head;
            if head == NIL {
                debug_assert!(false, "evicting from an empty set");
                return;
            }
            let bucket = self.nodes[head as usize].bucket;
            if bucket != NIL {
                self.unlink(head);
                self.erase(bucket as usize);
                self.free.push(head);
                self.singles -= 1;
                self.held -= 1;
                count -= 1;
                continue;
            }
            let run = &mut self.runs[head as usize];
            let len = run.hi - run.lo;
            if len > count {
                run.lo += count;
                self.held -= count;
                return;
            }
            let zone = run.seed >> 32;
            self.unlink(head);
            self.zones.remove(&zone);
            self.free.push(head);
            self.held -= len;
            count -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Runs against a plain recency list of keys inserted one by one: seeded random runs
    /// (seeds from a few, so the same request comes back, with some sharing a zone), single
    /// inserts of private and other keys, touches and lookups, through evictions that split
    /// and empty runs and through `clear`.
    #[test]
    fn runs_match_keys_inserted_one_by_one() {
        for capacity in [1, 5, 40, 300] {
            let mut set = LruKeySet::new(capacity);
            let mut model: VecDeque<u64> = VecDeque::new();
            let mut state = 0x9e37_u64 ^ u64::from(capacity);
            let mut next = || {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                state >> 33
            };
            let insert = |model: &mut VecDeque<u64>, key: u64| {
                if let Some(at) = model.iter().position(|&k| k == key) {
                    model.remove(at);
                } else if model.len() == capacity as usize {
                    model.pop_front();
                }
                model.push_back(key);
            };
            for step in 0..6_000 {
                let draw = next();
                // Seeds: 0..12 spread, or sharing the top 32 bits with seed 1 (same zone).
                let seed = match draw % 3 {
                    0 => (1 << 32) | (next() % 4 * 64),
                    _ => (next() % 12).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                };
                let lo = (next() % 8) as u32;
                let hi = lo + (next() % 60) as u32;
                let index = (next() % 70) as u32;
                let key = private_key_of_latent(seed ^ u64::from(index));
                match next() % 8 {
                    0..=3 => {
                        set.insert_private_run(seed, lo..hi);
                        for i in lo..hi {
                            insert(&mut model, private_key_of_latent(seed ^ u64::from(i)));
                        }
                    }
                    4 => {
                        set.insert(key);
                        insert(&mut model, key);
                    }
                    5 => {
                        // A key no run holds (a shareable block's).
                        let other = next() % 50;
                        set.insert(other);
                        insert(&mut model, other);
                    }
                    6 => {
                        set.touch(key);
                        if let Some(at) = model.iter().position(|&k| k == key) {
                            model.remove(at);
                            model.push_back(key);
                        }
                    }
                    _ if step % 997 == 0 => {
                        set.clear();
                        model.clear();
                    }
                    _ => {}
                }
                let held = model.contains(&key);
                assert_eq!(set.contains(key), held, "step {step}");
                assert_eq!(set.contains_private(seed, index), held, "step {step}");
                assert_eq!(set.len() as usize, model.len(), "step {step}");
                if step % 50 == 0 {
                    assert_eq!(
                        set.keys_lru_first(),
                        Vec::from(model.clone()),
                        "step {step}"
                    );
                }
            }
            assert_eq!(set.keys_lru_first(), Vec::from(model));
        }
    }
}
