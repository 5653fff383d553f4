//! Random operation sequences on the KV cache, as the engine makes them, against vLLM's
//! block pool moved block by block ([`super::block_pool`]): admissions with prefix lookups
//! (shared prefixes, a preempted request's own blocks, CPU-tier reloads) and chunked
//! prefill, explicit growth, lazy window steps (a member's KV call only at its thresholds;
//! crossings by `allocate`, by `take_crossing`, or deferred in batches closed by
//! `take_pending`, exactly as `engine::window::kv` makes them), preemption, completion and a
//! cache restored from outside (`seed_cached`); block sizes 1, 2, 4 and 16. After every
//! operation both must agree on the free keys in LRU order, the CPU tier's keys in LRU
//! order, the counters, the lookup map's shared keys and every table, and the cache must
//! pass its audit.

use proptest::prelude::*;

use super::super::hash::{BlockKeys, private_key, private_seed};
use super::super::{BlockTable, Crossings, KvCache, PrefixHit};
use super::block_pool::{BlockPool, Held};
use super::config;

/// Requests alive at once (one per slot).
const SLOTS: usize = 4;
/// Prefix groups, and the most shared blocks a request has.
const GROUPS: u64 = 2;
const MAX_SHARED: u32 = 4;

/// Key of block `index` of shared prefix `group`.
fn prefix_key(group: u64, index: u32) -> u64 {
    private_key(0xfeed_0000 + group, index) ^ 0x5a5a
}

/// A request's keys as the cache reads them: the shared ones stored, private ones derived.
fn keys_of(prefix: &[u64], owner: u64) -> BlockKeys<'_> {
    BlockKeys {
        shareable_keys: prefix,
        shareable: prefix.len() as u32,
        owner_seed: private_seed(owner),
    }
}

/// How a window step makes its crossings.
#[derive(Clone, Copy, Debug)]
enum Crossing {
    /// `allocate` only (the reference stepper's call).
    Allocate,
    /// `take_crossing`, else `allocate` (a window call outside a batch).
    Single,
    /// `take_crossing_deferred` into one batch per step, closed by `take_pending`.
    Deferred,
}

/// The cache a sequence starts on.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// Every block virgin.
    Fresh,
    /// Every block used before and free (no virgin block), holding a request's keys.
    Warm,
    /// Restored from an observation (`seed_cached`), the requests running on what they find.
    Restored,
}

/// A request as the engine holds it: its keys, progress and blocks in both caches.
#[derive(Clone, Debug)]
struct Request {
    owner: u64,
    group: u64,
    /// Leading shareable (prefix) blocks.
    shared: u32,
    prefix: Vec<u64>,
    /// Its sequence so far (prompt, plus what it generated before a preemption).
    length: u32,
    /// Tokens computed while admitted.
    tokens: u32,
    admitted: bool,
    /// Tokens were computed with no call on the cache (a window member between thresholds):
    /// its private blocks' keying is deferred until its next call.
    lagging: bool,
    table: BlockTable,
    held: Held,
}

impl Request {
    fn new(owner: u64, group: u64, shared: u32, length_raw: u32, block_size: u32) -> Self {
        let length = 1 + length_raw % (5 * block_size);
        let shared = shared.min(length / block_size);
        Self {
            owner,
            group,
            shared,
            prefix: (0..shared).map(|index| prefix_key(group, index)).collect(),
            length,
            tokens: 0,
            admitted: false,
            lagging: false,
            table: BlockTable::default(),
            held: Held::default(),
        }
    }

    /// Its blocks' keys for the reference, every one computed (borrows nothing).
    fn key_fn(&self) -> impl Fn(u32) -> u64 + use<> {
        let (owner, group, shared) = (self.owner, self.group, self.shared);
        move |index| {
            if index < shared {
                prefix_key(group, index)
            } else {
                private_key(owner, index)
            }
        }
    }

    /// Decoding: a window member.
    fn decoding(&self) -> bool {
        self.admitted && self.tokens >= self.length
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    /// Admit request `r` if waiting: a prefix lookup, then its first chunk (`chunk` blocks'
    /// worth of tokens, 0 for all).
    Admit(usize, u32),
    /// Request `r`'s next prefill chunk.
    Prefill(usize, u32),
    /// Request `r` grows in one explicit call (by up to two blocks' worth of tokens).
    Grow(usize, u32),
    /// One lazy window step over the decoding requests in the mask.
    Step(u8, Crossing),
    /// The decoding requests in the mask compute tokens to the end of their last block with
    /// no call on the cache (window steps between their thresholds).
    Fill(u8),
    Preempt(usize),
    /// Request `r` finishes; a new one (group, shared blocks, length) takes its slot.
    Finish(usize, u64, u32, u32),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let crossing = prop_oneof![
        Just(Crossing::Allocate),
        Just(Crossing::Single),
        Just(Crossing::Deferred),
        Just(Crossing::Deferred),
    ];
    prop_oneof![
        3 => (0..SLOTS, 0u32..3).prop_map(|(r, c)| Op::Admit(r, c)),
        2 => (0..SLOTS, 0u32..3).prop_map(|(r, c)| Op::Prefill(r, c)),
        1 => (0..SLOTS, any::<u32>()).prop_map(|(r, n)| Op::Grow(r, n)),
        5 => (1u8..16, crossing).prop_map(|(mask, how)| Op::Step(mask, how)),
        3 => (1u8..16).prop_map(Op::Fill),
        1 => (0..SLOTS).prop_map(Op::Preempt),
        2 => (0..SLOTS, 0..GROUPS, 0..=MAX_SHARED, any::<u32>())
            .prop_map(|(r, g, s, l)| Op::Finish(r, g, s, l)),
    ]
}

/// The cache, the reference, the requests.
struct World {
    kv: KvCache,
    pool: BlockPool,
    requests: Vec<Request>,
    block_size: u32,
    /// Requests share prefixes.
    sharing: bool,
    /// No preemption (with no shared prefix either, the lookup map stays empty, so window
    /// crossings take their fast paths).
    quiet: bool,
    /// Prefix caching on.
    caching: bool,
}

impl World {
    /// Request `r`'s explicit call: both grow it to `total` tokens; they must agree.
    fn allocate(&mut self, r: usize, hit: PrefixHit, total: u32) -> Result<bool, TestCaseError> {
        let request = &mut self.requests[r];
        let keys = keys_of(&request.prefix, request.owner);
        let granted = self.kv.allocate(&mut request.table, keys, hit, total);
        let key = request.key_fn();
        let expected = self.pool.allocate(&mut request.held, key, hit, total);
        prop_assert_eq!(
            granted,
            expected,
            "allocation of request {} to {}",
            r,
            total
        );
        if granted {
            request.tokens = request.tokens.max(total);
            request.lagging = false;
        }
        Ok(granted)
    }

    /// Keys what a lagging request's window deferred (`Engine::key_deferred`), before any
    /// other call for it.
    fn catch_up(&mut self, r: usize) -> Result<(), TestCaseError> {
        if self.requests[r].lagging {
            let tokens = self.requests[r].tokens;
            prop_assert!(self.allocate(r, PrefixHit::default(), tokens)?);
        }
        Ok(())
    }

    /// Request `r` restored running with its whole sequence computed
    /// (`Engine::restore_running`): its full blocks found cached on the GPU are its own, the
    /// rest fresh. It stays waiting if blocks run short.
    fn restore(&mut self, r: usize) -> Result<(), TestCaseError> {
        let request = &self.requests[r];
        let length = request.length;
        let max_blocks = length / self.block_size;
        let mut hit = self
            .kv
            .lookup(keys_of(&request.prefix, request.owner), max_blocks);
        let expected = self.pool.lookup(request.key_fn(), max_blocks);
        prop_assert_eq!(hit, expected, "lookup of request {}", r);
        hit.cpu_blocks = 0;
        if self.allocate(r, hit, length)? {
            self.requests[r].admitted = true;
        }
        Ok(())
    }

    fn admit(&mut self, r: usize, chunk: u32) -> Result<(), TestCaseError> {
        let request = &self.requests[r];
        let length = request.length;
        // At least one token is always computed, so a full hit leaves the last block.
        let max_blocks = (length - 1) / self.block_size;
        let hit = self
            .kv
            .lookup(keys_of(&request.prefix, request.owner), max_blocks);
        let expected = self.pool.lookup(request.key_fn(), max_blocks);
        prop_assert_eq!(hit, expected, "lookup of request {}", r);
        let cached = hit.blocks() * self.block_size;
        let wanted = length - cached;
        let new = if chunk == 0 {
            wanted
        } else {
            // (Leaving a block partly filled.)
            wanted.min((chunk * self.block_size).saturating_sub(1).max(1))
        };
        if self.allocate(r, hit, cached + new)? {
            if self.caching {
                self.kv.record_lookup(length, cached);
                self.pool.stats.query_tokens += u64::from(length);
                self.pool.stats.hit_tokens += u64::from(cached);
            }
            self.requests[r].admitted = true;
        }
        Ok(())
    }

    /// One window step over the requests in `mask`, in batch order, as
    /// `Engine::window_kv_calls` makes it: each decoding one (a member) computes one token,
    /// and those at a threshold (a new block, or a shareable block filling up) call the
    /// cache; each prefilling one computes its next chunk in an explicit call, amid the
    /// members' batch of deferred crossings.
    fn step(&mut self, mask: u8, how: Crossing) -> Result<(), TestCaseError> {
        let block_size = self.block_size;
        let mut pending = self.kv.crossings();
        for r in 0..SLOTS {
            if mask & (1 << r) == 0 || !self.requests[r].admitted {
                continue;
            }
            if !self.requests[r].decoding() {
                // An explicit call (`call_in_batch`): the pending blocks are taken first,
                // and the batch renewed after.
                let request = &self.requests[r];
                let total = request.tokens + (request.length - request.tokens).min(block_size + 1);
                let had_room = pending.has_room();
                self.kv.take_pending(&mut pending);
                if !self.allocate(r, PrefixHit::default(), total)? {
                    break; // the window closes
                }
                pending = Crossings::renew(had_room, &self.kv);
                continue;
            }
            let request = &mut self.requests[r];
            let total = request.tokens + 1;
            let key = request.key_fn();
            let table = &mut request.table;
            let held_end = table.len() * block_size + 1;
            let threshold = if self.caching && table.num_keyed < request.shared {
                held_end.min((table.num_keyed + 1) * block_size)
            } else {
                held_end
            };
            if total < threshold {
                // No call: the window computes the token, keying deferred; the reference
                // keys at once (nobody else can look those blocks up meanwhile).
                prop_assert!(total <= table.len() * block_size);
                let none = PrefixHit::default();
                prop_assert!(self.pool.allocate(&mut request.held, key, none, total));
                request.tokens = total;
                request.lagging = true;
                continue;
            }
            let all_shared_keyed = self.caching && table.num_keyed >= request.shared;
            let seed = private_seed(request.owner);
            let keys = keys_of(&request.prefix, request.owner);
            let none = PrefixHit::default();
            let granted = match how {
                Crossing::Allocate => self.kv.allocate(table, keys, none, total),
                Crossing::Single => {
                    (all_shared_keyed && self.kv.take_crossing(table, seed, total))
                        || self.kv.allocate(table, keys, none, total)
                }
                Crossing::Deferred => {
                    (all_shared_keyed
                        && self
                            .kv
                            .take_crossing_deferred(table, seed, total, &mut pending))
                        || {
                            let had_room = pending.has_room();
                            self.kv.take_pending(&mut pending);
                            let granted = (all_shared_keyed
                                && self.kv.take_crossing(table, seed, total))
                                || self.kv.allocate(table, keys, none, total);
                            if granted {
                                pending = Crossings::renew(had_room, &self.kv);
                            }
                            granted
                        }
                }
            };
            let expected = self.pool.allocate(&mut request.held, key, none, total);
            prop_assert_eq!(
                granted,
                expected,
                "window call of request {} to {}",
                r,
                total
            );
            if !granted {
                break; // the window closes
            }
            request.tokens = total;
            request.lagging = false;
        }
        self.kv.take_pending(&mut pending);
        Ok(())
    }

    fn apply(&mut self, op: Op, next_owner: &mut u64) -> Result<(), TestCaseError> {
        let block_size = self.block_size;
        match op {
            Op::Admit(r, chunk) if !self.requests[r].admitted => self.admit(r, chunk)?,
            Op::Prefill(r, chunk)
                if self.requests[r].admitted
                    && self.requests[r].tokens < self.requests[r].length =>
            {
                let request = &self.requests[r];
                let left = request.length - request.tokens;
                let new = if chunk == 0 {
                    left
                } else {
                    left.min(chunk * block_size)
                };
                self.allocate(r, PrefixHit::default(), request.tokens + new)?;
            }
            Op::Grow(r, n) if self.requests[r].decoding() => {
                self.catch_up(r)?;
                let total = self.requests[r].tokens + 1 + n % (2 * block_size);
                self.allocate(r, PrefixHit::default(), total)?;
            }
            Op::Step(mask, how) => self.step(mask, how)?,
            Op::Fill(mask) => {
                for (r, request) in self.requests.iter_mut().enumerate() {
                    let end = request.table.len() * block_size;
                    if mask & (1 << r) == 0
                        || !request.decoding()
                        || (self.caching && request.table.num_keyed < request.shared)
                        || end <= request.tokens
                    {
                        continue;
                    }
                    let key = request.key_fn();
                    let none = PrefixHit::default();
                    prop_assert!(self.pool.allocate(&mut request.held, key, none, end));
                    request.tokens = end;
                    request.lagging = true;
                }
            }
            Op::Preempt(r) if self.requests[r].admitted && !self.quiet => {
                self.catch_up(r)?;
                let request = &mut self.requests[r];
                self.kv.free_preempted(&mut request.table);
                self.pool.free(&mut request.held);
                request.length = request.length.max(request.tokens);
                request.tokens = 0;
                request.admitted = false;
            }
            Op::Finish(r, group, shared, length_raw) if self.requests[r].admitted => {
                self.catch_up(r)?;
                let request = &mut self.requests[r];
                self.kv.free(&mut request.table);
                self.pool.free(&mut request.held);
                *next_owner += 1;
                let shared = if self.sharing { shared } else { 0 };
                self.requests[r] = Request::new(*next_owner, group, shared, length_raw, block_size);
            }
            _ => {}
        }
        Ok(())
    }

    /// Everything observable agrees, and the cache passes its audit.
    fn compare(&self) -> Result<(), TestCaseError> {
        let (kv, pool) = (&self.kv, &self.pool);
        prop_assert_eq!(kv.free_blocks(), pool.free_count());
        prop_assert_eq!(kv.stats(), pool.stats);
        prop_assert_eq!(kv.free_keys_lru_first(), pool.free_keys());
        prop_assert_eq!(kv.cpu_keys_lru_first(), pool.cpu_keys());
        for group in 0..GROUPS {
            for index in 0..MAX_SHARED {
                let key = prefix_key(group, index);
                prop_assert_eq!(kv.contains_key(key), pool.is_cached(key));
            }
        }
        for (r, request) in self.requests.iter().enumerate() {
            prop_assert_eq!(request.table.len(), request.held.len(), "request {}", r);
            if !request.lagging {
                prop_assert_eq!(request.table.num_keyed, request.held.keyed, "request {}", r);
            }
        }
        kv.check(self.requests.iter().map(|request| &request.table))
            .map_err(TestCaseError::fail)
    }
}

proptest! {
    #![proptest_config(config(300))]
    /// The KV cache equals vLLM's block pool over random engine-like operation sequences
    /// (see the module doc).
    #[test]
    fn sequences_match_vllms_block_pool(
        block_size in prop::sample::select(vec![1u32, 2, 4, 16]),
        blocks in 4u32..24,
        cpu in prop::sample::select(vec![0u32, 6]),
        caching in prop::sample::select(vec![true, true, true, true, true, true, true, false]),
        (sharing, quiet) in prop_oneof![
            Just((true, false)),
            Just((false, false)),
            Just((false, true)),
            Just((false, true)),
        ],
        start in prop_oneof![Just(Start::Fresh), Just(Start::Warm), Just(Start::Restored)],
        seeded in prop::collection::vec((0..GROUPS, 0..MAX_SHARED), 0..4),
        observed in prop::collection::vec(any::<u32>(), SLOTS),
        starts in prop::collection::vec((0..GROUPS, 0..=MAX_SHARED, any::<u32>()), SLOTS),
        ops in prop::collection::vec(op_strategy(), 1..250),
    ) {
        let mut world = World {
            kv: KvCache::new(blocks, block_size, caching, cpu),
            pool: BlockPool::new(blocks, block_size, caching, cpu),
            requests: starts
                .iter()
                .enumerate()
                .map(|(r, &(group, shared, length))| {
                    let shared = if sharing { shared } else { 0 };
                    Request::new(r as u64, group, shared, length, block_size)
                })
                .collect(),
            block_size,
            sharing,
            quiet,
            caching,
        };
        match start {
            Start::Fresh => {}
            Start::Warm => {
                // A cache that served before: every block used once (no virgin block), all
                // back on the free list as one request's private blocks.
                let mut before = Request::new(u64::MAX, 0, 0, 0, block_size);
                before.length = blocks * block_size;
                world.requests.push(before);
                prop_assert!(world.allocate(SLOTS, PrefixHit::default(), blocks * block_size)?);
                let before = world.requests.last_mut().expect("pushed");
                world.kv.free(&mut before.table);
                world.pool.free(&mut before.held);
                world.requests.pop();
            }
            Start::Restored => {
                // `Engine::restore`: the observed keys seeded on a fresh cache (shared
                // prefixes', then each running request's leading blocks'), then each request
                // running again on the blocks found among them.
                let mut keys: Vec<u64> = seeded
                    .iter()
                    .filter(|_| sharing)
                    .map(|&(group, index)| prefix_key(group, index))
                    .collect();
                for (request, &count) in world.requests.iter().zip(&observed) {
                    let count = count % (request.length / block_size + 1);
                    keys.extend((0..count).map(request.key_fn()));
                }
                for key in keys.into_iter().filter(|_| caching) {
                    world.kv.seed_cached(key);
                    world.pool.seed(key);
                }
                world.compare()?;
                for r in 0..SLOTS {
                    world.restore(r)?;
                }
            }
        }
        world.compare()?;
        let mut next_owner = SLOTS as u64;
        for op in ops {
            world.apply(op, &mut next_owner)?;
            world.compare()?;
        }
    }
}
