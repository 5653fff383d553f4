//! The reference for the KV cache's random operation sequences: vLLM v1's block pool, every
//! block moved singly, written from its documented semantics rather than from our cache.
//!
//! - All blocks start on the free queue, in id order; allocation pops the queue's head (the
//!   least recently freed block) and a freed block goes to its tail, a request's blocks
//!   last first (so its tail is evicted before its prefix).
//! - A block whose tokens are all computed is *cached*: its content key, hash-chained from
//!   its parent's, enters the key-to-block map, unless the map already holds that key (the
//!   block is then a duplicate and stays uncached). Every key is mapped here, private or not.
//! - A freed block keeps its key; the key is evicted only when the block is popped for reuse,
//!   and an evicted key is offloaded to the CPU tier (an LRU set of keys: inserting a key it
//!   holds makes it most recently used; over capacity, the least recently used key goes).
//! - A prefix hit takes the leading blocks found in the map (off the free queue if free,
//!   one more holder), then the following keys found in the CPU tier are reloaded into fresh
//!   blocks (the key re-cached on the GPU and touched in the tier), then fresh blocks cover
//!   the rest. An allocation that cannot get every block it needs changes nothing.
//! - With prefix caching off, no block is ever cached, found or offloaded.

use std::collections::{HashMap, VecDeque};

use super::super::{KvStats, PrefixHit};

/// One GPU block.
#[derive(Clone, Copy, Debug, Default)]
struct Block {
    /// The content key, while cached.
    key: Option<u64>,
    /// Requests holding it.
    refs: u32,
}

/// One request's blocks, in token order, and how many leading ones have been considered for
/// caching (vLLM's `num_cached_block`).
#[derive(Clone, Debug, Default)]
pub(super) struct Held {
    blocks: Vec<usize>,
    /// Leading blocks full (cached, or duplicates of cached content) so far.
    pub(super) keyed: u32,
}

impl Held {
    /// Blocks held.
    pub(super) fn len(&self) -> u32 {
        self.blocks.len() as u32
    }
}

/// vLLM's block pool with a CPU tier (see the module doc).
pub(super) struct BlockPool {
    block_size: u32,
    /// Prefix caching on.
    caching: bool,
    blocks: Vec<Block>,
    /// Free blocks, least recently freed first.
    free: VecDeque<usize>,
    /// Cached content: key to block.
    cached: HashMap<u64, usize>,
    /// The CPU tier, least recently used first.
    cpu: VecDeque<u64>,
    cpu_capacity: usize,
    /// The counters the cache reports.
    pub(super) stats: KvStats,
}

impl BlockPool {
    /// `num_blocks` free blocks of `block_size` tokens, prefix caching on if `caching`; a CPU
    /// tier of `cpu_capacity` keys (none if 0).
    pub(super) fn new(num_blocks: u32, block_size: u32, caching: bool, cpu_capacity: u32) -> Self {
        Self {
            block_size,
            caching,
            blocks: vec![Block::default(); num_blocks as usize],
            free: (0..num_blocks as usize).collect(),
            cached: HashMap::new(),
            cpu: VecDeque::new(),
            cpu_capacity: if caching { cpu_capacity as usize } else { 0 },
            stats: KvStats::default(),
        }
    }

    /// Free blocks.
    pub(super) fn free_count(&self) -> u32 {
        self.free.len() as u32
    }

    /// Keys of the cached free blocks, least recently freed first.
    pub(super) fn free_keys(&self) -> Vec<u64> {
        self.free
            .iter()
            .filter_map(|&id| self.blocks[id].key)
            .collect()
    }

    /// The CPU tier's keys, least recently used first.
    pub(super) fn cpu_keys(&self) -> Vec<u64> {
        self.cpu.iter().copied().collect()
    }

    /// True if a GPU block caches `key`.
    pub(super) fn is_cached(&self, key: u64) -> bool {
        self.cached.contains_key(&key)
    }

    /// Leading blocks of `key` (at most `max_blocks`) cached on the GPU, then in the CPU tier.
    pub(super) fn lookup(&self, key: impl Fn(u32) -> u64, max_blocks: u32) -> PrefixHit {
        if !self.caching {
            return PrefixHit::default();
        }
        let mut index = 0;
        while index < max_blocks && self.is_cached(key(index)) {
            index += 1;
        }
        let gpu_blocks = index;
        while index < max_blocks && self.cpu.contains(&key(index)) {
            index += 1;
        }
        PrefixHit {
            gpu_blocks,
            cpu_blocks: index - gpu_blocks,
        }
    }

    /// Offloads an evicted key to the CPU tier.
    fn offload(&mut self, key: u64) {
        if self.cpu_capacity == 0 {
            return;
        }
        self.cpu.retain(|&held| held != key);
        self.cpu.push_back(key);
        if self.cpu.len() > self.cpu_capacity {
            self.cpu.pop_front();
        }
    }

    /// Pops the free queue's head for reuse (held once), evicting its key if cached.
    fn pop_free(&mut self) -> usize {
        let id = self.free.pop_front().expect("a free block");
        if let Some(key) = self.blocks[id].key.take() {
            self.cached.remove(&key);
            self.stats.evicted_blocks += 1;
            self.offload(key);
        }
        self.blocks[id].refs = 1;
        id
    }

    /// Caches `key` in block `id` unless another block caches it already.
    fn cache(&mut self, id: usize, key: u64) {
        if !self.caching {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = self.cached.entry(key) {
            slot.insert(id);
            self.blocks[id].key = Some(key);
        }
    }

    /// Grows `held` to cover `total` tokens, taking `hit` first (only while it is empty),
    /// then caches the blocks full at `total`. False, changing nothing, if blocks run short.
    pub(super) fn allocate(
        &mut self,
        held: &mut Held,
        key: impl Fn(u32) -> u64,
        hit: PrefixHit,
        total: u32,
    ) -> bool {
        assert!(hit.blocks() == 0 || held.blocks.is_empty());
        let required = total.div_ceil(self.block_size) as usize;
        let hits: Vec<usize> = (0..hit.gpu_blocks)
            .map(|index| self.cached[&key(index)])
            .collect();
        let fresh = required.saturating_sub(held.blocks.len() + hits.len());
        let revived = hits.iter().filter(|&&id| self.blocks[id].refs == 0).count();
        if fresh + revived > self.free.len() {
            return false;
        }
        for id in hits {
            if self.blocks[id].refs == 0 {
                self.free.retain(|&free| free != id);
            }
            self.blocks[id].refs += 1;
            held.blocks.push(id);
        }
        for fresh_index in 0..fresh {
            let id = self.pop_free();
            if fresh_index < hit.cpu_blocks as usize {
                let key = key(held.len());
                self.cache(id, key);
                if let Some(at) = self.cpu.iter().position(|&held| held == key) {
                    self.cpu.remove(at);
                    self.cpu.push_back(key);
                }
                self.stats.cpu_loaded_blocks += 1;
            }
            held.blocks.push(id);
        }
        if !self.caching {
            return true;
        }
        if hit.blocks() > 0 {
            held.keyed = hit.blocks();
        }
        let full = (total / self.block_size).min(held.len());
        for index in held.keyed..full {
            self.cache(held.blocks[index as usize], key(index));
        }
        held.keyed = held.keyed.max(full);
        true
    }

    /// Releases `held`'s blocks, last first; those nobody else holds go to the free queue's
    /// tail, keeping their keys.
    pub(super) fn free(&mut self, held: &mut Held) {
        for &id in held.blocks.iter().rev() {
            self.blocks[id].refs -= 1;
            if self.blocks[id].refs == 0 {
                self.free.push_back(id);
            }
        }
        *held = Held::default();
    }

    /// A cache restored from outside: the least recently freed block, if free and uncached,
    /// caches `key` and becomes the most recently freed (nothing if `key` is cached already).
    pub(super) fn seed(&mut self, key: u64) {
        if self.is_cached(key) {
            return;
        }
        let Some(&head) = self.free.front() else {
            return;
        };
        if self.blocks[head].key.is_none() {
            self.free.pop_front();
            self.cache(head, key);
            self.free.push_back(head);
        }
    }
}
