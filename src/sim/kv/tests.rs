//! Tests of the anonymous blocks and their runs, against the block-by-block behaviour: a
//! reference model that moves every block singly (an LRU deque of block keys) must agree
//! with the cache on every eviction, CPU-tier insert and free key, in order.

use std::collections::VecDeque;

use proptest::prelude::*;

use super::hash::{BlockKeys, private_key, private_seed};
use super::{BlockTable, KvCache, PrefixHit};

mod block_pool;
mod sequences;

const BLOCK: u32 = 4;

/// A property test's configuration: `cases` cases, unless `PROPTEST_CASES` asks for another
/// number (proptest's default configuration reads it; 256 is its own default).
fn config(cases: u32) -> ProptestConfig {
    let default = ProptestConfig::default();
    ProptestConfig {
        cases: if default.cases == 256 {
            cases
        } else {
            default.cases
        },
        ..default
    }
}

/// Grows `table` of private request `owner` to `total` tokens.
fn grow(kv: &mut KvCache, table: &mut BlockTable, owner: u64, total: u32) -> bool {
    kv.allocate(
        table,
        BlockKeys::private(owner),
        PrefixHit::default(),
        total,
    )
}

#[test]
fn a_partial_take_splits_a_run_from_its_top() {
    let mut kv = KvCache::new(8, BLOCK, true, 0);
    let mut a = BlockTable::default();
    // 23 tokens: 6 blocks, 5 of them full (keyed).
    assert!(grow(&mut kv, &mut a, 1, 23));
    assert_eq!((a.len(), a.anonymous(), a.num_keyed), (6, 6, 5));
    kv.free(&mut a);
    assert_eq!(kv.runs.len(), 1, "one run for the whole request");
    let keys_of_a =
        |indices: &[u32]| -> Vec<u64> { indices.iter().map(|&i| private_key(1, i)).collect() };
    assert_eq!(kv.free_keys_lru_first(), keys_of_a(&[4, 3, 2, 1, 0]));
    // Two virgin blocks first, then the run's top: index 5 (unkeyed), then 4 (evicted).
    let mut b = BlockTable::default();
    assert!(grow(&mut kv, &mut b, 2, 16));
    assert_eq!(kv.stats().evicted_blocks, 1);
    assert_eq!(kv.free_keys_lru_first(), keys_of_a(&[3, 2, 1, 0]));
    assert_eq!(kv.free_blocks(), 4);
    let run = kv.runs[0];
    assert_eq!((run.lo, run.hi, run.keyed_hi), (0, 4, 5));
    kv.check([&b].into_iter()).unwrap();
    // Taking the rest empties the run: its node and slot are recycled.
    assert!(grow(&mut kv, &mut b, 2, 32));
    assert_eq!((kv.free_blocks(), kv.stats().evicted_blocks), (0, 5));
    assert_eq!(kv.spare_runs, vec![0]);
    kv.check([&b].into_iter()).unwrap();
}

#[test]
fn a_preempted_requests_anonymous_blocks_become_findable() {
    let mut kv = KvCache::new(16, BLOCK, true, 0);
    let mut a = BlockTable::default();
    assert!(grow(&mut kv, &mut a, 7, 14)); // 4 blocks, 3 full
    let keys = BlockKeys::private(7);
    assert_eq!(
        kv.lookup(keys, 3).gpu_blocks,
        0,
        "latent keys are not looked up"
    );
    kv.free_preempted(&mut a);
    assert!(a.is_empty());
    kv.check(std::iter::empty()).unwrap();
    let hit = kv.lookup(keys, 3);
    assert_eq!(hit.gpu_blocks, 3, "its own blocks are found again");
    assert!(kv.allocate(&mut a, keys, hit, 14));
    assert_eq!((a.ids.len(), a.anonymous(), a.num_keyed), (3, 1, 3));
    assert_eq!(kv.used_blocks(), 4);
    kv.check([&a].into_iter()).unwrap();
    // Growing past them: new private blocks are anonymous again, and the keys found in the
    // map are not keyed twice.
    assert!(grow(&mut kv, &mut a, 7, 30));
    assert_eq!((a.ids.len(), a.anonymous(), a.num_keyed), (3, 5, 7));
    kv.check([&a].into_iter()).unwrap();
}

#[test]
fn a_runs_evictions_reach_the_cpu_tier_top_first() {
    let mut kv = KvCache::new(4, BLOCK, true, 10);
    let mut a = BlockTable::default();
    assert!(grow(&mut kv, &mut a, 3, 16)); // 4 full blocks
    kv.free(&mut a);
    let mut b = BlockTable::default();
    assert!(grow(&mut kv, &mut b, 4, 16));
    let expected: Vec<u64> = [3, 2, 1, 0].iter().map(|&i| private_key(3, i)).collect();
    assert_eq!(kv.cpu_keys_lru_first(), expected);
    assert_eq!(kv.stats().evicted_blocks, 4);
    // The CPU tier serves them back as a reload (identified blocks, keys in the map).
    kv.free(&mut b);
    let keys = BlockKeys::private(3);
    let hit = kv.lookup(keys, 3);
    assert_eq!((hit.gpu_blocks, hit.cpu_blocks), (0, 3));
    let mut a = BlockTable::default();
    assert!(kv.allocate(&mut a, keys, hit, 16));
    assert_eq!((a.ids.len(), a.anonymous()), (3, 1));
    assert!(kv.contains_key(private_key(3, 0)));
    kv.check([&a].into_iter()).unwrap();
}

/// A window step's crossings taken as one pending batch (`take_crossing_deferred`, then
/// `take_pending`) leave the cache exactly as one `take_crossing` each: the free list, the
/// evictions, the CPU tier's order, the tables. With and without a CPU tier, a batch inside
/// the head run and one that empties it.
#[test]
fn deferred_crossings_equal_single_takes() {
    for cpu_blocks in [0, 8] {
        let build = || {
            let mut kv = KvCache::new(16, BLOCK, true, cpu_blocks);
            let mut tables: Vec<BlockTable> = (0..3).map(|_| BlockTable::default()).collect();
            // 6 + 5 + 5 blocks: no virgin block left; the first's 6 go back as one run.
            assert!(grow(&mut kv, &mut tables[0], 1, 23));
            assert!(grow(&mut kv, &mut tables[1], 2, 20));
            assert!(grow(&mut kv, &mut tables[2], 3, 20));
            kv.free(&mut tables[0]);
            (kv, tables)
        };
        let (mut single, mut single_tables) = build();
        let (mut batched, mut batched_tables) = build();
        // (request, total tokens): two crossings inside the run, then four that empty it.
        let rounds: [&[(usize, u32)]; 2] =
            [&[(1, 21), (2, 21)], &[(2, 25), (1, 25), (2, 29), (1, 29)]];
        for round in rounds {
            let mut batch = batched.crossings();
            for &(r, total) in round {
                let seed = private_seed(r as u64 + 1); // the owner's, as `grow` gave
                assert!(single.take_crossing(&mut single_tables[r], seed, total));
                assert!(batched.take_crossing_deferred(
                    &mut batched_tables[r],
                    seed,
                    total,
                    &mut batch
                ));
            }
            batched.take_pending(&mut batch);
            assert_eq!(batched.free_keys_lru_first(), single.free_keys_lru_first());
            assert_eq!(batched.stats(), single.stats());
            assert_eq!(batched.free_blocks(), single.free_blocks());
            assert_eq!(batched.cpu_keys_lru_first(), single.cpu_keys_lru_first());
            assert_eq!(batched_tables, single_tables);
            batched.check(batched_tables.iter().skip(1)).unwrap();
        }
        assert_eq!(batched.free_blocks(), 0, "the run was emptied");
        // No room left: a crossing is refused, changing nothing.
        let mut batch = batched.crossings();
        assert!(!batched.take_crossing_deferred(&mut batched_tables[1], 2, 33, &mut batch));
        assert_eq!(batched_tables, single_tables);
    }
}

/// A window crossing (`take_crossing`, and deferred) leaves a table exactly as `allocate`
/// does, with every block size: with one-token blocks the new block is full at once, so it
/// is keyed too (a preempted request then finds it again).
#[test]
fn crossings_key_what_allocate_keys() {
    for block in [1, 2, BLOCK, 16] {
        let build = || {
            let mut kv = KvCache::new(6, block, true, 0);
            let mut tables = [BlockTable::default(), BlockTable::default()];
            // Three blocks each, the first freed (a run of three, no virgin block), and one
            // block of it taken by a new request (the crossing's block comes off a run).
            assert!(grow(&mut kv, &mut tables[0], 1, 3 * block));
            assert!(grow(&mut kv, &mut tables[1], 2, 3 * block));
            kv.free(&mut tables[0]);
            kv.allocate(
                &mut tables[0],
                BlockKeys::private(3),
                PrefixHit::default(),
                block,
            );
            (kv, tables)
        };
        let (mut general, mut general_tables) = build();
        let (mut single, mut single_tables) = build();
        let (mut deferred, mut deferred_tables) = build();
        let total = 3 * block + 1;
        assert!(general.allocate(
            &mut general_tables[1],
            BlockKeys::private(2),
            PrefixHit::default(),
            total
        ));
        assert!(single.take_crossing(&mut single_tables[1], private_seed(2), total));
        let mut batch = deferred.crossings();
        assert!(deferred.take_crossing_deferred(
            &mut deferred_tables[1],
            private_seed(2),
            total,
            &mut batch
        ));
        deferred.take_pending(&mut batch);
        assert_eq!(single_tables, general_tables, "block size {block}");
        assert_eq!(deferred_tables, general_tables, "block size {block}");
        assert_eq!(general_tables[1].num_keyed, total / block);
        // Preempted, the request's blocks are findable alike (the filled one included).
        for kv in [&mut general, &mut single, &mut deferred] {
            kv.check(general_tables.iter()).unwrap();
            kv.free_preempted(&mut general_tables[1].clone());
        }
        assert_eq!(single.free_keys_lru_first(), general.free_keys_lru_first());
        assert_eq!(
            deferred.free_keys_lru_first(),
            general.free_keys_lru_first()
        );
    }
}

/// The reference: every block moved singly, free blocks as an LRU deque of their keys.
struct Model {
    virgin: u32,
    free: VecDeque<Option<u64>>,
    evicted: u64,
    cpu: VecDeque<u64>,
    cpu_capacity: usize,
    /// Per request: its owner and its blocks' keys.
    held: Vec<(u64, Vec<Option<u64>>)>,
}

impl Model {
    fn free_count(&self) -> u32 {
        self.virgin + self.free.len() as u32
    }

    fn grow(&mut self, r: usize, total: u32) -> bool {
        let required = total.div_ceil(BLOCK) as usize;
        let need = required.saturating_sub(self.held[r].1.len());
        if need as u32 > self.free_count() {
            return false;
        }
        for _ in 0..need {
            if self.virgin > 0 {
                self.virgin -= 1;
            } else if let Some(Some(key)) = self.free.pop_front() {
                self.evicted += 1;
                if self.cpu_capacity > 0 {
                    self.cpu.retain(|&k| k != key);
                    self.cpu.push_back(key);
                    if self.cpu.len() > self.cpu_capacity {
                        self.cpu.pop_front();
                    }
                }
            }
            self.held[r].1.push(None);
        }
        let (owner, blocks) = &mut self.held[r];
        let full = (total / BLOCK) as usize;
        for (index, block) in blocks.iter_mut().enumerate().take(full) {
            *block = Some(private_key(*owner, index as u32));
        }
        true
    }

    fn finish(&mut self, r: usize, owner: u64) {
        let (_, blocks) = std::mem::replace(&mut self.held[r], (owner, Vec::new()));
        self.free.extend(blocks.into_iter().rev());
    }
}

proptest! {
    #![proptest_config(config(300))]
    /// Growing and finishing private requests: the cache's runs give the same evictions,
    /// CPU-tier contents and free keys, in the same order, as blocks moved one by one.
    #[test]
    fn runs_match_a_block_by_block_model(
        blocks in 4u32..60,
        cpu in prop::sample::select(vec![0u32, 6]),
        ops in prop::collection::vec((0usize..4, 0u32..3, 1u32..30), 1..150),
    ) {
        let mut kv = KvCache::new(blocks, BLOCK, true, cpu);
        let mut model = Model {
            virgin: blocks,
            free: VecDeque::new(),
            evicted: 0,
            cpu: VecDeque::new(),
            cpu_capacity: cpu as usize,
            held: (0..4).map(|r| (r as u64, Vec::new())).collect(),
        };
        let mut tables = vec![BlockTable::default(); 4];
        let mut tokens = [0u32; 4];
        let mut next_owner = 4u64;
        for (r, kind, n) in ops {
            if kind == 0 {
                kv.free(&mut tables[r]);
                model.finish(r, next_owner);
                tokens[r] = 0;
                next_owner += 1;
            } else {
                let total = tokens[r] + n;
                let owner = model.held[r].0;
                let granted = grow(&mut kv, &mut tables[r], owner, total);
                prop_assert_eq!(granted, model.grow(r, total));
                if granted {
                    tokens[r] = total;
                }
            }
            prop_assert_eq!(kv.free_blocks(), model.free_count());
            prop_assert_eq!(kv.stats().evicted_blocks, model.evicted);
            let free_keys: Vec<u64> = model.free.iter().flatten().copied().collect();
            prop_assert_eq!(kv.free_keys_lru_first(), free_keys);
            prop_assert_eq!(kv.cpu_keys_lru_first(), model.cpu.iter().copied().collect::<Vec<_>>());
            kv.check(tables.iter()).map_err(TestCaseError::fail)?;
        }
    }
}
