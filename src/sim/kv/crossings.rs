//! A lazy window step's block crossings taken as one batch: each common crossing grows its
//! table at once and leaves its block pending, and the pending blocks leave the free list
//! together before the next other call on the cache. Anonymous takes are alike whoever makes
//! them, so the cache ends exactly as one take each would leave it.

use super::{BlockTable, KvCache};

/// Window crossings whose blocks are pending ([`KvCache::take_crossing_deferred`]): how
/// many, and how many the free list can give while no other call is made on the cache.
#[derive(Clone, Copy, Debug, Default)]
pub struct Crossings {
    pending: u32,
    room: u32,
}

impl Crossings {
    /// The batch to use after another call on `kv` (made after [`KvCache::take_pending`]):
    /// a fresh one if the spent batch `had_room`, else an empty one (the cache's conditions
    /// seldom change within a step, and a batch without room only sends every crossing down
    /// the ordinary path, so a cache that refuses batches, as a fork's does, skips the check).
    #[inline(always)]
    pub fn renew(had_room: bool, kv: &KvCache) -> Crossings {
        if had_room {
            kv.crossings()
        } else {
            Crossings::default()
        }
    }

    /// True if the batch could take a crossing's block.
    #[inline(always)]
    pub fn has_room(&self) -> bool {
        self.room > 0
    }
}

impl KvCache {
    /// A batch of window crossings whose blocks are taken together (see
    /// [`Self::take_crossing_deferred`]), valid until the next other call on the cache.
    #[inline(always)]
    pub fn crossings(&self) -> Crossings {
        // (No virgin block: the free count is the list's, empty when it is.)
        let room = if self.virgin == 0 && self.by_key.is_empty() && self.prefix_caching {
            self.free_count
        } else {
            0
        };
        Crossings { pending: 0, room }
    }

    /// [`Self::take_crossing`] with the block's take deferred: the table is grown and the
    /// block counted in `batch`, and [`Self::take_pending`] takes every pending block off
    /// the free list at once (by arithmetic on its head run), before any other call on the
    /// cache. Anonymous takes are alike whoever makes them, so a window step's crossings
    /// between two other calls leave the free list exactly as one take each would. False,
    /// changing nothing, when [`Self::take_crossing`] would be false with the pending blocks
    /// taken.
    #[inline(always)]
    pub(crate) fn take_crossing_deferred(
        &mut self,
        table: &mut BlockTable,
        seed: u64,
        total_tokens: u32,
        batch: &mut Crossings,
    ) -> bool {
        // (The room first: a batch without any, as in a fork's cache, fails at once.)
        if batch.pending >= batch.room {
            return false;
        }
        let len = table.len();
        if total_tokens != len * self.block_size + 1 {
            return false;
        }
        debug_assert!(self.virgin == 0 && self.by_key.is_empty() && self.prefix_caching);
        debug_assert!(table.num_keyed <= len && table.ids.len() as u32 <= table.num_keyed);
        table.seed = seed;
        table.anon += 1;
        // The blocks full at `total_tokens` (`len * block_size + 1`): the filled one, and
        // the new one too when a block holds one token.
        table.num_keyed = len + u32::from(self.block_size == 1);
        batch.pending += 1;
        true
    }

    /// Takes the blocks [`Self::take_crossing_deferred`] left pending in `batch`, in the
    /// order single takes would have gone; the batch is then spent (take a new one after
    /// the next call on the cache, see [`Crossings::renew`]).
    #[inline(always)]
    pub fn take_pending(&mut self, batch: &mut Crossings) {
        if batch.pending > 0 {
            debug_assert!(self.virgin == 0 && batch.pending <= self.free_count);
            if !self.take_anon_off_head_run(batch.pending) {
                self.take_anon(batch.pending);
            }
        }
        *batch = Crossings::default();
    }
}
