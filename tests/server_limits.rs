#![allow(clippy::unwrap_used)]
//! Every configurable limit of `ditto serve`, tested at the limit and one over it over real
//! sockets: message size, candidates, replications, instances in a config, requests and
//! events in a pushed state, KV events in a batch, calls waiting for a simulation slot.
//! One over is RESOURCE_EXHAUSTED naming what was exceeded, and changes nothing.

use std::time::Duration;

mod common;

use common::server::Harness;
use common::within;
use ditto::server::proto;
use prost::Message;
use tonic::Code;

fn id(index: usize) -> String {
    format!("ns/vllm-{index}:8000")
}

fn config(instances: usize) -> proto::ClusterConfig {
    proto::ClusterConfig {
        instances: (0..instances)
            .map(|index| proto::InstanceSpec {
                id: id(index),
                address: format!("10.0.0.{index}:8000"),
                engine: Some(proto::EngineLimits {
                    num_gpu_blocks: Some(4096),
                    max_num_seqs: Some(4),
                    max_model_len: Some(4096),
                    ..proto::EngineLimits::default()
                }),
                ..proto::InstanceSpec::default()
            })
            .collect(),
        ..proto::ClusterConfig::default()
    }
}

fn waiting(count: usize, id_len: usize) -> proto::InstanceStateUpdate {
    proto::InstanceStateUpdate {
        instance_id: id(0),
        observed_at_us: 1_000_000,
        requests: Some(proto::RequestLists {
            waiting: (0..count)
                .map(|index| proto::RequestState {
                    request_id: format!("{index:0>id_len$}"),
                    arrival_us: 900_000,
                    prompt_tokens: 10,
                    max_tokens: 10,
                    ..proto::RequestState::default()
                })
                .collect(),
            running: vec![],
            step_end_us: 0,
        }),
        ..proto::InstanceStateUpdate::default()
    }
}

fn question(candidates: usize, replications: i64) -> proto::PredictRoutingRequest {
    proto::PredictRoutingRequest {
        request: Some(proto::CandidateRequest {
            prompt_tokens: 100,
            expected_output: Some(proto::candidate_request::ExpectedOutput::OutputTokens(10)),
            ..proto::CandidateRequest::default()
        }),
        candidate_instance_ids: (0..candidates).map(id).collect(),
        options: Some(proto::PredictOptions {
            replications,
            ..proto::PredictOptions::default()
        }),
        request_id: "q".to_owned(),
        ..proto::PredictRoutingRequest::default()
    }
}

fn exhausted<T: std::fmt::Debug>(result: Result<T, tonic::Status>, names: &str) {
    let status = result.expect_err("one over the limit must fail");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains(names), "{status:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_one_byte_over_the_size_limit_is_resource_exhausted() {
    within(async {
        const LIMIT: usize = 64 * 1024;
        let mut h = Harness::start(Some(config(1)), |o| o.max_message_bytes = LIMIT).await;
        // Requests with 20-byte ids, then the first id lengthened byte by byte until the
        // message is exactly at the limit.
        let mut count = 1;
        while waiting(count, 20).encoded_len() < LIMIT - 64 {
            count += 1;
        }
        let mut at_limit = waiting(count, 20);
        while at_limit.encoded_len() < LIMIT {
            at_limit.requests.as_mut().unwrap().waiting[0]
                .request_id
                .push('x');
        }
        assert_eq!(at_limit.encoded_len(), LIMIT);
        let mut over = at_limit.clone();
        over.requests.as_mut().unwrap().waiting[0]
            .request_id
            .push('y');
        assert_eq!(over.encoded_len(), LIMIT + 1);
        h.twin
            .push_instance_state(tokio_stream::iter(vec![at_limit]))
            .await
            .unwrap();
        let before = h.generation().await;
        exhausted(
            h.twin
                .push_instance_state(tokio_stream::iter(vec![over]))
                .await,
            "too large",
        );
        // The unary path too.
        let mut big = question(1, 1);
        big.request_id = "q".repeat(LIMIT);
        exhausted(h.twin.predict_routing(big).await, "too large");
        assert_eq!(h.generation().await, before);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn candidates_and_replications_one_over_are_resource_exhausted() {
    within(async {
        let mut h = Harness::start(Some(config(3)), |o| {
            o.service.twin.max_candidates = 2;
            o.service.twin.max_replications = 3;
        })
        .await;
        h.twin.predict_routing(question(2, 3)).await.unwrap();
        exhausted(
            h.twin.predict_routing(question(3, 1)).await,
            "candidate_instance_ids",
        );
        exhausted(
            h.twin.predict_routing(question(2, 4)).await,
            "options.replications",
        );
        // No candidates listed means every instance: three, one over.
        exhausted(
            h.twin.predict_routing(question(0, 1)).await,
            "candidate_instance_ids",
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn instances_requests_and_events_one_over_are_resource_exhausted() {
    within(async {
        let mut h = Harness::start(Some(config(1)), |o| {
            o.store.max_instances = 4;
            o.store.max_requests_per_instance = 5;
            o.store.max_events_per_update = 2;
            o.store.max_kv_events_per_batch = 3;
        })
        .await;
        h.twin.sync_cluster_config(config(4)).await.unwrap();
        let before = h.generation().await;
        exhausted(h.twin.sync_cluster_config(config(5)).await, "instances");
        h.twin
            .push_instance_state(tokio_stream::iter(vec![waiting(5, 4)]))
            .await
            .unwrap();
        let before_push = h.generation().await;
        assert!(before_push > before);
        exhausted(
            h.twin
                .push_instance_state(tokio_stream::iter(vec![waiting(6, 4)]))
                .await,
            "requests",
        );
        let finished = |request: &str| proto::RequestEvent {
            at_us: 1_100_000,
            event: Some(proto::request_event::Event::FirstToken(
                proto::RequestFirstToken {
                    request_id: request.to_owned(),
                },
            )),
        };
        let events = |count: usize| proto::InstanceStateUpdate {
            instance_id: id(0),
            observed_at_us: 1_200_000,
            events: (0..count).map(|i| finished(&format!("{i:0>4}"))).collect(),
            ..proto::InstanceStateUpdate::default()
        };
        let over = h
            .twin
            .push_instance_state(tokio_stream::iter(vec![events(3)]))
            .await
            .unwrap_err();
        assert_eq!(over.code(), Code::ResourceExhausted, "{over:?}");
        let batch = |count: usize| proto::KvEventBatch {
            instance_id: id(0),
            seq: 1,
            ts_us: 1_000_000,
            events: (0..count)
                .map(|i| proto::KvEvent {
                    event: Some(proto::kv_event::Event::Stored(proto::BlockStored {
                        block_hashes: vec![i as u64 + 1],
                        ..proto::BlockStored::default()
                    })),
                })
                .collect(),
        };
        exhausted(
            h.twin
                .push_kv_events(tokio_stream::iter(vec![batch(4)]))
                .await,
            "events",
        );
        assert_eq!(
            h.generation().await,
            before_push,
            "a refused write changed the mirror"
        );
        h.twin
            .push_kv_events(tokio_stream::iter(vec![batch(3)]))
            .await
            .unwrap();
    })
    .await;
}

fn heavy_forecast() -> proto::ForecastCapacityRequest {
    let constant = |value| proto::LengthDistribution {
        dist: Some(proto::length_distribution::Dist::Constant(value)),
    };
    proto::ForecastCapacityRequest {
        stages: vec![proto::RateStage {
            rate_rps: 2000.0,
            duration_s: 590.0,
        }],
        input_tokens: Some(constant(1000)),
        output_tokens: Some(constant(1000)),
        variants: vec![proto::VariantCandidates {
            template_instance_id: id(0),
            replica_counts: vec![1],
        }],
        replications: 1,
        ..proto::ForecastCapacityRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_beyond_the_simulation_queue_is_resource_exhausted_at_once() {
    within(async {
        let h = Harness::start(Some(config(1)), |o| {
            o.service.max_concurrent_simulations = 1;
            o.service.max_queued_simulations = 1;
        })
        .await;
        // One forecast runs, one waits (the queue's limit); both are cut by the client later.
        let mut running = h.twin.clone();
        let first = tokio::spawn(async move { running.forecast_capacity(heavy_forecast()).await });
        let mut metrics = String::new();
        while !metrics.contains("ditto_simulations_running 1") {
            tokio::time::sleep(Duration::from_millis(10)).await;
            metrics = h.metrics().await;
        }
        let mut queued = h.twin.clone();
        let second = tokio::spawn(async move { queued.forecast_capacity(heavy_forecast()).await });
        while !metrics.contains("ditto_simulations_waiting 1") {
            tokio::time::sleep(Duration::from_millis(10)).await;
            metrics = h.metrics().await;
        }
        // One over the queue: refused at once, not queued.
        let mut twin = h.twin.clone();
        exhausted(
            twin.predict_routing(question(1, 1)).await,
            "simulation slots are busy",
        );
        first.abort();
        second.abort();
        let _ = first.await;
        let _ = second.await;
        // The cut calls let go of their slots (their simulations stop), and questions are
        // answered again.
        while !(metrics.contains("ditto_simulations_running 0")
            && metrics.contains("ditto_simulations_waiting 0"))
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
            metrics = h.metrics().await;
        }
        let mut request = tonic::Request::new(question(1, 1));
        request.set_timeout(Duration::from_secs(30));
        let answer = twin.predict_routing(request).await;
        assert!(answer.is_ok(), "{answer:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_horizon_one_millisecond_over_is_resource_exhausted() {
    within(async {
        let mut h = Harness::start(Some(config(1)), |o| {
            o.service.twin.max_horizon_us = 2_000_000
        })
        .await;
        let with_horizon = |horizon_ms: f64| {
            let mut message = question(1, 1);
            message.options.as_mut().unwrap().horizon_ms = horizon_ms;
            message
        };
        h.twin.predict_routing(with_horizon(2_000.0)).await.unwrap();
        exhausted(
            h.twin.predict_routing(with_horizon(2_001.0)).await,
            "options.horizon_ms",
        );
        let staged = |duration_s: f64| {
            let mut message = heavy_forecast();
            message.stages = vec![proto::RateStage {
                rate_rps: 1.0,
                duration_s,
            }];
            message
        };
        h.twin.forecast_capacity(staged(2.0)).await.unwrap();
        exhausted(h.twin.forecast_capacity(staged(2.001)).await, "stages");
    })
    .await;
}
