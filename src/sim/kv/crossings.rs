//! A lazy window step's block crossings taken as one batch: each common crossing grows its
//! table at once and leaves its block pending, and the pending blocks leave the free list
//! together before the next other call on the cache. Anonymous takes are alike whoever makes
//! them, so the cache ends exactly as one take each would leave it. A request whose every
//! crossing is the common one may even leave its table behind: its crossings are only
//! counted, and the table caught up when it is next read.

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

    /// Counts `count` common crossings of requests whose tables lag (a lazy window's steady
    /// members): their blocks are pending like [`KvCache::take_crossing_deferred`]'s, but
    /// their tables are left as they are, to be brought up to date by
    /// [`KvCache::catch_up_crossings`]. False, changing nothing, unless the batch has room
    /// for all of them (a batch has room only while the cache meets the deferral's
    /// conditions).
    #[inline(always)]
    pub(crate) fn defer_lagging(&mut self, count: u32) -> bool {
        if self.pending + count > self.room {
            return false;
        }
        self.pending += count;
        true
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
        self.record_crossing(table, seed, len);
        batch.pending += 1;
        true
    }

    /// A common crossing's mark on a table of `len` blocks (its block taken, or pending):
    /// one more anonymous block of `seed`'s, and the blocks full at `len * block_size + 1`
    /// tokens keyed. One place for [`Self::take_crossing`], [`Self::take_crossing_deferred`]
    /// and [`Self::catch_up_crossings`].
    #[inline(always)]
    pub(super) fn record_crossing(&self, table: &mut BlockTable, seed: u64, len: u32) {
        table.seed = seed;
        table.anon += 1;
        table.num_keyed = self.keyed_after_crossing(len);
    }

    /// Blocks full once a table of `len` blocks crossed into a new one
    /// (`(len * block_size + 1) / block_size` without the division): the filled one, and the
    /// new one too when a block holds one token.
    #[inline(always)]
    fn keyed_after_crossing(&self, len: u32) -> u32 {
        len + u32::from(self.block_size == 1)
    }

    /// Writes into `table` the common crossings counted for it by
    /// [`Crossings::defer_lagging`] since it was last exact, up to `total_tokens` tokens
    /// allocated: the anonymous blocks covering them (already taken off the free list) and
    /// the keying those crossings give, exactly as one [`Self::take_crossing_deferred`]
    /// each would have left it. Nothing to do when the table covers `total_tokens`.
    pub(crate) fn catch_up_crossings(&self, table: &mut BlockTable, seed: u64, total_tokens: u32) {
        let len = table.len();
        let needed = total_tokens.div_ceil(self.block_size);
        if needed <= len {
            return;
        }
        table.seed = seed;
        table.anon += needed - len;
        // The last crossing's keying.
        let keyed = self.keyed_after_crossing(needed - 1);
        table.num_keyed = table.num_keyed.max(keyed);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::kv::PrefixHit;
    use crate::sim::kv::hash::{BlockKeys, private_seed};

    /// Crossings counted for a lagging table and caught up at the end leave the cache and
    /// the table exactly as one deferred take each, with every block size, over several
    /// steps, caught up every five crossings and at the end, and caught up again when there
    /// is nothing to catch up (no change).
    #[test]
    fn lagging_crossings_caught_up_equal_deferred_takes() {
        for block in [1u32, 2, 4, 16] {
            let build = || {
                let mut kv = KvCache::new(40, block, true, 0);
                // Every block used once (no virgin block left), then 30 freed as one run.
                let (mut first, mut table) = (BlockTable::default(), BlockTable::default());
                let grow = |kv: &mut KvCache, table: &mut BlockTable, owner, blocks: u32| {
                    let keys = BlockKeys::private(owner);
                    assert!(kv.allocate(table, keys, PrefixHit::default(), blocks * block));
                };
                grow(&mut kv, &mut first, 1, 30);
                grow(&mut kv, &mut table, 2, 10);
                kv.free(&mut first);
                (kv, table)
            };
            let (mut exact, mut exact_table) = build();
            let (mut lagging, mut lagging_table) = build();
            let seed = private_seed(2);
            for crossing in 0..12 {
                let total = (10 + crossing) * block + 1;
                let mut batch = exact.crossings();
                assert!(exact.take_crossing_deferred(&mut exact_table, seed, total, &mut batch));
                exact.take_pending(&mut batch);
                let mut batch = lagging.crossings();
                assert!(batch.defer_lagging(1));
                lagging.take_pending(&mut batch);
                if crossing % 5 == 4 {
                    lagging.catch_up_crossings(&mut lagging_table, seed, total);
                    assert_eq!(lagging_table, exact_table, "block size {block}");
                    // Nothing left to catch up: no change.
                    lagging.catch_up_crossings(&mut lagging_table, seed, total);
                    assert_eq!(lagging_table, exact_table, "block size {block}");
                }
            }
            assert_ne!(lagging_table, exact_table, "the table lags");
            let total = 21 * block + 1;
            lagging.catch_up_crossings(&mut lagging_table, seed, total);
            assert_eq!(lagging_table, exact_table, "block size {block}");
            assert_eq!(lagging.free_keys_lru_first(), exact.free_keys_lru_first());
            assert_eq!(lagging.stats(), exact.stats());
            lagging.check([&lagging_table].into_iter()).unwrap();
            // A batch without room for all refuses, changing nothing.
            let mut batch = lagging.crossings();
            assert!(!batch.defer_lagging(lagging.free_blocks() + 1));
            assert!(batch.defer_lagging(lagging.free_blocks()));
        }
    }
}
