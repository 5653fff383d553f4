//! The KV-offload connector's share of a step: the stores its scheduler makes for the step
//! formed now, and the host time they cost (`crate::sim::kv::offload_store` has vLLM's rules).
//!
//! The connector's scheduler runs at the end of every `schedule()` over every scheduled
//! request, so the store is made here for the step just formed, with each request's full
//! blocks counted as once the step is computed (`num_computed_tokens + num_scheduled`).
//! Lazy decode windows stay closed while a connector is configured: a window does not form
//! its steps one request at a time, and every step can change what the tier holds.

use super::Engine;
use crate::sim::config::OffloadConnector;
use crate::sim::kv::OffloadStore;
use crate::sim::latency::us_trunc_from_f64;

impl Engine {
    /// Makes the connector's stores for the batch in `in_flight` and returns the host side
    /// of the step, µs: the tier entries walked, the failed stores and the scheduler's own
    /// work per scheduled request, at the connector's prices. 0 without a connector.
    #[inline]
    pub(super) fn store_offloads(&mut self) -> u64 {
        match self.config.offload_connector {
            Some(connector) => self.store_offloads_priced(connector),
            None => 0,
        }
    }

    #[cold]
    #[inline(never)]
    fn store_offloads_priced(&mut self, connector: OffloadConnector) -> u64 {
        let Some(store) = self.offload.as_mut() else {
            return 0;
        };
        let block_size = self.config.block_size;
        let (mut walked, mut failed) = (0u64, 0u64);
        for entry in &self.in_flight {
            let Some(state) = self.slots[entry.slot as usize].as_mut() else {
                continue;
            };
            let full_blocks = (state.num_computed + entry.new_tokens) / block_size;
            state.ensure_keys(full_blocks, block_size);
            let keys = state.block_keys(block_size);
            let work = store.store(state.spec.id.0, full_blocks, keys.shareable, |index| {
                keys.get(index)
            });
            walked += work.walked;
            failed += u64::from(work.failed);
        }
        let scheduled = self.in_flight.len() as f64;
        us_trunc_from_f64(
            (walked as f64 * connector.walk_ns_per_entry
                + failed as f64 * connector.failed_store_ns
                + scheduled * connector.scheduler_ns_per_request)
                / 1000.0,
        )
    }
}

/// Request `id` left the engine: its stores complete (out of line: the common engine has
/// no connector).
#[cold]
#[inline(never)]
pub(super) fn finished(store: &mut Option<OffloadStore>, id: u64) {
    if let Some(store) = store.as_mut() {
        store.finish(id);
    }
}

/// Request `id` was preempted: its stores so far complete.
#[cold]
#[inline(never)]
pub(super) fn preempted(store: &mut Option<OffloadStore>, id: u64) {
    if let Some(store) = store.as_mut() {
        store.preempted(id);
    }
}
