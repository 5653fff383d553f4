//! Hash-chained block keys for prefix caching.
//!
//! A full block's key depends on its parent's key and on its tokens, so equal keys mean equal
//! prefixes, as in vLLM. Requests that carry real token ids hash those ids. Requests known
//! only by lengths have synthetic content: a block lying wholly inside the request's shared
//! prefix is keyed by (prefix group, block index), any other block by (request id, block
//! index), so shared prefixes really share blocks and nothing else does. Generated tokens are
//! always unique to their request. The hash is a fixed 64-bit mix, identical on every
//! platform and run.

use crate::sim::request::{PromptContent, RequestSpec};

/// Key of the (virtual) parent of a request's first block.
pub const ROOT_KEY: u64 = 0x6469_7474_6f2d_6b76; // "ditto-kv"

const TAG_GROUP: u64 = 0x1;
const TAG_REQUEST: u64 = 0x2;
const TAG_TOKENS: u64 = 0x3;

/// splitmix64's finaliser: a strong, cheap 64-bit mixer.
fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
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
            let mut state = combine(parent, TAG_TOKENS);
            for &token in &tokens[start as usize..end as usize] {
                state = combine(state, u64::from(token));
            }
            state
        }
        _ => combine(
            combine(combine(parent, TAG_REQUEST), spec.id.0),
            u64::from(block_index),
        ),
    }
}

/// Keys of every full block of `spec`'s prompt (what a router hashes to score prefixes).
pub fn prompt_block_keys(spec: &RequestSpec, block_size: u32) -> Vec<u64> {
    let full = spec.input_tokens / block_size;
    let mut keys = Vec::with_capacity(full as usize);
    let mut parent = ROOT_KEY;
    for index in 0..full {
        parent = block_key(spec, parent, index, block_size);
        keys.push(parent);
    }
    keys
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
