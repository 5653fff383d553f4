//! The engine's halves of a disaggregated request (docs/disaggregation.md): a prefill half
//! holds its KV blocks after it finishes until released; a decode half reserves blocks for
//! its prompt (under the engine's own KV and seat limits, waiting when they do not fit),
//! pulls, then computes the prompt's last token, which emits the first token, and decodes.
#![allow(clippy::unwrap_used)]

use ditto::sim::latency::{BlackboxCoefficients, LatencyModel};
use ditto::sim::{Engine, EngineConfig, Outcome, RequestId, RequestSpec};

fn model() -> LatencyModel {
    LatencyModel::Blackbox(BlackboxCoefficients {
        alpha: [0.0, 0.0, 0.0],
        beta: [1000.0, 1.0, 10.0],
    })
}

fn engine(blocks: u32, max_num_seqs: u32) -> Engine {
    let mut config = EngineConfig::vllm_defaults(blocks, 100_000);
    config.max_num_seqs = max_num_seqs;
    config.kv_sample_interval_us = 0;
    Engine::new(config, model()).unwrap()
}

fn run_idle(engine: &mut Engine) {
    while engine.process_next_event().is_some() {
        engine.check_invariants().unwrap();
    }
}

#[test]
fn a_prefill_half_holds_its_blocks_until_released() {
    let mut engine = engine(1000, 256);
    let mut spec = RequestSpec::synthetic(7, 0, 100, 1);
    spec.max_tokens = 1;
    engine.submit_prefill(spec).unwrap();
    run_idle(&mut engine);
    let record = &engine.metrics().records[0];
    assert_eq!(record.outcome, Outcome::Completed);
    assert_eq!(record.output_tokens, 1);
    // 100 tokens in 16-token blocks: 7 blocks, still used after the request finished.
    assert_eq!(engine.kv().used_blocks(), 7);
    assert_eq!(
        engine.held_kv().collect::<Vec<_>>(),
        vec![(RequestId(7), 7)]
    );
    assert_eq!(engine.counts().completed, 1);
    assert_eq!(engine.release_held(RequestId(7), engine.now_us()), Some(7));
    assert_eq!(engine.kv().used_blocks(), 0);
    assert_eq!(
        engine.release_held(RequestId(7), engine.now_us()),
        None,
        "released once"
    );
    engine.check_invariants().unwrap();
}

#[test]
fn held_blocks_make_a_later_request_wait_for_the_release() {
    // 10 blocks: a held 100-token prefill (7 blocks) leaves 3, too few for another.
    let mut engine = engine(10, 256);
    let mut spec = RequestSpec::synthetic(1, 0, 100, 1);
    spec.max_tokens = 1;
    engine.submit_prefill(spec).unwrap();
    engine
        .submit(RequestSpec::synthetic(2, 5_000, 100, 4))
        .unwrap();
    run_idle(&mut engine);
    assert_eq!(
        engine.metrics().records.len(),
        1,
        "the second waits for blocks"
    );
    assert_eq!(engine.num_waiting(), 1);
    let now = engine.now_us();
    engine.release_held(RequestId(1), now).unwrap();
    run_idle(&mut engine);
    assert_eq!(engine.metrics().records.len(), 2);
    assert_eq!(engine.kv().used_blocks(), 0);
}

#[test]
fn a_decode_half_reserves_pulls_then_decodes_from_the_second_token() {
    let mut engine = engine(1000, 256);
    engine
        .submit_remote_kv(RequestSpec::synthetic(3, 0, 100, 10))
        .unwrap();
    run_idle(&mut engine);
    // Reserved: the prompt but its last token (99 tokens, 7 blocks); no token yet.
    assert_eq!(engine.transferring_ids(), vec![RequestId(3)]);
    assert_eq!(engine.kv().used_blocks(), 7);
    assert_eq!(engine.counts().queued, 1, "transferring counts as waiting");
    assert!(engine.metrics().records.is_empty());
    let starts = engine.take_transfer_starts();
    assert_eq!(starts.len(), 1);
    assert_eq!((starts[0].tokens, starts[0].local_hit_tokens), (99, 0));
    assert!(engine.take_transfer_starts().is_empty(), "taken once");
    // The pull completes at 50 ms.
    assert!(engine.complete_transfer(RequestId(3), 50_000));
    assert!(
        !engine.complete_transfer(RequestId(3), 50_000),
        "completed once"
    );
    run_idle(&mut engine);
    let record = &engine.metrics().records[0];
    assert_eq!(record.outcome, Outcome::Completed);
    assert_eq!(record.output_tokens, 10);
    // The first step after the pull computes one token (the recompute of the prompt's last
    // token): blackbox 1000 + 1 × 1 µs, ending at 51,001 µs.
    assert_eq!(record.first_token_us, Some(51_001));
    assert_eq!(engine.kv().used_blocks(), 0);
}

#[test]
fn a_decode_half_waits_in_the_queue_while_its_blocks_do_not_fit() {
    // 10 blocks: the first pull reserves 7 (100 tokens), the second cannot reserve 7.
    let mut engine = engine(10, 256);
    engine
        .submit_remote_kv(RequestSpec::synthetic(1, 0, 100, 2))
        .unwrap();
    engine
        .submit_remote_kv(RequestSpec::synthetic(2, 0, 100, 2))
        .unwrap();
    run_idle(&mut engine);
    let starts = engine.take_transfer_starts();
    assert_eq!(
        starts.iter().map(|s| s.id).collect::<Vec<_>>(),
        vec![RequestId(1)]
    );
    assert_eq!(engine.num_waiting(), 1);
    let now = engine.now_us();
    engine.complete_transfer(RequestId(1), now);
    run_idle(&mut engine);
    // The first finished and freed its blocks: the second reserved then.
    let starts = engine.take_transfer_starts();
    assert_eq!(
        starts.iter().map(|s| s.id).collect::<Vec<_>>(),
        vec![RequestId(2)]
    );
    assert!(starts[0].at_us > 0);
    let now = engine.now_us();
    engine.complete_transfer(RequestId(2), now);
    run_idle(&mut engine);
    assert_eq!(engine.counts().completed, 2);
}

#[test]
fn a_decode_half_waits_for_a_seat() {
    // One seat: a running request holds it, so the pull does not start (vLLM stops
    // admitting, transfers included, when the running batch is full).
    let mut engine = engine(1000, 1);
    engine.submit(RequestSpec::synthetic(1, 0, 20, 50)).unwrap();
    engine
        .submit_remote_kv(RequestSpec::synthetic(2, 1, 100, 2))
        .unwrap();
    engine.run_until(10_000);
    assert!(!engine.has_transfer_starts());
    run_idle(&mut engine);
    assert!(engine.has_transfer_starts(), "started once the seat freed");
}

#[test]
fn a_decode_half_takes_local_prefix_hits_and_pulls_the_rest() {
    let mut engine = engine(1000, 256);
    engine
        .submit(RequestSpec::synthetic(1, 0, 100, 1).with_prefix(9, 64))
        .unwrap();
    run_idle(&mut engine);
    engine
        .submit_remote_kv(RequestSpec::synthetic(2, 100_000, 100, 3).with_prefix(9, 64))
        .unwrap();
    run_idle(&mut engine);
    let start = engine.take_transfer_starts()[0];
    assert_eq!((start.local_hit_tokens, start.tokens), (64, 35));
}

#[test]
fn a_transferring_request_times_out_and_frees_its_reservation() {
    let mut engine = engine(1000, 256);
    let mut spec = RequestSpec::synthetic(4, 0, 100, 5);
    spec.deadline_us = Some(30_000);
    engine.submit_remote_kv(spec).unwrap();
    run_idle(&mut engine);
    assert_eq!(engine.counts().timed_out, 1);
    assert_eq!(engine.kv().used_blocks(), 0);
    let now = engine.now_us();
    assert!(
        !engine.complete_transfer(RequestId(4), now),
        "nothing to complete"
    );
}

#[test]
fn a_pulled_request_timing_out_in_the_queue_frees_its_blocks() {
    // One seat: B reserves and pulls, A takes the seat meanwhile, B's KV arrives and it
    // waits for the seat holding its blocks until its deadline.
    let mut engine = engine(1000, 1);
    let mut b = RequestSpec::synthetic(2, 0, 100, 5);
    b.deadline_us = Some(20_000);
    engine.submit_remote_kv(b).unwrap();
    engine
        .submit(RequestSpec::synthetic(1, 1, 20, 100))
        .unwrap();
    engine.run_until(5_000);
    assert!(engine.complete_transfer(RequestId(2), 5_000));
    engine.run_until(10_000);
    assert_eq!(engine.num_waiting(), 1, "B waits for the seat");
    assert!(engine.kv().used_blocks() >= 7);
    run_idle(&mut engine);
    assert_eq!(engine.counts().timed_out, 1);
    assert_eq!(engine.counts().completed, 1);
    assert_eq!(engine.kv().used_blocks(), 0);
}
