//! A lazy window's steady members: decoders whose every block crossing is the common one
//! (a new anonymous block, the filled one keyed privately, while the key map is empty). Their
//! crossings are counted in the step's batch (`KvCache::take_crossing_deferred`'s pending
//! blocks) without touching their tables, when the batch has room for them all: in O(1) in
//! a step with no other KV call, else in O(log n) per other call plus one pass over the
//! bucket. The tables are caught up (`KvCache::catch_up_crossings`) wherever they are read:
//! a finish, the window's close, an observation, an audit, a crossing that cannot be
//! batched. `LazyWindow::steady_ring` holds them by the step of their next crossing, a
//! bucket moving `block_size` steps on whole.

use super::LazyWindow;
use crate::sim::engine::Engine;
use crate::sim::kv::Crossings;
use crate::sim::state::RequestState;

impl Engine {
    /// The common step: no call but the steady members' crossings (if any), counted at once
    /// and their bucket moved `block_size` steps on. False, changing nothing, if the cache's
    /// batch has no room for them all (the general path then takes them one by one).
    #[inline(always)]
    pub(in crate::sim::engine) fn steady_only_step(
        &mut self,
        window: &mut LazyWindow,
        bucket_index: usize,
    ) -> bool {
        let count = window.steady_ring[bucket_index].len();
        if count == 0 {
            return true;
        }
        let mut pending = self.kv.crossings();
        if !pending.defer_lagging(count as u32) {
            return false;
        }
        self.steady_crossings.batched += count as u64;
        #[cfg(debug_assertions)]
        self.check_steady(window, &window.steady_ring[bucket_index], window.step + 1);
        self.kv.take_pending(&mut pending);
        let ring_len = window.steady_ring.len();
        let target = (window.step as usize + 1 + self.config.block_size as usize) & (ring_len - 1);
        debug_assert!(
            window.steady_ring[target].is_empty(),
            "a steady bucket is read before it is reused"
        );
        window.steady_ring.swap(bucket_index, target);
        true
    }

    /// Counts the crossings of the steady members `steady[*counted..upto]` (in batch order)
    /// into the step's batch: all at once if it has room for them, else one by one as any
    /// member's (their tables caught up first), those that cannot defer leaving the steady
    /// ring (marked `u32::MAX` in `steady`). Advances `counted`; false if an allocation
    /// fails (the window closes).
    pub(in crate::sim::engine) fn cross_steady(
        &mut self,
        window: &mut LazyWindow,
        steady: &mut [u32],
        counted: &mut usize,
        upto: usize,
        pending: &mut Crossings,
    ) -> bool {
        let step = window.step + 1;
        #[cfg(debug_assertions)]
        self.check_steady(window, &steady[*counted..upto], step);
        if pending.defer_lagging((upto - *counted) as u32) {
            self.steady_crossings.batched += (upto - *counted) as u64;
            *counted = upto;
            return true;
        }
        while *counted < upto {
            self.steady_crossings.singly += 1;
            let position = steady[*counted];
            let (slot, total) = self.steady_member(window, position, step);
            // (Live: a finishing member leaves the ring, a closing window drops it.)
            let state = self.slots[slot as usize]
                .as_mut()
                .expect("steady members are live");
            self.kv
                .catch_up_crossings(&mut state.blocks, state.owner_seed, total - 1);
            match self.member_call(window, pending, slot, position, total) {
                Some(true) => {}                            // still steady
                Some(false) => steady[*counted] = u32::MAX, // exact, rescheduled
                None => return false,
            }
            *counted += 1;
        }
        true
    }

    /// The slot of the steady member at batch `position` and its tokens at window step
    /// `step` (the step's crossing included).
    fn steady_member(&self, window: &LazyWindow, position: u32, step: u32) -> (u32, u32) {
        let (slot, _) = window.by_position[position as usize];
        let state = self.state(slot);
        let base = state
            .lazy_base_step
            .expect("steady members are window members");
        (slot, state.num_computed + (step - base))
    }

    /// Debug builds: every steady member crossing at `step` is live, lagging, past its
    /// shareable blocks, and at a common crossing of its caught-up table.
    #[cfg(debug_assertions)]
    fn check_steady(&self, window: &LazyWindow, steady: &[u32], step: u32) {
        let block_size = self.config.block_size;
        for &position in steady {
            let (slot, serial) = window.by_position[position as usize];
            let state = self.state(slot);
            assert_eq!(state.serial, serial, "a steady member finished unnoticed");
            assert!(state.lagging_blocks, "a steady member's table is exact");
            assert!(state.blocks.num_keyed >= state.shareable);
            let (_, total) = self.steady_member(window, position, step);
            let held = state.blocks.len().max((total - 1).div_ceil(block_size));
            assert_eq!(total, held * block_size + 1, "not a common crossing");
        }
    }

    /// Catches up the tables of `steady` members (batch positions) to their tokens at window
    /// step `step` (its crossing's block included).
    pub(in crate::sim::engine) fn catch_up_steady(
        &mut self,
        window: &LazyWindow,
        steady: &[u32],
        step: u32,
    ) {
        for &position in steady {
            if position == u32::MAX {
                continue; // exact already
            }
            let (slot, total) = self.steady_member(window, position, step);
            let state = self.slots[slot as usize]
                .as_mut()
                .expect("steady members are live");
            let before = state.blocks.len();
            self.kv
                .catch_up_crossings(&mut state.blocks, state.owner_seed, total);
            if state.blocks.len() > before {
                self.steady_crossings.caught_up_on_close += 1;
            }
        }
    }

    /// Takes a finishing steady member (batch `position`, `computed` tokens through the
    /// window's current step, its progress brought up to it) out of the steady ring.
    pub(in crate::sim::engine) fn leave_steady_ring(
        &self,
        window: &mut LazyWindow,
        position: u32,
        computed: u32,
    ) {
        let block_size = self.config.block_size;
        // Its next crossing: the first step whose token is a block's first.
        let next = window.step + 1 + (block_size - computed % block_size) % block_size;
        let ring_len = window.steady_ring.len() as u32;
        let bucket = &mut window.steady_ring[(next & (ring_len - 1)) as usize];
        if let Ok(index) = bucket.binary_search(&position) {
            bucket.remove(index);
            return;
        }
        // Never reached (its next crossing's bucket holds it): a stale entry would take a
        // block every `block_size` steps that nobody frees, so a release build still finds it.
        debug_assert!(false, "a steady member is in its next crossing's bucket");
        for bucket in &mut window.steady_ring {
            bucket.retain(|&held| held != position);
        }
    }

    /// Blocks a running request holds: its table's, or for a steady member, those its
    /// counted crossings took too (`total` tokens allocated).
    pub(in crate::sim::engine) fn held_blocks(&self, state: &RequestState, total: u32) -> u32 {
        let len = state.blocks.len();
        if state.lagging_blocks {
            len.max(total.div_ceil(self.config.block_size))
        } else {
            len
        }
    }
}
