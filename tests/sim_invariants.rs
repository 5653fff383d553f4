//! Property test: random engine configs (down to caches so small they force preemption)
//! and random workloads; every invariant is audited after every event.
#![allow(clippy::unwrap_used)]

use ditto::catalog;
use ditto::sim::engine::ReachLog;
use ditto::sim::latency::{BlackboxCoefficients, LatencyKind, LatencyModel};
use ditto::sim::{Engine, EngineConfig, Outcome, RequestSpec, SchedulingPolicy, SloClass};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Scenario {
    config: EngineConfig,
    alpha: [f64; 3],
    /// Price steps with a context-dependent analytic model (the roofline, or the calibrated
    /// default when the request count is odd) instead of the blackbox.
    roofline: bool,
    requests: Vec<RequestSpec>,
}

fn config_strategy() -> impl Strategy<Value = EngineConfig> {
    (
        (2u32..300, prop::sample::select(vec![1u32, 4, 16])),
        (1u32..12, 8u32..600, 0u32..4),
        (
            any::<bool>(),
            any::<bool>(),
            0u32..3,
            prop::sample::select(vec![0u32, 6]),
        ),
        prop::sample::select(vec![0u32, 20, 64]),
    )
        .prop_map(
            |(
                (blocks, block_size),
                (seqs, budget, threshold_pick),
                (chunked, prefix, policy, cpu),
                max_len_cap,
            )| {
                let mut config = EngineConfig::vllm_defaults(
                    blocks,
                    if max_len_cap == 0 {
                        4096
                    } else {
                        4096 - max_len_cap
                    },
                );
                shape(
                    &mut config,
                    (block_size, seqs, budget),
                    ([0, 1, 7, 50][threshold_pick as usize], chunked),
                    (prefix, cpu, policy),
                );
                config.record_token_gaps = true;
                config
            },
        )
}

/// Sets the knobs both scenario strategies draw: (block size, max seqs, token budget),
/// (long-prefill threshold, chunked prefill), (prefix caching, CPU blocks, policy index).
fn shape(
    config: &mut EngineConfig,
    (block_size, seqs, budget): (u32, u32, u32),
    (threshold, chunked): (u32, bool),
    (prefix, cpu, policy): (bool, u32, u32),
) {
    config.block_size = block_size;
    config.max_num_seqs = seqs;
    config.max_num_batched_tokens = budget;
    config.long_prefill_token_threshold = threshold;
    config.enable_chunked_prefill = chunked;
    config.enable_prefix_caching = prefix || cpu > 0;
    config.num_cpu_blocks = cpu;
    config.cpu_block_load_us = 3;
    config.scheduling_policy = [
        SchedulingPolicy::Fcfs,
        SchedulingPolicy::Priority,
        SchedulingPolicy::Sjf,
    ][policy as usize];
    config.kv_sample_interval_us = 10_000;
}

/// (arrival gap, input, output, prefix (group, length), SLO class index, deadline offset).
type RawRequest = (u64, u32, u32, Option<(u64, u32)>, usize, Option<u64>);

fn request_strategy() -> impl Strategy<Value = RawRequest> {
    (
        0u64..3_000,
        1u32..300,
        0u32..80,
        prop::option::of((0u64..3, 0u32..200)),
        0usize..5,
        prop::option::weighted(0.2, 1_000u64..200_000),
    )
}

fn scenario_strategy() -> impl Strategy<Value = Scenario> {
    (
        config_strategy(),
        prop::sample::select(vec![[0.0, 0.0, 0.0], [200.0, 0.5, 20.0]]),
        prop::collection::vec(request_strategy(), 1..50),
    )
        .prop_map(|(config, alpha, raw)| {
            let mut arrival = 0;
            let requests = raw
                .into_iter()
                .enumerate()
                .map(|(id, (gap, input, output, prefix, class, deadline))| {
                    arrival += gap;
                    let mut spec = RequestSpec::synthetic(id as u64, arrival, input, output)
                        .with_class(SloClass::ALL[class]);
                    if let Some((group, len)) = prefix {
                        spec = spec.with_prefix(group, len);
                    }
                    spec.deadline_us = deadline.map(|d| arrival + d);
                    spec
                })
                .collect();
            Scenario {
                config,
                alpha,
                roofline: false,
                requests,
            }
        })
}

/// A busy instance: long decodes while new prompts keep arriving, so lazy decode windows run
/// with prefill chunks and admissions beside them, budgets bind mid-batch, and small caches
/// preempt.
fn busy_scenario_strategy() -> impl Strategy<Value = Scenario> {
    (
        (
            prop::sample::select(vec![40u32, 120, 400, 3_000]),
            prop::sample::select(vec![4u32, 16]),
            2u32..48,
            16u32..400,
        ),
        (
            prop::sample::select(vec![0u32, 24, 200]),
            any::<bool>(),
            0u32..3,
            prop::sample::select(vec![0u32, 6]),
        ),
        prop::collection::vec(
            (
                0u64..4_000,
                1u32..900,
                1u32..200,
                prop::option::of((0u64..3, 0u32..300)),
            ),
            5..60,
        ),
        any::<bool>(),
    )
        .prop_map(
            |(
                (blocks, block_size, seqs, budget),
                (threshold, prefix, policy, cpu),
                raw,
                roofline,
            )| {
                let mut config = EngineConfig::vllm_defaults(blocks, 4096);
                shape(
                    &mut config,
                    (block_size, seqs, budget),
                    (threshold, true),
                    (prefix, cpu, policy),
                );
                config.record_token_gaps = false;
                let mut arrival = 0;
                let requests = raw
                    .into_iter()
                    .enumerate()
                    .map(|(id, (gap, input, output, prefix))| {
                        arrival += gap;
                        let mut spec = RequestSpec::synthetic(id as u64, arrival, input, output);
                        spec.priority = (id % 3) as i32;
                        if let Some((group, len)) = prefix {
                            spec = spec.with_prefix(group, len);
                        }
                        spec
                    })
                    .collect();
                Scenario {
                    config,
                    alpha: [0.0, 0.0, 0.0],
                    roofline,
                    requests,
                }
            },
        )
}

/// The latency model `scenario` asks for.
fn scenario_model(scenario: &Scenario) -> LatencyModel {
    if scenario.roofline {
        analytic(kind_by_parity(scenario.requests.len()))
    } else {
        model(scenario.alpha)
    }
}

/// A fast-path engine for `scenario` with every request submitted (they arrive as their
/// times come).
fn submitted_up_front(scenario: &Scenario) -> Engine {
    let mut engine = Engine::new(scenario.config.clone(), scenario_model(scenario)).unwrap();
    for spec in &scenario.requests {
        engine.submit(spec.clone()).unwrap();
    }
    engine
}

/// Runs `scenario` with the fast paths and with the reference stepper.
fn fast_and_reference(scenario: &Scenario) -> (Engine, Engine) {
    let mut fast = Engine::new(scenario.config.clone(), scenario_model(scenario)).unwrap();
    fast.run(scenario.requests.clone(), 2_000_000).unwrap();
    let mut reference = Engine::new(scenario.config.clone(), scenario_model(scenario)).unwrap();
    reference.set_reference_stepper(true);
    reference.run(scenario.requests.clone(), 2_000_000).unwrap();
    (fast, reference)
}

/// The embedded `kind` model of llama-3.1-8b-instruct on one H100 (step times depend on
/// context; the calibrated one also has request overheads and a first-token delay).
fn analytic(kind: LatencyKind) -> LatencyModel {
    let arch = catalog::model("llama-3.1-8b-instruct").unwrap();
    let gpu = catalog::gpu("H100").unwrap();
    catalog::latency_model(kind, &arch, &gpu, 1).unwrap()
}

/// Roofline for an even request count, calibrated for an odd one.
fn kind_by_parity(count: usize) -> LatencyKind {
    if count.is_multiple_of(2) {
        LatencyKind::Roofline
    } else {
        LatencyKind::Calibrated
    }
}

fn model(alpha: [f64; 3]) -> LatencyModel {
    LatencyModel::Blackbox(BlackboxCoefficients {
        alpha,
        beta: [500.0, 2.0, 15.0],
    })
}

/// A newcomer (id 1,000,000) arriving `offset` µs after the `pick`-th request of
/// `scenario`, with (input, output, priority) and an optional (prefix group, length).
fn newcomer_after(
    scenario: &Scenario,
    pick: usize,
    offset: u64,
    (input, output, priority): (u32, u32, i32),
    prefix: Option<(u64, u32)>,
) -> (u64, RequestSpec) {
    let now = scenario.requests[pick % scenario.requests.len()].arrival_us + offset;
    let mut newcomer = RequestSpec::synthetic(1_000_000, now, input, output);
    newcomer.priority = priority;
    if let Some((group, len)) = prefix {
        newcomer = newcomer.with_prefix(group, len);
    }
    (now, newcomer)
}

/// Late entry: the run with `newcomer` submitted at `now` must equal the run without it,
/// copied just before the first event the newcomer changes (as its [`ReachLog`] finds it),
/// with the newcomer inserted there. Returns how many events past `now` the copy skipped
/// (`None` if the log found no such event).
fn late_entry_matches_submission(
    scenario: &Scenario,
    now: u64,
    newcomer: &RequestSpec,
) -> Option<u64> {
    let fresh = || submitted_up_front(scenario);
    let mut with = fresh();
    with.run_until(now);
    let events_at_now = with.events_processed();
    with.submit(newcomer.clone()).unwrap();
    with.run(std::iter::empty(), 2_000_000).unwrap();
    let mut without = fresh();
    if !without.fits_model_len(newcomer) {
        return None; // dropped at arrival: nothing to insert
    }
    let key = without.newcomer_queue_key(newcomer);
    let mut log = ReachLog::start(&without);
    while without.process_next_event().is_some() {
        log.observe(&without);
    }
    let enqueue_us = now + without.latency().queueing_us(newcomer.input_tokens);
    let policy = scenario.config.scheduling_policy;
    let skip = log.events_before_reach(now, enqueue_us, policy, key, u64::MAX)?;
    let mut late = fresh();
    for _ in 0..skip {
        late.process_next_event().unwrap();
    }
    late.insert_waiting(newcomer.clone(), enqueue_us).unwrap();
    late.check_invariants().unwrap();
    while late.process_next_event().is_some() {
        late.check_invariants().unwrap();
    }
    assert_eq!(late.metrics().records, with.metrics().records);
    assert_eq!(late.counts(), with.counts());
    assert_eq!(late.kv().stats(), with.kv().stats());
    assert_eq!(late.now_us(), with.now_us());
    Some(skip.saturating_sub(events_at_now))
}

/// Closed-form drains: wherever the engine offers one, its ends and step count must equal
/// running on to the end (and to a cut halfway). Returns how many drains were checked.
fn drains_match_running_on(scenario: &Scenario) -> u64 {
    let mut engine = submitted_up_front(scenario);
    let mut checked = 0;
    while engine.process_next_event().is_some() && checked < 3 {
        let Some(drain) = engine.drain(u64::MAX) else {
            continue;
        };
        let mut run = engine.clone();
        let (mut ends, mut steps, mut seen) = (Vec::new(), Vec::new(), run.metrics().records.len());
        while let Some(time) = run.process_next_event() {
            steps.push(time);
            for record in &run.metrics().records[seen..] {
                let end = ditto::sim::engine::DrainEnd {
                    id: record.id,
                    end_us: record.end_us,
                    finished_at_us: time,
                    token_gap_sum_us: record.token_gap_sum_us,
                };
                assert_eq!(engine.drained_record(&end).as_ref(), Some(record));
                ends.push(end);
            }
            seen = run.metrics().records.len();
        }
        let key = |end: &ditto::sim::engine::DrainEnd| (end.finished_at_us, end.id.0);
        let mut sorted = drain.ends.clone();
        sorted.sort_by_key(key);
        ends.sort_by_key(key);
        assert_eq!(sorted, ends, "drain ends differ from running on");
        let drained_times: Vec<u64> = drain.steps.iter().map(|step| step.end_us).collect();
        assert_eq!(drained_times, steps, "drain steps differ");
        // The reach log a stepped run leaves equals the one a drain leaves.
        let mut stepped_log = ReachLog::start(&engine);
        let mut replay = engine.clone();
        while replay.process_next_event().is_some() {
            stepped_log.observe(&replay);
        }
        let mut drained_log = ReachLog::start(&engine);
        drained_log.observe_drain(&engine, &drain);
        assert_eq!(drained_log, stepped_log, "drained reach log differs");
        let cut_us = steps[steps.len() / 2];
        let cut = engine.drain(cut_us).unwrap();
        let mut cut_ends = cut.ends.clone();
        cut_ends.sort_by_key(key);
        let expected: Vec<_> = ends
            .iter()
            .filter(|end| end.finished_at_us <= cut_us)
            .copied()
            .collect();
        assert_eq!(cut_ends, expected, "drain ends up to a cut differ");
        assert_eq!(
            cut.steps.len() as u64,
            steps.iter().filter(|&&t| t <= cut_us).count() as u64
        );
        checked += 1;
    }
    checked
}

/// Runs the scenario, auditing after every event; returns the engine.
fn run_audited(scenario: &Scenario) -> Engine {
    let mut engine = Engine::new(scenario.config.clone(), model(scenario.alpha)).unwrap();
    let mut pending = scenario.requests.iter().cloned().peekable();
    let mut last_time = 0;
    let mut events = 0u64;
    loop {
        if let Some(spec) =
            pending.next_if(|spec| engine.next_event_us().is_none_or(|t| spec.arrival_us <= t))
        {
            engine.submit(spec).unwrap();
            continue;
        }
        if engine.process_next_event().is_none() {
            break;
        }
        events += 1;
        assert!(events < 2_000_000, "no termination: livelock");
        assert!(engine.now_us() >= last_time, "clock went backwards");
        last_time = engine.now_us();
        if let Err(violation) = engine.check_invariants() {
            panic!("after event {events} at t={}: {violation}", engine.now_us());
        }
    }
    engine
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn invariants_hold_through_every_event(scenario in scenario_strategy()) {
        let engine = run_audited(&scenario);
        let counts = engine.counts();
        // Request conservation with nothing left in flight: everything finished somehow.
        prop_assert!(counts.is_conserved());
        prop_assert_eq!(counts.injected, scenario.requests.len() as u64);
        prop_assert_eq!(counts.queued + counts.running, 0);
        prop_assert_eq!(engine.kv().used_blocks(), 0, "blocks leaked");
        let records = &engine.metrics().records;
        prop_assert_eq!(records.len(), scenario.requests.len());
        for record in records {
            let spec = &scenario.requests[record.id.0 as usize];
            let mut last = record.arrival_us;
            for stamp in [record.enqueue_us, record.schedule_us, record.first_token_us].into_iter().flatten() {
                prop_assert!(stamp >= last, "causality broken in {:?}", record);
                last = stamp;
            }
            match record.outcome {
                Outcome::Completed => {
                    prop_assert!(record.end_us >= last);
                    prop_assert_eq!(record.output_tokens, spec.output_tokens.max(1));
                    prop_assert_eq!(record.token_gaps_us.len() as u32, record.output_tokens - 1);
                }
                Outcome::Dropped => prop_assert!(record.schedule_us.is_none()),
                Outcome::TimedOut => prop_assert_eq!(Some(record.end_us), spec.deadline_us),
                Outcome::Rejected => prop_assert!(false, "an engine never rejects"),
            }
        }
        // Token gaps: the aggregate map holds exactly the per-request gaps.
        let gap_total: u64 = engine.metrics().token_gap_counts.values().sum();
        let per_request: u64 = records.iter().map(|r| r.token_gaps_us.len() as u64).sum();
        prop_assert_eq!(gap_total, per_request);
    }

    #[test]
    fn invariants_hold_with_lazy_decode_windows(scenario in scenario_strategy()) {
        let mut scenario = scenario;
        scenario.config.record_token_gaps = false;
        let engine = run_audited(&scenario);
        let counts = engine.counts();
        prop_assert!(counts.is_conserved());
        prop_assert_eq!(counts.queued + counts.running, 0);
        prop_assert_eq!(engine.kv().used_blocks(), 0, "blocks leaked");
    }

    #[test]
    fn fast_paths_match_the_reference_stepper(scenario in scenario_strategy()) {
        // Without per-request gap lists, so lazy decode windows can open.
        let mut config = scenario.config.clone();
        config.record_token_gaps = false;
        let mut fast = Engine::new(config.clone(), model(scenario.alpha)).unwrap();
        fast.run(scenario.requests.clone(), 2_000_000).unwrap();
        let mut reference = Engine::new(config, model(scenario.alpha)).unwrap();
        reference.set_reference_stepper(true);
        reference.run(scenario.requests.clone(), 2_000_000).unwrap();
        prop_assert_eq!(&fast.metrics().records, &reference.metrics().records);
        prop_assert_eq!(&fast.metrics().token_gap_counts, &reference.metrics().token_gap_counts);
        prop_assert_eq!(fast.summary(), reference.summary());
        prop_assert_eq!(fast.kv().stats(), reference.kv().stats());
    }

    #[test]
    fn busy_mixed_windows_match_the_reference_stepper(scenario in busy_scenario_strategy()) {
        let (fast, reference) = fast_and_reference(&scenario);
        prop_assert_eq!(&fast.metrics().records, &reference.metrics().records);
        prop_assert_eq!(&fast.metrics().token_gap_counts, &reference.metrics().token_gap_counts);
        prop_assert_eq!(fast.summary(), reference.summary());
        prop_assert_eq!(fast.kv().stats(), reference.kv().stats());
        prop_assert_eq!(fast.counts(), reference.counts());
    }

    /// What an observer sees mid-run (the twin's view) does not depend on the fast paths:
    /// progress, steps in flight and cached keys, with windows open (and their keying of
    /// private blocks deferred) at the cut.
    #[test]
    fn observed_state_matches_the_reference_stepper(
        scenario in busy_scenario_strategy(),
        cut_fraction in 0.05f64..0.95,
    ) {
        let last = scenario.requests.last().map_or(0, |r| r.arrival_us);
        let cut = (last as f64 * cut_fraction) as u64 + 1;
        let observe_at_cut = |reference: bool| {
            let model = scenario_model(&scenario);
            let mut engine = Engine::new(scenario.config.clone(), model).unwrap();
            engine.set_reference_stepper(reference);
            for spec in scenario.requests.iter().filter(|r| r.arrival_us <= cut) {
                engine.run_before(spec.arrival_us);
                engine.submit(spec.clone()).unwrap();
            }
            engine.run_until(cut);
            engine.observe()
        };
        prop_assert_eq!(observe_at_cut(false), observe_at_cut(true));
    }

    /// A window that stays open for hundreds of admissions (long decoders, a stream of
    /// short requests) renumbers its batch positions along the way; results stay those of
    /// the reference stepper.
    #[test]
    fn long_lived_windows_match_the_reference_stepper(
        decoders in 1u32..6,
        stream in 200u64..500,
        gap in 500u64..6_000,
        budget in 64u32..600,
        roofline_pricing in any::<bool>(),
        prefix in any::<bool>(),
    ) {
        let mut config = EngineConfig::vllm_defaults(20_000, 8192);
        config.max_num_batched_tokens = budget;
        config.max_num_seqs = 64;
        config.enable_prefix_caching = prefix;
        config.kv_sample_interval_us = 0;
        let mut requests: Vec<RequestSpec> = (0..u64::from(decoders))
            .map(|id| RequestSpec::synthetic(id, 0, 100, 3_000))
            .collect();
        let first = requests.len() as u64;
        requests.extend((0..stream).map(|i| {
            RequestSpec::synthetic(first + i, 1_000 + i * gap, 20 + (i as u32 * 37) % 300, 1 + (i as u32 % 4))
        }));
        let scenario = Scenario { config, alpha: [0.0; 3], roofline: roofline_pricing, requests };
        let (fast, reference) = fast_and_reference(&scenario);
        prop_assert_eq!(&fast.metrics().records, &reference.metrics().records);
        prop_assert_eq!(&fast.metrics().token_gap_counts, &reference.metrics().token_gap_counts);
        prop_assert_eq!(fast.kv().stats(), reference.kv().stats());
        prop_assert!(fast.mixed_lazy_steps() > 0, "windows ran beside the stream");
    }

    #[test]
    fn late_entry_equals_submission(
        scenario in busy_scenario_strategy(),
        pick in 0usize..64,
        offset in 0u64..3_000,
        (input, output, priority) in (1u32..900, 1u32..200, 0i32..3),
        prefix in prop::option::of((0u64..3, 0u32..300)),
    ) {
        let (now, newcomer) =
            newcomer_after(&scenario, pick, offset, (input, output, priority), prefix);
        late_entry_matches_submission(&scenario, now, &newcomer);
    }

    #[test]
    fn late_entry_equals_submission_with_delays_and_deadlines(
        scenario in scenario_strategy(),
        pick in 0usize..64,
        offset in 0u64..3_000,
        (input, output, priority) in (1u32..300, 1u32..80, 0i32..3),
    ) {
        // Queueing delays (alpha) put the enqueue after `now`, possibly on a step's end;
        // other requests time out.
        let (now, newcomer) = newcomer_after(&scenario, pick, offset, (input, output, priority), None);
        late_entry_matches_submission(&scenario, now, &newcomer);
    }

    #[test]
    fn closed_form_drains_equal_running_on(scenario in busy_scenario_strategy()) {
        drains_match_running_on(&scenario);
    }

    #[test]
    fn same_input_same_output(scenario in scenario_strategy()) {
        let a = run_audited(&scenario);
        let b = run_audited(&scenario);
        prop_assert_eq!(&a.metrics().records, &b.metrics().records);
        prop_assert_eq!(a.summary(), b.summary());
    }
}

/// The random scenarios must actually reach the interesting paths, or the properties above
/// prove little: sample a fixed set and require preemptions, drops, timeouts, prefix hits
/// and CPU-tier reloads to all occur.
#[test]
fn swarm_reaches_every_path() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let strategy = scenario_strategy();
    let (mut preemptions, mut dropped, mut timed_out, mut hits, mut reloads) = (0, 0, 0, 0, 0);
    let mut lazy_steps = 0;
    let (mut steady_batched, mut steady_singly) = (0, 0);
    for _ in 0..200 {
        let scenario = strategy.new_tree(&mut runner).unwrap().current();
        let engine = run_audited(&scenario);
        let counts = engine.counts();
        preemptions += counts.preemptions;
        dropped += counts.dropped;
        timed_out += counts.timed_out;
        hits += engine.kv().stats().hit_tokens;
        reloads += engine.kv().stats().cpu_loaded_blocks;
        let mut config = scenario.config.clone();
        config.record_token_gaps = false;
        let mut fast = Engine::new(config, model(scenario.alpha)).unwrap();
        fast.run(scenario.requests.clone(), 2_000_000).unwrap();
        lazy_steps += fast.lazy_steps();
        steady_batched += fast.steady_crossings().batched;
        steady_singly += fast.steady_crossings().singly;
    }
    eprintln!("steady crossings: {steady_batched} batched, {steady_singly} one by one");
    assert!(
        lazy_steps > 1_000,
        "lazy decode windows barely exercised: {lazy_steps} steps"
    );
    // The busy scenarios must run mixed windows (prefills beside lazy decodes) and preempt.
    let busy = busy_scenario_strategy();
    let (mut mixed, mut busy_preemptions) = (0, 0);
    for _ in 0..100 {
        let scenario = busy.new_tree(&mut runner).unwrap().current();
        let (fast, _) = fast_and_reference(&scenario);
        mixed += fast.mixed_lazy_steps();
        busy_preemptions += fast.counts().preemptions;
    }
    assert!(
        mixed > 2_000,
        "mixed windows barely exercised: {mixed} steps"
    );
    assert!(busy_preemptions > 0, "busy scenarios never preempt");
    // Closed-form drains must be offered, and checked, in a good share of busy cases.
    let mut drains = 0;
    for _ in 0..60 {
        drains += drains_match_running_on(&busy.new_tree(&mut runner).unwrap().current());
    }
    eprintln!("drains: {drains} checked");
    assert!(drains > 30, "closed-form drains barely exercised: {drains}");
    // Late entries must skip real work past `now` in a good share of busy cases.
    let (mut skipped, mut entered) = (0, 0);
    for index in 0..60u64 {
        let scenario = busy.new_tree(&mut runner).unwrap().current();
        let now = scenario.requests[(index as usize * 7) % scenario.requests.len()].arrival_us;
        let newcomer = RequestSpec::synthetic(1_000_000, now, 300, 20);
        if let Some(events) = late_entry_matches_submission(&scenario, now, &newcomer) {
            entered += 1;
            skipped += events;
        }
    }
    eprintln!("late entries: {entered} cases, {skipped} events skipped");
    assert!(
        entered > 20 && skipped > 2_000,
        "late entries barely exercised: {entered} cases, {skipped} events skipped"
    );
    assert!(preemptions > 0, "no preemption exercised");
    assert!(dropped > 0, "no drop exercised");
    assert!(timed_out > 0, "no timeout exercised");
    assert!(hits > 0, "no prefix hit exercised");
    assert!(reloads > 0, "no CPU reload exercised");
    eprintln!(
        "swarm: {preemptions} preemptions, {dropped} drops, {timed_out} timeouts, {hits} hit tokens, {reloads} reloads"
    );
}

/// Found by `fast_paths_match_the_reference_stepper` in CI: one-token blocks, a cache of 213
/// with prefix caching on, six requests at once. The lazy windows must count evicted latent
/// keys exactly as the reference stepper's one-by-one steps do.
#[test]
fn lazy_windows_count_evictions_like_the_reference_stepper() {
    let mut config = EngineConfig::vllm_defaults(213, 4096);
    config.block_size = 1;
    config.max_num_seqs = 2;
    config.max_num_batched_tokens = 8;
    config.long_prefill_token_threshold = 1;
    config.enable_chunked_prefill = true;
    config.enable_prefix_caching = true;
    config.scheduling_policy = SchedulingPolicy::Priority;
    config.record_token_gaps = false;
    let requests: Vec<RequestSpec> = [(4, 5), (148, 33), (7, 71), (1, 0), (1, 0), (64, 0)]
        .into_iter()
        .enumerate()
        .map(|(id, (input, output))| RequestSpec::synthetic(id as u64, 0, input, output))
        .collect();
    let scenario = Scenario {
        config,
        alpha: [0.0; 3],
        roofline: false,
        requests,
    };
    let (fast, reference) = fast_and_reference(&scenario);
    assert_eq!(&fast.metrics().records, &reference.metrics().records);
    assert_eq!(fast.kv().stats(), reference.kv().stats());
}
