//! vLLM's KV-offload connector in the engine: its failed stores' tier walks cost host time
//! that shows once it is longer than the GPU step (vLLM 0.15.1's `OffloadingConnector`,
//! `LRUOffloadingManager.prepare_store`; `src/sim/kv/offload_store.rs`), hand-checked on
//! tiny scenarios.
#![allow(clippy::unwrap_used)]

use ditto::sim::latency::{BlackboxCoefficients, LatencyModel};
use ditto::sim::{Engine, EngineConfig, OffloadConnector, RequestId, RequestSpec};

/// Step = 1000 µs + 1 µs per prefill token + 10 µs per decode token; no overheads.
fn linear_model() -> LatencyModel {
    LatencyModel::Blackbox(BlackboxCoefficients {
        alpha: [0.0, 0.0, 0.0],
        beta: [1000.0, 1.0, 10.0],
    })
}

fn config(connector: Option<OffloadConnector>) -> EngineConfig {
    let mut config = EngineConfig::vllm_defaults(1_000, 8192);
    config.kv_sample_interval_us = 0;
    config.offload_connector = connector;
    config
}

/// Runs `requests` to the end, auditing the invariants after every event; returns each
/// request's E2E, by id.
fn e2e_by_id(config: EngineConfig, requests: &[RequestSpec]) -> Vec<u64> {
    let mut engine = Engine::new(config, linear_model()).unwrap();
    for spec in requests {
        engine.submit(spec.clone()).unwrap();
    }
    while engine.process_next_event().is_some() {
        engine.check_invariants().unwrap();
    }
    assert_eq!(engine.kv().used_blocks(), 0, "blocks leaked");
    (0..requests.len() as u64)
        .map(|id| {
            let record = engine
                .metrics()
                .records
                .iter()
                .find(|r| r.id == RequestId(id))
                .unwrap();
            record.e2e_us().unwrap()
        })
        .collect()
}

const MS_PER_ENTRY: OffloadConnector = OffloadConnector {
    cpu_blocks: 4,
    walk_ns_per_entry: 1_000_000.0,
    failed_store_ns: 0.0,
    scheduler_ns_per_request: 0.0,
};

#[test]
fn stores_that_find_the_tier_full_of_running_requests_blocks_make_the_steps_host_bound() {
    // Two 32-token prompts (two blocks each) fill the 4-block tier at their prefill. From
    // the 17th step on each has a third block to store (32 + 16 tokens), finds nothing
    // evictable (both still run), walks all 4 entries and fails, every step until both end
    // at step 20: 4 steps of 2 x 4 entries at 1 ms an entry = 8 ms, where the GPU step is
    // 1000 + 2 x 10 µs.
    let requests = [
        RequestSpec::synthetic(0, 0, 32, 20),
        RequestSpec::synthetic(1, 0, 32, 20),
    ];
    let without = e2e_by_id(config(None), &requests);
    let with = e2e_by_id(config(Some(MS_PER_ENTRY)), &requests);
    for id in 0..2 {
        assert_eq!(with[id] - without[id], 4 * (8_000 - 1_020), "request {id}");
    }
}

#[test]
fn a_finished_request_s_blocks_make_room_so_later_stores_cost_nothing_visible() {
    // Request 0 ends at step 17 (its one failing step: 2 x 4 entries); its blocks turn
    // evictable, so request 1's stores at steps 18 and 33 each evict one of them, the least
    // recently used ready entry, which vLLM's walk finds first (1 ms, under the 1010 µs
    // GPU step of one decode): every later step is the GPU's again.
    let requests = [
        RequestSpec::synthetic(0, 0, 32, 17),
        RequestSpec::synthetic(1, 0, 32, 40),
    ];
    let without = e2e_by_id(config(None), &requests);
    let with = e2e_by_id(config(Some(MS_PER_ENTRY)), &requests);
    assert_eq!(with[0] - without[0], 8_000 - 1_020);
    assert_eq!(with[1] - without[1], 8_000 - 1_020);
}

#[test]
fn the_scheduler_s_own_work_is_counted_on_the_same_host_side() {
    // With a tier that never fills, the host side is the scheduler's own work alone:
    // 2 ms a scheduled request, two requests, 4 ms a step, longer than every GPU step
    // (1000 + 64 µs for the two prefills, 1000 + 2 x 10 µs a decode): all twenty steps last
    // 4 ms.
    let requests = [
        RequestSpec::synthetic(0, 0, 32, 20),
        RequestSpec::synthetic(1, 0, 32, 20),
    ];
    let busy_scheduler = OffloadConnector {
        cpu_blocks: 100_000,
        walk_ns_per_entry: 0.0,
        failed_store_ns: 0.0,
        scheduler_ns_per_request: 2_000_000.0,
    };
    let without = e2e_by_id(config(None), &requests);
    let with = e2e_by_id(config(Some(busy_scheduler)), &requests);
    for id in 0..2 {
        assert_eq!(without[id], 1_064 + 19 * 1_020, "request {id}");
        assert_eq!(with[id], 20 * 4_000, "request {id}");
    }
}

#[test]
fn a_tier_that_never_fills_changes_nothing() {
    // Stepping one step at a time (a connector keeps the lazy decode windows closed) gives
    // the records the windows give.
    let requests: Vec<RequestSpec> = (0..24)
        .map(|id| RequestSpec::synthetic(id, id * 700, 40 + 13 * (id as u32 % 7), 30 + id as u32))
        .collect();
    let roomy = OffloadConnector {
        cpu_blocks: 100_000,
        ..MS_PER_ENTRY
    };
    assert_eq!(
        e2e_by_id(config(Some(roomy)), &requests),
        e2e_by_id(config(None), &requests)
    );
}

#[test]
fn a_connector_without_a_tier_or_with_a_bad_price_is_refused_by_name() {
    let empty = OffloadConnector {
        cpu_blocks: 0,
        ..MS_PER_ENTRY
    };
    let err = Engine::new(config(Some(empty)), linear_model()).unwrap_err();
    assert!(
        err.to_string().contains("offload_connector.cpu_blocks"),
        "{err}"
    );
    let negative = OffloadConnector {
        walk_ns_per_entry: -1.0,
        ..MS_PER_ENTRY
    };
    let err = Engine::new(config(Some(negative)), linear_model()).unwrap_err();
    assert!(
        err.to_string()
            .contains("offload_connector.walk_ns_per_entry"),
        "{err}"
    );
}
