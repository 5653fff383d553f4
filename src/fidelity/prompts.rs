//! The prompts of inference-perf's shared-prefix workloads, as vLLM's prefix cache sees them.
//!
//! inference-perf's `shared_prefix` data generator builds its prompts once, `num_groups ×
//! num_prompts_per_group` of them (each a group's system prompt followed by a question of its
//! own, random token ids decoded to text), and then sends them in turn: request `i` carries
//! prompt `i mod P` (`load_lazy_data` in `inference_perf/datagen/shared_prefix_datagen.py`,
//! `data_index % len(self.prompts)`). Every prompt therefore comes back every P requests, and
//! vLLM's automatic prefix caching (on by default in v1) serves all of its full blocks from
//! the cache while they survive there: only the last partial block, or the last token of a
//! prompt that fills its blocks, is computed again.
//!
//! The measured runs show it (docs/fidelity/repeated-prompts.md, guarded by
//! `tests/gt_repeated_prompts.rs`): in each of the eleven per-request runs a request's prompt
//! length equals that of the request P = 100 places earlier for 98.1-99.6% of the requests
//! that succeeded (at any other lag 6-11%), and the first 100 requests, which find nothing
//! cached, take longer to their first token than the hundreds after them at the same load.
//!
//! [`PromptPool`] gives each of the P prompts the block keys of that content: the blocks
//! wholly inside the system prompt keyed by the prompt's group (shared by the group's
//! prompts, as the system prompt is), the rest keyed by the prompt. A replayed request gets
//! its prompt's keys; blocks past them (its output) stay private.

use std::sync::Arc;

use crate::sim::kv::hash::{ROOT_KEY, token_block_key};
use crate::sim::request::PromptContent;

use super::run::SharedPrefix;

/// Marks the words hashed for a pool's blocks (so they never meet another content's keys).
const POOL_TAG: u32 = 0x7072_6f6d; // "prom"

/// The P prompts of a shared-prefix workload, each as the chain of its full blocks' keys.
#[derive(Clone, Debug)]
pub struct PromptPool {
    keys: Vec<Arc<[u64]>>,
}

impl PromptPool {
    /// The pool of `shape` (P = groups × prompts per group) for prompts of at most
    /// `max_prompt_tokens` tokens in blocks of `block_size`. Prompt `p` belongs to group
    /// `p mod groups`: the generator shuffles its prompts after building them, so which
    /// prompt had which system prompt is not recorded, and only the prompts' first sendings
    /// depend on it.
    pub fn new(shape: SharedPrefix, block_size: u32, max_prompt_tokens: u32) -> Self {
        let groups = shape.groups.max(1);
        let prompts = u32::try_from(shape.prompts()).unwrap_or(u32::MAX);
        let block_size = block_size.max(1);
        let blocks = max_prompt_tokens / block_size;
        let system_blocks = shape.system_prompt_len / block_size;
        let keys = (0..prompts)
            .map(|prompt| {
                let group = prompt % groups;
                let mut parent = ROOT_KEY;
                (0..blocks)
                    .map(|block| {
                        let owner = if block < system_blocks {
                            [POOL_TAG, 0, group, block]
                        } else {
                            [POOL_TAG, 1, prompt, block]
                        };
                        parent = token_block_key(parent, &owner);
                        parent
                    })
                    .collect::<Arc<[u64]>>()
            })
            .collect();
        Self { keys }
    }

    /// How many distinct prompts the generator cycles through (P).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True for a pool of no prompts (never built by [`Self::new`], which makes at least one).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The prompt content of the generator's request number `index` (its place in the order
    /// the load generator sent them): prompt `index mod P`.
    pub fn content(&self, index: u64) -> PromptContent {
        let slot = (index % self.keys.len().max(1) as u64) as usize;
        match self.keys.get(slot) {
            Some(keys) => PromptContent::BlockKeys(Arc::clone(keys)),
            None => PromptContent::BlockKeys(Arc::from(Vec::new())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> SharedPrefix {
        SharedPrefix {
            groups: 10,
            users_per_group: 10,
            system_prompt_len: 100,
            question_len: 447,
        }
    }

    fn keys(content: PromptContent) -> Arc<[u64]> {
        match content {
            PromptContent::BlockKeys(keys) => keys,
            other => panic!("expected block keys, got {other:?}"),
        }
    }

    #[test]
    fn a_prompt_comes_back_every_p_requests() {
        let pool = PromptPool::new(shape(), 16, 600);
        assert_eq!(pool.len(), 100);
        assert_eq!(keys(pool.content(7)), keys(pool.content(107)));
        assert_eq!(keys(pool.content(7)), keys(pool.content(1007)));
        assert_ne!(keys(pool.content(7)), keys(pool.content(8)));
        assert_eq!(keys(pool.content(0)).len(), 600 / 16);
    }

    #[test]
    fn prompts_of_one_group_share_only_the_system_prompt_s_full_blocks() {
        let pool = PromptPool::new(shape(), 16, 600);
        // Prompts 3 and 13 are both in group 3; prompt 4 is not.
        let (a, b, other) = (
            keys(pool.content(3)),
            keys(pool.content(13)),
            keys(pool.content(4)),
        );
        // 100 tokens fill six 16-token blocks; the seventh holds system and question.
        assert_eq!(a[..6], b[..6]);
        assert!(a[6..].iter().zip(&b[6..]).all(|(x, y)| x != y));
        assert!(a.iter().zip(other.iter()).all(|(x, y)| x != y));
    }
}
