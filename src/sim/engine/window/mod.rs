//! Lazy decode windows (`lazy.rs`: opening, forming and closing them; `steady.rs`: steady
//! members, whose common crossings are counted in O(1) while their tables lag; `kv.rs`: the
//! members' KV calls) and what all three share: the window's state, its due-event type, the
//! next KV step of a member, and the sorted merge of slot lists. The submodules import only
//! from here and from the engine, never from each other.

mod kv;
mod lazy;
mod steady;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::sim::latency::DecodeSteps;
use crate::sim::state::RequestState;

/// (window step, batch position, slot): an event due for one member.
pub(super) type Due = Reverse<(u32, u32, u32)>;

/// Positions a window may hand out beyond twice its batch before renumbering them.
const POSITION_SLACK: usize = 64;

/// The state of an open lazy decode window.
#[derive(Clone, Debug, Default)]
pub(super) struct LazyWindow {
    /// Window steps completed.
    pub(super) step: u32,
    /// End time of the last completed window step (the window's start at step 0).
    pub(super) prev_end_us: u64,
    /// Members (decoding requests handled lazily).
    pub(super) members: u64,
    /// Total context of the members before the next step.
    pub(super) context_sum: u64,
    /// Members due for a KV call, by step: a ring of buckets indexed by `step % len` (a
    /// member is never due more than `block_size + 1` steps ahead; `len` is a power of two
    /// at least `block_size + 2`), each the batch positions due then, unordered (sorted
    /// when the bucket is read: a handful a step, fewer instructions than scanning a
    /// bitset of the whole batch).
    pub(super) kv_ring: Vec<Vec<u32>>,
    /// The steady members (their every crossing the common one, counted without touching
    /// their tables: see `RequestState::lagging_blocks`), by the step of their next crossing:
    /// a ring like `kv_ring`, each bucket sorted by batch position. A bucket moves
    /// `block_size` steps on whole, and a step with no other KV call counts its crossings in
    /// O(1) when the cache's batch has room for them all (`sim/engine/steady.rs`).
    pub(super) steady_ring: Vec<Vec<u32>>,
    /// The member at each batch position: (slot, serial). The serial tells a finished
    /// member's leftover call from a new request that took its slot.
    pub(super) by_position: Vec<(u32, u64)>,
    /// Members finishing at a step.
    pub(super) done_due: BinaryHeap<Due>,
    /// Scratch for the requests finishing at a step: (batch position, slot, was a member).
    pub(super) done_scratch: Vec<(u32, u32, bool)>,
    /// Running requests outside the window (prefilling), as (batch position, slot) in batch
    /// order. While a step is in flight, `Engine::in_flight` holds exactly their entries, in
    /// the same order.
    pub(super) explicit: Vec<(u32, u32)>,
    /// Scratch: members ahead of each explicit request in the batch.
    pub(super) members_ahead: Vec<u32>,
    /// Batch position given to the next request admitted (positions only grow, so they
    /// order the batch as `Engine::running` does).
    pub(super) next_position: u32,
    /// A window step is formed and pending.
    pub(super) in_flight: bool,
    /// Times the positions were renumbered (a diagnostic for tests).
    pub(super) compactions: u32,
    /// The latency model's price terms of an all-decode step of `members` sequences, kept
    /// while the member count holds ([`crate::sim::latency::LatencyModel::decode_step_us`]).
    pub(super) decode_steps: Option<DecodeSteps>,
}

impl LazyWindow {
    /// Empties the window for reuse (its buffers keep their room) as a fresh one starting at
    /// `prev_end_us` with `ring_len` KV buckets and batch positions from `next_position`.
    fn reset(&mut self, prev_end_us: u64, ring_len: usize, next_position: u32) {
        let mut kv_ring = std::mem::take(&mut self.kv_ring);
        kv_ring.iter_mut().for_each(Vec::clear);
        kv_ring.resize_with(ring_len, Vec::new);
        let mut steady_ring = std::mem::take(&mut self.steady_ring);
        steady_ring.iter_mut().for_each(Vec::clear);
        steady_ring.resize_with(ring_len, Vec::new);
        let mut by_position = std::mem::take(&mut self.by_position);
        by_position.clear();
        by_position.reserve(next_position as usize);
        let mut done_due = std::mem::take(&mut self.done_due);
        done_due.clear();
        done_due.reserve(next_position as usize);
        let mut done_scratch = std::mem::take(&mut self.done_scratch);
        done_scratch.clear();
        let mut explicit = std::mem::take(&mut self.explicit);
        explicit.clear();
        let mut members_ahead = std::mem::take(&mut self.members_ahead);
        members_ahead.clear();
        *self = LazyWindow {
            prev_end_us,
            kv_ring,
            steady_ring,
            by_position,
            done_due,
            done_scratch,
            explicit,
            members_ahead,
            next_position,
            ..LazyWindow::default()
        };
    }
}

/// The last closed window, kept so the next one reuses its buffers instead of allocating
/// them again (windows close and reopen often while prefills crowd the budget). Scratch,
/// not state: a copy of the engine starts without it, and `Debug` shows only whether one is
/// held (its leftovers are a closed window's).
#[derive(Default)]
pub(super) struct WindowSpare(Option<Box<LazyWindow>>);

impl std::fmt::Debug for WindowSpare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = if self.0.is_some() { "held" } else { "none" };
        f.debug_tuple("WindowSpare").field(&held).finish()
    }
}

impl Clone for WindowSpare {
    fn clone(&self) -> Self {
        Self(None)
    }
}

/// `a` and `b` (sorted, disjoint) merged into `out` (empty), sorted.
#[inline]
pub(super) fn merge_sorted(a: &[u32], b: &[u32], out: &mut Vec<u32>) {
    out.reserve(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] < b[j] {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
}

/// The first window step after `step` (the request in `state` having computed `computed`
/// tokens through window step `step`) whose token needs a KV call: a new block, or a
/// shareable block filling up. A private block filling up waits for the next call (the new
/// block's), for the request's completion or for the window's close: no other request can
/// look it up meanwhile, and the step-by-step path's keying is caught up at those points.
#[inline(always)]
pub(super) fn next_kv_step_of(
    state: &RequestState,
    step: u32,
    computed: u32,
    block_size: u32,
    prefix_caching: bool,
) -> u32 {
    let held = state.blocks.len() * block_size + 1;
    let threshold = if prefix_caching && state.blocks.num_keyed < state.shareable {
        held.min((state.blocks.num_keyed + 1) * block_size)
    } else {
        held
    };
    // At window step s > step the token computed is number computed + (s - step).
    let total_next = computed + 1;
    step + 1 + threshold.saturating_sub(total_next)
}
