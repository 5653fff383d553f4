//! The KV cache's free list: taking blocks (virgin ones first, then the least recently
//! freed, singly or a run at once, keyed on the way when they are private and full) and
//! putting them back, and forgetting a reused block's key.

use super::KvCache;
use super::block::{Block, NIL};

/// How fresh blocks are keyed as they are taken: those going to table indices below `full`
/// are private and full, so they get their latent keys (`seed ^ index`) at once.
#[derive(Clone, Copy, Debug)]
pub(super) struct PrivateFill {
    pub(super) seed: u64,
    pub(super) full: u32,
}

impl PrivateFill {
    /// Of `count` blocks going to indices from `first_index` on, how many lead below `full`.
    pub(super) fn keyed(self, first_index: u32, count: u32) -> u32 {
        self.full.saturating_sub(first_index).min(count)
    }
}

impl KvCache {
    /// Materializes the next virgin block (free, unkeyed, off the list), if any is left,
    /// counting it as taken from the free blocks.
    pub(super) fn take_virgin(&mut self) -> Option<u32> {
        let id = self.blocks.len() as u32;
        if id == self.total {
            return None;
        }
        self.blocks.push(Block::held(0));
        self.free_count -= 1;
        Some(id)
    }

    /// Materializes up to `count` virgin blocks at once, taken (refcount 1), to go to a
    /// table from index `first_index` on (keyed as `fill` says): their ids.
    pub(super) fn take_virgins(
        &mut self,
        count: u32,
        first_index: u32,
        fill: Option<PrivateFill>,
    ) -> std::ops::Range<u32> {
        let start = self.blocks.len() as u32;
        let taken = count.min(self.total - start);
        let keyed = fill.map_or(0, |fill| fill.keyed(first_index, taken));
        if keyed > 0 {
            let seed = fill.map_or(0, |fill| fill.seed);
            self.blocks.extend(
                (first_index..first_index + keyed)
                    .map(|index| Block::latent_held(seed ^ u64::from(index))),
            );
        }
        self.blocks.extend(std::iter::repeat_n(
            Block::held(1),
            (taken - keyed) as usize,
        ));
        self.free_count -= taken;
        start..start + taken
    }

    pub(super) fn pop_free(&mut self) -> u32 {
        if let Some(id) = self.take_virgin() {
            self.blocks[id as usize].set_held(1);
            return id;
        }
        self.pop_listed()
    }

    /// Takes the least recently freed block (the free list's head, which must exist), held
    /// once and unkeyed: its key, if any, is forgotten.
    #[inline(always)]
    pub(super) fn pop_listed(&mut self) -> u32 {
        let id = self.free_head;
        debug_assert!(id != NIL, "pop from an empty free list");
        let block = self.blocks[id as usize];
        debug_assert_eq!(block.prev(), NIL, "the head has no predecessor");
        let next = block.next();
        self.free_head = next;
        if next == NIL {
            self.free_tail = NIL;
        } else {
            self.blocks[next as usize].set_prev(NIL);
        }
        self.free_count -= 1;
        self.blocks[id as usize] = Block::held(1);
        if block.is_keyed() {
            self.forget(id, block);
        }
        id
    }

    /// Takes the `count` least recently freed blocks (the free list must hold them) into
    /// `ids`, as [`Self::pop_listed`] would one by one, with one list update.
    pub(super) fn pop_listed_run(
        &mut self,
        count: u32,
        ids: &mut Vec<u32>,
        fill: Option<PrivateFill>,
    ) {
        debug_assert!(count > 0, "an empty run");
        ids.reserve(count as usize);
        let first_index = ids.len() as u32;
        let keyed = fill.map_or(0, |fill| fill.keyed(first_index, count));
        let seed = fill.map_or(0, |fill| fill.seed);
        let mut id = self.free_head;
        for taken in 0..count {
            debug_assert!(id != NIL, "pop from an empty free list");
            let block = self.blocks[id as usize];
            self.blocks[id as usize] = if taken < keyed {
                Block::latent_held(seed ^ u64::from(first_index + taken))
            } else {
                Block::held(1)
            };
            if block.is_keyed() {
                self.forget(id, block);
            }
            ids.push(id);
            id = block.next();
        }
        self.free_head = id;
        if id == NIL {
            self.free_tail = NIL;
        } else {
            self.blocks[id as usize].set_prev(NIL);
        }
        self.free_count -= count;
    }

    /// Forgets the key `block` (as it was on the free list) held: block `id` is reused. (A
    /// latent key, the common case, costs a count; the map and the CPU tier are out of line.)
    #[inline(always)]
    fn forget(&mut self, id: u32, block: Block) {
        if block.is_mapped() || self.cpu.is_some() {
            self.forget_slow(id, block);
        }
        self.stats.evicted_blocks += 1;
    }

    #[inline(never)]
    fn forget_slow(&mut self, id: u32, block: Block) {
        if block.is_mapped() {
            let removed = self.by_key.remove(&block.key);
            debug_assert_eq!(removed, Some(id), "a mapped block's key maps to it");
            self.key_version += 1;
        }
        debug_assert!(block.key().is_some(), "only keyed blocks are forgotten");
        if let (Some(cpu), Some(key)) = (&mut self.cpu, block.key()) {
            cpu.insert(key);
        }
    }

    pub(super) fn unlink_free(&mut self, id: u32) {
        let (prev, next) = (
            self.blocks[id as usize].prev(),
            self.blocks[id as usize].next(),
        );
        if prev == NIL {
            self.free_head = next;
        } else {
            self.blocks[prev as usize].set_next(next);
        }
        if next == NIL {
            self.free_tail = prev;
        } else {
            self.blocks[next as usize].set_prev(prev);
        }
        // Off the list, held by nobody yet (the caller takes it).
        self.blocks[id as usize].set_held(0);
        self.free_count -= 1;
    }

    pub(super) fn push_free(&mut self, id: u32) {
        let tail = self.free_tail;
        self.blocks[id as usize].set_free(tail, NIL);
        if tail == NIL {
            self.free_head = id;
        } else {
            self.blocks[tail as usize].set_next(id);
        }
        self.free_tail = id;
        self.free_count += 1;
    }
}
