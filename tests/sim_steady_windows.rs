//! Property tests of a lazy window's steady members: decoders whose every block crossing is
//! the common one have their crossings counted in batches without touching their block
//! tables, which are caught up when read (a finish, the window's close, an observation, an
//! audit). The scenarios favour them (prefix caching on, long decodes, every block size)
//! and also break their batches: shared prefixes map keys (no batch then), tight caches run
//! out of blocks (a window closes mid-step and preempts), deadlines close windows. Every
//! outcome must equal the reference stepper's, and every invariant hold after every event.
#![allow(clippy::unwrap_used)]

use ditto::catalog;
use ditto::sim::latency::{BlackboxCoefficients, LatencyKind, LatencyModel};
use ditto::sim::{Engine, EngineConfig, RequestSpec, SchedulingPolicy};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Scenario {
    config: EngineConfig,
    /// 0: blackbox, 1: roofline, 2: calibrated (llama-3.1-8b-instruct on one H100).
    pricing: usize,
    requests: Vec<RequestSpec>,
}

fn model(pricing: usize) -> LatencyModel {
    if pricing == 0 {
        return LatencyModel::Blackbox(BlackboxCoefficients {
            alpha: [0.0, 0.0, 0.0],
            beta: [500.0, 2.0, 15.0],
        });
    }
    let kind = [LatencyKind::Roofline, LatencyKind::Calibrated][pricing - 1];
    let arch = catalog::model("llama-3.1-8b-instruct").unwrap();
    let gpu = catalog::gpu("H100").unwrap();
    catalog::latency_model(kind, &arch, &gpu, 1).unwrap()
}

/// (arrival gap, input, output, prefix (group, length), deadline offset).
type RawRequest = (u64, u32, u32, Option<(u64, u32)>, Option<u64>);

fn steady_scenario_strategy() -> impl Strategy<Value = Scenario> {
    let request = (
        0u64..30_000,
        1u32..400,
        1u32..500,
        prop::option::weighted(0.1, (0u64..3, 0u32..120)),
        prop::option::weighted(0.1, 20_000u64..2_000_000),
    );
    (
        (
            prop::sample::select(vec![1u32, 2, 4, 16]),
            prop::sample::select(vec![0.6f64, 0.9, 1.2, 2.0]),
            2u32..40,
            16u32..600,
        ),
        (0u32..3, prop::sample::select(vec![0u32, 12]), 0usize..3),
        prop::collection::vec(request, 10..50),
        any::<bool>(),
    )
        .prop_map(
            |((block_size, room, seqs, budget), (policy, cpu, pricing), raw, calm)| {
                let mut raw: Vec<RawRequest> = raw;
                if calm {
                    // Nothing but decoders: no shared prefix, no deadline, so batches hold.
                    for request in &mut raw {
                        (request.3, request.4) = (None, None);
                    }
                }
                // Room for `room` times the mean request's blocks per seat (up to 8 seats), at
                // least the longest request's: under 1 the cache runs out and preempts; a
                // small cache soon has no never-used block left, which batches need.
                let mean_tokens =
                    raw.iter().map(|r| u64::from(r.1 + r.2)).sum::<u64>() / raw.len() as u64;
                let per_seat = mean_tokens.div_ceil(u64::from(block_size));
                let blocks = (per_seat as f64 * f64::from(seqs.min(8)) * room) as u32;
                let longest = raw.iter().map(|r| r.1 + r.2).max().unwrap_or(1);
                let blocks = blocks.max(longest.div_ceil(block_size) + 2);
                let mut config = EngineConfig::vllm_defaults(blocks, 4096);
                config.block_size = block_size;
                config.max_num_seqs = seqs;
                config.max_num_batched_tokens = budget;
                config.enable_prefix_caching = true;
                config.num_cpu_blocks = cpu;
                config.cpu_block_load_us = 3;
                config.scheduling_policy = [
                    SchedulingPolicy::Fcfs,
                    SchedulingPolicy::Priority,
                    SchedulingPolicy::Sjf,
                ][policy as usize];
                config.kv_sample_interval_us = 10_000;
                // Windows open only without per-request gap lists.
                config.record_token_gaps = false;
                let mut arrival = 0;
                let requests = raw
                    .into_iter()
                    .enumerate()
                    .map(|(id, (gap, input, output, prefix, deadline))| {
                        arrival += gap;
                        let mut spec = RequestSpec::synthetic(id as u64, arrival, input, output);
                        spec.priority = (id % 3) as i32;
                        if let Some((group, len)) = prefix {
                            spec = spec.with_prefix(group, len.min(input));
                        }
                        spec.deadline_us = deadline.map(|d| arrival + d);
                        spec
                    })
                    .collect();
                Scenario {
                    config,
                    pricing,
                    requests,
                }
            },
        )
}

/// Runs `scenario` with the fast paths (auditing every invariant after every event when
/// `audit`) or with the reference stepper.
fn run(scenario: &Scenario, reference: bool, audit: bool) -> Engine {
    let mut engine = Engine::new(scenario.config.clone(), model(scenario.pricing)).unwrap();
    engine.set_reference_stepper(reference);
    if !audit {
        engine.run(scenario.requests.clone(), 5_000_000).unwrap();
        return engine;
    }
    let mut pending = scenario.requests.iter().peekable();
    let mut events = 0u64;
    loop {
        let next_event = engine.next_event_us();
        if let Some(spec) = pending.peek()
            && next_event.is_none_or(|t| spec.arrival_us <= t)
        {
            engine.submit((*spec).clone()).unwrap();
            pending.next();
            continue;
        }
        if engine.process_next_event().is_none() {
            break;
        }
        events += 1;
        assert!(events < 5_000_000, "no termination");
        if let Err(violation) = engine.check_invariants() {
            panic!("after event {events} at t={}: {violation}", engine.now_us());
        }
    }
    engine
}

/// An engine run from the start of `scenario` to `cut_fraction` of its arrivals' span (fed
/// only the requests arrived by then, as a mirror is), and that cut time.
fn at_cut(scenario: &Scenario, cut_fraction: f64, reference: bool) -> (Engine, u64) {
    let last = scenario.requests.last().map_or(0, |r| r.arrival_us);
    let cut = (last as f64 * cut_fraction) as u64 + 1;
    let mut engine = Engine::new(scenario.config.clone(), model(scenario.pricing)).unwrap();
    engine.set_reference_stepper(reference);
    for spec in scenario.requests.iter().filter(|r| r.arrival_us <= cut) {
        engine.run_before(spec.arrival_us);
        engine.submit(spec.clone()).unwrap();
    }
    engine.run_until(cut);
    (engine, cut)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn steady_windows_match_the_reference_stepper(scenario in steady_scenario_strategy()) {
        let fast = run(&scenario, false, false);
        let reference = run(&scenario, true, false);
        prop_assert_eq!(&fast.metrics().records, &reference.metrics().records);
        prop_assert_eq!(&fast.metrics().token_gap_counts, &reference.metrics().token_gap_counts);
        prop_assert_eq!(fast.summary(), reference.summary());
        prop_assert_eq!(fast.kv().stats(), reference.kv().stats());
        prop_assert_eq!(fast.counts(), reference.counts());
        prop_assert_eq!(fast.kv().free_keys_lru_first(), reference.kv().free_keys_lru_first());
        prop_assert_eq!(fast.kv().cpu_keys_lru_first(), reference.kv().cpu_keys_lru_first());
    }

    /// A copy of an engine whose window holds steady members (lagging tables), taken
    /// mid-run as a fork is, continues exactly as the original; switched to the reference
    /// stepper (the window closes, every table caught up) it ends as the reference does;
    /// and any drain offered on the way equals running on.
    #[test]
    fn steady_windows_fork_and_drain_exactly(
        scenario in steady_scenario_strategy(),
        cut_fraction in 0.05f64..0.95,
    ) {
        let (engine, cut) = at_cut(&scenario, cut_fraction, false);
        let rest: Vec<RequestSpec> =
            scenario.requests.iter().filter(|r| r.arrival_us > cut).cloned().collect();
        let finish = |mut engine: Engine| {
            engine.run(rest.clone(), 5_000_000).unwrap();
            engine
        };
        let mut switched = engine.clone();
        switched.set_reference_stepper(true);
        let (original, copy, switched) = (finish(engine.clone()), finish(engine.clone()), finish(switched));
        for other in [&copy, &switched] {
            prop_assert_eq!(&original.metrics().records, &other.metrics().records);
            prop_assert_eq!(original.kv().stats(), other.kv().stats());
            prop_assert_eq!(original.kv().free_keys_lru_first(), other.kv().free_keys_lru_first());
            prop_assert_eq!(original.kv().cpu_keys_lru_first(), other.kv().cpu_keys_lru_first());
        }
        // Drains: wherever the run offers one, its ends equal running on.
        let mut probe = engine;
        let mut checked = 0;
        while probe.process_next_event().is_some() && checked < 2 {
            let Some(drain) = probe.drain(u64::MAX) else { continue };
            let mut run = probe.clone();
            let seen = run.metrics().records.len();
            while run.process_next_event().is_some() {}
            let mut ran: Vec<(u64, u64)> = run.metrics().records[seen..]
                .iter()
                .map(|record| (record.id.0, record.end_us))
                .collect();
            let mut drained: Vec<(u64, u64)> =
                drain.ends.iter().map(|end| (end.id.0, end.end_us)).collect();
            ran.sort_unstable();
            drained.sort_unstable();
            prop_assert_eq!(drained, ran);
            checked += 1;
        }
    }

}

proptest! {
    // (An audit after every event is slow in a debug build: fewer cases.)
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    #[test]
    fn steady_windows_keep_every_invariant(scenario in steady_scenario_strategy()) {
        let engine = run(&scenario, false, true);
        let counts = engine.counts();
        prop_assert!(counts.is_conserved());
        prop_assert_eq!(counts.queued + counts.running, 0);
        prop_assert_eq!(engine.kv().used_blocks(), 0, "blocks leaked");
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn steady_windows_are_observed_as_the_reference_stepper_is(
        scenario in steady_scenario_strategy(),
        cut_fraction in 0.05f64..0.95,
    ) {
        let observe_at_cut = |reference: bool| at_cut(&scenario, cut_fraction, reference).0.observe();
        prop_assert_eq!(observe_at_cut(false), observe_at_cut(true));
    }
}

/// The scenarios above must reach both ways of counting steady crossings, with every block
/// size, or they prove little: sample a fixed set and require many batched crossings and
/// some taken one by one (a batch without room: keys mapped, or the cache short).
#[test]
fn steady_paths_are_reached() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let strategy = steady_scenario_strategy();
    let mut by_block_size = std::collections::BTreeMap::new();
    let (mut singly, mut on_close, mut preemptions) = (0, 0, 0);
    for _ in 0..60 {
        let scenario = strategy.new_tree(&mut runner).unwrap().current();
        let engine = run(&scenario, false, false);
        let counts = engine.steady_crossings();
        *by_block_size
            .entry(scenario.config.block_size)
            .or_insert(0u64) += counts.batched;
        singly += counts.singly;
        on_close += counts.caught_up_on_close;
        preemptions += engine.counts().preemptions;
    }
    eprintln!(
        "steady crossings batched by block size {by_block_size:?}, {singly} one by one, \
         {on_close} caught up on a close, {preemptions} preemptions"
    );
    assert_eq!(by_block_size.len(), 4, "every block size sampled");
    for (block_size, batched) in &by_block_size {
        assert!(*batched > 300, "block size {block_size}: {batched} batched");
    }
    assert!(
        singly > 50,
        "steady crossings one by one barely exercised: {singly}"
    );
    assert!(
        on_close > 0,
        "no window closed after counting steady crossings"
    );
    assert!(preemptions > 0, "no preemption");
}
