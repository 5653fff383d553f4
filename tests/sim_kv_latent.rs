//! Property test: keeping private block keys out of the lookup map while their owner holds
//! them (latent keys) changes nothing observable. Two caches run the same random operations,
//! one told which blocks are private, the other treating every block as shareable (every key
//! in the map, the plain vLLM bookkeeping); every answer, counter and cached-key listing must
//! agree after every operation (the CPU tier's keys in LRU order), and both must pass their
//! internal audit. Block sizes 1, 4 and 16.
#![allow(clippy::unwrap_used)]

use ditto::sim::kv::hash::{BlockKeys, private_key, private_seed};
use ditto::sim::kv::{BlockTable, KvCache, PrefixHit};
use proptest::prelude::*;

/// One request: a shared prefix of `shared` blocks, then private content.
#[derive(Clone, Debug)]
struct Request {
    /// Keys of every block the request can fill (shared prefix first, then its private
    /// keys, derived from `owner` as the engine derives them).
    keys: Vec<u64>,
    /// The id private keys derive from (unique per slot and generation).
    owner: u64,
    shared: u32,
    /// Tokens computed (held in blocks) while admitted.
    tokens: u32,
    /// Tokens of the whole sequence so far (prompt plus generated).
    length: u32,
    admitted: bool,
}

impl Request {
    /// Its keys as the engine gives them: shared ones stored, private ones derived.
    fn latent_keys(&self) -> BlockKeys<'_> {
        BlockKeys {
            shareable_keys: &self.keys[..self.shared as usize],
            shareable: self.shared,
            owner_seed: private_seed(self.owner),
        }
    }

    /// Its keys with every block treated as shareable (all stored, all mapped).
    fn mapped_keys(&self) -> BlockKeys<'_> {
        BlockKeys {
            shareable_keys: &self.keys,
            shareable: self.keys.len() as u32,
            owner_seed: private_seed(self.owner),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    /// Admit request `r` (if waiting): look up its prefix and allocate its sequence.
    Admit(usize),
    /// Grow admitted request `r` by up to three blocks' worth of tokens.
    Grow(usize, u32),
    /// Preempt admitted request `r` (it will look its blocks up again).
    Preempt(usize),
    /// Finish admitted request `r`; a new request takes its place.
    Finish(usize),
}

fn op_strategy(requests: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..requests).prop_map(Op::Admit),
        (0..requests, any::<u32>()).prop_map(|(r, n)| Op::Grow(r, n)),
        (0..requests).prop_map(Op::Preempt),
        (0..requests).prop_map(Op::Finish),
    ]
}

/// Fresh private keys for request slot `r`, generation `generation` (unique across both).
/// Its length: up to ten blocks.
fn new_request(
    r: usize,
    generation: u64,
    shared: u32,
    prefix: &[u64],
    length: u32,
    block_size: u32,
) -> Request {
    let owner = 0x1000_0000 + (r as u64) * 0x10_0000 + generation;
    let mut keys: Vec<u64> = prefix[..shared as usize].to_vec();
    keys.extend((shared..64).map(|index| private_key(owner, index)));
    let length = 1 + length % (10 * block_size);
    Request {
        keys,
        owner,
        shared,
        tokens: 0,
        length,
        admitted: false,
    }
}

/// A property test's configuration: `cases` cases, unless `PROPTEST_CASES` asks for another
/// number.
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(cases);
    ProptestConfig::with_cases(cases)
}

/// The two caches and one table per request in each.
struct Pair {
    latent: KvCache,
    mapped: KvCache,
    tables: Vec<(BlockTable, BlockTable)>,
}

impl Pair {
    fn allocate(&mut self, r: usize, request: &Request, hit: PrefixHit, total: u32) -> bool {
        let (a, b) = &mut self.tables[r];
        let granted = self.latent.allocate(a, request.latent_keys(), hit, total);
        let granted_b = self.mapped.allocate(b, request.mapped_keys(), hit, total);
        assert_eq!(granted, granted_b, "allocation answers differ");
        granted
    }

    fn assert_same(&self) {
        assert_eq!(self.latent.stats(), self.mapped.stats());
        assert_eq!(self.latent.free_blocks(), self.mapped.free_blocks());
        assert_eq!(
            self.latent.free_keys_lru_first(),
            self.mapped.free_keys_lru_first()
        );
        assert_eq!(
            self.latent.cpu_resident_blocks(),
            self.mapped.cpu_resident_blocks()
        );
        let cpu = self.latent.cpu_keys_lru_first();
        assert_eq!(cpu.len() as u32, self.latent.cpu_resident_blocks());
        assert_eq!(cpu, self.mapped.cpu_keys_lru_first(), "CPU tiers differ");
        for (a, b) in &self.tables {
            // (Block ids differ: private blocks are anonymous in one cache, identified in
            // the other. Ids never reach output.)
            assert_eq!(
                (a.len(), a.num_keyed),
                (b.len(), b.num_keyed),
                "block tables differ"
            );
        }
        self.latent
            .check(self.tables.iter().map(|(a, _)| a))
            .unwrap();
        self.mapped
            .check(self.tables.iter().map(|(_, b)| b))
            .unwrap();
    }
}

proptest! {
    #![proptest_config(config(400))]
    #[test]
    fn latent_private_keys_are_unobservable(
        block_size in prop::sample::select(vec![1u32, 4, 16]),
        blocks in 6u32..40,
        cpu in prop::sample::select(vec![0u32, 5]),
        shares in prop::collection::vec(0u32..4, 4),
        lengths in prop::collection::vec(any::<u32>(), 4),
        ops in prop::collection::vec(op_strategy(4), 1..120),
    ) {
        let prefix: Vec<u64> = (0..8).map(|i| 0x500 + i).collect();
        let mut pair = Pair {
            latent: KvCache::new(blocks, block_size, true, cpu),
            mapped: KvCache::new(blocks, block_size, true, cpu),
            tables: vec![(BlockTable::default(), BlockTable::default()); 4],
        };
        let mut generation = 0u64;
        let mut requests: Vec<Request> = (0..4)
            .map(|r| new_request(r, 0, shares[r], &prefix, lengths[r], block_size))
            .collect();
        for op in ops {
            match op {
                Op::Admit(r) if !requests[r].admitted => {
                    let request = requests[r].clone();
                    let full = (request.length - 1) / block_size;
                    let hit = pair.latent.lookup(request.latent_keys(), full);
                    prop_assert_eq!(hit, pair.mapped.lookup(request.mapped_keys(), full));
                    let cached = hit.blocks() * block_size;
                    if pair.allocate(r, &request, hit, request.length) {
                        let query = request.length;
                        pair.latent.record_lookup(query, cached);
                        pair.mapped.record_lookup(query, cached);
                        requests[r].admitted = true;
                        requests[r].tokens = request.length;
                    }
                }
                Op::Grow(r, n) if requests[r].admitted => {
                    let request = requests[r].clone();
                    let grown = request.tokens + 1 + n % (3 * block_size);
                    let total = grown.min(60 * block_size);
                    if pair.allocate(r, &request, PrefixHit::default(), total) {
                        requests[r].tokens = total;
                        requests[r].length = requests[r].length.max(total);
                    }
                }
                Op::Preempt(r) if requests[r].admitted => {
                    let (a, b) = &mut pair.tables[r];
                    pair.latent.free_preempted(a);
                    pair.mapped.free_preempted(b);
                    requests[r].admitted = false;
                    requests[r].tokens = 0;
                }
                Op::Finish(r) if requests[r].admitted => {
                    let (a, b) = &mut pair.tables[r];
                    pair.latent.free(a);
                    pair.mapped.free(b);
                    generation += 1;
                    requests[r] =
                        new_request(r, generation, shares[r], &prefix, lengths[r], block_size);
                }
                _ => continue,
            }
            pair.assert_same();
        }
    }
}
