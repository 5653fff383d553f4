//! The autoscaled cluster (docs/autoscaling.md): randomized loads, policies and bounds must
//! keep every request (none lost when a replica is removed), never route to a replica
//! before its warm-up ends or after its removal, hold the replica bounds, and draw each
//! warm-up from its range.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use ditto::cluster::autoscale::{
    AutoscaleConfig, Objectives, Policy, PolicyOutcome, PolicyRun, SlotState, WarmUp, run_policy,
};
use ditto::cluster::config::{
    AdmissionPolicy, ClusterConfig, InstanceConfig, InstanceRole, RoutingPolicy, StalenessConfig,
};
use ditto::sim::latency::{BlackboxCoefficients, LatencyModel};
use ditto::sim::{EngineConfig, RequestRecord, RequestSpec};
use proptest::prelude::*;

fn base(routing: RoutingPolicy, max_num_seqs: u32) -> ClusterConfig {
    let mut engine = EngineConfig::vllm_defaults(4_000, 100_000);
    engine.max_num_seqs = max_num_seqs;
    engine.kv_sample_interval_us = 0;
    ClusterConfig {
        instances: vec![InstanceConfig {
            id: "pool-0".into(),
            model: "test".into(),
            model_config_json: None,
            gpu: "test".into(),
            tp: 1,
            role: InstanceRole::Both,
            engine,
            // 2 ms + 10 µs per prefill token + 0.5 ms per decoding sequence.
            latency: LatencyModel::Blackbox(BlackboxCoefficients {
                alpha: [0.0, 0.0, 0.0],
                beta: [2_000.0, 10.0, 500.0],
            }),
            cost_per_hour: 2.0,
        }],
        routing,
        admission: AdmissionPolicy::Always,
        staleness: StalenessConfig::uniform(50_000),
    }
}

/// Requests at piecewise-constant rates (deterministic spacing with a jitter from `seed`).
fn load(stages: &[(f64, u64)], seed: u64) -> Vec<RequestSpec> {
    let mut requests = Vec::new();
    let mut start_us = 0u64;
    let mut state = seed | 1;
    for &(rate, seconds) in stages {
        let gap = (1e6 / rate) as u64;
        let end = start_us + seconds * 1_000_000;
        let mut at = start_us;
        while at < end {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let input = 16 + (state % 400) as u32;
            let output = 2 + ((state >> 20) % 120) as u32;
            requests.push(RequestSpec::synthetic(
                requests.len() as u64,
                at,
                input,
                output,
            ));
            at += gap / 2 + state % gap.max(1);
        }
        start_us = end;
    }
    requests
}

fn config(policy: &Policy, min: u32, max: u32, warm: (u64, u64)) -> AutoscaleConfig {
    let mut config = AutoscaleConfig::with_defaults(
        min,
        max,
        Objectives {
            ttft_us: 200_000.0,
            tpot_us: 20_000.0,
        },
    );
    config.warm_up = WarmUp {
        min_us: warm.0 * 1_000_000,
        max_us: warm.1 * 1_000_000,
    };
    config.sync_period_us = 5_000_000;
    config.hpa.scale_up.stabilization_us = 0;
    config.hpa.scale_down.stabilization_us = 20_000_000;
    config.policies = vec![policy.clone()];
    config
}

/// Each slot's state at a request's arrival: the last change strictly before it (a change
/// takes effect after the events at its own time), or a change at time 0 (the start).
fn state_at(changes: &[(u64, SlotState)], at_us: u64) -> SlotState {
    changes
        .iter()
        .rev()
        .find(|(t, _)| *t < at_us || *t == 0)
        .map_or(SlotState::Off, |(_, s)| *s)
}

fn check(
    outcome: &PolicyOutcome,
    seen: &[(usize, RequestRecord)],
    config: &AutoscaleConfig,
    requests: usize,
) {
    // Conservation: every request submitted is accounted for once, and seen leaving once.
    assert_eq!(outcome.requests, requests as u64);
    assert!(outcome.counts.is_conserved(), "{:?}", outcome.counts);
    assert_eq!(outcome.counts.injected, requests as u64);
    assert_eq!(outcome.finished, requests as u64);
    let mut ids: Vec<_> = seen.iter().map(|(_, r)| r.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), requests, "a request left twice or never");
    // Nothing lost: these loads never time out, reject or drop a request.
    assert_eq!(outcome.completed, requests as u64, "{:?}", outcome.counts);
    // Warm-up respected: a request only ever ran on a ready slot at its arrival.
    let mut by_slot: HashMap<usize, Vec<(u64, SlotState)>> = HashMap::new();
    for change in &outcome.changes {
        by_slot
            .entry(change.slot)
            .or_default()
            .push((change.at_us, change.state));
    }
    for (slot, record) in seen {
        let changes = by_slot.get(slot).map_or(&[][..], |c| &c[..]);
        assert_eq!(
            state_at(changes, record.arrival_us),
            SlotState::Ready,
            "request {:?} arrived at {} on slot {slot}: {changes:?}",
            record.id,
            record.arrival_us
        );
    }
    // Each warm-up is drawn from its range and ends exactly when drawn (or is cancelled).
    for changes in by_slot.values() {
        for pair in changes.windows(2) {
            if let (t, SlotState::Warming { ready_at_us }) = pair[0] {
                let span = ready_at_us - t;
                assert!(span >= config.warm_up.min_us && span <= config.warm_up.max_us);
                let (next_at, next) = pair[1];
                assert!(
                    (next == SlotState::Ready && next_at == ready_at_us)
                        || (next == SlotState::Off && next_at <= ready_at_us),
                    "{pair:?}"
                );
            }
            // A slot leaves only drained: Draining → Off, never Draining → Ready.
            if pair[0].1 == SlotState::Draining {
                assert_eq!(pair[1].1, SlotState::Off);
            }
        }
    }
    // Bounds: the HPA's count and the pods asked for stay within min..=max.
    let (min, max) = (config.hpa.min_replicas, config.hpa.max_replicas);
    for sample in &outcome.timeline {
        assert!((min..=max).contains(&sample.desired), "{sample:?}");
        assert!(sample.ready <= max);
    }
    let mut states: HashMap<usize, SlotState> = HashMap::new();
    let mut index = 0;
    let changes = &outcome.changes;
    while index < changes.len() {
        let at = changes[index].at_us;
        while index < changes.len() && changes[index].at_us == at {
            states.insert(changes[index].slot, changes[index].state);
            index += 1;
        }
        let asked = states
            .values()
            .filter(|s| matches!(s, SlotState::Ready | SlotState::Warming { .. }))
            .count() as u32;
        assert!(asked <= max, "{asked} pods asked for at {at}");
    }
}

fn routing(index: u8) -> RoutingPolicy {
    match index % 3 {
        0 => RoutingPolicy::RoundRobin,
        1 => RoutingPolicy::LeastLoaded,
        _ => RoutingPolicy::llm_d_default(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20, .. ProptestConfig::default() })]

    #[test]
    fn autoscaled_cluster_keeps_requests_and_respects_warm_up_and_bounds(
        policy_index in 0usize..5,
        route in 0u8..3,
        min in 1u32..3,
        extra in 0u32..4,
        warm_min in 1u64..20,
        warm_extra in 0u64..15,
        low in 5.0f64..30.0,
        high in 40.0f64..160.0,
        seed in any::<u64>(),
    ) {
        let max = min + extra;
        let policy = Policy::by_name(Policy::NAMES[policy_index]).unwrap();
        let policy = match policy {
            Policy::Predictive { utilization, .. } => Policy::Predictive {
                horizon_us: (warm_min + warm_extra) * 1_000_000,
                utilization,
            },
            other => other,
        };
        let config = config(&policy, min, max, (warm_min, warm_min + warm_extra));
        let requests = load(&[(low, 40), (high, 60), (low, 60), (high, 30)], seed);
        let count = requests.len();
        let mut seen = Vec::new();
        let outcome = run_policy(
            &PolicyRun {
                base: &base(routing(route), 8),
                config: &config,
                policy: &policy,
                capacity: 20.0,
                seed,
                max_events: u64::MAX,
            },
            requests,
            &mut |slot, record| seen.push((slot, record.clone())),
        )
        .unwrap();
        check(&outcome, &seen, &config, count);
    }
}

#[test]
fn a_reactive_policy_scales_up_under_a_burst_and_back_down_after() {
    let policy = Policy::by_name("queue-depth").unwrap();
    let config = config(&policy, 1, 6, (10, 10));
    let requests = load(&[(10.0, 30), (200.0, 90), (5.0, 300)], 3);
    let count = requests.len();
    let mut seen = Vec::new();
    let outcome = run_policy(
        &PolicyRun {
            base: &base(RoutingPolicy::LeastLoaded, 8),
            config: &config,
            policy: &policy,
            capacity: 20.0,
            seed: 3,
            max_events: u64::MAX,
        },
        requests,
        &mut |slot, record| seen.push((slot, record.clone())),
    )
    .unwrap();
    check(&outcome, &seen, &config, count);
    assert!(outcome.peak_replicas >= 3, "{outcome:?}");
    assert!(
        outcome.pods_removed >= 2,
        "scaled back down: {}",
        outcome.pods_removed
    );
    assert!(outcome.scale_ups >= 1 && outcome.scale_downs >= 1);
    // Requests ran on replicas added during the burst.
    assert!(seen.iter().any(|(slot, _)| *slot > 0));
    // Replica-hours are the integral of the pods held: between min and max for the run.
    let hours = outcome.duration_s / 3600.0;
    assert!(outcome.replica_hours > hours && outcome.replica_hours < 6.0 * hours);
}

#[test]
fn a_static_pool_holds_its_size_and_bills_it() {
    let policy = Policy::Static { replicas: Some(3) };
    let config = config(&policy, 1, 4, (5, 5));
    let requests = load(&[(20.0, 60)], 9);
    let count = requests.len();
    let mut seen = Vec::new();
    let outcome = run_policy(
        &PolicyRun {
            base: &base(RoutingPolicy::RoundRobin, 8),
            config: &config,
            policy: &policy,
            capacity: 20.0,
            seed: 9,
            max_events: u64::MAX,
        },
        requests,
        &mut |slot, record| seen.push((slot, record.clone())),
    )
    .unwrap();
    check(&outcome, &seen, &config, count);
    assert_eq!(outcome.pods_added + outcome.pods_removed, 0);
    let expected = 3.0 * outcome.duration_s / 3600.0;
    assert!((outcome.replica_hours - expected).abs() < 1e-9 * expected.max(1.0));
    assert!((outcome.cost - 2.0 * outcome.replica_hours).abs() < 1e-9);
    // Round robin over 3 ready slots: each got a third.
    let mut per_slot = [0usize; 3];
    for (slot, _) in &seen {
        per_slot[*slot] += 1;
    }
    assert!(
        per_slot.iter().all(|&n| n.abs_diff(count / 3) <= 1),
        "{per_slot:?}"
    );
}
