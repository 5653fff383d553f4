//! Prefill/decode disaggregation on one engine: the two halves a P/D request has.
//!
//! The engine has no role of its own; each request says what it is ([`PdMode`]):
//! - a **prefill half** ([`Engine::submit_prefill`]) runs as any request (the cluster sends it
//!   with `max_tokens = 1`, as llm-d's routing sidecar does), but when it finishes its KV
//!   blocks are not freed: they stay held (counted as used) until the cluster reports that
//!   the decode side pulled them ([`Engine::release_held`]), as vLLM's NIXL connector delays
//!   freeing a finished request's blocks until the remote read is done;
//! - a **decode half** ([`Engine::submit_remote_kv`]) arrives with its prompt's KV on a prefill
//!   instance. When batch formation reaches it in the wait queue (a seat free, blocks
//!   available: the engine's own limits) it takes its local prefix hits, reserves blocks for
//!   the rest of the prompt (to pull all but its last token), leaves the queue without
//!   joining the batch
//!   (phase `Transferring`, counted as queued, as vLLM lists `WAITING_FOR_REMOTE_KVS`
//!   requests as waiting) and posts a [`TransferStart`]; if it cannot, it waits. When the
//!   cluster reports the pull complete ([`Engine::complete_transfer`]) the prompt but its
//!   last token counts as computed and the request returns to the front of the queue; the
//!   next step it joins computes that last token (vLLM recomputes it to get the first
//!   token's logits) and emits the first token; then it decodes as any request.
//!
//! Nothing here runs for a request of mode `Local`: the monolithic path is unchanged.

use std::collections::BTreeMap;

use super::Engine;
use crate::sim::error::SimError;
use crate::sim::kv::{BlockTable, KvCache};
use crate::sim::request::{RequestId, RequestSpec};
use crate::sim::state::{PdMode, Phase, RequestState};

/// A decode half's transfer that started: its blocks are reserved, its KV is to be pulled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferStart {
    /// The request.
    pub id: RequestId,
    /// When the blocks were reserved (the pull starts).
    pub at_us: u64,
    /// Prompt tokens to pull (the prompt but its last token, less local prefix hits).
    pub tokens: u32,
    /// Prompt tokens the decode instance already held (local prefix-cache hits).
    pub local_hit_tokens: u32,
}

/// The engine's disaggregation state: held prefill KV, transfers under way, the outbox of
/// transfers started since the cluster last looked.
#[derive(Clone, Debug, Default)]
pub(super) struct DisaggState {
    /// Finished prefill halves' blocks, held until pulled.
    held: BTreeMap<RequestId, BlockTable>,
    /// Decode halves transferring: slot and serial.
    transferring: BTreeMap<RequestId, (u32, u64)>,
    /// Transfers started, not yet taken by the cluster.
    started: Vec<TransferStart>,
}

impl Engine {
    /// Submits the prefill half of a disaggregated request: served as any request, its KV
    /// blocks held after it finishes until [`Engine::release_held`]. The caller sets
    /// `max_tokens` (llm-d sends 1).
    pub fn submit_prefill(&mut self, spec: RequestSpec) -> Result<(), SimError> {
        let slot = self.submit_slot(spec)?;
        self.slot_state_mut(slot).pd = PdMode::HoldKv;
        Ok(())
    }

    /// Submits the decode half of a disaggregated request: its prompt's KV (but the last
    /// token) is pulled from elsewhere once blocks are reserved for it (see the module).
    pub fn submit_remote_kv(&mut self, spec: RequestSpec) -> Result<(), SimError> {
        let slot = self.submit_slot(spec)?;
        self.slot_state_mut(slot).pd = PdMode::RemoteKv { pulled: false };
        Ok(())
    }

    /// Takes the transfers started since the last call, in the order they started.
    pub fn take_transfer_starts(&mut self) -> Vec<TransferStart> {
        std::mem::take(&mut self.disagg.started)
    }

    /// True if transfers started since the last [`Engine::take_transfer_starts`].
    pub fn has_transfer_starts(&self) -> bool {
        !self.disagg.started.is_empty()
    }

    /// Moves the clock to `now_us` for a report from outside (a transfer's end), which
    /// comes before the engine's own events at that time; every earlier event must have
    /// been processed.
    fn report_at(&mut self, now_us: u64) {
        debug_assert!(
            self.next_event_us().is_none_or(|at| at >= now_us),
            "a report at {now_us} µs with an earlier event pending"
        );
        self.now_us = self.now_us.max(now_us);
    }

    /// The decode half `id`'s pull completed at `now_us` (not before the engine's clock or
    /// any of its pending events): its prompt but the last token counts as computed, and it
    /// waits at the front of the queue for the next step. False if the request is no longer
    /// transferring (it timed out meanwhile).
    pub fn complete_transfer(&mut self, id: RequestId, now_us: u64) -> bool {
        self.requeue_pulled(id, now_us, true)
    }

    /// The decode half `id`'s pull failed at `now_us` (the prefill's KV was gone): it keeps
    /// its reserved blocks and returns to the front of the queue with nothing computed, to
    /// compute its prompt locally (vLLM's default `kv_load_failure_policy`, recompute).
    /// False if the request is no longer transferring.
    pub fn fail_transfer(&mut self, id: RequestId, now_us: u64) -> bool {
        self.requeue_pulled(id, now_us, false)
    }

    /// Ends the decode half `id`'s pull at `now_us` and puts it back at the front of the
    /// queue (where vLLM puts requests whose KV load finished), its prompt but the last token
    /// computed when the pull `arrived`, nothing computed when it failed. False if the
    /// request is no longer transferring.
    fn requeue_pulled(&mut self, id: RequestId, now_us: u64, arrived: bool) -> bool {
        self.report_at(now_us);
        let Some((slot, serial)) = self.disagg.transferring.remove(&id) else {
            return false;
        };
        let policy = self.config.scheduling_policy;
        let Some(state) = self.live_mut(slot, serial) else {
            debug_assert!(false, "a transferring request left without its entry");
            return false;
        };
        debug_assert_eq!(state.phase, Phase::Transferring);
        if arrived {
            state.num_computed = state.spec.input_tokens - 1;
        }
        state.phase = Phase::Waiting;
        state.pd = PdMode::RemoteKv { pulled: true };
        let key = super::queue_key::queue_key(policy, state);
        self.waiting.push_preempted(key, slot);
        self.ensure_step_scheduled();
        self.debug_check_counters();
        true
    }

    /// Frees, at `now_us` (as [`Engine::complete_transfer`]), the held KV blocks of the
    /// finished prefill half `id` (its pull completed, or was abandoned); returns how many
    /// blocks it held, `None` if it holds none.
    pub fn release_held(&mut self, id: RequestId, now_us: u64) -> Option<u32> {
        self.report_at(now_us);
        let mut table = self.disagg.held.remove(&id)?;
        let blocks = table.len();
        self.kv.free(&mut table);
        self.track_kv_usage();
        if !self.waiting.is_empty() {
            // A request may have waited for these blocks.
            self.ensure_step_scheduled();
        }
        self.debug_check_counters();
        Some(blocks)
    }

    /// Finished prefill halves whose blocks are held, and how many blocks they hold.
    pub fn held_kv(&self) -> impl Iterator<Item = (RequestId, u32)> + '_ {
        self.disagg
            .held
            .iter()
            .map(|(&id, table)| (id, table.len()))
    }

    /// Blocks held by finished prefill halves.
    pub fn held_pull_blocks(&self) -> u32 {
        self.disagg.held.values().map(BlockTable::len).sum()
    }

    /// Decode halves whose KV is being pulled.
    pub fn transferring_ids(&self) -> Vec<RequestId> {
        self.disagg.transferring.keys().copied().collect()
    }

    /// The block tables the disaggregation state holds outside live requests (for audits).
    pub(super) fn held_tables(&self) -> impl Iterator<Item = &BlockTable> {
        self.disagg.held.values()
    }

    /// True if blocks are held for a pull or reserved by one: then a request may wait with
    /// nothing running until the cluster reports a transfer.
    pub(super) fn waits_on_cluster(&self) -> bool {
        !self.disagg.transferring.is_empty() || !self.disagg.held.is_empty()
    }

    /// Requests in phase `Transferring`.
    pub(super) fn transferring_count(&self) -> usize {
        self.disagg.transferring.len()
    }

    /// A transferring request timed out: frees its reserved blocks.
    pub(super) fn abandon_transfer(&mut self, slot: u32) {
        let state = self.slots[slot as usize]
            .as_mut()
            .expect("a transferring slot holds a live request");
        let id = state.spec.id;
        self.kv.free(&mut state.blocks);
        self.disagg.transferring.remove(&id);
        self.track_kv_usage();
        if !self.waiting.is_empty() {
            self.ensure_step_scheduled();
        }
    }

    /// Phase 2's step for a decode half not yet pulled, at the head of the queue: reserves
    /// blocks for the prompt, its local prefix hits first, to pull all but its last token
    /// into. False (nothing changed) if the blocks do not fit: the request waits.
    pub(super) fn reserve_transfer(&mut self, slot: u32) -> bool {
        let block_size = self.config.block_size;
        let prefix_caching = self.config.enable_prefix_caching;
        let now = self.now_us;
        let state = self.slots[slot as usize]
            .as_mut()
            .expect("a waiting slot holds a live request");
        let num_tokens = state.num_tokens();
        let pull_to = state.spec.input_tokens - 1;
        let hit = if prefix_caching {
            state.ensure_keys(num_tokens / block_size, block_size);
            self.kv
                .lookup(state.block_keys(block_size), (num_tokens - 1) / block_size)
        } else {
            crate::sim::kv::PrefixHit::default()
        };
        let cached = hit.blocks() * block_size;
        let state = self.slots[slot as usize]
            .as_mut()
            .expect("a waiting slot holds a live request");
        // Blocks for the whole prompt: vLLM reserves those of the prompt but its last token
        // and allocates the last token's when the request is scheduled after the pull;
        // reserving it now (one block more at most) means a pulled request never waits for
        // a block, so a pool full of pulled requests cannot stall with nothing running.
        // (A one-token prompt pulls nothing: it is computed as any request once "pulled".)
        let reserve = if pull_to == 0 { 0 } else { num_tokens };
        if !state.allocate_blocks(&mut self.kv, hit, reserve, block_size) {
            return false;
        }
        if prefix_caching {
            self.kv.record_lookup(num_tokens, cached);
        }
        state.phase = Phase::Transferring;
        if state.timeline.schedule_us.is_none() {
            state.timeline.schedule_us = Some(now);
            state.timeline.cached_tokens = cached;
        }
        if state.timeline.used_blocks_at_schedule == 0 {
            state.timeline.used_blocks_at_schedule = self.kv.used_blocks();
        }
        let id = state.spec.id;
        let serial = state.serial;
        self.waiting.pop();
        self.disagg.transferring.insert(id, (slot, serial));
        self.disagg.started.push(TransferStart {
            id,
            at_us: now,
            tokens: pull_to.saturating_sub(cached),
            local_hit_tokens: cached.min(pull_to),
        });
        true
    }

    fn slot_state_mut(&mut self, slot: u32) -> &mut crate::sim::state::RequestState {
        self.slots[slot as usize]
            .as_mut()
            .expect("a submitted slot holds a live request")
    }
}

/// Frees, or for a prefill half holds until its pull completes, the blocks of a request that
/// just finished. Takes the engine's parts, not the engine, so a caller holding the request's
/// state needs no second lookup: the monolithic case, every request of a plain run, is one
/// inlined test before the free.
#[inline(always)]
pub(super) fn release_finished(
    kv: &mut KvCache,
    disagg: &mut DisaggState,
    state: &mut RequestState,
) {
    if state.pd == PdMode::HoldKv {
        hold_finished(disagg, state);
    } else {
        kv.free(&mut state.blocks);
    }
}

/// A prefill half finished: its table is held until its pull completes.
#[inline(never)]
fn hold_finished(disagg: &mut DisaggState, state: &mut RequestState) {
    let table = std::mem::take(&mut state.blocks);
    let previous = disagg.held.insert(state.spec.id, table);
    debug_assert!(previous.is_none(), "two held prefills share an id");
}
