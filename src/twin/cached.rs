//! The blocks one instance holds in its prefix cache, as its KV events said, in persistent
//! (structurally shared) maps: a snapshot's copy costs O(1) and a KV batch costs what it
//! changes (O(blocks in the batch × log n)), not a copy of the whole cache. A busy pod keeps
//! its cache full (tens of thousands of blocks) and publishes many batches a second while the
//! store keeps a history of snapshots, so copying the cache per batch would cost CPU and
//! memory in proportion to the cache size times the history.
//!
//! A block is known by the hash its publisher gave it (what removals and parents name) and
//! kept under its *key*: derived from its token ids when the publisher sent them
//! ([`crate::sim::kv::hash::token_block_key`], chained from its parent's key), else the
//! publisher's hash. Memory: the publisher's hash, the key and a stamp per block, never the
//! tokens.

use imbl::OrdMap;

/// One instance's cached blocks in storage order (least recently stored first).
#[derive(Clone, Debug, Default)]
pub struct CachedBlocks {
    /// Publisher hash -> (stamp, key).
    by_hash: OrdMap<u64, (u64, u64)>,
    /// Stamp -> (publisher hash, key), in storage order.
    by_stamp: OrdMap<u64, (u64, u64)>,
    /// The next block's stamp.
    next_stamp: u64,
    /// Blocks whose key differs from their publisher hash.
    keyed_by_tokens: usize,
}

impl PartialEq for CachedBlocks {
    /// Equal when the same blocks are cached, in the same order, under the same keys
    /// (stamps are bookkeeping).
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .by_stamp
                .values()
                .zip(other.by_stamp.values())
                .all(|(a, b)| a == b)
    }
}

impl CachedBlocks {
    /// Blocks known only by their keys (no publisher hashes: a synthetic cache, or a test's),
    /// in storage order.
    pub fn from_keys(keys: impl IntoIterator<Item = u64>) -> Self {
        let mut blocks = Self::default();
        blocks.extend_keys(keys);
        blocks
    }

    /// Stores `keys` after the cached blocks, each its own publisher hash.
    pub fn extend_keys(&mut self, keys: impl IntoIterator<Item = u64>) {
        for key in keys {
            self.store(key, key);
        }
    }

    /// Number of cached blocks.
    pub fn len(&self) -> usize {
        self.by_stamp.len()
    }

    /// No block cached.
    pub fn is_empty(&self) -> bool {
        self.by_stamp.is_empty()
    }

    /// The cached blocks' keys, least recently stored first.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_stamp.values().map(|&(_, key)| key)
    }

    /// The cached blocks' keys as a vector, least recently stored first.
    pub fn to_keys(&self) -> Vec<u64> {
        self.keys().collect()
    }

    /// The cached blocks as their publisher named them, least recently stored first.
    pub fn publisher_hashes(&self) -> Vec<u64> {
        self.by_stamp.values().map(|&(hash, _)| hash).collect()
    }

    /// Whether some block is kept under a key other than its publisher's hash.
    pub fn has_aliases(&self) -> bool {
        self.keyed_by_tokens > 0
    }

    /// The key a question naming `hash` meets: the key of the cached block the publisher
    /// named `hash`, else `hash` itself.
    pub fn key_for(&self, hash: u64) -> u64 {
        self.key_of(hash).unwrap_or(hash)
    }

    /// The key of the cached block the publisher named `hash`, if it is cached.
    pub fn key_of(&self, hash: u64) -> Option<u64> {
        self.by_hash.get(&hash).map(|&(_, key)| key)
    }

    /// Stores block `hash` under `key` as the most recently stored (a block stored again
    /// moves to the end).
    pub fn store(&mut self, hash: u64, key: u64) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some((old, old_key)) = self.by_hash.insert(hash, (stamp, key)) {
            self.by_stamp.remove(&old);
            self.keyed_by_tokens -= usize::from(old_key != hash);
        }
        self.keyed_by_tokens += usize::from(key != hash);
        self.by_stamp.insert(stamp, (hash, key));
    }

    /// Removes block `hash` (nothing when it is not cached).
    pub fn remove(&mut self, hash: u64) {
        if let Some((stamp, key)) = self.by_hash.remove(&hash) {
            self.by_stamp.remove(&stamp);
            self.keyed_by_tokens -= usize::from(key != hash);
        }
    }

    /// Removes every block.
    pub fn clear(&mut self) {
        let next_stamp = self.next_stamp;
        *self = Self {
            next_stamp,
            ..Self::default()
        };
    }

    /// Drops the least recently stored blocks until at most `capacity` remain (the pod's own
    /// LRU would have evicted them; their removals were missed); returns how many.
    pub fn evict_to(&mut self, capacity: usize) -> usize {
        let mut evicted = 0;
        while self.by_stamp.len() > capacity {
            let Some(&(stamp, (hash, key))) = self.by_stamp.get_min() else {
                break;
            };
            self.by_stamp.remove(&stamp);
            self.by_hash.remove(&hash);
            self.keyed_by_tokens -= usize::from(key != hash);
            evicted += 1;
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_storage_order_keys_and_aliases() {
        let mut blocks = CachedBlocks::from_keys([1, 2]);
        blocks.store(10, 100);
        blocks.store(11, 11);
        assert_eq!(blocks.to_keys(), vec![1, 2, 100, 11]);
        assert_eq!(blocks.publisher_hashes(), vec![1, 2, 10, 11]);
        assert!(blocks.has_aliases());
        assert_eq!((blocks.key_for(10), blocks.key_for(99)), (100, 99));
        // Stored again: moves to the end, alias kept once.
        blocks.store(10, 100);
        assert_eq!(blocks.to_keys(), vec![1, 2, 11, 100]);
        blocks.remove(10);
        assert!(!blocks.has_aliases());
        assert_eq!(blocks.evict_to(1), 2);
        assert_eq!(blocks.to_keys(), vec![11]);
        blocks.clear();
        assert!(blocks.is_empty() && blocks.key_of(11).is_none());
    }

    #[test]
    fn a_copy_is_independent_of_later_writes() {
        let mut blocks = CachedBlocks::from_keys(0..1_000);
        let copy = blocks.clone();
        blocks.remove(5);
        blocks.store(2_000, 7);
        assert_eq!(copy.len(), 1_000);
        assert_eq!(copy.to_keys(), (0..1_000).collect::<Vec<_>>());
        assert_eq!(blocks.len(), 1_000);
        assert_ne!(blocks, copy);
        // Equality ignores stamps.
        assert_eq!(
            CachedBlocks::from_keys([3, 4]),
            CachedBlocks::from_keys([3, 4])
        );
    }
}
