//! Hash-chained block keys for prefix caching.
//!
//! A full block's key depends on its parent's key and on its tokens, so equal keys mean equal
//! prefixes, as in vLLM. Requests that carry real token ids hash those ids. Requests known
//! only by lengths have synthetic content: a block lying wholly inside the request's shared
//! prefix is keyed by (prefix group, block index), so shared prefixes really share blocks.
//! Every other block (past the shared prefix, or holding generated tokens) is *private*,
//! keyed by (request id, block index) alone: its content differs from every other
//! sequence's whatever precedes it. The hash is a fixed 64-bit mix, identical on every
//! platform and run.

use crate::sim::request::{PromptContent, RequestSpec};

/// Key of the (virtual) parent of a request's first block.
pub const ROOT_KEY: u64 = 0x6469_7474_6f2d_6b76; // "ditto-kv"

const TAG_GROUP: u64 = 0x1;
const TAG_REQUEST: u64 = 0x2d6b_6579_2d70_7276; // private-key seed
const TAG_TOKENS: u64 = 0x3;

/// splitmix64's finaliser: a strong, cheap 64-bit mixer.
fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The multiplicative inverse of odd `m` modulo 2^64 (Newton's iteration: each step doubles
/// the correct low bits, from the 3 that `m` itself gets right).
const fn inverse_mod_2_64(m: u64) -> u64 {
    let mut inverse = m;
    let mut step = 0;
    while step < 5 {
        inverse = inverse.wrapping_mul(2u64.wrapping_sub(m.wrapping_mul(inverse)));
        step += 1;
    }
    inverse
}

/// Undoes `x ^= x >> shift` (shift > 0).
fn unshift_xor(y: u64, shift: u32) -> u64 {
    let mut x = y;
    let mut s = shift;
    while s < 64 {
        x ^= y >> s;
        s += shift;
    }
    x
}

/// [`mix64`]'s inverse (the finaliser is a bijection of `u64`).
fn unmix64(y: u64) -> u64 {
    const INV_2: u64 = inverse_mod_2_64(0x94d0_49bb_1331_11eb);
    const INV_1: u64 = inverse_mod_2_64(0xbf58_476d_1ce4_e5b9);
    let x = unshift_xor(y, 31).wrapping_mul(INV_2);
    let x = unshift_xor(x, 27).wrapping_mul(INV_1);
    unshift_xor(x, 30)
}

/// Folds `word` into the running hash `state`.
fn combine(state: u64, word: u64) -> u64 {
    mix64(state ^ mix64(word.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// Key of block `block_index` (0-based) of `spec`, whose parent block has key `parent`.
///
/// `block_size` tokens per block; the block must be full (callers never hash partial blocks).
pub fn block_key(spec: &RequestSpec, parent: u64, block_index: u32, block_size: u32) -> u64 {
    let start = u64::from(block_index) * u64::from(block_size);
    let end = start + u64::from(block_size);
    let prompt_end = u64::from(spec.input_tokens);
    match &spec.content {
        PromptContent::Synthetic {
            prefix_group: Some(group),
            prefix_len,
        } if end <= u64::from(*prefix_len).min(prompt_end) => combine(
            combine(combine(parent, TAG_GROUP), *group),
            u64::from(block_index),
        ),
        PromptContent::BlockKeys(keys)
            if end <= prompt_end && (block_index as usize) < keys.len() =>
        {
            keys[block_index as usize]
        }
        PromptContent::Tokens(tokens) if end <= prompt_end => {
            token_block_key(parent, &tokens[start as usize..end as usize])
        }
        _ => private_key(spec.id.0, block_index),
    }
}

/// Key of a full block of real tokens `tokens` whose parent block has key `parent` (the
/// first block's parent is [`ROOT_KEY`]): the key the engine gives a prompt's block when the
/// request carries token ids, and the key the mirror gives a block a vLLM pod published
/// with its token ids, so both meet in one cache whatever vLLM's own hash seed.
pub fn token_block_key(parent: u64, tokens: &[u32]) -> u64 {
    let mut state = combine(parent, TAG_TOKENS);
    for &token in tokens {
        state = combine(state, u64::from(token));
    }
    state
}

/// Key of a private block: unique to (request, index), so it needs no parent chain (the
/// request's id already sets it apart from every other sequence). Two mixes instead of six:
/// private blocks are most blocks, and keying them is on the decode hot path.
pub fn private_key(id: u64, block_index: u32) -> u64 {
    private_key_of_latent(private_seed(id) ^ u64::from(block_index))
}

/// The per-request half of [`private_key`]: `private_key(id, index)` is
/// `private_key_of_latent(private_seed(id) ^ index)`. A request computes it once, so the KV
/// cache keeps no per-block key for a private block at all: an anonymous block's key is its
/// table's (or free run's) seed xor its index, and the hash is finished only when the key is
/// read (a preemption, an eviction into the CPU tier, an observation), which almost never
/// happens to a private block.
#[inline]
pub fn private_seed(id: u64) -> u64 {
    mix64(id ^ TAG_REQUEST)
}

/// The private key whose latent form is `latent` (see [`private_seed`]).
#[inline]
pub fn private_key_of_latent(latent: u64) -> u64 {
    mix64(latent)
}

/// The latent form whose private key is `key`: `private_key_of_latent(latent_of_key(k)) == k`
/// for every `k` (the mix is a bijection), so a key-addressed set can tell whether a key
/// belongs to a run of private keys it holds by seed and indices alone.
#[inline]
pub fn latent_of_key(key: u64) -> u64 {
    unmix64(key)
}

/// How many leading full blocks of `spec` can have content another request also produces
/// (a shared prefix group, given block keys, or real token ids). Every later block is
/// *private*: keyed by the request's own id, so only the request itself (coming back after a
/// preemption) can ever hit it. The KV cache keeps private keys out of its lookup map while
/// their owner holds them, which saves a map insert and removal per block.
pub fn shareable_blocks(spec: &RequestSpec, block_size: u32) -> u32 {
    let prompt = spec.input_tokens;
    match &spec.content {
        PromptContent::Synthetic {
            prefix_group: Some(_),
            prefix_len,
        } => (*prefix_len).min(prompt) / block_size,
        PromptContent::Synthetic {
            prefix_group: None, ..
        } => 0,
        PromptContent::BlockKeys(keys) => (prompt / block_size).min(keys.len() as u32),
        PromptContent::Tokens(_) => prompt / block_size,
    }
}

/// The content keys of one request's blocks, as the KV cache reads them: the shareable
/// blocks' keys (a hash chain, computed ahead and stored) and, past them, the private ones,
/// derived from the request id when read. Storing only the shareable keys keeps a request's
/// state (and so a fork) small and its hot path free of key pushes.
#[derive(Clone, Copy, Debug)]
pub struct BlockKeys<'a> {
    /// Keys computed so far of the leading shareable blocks.
    pub shareable_keys: &'a [u64],
    /// How many leading blocks are shareable (see [`shareable_blocks`]); the keys of those
    /// read must be in `shareable_keys`.
    pub shareable: u32,
    /// `private_seed(id)` of the request id private keys derive from, computed once per
    /// request.
    pub owner_seed: u64,
}

impl BlockKeys<'_> {
    /// Key of block `index` (0-based).
    #[inline]
    pub fn get(&self, index: u32) -> u64 {
        if index < self.shareable {
            self.shareable_keys[index as usize]
        } else {
            private_key_of_latent(self.latent_private(index))
        }
    }

    /// The latent form of private block `index`'s key (see [`private_seed`]).
    #[inline]
    pub fn latent_private(&self, index: u32) -> u64 {
        self.owner_seed ^ u64::from(index)
    }

    /// Keys with no shareable block (a request that holds only private content, or a test).
    pub fn private(owner: u64) -> Self {
        BlockKeys {
            shareable_keys: &[],
            shareable: 0,
            owner_seed: private_seed(owner),
        }
    }
}

/// Keys of every full block of `spec`'s prompt (what a router hashes to score prefixes).
///
/// The blocks past [`shareable_blocks`] are private: their keys are derived from the request
/// id's seed, computed once, instead of through [`block_key`] (the same keys; private keys
/// need no parent).
pub fn prompt_block_keys(spec: &RequestSpec, block_size: u32) -> Vec<u64> {
    let mut keys = PromptKeys::new(spec, block_size);
    keys.materialize();
    keys.keys
}

/// A prompt's full-block keys as a router reads them: the shareable blocks' keys computed,
/// the private ones (past them) as the request's seed and their indices, hashed only if
/// asked for ([`PromptKeys::materialize`]). The router's approximate index records and
/// matches the private ones as one run (see [`crate::sim::kv::LruKeySet::insert_private_run`]).
#[derive(Clone, Debug)]
pub struct PromptKeys {
    /// The shareable blocks' keys, then (once materialized) the private ones.
    keys: Vec<u64>,
    /// Leading shareable blocks.
    shareable: u32,
    /// Full blocks in the prompt.
    full: u32,
    /// `private_seed` of the request id.
    seed: u64,
}

impl PromptKeys {
    /// `spec`'s prompt keys at `block_size` tokens a block, the private ones not yet hashed.
    pub fn new(spec: &RequestSpec, block_size: u32) -> Self {
        let full = spec.input_tokens / block_size;
        let shareable = shareable_blocks(spec, block_size).min(full);
        let mut keys = Vec::with_capacity(shareable as usize);
        let mut parent = ROOT_KEY;
        for index in 0..shareable {
            parent = block_key(spec, parent, index, block_size);
            keys.push(parent);
        }
        PromptKeys {
            keys,
            shareable,
            full,
            seed: private_seed(spec.id.0),
        }
    }

    /// Number of full blocks.
    pub fn len(&self) -> usize {
        self.full as usize
    }

    /// True if the prompt has no full block.
    pub fn is_empty(&self) -> bool {
        self.full == 0
    }

    /// The shareable blocks' keys (the prompt's leading blocks).
    pub fn shareable(&self) -> &[u64] {
        &self.keys[..self.shareable as usize]
    }

    /// The request's private seed: private block `i`'s key is
    /// `private_key_of_latent(seed ^ i)`.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Indices of the private blocks (after the shareable ones).
    pub fn private_range(&self) -> std::ops::Range<u32> {
        self.shareable..self.full
    }

    /// Hashes the private keys too (once) and returns every key in order.
    pub fn materialize(&mut self) -> &[u64] {
        if self.keys.len() < self.full as usize {
            let seed = self.seed;
            self.keys.extend(
                (self.shareable..self.full)
                    .map(|index| private_key_of_latent(seed ^ u64::from(index))),
            );
        }
        &self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefix_blocks_match_and_unique_blocks_differ() {
        let a = RequestSpec::synthetic(1, 0, 100, 10).with_prefix(7, 64);
        let b = RequestSpec::synthetic(2, 0, 100, 10).with_prefix(7, 64);
        let c = RequestSpec::synthetic(3, 0, 100, 10).with_prefix(8, 64);
        let (mut ka, mut kb, mut kc) = (ROOT_KEY, ROOT_KEY, ROOT_KEY);
        for index in 0..4 {
            ka = block_key(&a, ka, index, 16);
            kb = block_key(&b, kb, index, 16);
            kc = block_key(&c, kc, index, 16);
            assert_eq!(ka, kb, "block {index} of one group must match");
            assert_ne!(ka, kc, "different groups must not match");
        }
        // Block 4 holds tokens 64..80: past the prefix, so unique per request.
        assert_ne!(block_key(&a, ka, 4, 16), block_key(&b, kb, 4, 16));
    }

    #[test]
    fn given_block_keys_are_used_verbatim() {
        let mut a = RequestSpec::synthetic(1, 0, 40, 4);
        a.content = PromptContent::BlockKeys(vec![11, 22].into());
        assert_eq!(prompt_block_keys(&a, 16), vec![11, 22]);
        // A third block would be past the prompt's 40 tokens: only two are full.
        let mut b = RequestSpec::synthetic(2, 0, 64, 4);
        b.content = PromptContent::BlockKeys(vec![11].into());
        let keys = prompt_block_keys(&b, 16);
        assert_eq!(keys[0], 11);
        assert_eq!(keys.len(), 4);
        assert_ne!(keys[1], prompt_block_keys(&a, 16)[1]);
    }

    /// One prompt content of each kind: synthetic without a prefix, with a prefix shorter and
    /// longer than the prompt, block keys `5..=last_key` and `[5, 6]`, and `tokens` tokens.
    fn every_content(tokens: u32, last_key: u64) -> [PromptContent; 6] {
        let tokens: std::sync::Arc<[u32]> = (0..tokens).collect::<Vec<u32>>().into();
        [
            PromptContent::Synthetic {
                prefix_group: None,
                prefix_len: 0,
            },
            PromptContent::Synthetic {
                prefix_group: Some(3),
                prefix_len: 40,
            },
            PromptContent::Synthetic {
                prefix_group: Some(3),
                prefix_len: 500,
            },
            PromptContent::BlockKeys(vec![5, 6].into()),
            PromptContent::BlockKeys((5..=last_key).collect::<Vec<u64>>().into()),
            PromptContent::Tokens(tokens),
        ]
    }

    /// The blocks past `shareable_blocks` are exactly those keyed by the request's own id: two
    /// requests with the same content but different ids agree below it and differ from it on.
    #[test]
    fn shareable_blocks_end_where_keys_become_request_private() {
        let contents = every_content(70, 10);
        for content in contents {
            let mut a = RequestSpec::synthetic(1, 0, 70, 40);
            a.content = content.clone();
            let mut b = RequestSpec::synthetic(2, 0, 70, 40);
            b.content = content.clone();
            let shareable = shareable_blocks(&a, 16);
            let (mut ka, mut kb) = (ROOT_KEY, ROOT_KEY);
            // 110 tokens: 6 full blocks, prompt and output.
            for index in 0..6 {
                ka = block_key(&a, ka, index, 16);
                kb = block_key(&b, kb, index, 16);
                assert_eq!(ka == kb, index < shareable, "{content:?} block {index}");
            }
        }
    }

    /// The private blocks' shortcut gives the keys `block_key`'s chain gives, for every kind
    /// of content.
    #[test]
    fn prompt_keys_equal_the_block_key_chain() {
        let contents = every_content(90, 11);
        for content in contents {
            for prompt in [0, 15, 16, 47, 90] {
                let mut spec = RequestSpec::synthetic(77, 0, prompt, 4);
                spec.content = content.clone();
                let mut chain = Vec::new();
                let mut parent = ROOT_KEY;
                for index in 0..prompt / 16 {
                    parent = block_key(&spec, parent, index, 16);
                    chain.push(parent);
                }
                assert_eq!(prompt_block_keys(&spec, 16), chain, "{content:?} {prompt}");
            }
        }
    }

    /// `latent_of_key` inverts the private keys' mix for any 64-bit value.
    #[test]
    fn latent_of_key_inverts_the_mix() {
        let mut state = 0x0123_4567_89ab_cdef_u64;
        for _ in 0..10_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            assert_eq!(latent_of_key(private_key_of_latent(state)), state);
            assert_eq!(private_key_of_latent(latent_of_key(state)), state);
        }
        for edge in [0, 1, u64::MAX, 1 << 63] {
            assert_eq!(latent_of_key(private_key_of_latent(edge)), edge);
        }
    }

    #[test]
    fn token_content_is_hashed() {
        let tokens: std::sync::Arc<[u32]> = (0..32).collect::<Vec<u32>>().into();
        let mut a = RequestSpec::synthetic(1, 0, 32, 4);
        a.content = PromptContent::Tokens(tokens.clone());
        let mut b = RequestSpec::synthetic(2, 0, 32, 4);
        b.content = PromptContent::Tokens(tokens);
        assert_eq!(
            block_key(&a, ROOT_KEY, 0, 16),
            block_key(&b, ROOT_KEY, 0, 16)
        );
        // Parent chaining: same tokens under a different parent differ.
        assert_ne!(block_key(&a, 1, 0, 16), block_key(&a, 2, 0, 16));
    }
}
