//! The KV side of lazy decode windows: when each member next needs the KV cache (a new
//! block, or a shareable block filling up), the per-step lists of members due, the calls
//! themselves in batch order beside the explicit requests, the keying of private blocks a
//! window defers (and its catch-up), and the renumbering of batch positions in long-lived
//! windows.

use std::cmp::Reverse;

use super::{Due, LazyWindow, merge_sorted, next_kv_step_of};
use crate::sim::engine::Engine;
use crate::sim::kv::hash::BlockKeys;
use crate::sim::kv::{Crossings, PrefixHit};
use crate::sim::state::RequestState;

impl Engine {
    /// Renumbers batch positions to the running requests' indices (the same order), so a
    /// long-lived window's positions, due lists and tables stay as small as the batch.
    /// Amortized O(1) per admission: it runs once positions outgrow twice the batch plus
    /// `lazy::POSITION_SLACK`.
    pub(in crate::sim::engine) fn compact_positions(&mut self, window: &mut LazyWindow) {
        let mut index_of_slot = vec![u32::MAX; self.slots.len()];
        for (index, &slot) in self.running.iter().enumerate() {
            index_of_slot[slot as usize] = index as u32;
        }
        // Old position -> new one, for live members (stale ones map to nothing).
        let mut renumber = vec![u32::MAX; window.next_position as usize];
        let mut by_position = vec![(u32::MAX, 0); self.running.len()];
        for (old, &(slot, serial)) in window.by_position.iter().enumerate() {
            let live = self
                .slots
                .get(slot as usize)
                .and_then(Option::as_ref)
                .is_some_and(|state| state.serial == serial && state.lazy_base_step.is_some());
            if live {
                let new = index_of_slot[slot as usize];
                renumber[old] = new;
                by_position[new as usize] = (slot, serial);
            }
        }
        for bucket in window
            .kv_ring
            .iter_mut()
            .chain(window.steady_ring.iter_mut())
        {
            bucket.retain_mut(|position| {
                *position = renumber[*position as usize];
                *position != u32::MAX
            });
        }
        let done: Vec<Due> = std::mem::take(&mut window.done_due).into_vec();
        window.done_due = done
            .into_iter()
            .map(|Reverse((at, old, slot))| {
                debug_assert!(renumber[old as usize] != u32::MAX, "members are live");
                Reverse((at, renumber[old as usize], slot))
            })
            .collect();
        for entry in &mut window.explicit {
            entry.0 = index_of_slot[entry.1 as usize];
        }
        window.by_position = by_position;
        window.next_position = self.running.len() as u32;
        window.compactions += 1;
    }

    /// Phase 1's KV calls, in batch order: the members due at the next step (the steady
    /// ones counted in O(1) when the cache's batch has room for them) and every explicit
    /// request (whose tokens are in `in_flight`). `None` if an allocation fails.
    pub(in crate::sim::engine) fn window_kv_calls(
        &mut self,
        window: &mut LazyWindow,
    ) -> Option<()> {
        let step = window.step + 1;
        let ring_len = window.kv_ring.len();
        let bucket_index = step as usize & (ring_len - 1);
        if window.kv_ring[bucket_index].is_empty()
            && window.explicit.is_empty()
            && self.steady_only_step(window, bucket_index)
        {
            return Some(());
        }
        // The step's bucket, in batch order. A call reschedules its member 1 to
        // `ring_len - 1` steps ahead, so never into this bucket.
        let mut bucket = std::mem::take(&mut window.kv_ring[bucket_index]);
        // (Usually sorted already: members are rescheduled in batch order.)
        if !bucket.is_sorted() {
            bucket.sort_unstable();
        }
        debug_assert!(
            bucket.windows(2).all(|pair| pair[0] < pair[1]),
            "a member is due once per step"
        );
        // The steady members crossing now, in batch order; the first `counted` are done.
        let mut steady = std::mem::take(&mut window.steady_ring[bucket_index]);
        let mut counted = 0;
        // Crossings' blocks not yet taken (`KvCache::take_crossing_deferred`).
        let mut pending = self.kv.crossings();
        let mut result =
            self.step_kv_calls(window, &mut bucket, &mut steady, &mut counted, &mut pending);
        let all = steady.len();
        if result.is_some()
            && counted < all
            && !self.cross_steady(window, &mut steady, &mut counted, all, &mut pending)
        {
            result = None;
        }
        self.kv.take_pending(&mut pending);
        let Some(kept) = result else {
            // The window closes: the steady members whose crossing was taken get its block
            // in their tables now (the close catches up the rest).
            self.catch_up_steady(window, &steady[..counted], window.step + 1);
            return None;
        };
        // The steady members cross again `block_size` steps on, joined by the new ones.
        steady.retain(|&position| position != u32::MAX);
        bucket.truncate(kept);
        requeue_steady(
            window,
            bucket,
            steady,
            bucket_index,
            step + self.config.block_size,
        );
        Some(())
    }

    /// The calls of [`Engine::window_kv_calls`] in batch order: the due members of `bucket`
    /// and the explicit requests interleaved, the steady members ahead of each call crossing
    /// first. Returns how many due members were deferred (they turn steady; their positions
    /// are moved to the front of `bucket`), or `None` if an allocation fails.
    #[inline]
    fn step_kv_calls(
        &mut self,
        window: &mut LazyWindow,
        bucket: &mut [u32],
        steady: &mut [u32],
        counted: &mut usize,
        pending: &mut Crossings,
    ) -> Option<usize> {
        let window_step = window.step;
        let (mut next_due, mut next_explicit) = (0, 0);
        // Members whose crossing was deferred (they turn steady), kept at the front of the
        // bucket.
        let mut kept = 0;
        loop {
            let due_position = bucket.get(next_due).copied();
            let explicit_position = window
                .explicit
                .get(next_explicit)
                .map(|&(position, _)| position);
            let position = match (due_position, explicit_position) {
                (None, None) => return Some(kept),
                (Some(due), Some(explicit)) => due.min(explicit),
                (Some(only), None) | (None, Some(only)) => only,
            };
            // The steady members ahead of this call cross first.
            if steady.get(*counted).is_some_and(|&first| first < position) {
                let upto = *counted + steady[*counted..].partition_point(|&q| q < position);
                if !self.cross_steady(window, steady, counted, upto, pending) {
                    return None;
                }
            }
            if due_position != Some(position) {
                let entry = self.in_flight[next_explicit];
                next_explicit += 1;
                if !self.explicit_call(entry.slot, entry.new_tokens, pending) {
                    return None;
                }
                continue;
            }
            next_due += 1;
            let (slot, serial) = window.by_position[position as usize];
            let Some(state) = self.slots[slot as usize]
                .as_mut()
                .filter(|state| state.serial == serial)
            else {
                continue; // finished earlier in the window
            };
            let base = state.lazy_base_step.expect("due requests are members");
            let total = state.num_computed + (window_step - base) + 1;
            // Deferred (true): it turns steady, and its bucket entry stays (the bucket moves
            // `block_size` steps on to the steady ring). `None`: the window closes (its ring
            // is cleared when reused).
            if self.member_call(window, pending, slot, position, total)? {
                bucket[kept] = position;
                kept += 1;
            }
        }
    }

    /// An explicit request's KV call for its `new_tokens` of the step. False if the cache
    /// cannot (the window closes).
    #[inline]
    fn explicit_call(&mut self, slot: u32, new_tokens: u32, pending: &mut Crossings) -> bool {
        let (block_size, prefix_caching) =
            (self.config.block_size, self.config.enable_prefix_caching);
        let state = self.slots[slot as usize]
            .as_mut()
            .expect("explicit requests are live");
        let total = state.num_computed + new_tokens;
        call_in_batch(
            &mut self.kv,
            pending,
            state,
            total,
            block_size,
            prefix_caching,
        )
    }

    /// One due member's KV call at the next window step (`total` tokens then), in batch order
    /// within the step's batch `pending`: its common crossing deferred into the batch (true:
    /// it is steady from now on, its next call exactly `block_size` steps on), or an ordinary
    /// call, after which its table is exact and it is rescheduled in `kv_ring` (false).
    /// `None` if the cache cannot (the window closes). Used by the due members' bucket and by
    /// steady members whose crossing cannot be batched.
    pub(in crate::sim::engine) fn member_call(
        &mut self,
        window: &mut LazyWindow,
        pending: &mut Crossings,
        slot: u32,
        position: u32,
        total: u32,
    ) -> Option<bool> {
        let (block_size, prefix_caching) =
            (self.config.block_size, self.config.enable_prefix_caching);
        let step = window.step + 1;
        let ring_len = window.kv_ring.len() as u32;
        let state = self.slots[slot as usize]
            .as_mut()
            .expect("due members are live");
        // The common crossing's block is taken with the next call on the cache (or at the
        // step's end), together with the other crossings' before it.
        let deferred = prefix_caching
            && state.blocks.num_keyed >= state.shareable
            && self
                .kv
                .take_crossing_deferred(&mut state.blocks, state.owner_seed, total, pending);
        state.lagging_blocks = deferred;
        if deferred {
            debug_assert_eq!(
                next_kv_step_of(state, step, total, block_size, prefix_caching),
                step + block_size
            );
            return Some(true);
        }
        if !call_in_batch(
            &mut self.kv,
            pending,
            state,
            total,
            block_size,
            prefix_caching,
        ) {
            return None;
        }
        // A call earlier than needed is harmless (it finds nothing to do and reschedules),
        // so a far one is clamped to the ring.
        let next = next_kv_step_of(state, step, total, block_size, prefix_caching)
            .min(step + ring_len - 1);
        debug_assert_ne!(next, step, "a call reschedules its member ahead");
        window.kv_ring[(next & (ring_len - 1)) as usize].push(position);
        Some(false)
    }

    /// Brings a member's table up to `total` tokens as the step-by-step path would have it by
    /// now: the crossings counted while it was steady, then the keying of the private blocks
    /// the window deferred. Never allocates.
    pub(in crate::sim::engine) fn catch_up_member(&mut self, slot: u32, total: u32) {
        let block_size = self.config.block_size;
        let state = self.slots[slot as usize]
            .as_mut()
            .expect("window members are live");
        // (Only a prefix-caching cache batches crossings, so only then can a table lag; caught
        // up first whatever the configuration, so the blocks it holds are never freed short.)
        if state.lagging_blocks {
            self.kv
                .catch_up_crossings(&mut state.blocks, state.owner_seed, total);
            state.lagging_blocks = false;
        }
        if !self.config.enable_prefix_caching || total / block_size <= state.blocks.num_keyed {
            return;
        }
        let keyed = allocate_to(&mut self.kv, state, total, block_size, true);
        debug_assert!(keyed, "catching up keys needs no new block");
    }

    /// Blocks of running request `slot` the step-by-step path would have keyed by now: the
    /// table's count, or for a window member, that of its progress (keying of private blocks
    /// is deferred inside a window).
    pub(in crate::sim::engine) fn observed_keyed_blocks(&self, slot: u32) -> u32 {
        let state = self.state(slot);
        let keyed = state.blocks.num_keyed;
        match (&self.lazy, state.lazy_base_step) {
            (Some(window), Some(base)) if self.config.enable_prefix_caching => {
                let total = state.num_computed + (window.step - base) + u32::from(window.in_flight);
                (total / self.config.block_size)
                    .min(self.held_blocks(state, total))
                    .max(keyed)
            }
            _ => keyed,
        }
    }
}

/// Files the steady members (`steady`, joined by the due members deferred into it,
/// `bucket`, both in batch order) at their next crossing, step `target_step`, and gives the
/// step's emptied lists back to the rings for reuse.
#[inline]
fn requeue_steady(
    window: &mut LazyWindow,
    mut bucket: Vec<u32>,
    mut steady: Vec<u32>,
    bucket_index: usize,
    target_step: u32,
) {
    let ring_len = window.kv_ring.len();
    let target = target_step as usize & (ring_len - 1);
    debug_assert_ne!(target, bucket_index, "the ring is longer than a block");
    let mut moved = std::mem::take(&mut window.steady_ring[target]);
    debug_assert!(
        moved.is_empty(),
        "a steady bucket is read before it is reused"
    );
    if bucket.is_empty() {
        std::mem::swap(&mut moved, &mut steady);
    } else {
        merge_sorted(&steady, &bucket, &mut moved);
        steady.clear();
        bucket.clear();
    }
    window.steady_ring[target] = moved;
    window.steady_ring[bucket_index] = steady;
    window.kv_ring[bucket_index] = bucket;
}

/// An ordinary KV call amid a step's batch of deferred crossings: the batch's pending blocks
/// are taken first (so the free list is as single takes would have left it), then
/// [`allocate_to`]; the batch is renewed after. False if the cache cannot (the window closes).
#[inline(always)]
fn call_in_batch(
    kv: &mut crate::sim::kv::KvCache,
    pending: &mut Crossings,
    state: &mut RequestState,
    total: u32,
    block_size: u32,
    prefix_caching: bool,
) -> bool {
    let had_room = pending.has_room();
    kv.take_pending(pending);
    if !allocate_to(kv, state, total, block_size, prefix_caching) {
        return false;
    }
    *pending = Crossings::renew(had_room, kv);
    true
}

/// One phase-1 KV call: makes `state`'s blocks cover `total` tokens (keys first, if prefix
/// caching is on). False if the cache cannot. (Inlined: it is the per-block call.)
#[inline(always)]
fn allocate_to(
    kv: &mut crate::sim::kv::KvCache,
    state: &mut RequestState,
    total: u32,
    block_size: u32,
    prefix_caching: bool,
) -> bool {
    // The common call (a member past its shareable blocks, crossing a block boundary): every
    // shareable block is keyed, so no key needs computing, and its new blocks are anonymous
    // (no table room to take). Straight to the cache, as `allocate_blocks` would go.
    let shareable = state.shareable;
    if prefix_caching && state.blocks.num_keyed >= shareable {
        if kv.take_crossing(&mut state.blocks, state.owner_seed, total) {
            return true;
        }
        let keys = BlockKeys {
            shareable_keys: &state.keys,
            shareable,
            owner_seed: state.owner_seed,
        };
        return kv.allocate(&mut state.blocks, keys, PrefixHit::default(), total);
    }
    if prefix_caching {
        state.ensure_keys(total / block_size, block_size);
    }
    state.allocate_blocks(kv, PrefixHit::default(), total, block_size)
}

#[cfg(test)]
mod tests {
    use crate::sim::latency::{BlackboxCoefficients, LatencyModel};
    use crate::sim::{Engine, EngineConfig, RequestSpec};

    /// One window open across hundreds of admissions (a long decoder, a steady stream of
    /// short requests, arrivals a step apart): its positions are renumbered, and results
    /// equal the reference stepper's.
    #[test]
    fn a_long_lived_window_renumbers_positions_exactly() {
        let mut config = EngineConfig::vllm_defaults(20_000, 8192);
        config.kv_sample_interval_us = 0;
        let model = LatencyModel::Blackbox(BlackboxCoefficients {
            alpha: [0.0, 0.0, 0.0],
            beta: [1_000.0, 1.0, 10.0],
        });
        let mut requests = vec![RequestSpec::synthetic(0, 0, 100, 5_000)];
        requests.extend((1..600u64).map(|i| {
            RequestSpec::synthetic(i, i * 1_200, 20 + (i as u32 * 37) % 100, 1 + (i as u32 % 3))
        }));
        let mut fast = Engine::new(config.clone(), model.clone()).unwrap();
        for spec in requests.iter().filter(|r| r.arrival_us <= 400_000) {
            while fast.next_event_us().is_some_and(|t| t < spec.arrival_us) {
                fast.process_next_event();
                fast.check_invariants().unwrap();
            }
            fast.submit(spec.clone()).unwrap();
        }
        fast.run_until(400_000);
        fast.check_invariants().unwrap();
        let window = fast.lazy.as_ref().expect("the window is still open");
        assert!(window.compactions > 0, "positions were never renumbered");
        fast.run(
            requests.iter().filter(|r| r.arrival_us > 400_000).cloned(),
            u64::MAX,
        )
        .unwrap();
        let mut reference = Engine::new(config, model).unwrap();
        reference.set_reference_stepper(true);
        reference.run(requests, u64::MAX).unwrap();
        assert_eq!(fast.metrics().records, reference.metrics().records);
        assert_eq!(fast.kv().stats(), reference.kv().stats());
    }
}
