//! The KV cache's full audit: every refcount, the free list's links and runs, the arena's
//! retired slots and the key map, walked end to end (for tests and debug audits, never the
//! hot path).

use std::collections::HashSet;

use super::hash::private_key_of_latent;
use super::{BlockTable, Keying, KvCache, NIL};

/// What the walk over the live tables found: per record how many tables hold it, the
/// anonymous blocks held, and every latent key held anywhere (each live once, never mapped).
struct Holders {
    counts: Vec<u32>,
    anonymous: u64,
    latent: HashSet<u64>,
}

/// What the free-list walk found: which records it links, and the blocks they stand for.
struct FreeList {
    on_list: Vec<bool>,
    listed: u64,
}

impl KvCache {
    /// Checks the cache's internal invariants and that `tables` (every live request's blocks)
    /// account for every refcount and every anonymous block. Walks everything: for tests and
    /// debugging.
    pub fn check<'a>(&self, tables: impl Iterator<Item = &'a BlockTable>) -> Result<(), String> {
        if self.blocks.len() > self.total as usize {
            return Err(format!(
                "{} block records for a cache of {}",
                self.blocks.len(),
                self.total
            ));
        }
        let mut holders = Holders {
            counts: vec![0u32; self.blocks.len()],
            anonymous: 0,
            latent: HashSet::new(),
        };
        for table in tables {
            self.audit_table(table, &mut holders)?;
        }
        let spare = self.audit_spares()?;
        let free = self.walk_free_list(&spare, &mut holders)?;
        let identified = self.audit_records(&spare, &holders, &free)?;
        self.audit_accounting(identified, &holders, &free)?;
        self.audit_map(&spare)
    }

    /// Notes a latent key held by a table or a run: live once, never also in the map.
    fn note_latent(&self, holders: &mut Holders, seed: u64, index: u32) -> Result<(), String> {
        let key = private_key_of_latent(seed ^ u64::from(index));
        if self.by_key.contains_key(&key) || !holders.latent.insert(key) {
            return Err(format!(
                "latent key of index {index} is also in the map or held twice"
            ));
        }
        Ok(())
    }

    /// One live table: its keyed count, latent keys, held records and duplicates.
    fn audit_table(&self, table: &BlockTable, holders: &mut Holders) -> Result<(), String> {
        let lo = table.ids.len() as u32;
        if table.num_keyed > table.len() {
            return Err(format!(
                "a table keys {} blocks but holds {}",
                table.num_keyed,
                table.len()
            ));
        }
        for index in lo..table.num_keyed.min(lo + table.anon) {
            if table.anon_keyed(index) {
                self.note_latent(holders, table.seed, index)?;
            }
        }
        for &id in &table.ids {
            match holders.counts.get_mut(id as usize) {
                Some(count) => *count += 1,
                None => return Err(format!("a table holds unknown block {id}")),
            }
        }
        holders.anonymous += u64::from(table.anon);
        let ordered = table.dups.windows(2).all(|pair| pair[0] < pair[1]);
        let inside = table
            .dups
            .iter()
            .all(|&dup| dup >= lo && dup < table.num_keyed.min(lo + table.anon));
        if !ordered || !inside {
            return Err(format!(
                "a table's duplicates {:?} are misplaced",
                table.dups
            ));
        }
        Ok(())
    }

    /// The retired record slots, each known and listed once; returned as a mask.
    fn audit_spares(&self) -> Result<Vec<bool>, String> {
        let mut spare = vec![false; self.blocks.len()];
        for &id in &self.spare_ids {
            match spare.get_mut(id as usize) {
                Some(seen) if !*seen => *seen = true,
                _ => return Err(format!("retired slot {id} is unknown or listed twice")),
            }
        }
        Ok(spare)
    }

    /// The free list end to end: links both ways, every node free, run nodes naming run
    /// slots used once (with the unused ones, every slot exactly once), and the count of
    /// blocks listed plus the virgin ones matching the free counter.
    fn walk_free_list(&self, spare: &[bool], holders: &mut Holders) -> Result<FreeList, String> {
        let mut run_used = vec![false; self.runs.len()];
        for &slot in &self.spare_runs {
            match run_used.get_mut(slot as usize) {
                Some(seen) if !*seen => *seen = true,
                _ => return Err(format!("unused run slot {slot} is unknown or listed twice")),
            }
        }
        let mut on_list = vec![false; self.blocks.len()];
        let (mut cursor, mut listed, mut prev) = (self.free_head, 0u64, NIL);
        while cursor != NIL {
            let Some(seen) = on_list.get_mut(cursor as usize) else {
                return Err(format!("the free list links unknown record {cursor}"));
            };
            if *seen || spare[cursor as usize] {
                return Err(format!("record {cursor} is listed twice or retired"));
            }
            *seen = true;
            let block = &self.blocks[cursor as usize];
            if !block.is_free() {
                return Err(format!(
                    "block {cursor} is on the free list but not marked free"
                ));
            }
            if block.prev() != prev {
                return Err(format!("free list back link broken at block {cursor}"));
            }
            if block.is_run() {
                let slot = block.run_slot();
                let Some(used) = run_used.get_mut(slot) else {
                    return Err(format!("run node {cursor} names unknown slot {slot}"));
                };
                if *used {
                    return Err(format!("run slot {slot} is unused or linked twice"));
                }
                *used = true;
                let run = self.runs[slot];
                if run.lo >= run.hi {
                    return Err(format!("run node {cursor} is empty"));
                }
                for index in run.lo..run.hi.min(run.keyed_hi) {
                    self.note_latent(holders, run.seed, index)?;
                }
                listed += u64::from(run.len());
            } else {
                listed += 1;
            }
            prev = cursor;
            cursor = block.next();
        }
        if prev != self.free_tail {
            return Err("free list tail does not match".to_owned());
        }
        if run_used.iter().any(|used| !used) {
            return Err("a run slot is neither linked nor unused".to_owned());
        }
        if listed + u64::from(self.virgin) != u64::from(self.free_count) {
            return Err(format!(
                "free list has {listed} blocks and {} virgin ones, counter says {}",
                self.virgin, self.free_count
            ));
        }
        Ok(FreeList { on_list, listed })
    }

    /// Every record: a retired one unheld, a run node listed and unheld, an identified block's
    /// refcount equal to its holders and zero exactly when listed, a mapped key in the map.
    /// Returns the number of identified blocks.
    fn audit_records(
        &self,
        spare: &[bool],
        holders: &Holders,
        free: &FreeList,
    ) -> Result<u64, String> {
        let mut identified = 0u64;
        for (id, block) in self.blocks.iter().enumerate() {
            let held = holders.counts[id];
            if spare[id] {
                if held != 0 {
                    return Err(format!("a table holds retired block {id}"));
                }
                continue;
            }
            if block.is_run() {
                if !free.on_list[id] || held != 0 {
                    return Err(format!("run node {id} is off the list or held"));
                }
                continue;
            }
            identified += 1;
            if block.ref_cnt() != held {
                return Err(format!(
                    "block {id}: refcount {} but {held} requests hold it",
                    block.ref_cnt()
                ));
            }
            if (block.ref_cnt() == 0) != free.on_list[id] {
                return Err(format!(
                    "block {id}: refcount {} vs free-list membership",
                    block.ref_cnt()
                ));
            }
            if block.keying() == Keying::Mapped && self.by_key.get(&block.key) != Some(&(id as u32))
            {
                return Err(format!("block {id} has a key missing from the map"));
            }
        }
        Ok(identified)
    }

    /// Every block is identified (held or listed), anonymous and held, in a run, or virgin.
    fn audit_accounting(
        &self,
        identified: u64,
        holders: &Holders,
        free: &FreeList,
    ) -> Result<(), String> {
        let listed_identified = free
            .on_list
            .iter()
            .zip(&self.blocks)
            .filter(|(listed, block)| **listed && !block.is_run())
            .count() as u64;
        let held_identified = identified - listed_identified;
        let anonymous = holders.anonymous;
        let listed = free.listed;
        let accounted = held_identified + anonymous + listed + u64::from(self.virgin);
        if accounted != u64::from(self.total) {
            return Err(format!(
                "{held_identified} held identified + {anonymous} anonymous + {listed} listed + {} \
                 virgin blocks, but the cache has {}",
                self.virgin, self.total
            ));
        }
        Ok(())
    }

    /// Every map entry names a live, mapped block carrying that key.
    fn audit_map(&self, spare: &[bool]) -> Result<(), String> {
        for (key, &id) in &self.by_key {
            let block = self.blocks.get(id as usize);
            if spare.get(id as usize) != Some(&false)
                || block.is_none_or(|block| block.keying() != Keying::Mapped || block.key != *key)
            {
                return Err(format!("map entry for block {id} disagrees with the block"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::PrefixHit;
    use super::super::hash::{BlockKeys, private_key};
    use super::*;

    #[test]
    fn the_audit_rejects_a_latent_key_live_twice_or_also_mapped() {
        let mut kv = KvCache::new(16, 4, true, 0);
        let mut held = BlockTable::default();
        // Request 1: 5 blocks, 4 of them full (keyed latent).
        assert!(kv.allocate(&mut held, BlockKeys::private(1), PrefixHit::default(), 19));
        assert_eq!(kv.check([&held].into_iter()), Ok(()));
        // The same table listed twice: its latent keys would be live twice.
        let twice = kv.check([&held, &held].into_iter());
        assert!(
            twice.as_ref().is_err_and(|err| err.contains("latent key")),
            "{twice:?}"
        );
        // Freed, its keyed blocks form a run; one of their keys also in the map is an error.
        kv.free(&mut held);
        assert_eq!(kv.check(std::iter::empty()), Ok(()));
        let mut other = BlockTable::default();
        assert!(kv.allocate(&mut other, BlockKeys::private(2), PrefixHit::default(), 4));
        kv.by_key
            .insert(private_key(1, 0), other.ids.first().copied().unwrap_or(0));
        let mapped = kv.check([&other].into_iter());
        assert!(
            mapped.as_ref().is_err_and(|err| err.contains("latent key")),
            "{mapped:?}"
        );
    }
}
