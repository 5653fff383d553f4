#![allow(clippy::unwrap_used)]
//! `ditto serve` against a hostile client (issue 15, item 7), over real sockets with tonic
//! clients and raw bytes: a call whose client went away or whose deadline passed frees its
//! simulation slot; huge distribution parameters, oversized or unprintable ids and
//! undecodable protobuf bytes are INVALID_ARGUMENT naming the field; error messages stay
//! short; no rejected write changes the mirror.

use std::time::Duration;

mod common;

use common::server::{Harness, Raw};
use common::within;
use ditto::server::ServerOptions;
use ditto::server::proto;
use tonic::Code;

const A: &str = "ns/vllm-0:8000";

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
        instances: vec![instance(A)],
        ..proto::ClusterConfig::default()
    }
}

fn routing_question() -> proto::PredictRoutingRequest {
    proto::PredictRoutingRequest {
        request: Some(proto::CandidateRequest {
            prompt_tokens: 200,
            expected_output: Some(proto::candidate_request::ExpectedOutput::OutputTokens(16)),
            ..proto::CandidateRequest::default()
        }),
        request_id: "q".to_owned(),
        ..proto::PredictRoutingRequest::default()
    }
}

fn constant(value: i64) -> proto::LengthDistribution {
    proto::LengthDistribution {
        dist: Some(proto::length_distribution::Dist::Constant(value)),
    }
}

/// A forecast that simulates for many seconds: a long, heavily overloaded horizon.
fn heavy_forecast() -> proto::ForecastCapacityRequest {
    proto::ForecastCapacityRequest {
        stages: vec![proto::RateStage {
            rate_rps: 2000.0,
            duration_s: 590.0,
        }],
        input_tokens: Some(constant(1000)),
        output_tokens: Some(constant(1000)),
        variants: vec![proto::VariantCandidates {
            template_instance_id: A.to_owned(),
            replica_counts: vec![1],
        }],
        replications: 2,
        ..proto::ForecastCapacityRequest::default()
    }
}

fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// One simulation slot and a long server-side call limit, so only cancellation can free the
/// slot early.
fn one_slot(options: &mut ServerOptions) {
    options.service.max_concurrent_simulations = 1;
    options.service.max_call = Duration::from_secs(600);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_whose_client_went_away_frees_its_simulation_slot() {
    within(async {
        let h = Harness::start(Some(config()), one_slot).await;
        let mut heavy = h.twin.clone();
        let call = tokio::spawn(async move { heavy.forecast_capacity(heavy_forecast()).await });
        // Wait until the forecast is in flight, then the client goes away.
        while h.server.lifecycle().in_flight() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        call.abort();
        let _ = call.await;
        // The slot is free long before the forecast would have ended (minutes): a question
        // with a generous deadline gets its answer instead of "waiting for a simulation slot".
        let mut twin = h.twin.clone();
        let answer = twin
            .predict_routing(with_timeout(routing_question(), Duration::from_secs(20)))
            .await;
        assert!(answer.is_ok(), "{answer:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_past_its_deadline_frees_its_simulation_slot() {
    within(async {
        let h = Harness::start(Some(config()), one_slot).await;
        let mut twin = h.twin.clone();
        let status = twin
            .forecast_capacity(with_timeout(heavy_forecast(), Duration::from_millis(300)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        let answer = twin
            .predict_routing(with_timeout(routing_question(), Duration::from_secs(20)))
            .await;
        assert!(answer.is_ok(), "{answer:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn huge_distribution_parameters_are_invalid_naming_the_field() {
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        use proto::length_distribution::Dist;
        let cases = [
            (
                Dist::Lognormal(proto::LognormalLength {
                    mu: 1e6,
                    sigma: 1e6,
                }),
                "input_tokens.lognormal.mu",
            ),
            (
                Dist::Lognormal(proto::LognormalLength {
                    mu: 5.0,
                    sigma: 1e6,
                }),
                "input_tokens.lognormal.sigma",
            ),
            (Dist::ExponentialMean(1e9), "input_tokens.exponential_mean"),
            (
                Dist::Gaussian(proto::GaussianLength {
                    mean: 1e12,
                    stdev: 1.0,
                    ..Default::default()
                }),
                "input_tokens.gaussian.mean",
            ),
        ];
        for (dist, field) in cases {
            let mut question = heavy_forecast();
            question.input_tokens = Some(proto::LengthDistribution { dist: Some(dist) });
            let status = h.twin.forecast_capacity(question).await.unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
            assert!(status.message().starts_with(field), "{status:?}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn error_messages_stay_short() {
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        let mut question = heavy_forecast();
        question.stages[0].duration_s = 1e300;
        let status = h.twin.forecast_capacity(question).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().len() < 120, "{}", status.message());
        let mut question = routing_question();
        question.options = Some(proto::PredictOptions {
            horizon_ms: 1e300,
            ..Default::default()
        });
        let status = h.twin.predict_routing(question).await.unwrap_err();
        assert!(
            status.message().contains("options.horizon_ms"),
            "{status:?}"
        );
        assert!(status.message().len() < 120, "{}", status.message());
        // An unknown id of the largest accepted size is echoed, but the message stays bounded.
        let mut question = routing_question();
        question.candidate_instance_ids = vec!["x".repeat(256)];
        let status = h.twin.predict_routing(question).await.unwrap_err();
        assert!(status.message().chars().count() <= 257, "{status:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_or_unprintable_ids_are_invalid_and_change_nothing() {
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        let before = h.snapshot(0).await.unwrap();
        let huge = "i".repeat(1024 * 1024);
        // Config: a 1 MB instance id, an id with a newline, a huge address.
        let mut bad = config();
        bad.instances.push(instance(&huge));
        let status = h.twin.sync_cluster_config(bad).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().starts_with("instances[1].id"),
            "{status:?}"
        );
        assert!(status.message().len() < 200);
        let mut bad = config();
        bad.instances.push(instance("evil\nid"));
        let status = h.twin.sync_cluster_config(bad).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with("instances[1].id"));
        let mut bad = config();
        bad.instances[0].address = huge.clone();
        let status = h.twin.sync_cluster_config(bad).await.unwrap_err();
        assert!(
            status.message().starts_with("instances[0].address"),
            "{status:?}"
        );
        // State pushes: a huge instance id, a huge request id.
        let update = |instance_id: &str, request_id: &str| proto::InstanceStateUpdate {
            instance_id: instance_id.to_owned(),
            observed_at_us: 1_000_000,
            requests: Some(proto::RequestLists {
                waiting: vec![proto::RequestState {
                    request_id: request_id.to_owned(),
                    arrival_us: 900_000,
                    prompt_tokens: 10,
                    max_tokens: 10,
                    ..Default::default()
                }],
                running: vec![],
                step_end_us: 0,
            }),
            ..Default::default()
        };
        let status = h
            .twin
            .push_instance_state(tokio_stream::iter(vec![update(&huge, "r")]))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("instance_id"), "{status:?}");
        assert!(status.message().len() < 200);
        let status = h
            .twin
            .push_instance_state(tokio_stream::iter(vec![update(A, &huge)]))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("requests.waiting[0].request_id"),
            "{status:?}"
        );
        // KV events for a huge instance id.
        let batch = proto::KvEventBatch {
            instance_id: huge.clone(),
            seq: 1,
            ts_us: 1_000_000,
            events: vec![],
        };
        let status = h
            .twin
            .push_kv_events(tokio_stream::iter(vec![batch]))
            .await
            .unwrap_err();
        assert!(status.message().contains("instance_id"), "{status:?}");
        // Questions: a huge request id and candidate id.
        let mut question = routing_question();
        question.request_id = huge.clone();
        let status = h.twin.predict_routing(question).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with("request_id"), "{status:?}");
        let mut question = routing_question();
        question.candidate_instance_ids = vec![huge.clone()];
        let status = h.twin.predict_routing(question).await.unwrap_err();
        assert!(
            status.message().starts_with("candidate_instance_ids[0]"),
            "{status:?}"
        );
        let mut question = heavy_forecast();
        question.variants[0].template_instance_id = huge.clone();
        let status = h.twin.forecast_capacity(question).await.unwrap_err();
        assert!(
            status
                .message()
                .starts_with("variants[0].template_instance_id"),
            "{status:?}"
        );
        assert_eq!(
            h.snapshot(0).await.unwrap(),
            before,
            "a rejected write changed the mirror"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn undecodable_protobuf_bytes_are_invalid_argument() {
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        let before = h.snapshot(0).await.unwrap();
        // Field 1 (length-delimited) claiming more bytes than follow; a bad wire type.
        let garbage: [&[u8]; 2] = [&[0x0a, 0xff, 0xff, 0xff, 0x0f, 0x01], &[0x0f, 0x01]];
        let methods = [
            "/ditto.v1.Twin/SyncClusterConfig",
            "/ditto.v1.Twin/PredictRouting",
            "/ditto.v1.Twin/ForecastCapacity",
            "/ditto.v1.Twin/GetSnapshot",
        ];
        for method in methods {
            for bytes in garbage {
                let mut grpc = tonic::client::Grpc::new(h.channel.clone());
                grpc.ready().await.unwrap();
                let path = http::uri::PathAndQuery::from_static(method);
                let status = grpc
                    .unary(tonic::Request::new(bytes.to_vec()), path, Raw)
                    .await
                    .unwrap_err();
                assert_eq!(status.code(), Code::InvalidArgument, "{method}: {status:?}");
                assert!(status.message().len() < 300);
            }
        }
        for method in [
            "/ditto.v1.Twin/PushInstanceState",
            "/ditto.v1.Twin/PushKvEvents",
        ] {
            let mut grpc = tonic::client::Grpc::new(h.channel.clone());
            grpc.ready().await.unwrap();
            let path = http::uri::PathAndQuery::from_static(method);
            let stream = tokio_stream::iter(vec![garbage[0].to_vec()]);
            let status = grpc
                .client_streaming(tonic::Request::new(stream), path, Raw)
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{method}: {status:?}");
        }
        assert_eq!(
            h.snapshot(0).await.unwrap(),
            before,
            "a rejected write changed the mirror"
        );
    })
    .await;
}
