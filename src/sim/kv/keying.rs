//! Keying a request's full blocks: shareable ones mapped (findable by others), private ones
//! counted latent (`num_keyed`), a private key already in the map left as a duplicate.

use super::hash::{BlockKeys, private_key_of_latent};
use super::{BlockTable, Keying, KvCache};

impl KvCache {
    /// The decode path's keying in one go: if exactly one more block is full, it is
    /// anonymous and the key map is empty (so it cannot hold the key), counts it keyed and
    /// returns true; otherwise returns false and leaves the work to [`Self::key_full_blocks`].
    #[inline]
    pub(super) fn key_one_private_block(
        &mut self,
        table: &mut BlockTable,
        keys: BlockKeys<'_>,
        total_tokens: u32,
    ) -> bool {
        if !self.prefix_caching {
            return true;
        }
        let index = table.num_keyed;
        let full = (total_tokens / self.block_size).min(table.len());
        if full != index + 1
            || index < keys.shareable
            || index < table.ids.len() as u32
            || !self.by_key.is_empty()
        {
            return full <= index;
        }
        table.num_keyed = full;
        true
    }

    /// Keys every block of `table` that is full at `total_tokens` and not keyed yet: shareable
    /// ones into the map, anonymous private ones as latent keys (counted by `num_keyed`),
    /// leaving duplicates of content already cached unkeyed.
    pub(super) fn key_full_blocks(
        &mut self,
        table: &mut BlockTable,
        keys: BlockKeys<'_>,
        total_tokens: u32,
    ) {
        if !self.prefix_caching {
            return;
        }
        let full = (total_tokens / self.block_size).min(table.len());
        if full <= table.num_keyed {
            return;
        }
        let shared_end = full.min(keys.shareable);
        for index in table.num_keyed..shared_end {
            let id = table.ids[index as usize];
            if !self.blocks[id as usize].is_keyed() {
                self.set_key(id, keys.get(index));
            }
        }
        // Private blocks, all anonymous (identified ones past the shareable blocks are prefix
        // hits or reloads, keyed as taken): latent keys, counted by `num_keyed`. (A key
        // already in the map is this request's own content cached from before a
        // preemption: the block stays an unkeyed duplicate, as `set_key` would leave it. An
        // empty map holds none, so it is not probed.)
        let private = table.num_keyed.max(shared_end)..full;
        debug_assert!(
            private.is_empty() || private.start >= table.ids.len() as u32,
            "private blocks being keyed are anonymous"
        );
        if !self.by_key.is_empty() {
            for index in private {
                let latent = keys.latent_private(index);
                if self.by_key.contains_key(&private_key_of_latent(latent)) {
                    table.dups.push(index);
                }
            }
        }
        table.num_keyed = full;
    }

    /// Maps `key` to identified block `id`, unless the key is cached already (then the block
    /// stays an unkeyed duplicate).
    pub(super) fn set_key(&mut self, id: u32, key: u64) {
        // When two requests computed the same content, the first block stays the cached copy
        // and the duplicate remains unkeyed (it is freed like any private block).
        if let std::collections::hash_map::Entry::Vacant(slot) = self.by_key.entry(key) {
            slot.insert(id);
            let block = &mut self.blocks[id as usize];
            block.key = key;
            block.set_keying(Keying::Mapped);
            self.key_version += 1;
        }
    }
}
