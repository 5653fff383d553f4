//! A fixed-capacity LRU set of block keys.
//!
//! Used as the KV cache's CPU offload tier (full blocks evicted from the GPU are copied here
//! and reloaded on a later GPU prefix miss) and as the router's approximate prefix index.
//! Index-linked list over a slot arena: every operation is O(1) and allocation-free once
//! full, and the set clones as plain data.

use std::collections::HashMap;

use super::IdentityBuildHasher;

const NIL: u32 = u32::MAX;

/// An LRU set of block keys with a fixed capacity.
#[derive(Clone, Debug)]
pub struct LruKeySet {
    capacity: u32,
    slot_of: HashMap<u64, u32, IdentityBuildHasher>,
    keys: Vec<u64>,
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Least recently used end.
    head: u32,
    /// Most recently used end.
    tail: u32,
}

impl LruKeySet {
    /// An empty tier holding at most `capacity` blocks (`capacity > 0`).
    pub fn new(capacity: u32) -> Self {
        debug_assert!(capacity > 0, "an LRU set needs capacity > 0");
        Self {
            capacity,
            slot_of: HashMap::with_capacity_and_hasher(capacity as usize, IdentityBuildHasher),
            keys: Vec::with_capacity(capacity as usize),
            prev: Vec::with_capacity(capacity as usize),
            next: Vec::with_capacity(capacity as usize),
            head: NIL,
            tail: NIL,
        }
    }

    /// Number of blocks held.
    pub fn len(&self) -> u32 {
        self.slot_of.len() as u32
    }

    /// True if no block is held.
    pub fn is_empty(&self) -> bool {
        self.slot_of.is_empty()
    }

    /// True if `key` is held (does not change recency).
    pub fn contains(&self, key: u64) -> bool {
        self.slot_of.contains_key(&key)
    }

    /// Marks `key` most recently used, if held.
    pub fn touch(&mut self, key: u64) {
        if let Some(&slot) = self.slot_of.get(&key) {
            self.unlink(slot);
            self.push_tail(slot);
        }
    }

    /// Heap bytes held (capacity-based estimate).
    pub fn memory_bytes(&self) -> usize {
        self.slot_of.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
            + self.keys.capacity() * 8
            + (self.prev.capacity() + self.next.capacity()) * 4
    }

    /// Keys held, least recently used first (for tests and snapshots).
    pub fn keys_lru_first(&self) -> Vec<u64> {
        let mut keys = Vec::with_capacity(self.slot_of.len());
        let mut cursor = self.head;
        while cursor != NIL {
            keys.push(self.keys[cursor as usize]);
            cursor = self.next[cursor as usize];
        }
        keys
    }

    /// Stores `key` as most recently used, evicting the least recently used key when full.
    pub fn insert(&mut self, key: u64) {
        if self.slot_of.contains_key(&key) {
            self.touch(key);
            return;
        }
        let slot = if (self.keys.len() as u32) < self.capacity {
            self.keys.push(key);
            self.prev.push(NIL);
            self.next.push(NIL);
            (self.keys.len() - 1) as u32
        } else {
            let victim = self.head;
            debug_assert!(victim != NIL, "a full tier has a head");
            self.unlink(victim);
            let old_key = self.keys[victim as usize];
            self.slot_of.remove(&old_key);
            self.keys[victim as usize] = key;
            victim
        };
        self.slot_of.insert(key, slot);
        self.push_tail(slot);
        debug_assert!(self.len() <= self.capacity, "LRU set over capacity");
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next) = (self.prev[slot as usize], self.next[slot as usize]);
        if prev == NIL {
            self.head = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.prev[next as usize] = prev;
        }
        self.prev[slot as usize] = NIL;
        self.next[slot as usize] = NIL;
    }

    fn push_tail(&mut self, slot: u32) {
        self.prev[slot as usize] = self.tail;
        self.next[slot as usize] = NIL;
        if self.tail == NIL {
            self.head = slot;
        } else {
            self.next[self.tail as usize] = slot;
        }
        self.tail = slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
