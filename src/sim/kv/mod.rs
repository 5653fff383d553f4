//! The paged KV cache of one instance, with vLLM v1's prefix caching.
//!
//! Owns the GPU blocks (refcounts, content keys), the LRU free list, the key-to-block map,
//! hit/miss counters and the optional CPU offload tier. Blocks whose refcount drops to zero
//! go to the tail of the free list *keeping their keys*, so a later request (or a preempted
//! one coming back) can still hit them; a key is forgotten only when its block is reused.
//! Allocation is transactional: it either grants every block a step needs or changes nothing.
//!
//! Knows nothing about scheduling, time or latency: callers say how many tokens a request
//! needs and receive blocks or a refusal.
//!
//! *Private* blocks (content only their own request produces: see
//! [`hash::shareable_blocks`]) are *anonymous*: no arena record, no id. A block table holds
//! its identified blocks' ids (prefix hits, shareable content) and then a count of anonymous
//! ones, whose keys derive from the owner's seed and the index (`seed ^ index`, the *latent*
//! form, see [`hash::private_seed`]); nobody else can hit them, so they stay out of the
//! lookup map. A finished request's anonymous blocks go back to the free list as one run
//! node, and admission and decode take blocks off a run by arithmetic (see `free_list`).
//! A latent key still counts as cached for eviction statistics, the CPU tier and
//! observation, and a preempted request's anonymous blocks are materialized with their
//! keys mapped (the only way they can be looked up). Results are exactly those of keying
//! every block in the map, one block at a time.
//!
//! Invariant: `free + used == total` at all times, where a block is free exactly when its
//! refcount is zero, and every free block is on the free list exactly once.

mod audit;
mod block;
mod crossings;
mod free_list;
pub mod hash;
mod key_hasher;
mod keying;
pub mod lru;
pub mod offload_store;
mod table;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use block::{Block, Keying, NIL};
use free_list::Run;
use hash::{BlockKeys, private_key_of_latent};

pub use block::MAX_BLOCKS;
pub use crossings::Crossings;
pub use key_hasher::{IdentityBuildHasher, IdentityHasher};
pub use lru::LruKeySet;
pub use offload_store::{OffloadStore, StoreWork};
pub use table::BlockTable;

/// Result of a prefix lookup: how many leading full blocks are already cached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixHit {
    /// Leading blocks resident on the GPU.
    pub gpu_blocks: u32,
    /// Following blocks found in the CPU tier (must be reloaded).
    pub cpu_blocks: u32,
}

impl PrefixHit {
    /// All hit blocks.
    pub fn blocks(&self) -> u32 {
        self.gpu_blocks + self.cpu_blocks
    }
}

/// Counters of prefix-cache effectiveness, in tokens (as vLLM's `prefix_cache_queries` and
/// `prefix_cache_hits`), plus block movements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Prompt tokens looked up at admission.
    pub query_tokens: u64,
    /// Of those, tokens found cached (GPU or CPU).
    pub hit_tokens: u64,
    /// Blocks reloaded from the CPU tier.
    pub cpu_loaded_blocks: u64,
    /// Keyed GPU blocks whose content was forgotten because the block was reused.
    pub evicted_blocks: u64,
}

/// The KV cache of one instance.
///
/// Blocks never used yet are *virgin*: counted, not materialized, and logically at the head
/// of the free list, ahead of every freed block (a block, once freed, goes to the tail).
/// Identified blocks and run nodes are records of an arena (`blocks`) whose slots are
/// recycled; anonymous blocks have no record at all. So a fork of a cache copies only the
/// identified blocks and the runs.
#[derive(Debug)]
pub struct KvCache {
    block_size: u32,
    prefix_caching: bool,
    /// The arena: identified blocks, run nodes and retired slots (in `spare_ids`).
    blocks: Vec<Block>,
    /// Retired arena slots, reused first.
    spare_ids: Vec<u32>,
    /// Run nodes' runs, by slot.
    runs: Vec<Run>,
    /// Unused run slots.
    spare_runs: Vec<u32>,
    /// Virgin blocks (free, at the head of the free list).
    virgin: u32,
    /// All blocks.
    total: u32,
    /// Least recently freed end of the list of freed records; virgin blocks come before it,
    /// and allocation takes them first.
    free_head: u32,
    /// Most recently freed end: release appends here.
    free_tail: u32,
    /// Free blocks: virgin ones plus those on the list (a run counts its blocks).
    free_count: u32,
    by_key: HashMap<u64, u32, IdentityBuildHasher>,
    cpu: Option<LruKeySet>,
    stats: KvStats,
    /// Bumped whenever the set of cached keys changes (lets observers skip re-copying it).
    key_version: u64,
}

impl Clone for KvCache {
    /// Copies the arena and the runs, keeping room for the rest.
    fn clone(&self) -> Self {
        Self {
            block_size: self.block_size,
            prefix_caching: self.prefix_caching,
            blocks: table::clone_with_capacity(&self.blocks),
            spare_ids: self.spare_ids.clone(),
            runs: self.runs.clone(),
            spare_runs: self.spare_runs.clone(),
            virgin: self.virgin,
            total: self.total,
            free_head: self.free_head,
            free_tail: self.free_tail,
            free_count: self.free_count,
            by_key: self.by_key.clone(),
            cpu: self.cpu.clone(),
            stats: self.stats,
            key_version: self.key_version,
        }
    }
}

impl KvCache {
    /// A cache of `num_blocks` empty blocks of `block_size` tokens, all free.
    ///
    /// `cpu_blocks > 0` adds a CPU offload tier of that many blocks.
    pub fn new(num_blocks: u32, block_size: u32, prefix_caching: bool, cpu_blocks: u32) -> Self {
        debug_assert!(num_blocks > 0, "a KV cache needs blocks");
        debug_assert!(
            num_blocks <= MAX_BLOCKS,
            "block ids fit the free-list links"
        );
        debug_assert!(block_size > 0, "blocks need tokens");
        Self {
            block_size,
            prefix_caching,
            // Grown on demand: live records never outnumber the blocks.
            blocks: Vec::new(),
            spare_ids: Vec::new(),
            runs: Vec::new(),
            spare_runs: Vec::new(),
            virgin: num_blocks,
            total: num_blocks,
            free_head: NIL,
            free_tail: NIL,
            free_count: num_blocks,
            // Grown on demand: private blocks never enter it, and a small map clones cheaply.
            by_key: HashMap::with_hasher(IdentityBuildHasher),
            cpu: (cpu_blocks > 0 && prefix_caching).then(|| LruKeySet::new(cpu_blocks)),
            stats: KvStats::default(),
            key_version: 0,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Total GPU blocks.
    pub fn total_blocks(&self) -> u32 {
        self.total
    }

    /// Blocks with refcount zero (free, possibly still holding a cached key).
    pub fn free_blocks(&self) -> u32 {
        self.free_count
    }

    /// Blocks held by at least one request.
    pub fn used_blocks(&self) -> u32 {
        self.total_blocks() - self.free_count
    }

    /// Fraction of blocks in use, in [0, 1] (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        f64::from(self.used_blocks()) / f64::from(self.total_blocks())
    }

    /// Counters so far.
    pub fn stats(&self) -> KvStats {
        self.stats
    }

    /// Blocks held in the CPU tier (0 without one).
    pub fn cpu_resident_blocks(&self) -> u32 {
        self.cpu.as_ref().map_or(0, LruKeySet::len)
    }

    /// Keys of the blocks findable by a prefix lookup on the GPU, in no particular order
    /// (callers collect them into a set; the order never reaches output). Latent private keys
    /// are left out: no other request can hit them.
    pub fn cached_keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_key.keys().copied()
    }

    /// Keys of the keyed blocks on the free list, least recently used (next evicted) first
    /// (virgin blocks hold none).
    pub fn free_keys_lru_first(&self) -> Vec<u64> {
        let mut keys = Vec::new();
        let mut cursor = self.free_head;
        while cursor != NIL {
            let block = &self.blocks[cursor as usize];
            if block.is_run() {
                let run = self.runs[block.run_slot()];
                let keyed_top = run.hi.min(run.keyed_hi);
                keys.extend(
                    (run.lo..keyed_top)
                        .rev()
                        .map(|index| private_key_of_latent(run.seed ^ u64::from(index))),
                );
            } else if let Some(key) = block.key() {
                keys.push(key);
            }
            cursor = block.next();
        }
        keys
    }

    /// Keys in the CPU tier, least recently used (next dropped) first; empty without a tier.
    /// The order its offloads and reloads leave is observable (what a later reload finds),
    /// so tests compare it.
    pub fn cpu_keys_lru_first(&self) -> Vec<u64> {
        self.cpu
            .as_ref()
            .map_or_else(Vec::new, LruKeySet::keys_lru_first)
    }

    /// Heap bytes held (estimate: the arena and runs as used, plus the key map's and CPU
    /// tier's capacity).
    pub fn memory_bytes(&self) -> usize {
        let map_entry = std::mem::size_of::<(u64, u32)>() + 1;
        self.blocks.len() * std::mem::size_of::<Block>()
            + self.runs.len() * std::mem::size_of::<Run>()
            + (self.spare_ids.len() + self.spare_runs.len()) * 4
            + self.by_key.capacity() * map_entry
            + self.cpu.as_ref().map_or(0, LruKeySet::memory_bytes)
    }

    /// A counter that changes whenever the set of cached keys changes.
    pub fn key_version(&self) -> u64 {
        self.key_version
    }

    /// True if a block with content `key` is findable by a prefix lookup on the GPU.
    pub fn contains_key(&self, key: u64) -> bool {
        self.by_key.contains_key(&key)
    }

    /// Number of leading blocks of `keys` (at most `max_blocks`) cached on the GPU, then in
    /// the CPU tier. A pure query: nothing changes.
    pub fn lookup(&self, keys: BlockKeys<'_>, max_blocks: u32) -> PrefixHit {
        let mut hit = PrefixHit::default();
        if !self.prefix_caching {
            return hit;
        }
        let mut index = 0;
        while index < max_blocks && self.by_key.contains_key(&keys.get(index)) {
            index += 1;
        }
        hit.gpu_blocks = index;
        if let Some(cpu) = &self.cpu {
            while index < max_blocks && cpu.contains(keys.get(index)) {
                index += 1;
            }
        }
        hit.cpu_blocks = index - hit.gpu_blocks;
        hit
    }

    /// Records one admission's prefix lookup in the hit counters.
    pub fn record_lookup(&mut self, query_tokens: u32, hit_tokens: u32) {
        debug_assert!(
            hit_tokens <= query_tokens,
            "hits {hit_tokens} > queries {query_tokens}"
        );
        self.stats.query_tokens += u64::from(query_tokens);
        self.stats.hit_tokens += u64::from(hit_tokens);
    }

    /// The first table index whose fresh blocks are anonymous: past the shareable ones
    /// (every block, with prefix caching off: none is ever looked up).
    #[inline(always)]
    fn anon_from(&self, keys: BlockKeys<'_>) -> u32 {
        if self.prefix_caching {
            keys.shareable
        } else {
            0
        }
    }

    /// Grows `table` so it covers `total_tokens` tokens, first taking the `hit` blocks (only
    /// allowed while the table is empty), then fresh blocks; then keys every block that is
    /// full at `total_tokens` (blocks from `keys.shareable` on hold private content).
    /// Returns false, changing nothing, if there are not enough free blocks.
    #[inline(always)]
    pub fn allocate(
        &mut self,
        table: &mut BlockTable,
        keys: BlockKeys<'_>,
        hit: PrefixHit,
        total_tokens: u32,
    ) -> bool {
        // The decode path's call, inlined: a token crossing a block boundary into anonymous
        // blocks takes the least recently freed block (no virgin left), and the block it
        // filled, if private, gets its latent key.
        let len = table.len();
        if hit.blocks() == 0
            && total_tokens == len * self.block_size + 1
            && self.free_head != NIL
            && self.virgin == 0
            && len >= self.anon_from(keys)
        {
            self.take_anon_one();
            table.seed = keys.owner_seed;
            table.anon += 1;
            if !self.key_one_private_block(table, keys, total_tokens) {
                self.key_full_blocks(table, keys, total_tokens);
            }
            return true;
        }
        self.allocate_general(table, keys, hit, total_tokens)
    }

    /// A lazy window's per-block call, its common case: a request all of whose shareable
    /// blocks are keyed (`table.num_keyed >= shareable`, prefix caching on) crossing into a
    /// new block while the key map is empty takes one anonymous block, and the blocks full
    /// at `total_tokens` count as keyed (the one it filled, and the new one when a block
    /// holds one token; private, and no map can hold their keys), exactly as
    /// [`Self::allocate`] would. Returns false, changing nothing, in every other case (the
    /// caller then calls [`Self::allocate`]). `seed` is the owner's private seed. The caller
    /// guarantees the preconditions in parentheses (the window checks them; crate-only so
    /// no other caller can skip them).
    #[inline(always)]
    pub(crate) fn take_crossing(
        &mut self,
        table: &mut BlockTable,
        seed: u64,
        total_tokens: u32,
    ) -> bool {
        let len = table.len();
        if total_tokens != len * self.block_size + 1
            || self.free_head == NIL
            || self.virgin != 0
            || !self.by_key.is_empty()
        {
            return false;
        }
        debug_assert!(self.prefix_caching, "keying needs prefix caching");
        debug_assert!(table.num_keyed <= len && table.ids.len() as u32 <= table.num_keyed);
        self.take_anon_one();
        self.record_crossing(table, seed, len);
        true
    }

    /// Takes `count` fresh blocks (which must be free) for `table`'s next indices:
    /// identified ones below `anon_from`, anonymous ones from it on, in index order.
    fn take_fresh(&mut self, table: &mut BlockTable, keys: BlockKeys<'_>, count: u32) {
        let identified = self.anon_from(keys).saturating_sub(table.len()).min(count);
        if identified > 0 {
            debug_assert_eq!(table.anon, 0, "identified blocks lead");
            for _ in 0..identified {
                let id = self.take_ident();
                table.ids.push(id);
            }
        }
        if count > identified {
            self.take_anon(count - identified);
            table.seed = keys.owner_seed;
            table.anon += count - identified;
        }
    }

    /// [`Self::allocate`]'s every other case.
    #[inline(never)]
    fn allocate_general(
        &mut self,
        table: &mut BlockTable,
        keys: BlockKeys<'_>,
        hit: PrefixHit,
        total_tokens: u32,
    ) -> bool {
        debug_assert!(
            hit.blocks() == 0 || table.is_empty(),
            "prefix hits are taken only by a request holding no blocks"
        );
        let required = total_tokens.div_ceil(self.block_size);
        if hit.blocks() == 0 && required == table.len() + 1 {
            // One fresh block (a decode crossing a block boundary).
            if self.free_count == 0 {
                return false;
            }
            self.take_fresh(table, keys, 1);
            if !self.key_one_private_block(table, keys, total_tokens) {
                self.key_full_blocks(table, keys, total_tokens);
            }
            return true;
        }
        if hit.blocks() == 0 && required <= table.len() {
            // The common decode step: the tokens fit the blocks already held.
            self.key_full_blocks(table, keys, total_tokens);
            return true;
        }
        let held = table.len() + hit.gpu_blocks;
        let fresh = required.saturating_sub(held);
        let hits_on_free_list = (0..hit.gpu_blocks)
            .filter(|&index| {
                let id = self.by_key[&keys.get(index)];
                self.blocks[id as usize].is_free()
            })
            .count() as u32;
        // (Written without subtraction: repeated keys may count one free block twice.)
        if u64::from(fresh) + u64::from(hits_on_free_list) > u64::from(self.free_count) {
            return false;
        }
        for index in 0..hit.gpu_blocks {
            let id = self.by_key[&keys.get(index)];
            self.acquire(id);
            table.ids.push(id);
        }
        // Blocks reloaded from the CPU tier first (identified: their keys enter the map),
        // then fresh ones.
        let reloaded = hit.cpu_blocks.min(fresh);
        for _ in 0..reloaded {
            let id = self.take_ident();
            let key = keys.get(table.len());
            self.set_key(id, key);
            if let Some(cpu) = &mut self.cpu {
                cpu.touch(key);
            }
            self.stats.cpu_loaded_blocks += 1;
            table.ids.push(id);
        }
        if fresh > reloaded {
            self.take_fresh(table, keys, fresh - reloaded);
        }
        if hit.blocks() > 0 {
            table.num_keyed = hit.blocks();
        }
        self.key_full_blocks(table, keys, total_tokens);
        debug_assert_eq!(table.len(), required.max(held), "table covers the tokens");
        true
    }

    /// Marks a free, never-keyed block as holding `key` and moves it to the most recently
    /// used end of the free list (restoring a cache observed from outside): a virgin block,
    /// else the least recently used free block if it is unkeyed. Does nothing if `key` is
    /// already cached, or if neither exists (the head of the free list holds a key: seeding
    /// fills a fresh cache from its virgin blocks, so keyed blocks only sit ahead of unkeyed
    /// ones once the virgin blocks are spent).
    pub fn seed_cached(&mut self, key: u64) {
        if self.by_key.contains_key(&key) {
            return;
        }
        let id = if self.virgin > 0 {
            self.virgin -= 1;
            self.free_count -= 1;
            self.new_record(Block::held(0))
        } else {
            let head = self.free_head;
            if head == NIL {
                return;
            }
            let node = self.blocks[head as usize];
            if node.is_run() {
                let run = self.runs[node.run_slot()];
                if run.hi <= run.keyed_hi {
                    return; // the head block is keyed
                }
                self.take_anon(1);
                self.new_record(Block::held(0))
            } else {
                if node.keying() != Keying::Unkeyed {
                    return;
                }
                self.unlink_free(head);
                head
            }
        };
        self.set_key(id, key);
        self.push_free(id);
    }

    /// Releases the blocks of a preempted request: as [`KvCache::free`], after making its
    /// latent private keys findable, since the request will look them up when it returns
    /// (its anonymous blocks are materialized, one record each: preemption is rare).
    pub fn free_preempted(&mut self, table: &mut BlockTable) {
        let lo = table.ids.len() as u32;
        for index in (lo..lo + table.anon).rev() {
            let id = self.new_record(Block::held(0));
            if table.anon_keyed(index) {
                // Its key was absent when latent, and only this request produces it.
                self.set_key(id, private_key_of_latent(table.seed ^ u64::from(index)));
            }
            self.push_free(id);
        }
        table.anon = 0;
        self.free(table);
    }

    /// Releases every block of `table` (last block first, so a request's tail is evicted
    /// before its prefix) and empties it. Its anonymous blocks go back as one run (more
    /// around duplicates), whatever their number.
    pub fn free(&mut self, table: &mut BlockTable) {
        if table.anon > 0 {
            let lo = table.ids.len() as u32;
            let mut top = lo + table.anon;
            let keyed_hi = table.num_keyed.clamp(lo, top);
            for &dup in table.dups.iter().rev() {
                if dup + 1 < top {
                    self.push_run(table.seed, dup + 1, top, keyed_hi);
                }
                self.push_run(table.seed, dup, dup + 1, dup);
                top = dup;
            }
            if lo < top {
                self.push_run(table.seed, lo, top, keyed_hi);
            }
            table.anon = 0;
        }
        table.dups.clear();
        // The released identified blocks are chained onto the tail in one pass (the list's
        // ends and count written once).
        let mut tail = self.free_tail;
        let mut released = 0;
        for &id in table.ids.iter().rev() {
            let block = &mut self.blocks[id as usize];
            if block.drop_holder() {
                block.set_free(tail, NIL);
                if tail == NIL {
                    self.free_head = id;
                } else {
                    self.blocks[tail as usize].set_next(id);
                }
                tail = id;
                released += 1;
            }
        }
        self.free_tail = tail;
        self.free_count += released;
        table.ids.clear();
        table.num_keyed = 0;
    }

    fn acquire(&mut self, id: u32) {
        if self.blocks[id as usize].is_free() {
            self.unlink_free(id);
            self.blocks[id as usize].set_held(1);
        } else {
            self.blocks[id as usize].add_holder();
        }
    }
}
