//! Invariant checks: cheap ones after every event in debug builds, a full audit on demand.

use super::Engine;
use crate::sim::kv::BlockTable;
use crate::sim::state::{PdMode, Phase};

impl Engine {
    /// O(1) checks run after every event in debug builds: request conservation and KV block
    /// conservation by counters.
    pub(super) fn debug_check_counters(&self) {
        debug_assert!(
            self.counts.is_conserved(),
            "request conservation broken: {:?}",
            self.counts
        );
        debug_assert_eq!(
            self.kv.free_blocks() + self.kv.used_blocks(),
            self.kv.total_blocks(),
            "KV block conservation broken"
        );
        debug_assert_eq!(
            self.counts.running as usize,
            self.running.len(),
            "running count drifted"
        );
    }

    /// Audits every invariant by walking the whole state: request conservation, phases
    /// agreeing with the queues, KV refcounts matching the requests' block tables, free list
    /// integrity, and no blocks used when no request runs. Returns the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        if !self.counts.is_conserved() {
            return Err(format!("request conservation broken: {:?}", self.counts));
        }
        let live: Vec<_> = self.slots.iter().flatten().collect();
        let waiting = live.iter().filter(|s| s.phase == Phase::Waiting).count();
        let running = live.iter().filter(|s| s.phase == Phase::Running).count();
        let arriving = live.iter().filter(|s| s.phase == Phase::Arriving).count();
        let transferring = live
            .iter()
            .filter(|s| s.phase == Phase::Transferring)
            .count();
        if transferring != self.transferring_count() {
            return Err(format!(
                "{transferring} transferring requests but {} transfers listed",
                self.transferring_count()
            ));
        }
        if waiting != self.waiting.len() {
            return Err(format!(
                "{waiting} waiting requests but {} queued",
                self.waiting.len()
            ));
        }
        if running != self.running.len() {
            return Err(format!(
                "{running} running requests but {} in the batch list",
                self.running.len()
            ));
        }
        // Arriving requests not yet injected (future arrivals) are not counted anywhere.
        // Transferring requests count as queued (vLLM lists them as waiting).
        let counted_queued = self.counts.queued as usize;
        let waiting_or_transferring = waiting + transferring;
        if counted_queued < waiting_or_transferring
            || counted_queued > waiting_or_transferring + arriving
        {
            return Err(format!(
                "queued count {counted_queued} vs {waiting} waiting + {transferring} \
                 transferring + {arriving} arriving"
            ));
        }
        // Blocks cover every computed token and every token of the step in flight (a lazy
        // window's members included: their stored progress lags by the window's steps, and a
        // steady member's table by the crossings counted for it, caught up in a copy here).
        let batch = self.batch_entries();
        let mut caught_up = Vec::new();
        for &slot in &self.running {
            let state = self.state(slot);
            let scheduled: u32 = batch
                .iter()
                .filter(|entry| entry.slot == slot)
                .map(|entry| entry.new_tokens)
                .sum();
            let tokens = state.num_computed + self.lazy_delta(slot) + scheduled;
            if state.lagging_blocks {
                if self.lazy.is_none() || state.lazy_base_step.is_none() {
                    return Err(format!(
                        "request {:?}'s table lags outside a window",
                        state.spec.id
                    ));
                }
                let mut table = state.blocks.clone();
                self.kv
                    .catch_up_crossings(&mut table, state.owner_seed, tokens);
                caught_up.push((slot, table));
                continue;
            }
            let needed = tokens.div_ceil(self.config.block_size);
            if state.blocks.len() < needed {
                return Err(format!(
                    "request {:?} computed or scheduled {tokens} tokens with only {} blocks",
                    state.spec.id,
                    state.blocks.len()
                ));
            }
        }
        for state in &live {
            // A decode half whose pull ended waits holding its reserved blocks (the prompt
            // but its last token computed, or nothing if the pull failed).
            let pulled_waiting = state.phase == Phase::Waiting
                && state.pd == PdMode::RemoteKv { pulled: true }
                && !state.blocks.is_empty();
            if pulled_waiting {
                let needed = state.num_computed.div_ceil(self.config.block_size);
                if state.blocks.len() < needed {
                    return Err(format!(
                        "request {:?} pulled {} tokens into {} blocks",
                        state.spec.id,
                        state.num_computed,
                        state.blocks.len()
                    ));
                }
            }
            if !matches!(state.phase, Phase::Running | Phase::Transferring)
                && !pulled_waiting
                && !state.blocks.is_empty()
            {
                return Err(format!(
                    "request {:?} holds blocks while not running",
                    state.spec.id
                ));
            }
        }
        let waits_on_cluster = self.running.is_empty() && self.waits_on_cluster();
        if (!self.waiting.is_empty() || !self.running.is_empty())
            && !self.step_pending
            && !waits_on_cluster
        {
            return Err("work waits but no step is pending (work conservation)".to_owned());
        }
        let caught_up: std::collections::BTreeMap<u32, BlockTable> =
            caught_up.into_iter().collect();
        let tables = self.slots.iter().enumerate().filter_map(|(slot, state)| {
            let state = state.as_ref()?;
            Some(caught_up.get(&(slot as u32)).unwrap_or(&state.blocks))
        });
        // Held prefill KV is used until pulled: no block of it is free.
        self.kv.check(tables.chain(self.held_tables()))?;
        let holding_waiters = live
            .iter()
            .any(|s| s.phase == Phase::Waiting && !s.blocks.is_empty());
        if self.running.is_empty()
            && transferring == 0
            && !holding_waiters
            && self.held_pull_blocks() == 0
            && self.kv.used_blocks() != 0
        {
            return Err(format!(
                "{} blocks used with nothing running",
                self.kv.used_blocks()
            ));
        }
        Ok(())
    }
}
