//! The KV cache's free list: taking blocks (virgin ones first, then the least recently
//! freed) for an identified or an anonymous destination, putting them back one by one or a
//! run at once, and forgetting a reused block's key.
//!
//! The list, least recently freed first, links arena records: identified free blocks and
//! run nodes. A run node stands for anonymous blocks `lo..hi` of one former owner, freed
//! highest index first, so the next one taken is `hi - 1`; those below `keyed_hi` hold their
//! private keys in latent form (`seed ^ index`). Taking from a run is arithmetic: the latent
//! key of a reused block is counted as evicted (and finished for the CPU tier, if any) in
//! exactly the order the blocks would have been taken one by one.

use super::KvCache;
use super::block::{Block, NIL};
use super::hash::private_key_of_latent;

/// A run of anonymous free blocks (see the module doc).
#[derive(Clone, Copy, Debug)]
pub(super) struct Run {
    /// The former owner's private seed.
    pub(super) seed: u64,
    /// Lowest table index of the run.
    pub(super) lo: u32,
    /// One past the highest index still in the run (the next taken is `hi - 1`).
    pub(super) hi: u32,
    /// Indices below this held latent keys; from it on, the blocks were unkeyed.
    pub(super) keyed_hi: u32,
}

impl Run {
    /// Blocks in the run.
    pub(super) fn len(&self) -> u32 {
        self.hi - self.lo
    }
}

impl KvCache {
    /// A new arena record holding `block`: a recycled slot if any, else a new one.
    #[inline]
    pub(super) fn new_record(&mut self, block: Block) -> u32 {
        match self.spare_ids.pop() {
            Some(id) => {
                self.blocks[id as usize] = block;
                id
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    /// Retires arena record `id` (its block became anonymous, or its run node emptied).
    #[inline]
    fn kill_record(&mut self, id: u32) {
        self.blocks[id as usize] = Block::held(0);
        self.spare_ids.push(id);
    }

    /// Takes one block for an identified destination (held once, unkeyed): a virgin block,
    /// the top of the head run, or the head block (its key forgotten). Its id.
    pub(super) fn take_ident(&mut self) -> u32 {
        debug_assert!(self.free_count > 0, "take from an empty cache");
        if self.virgin > 0 {
            self.virgin -= 1;
            self.free_count -= 1;
            return self.new_record(Block::held(1));
        }
        let head = self.free_head;
        if self.blocks[head as usize].is_run() {
            self.take_from_head_run(1);
            self.free_count -= 1;
            return self.new_record(Block::held(1));
        }
        self.pop_listed()
    }

    /// Takes `count` blocks (which must be free) for an anonymous destination, in LRU order:
    /// virgin blocks, then runs and identified blocks off the head.
    pub(super) fn take_anon(&mut self, count: u32) {
        debug_assert!(count <= self.free_count, "take more than is free");
        let virgin = count.min(self.virgin);
        self.virgin -= virgin;
        // (`pop_listed` counts its own block.)
        self.free_count -= virgin;
        let mut need = count - virgin;
        while need > 0 {
            let head = self.free_head;
            debug_assert!(head != NIL, "take from an empty free list");
            if self.blocks[head as usize].is_run() {
                let taken = self.take_from_head_run(need);
                self.free_count -= taken;
                need -= taken;
            } else {
                let id = self.pop_listed();
                self.kill_record(id);
                need -= 1;
            }
        }
    }

    /// [`Self::take_anon`]'s common batch, inlined: `count` blocks off a head run holding
    /// more than that, with no virgin block and no CPU tier (the evicted latent keys are
    /// only counted). False, changing nothing, otherwise.
    #[inline(always)]
    pub(super) fn take_anon_off_head_run(&mut self, count: u32) -> bool {
        debug_assert!(self.virgin == 0 && count > 0 && count <= self.free_count);
        let node = self.blocks[self.free_head as usize];
        if !node.is_run() || self.cpu.is_some() {
            return false;
        }
        let run = &mut self.runs[node.run_slot()];
        if run.len() <= count {
            return false;
        }
        let new_hi = run.hi - count;
        let keyed_top = run.hi.min(run.keyed_hi);
        run.hi = new_hi;
        self.stats.evicted_blocks += u64::from(keyed_top.saturating_sub(new_hi));
        self.free_count -= count;
        true
    }

    /// One block for an anonymous destination, off a free list holding no virgin block (the
    /// decode path's call).
    #[inline(always)]
    pub(super) fn take_anon_one(&mut self) {
        let head = self.free_head;
        debug_assert!(head != NIL && self.virgin == 0, "a listed block to take");
        let node = self.blocks[head as usize];
        if node.is_run() {
            let run = &mut self.runs[node.run_slot()];
            run.hi -= 1;
            let (index, seed, keyed, empty) =
                (run.hi, run.seed, run.hi < run.keyed_hi, run.hi == run.lo);
            if keyed {
                self.evict_latent(seed ^ u64::from(index));
            }
            if empty {
                self.drop_head_run(head);
            }
            self.free_count -= 1;
        } else {
            let id = self.pop_listed();
            self.kill_record(id);
        }
    }

    /// Takes up to `count` blocks off the top of the head run (free count left to the
    /// caller): how many.
    fn take_from_head_run(&mut self, count: u32) -> u32 {
        let head = self.free_head;
        let slot = self.blocks[head as usize].run_slot();
        let run = self.runs[slot];
        let taken = count.min(run.len());
        let new_hi = run.hi - taken;
        let keyed_top = run.hi.min(run.keyed_hi);
        if keyed_top > new_hi {
            self.stats.evicted_blocks += u64::from(keyed_top - new_hi);
            if let Some(cpu) = &mut self.cpu {
                for index in (new_hi..keyed_top).rev() {
                    cpu.insert(private_key_of_latent(run.seed ^ u64::from(index)));
                }
            }
        }
        self.runs[slot].hi = new_hi;
        if new_hi == run.lo {
            self.drop_head_run(head);
        }
        taken
    }

    /// Counts the eviction of an anonymous block's latent key (the CPU tier, if any, keeps
    /// the finished key).
    #[inline(always)]
    fn evict_latent(&mut self, latent: u64) {
        self.stats.evicted_blocks += 1;
        if self.cpu.is_some() {
            self.evict_latent_to_cpu(latent);
        }
    }

    #[inline(never)]
    fn evict_latent_to_cpu(&mut self, latent: u64) {
        if let Some(cpu) = &mut self.cpu {
            cpu.insert(private_key_of_latent(latent));
        }
    }

    /// Unlinks the empty run node at the head and recycles it.
    fn drop_head_run(&mut self, head: u32) {
        let node = self.blocks[head as usize];
        debug_assert!(node.is_run() && node.prev() == NIL, "the head run node");
        let next = node.next();
        self.free_head = next;
        if next == NIL {
            self.free_tail = NIL;
        } else {
            self.blocks[next as usize].set_prev(NIL);
        }
        self.spare_runs.push(node.run_slot() as u32);
        self.kill_record(head);
    }

    /// Appends a run of `seed`'s anonymous blocks `lo..hi` (latent keys below `keyed_hi`)
    /// to the tail, as if they were freed one by one from `hi - 1` down.
    pub(super) fn push_run(&mut self, seed: u64, lo: u32, hi: u32, keyed_hi: u32) {
        debug_assert!(lo < hi, "an empty run");
        let run = Run {
            seed,
            lo,
            hi,
            keyed_hi,
        };
        let slot = match self.spare_runs.pop() {
            Some(slot) => {
                self.runs[slot as usize] = run;
                slot
            }
            None => {
                self.runs.push(run);
                (self.runs.len() - 1) as u32
            }
        };
        let id = self.new_record(Block::run_node(slot));
        self.link_tail(id);
        self.free_count += hi - lo;
    }

    /// Takes the least recently freed record, an identified block (the free list's head,
    /// which must exist), held once and unkeyed: its key, if any, is forgotten.
    #[inline(always)]
    pub(super) fn pop_listed(&mut self) -> u32 {
        let id = self.free_head;
        debug_assert!(id != NIL, "pop from an empty free list");
        let block = self.blocks[id as usize];
        debug_assert!(!block.is_run(), "an identified block");
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

    /// Forgets the key `block` (as it was on the free list) held: block `id` is reused.
    #[inline(never)]
    fn forget(&mut self, id: u32, block: Block) {
        let removed = self.by_key.remove(&block.key);
        debug_assert_eq!(removed, Some(id), "a mapped block's key maps to it");
        self.key_version += 1;
        if let Some(cpu) = &mut self.cpu {
            cpu.insert(block.key);
        }
        self.stats.evicted_blocks += 1;
    }

    /// Takes identified block `id` off the free list (a prefix hit on it).
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

    /// Appends identified block `id` to the tail.
    pub(super) fn push_free(&mut self, id: u32) {
        self.link_tail(id);
        self.free_count += 1;
    }

    /// Links record `id` at the tail (marking it free, keeping its keying).
    fn link_tail(&mut self, id: u32) {
        let tail = self.free_tail;
        self.blocks[id as usize].set_free(tail, NIL);
        if tail == NIL {
            self.free_head = id;
        } else {
            self.blocks[tail as usize].set_next(id);
        }
        self.free_tail = id;
    }
}
