//! Predictions from pod aggregates (the llm-d latency predictor's question) against
//! PredictRouting on the per-request state those aggregates summarise: the same pods must
//! rank the same way, and the aggregate state must be built as documented.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ditto::cluster::spec::default_cluster;
use ditto::sim::SloClass;
use ditto::twin::Limits;
use ditto::twin::aggregate::{
    AggregateOptions, Objective, PodAggregates, PodType, instance_from_aggregates,
    predict_aggregates, single_instance_config,
};
use ditto::twin::cached::CachedBlocks;
use ditto::twin::predict::predict_routing;
use ditto::twin::question::{
    Background, CandidateRequest, OutputLength, PredictOptions, RoutingQuestion, SloTargets,
    StalePolicy,
};
use ditto::twin::snapshot::{
    InstanceState, MirrorSnapshot, ObservedRequest, TrafficStats, TwinSettings,
};

const NOW: u64 = 5_000_000;
const PROMPT: u32 = 1_600;
const OUTPUT: u32 = 128;

fn observed(id: String, prompt: u32, computed: u32, generated: u32) -> ObservedRequest {
    ObservedRequest {
        request_id: id,
        arrival_us: NOW - 1_000,
        prompt_tokens: prompt,
        computed_tokens: computed,
        cached_tokens: 0,
        output_tokens: generated,
        max_tokens: 4_096,
        known_output_tokens: None,
        priority: 0,
        slo_class: SloClass::Standard,
        scheduled_tokens: 0,
        block_hashes: Vec::new(),
        token_ids: None,
    }
}

/// Load shapes: (running, running context, waiting, waiting prompt, cached prompt blocks).
const SHAPES: [(u32, u32, u32, u32, usize); 4] = [
    (24, 1_024, 6, 1_800, 0),
    (2, 512, 0, 0, 0),
    (12, 2_048, 2, 900, 0),
    (2, 512, 0, 0, 80),
];

fn prompt_hashes() -> Vec<u64> {
    (0..u64::from(PROMPT / 16)).map(|i| 77_000 + i).collect()
}

fn snapshot() -> MirrorSnapshot {
    let config = default_cluster();
    let instances = config
        .instances
        .iter()
        .zip(SHAPES)
        .map(|(instance, (running, context, waiting, prompt, cached))| {
            Arc::new(InstanceState {
                instance_id: instance.id.clone(),
                observed_at_us: NOW,
                running: (0..running)
                    .map(|i| observed(format!("r{i}"), context, context, 1))
                    .collect(),
                waiting: (0..waiting)
                    .map(|i| observed(format!("w{i}"), prompt, 0, 0))
                    .collect(),
                cached_blocks: CachedBlocks::from_keys(prompt_hashes()[..cached].iter().copied()),
                ..InstanceState::default()
            })
        })
        .collect();
    MirrorSnapshot {
        generation: 1,
        config_generation: 1,
        config: Arc::new(config),
        settings: Arc::new(TwinSettings::defaults()),
        instances,
        traffic: Arc::new(TrafficStats::default()),
        memo: Default::default(),
    }
}

/// What the router would send for pod `index` of `snapshot` (what its /metrics and its own
/// bookkeeping say).
fn aggregates_of(snapshot: &MirrorSnapshot, index: usize) -> PodAggregates {
    let state = &snapshot.instances[index];
    let engine = &snapshot.config.instances[index].engine;
    let blocks: u32 = state
        .running
        .iter()
        .map(|r| r.computed_tokens.div_ceil(engine.block_size))
        .sum();
    let full_blocks = PROMPT / engine.block_size;
    PodAggregates {
        kv_cache_percentage: f64::from(blocks) / f64::from(engine.num_gpu_blocks),
        input_token_length: PROMPT,
        num_request_waiting: state.waiting.len() as u32,
        num_request_running: state.running.len() as u32,
        num_tokens_generated: 0,
        prefix_cache_score: state.cached_blocks.len() as f64 / f64::from(full_blocks),
        pod_type: PodType::Monolithic,
        prefill_tokens_in_flight: state
            .waiting
            .iter()
            .map(|r| u64::from(r.prompt_tokens))
            .sum(),
        decode_tokens_in_flight: state
            .running
            .iter()
            .map(|r| u64::from(r.computed_tokens))
            .sum(),
        encoder_input_size: 0,
        encoder_matched_size: 0,
    }
}

/// Every pair of pods that `routed` separates by more than 2 % is ordered the same way by
/// `aggregate` (pairs closer than that are ties for a router).
fn assert_same_ranking(metric: &str, aggregate: &[f64], routed: &[f64]) {
    let mut separated = 0;
    for a in 0..routed.len() {
        for b in 0..routed.len() {
            if routed[a] < routed[b] * 0.98 {
                separated += 1;
                assert!(
                    aggregate[a] < aggregate[b],
                    "{metric}: pod {a} beats pod {b} in PredictRouting ({routed:?}) \
                     but not from aggregates ({aggregate:?})"
                );
            }
        }
    }
    assert!(
        separated >= 4,
        "{metric}: the pods should differ ({routed:?})"
    );
}

#[test]
fn aggregate_prediction_ranks_pods_like_predict_routing() {
    let snapshot = snapshot();
    let question = RoutingQuestion {
        request: CandidateRequest {
            prompt_tokens: PROMPT,
            token_ids: None,
            block_hashes: prompt_hashes(),
            output: OutputLength::Point(OUTPUT),
            max_tokens: OUTPUT,
            priority: 0,
            slo_class: SloClass::Standard,
            slo: SloTargets::default(),
        },
        candidates: Vec::new(),
        options: PredictOptions {
            replications: 8,
            quantiles: vec![0.5],
            horizon_us: 600_000_000,
            background: Background::None,
            stale_policy: Some(StalePolicy::UseLast),
            max_signal_age_us: Some(u64::MAX),
            seed: 3,
        },
        now_us: NOW,
    };
    let routing = predict_routing(&snapshot, &question, &Limits::DEFAULT).unwrap();
    let routed_ttft: Vec<f64> = routing.candidates.iter().map(|c| c.ttft_ms.mean).collect();
    let routed_tpot: Vec<f64> = routing.candidates.iter().map(|c| c.tpot_ms.mean).collect();

    let template = Arc::new(single_instance_config(&snapshot.config, 0).unwrap());
    let options = AggregateOptions {
        replications: 8,
        seed: 3,
        horizon_us: 600_000_000,
        output_tokens: OUTPUT,
        objective: Objective::Mean,
    };
    let predicted: Vec<_> = (0..snapshot.instances.len())
        .map(|index| {
            predict_aggregates(
                &template,
                &snapshot.settings,
                &aggregates_of(&snapshot, index),
                &options,
                &Limits::DEFAULT,
            )
            .unwrap()
        })
        .collect();
    let aggregate_ttft: Vec<f64> = predicted.iter().map(|p| p.ttft.value).collect();
    let aggregate_tpot: Vec<f64> = predicted.iter().map(|p| p.tpot.value).collect();
    assert!(predicted.iter().all(|p| p.valid));
    assert_same_ranking("TTFT", &aggregate_ttft, &routed_ttft);
    assert_same_ranking("TPOT", &aggregate_tpot, &routed_tpot);
    // The prefix hit must show: pod 3 is pod 1 plus a cached prompt prefix.
    assert!(aggregate_ttft[3] < aggregate_ttft[1], "{aggregate_ttft:?}");
    // The spread comes from the replications and brackets the value.
    for p in &predicted {
        let slack = 1e-9 * p.ttft.value;
        assert!(
            p.ttft.bounds.0 - slack <= p.ttft.value && p.ttft.value <= p.ttft.bounds.1 + slack,
            "{p:?}"
        );
    }
}

#[test]
fn the_aggregate_state_holds_the_reported_load() {
    let config = default_cluster();
    let instance = &config.instances[0];
    let aggregates = PodAggregates {
        kv_cache_percentage: 0.5,
        input_token_length: 1_000,
        num_request_waiting: 3,
        num_request_running: 10,
        num_tokens_generated: 0,
        prefix_cache_score: 0.5,
        pod_type: PodType::Monolithic,
        prefill_tokens_in_flight: 3_000,
        decode_tokens_in_flight: 0,
        encoder_input_size: 0,
        encoder_matched_size: 0,
    };
    let (state, request) = instance_from_aggregates(instance, &aggregates, 100);
    assert_eq!(state.running.len(), 10);
    assert_eq!(state.waiting.len(), 3);
    assert!(state.waiting.iter().all(|r| r.prompt_tokens == 1_000));
    let block = instance.engine.block_size;
    let blocks: u32 = state
        .running
        .iter()
        .map(|r| r.computed_tokens.div_ceil(block))
        .sum();
    let usage = f64::from(blocks) / f64::from(instance.engine.num_gpu_blocks);
    assert!((usage - 0.5).abs() < 0.01, "usage {usage}");
    // 62 full blocks in the prompt, half of them cached.
    assert_eq!(request.block_hashes.len(), 62);
    assert_eq!(
        state.cached_blocks.to_keys(),
        request.block_hashes[..31].to_vec()
    );
}

/// Aggregate options of one replication with `horizon_us`.
fn one_replication(horizon_us: u64) -> AggregateOptions {
    AggregateOptions {
        replications: 1,
        seed: 3,
        horizon_us,
        output_tokens: OUTPUT,
        objective: Objective::Mean,
    }
}

/// A monolithic pod's aggregates: `running` requests decoding `decode_each` tokens of
/// context each in `kv` of the cache, `waiting` prompts of `prompt_each` tokens queued, and a
/// new prompt of `new_prompt` tokens.
fn pod_aggregates(
    kv: f64,
    (running, decode_each): (u32, u64),
    (waiting, prompt_each): (u32, u64),
    new_prompt: u32,
) -> PodAggregates {
    PodAggregates {
        kv_cache_percentage: kv,
        input_token_length: new_prompt,
        num_request_waiting: waiting,
        num_request_running: running,
        num_tokens_generated: 0,
        prefix_cache_score: 0.0,
        pod_type: PodType::Monolithic,
        prefill_tokens_in_flight: u64::from(waiting) * prompt_each,
        decode_tokens_in_flight: u64::from(running) * decode_each,
        encoder_input_size: 0,
        encoder_matched_size: 0,
    }
}

#[test]
fn a_short_new_prompt_waits_behind_the_pod_s_waiting_requests() {
    // Goal: the pod's waiting requests were queued before the new request arrived, so vLLM's
    // FCFS scheduler serves their prompts first, whatever the new prompt's length. Found when
    // the refitted front end (`queue_us_per_token` > 0) let a shorter new prompt reach the
    // queue first when the synthesized waiting requests arrived at the same instant as it.
    // Method: an idle pod but for four waiting 6,000-token prompts, and a 100-token new
    // request: its TTFT must include their prefills (tens of ms on one H100), against the
    // same pod with nothing waiting.
    let snapshot = snapshot();
    let template = Arc::new(single_instance_config(&snapshot.config, 0).unwrap());
    let options = one_replication(600_000_000);
    let pod = |waiting: u32| pod_aggregates(0.0, (0, 0), (waiting, 6_000), 100);
    let ttft = |waiting: u32| {
        predict_aggregates(
            &template,
            &snapshot.settings,
            &pod(waiting),
            &options,
            &Limits::DEFAULT,
        )
        .unwrap()
        .ttft
        .value
    };
    let (alone, behind) = (ttft(0), ttft(4));
    assert!(
        behind > alone + 40.0,
        "TTFT behind 24,000 waiting prompt tokens {behind} ms vs alone {alone} ms"
    );
}

#[test]
fn a_request_the_horizon_cuts_off_answers_the_pod_s_decode_pace_as_its_tpot() {
    // Goal: an inter-token time is never the horizon. Found on llm-d's recorded chatbot
    // trace, where one pod's queue outlasted the 600 s horizon and the answer's TPOT was
    // 600,000 ms. Method: a pod decoding 32 requests with 40 long prompts waiting, a horizon
    // of 1.5 s: the new request never starts; its TTFT is censored at the horizon, its TPOT
    // is the decode pace of the requests that finished (tens of ms, far below the horizon).
    let snapshot = snapshot();
    let template = Arc::new(single_instance_config(&snapshot.config, 0).unwrap());
    let options = one_replication(1_500_000);
    let pod = pod_aggregates(0.2, (32, 600), (40, 8_000), 1_000);
    let predicted = predict_aggregates(
        &template,
        &snapshot.settings,
        &pod,
        &options,
        &Limits::DEFAULT,
    )
    .unwrap();
    assert!(predicted.ttft.value >= 1_499.0, "{predicted:?}");
    assert!(
        predicted.tpot.value > 1.0 && predicted.tpot.value < 200.0,
        "{predicted:?}"
    );
}
