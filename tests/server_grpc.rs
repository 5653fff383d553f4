#![allow(clippy::unwrap_used)]
//! The Twin service end to end over real sockets: a server started in-process on
//! 127.0.0.1:0, driven by tonic clients (Twin, health, reflection v1 and v1alpha) and by a
//! raw HTTP/1.1 request for /metrics. Bad inputs get the documented codes and leave the
//! mirror unchanged.

use std::time::Duration;

mod common;

use common::server::{Harness, http_get};
use common::within;
use ditto::server::proto;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const A: &str = "ns/vllm-0:8000";
const B: &str = "ns/vllm-1:8000";

fn instance(id: &str) -> proto::InstanceSpec {
    proto::InstanceSpec {
        id: id.to_owned(),
        address: format!("{id}-addr"),
        engine: Some(proto::EngineLimits {
            num_gpu_blocks: Some(64),
            max_num_seqs: Some(4),
            max_model_len: Some(4096),
            ..proto::EngineLimits::default()
        }),
        ..proto::InstanceSpec::default()
    }
}

fn config() -> proto::ClusterConfig {
    proto::ClusterConfig {
        instances: vec![instance(A), instance(B)],
        ..proto::ClusterConfig::default()
    }
}

fn request(id: &str, prompt: i64, computed: i64, output: i64) -> proto::RequestState {
    proto::RequestState {
        request_id: id.to_owned(),
        arrival_us: 900_000,
        prompt_tokens: prompt,
        computed_tokens: computed,
        output_tokens: output,
        max_tokens: 100,
        ..proto::RequestState::default()
    }
}

fn full_update(
    id: &str,
    at: i64,
    waiting: Vec<proto::RequestState>,
    running: Vec<proto::RequestState>,
) -> proto::InstanceStateUpdate {
    proto::InstanceStateUpdate {
        instance_id: id.to_owned(),
        observed_at_us: at,
        requests: Some(proto::RequestLists {
            waiting,
            running,
            step_end_us: 0,
        }),
        ..proto::InstanceStateUpdate::default()
    }
}

fn event(at: i64, event: proto::request_event::Event) -> proto::RequestEvent {
    proto::RequestEvent {
        at_us: at,
        event: Some(event),
    }
}

fn kv(seq: u64, ts: i64, events: Vec<proto::kv_event::Event>) -> proto::KvEventBatch {
    proto::KvEventBatch {
        instance_id: A.to_owned(),
        seq,
        ts_us: ts,
        events: events
            .into_iter()
            .map(|event| proto::KvEvent { event: Some(event) })
            .collect(),
    }
}

fn stored(hashes: Vec<u64>) -> proto::kv_event::Event {
    proto::kv_event::Event::Stored(proto::BlockStored {
        block_hashes: hashes,
        ..proto::BlockStored::default()
    })
}

fn routing_question() -> proto::PredictRoutingRequest {
    proto::PredictRoutingRequest {
        request: Some(proto::CandidateRequest {
            prompt_tokens: 2000,
            expected_output: Some(proto::candidate_request::ExpectedOutput::OutputTokens(256)),
            ..proto::CandidateRequest::default()
        }),
        request_id: "q".to_owned(),
        ..proto::PredictRoutingRequest::default()
    }
}

fn forecast_question() -> proto::ForecastCapacityRequest {
    let constant = |value| proto::LengthDistribution {
        dist: Some(proto::length_distribution::Dist::Constant(value)),
    };
    proto::ForecastCapacityRequest {
        stages: vec![proto::RateStage {
            rate_rps: 5.0,
            duration_s: 60.0,
        }],
        input_tokens: Some(constant(512)),
        output_tokens: Some(constant(128)),
        variants: vec![proto::VariantCandidates {
            template_instance_id: A.to_owned(),
            replica_counts: vec![1, 2],
        }],
        ..proto::ForecastCapacityRequest::default()
    }
}

/// Asserts the call failed with `code` and a message naming `field`.
fn check<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, field: &str) {
    let status = result.expect_err("the call must fail");
    assert_eq!(status.code(), code, "{}", status.message());
    assert!(
        status.message().contains(field),
        "{:?} does not name {field:?}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn health_turns_serving_once_a_config_is_synced() {
    within(async {
        let mut h = Harness::start(None, |_| {}).await;
        let not_serving = ServingStatus::NotServing as i32;
        assert_eq!(h.health("").await, not_serving);
        assert_eq!(h.health("ditto.v1.Twin").await, not_serving);
        check(h.snapshot(0).await, Code::FailedPrecondition, "config");
        check(
            h.push(vec![full_update(A, 1_000_000, vec![], vec![])])
                .await,
            Code::FailedPrecondition,
            "config",
        );
        check(
            h.twin.predict_routing(routing_question()).await,
            Code::FailedPrecondition,
            "config",
        );
        let ack = h
            .twin
            .sync_cluster_config(config())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (ack.generation, ack.config_generation, ack.changed),
            (1, 1, true)
        );
        assert_eq!(h.health("").await, ServingStatus::Serving as i32);
        assert_eq!(
            h.health("ditto.v1.Twin").await,
            ServingStatus::Serving as i32
        );
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn config_sync_is_versioned_and_idempotent() {
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        let again = h
            .twin
            .sync_cluster_config(config())
            .await
            .unwrap()
            .into_inner();
        assert_eq!((again.generation, again.changed), (1, false));
        let snapshot = h.snapshot(0).await.unwrap();
        let echoed = snapshot.config.unwrap();
        assert_eq!(echoed.instances[1].address, format!("{B}-addr"));
        assert_eq!(
            echoed.instances[0].engine.as_ref().unwrap().num_gpu_blocks,
            Some(64)
        );
        // The echoed config, every default resolved, is the same config.
        let same = h
            .twin
            .sync_cluster_config(echoed)
            .await
            .unwrap()
            .into_inner();
        assert!(!same.changed, "{same:?}");
        let mut changed = config();
        changed.instances.truncate(1);
        let ack = h
            .twin
            .sync_cluster_config(changed)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (ack.generation, ack.config_generation, ack.changed),
            (2, 2, true)
        );
        assert_eq!(h.snapshot(0).await.unwrap().instances.len(), 1);
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pushed_state_and_events_are_mirrored_with_ages() {
    use proto::request_event::Event;
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        let mut first = full_update(
            A,
            1_000_000,
            vec![request("r1", 100, 0, 0)],
            vec![request("r2", 200, 204, 5)],
        );
        first.gauges = Some(proto::Gauges {
            running: 1,
            waiting: 1,
            kv_usage: 0.2,
            ..Default::default()
        });
        let routed = Event::Routed(proto::RequestRouted {
            request: Some(proto::RequestState {
                arrival_us: 1_050_000,
                max_tokens: 0,
                ..request("r3", 50, 0, 0)
            }),
        });
        let second = proto::InstanceStateUpdate {
            instance_id: A.to_owned(),
            observed_at_us: 1_100_000,
            events: vec![
                event(1_050_000, routed),
                event(
                    1_060_000,
                    Event::FirstToken(proto::RequestFirstToken {
                        request_id: "r1".into(),
                    }),
                ),
                event(
                    1_090_000,
                    Event::Finished(proto::RequestFinished {
                        request_id: "r2".into(),
                        output_tokens: 40,
                    }),
                ),
            ],
            ..proto::InstanceStateUpdate::default()
        };
        let gauges_only = proto::InstanceStateUpdate {
            instance_id: B.to_owned(),
            observed_at_us: 1_900_000,
            gauges: Some(proto::Gauges::default()),
            ..proto::InstanceStateUpdate::default()
        };
        let ack = h.push(vec![first, second, gauges_only]).await.unwrap();
        assert_eq!((ack.accepted, ack.generation), (3, 4));

        let snapshot = h.snapshot(0).await.unwrap();
        assert_eq!(snapshot.generation, 4);
        let a = &snapshot.instances[0];
        let lists = a.requests.as_ref().unwrap();
        let ids = |list: &[proto::RequestState]| {
            list.iter()
                .map(|r| r.request_id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&lists.waiting), ["r3"]);
        assert_eq!(ids(&lists.running), ["r1"]);
        assert_eq!(lists.running[0].computed_tokens, 100);
        assert_eq!(lists.running[0].output_tokens, 1);
        // Unset max_tokens: the usable length (64 blocks of 16 tokens) minus the prompt.
        assert_eq!(lists.waiting[0].max_tokens, 1024 - 50);
        let age = a.requests_age.unwrap();
        assert!(age.observed);
        assert_eq!(age.age_ms, 900.0);
        assert!(age.stale, "900 ms is past the 200 ms default");
        let b = &snapshot.instances[1];
        assert!(!b.requests_age.unwrap().observed);
        let gauges_age = b.gauges_age.unwrap();
        assert_eq!((gauges_age.age_ms, gauges_age.stale), (100.0, false));
        assert_eq!(snapshot.traffic.unwrap().recent_finished, 1);

        let older = h.snapshot(2).await.unwrap();
        let lists = older.instances[0].requests.as_ref().unwrap();
        assert_eq!(ids(&lists.waiting), ["r1"]);
        assert_eq!(ids(&lists.running), ["r2"]);
        check(h.snapshot(99).await, Code::NotFound, "generation");
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kv_events_follow_the_cache_and_report_gaps() {
    use proto::kv_event::Event;
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        let first = kv(
            1,
            1_000_000,
            vec![proto::kv_event::Event::Stored(proto::BlockStored {
                block_hashes: vec![1, 2, 3],
                parent_block_hash: None,
                token_ids: (0..48).collect(),
                block_size: 16,
            })],
        );
        let second = kv(
            2,
            1_000_100,
            vec![Event::Removed(proto::BlockRemoved {
                block_hashes: vec![2],
            })],
        );
        let after_gap = kv(4, 1_000_200, vec![stored(vec![7])]);
        let ack = h.push_kv(vec![first, second, after_gap]).await.unwrap();
        assert_eq!(ack.accepted, 3);
        assert_eq!(ack.gaps.len(), 1);
        let gap = &ack.gaps[0];
        assert_eq!(
            (gap.instance_id.as_str(), gap.expected_seq, gap.received_seq),
            (A, 3, 4)
        );
        let snapshot = h.snapshot(0).await.unwrap();
        let a = &snapshot.instances[0];
        assert_eq!(a.cached_block_hashes, [1, 3, 7]);
        assert_eq!(
            (a.cached_blocks, a.kv_event_seq, a.kv_event_gaps),
            (3, 4, 1)
        );
        assert!(a.kv_events_age.unwrap().observed);

        // A repeated sequence number is refused; the mirror is unchanged.
        check(
            h.push_kv(vec![kv(4, 1_000_300, vec![stored(vec![9])])])
                .await,
            Code::InvalidArgument,
            "seq",
        );
        // More cached blocks than the instance has (64) is refused.
        check(
            h.push_kv(vec![kv(5, 1_000_300, vec![stored((100..162).collect())])])
                .await,
            Code::InvalidArgument,
            "num_gpu_blocks",
        );
        assert_eq!(h.snapshot(0).await.unwrap(), snapshot);
        // A publisher restart starts with AllBlocksCleared and may reset the sequence.
        let restart = kv(
            1,
            1_000_400,
            vec![Event::Cleared(proto::AllBlocksCleared {}), stored(vec![11])],
        );
        let ack = h.push_kv(vec![restart]).await.unwrap();
        assert!(ack.gaps.is_empty());
        assert_eq!(
            h.snapshot(0).await.unwrap().instances[0].cached_block_hashes,
            [11]
        );
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_state_updates_are_invalid_and_change_nothing() {
    use proto::request_event::Event;
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        h.push(vec![full_update(
            A,
            1_000_000,
            vec![request("w", 10, 0, 0)],
            vec![],
        )])
        .await
        .unwrap();
        let before = h.snapshot(0).await.unwrap();
        let mut bad_gauges = full_update(A, 1_100_000, vec![], vec![]);
        bad_gauges.gauges = Some(proto::Gauges {
            running: 0,
            waiting: 0,
            kv_usage: 1.5,
            ..Default::default()
        });
        let mut bad_transfers = full_update(A, 1_100_000, vec![], vec![]);
        bad_transfers.gauges = Some(proto::Gauges {
            transfers: Some(proto::KvTransferCounters {
                transfers: 3.0,
                bytes: f64::NAN,
                ..Default::default()
            }),
            ..Default::default()
        });
        let first_token_unknown = proto::InstanceStateUpdate {
            instance_id: A.to_owned(),
            observed_at_us: 1_100_000,
            events: vec![event(
                1_050_000,
                Event::FirstToken(proto::RequestFirstToken {
                    request_id: "nope".into(),
                }),
            )],
            ..proto::InstanceStateUpdate::default()
        };
        let five_running = (0..5)
            .map(|i| request(&format!("r{i}"), 10, 10, 1))
            .collect();
        let cases = vec![
            (
                full_update("nope", 1_100_000, vec![], vec![]),
                "instance_id",
            ),
            (
                full_update(A, 1_100_000, vec![], vec![request("x", 100, 500, 0)]),
                "requests.running[0].computed_tokens",
            ),
            (
                full_update(A, 1_100_000, vec![request("x", -5, 0, 0)], vec![]),
                "requests.waiting[0].prompt_tokens",
            ),
            (
                full_update(A, 1_100_000, vec![request("x", 5000, 0, 0)], vec![]),
                "requests.waiting[0].prompt_tokens",
            ),
            (
                full_update(A, 1_100_000, vec![], five_running),
                "requests.running",
            ),
            (
                full_update(
                    A,
                    1_100_000,
                    vec![proto::RequestState {
                        cached_tokens: 11,
                        ..request("x", 10, 0, 0)
                    }],
                    vec![],
                ),
                "requests.waiting[0].cached_tokens",
            ),
            (
                full_update(
                    A,
                    1_100_000,
                    vec![request("x", 10, 0, 0), request("x", 10, 0, 0)],
                    vec![],
                ),
                "requests.waiting[1].request_id",
            ),
            (full_update(A, 0, vec![], vec![]), "observed_at_us"),
            (full_update(A, 999_999, vec![], vec![]), "observed_at_us"),
            (bad_gauges, "gauges.kv_usage"),
            (bad_transfers, "gauges.transfers.bytes"),
            (first_token_unknown, "events[0].first_token.request_id"),
        ];
        for (update, field) in cases {
            check(h.push(vec![update]).await, Code::InvalidArgument, field);
            assert_eq!(h.snapshot(0).await.unwrap(), before, "after a bad {field}");
        }
        // Messages before a rejected one stay applied; the error names the message.
        let good = full_update(B, 1_000_000, vec![], vec![]);
        let bad = full_update(B, 1_000_000, vec![request("x", -1, 0, 0)], vec![]);
        let status = h.push(vec![good, bad]).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status
                .message()
                .starts_with("stream message 1: requests.waiting[0].prompt_tokens"),
            "{}",
            status.message()
        );
        assert_eq!(
            h.snapshot(0).await.unwrap().generation,
            before.generation + 1
        );
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_configs_are_invalid_and_change_nothing() {
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        let before = h.snapshot(0).await.unwrap();
        let mut negative_tp = config();
        negative_tp.instances[0].tp = -1;
        let mut duplicate = config();
        duplicate.instances[1].id = A.to_owned();
        let mut unknown_model = config();
        unknown_model.instances[1].model = "no-such-model".to_owned();
        let mut bad_scorer = config();
        bad_scorer.router = Some(proto::RouterPolicy {
            policy: "weighted".into(),
            scorers: vec![proto::ScorerSpec {
                name: "astrology".into(),
                weight: 1.0,
                ..proto::ScorerSpec::default()
            }],
            picker: String::new(),
        });
        let mut bad_blocks = config();
        bad_blocks.instances[0].engine.as_mut().unwrap().block_size = Some(-16);
        let cases = vec![
            (proto::ClusterConfig::default(), "instances"),
            (negative_tp, "instances[0].tp"),
            (duplicate, "instances[1].id"),
            (unknown_model, "instances[1].model"),
            (bad_scorer, "router.scorers[0].name"),
            (bad_blocks, "instances[0].engine.block_size"),
        ];
        for (config, field) in cases {
            check(
                h.twin.sync_cluster_config(config).await,
                Code::InvalidArgument,
                field,
            );
            assert_eq!(h.snapshot(0).await.unwrap(), before, "after a bad {field}");
        }
        check(
            h.twin
                .get_snapshot(proto::GetSnapshotRequest {
                    now_us: -1,
                    ..proto::GetSnapshotRequest::default()
                })
                .await,
            Code::InvalidArgument,
            "now_us",
        );
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_questions_get_invalid_argument_or_resource_exhausted() {
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        let limits = ditto::twin::Limits::DEFAULT;
        let with = |edit: &dyn Fn(&mut proto::PredictRoutingRequest)| {
            let mut question = routing_question();
            edit(&mut question);
            question
        };
        let cases: Vec<(proto::PredictRoutingRequest, Code, &str)> = vec![
            (
                with(&|q| q.request = None),
                Code::InvalidArgument,
                "request",
            ),
            (
                with(&|q| q.request.as_mut().unwrap().prompt_tokens = -5),
                Code::InvalidArgument,
                "request.prompt_tokens",
            ),
            (
                with(&|q| q.request.as_mut().unwrap().expected_output = None),
                Code::InvalidArgument,
                "request.expected_output",
            ),
            (
                with(&|q| q.request.as_mut().unwrap().slo_class = "vip".into()),
                Code::InvalidArgument,
                "request.slo_class",
            ),
            (
                with(&|q| q.candidate_instance_ids = vec!["ghost".into()]),
                Code::InvalidArgument,
                "candidate_instance_ids[0]",
            ),
            (
                with(&|q| q.candidate_instance_ids = vec![A.into(), A.into()]),
                Code::InvalidArgument,
                "candidate_instance_ids[1]",
            ),
            (
                with(&|q| {
                    q.options = Some(proto::PredictOptions {
                        quantiles: vec![1.0],
                        ..Default::default()
                    })
                }),
                Code::InvalidArgument,
                "options.quantiles[0]",
            ),
            (with(&|q| q.now_us = 1), Code::InvalidArgument, "now_us"),
            (
                with(&|q| {
                    q.options = Some(proto::PredictOptions {
                        replications: i64::from(limits.max_replications) + 1,
                        ..Default::default()
                    })
                }),
                Code::ResourceExhausted,
                "options.replications",
            ),
            (
                with(&|q| {
                    q.options = Some(proto::PredictOptions {
                        horizon_ms: 1e9,
                        ..Default::default()
                    })
                }),
                Code::ResourceExhausted,
                "options.horizon_ms",
            ),
            (
                with(&|q| {
                    q.candidate_instance_ids = (0..=limits.max_candidates)
                        .map(|i| format!("c{i}"))
                        .collect()
                }),
                Code::ResourceExhausted,
                "candidate_instance_ids",
            ),
            (
                with(&|q| q.snapshot_generation = 77),
                Code::NotFound,
                "generation",
            ),
        ];
        // `now_us: 1` precedes an observation only once there is one.
        h.push(vec![full_update(A, 1_000_000, vec![], vec![])])
            .await
            .unwrap();
        for (question, code, field) in cases {
            check(h.twin.predict_routing(question).await, code, field);
        }

        let forecast = |edit: &dyn Fn(&mut proto::ForecastCapacityRequest)| {
            let mut question = forecast_question();
            edit(&mut question);
            question
        };
        let cases: Vec<(proto::ForecastCapacityRequest, Code, &str)> = vec![
            (
                forecast(&|q| q.stages.clear()),
                Code::InvalidArgument,
                "stages",
            ),
            (
                forecast(&|q| q.stages[0].rate_rps = -1.0),
                Code::InvalidArgument,
                "stages[0].rate_rps",
            ),
            (
                forecast(&|q| q.input_tokens = None),
                Code::InvalidArgument,
                "input_tokens",
            ),
            (
                forecast(&|q| q.variants[0].template_instance_id = "ghost".into()),
                Code::InvalidArgument,
                "variants[0].template_instance_id",
            ),
            (
                forecast(&|q| q.variants[0].replica_counts = vec![0]),
                Code::InvalidArgument,
                "variants[0].replica_counts[0]",
            ),
            (
                forecast(&|q| q.target_attainment = 2.0),
                Code::InvalidArgument,
                "target_attainment",
            ),
            (
                forecast(&|q| q.replications = i64::from(limits.max_replications) + 1),
                Code::ResourceExhausted,
                "replications",
            ),
            (
                forecast(&|q| {
                    q.variants[0].replica_counts =
                        (1..=i64::from(limits.max_forecast_candidates) + 1).collect()
                }),
                Code::ResourceExhausted,
                "variants",
            ),
            (
                forecast(&|q| q.stages[0].duration_s = 1e9),
                Code::ResourceExhausted,
                "stages",
            ),
        ];
        for (question, code, field) in cases {
            check(h.twin.forecast_capacity(question).await, code, field);
        }
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_prediction_stream_answers_each_question_in_order() {
    use proto::predict_routing_stream_response::Result as Outcome;
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        let mut bad = routing_question();
        bad.request_id = "bad".into();
        bad.request.as_mut().unwrap().prompt_tokens = -1;
        let mut good = routing_question();
        good.request_id = "good".into();
        let responses: Vec<_> = h
            .twin
            .predict_routing_stream(tokio_stream::iter(vec![bad, good]))
            .await
            .unwrap()
            .into_inner()
            .collect()
            .await;
        assert_eq!(responses.len(), 2);
        let first = responses[0].as_ref().unwrap();
        assert_eq!(first.request_id, "bad");
        match &first.result {
            Some(Outcome::Error(err)) => {
                assert_eq!(err.code, Code::InvalidArgument as i32);
                assert!(
                    err.message.starts_with("request.prompt_tokens"),
                    "{}",
                    err.message
                );
            }
            other => panic!("expected an error, got {other:?}"),
        }
        let second = responses[1].as_ref().unwrap();
        assert_eq!(second.request_id, "good");
        match &second.result {
            Some(Outcome::Answer(answer)) => assert_eq!(answer.request_id, "good"),
            Some(Outcome::Error(err)) => {
                assert_ne!(err.code, Code::InvalidArgument as i32, "{}", err.message)
            }
            None => panic!("empty stream response"),
        }
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_push_stream_past_its_deadline_ends_with_deadline_exceeded() {
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        // The client sends one update and then keeps the stream open without sending more.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(full_update(A, 1_000_000, vec![], vec![]))
            .await
            .unwrap();
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        request.set_timeout(Duration::from_millis(300));
        let status = h.twin.push_instance_state(request).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::DeadlineExceeded,
            "{}",
            status.message()
        );
        assert!(
            status.message().contains("after 1 accepted"),
            "{}",
            status.message()
        );
        drop(tx);
        h.stop().await;
    })
    .await;
}

async fn service_names(h: &Harness, v1: bool) -> Vec<String> {
    if v1 {
        use tonic_reflection::pb::v1::ServerReflectionRequest;
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
        let mut client = ServerReflectionClient::new(h.channel.clone());
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut responses = client
            .server_reflection_info(tokio_stream::iter(vec![request]))
            .await
            .unwrap()
            .into_inner();
        match responses.next().await.unwrap().unwrap().message_response {
            Some(MessageResponse::ListServicesResponse(list)) => {
                list.service.into_iter().map(|s| s.name).collect()
            }
            other => panic!("unexpected reflection response {other:?}"),
        }
    } else {
        use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
        let mut client = ServerReflectionClient::new(h.channel.clone());
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut responses = client
            .server_reflection_info(tokio_stream::iter(vec![request]))
            .await
            .unwrap()
            .into_inner();
        match responses.next().await.unwrap().unwrap().message_response {
            Some(MessageResponse::ListServicesResponse(list)) => {
                list.service.into_iter().map(|s| s.name).collect()
            }
            other => panic!("unexpected reflection response {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reflection_v1_and_v1alpha_list_the_twin() {
    within(async {
        let h = Harness::start(Some(config()), |_| {}).await;
        for v1 in [true, false] {
            let names = service_names(&h, v1).await;
            assert!(names.iter().any(|n| n == "ditto.v1.Twin"), "{names:?}");
            assert!(
                names.iter().any(|n| n == "grpc.health.v1.Health"),
                "{names:?}"
            );
        }
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_health_and_readiness_over_http() {
    within(async {
        let mut h = Harness::start(None, |_| {}).await;
        let http = h.server.http_addr();
        assert!(http_get(http, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(http_get(http, "/readyz").await.starts_with("HTTP/1.1 503"));
        h.twin.sync_cluster_config(config()).await.unwrap();
        h.push_kv(vec![
            kv(1, 1_000_000, vec![stored(vec![1])]),
            kv(3, 1_000_001, vec![stored(vec![2])]),
        ])
        .await
        .unwrap();
        assert!(http_get(http, "/readyz").await.starts_with("HTTP/1.1 200"));
        let metrics = http_get(http, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        for needle in [
            "ditto_rpc_requests_total{code=\"Ok\",rpc=\"SyncClusterConfig\"} 1",
            "ditto_snapshot_generation 3",
            "ditto_kv_event_seq_gaps_total 1",
            "ditto_kv_events_total{type=\"stored\"} 2",
            "ditto_signal_age_seconds{instance=\"ns/vllm-0:8000\",signal=\"kv_events\"}",
            "ditto_instances 2",
        ] {
            assert!(metrics.contains(needle), "missing {needle:?} in\n{metrics}");
        }
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_reports_not_serving_then_stops_accepting() {
    within(async {
        let h = Harness::start(Some(config()), |_| {}).await;
        let grpc = h.server.grpc_addr();
        let mut health = HealthClient::new(h.channel.clone());
        let request = tonic_health::pb::HealthCheckRequest {
            service: "ditto.v1.Twin".to_owned(),
        };
        let mut watch = health.watch(request).await.unwrap().into_inner();
        let first = watch.next().await.unwrap().unwrap();
        assert_eq!(first.status, ServingStatus::Serving as i32);
        // The open watch keeps a call in flight, so the shutdown drains until its bound.
        let stopping = tokio::spawn(h.stop());
        let next = watch.next().await.unwrap().unwrap();
        assert_eq!(next.status, ServingStatus::NotServing as i32);
        stopping.await.unwrap();
        let connect = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await;
        assert!(connect.is_err(), "the listener is closed after shutdown");
    })
    .await;
}
