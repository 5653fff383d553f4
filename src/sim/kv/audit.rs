//! The KV cache's full audit: every refcount, the free list's links and runs, the arena's
//! retired slots and the key map, walked end to end (for tests and debug audits, never the
//! hot path).

use super::{BlockTable, Keying, KvCache, NIL};

impl KvCache {
    /// Checks the cache's internal invariants and that `tables` (every live request's blocks)
    /// account for every refcount and every anonymous block. Walks everything: for tests and
    /// debugging.
    pub fn check<'a>(&self, tables: impl Iterator<Item = &'a BlockTable>) -> Result<(), String> {
        let mut holders = vec![0u32; self.blocks.len()];
        let mut anonymous = 0u64;
        for table in tables {
            for &id in &table.ids {
                match holders.get_mut(id as usize) {
                    Some(count) => *count += 1,
                    None => return Err(format!("a table holds unknown block {id}")),
                }
            }
            anonymous += u64::from(table.anon);
            let lo = table.ids.len() as u32;
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
        }
        let mut spare = vec![false; self.blocks.len()];
        for &id in &self.spare_ids {
            match spare.get_mut(id as usize) {
                Some(seen) if !*seen => *seen = true,
                _ => return Err(format!("retired slot {id} is unknown or listed twice")),
            }
        }
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
        let mut identified = 0u64;
        for (id, block) in self.blocks.iter().enumerate() {
            if spare[id] {
                if holders[id] != 0 {
                    return Err(format!("a table holds retired block {id}"));
                }
                continue;
            }
            if block.is_run() {
                if !on_list[id] || holders[id] != 0 {
                    return Err(format!("run node {id} is off the list or held"));
                }
                continue;
            }
            identified += 1;
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
            if block.keying() == Keying::Mapped && self.by_key.get(&block.key) != Some(&(id as u32))
            {
                return Err(format!("block {id} has a key missing from the map"));
            }
        }
        // Every block is identified (held or listed), anonymous and held, in a run, or virgin.
        let listed_identified = on_list
            .iter()
            .zip(&self.blocks)
            .filter(|(listed, block)| **listed && !block.is_run())
            .count() as u64;
        let held_identified = identified - listed_identified;
        let accounted = held_identified + anonymous + listed + u64::from(self.virgin);
        if accounted != u64::from(self.total) {
            return Err(format!(
                "{held_identified} held identified + {anonymous} anonymous + {listed} listed + {} \
                 virgin blocks, but the cache has {}",
                self.virgin, self.total
            ));
        }
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
