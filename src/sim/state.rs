//! Mutable per-request state inside an engine.
//!
//! A request's progress is two numbers, as in vLLM v1: `num_computed` (tokens whose KV
//! exists) and `generated` (output tokens emitted). Its token sequence is the prompt plus the
//! generated tokens, so a step computes `num_tokens() - num_computed` new tokens: the whole
//! (remaining) prompt while prefilling, exactly one while decoding. Preemption by recompute
//! resets `num_computed` to zero and keeps `generated`: the request later prefills prompt and
//! outputs again and resumes decoding where it stopped, as vLLM does.

use crate::sim::kv::hash::{BlockKeys, ROOT_KEY, block_key, private_seed, shareable_blocks};
use crate::sim::kv::{BlockTable, KvCache, PrefixHit};
use crate::sim::request::RequestSpec;
use std::sync::Arc;

/// Where a request is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Arrived, in the API server's queueing delay.
    Arriving,
    /// In the scheduler's wait queue.
    Waiting,
    /// Admitted to the running batch (holds KV blocks).
    Running,
    /// Disaggregated decode only: blocks reserved for the prompt's KV, which is being pulled
    /// from a prefill instance (vLLM's `WAITING_FOR_REMOTE_KVS`; counted as queued).
    Transferring,
}

/// A request's part in prefill/decode disaggregation (see `sim/engine/disagg.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PdMode {
    /// Served whole on this instance (the monolithic path).
    #[default]
    Local,
    /// A prefill instance's half (sent with `max_tokens = 1`): when it finishes, its KV
    /// blocks stay held until the decode side's pull completes.
    HoldKv,
    /// A decode instance's half: its prompt's KV arrives by transfer. `pulled` once the
    /// transfer completed (a later preemption recomputes locally, as vLLM does).
    RemoteKv {
        /// The transfer has completed.
        pulled: bool,
    },
}

/// Timestamps and counters that end up in the request's record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Entered the wait queue (first time).
    pub enqueue_us: Option<u64>,
    /// First admitted to the running batch.
    pub schedule_us: Option<u64>,
    /// First token seen by the client (includes per-token overhead).
    pub first_token_us: Option<u64>,
    /// Client-side time of the latest token.
    pub last_token_us: u64,
    /// Engine time of the step that emitted the latest token.
    pub last_emit_step_end_us: u64,
    /// Times the request was preempted.
    pub preemptions: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: u32,
    /// KV blocks in use on the instance right after its first admission.
    pub used_blocks_at_schedule: u32,
    /// Sum of inter-token gaps (µs).
    pub token_gap_sum_us: u64,
    /// Every inter-token gap (µs), when the engine records them.
    pub token_gaps_us: Vec<u64>,
}

/// One live request.
#[derive(Debug)]
pub struct RequestState {
    /// The immutable request.
    pub spec: RequestSpec,
    /// Unique per submission: lets stale events and batch entries detect a reused slot.
    pub serial: u64,
    /// Lifecycle phase.
    pub phase: Phase,
    /// Tokens whose KV has been computed (and is held in `blocks`).
    pub num_computed: u32,
    /// Output tokens emitted so far.
    pub generated: u32,
    /// KV blocks held.
    pub blocks: BlockTable,
    /// Content keys of the leading shareable full blocks, computed on demand (private
    /// blocks' keys derive from the id when read: see [`RequestState::block_keys`]).
    /// Shared between copies: a fork copies no keys (they change only while prefilling).
    pub keys: SharedKeys,
    /// `private_seed(spec.id)`: the request's half of its private blocks' keys, hashed once
    /// at submission rather than per block.
    pub owner_seed: u64,
    /// `shareable_blocks(spec, block_size)` for the engine's block size: read on every KV
    /// call, so computed once at submission.
    pub shareable: u32,
    /// While a member of an open lazy decode window: the window step its progress fields
    /// were last brought up to (`None` outside a window, or prefilling beside one).
    pub lazy_base_step: Option<u32>,
    /// A window member whose crossings are counted without touching its table (a steady
    /// member): `blocks` may miss the anonymous blocks of those crossings, already taken off
    /// the free list, until the window catches it up (`KvCache::catch_up_crossings`).
    pub lagging_blocks: bool,
    /// Timestamps and counters.
    pub timeline: Timeline,
    /// Its part in prefill/decode disaggregation.
    pub pd: PdMode,
}

impl Clone for RequestState {
    /// Keeps the key and block vectors' reserved room, so a forked engine never regrows
    /// them on its hot path.
    fn clone(&self) -> Self {
        Self {
            spec: self.spec.clone(),
            serial: self.serial,
            phase: self.phase,
            num_computed: self.num_computed,
            generated: self.generated,
            blocks: self.blocks.clone(),
            keys: self.keys.clone(),
            owner_seed: self.owner_seed,
            shareable: self.shareable,
            lazy_base_step: self.lazy_base_step,
            lagging_blocks: self.lagging_blocks,
            timeline: self.timeline.clone(),
            pd: self.pd,
        }
    }
}

/// The computed content keys of a request's leading shareable blocks, shared by the
/// request's copies in forked engines (one reference count instead of an allocation and a
/// copy per request per fork). Empty without an allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedKeys(Option<Arc<[u64]>>);

impl SharedKeys {
    /// Extends the keys to `count` (if shorter), each new key `next(parent, index)` from the
    /// previous one ([`ROOT_KEY`] before the first): one allocation for the whole extension.
    fn extend_to(&mut self, count: u32, mut next: impl FnMut(u64, u32) -> u64) {
        let old: &[u64] = self;
        if old.len() as u32 >= count {
            return;
        }
        let mut parent = old.last().copied().unwrap_or(ROOT_KEY);
        let extended: Arc<[u64]> = (0..count)
            .map(|index| match old.get(index as usize) {
                Some(&key) => key,
                None => {
                    parent = next(parent, index);
                    parent
                }
            })
            .collect();
        self.0 = Some(extended);
    }
}

impl std::ops::Deref for SharedKeys {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl RequestState {
    /// A freshly arrived request, in an engine of `block_size`-token blocks.
    pub fn new(spec: RequestSpec, serial: u64, block_size: u32) -> Self {
        Self {
            owner_seed: private_seed(spec.id.0),
            shareable: shareable_blocks(&spec, block_size),
            spec,
            serial,
            phase: Phase::Arriving,
            num_computed: 0,
            generated: 0,
            blocks: BlockTable::default(),
            keys: SharedKeys::default(),
            lazy_base_step: None,
            lagging_blocks: false,
            timeline: Timeline::default(),
            pd: PdMode::Local,
        }
    }

    /// Length of the token sequence: prompt plus generated tokens.
    pub fn num_tokens(&self) -> u32 {
        self.spec.input_tokens + self.generated
    }

    /// Tokens the next step would compute without caps.
    pub fn remaining_tokens(&self) -> u32 {
        self.num_tokens() - self.num_computed
    }

    /// Output tokens at which the request finishes.
    pub fn target_tokens(&self) -> u32 {
        self.spec.generated_tokens()
    }

    /// True while the request's next step is a decode (one token after its first output).
    pub fn is_decoding(&self) -> bool {
        self.generated > 0 && self.num_computed + 1 == self.num_tokens()
    }

    /// Emits one output token at the end of the step ending at `now`, seen by the client
    /// `token_us` later (the first token `first_delay_us` later still: the serving front
    /// end's delivery delay, which every later token inherits): the first token sets the
    /// time to first token, a later one adds an inter-token gap (kept in the list too if
    /// `record_gaps`). Returns that gap, if any.
    pub fn emit_token(
        &mut self,
        now: u64,
        token_us: u64,
        first_delay_us: u64,
        record_gaps: bool,
    ) -> Option<u64> {
        self.generated += 1;
        let timeline = &mut self.timeline;
        let gap = match timeline.first_token_us {
            None => {
                let seen = now.saturating_add(token_us).saturating_add(first_delay_us);
                timeline.first_token_us = Some(seen);
                timeline.last_token_us = seen;
                None
            }
            Some(_) => {
                let gap = (now - timeline.last_emit_step_end_us).saturating_add(token_us);
                timeline.last_token_us = timeline.last_token_us.saturating_add(gap);
                timeline.token_gap_sum_us = timeline.token_gap_sum_us.saturating_add(gap);
                if record_gaps {
                    timeline.token_gaps_us.push(gap);
                }
                Some(gap)
            }
        };
        timeline.last_emit_step_end_us = now;
        gap
    }

    /// Makes sure the keys the first `full_blocks` blocks need are computed (the shareable
    /// ones among them: private keys are derived when read) and the block table has room
    /// for its identified (shareable) blocks.
    pub fn ensure_keys(&mut self, full_blocks: u32, block_size: u32) {
        // Room for the shareable blocks at once, taken when the table is full: no regrowth
        // on the hot path (a fork's clone keeps the room). Private blocks are anonymous: a
        // count, no ids.
        if self.blocks.ids.capacity() == self.blocks.ids.len()
            && (self.blocks.ids.len() as u32) < self.shareable
        {
            self.reserve_table(block_size);
        }
        if self.keys.len() as u32 >= full_blocks {
            return; // (the common call: nothing new to hash)
        }
        let shareable = self.shareable;
        debug_assert_eq!(shareable, shareable_blocks(&self.spec, block_size));
        let full_blocks = full_blocks.min(shareable);
        if self.keys.len() as u32 >= full_blocks {
            return;
        }
        self.keys.extend_to(full_blocks, |parent, index| {
            block_key(&self.spec, parent, index, block_size)
        });
    }

    /// Reserves block-table room for the identified blocks of the whole sequence (its
    /// shareable ones).
    #[cold]
    fn reserve_table(&mut self, block_size: u32) {
        let most = ((self.spec.input_tokens + self.target_tokens()) / block_size + 1)
            .min(self.shareable) as usize;
        if self.blocks.ids.capacity() < most + 1 {
            self.blocks
                .ids
                .reserve_exact(most + 1 - self.blocks.ids.len());
        }
    }

    /// Grows this request's blocks in `kv` to cover `total` tokens, taking the `hit` blocks
    /// first (see [`KvCache::allocate`]); false, changing nothing, if blocks run out.
    pub fn allocate_blocks(
        &mut self,
        kv: &mut KvCache,
        hit: PrefixHit,
        total: u32,
        block_size: u32,
    ) -> bool {
        debug_assert_eq!(self.shareable, shareable_blocks(&self.spec, block_size));
        let keys = BlockKeys {
            shareable_keys: &self.keys,
            shareable: self.shareable,
            owner_seed: self.owner_seed,
        };
        kv.allocate(&mut self.blocks, keys, hit, total)
    }

    /// The keys of this request's blocks as the KV cache reads them (shareable ones must
    /// have been computed by [`RequestState::ensure_keys`] as far as they are read).
    pub fn block_keys(&self, block_size: u32) -> BlockKeys<'_> {
        debug_assert_eq!(self.shareable, shareable_blocks(&self.spec, block_size));
        BlockKeys {
            shareable_keys: &self.keys,
            shareable: self.shareable,
            owner_seed: self.owner_seed,
        }
    }
}
