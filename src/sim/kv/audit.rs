//! The KV cache's full audit: every refcount, the free list's links and the key map, walked
//! end to end (for tests and debug audits, never the hot path).

use super::{BlockTable, Keying, KvCache, NIL};

impl KvCache {
    /// Checks the cache's internal invariants and that `tables` (every live request's blocks)
    /// account for every refcount. Walks everything: for tests and debugging.
    pub fn check<'a>(&self, tables: impl Iterator<Item = &'a BlockTable>) -> Result<(), String> {
        let mut holders = vec![0u32; self.blocks.len()];
        for table in tables {
            for &id in &table.ids {
                match holders.get_mut(id as usize) {
                    Some(count) => *count += 1,
                    None => return Err(format!("a table holds virgin block {id}")),
                }
            }
        }
        if self.blocks.len() as u32 > self.total {
            return Err("more blocks materialized than exist".to_owned());
        }
        let mut on_list = vec![false; self.blocks.len()];
        let (mut cursor, mut walked, mut prev) = (self.free_head, 0u32, NIL);
        while cursor != NIL {
            if on_list[cursor as usize] {
                return Err(format!("block {cursor} is on the free list twice"));
            }
            on_list[cursor as usize] = true;
            if !self.blocks[cursor as usize].is_free() {
                return Err(format!(
                    "block {cursor} is on the free list but not marked free"
                ));
            }
            if self.blocks[cursor as usize].prev() != prev {
                return Err(format!("free list back link broken at block {cursor}"));
            }
            prev = cursor;
            cursor = self.blocks[cursor as usize].next();
            walked += 1;
        }
        if prev != self.free_tail {
            return Err("free list tail does not match".to_owned());
        }
        let virgin = self.total - self.blocks.len() as u32;
        if walked + virgin != self.free_count {
            return Err(format!(
                "free list has {walked} blocks and {virgin} virgin ones, counter says {}",
                self.free_count
            ));
        }
        for (id, block) in self.blocks.iter().enumerate() {
            if block.ref_cnt() != holders[id] {
                return Err(format!(
                    "block {id}: refcount {} but {} requests hold it",
                    block.ref_cnt(),
                    holders[id]
                ));
            }
            if (block.ref_cnt() == 0) != on_list[id] {
                return Err(format!(
                    "block {id}: refcount {} vs free-list membership",
                    block.ref_cnt()
                ));
            }
            match block.keying() {
                Keying::Mapped if self.by_key.get(&block.key) != Some(&(id as u32)) => {
                    return Err(format!("block {id} has a key missing from the map"));
                }
                Keying::Latent
                    if block
                        .key()
                        .is_some_and(|key| self.by_key.contains_key(&key)) =>
                {
                    return Err(format!("block {id}'s latent key is also in the map"));
                }
                _ => {}
            }
        }
        for (key, &id) in &self.by_key {
            let block = &self.blocks[id as usize];
            if block.keying() != Keying::Mapped || block.key != *key {
                return Err(format!("map entry for block {id} disagrees with the block"));
            }
        }
        Ok(())
    }
}
