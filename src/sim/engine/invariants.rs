//! Invariant checks: cheap ones after every event in debug builds, a full audit on demand.

use std::collections::BTreeMap;

use super::Engine;
use crate::sim::kv::BlockTable;
use crate::sim::state::{PdMode, Phase, RequestState};

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
        let live: Vec<&RequestState> = self.slots.iter().flatten().collect();
        let transferring = self.check_phases(&live)?;
        let caught_up = self.check_running_blocks()?;
        Self::check_idle_blocks(&live, self.config.block_size)?;
        let waits_on_cluster = self.running.is_empty() && self.waits_on_cluster();
        if (!self.waiting.is_empty() || !self.running.is_empty())
            && !self.step_pending
            && !waits_on_cluster
        {
            return Err("work waits but no step is pending (work conservation)".to_owned());
        }
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

    /// The live requests' phases against the queues, the batch list, the transfers and the
    /// queued counter. Returns the number transferring.
    fn check_phases(&self, live: &[&RequestState]) -> Result<usize, String> {
        let count = |phase: Phase| live.iter().filter(|s| s.phase == phase).count();
        let waiting = count(Phase::Waiting);
        let running = count(Phase::Running);
        let arriving = count(Phase::Arriving);
        let transferring = count(Phase::Transferring);
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
        Ok(transferring)
    }

    /// Blocks cover every computed token and every token of the step in flight (a lazy
    /// window's members included: their stored progress lags by the window's steps, and a
    /// steady member's table by the crossings counted for it, caught up in a copy here).
    /// Returns those caught-up copies by slot, for the cache's audit.
    fn check_running_blocks(&self) -> Result<BTreeMap<u32, BlockTable>, String> {
        let batch = self.batch_entries();
        let mut caught_up = BTreeMap::new();
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
                caught_up.insert(slot, table);
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
        Ok(caught_up)
    }

    /// No request holds blocks unless running, transferring, or a decode half whose pull
    /// ended waiting with its reserved blocks (the prompt but its last token computed, or
    /// nothing if the pull failed), and such a half's blocks cover what it pulled.
    fn check_idle_blocks(live: &[&RequestState], block_size: u32) -> Result<(), String> {
        for state in live {
            let pulled_waiting = state.phase == Phase::Waiting
                && state.pd == PdMode::RemoteKv { pulled: true }
                && !state.blocks.is_empty();
            if pulled_waiting {
                let needed = state.num_computed.div_ceil(block_size);
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
        Ok(())
    }
}
