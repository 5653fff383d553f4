//! Unit cases of the engine's vLLM v1 semantics, each on a tiny hand-checked scenario.
#![allow(clippy::unwrap_used)]

use ditto::sim::latency::{BlackboxCoefficients, LatencyModel};
use ditto::sim::{
    Engine, EngineConfig, Outcome, RequestId, RequestRecord, RequestSpec, SchedulingPolicy,
    SloClass,
};

/// Step = 1000 µs + 1 µs per prefill token + 10 µs per decode token; no overheads.
fn linear_model() -> LatencyModel {
    LatencyModel::Blackbox(BlackboxCoefficients {
        alpha: [0.0, 0.0, 0.0],
        beta: [1000.0, 1.0, 10.0],
    })
}

fn config(num_gpu_blocks: u32) -> EngineConfig {
    let mut config = EngineConfig::vllm_defaults(num_gpu_blocks, 8192);
    config.kv_sample_interval_us = 0;
    config
}

fn engine(config: EngineConfig) -> Engine {
    Engine::new(config, linear_model()).unwrap()
}

/// Runs `requests` to the end, auditing every invariant after every event.
fn run_checked(engine: &mut Engine, requests: Vec<RequestSpec>) {
    for spec in requests {
        engine.run_before(spec.arrival_us);
        engine.submit(spec).unwrap();
    }
    let mut last = engine.now_us();
    let mut guard = 0;
    while engine.process_next_event().is_some() {
        assert!(engine.now_us() >= last, "clock went backwards");
        last = engine.now_us();
        engine.check_invariants().unwrap();
        guard += 1;
        assert!(guard < 1_000_000, "livelock");
    }
    engine.check_invariants().unwrap();
    assert_eq!(engine.kv().used_blocks(), 0, "blocks leaked");
}

fn record(engine: &Engine, id: u64) -> &RequestRecord {
    engine
        .metrics()
        .records
        .iter()
        .find(|r| r.id == RequestId(id))
        .unwrap()
}

/// Advances until a step is in flight and returns its (id, tokens) list.
fn next_batch(engine: &mut Engine) -> Vec<(u64, u32)> {
    loop {
        engine.process_next_event().unwrap();
        let batch = engine.batch_in_flight();
        if !batch.is_empty() {
            return batch.into_iter().map(|(id, n)| (id.0, n)).collect();
        }
    }
}

#[test]
fn token_budget_and_chunked_prefill() {
    let mut engine = engine(config(10_000));
    for id in 0..3 {
        engine
            .submit(RequestSpec::synthetic(id, 0, 1000, 4))
            .unwrap();
    }
    // 2048 tokens: two whole prompts and a 48-token chunk of the third.
    assert_eq!(next_batch(&mut engine), vec![(0, 1000), (1, 1000), (2, 48)]);
    // Next step: two decodes and the rest of the third prompt up to the budget.
    engine.process_next_event().unwrap();
    assert_eq!(engine.batch_in_flight().len(), 3);
    let batch: Vec<_> = engine
        .batch_in_flight()
        .into_iter()
        .map(|(i, n)| (i.0, n))
        .collect();
    assert_eq!(batch, vec![(0, 1), (1, 1), (2, 952)]);
}

#[test]
fn max_num_seqs_limits_admission() {
    let mut cfg = config(10_000);
    cfg.max_num_seqs = 2;
    let mut engine = engine(cfg);
    for id in 0..4 {
        engine.submit(RequestSpec::synthetic(id, 0, 10, 4)).unwrap();
    }
    assert_eq!(next_batch(&mut engine), vec![(0, 10), (1, 10)]);
    assert_eq!(engine.num_waiting(), 2);
}

#[test]
fn long_prefill_threshold_caps_chunks() {
    let mut cfg = config(10_000);
    cfg.long_prefill_token_threshold = 300;
    let mut engine = engine(cfg);
    engine
        .submit(RequestSpec::synthetic(0, 0, 1000, 4))
        .unwrap();
    engine.submit(RequestSpec::synthetic(1, 0, 100, 4)).unwrap();
    assert_eq!(next_batch(&mut engine), vec![(0, 300), (1, 100)]);
}

#[test]
fn prefill_without_chunking_waits_for_a_whole_budget() {
    let mut cfg = config(10_000);
    cfg.enable_chunked_prefill = false;
    let mut engine = engine(cfg);
    engine
        .submit(RequestSpec::synthetic(0, 0, 1500, 4))
        .unwrap();
    engine
        .submit(RequestSpec::synthetic(1, 0, 1000, 4))
        .unwrap();
    assert_eq!(next_batch(&mut engine), vec![(0, 1500)]);
}

#[test]
fn fcfs_preempts_the_tail_and_admits_nothing_that_step() {
    // 8 blocks of 16 tokens. A and B (48-token prompts, 3 blocks each) fill 8 blocks once
    // both decode into their 4th block; A's 5th block then forces B (the tail) out.
    let mut engine = engine(config(8));
    engine.submit(RequestSpec::synthetic(0, 0, 48, 40)).unwrap();
    engine.submit(RequestSpec::synthetic(1, 0, 48, 40)).unwrap();
    engine.submit(RequestSpec::synthetic(2, 1, 16, 2)).unwrap();
    let mut saw_preemption = false;
    while engine.process_next_event().is_some() {
        let counts = engine.counts();
        if counts.preemptions == 1 && !saw_preemption {
            saw_preemption = true;
            // The preempting step holds only A: B is back at the queue's front, and the
            // waiting request 2 was not admitted in the same step.
            let batch: Vec<u64> = engine
                .batch_in_flight()
                .iter()
                .map(|(id, _)| id.0)
                .collect();
            assert_eq!(batch, vec![0]);
            assert_eq!(engine.waiting_ids().first(), Some(&RequestId(1)));
        }
        engine.check_invariants().unwrap();
    }
    assert!(saw_preemption);
    assert_eq!(record(&engine, 0).preemptions, 0);
    assert_eq!(record(&engine, 1).preemptions, 1);
    assert_eq!(engine.counts().completed, 3);
}

#[test]
fn preempted_request_hits_its_own_blocks_lazily() {
    let mut engine = engine(config(8));
    engine.submit(RequestSpec::synthetic(0, 0, 48, 40)).unwrap();
    engine.submit(RequestSpec::synthetic(1, 0, 48, 40)).unwrap();
    while engine.counts().preemptions == 0 {
        engine.process_next_event().unwrap();
    }
    let hits_before = engine.kv().stats().hit_tokens;
    run_checked(&mut engine, vec![]);
    // B freed its four keyed blocks tail first, so A's growth to 6 blocks reused (and
    // evicted) B's 4th and 3rd blocks; B's first two blocks kept their keys on the free list
    // and B hit them when it came back: exactly 32 tokens.
    assert_eq!(engine.kv().stats().hit_tokens - hits_before, 32);
    // Preemption keeps generated tokens: no token is produced twice.
    assert_eq!(record(&engine, 1).output_tokens, 40);
    assert_eq!(
        engine.metrics().token_gap_counts.values().sum::<u64>(),
        2 * 39
    );
}

#[test]
fn priority_preempts_the_least_urgent_latest_arrival() {
    let mut cfg = config(12);
    cfg.scheduling_policy = SchedulingPolicy::Priority;
    let mut engine = engine(cfg);
    // Three 48-token prompts (3 blocks each) growing to 6 blocks: the cache of 12 runs out.
    engine
        .submit(RequestSpec::synthetic(0, 0, 48, 40).with_class(SloClass::Batch))
        .unwrap();
    engine
        .submit(RequestSpec::synthetic(1, 0, 48, 40).with_class(SloClass::Critical))
        .unwrap();
    engine
        .submit(RequestSpec::synthetic(2, 1, 48, 40).with_class(SloClass::Batch))
        .unwrap();
    while engine.counts().preemptions == 0 {
        engine.process_next_event().unwrap();
    }
    // Requests 0 and 2 share the least urgent priority; 2 arrived later, so it goes first.
    assert!(engine.waiting_ids().contains(&RequestId(2)));
    assert!(engine.running_ids().contains(&RequestId(0)));
    assert!(engine.running_ids().contains(&RequestId(1)));
    run_checked(&mut engine, vec![]);
    assert_eq!(
        record(&engine, 1).preemptions,
        0,
        "the critical request is never the victim"
    );
}

#[test]
fn priority_policy_orders_the_wait_queue() {
    let mut cfg = config(10_000);
    cfg.scheduling_policy = SchedulingPolicy::Priority;
    cfg.max_num_seqs = 1;
    let mut engine = engine(cfg);
    engine
        .submit(RequestSpec::synthetic(0, 0, 10, 1).with_class(SloClass::Background))
        .unwrap();
    engine
        .submit(RequestSpec::synthetic(1, 0, 10, 1).with_class(SloClass::Batch))
        .unwrap();
    engine
        .submit(RequestSpec::synthetic(2, 0, 10, 1).with_class(SloClass::Critical))
        .unwrap();
    run_checked(&mut engine, vec![]);
    let order: Vec<u64> = engine.metrics().records.iter().map(|r| r.id.0).collect();
    assert_eq!(order, vec![2, 1, 0]);
}

#[test]
fn sjf_serves_short_prompts_first() {
    let mut cfg = config(10_000);
    cfg.scheduling_policy = SchedulingPolicy::Sjf;
    cfg.max_num_seqs = 1;
    let mut engine = engine(cfg);
    engine.submit(RequestSpec::synthetic(0, 0, 300, 1)).unwrap();
    engine.submit(RequestSpec::synthetic(1, 0, 100, 1)).unwrap();
    engine.submit(RequestSpec::synthetic(2, 0, 200, 1)).unwrap();
    run_checked(&mut engine, vec![]);
    let order: Vec<u64> = engine.metrics().records.iter().map(|r| r.id.0).collect();
    assert_eq!(order, vec![1, 2, 0]);
}

#[test]
fn prefix_group_shares_blocks_across_requests() {
    let mut engine = engine(config(10_000));
    run_checked(
        &mut engine,
        vec![
            RequestSpec::synthetic(0, 0, 200, 4).with_prefix(9, 128),
            RequestSpec::synthetic(1, 100_000, 200, 4).with_prefix(9, 128),
            RequestSpec::synthetic(2, 200_000, 200, 4).with_prefix(10, 128),
        ],
    );
    assert_eq!(record(&engine, 0).cached_tokens, 0);
    assert_eq!(record(&engine, 1).cached_tokens, 128);
    assert_eq!(
        record(&engine, 2).cached_tokens,
        0,
        "another group shares nothing"
    );
    let summary = engine.summary();
    assert!((summary.prefix_cache_hit_rate - 128.0 / 600.0).abs() < 1e-12);
}

#[test]
fn same_step_admissions_hit_blocks_keyed_at_schedule_time() {
    // vLLM keys blocks when it allocates them, so a second request admitted in the same
    // step already hits the first one's prefix.
    let mut engine = engine(config(10_000));
    engine
        .submit(RequestSpec::synthetic(0, 0, 200, 2).with_prefix(1, 160))
        .unwrap();
    engine
        .submit(RequestSpec::synthetic(1, 0, 200, 2).with_prefix(1, 160))
        .unwrap();
    assert_eq!(next_batch(&mut engine), vec![(0, 200), (1, 40)]);
}

#[test]
fn full_prefix_hit_still_computes_the_last_token() {
    let mut engine = engine(config(10_000));
    let first = RequestSpec::synthetic(0, 0, 64, 2).with_prefix(3, 64);
    let second = RequestSpec::synthetic(1, 1_000_000, 64, 2).with_prefix(3, 64);
    run_checked(&mut engine, vec![first, second]);
    // 64 tokens = 4 full blocks, but only 3 can be hit: the last block is recomputed.
    assert_eq!(record(&engine, 1).cached_tokens, 48);
}

#[test]
fn oversized_request_dropped_exact_fit_accepted() {
    let mut engine = engine(EngineConfig::vllm_defaults(10_000, 100));
    run_checked(
        &mut engine,
        vec![
            RequestSpec::synthetic(0, 0, 60, 41),
            RequestSpec::synthetic(1, 0, 60, 40),
        ],
    );
    assert_eq!(record(&engine, 0).outcome, Outcome::Dropped);
    assert_eq!(record(&engine, 1).outcome, Outcome::Completed);
    let counts = engine.counts();
    assert_eq!((counts.dropped, counts.completed), (1, 1));
}

#[test]
fn request_larger_than_the_cache_is_dropped() {
    // 4 blocks hold 64 tokens: a sequence of 65 can never fit.
    let mut engine = engine(config(4));
    run_checked(
        &mut engine,
        vec![
            RequestSpec::synthetic(0, 0, 60, 5),
            RequestSpec::synthetic(1, 0, 60, 4),
        ],
    );
    assert_eq!(record(&engine, 0).outcome, Outcome::Dropped);
    assert_eq!(record(&engine, 1).outcome, Outcome::Completed);
}

#[test]
fn zero_output_request_records_ttft_before_e2e() {
    let mut engine = engine(config(100));
    run_checked(&mut engine, vec![RequestSpec::synthetic(0, 0, 32, 0)]);
    let rec = record(&engine, 0);
    assert_eq!(rec.outcome, Outcome::Completed);
    assert_eq!(rec.output_tokens, 1);
    let ttft = rec.ttft_us().unwrap();
    assert_eq!(ttft, 1000 + 32, "one prefill step");
    assert!(ttft <= rec.e2e_us().unwrap());
}

#[test]
fn work_conserving_restart_after_idle() {
    let mut engine = engine(config(100));
    run_checked(
        &mut engine,
        vec![
            RequestSpec::synthetic(0, 0, 16, 2),
            RequestSpec::synthetic(1, 50_000, 16, 2),
        ],
    );
    let second = record(&engine, 1);
    assert_eq!(
        second.schedule_us,
        Some(50_000),
        "an idle engine starts a step at once"
    );
    assert_eq!(second.ttft_us(), Some(1016));
}

#[test]
fn timeline_adds_output_overheads_like_blis() {
    // alpha2 = 100 µs per token is added to TTFT and to every gap.
    let model = LatencyModel::Blackbox(BlackboxCoefficients {
        alpha: [500.0, 0.0, 100.0],
        beta: [1000.0, 0.0, 0.0],
    });
    let mut engine = Engine::new(config(100), model).unwrap();
    run_checked(&mut engine, vec![RequestSpec::synthetic(0, 0, 16, 3)]);
    let rec = record(&engine, 0);
    assert_eq!(rec.enqueue_us, Some(500));
    assert_eq!(rec.ttft_us(), Some(500 + 1000 + 100));
    assert_eq!(rec.e2e_us(), Some(500 + 1000 + 100 + 2 * (1000 + 100)));
}

#[test]
fn deadline_times_out_waiting_and_running_requests() {
    let mut cfg = config(10_000);
    cfg.max_num_seqs = 1;
    let mut engine = engine(cfg);
    let mut slow = RequestSpec::synthetic(0, 0, 16, 1000);
    slow.deadline_us = Some(5_000);
    let mut stuck = RequestSpec::synthetic(1, 0, 16, 10);
    stuck.deadline_us = Some(3_000);
    run_checked(&mut engine, vec![slow, stuck]);
    assert_eq!(record(&engine, 0).outcome, Outcome::TimedOut);
    assert_eq!(record(&engine, 1).outcome, Outcome::TimedOut);
    assert_eq!(record(&engine, 1).end_us, 3_000);
    assert_eq!(engine.counts().timed_out, 2);
}

#[test]
fn cpu_tier_reloads_evicted_prefix_at_a_cost() {
    let mut cfg = config(6);
    cfg.num_cpu_blocks = 16;
    cfg.cpu_block_load_us = 7;
    let mut engine = engine(cfg);
    // Request 0 caches a 64-token prefix (4 blocks); request 1 (unrelated) evicts it from the
    // 6-block GPU; request 2 of 0's group reloads 3 blocks from the CPU tier.
    run_checked(
        &mut engine,
        vec![
            RequestSpec::synthetic(0, 0, 80, 2).with_prefix(5, 64),
            RequestSpec::synthetic(1, 100_000, 80, 2),
            RequestSpec::synthetic(2, 200_000, 80, 2).with_prefix(5, 64),
        ],
    );
    assert_eq!(record(&engine, 2).cached_tokens, 64);
    assert!(engine.kv().stats().cpu_loaded_blocks >= 1);
    // TTFT = one step over 16 new tokens + reload cost of the CPU-resident blocks.
    let loaded = engine.kv().stats().cpu_loaded_blocks;
    assert_eq!(record(&engine, 2).ttft_us(), Some(1000 + 16 + 7 * loaded));
}

#[test]
fn forked_engine_continues_identically() {
    let requests: Vec<RequestSpec> = (0..200)
        .map(|i| {
            RequestSpec::synthetic(
                i,
                i * 3_000,
                100 + (i as u32 * 37) % 900,
                1 + (i as u32 * 13) % 300,
            )
            .with_prefix(i % 4, 64)
        })
        .collect();
    let mut engine = engine(config(400));
    let (first, rest) = requests.split_at(120);
    for spec in first.iter().cloned() {
        engine.run_before(spec.arrival_us);
        engine.submit(spec).unwrap();
    }
    let mut fork = engine.clone();
    engine.run(rest.iter().cloned(), u64::MAX).unwrap();
    fork.run(rest.iter().cloned(), u64::MAX).unwrap();
    assert_eq!(engine.metrics().records, fork.metrics().records);
    assert_eq!(engine.summary(), fork.summary());
    assert!(
        engine.counts().preemptions > 0,
        "the scenario should exercise preemption"
    );
}

#[test]
fn heavy_thrashing_still_terminates() {
    // A burst far beyond a tiny cache: constant preemption, yet every request finishes.
    for policy in [
        SchedulingPolicy::Fcfs,
        SchedulingPolicy::Priority,
        SchedulingPolicy::Sjf,
    ] {
        let mut cfg = config(60);
        cfg.scheduling_policy = policy;
        cfg.max_num_seqs = 64;
        let requests: Vec<RequestSpec> = (0..300u64)
            .map(|i| {
                let class = SloClass::ALL[(i % 5) as usize];
                RequestSpec::synthetic(
                    i,
                    i * 100,
                    200 + (i as u32 * 7) % 200,
                    100 + (i as u32 * 11) % 200,
                )
                .with_class(class)
            })
            .collect();
        let mut engine = engine(cfg);
        engine.run(requests, 5_000_000).unwrap();
        let counts = engine.counts();
        assert_eq!(counts.completed, 300, "{policy:?}");
        assert!(
            counts.preemptions > 100,
            "{policy:?}: {} preemptions",
            counts.preemptions
        );
        engine.check_invariants().unwrap();
        assert_eq!(engine.kv().used_blocks(), 0);
    }
}

#[test]
fn reference_stepper_matches_on_the_reference_workload() {
    let mut fast = ditto::bench::reference_engine().unwrap();
    fast.run(ditto::bench::reference_requests(3_000).unwrap(), u64::MAX)
        .unwrap();
    let mut reference = ditto::bench::reference_engine().unwrap();
    reference.set_reference_stepper(true);
    reference
        .run(ditto::bench::reference_requests(3_000).unwrap(), u64::MAX)
        .unwrap();
    assert_eq!(fast.metrics().records, reference.metrics().records);
    assert_eq!(fast.summary(), reference.summary());
    assert!(
        fast.lazy_steps() > 1_000,
        "lazy windows: {} steps",
        fast.lazy_steps()
    );
    assert_eq!(reference.lazy_steps(), 0);
}

#[test]
fn client_timeouts_under_overload_abort_queued_and_running_requests() {
    // Goal: past the knee, a client timeout aborts requests wherever they are (waiting or in
    // the batch mid-decode), frees their KV blocks and counts them timed out, with every
    // invariant holding after every event. Method: 60 requests of 200 tokens (over 200 ms
    // each) arriving every 0.1 ms at a one-sequence engine, each abandoned 50 ms after it
    // arrived: the first runs until its timeout, the next is admitted and aborted mid-step,
    // the rest time out while waiting; a short request afterwards completes.
    let mut cfg = config(40);
    cfg.max_num_seqs = 1;
    let mut engine = engine(cfg);
    let mut requests: Vec<RequestSpec> = (0..60)
        .map(|i| {
            let mut spec = RequestSpec::synthetic(i, i * 100, 100, 200);
            spec.deadline_us = Some(i * 100 + 50_000);
            spec
        })
        .collect();
    let mut short = RequestSpec::synthetic(60, 400_000, 16, 2);
    short.deadline_us = Some(400_000 + 50_000);
    requests.push(short);
    run_checked(&mut engine, requests);
    let counts = engine.counts();
    assert_eq!(counts.injected, 61, "{counts:?}");
    assert_eq!(counts.completed, 1, "{counts:?}");
    assert_eq!(counts.timed_out, 60, "{counts:?}");
    let records = &engine.metrics().records;
    // Some were abandoned mid-decode (they had a first token), some while still waiting.
    let running = records
        .iter()
        .filter(|r| r.outcome == Outcome::TimedOut && r.first_token_us.is_some())
        .count();
    let waiting = records
        .iter()
        .filter(|r| r.outcome == Outcome::TimedOut && r.schedule_us.is_none())
        .count();
    assert!(
        running > 0 && waiting > 0,
        "{running} running, {waiting} waiting"
    );
    for r in records.iter().filter(|r| r.outcome == Outcome::TimedOut) {
        assert_eq!(r.end_us, r.arrival_us + 50_000, "abandoned at its timeout");
    }
    assert_eq!(record(&engine, 60).outcome, Outcome::Completed);
}

#[test]
fn an_engine_keeping_no_records_summarises_the_same() {
    // Goal: `keep_request_records` off keeps 32 bytes of samples per completed request
    // instead of a record, and the summary is the same to the bit. Method: one workload
    // with every way of leaving (completed, preempted then completed, dropped, timed out
    // waiting and running) run twice, with and without records.
    let requests = || -> Vec<RequestSpec> {
        (0..300u64)
            .map(|i| {
                let input = 16 + (i * 37 % 300) as u32;
                let output = 1 + (i * 53 % 120) as u32;
                let mut spec = RequestSpec::synthetic(i, i * 900, input, output);
                if i % 7 == 0 {
                    spec.deadline_us = Some(i * 900 + 40_000);
                }
                if i == 150 {
                    // Larger than the whole cache: dropped at arrival.
                    spec.input_tokens = 5_000;
                }
                spec
            })
            .collect()
    };
    let run = |keep: bool| {
        let mut cfg = config(80);
        cfg.keep_request_records = keep;
        let mut engine = engine(cfg);
        run_checked(&mut engine, requests());
        engine
    };
    let (with, without) = (run(true), run(false));
    let counts = with.counts();
    assert!(
        counts.completed > 0 && counts.timed_out > 0 && counts.dropped > 0,
        "{counts:?}"
    );
    assert!(counts.preemptions > 0, "{counts:?}");
    assert_eq!(with.summary(), without.summary());
    assert!(without.metrics().records.is_empty());
    assert_eq!(
        without.metrics().samples.e2e_us.len() as u64,
        counts.completed
    );
    assert!(with.metrics().samples.e2e_us.is_empty());
}
