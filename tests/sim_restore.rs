//! Restoring an engine from observed state: the restored copy continues exactly like the
//! original (the basis of every twin prediction), and bad state is refused with the field.
#![allow(clippy::unwrap_used)]

use ditto::catalog;
use ditto::sim::engine::{RestoreState, RestoredRequest};
use ditto::sim::latency::{BatchEntry, BlackboxCoefficients, LatencyKind, LatencyModel};
use ditto::sim::{Engine, EngineConfig, Outcome, RequestSpec, SimError};

fn model() -> LatencyModel {
    LatencyModel::Blackbox(BlackboxCoefficients {
        alpha: [0.0, 0.0, 0.0],
        beta: [800.0, 3.0, 20.0],
    })
}

/// Longest a finished request's end can trail its last engine step in these runs: the
/// calibrated default's first-token delay (one decode step at this workload's batches) plus
/// its post-decode time, with room.
const CLIENT_LAG_US: u64 = 100_000;

fn config() -> EngineConfig {
    let mut config = EngineConfig::vllm_defaults(50_000, 100_000);
    config.max_num_seqs = 24;
    config.max_num_batched_tokens = 512;
    config.kv_sample_interval_us = 0;
    config
}

fn workload() -> Vec<RequestSpec> {
    (0..400u64)
        .map(|i| {
            RequestSpec::synthetic(
                i,
                i * 9_000,
                40 + (i as u32 * 131) % 1500,
                1 + (i as u32 * 29) % 300,
            )
            .with_prefix(i % 4, 256)
        })
        .collect()
}

/// Runs the original with `model` to `cut` (every event at or before it), observes, restores, then feeds
/// both the remaining arrivals; returns (original, restored).
fn split_run_with(cut: u64, model: LatencyModel) -> (Engine, Engine) {
    let requests = workload();
    let (before, after): (Vec<_>, Vec<_>) = requests.into_iter().partition(|r| r.arrival_us <= cut);
    let mut original = Engine::new(config(), model.clone()).unwrap();
    for spec in before {
        original.run_before(spec.arrival_us);
        original.submit(spec).unwrap();
    }
    original.run_until(cut);
    let observed = original.observe();
    assert!(
        !observed.running.is_empty(),
        "the cut should catch requests mid-flight"
    );
    assert!(observed.step_end_us.is_some(), "and a step in flight");
    let mut restored = Engine::restore(config(), model, observed).unwrap();
    original.run(after.clone(), u64::MAX).unwrap();
    restored.run(after, u64::MAX).unwrap();
    (original, restored)
}

#[test]
fn restored_engine_continues_exactly() {
    for cut in [1_000_000, 1_234_567, 2_500_001] {
        assert_continues_exactly(cut, model());
    }
}

#[test]
fn restored_engine_continues_exactly_with_request_overheads() {
    // Goal: a request observed between its arrival and the scheduler's queue (the latency
    // model's queueing delay: HTTP, tokenization) joins the queue when it would have, not at
    // the restore. Method: a blackbox model with a 5 ms queueing delay (arrivals every 9 ms,
    // so some cuts catch one in flight) and the calibrated default, whose request overheads
    // (queueing, first-token delay, post-decode) are all non-zero.
    let queueing = LatencyModel::Blackbox(BlackboxCoefficients {
        alpha: [5_000.0, 0.0, 0.0],
        beta: [800.0, 3.0, 20.0],
    });
    let arch = catalog::model("llama-3.1-8b-instruct").unwrap();
    let gpu = catalog::gpu("H100").unwrap();
    let calibrated = catalog::latency_model(LatencyKind::Calibrated, &arch, &gpu, 1).unwrap();
    for model in [queueing, calibrated] {
        for cut in [1_000_000, 1_234_567, 2_500_001, 3_001_000, 3_604_000] {
            assert_continues_exactly(cut, model.clone());
        }
    }
}

#[test]
fn a_request_observed_before_its_enqueue_joins_the_queue_when_it_would_have() {
    // Goal: a request observed between arrival and the scheduler's queue (queueing delay)
    // is not scheduled earlier after a restore. Method: an idle engine with a 5 ms queueing
    // delay, two arrivals, a cut before either reaches the queue; the restored copy must
    // schedule and finish them at the original's times.
    let model = LatencyModel::Blackbox(BlackboxCoefficients {
        alpha: [5_000.0, 0.0, 0.0],
        beta: [800.0, 3.0, 20.0],
    });
    let specs = [
        RequestSpec::synthetic(1, 0, 300, 20),
        RequestSpec::synthetic(2, 1_000, 200, 10),
    ];
    let mut original = Engine::new(config(), model.clone()).unwrap();
    for spec in specs {
        original.submit(spec).unwrap();
    }
    original.run_until(2_000);
    let observed = original.observe();
    assert_eq!(observed.waiting.len(), 2, "both arrived, neither scheduled");
    let mut restored = Engine::restore(config(), model, observed).unwrap();
    original.run(Vec::new(), u64::MAX).unwrap();
    restored.run(Vec::new(), u64::MAX).unwrap();
    let ends = |engine: &Engine| -> Vec<(u64, u64, Option<u64>)> {
        engine
            .metrics()
            .records
            .iter()
            .map(|r| (r.id.0, r.end_us, r.ttft_us()))
            .collect()
    };
    assert_eq!(ends(&original), ends(&restored));
    restored.check_invariants().unwrap();
}

fn assert_continues_exactly(cut: u64, model: LatencyModel) {
    {
        let (original, restored) = split_run_with(cut, model);
        // Records are in completion order; the restored engine knows only the requests not
        // yet finished at the cut. One that finished its last step before the cut can still
        // reach its client after it (the model's first-token delay, which later tokens
        // inherit, and its post-decode time), so "finished before" is by the engine's
        // retirement, not by the client's end: the original's records the restored engine
        // does not have, a prefix of them, all ended by the cut plus that client-side lag.
        let restored_ids: Vec<_> = restored.metrics().records.iter().map(|r| r.id).collect();
        let finished_before = original
            .metrics()
            .records
            .iter()
            .take_while(|r| !restored_ids.contains(&r.id))
            .count();
        for record in &original.metrics().records[..finished_before] {
            assert!(
                record.end_us <= cut + CLIENT_LAG_US,
                "cut {cut}: {:?} ended at {} but is not in the restored engine",
                record.id,
                record.end_us
            );
        }
        let tail: Vec<_> = original.metrics().records[finished_before..].to_vec();
        let restored_records = &restored.metrics().records;
        assert_eq!(tail.len(), restored_records.len(), "cut {cut}");
        for (a, b) in tail.iter().zip(restored_records) {
            assert_eq!(a.id, b.id, "cut {cut}: completion order");
            assert_eq!(a.end_us, b.end_us, "cut {cut}: request {:?}", a.id);
            assert_eq!(a.output_tokens, b.output_tokens);
            assert_eq!(a.outcome, Outcome::Completed);
            if a.arrival_us > cut {
                // Requests arriving after the cut are simulated identically in every detail.
                assert_eq!(a, b);
            }
        }
        assert_eq!(original.now_us(), restored.now_us());
        restored.check_invariants().unwrap();
        assert_eq!(restored.kv().used_blocks(), 0);
    }
}

fn request(id: u64, computed: u32, generated: u32, output: u32) -> RestoredRequest {
    RestoredRequest {
        spec: RequestSpec::synthetic(id, 0, 100, output),
        computed_tokens: computed,
        generated,
        cached_tokens: 0,
        scheduled_tokens: 0,
        client_lag_us: 0,
    }
}

#[test]
fn inconsistent_state_is_refused_with_the_field() {
    let base = RestoreState {
        now_us: 1_000,
        ..RestoreState::default()
    };
    let cases: Vec<(RestoreState, &str)> = vec![
        (
            RestoreState {
                running: vec![request(1, 100, 0, 10)],
                ..base.clone()
            },
            "computed_tokens",
        ),
        (
            RestoreState {
                running: vec![request(1, 105, 5, 5)],
                ..base.clone()
            },
            "output_tokens",
        ),
        (
            RestoreState {
                waiting: vec![request(1, 10, 0, 10)],
                ..base.clone()
            },
            "computed_tokens",
        ),
        (
            RestoreState {
                cached_keys: (0..60_000).collect(),
                ..base.clone()
            },
            "cached_blocks",
        ),
        (
            RestoreState {
                running: vec![request(1, 50, 0, 10)],
                step_end_us: Some(500),
                ..base.clone()
            },
            "step_end_us",
        ),
    ];
    for (mut state, field) in cases {
        if field == "step_end_us" {
            state.running[0].scheduled_tokens = 10;
        }
        let err = Engine::restore(config(), model(), state).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(field), "expected {field}: {text}");
        assert!(matches!(
            err,
            SimError::InvalidRequest { .. } | SimError::InvalidState { .. }
        ));
    }
    // Too many blocks in use: 3 requests of 20,000 tokens in a 50,000-block... 1,000-block cache.
    let mut small = config();
    small.num_gpu_blocks = 1_000;
    let big = |id| RestoredRequest {
        spec: RequestSpec::synthetic(id, 0, 8_000, 10),
        computed_tokens: 7_999,
        generated: 0,
        cached_tokens: 0,
        scheduled_tokens: 0,
        client_lag_us: 0,
    };
    let state = RestoreState {
        now_us: 10,
        running: vec![big(1), big(2), big(3)],
        ..RestoreState::default()
    };
    let err = Engine::restore(small, model(), state)
        .unwrap_err()
        .to_string();
    assert!(err.contains("running"), "{err}");
}

#[test]
fn restored_prefix_blocks_are_hit() {
    let spec = RequestSpec::synthetic(5, 2_000, 300, 4).with_prefix(9, 256);
    let keys = ditto::sim::kv::hash::prompt_block_keys(&spec, 16);
    let state = RestoreState {
        now_us: 1_000,
        cached_keys: keys[..16].to_vec(),
        ..RestoreState::default()
    };
    let mut engine = Engine::restore(config(), model(), state).unwrap();
    engine.run([spec], u64::MAX).unwrap();
    assert_eq!(engine.metrics().records[0].cached_tokens, 256);
}

/// Restoring once and setting final lengths afterwards (how the twin forks replications)
/// equals restoring with those lengths: same per-request results to the end.
#[test]
fn final_lengths_set_after_restore_equal_restoring_with_them() {
    let cut = 1_234_567;
    let requests = workload();
    let mut original = Engine::new(config(), model()).unwrap();
    for spec in requests.into_iter().filter(|r| r.arrival_us <= cut) {
        original.run_before(spec.arrival_us);
        original.submit(spec).unwrap();
    }
    original.run_until(cut);
    let observed = original.observe();
    // Other final lengths than the original's, as a replication would draw.
    let mut with_lengths = observed.clone();
    let lengths: Vec<(u32, u32)> = with_lengths
        .running
        .iter_mut()
        .chain(with_lengths.waiting.iter_mut())
        .enumerate()
        .map(|(index, request)| {
            let length = request.generated + 1 + (index as u32 * 37) % 200;
            request.spec.output_tokens = length;
            request.spec.max_tokens = length;
            (length, length)
        })
        .collect();
    let mut direct = Engine::restore(config(), model(), with_lengths).unwrap();
    let mut patched = Engine::restore(config(), model(), observed).unwrap();
    patched.set_final_lengths(&lengths).unwrap();
    direct.run(Vec::new(), u64::MAX).unwrap();
    patched.run(Vec::new(), u64::MAX).unwrap();
    assert_eq!(direct.metrics().records, patched.metrics().records);
    assert_eq!(direct.summary(), patched.summary());
    // Once the engine has moved, lengths can no longer change.
    assert!(matches!(
        patched.set_final_lengths(&lengths),
        Err(SimError::InvalidState {
            field: "output_tokens",
            ..
        })
    ));
}

#[test]
fn final_lengths_are_checked_like_restored_ones() {
    let state = RestoreState {
        now_us: 0,
        cached_keys: Vec::new(),
        running: vec![request(1, 119, 20, 50)],
        waiting: vec![request(2, 0, 0, 10)],
        step_end_us: None,
    };
    let fresh = || Engine::restore(config(), model(), state.clone()).unwrap();
    let field = |err: SimError| match err {
        SimError::InvalidRequest { field, .. } => field,
        other => panic!("expected a request error, got {other:?}"),
    };
    // The running request has generated 20 tokens: a final length of 20 is too short.
    assert_eq!(
        field(
            fresh()
                .set_final_lengths(&[(20, 20), (10, 10)])
                .unwrap_err()
        ),
        "output_tokens"
    );
    assert_eq!(
        field(
            fresh()
                .set_final_lengths(&[(30, 29), (10, 10)])
                .unwrap_err()
        ),
        "max_tokens"
    );
    assert_eq!(
        field(
            fresh()
                .set_final_lengths(&[(30, 30), (10, 200_000)])
                .unwrap_err()
        ),
        "max_tokens"
    );
    assert!(matches!(
        fresh().set_final_lengths(&[(30, 30)]),
        Err(SimError::InvalidState { .. })
    ));
    fresh().set_final_lengths(&[(30, 30), (10, 10)]).unwrap();
}

#[test]
fn a_request_that_times_out_mid_step_is_out_of_that_steps_first_token_delay() {
    // Goal: a restored copy continues exactly even when the step in flight lost a request to
    // its deadline before the observation: the original must not count the dead request in
    // that step's first-token delay (batch and KV) when the restored copy, which never sees
    // it, cannot. Method: the calibrated default; A and B prefill in one step, A's deadline
    // falls inside it, the cut after A's timeout and before the step ends; B's first token
    // (made by that step) must reach the client at the same time in both.
    let arch = catalog::model("llama-3.1-8b-instruct").unwrap();
    let gpu = catalog::gpu("H100").unwrap();
    let model = catalog::latency_model(LatencyKind::Calibrated, &arch, &gpu, 1).unwrap();
    let mut config = EngineConfig::vllm_defaults(50_000, 8_192);
    config.kv_sample_interval_us = 0;
    let enqueue = model.queueing_us(1_000);
    let entry = BatchEntry {
        context_tokens: 0,
        new_tokens: 1_000,
        prompt_tokens: 1_000,
        is_prefill: true,
    };
    let step = model.step_us(&[entry; 2]);
    let deadline = enqueue + step / 2;
    let mut doomed = RequestSpec::synthetic(1, 0, 1_000, 50);
    doomed.deadline_us = Some(deadline);
    let specs = [doomed, RequestSpec::synthetic(2, 0, 1_000, 20)];
    let mut original = Engine::new(config.clone(), model.clone()).unwrap();
    for spec in specs {
        original.submit(spec).unwrap();
    }
    original.run_until(deadline + 1);
    let observed = original.observe();
    assert_eq!(observed.running.len(), 1, "A timed out, B is mid-prefill");
    assert_eq!(observed.step_end_us, Some(enqueue + step));
    let mut restored = Engine::restore(config, model, observed).unwrap();
    original.run(Vec::new(), u64::MAX).unwrap();
    restored.run(Vec::new(), u64::MAX).unwrap();
    let first_token = |engine: &Engine| {
        let record = engine.metrics().records.iter().find(|r| r.id.0 == 2);
        record.unwrap().first_token_us
    };
    assert_eq!(first_token(&original), first_token(&restored));
    let timed_out = original.metrics().records.iter().find(|r| r.id.0 == 1);
    assert_eq!(timed_out.unwrap().outcome, Outcome::TimedOut);
}
