#![allow(clippy::unwrap_used)]
//! What the server's observation layer records, over real sockets: every gRPC call counted
//! once with the status its client saw (a prediction stream ended by undecodable bytes is
//! INVALID_ARGUMENT, answered up to that point, and counted), HTTP predictor calls counted
//! as errors only when they fail; and error paths that are the wire message's own field
//! names.

mod common;

use common::server::{Harness, Raw, sample};
use common::wire::assert_field_path;
use common::within;
use ditto::server::proto;
use prost::Message;
use tonic::Code;

const A: &str = "ns/vllm-0:8000";

fn config() -> proto::ClusterConfig {
    proto::ClusterConfig {
        instances: vec![proto::InstanceSpec {
            id: A.to_owned(),
            address: "vllm-0:8000".to_owned(),
            engine: Some(proto::EngineLimits {
                num_gpu_blocks: Some(64),
                max_num_seqs: Some(4),
                max_model_len: Some(4096),
                ..proto::EngineLimits::default()
            }),
            ..proto::InstanceSpec::default()
        }],
        ..proto::ClusterConfig::default()
    }
}

fn question(id: &str) -> proto::PredictRoutingRequest {
    proto::PredictRoutingRequest {
        request: Some(proto::CandidateRequest {
            prompt_tokens: 200,
            expected_output: Some(proto::candidate_request::ExpectedOutput::OutputTokens(16)),
            ..proto::CandidateRequest::default()
        }),
        options: Some(proto::PredictOptions {
            replications: 1,
            ..proto::PredictOptions::default()
        }),
        request_id: id.to_owned(),
        ..proto::PredictRoutingRequest::default()
    }
}

/// Field 1 (length-delimited) claiming more bytes than follow.
const GARBAGE: &[u8] = &[0x0a, 0xff, 0xff, 0xff, 0x0f, 0x01];

#[tokio::test(flavor = "multi_thread")]
async fn undecodable_bytes_end_a_prediction_stream_with_invalid_argument_and_are_counted() {
    within(async {
        let h = Harness::start(Some(config()), |_| {}).await;
        let messages = vec![
            question("first").encode_to_vec(),
            GARBAGE.to_vec(),
            question("third").encode_to_vec(),
        ];
        let mut grpc = tonic::client::Grpc::new(h.channel.clone());
        grpc.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static("/ditto.v1.Twin/PredictRoutingStream");
        let response = grpc
            .streaming(tonic::Request::new(tokio_stream::iter(messages)), path, Raw)
            .await
            .unwrap();
        let mut stream = response.into_inner();
        let mut answers = Vec::new();
        let status = loop {
            match stream.message().await {
                Ok(Some(bytes)) => answers
                    .push(proto::PredictRoutingStreamResponse::decode(bytes.as_slice()).unwrap()),
                Ok(None) => panic!("the stream ended OK after {} answers", answers.len()),
                Err(status) => break status,
            }
        };
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert_eq!(answers[0].request_id, "first");
        assert!(matches!(
            answers[0].result,
            Some(proto::predict_routing_stream_response::Result::Answer(_))
        ));
        let metrics = h.metrics().await;
        let series =
            "ditto_rpc_requests_total{code=\"InvalidArgument\",rpc=\"PredictRoutingStream\"}";
        assert_eq!(sample(&metrics, series), Some(1.0), "{metrics}");
        let errors =
            "ditto_rpc_errors_total{code=\"InvalidArgument\",rpc=\"PredictRoutingStream\"}";
        assert_eq!(sample(&metrics, errors), Some(1.0), "{metrics}");
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_method_counts_undecodable_bytes_as_invalid_argument() {
    within(async {
        let h = Harness::start(Some(config()), |_| {}).await;
        for method in ["PredictRouting", "GetSnapshot", "ForecastCapacity"] {
            let mut grpc = tonic::client::Grpc::new(h.channel.clone());
            grpc.ready().await.unwrap();
            let path: http::uri::PathAndQuery = format!("/ditto.v1.Twin/{method}").parse().unwrap();
            let status = grpc
                .unary(tonic::Request::new(GARBAGE.to_vec()), path, Raw)
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{method}: {status:?}");
        }
        let metrics = h.metrics().await;
        for method in ["PredictRouting", "GetSnapshot", "ForecastCapacity"] {
            let series =
                format!("ditto_rpc_requests_total{{code=\"InvalidArgument\",rpc=\"{method}\"}}");
            assert_eq!(sample(&metrics, &series), Some(1.0), "{series}\n{metrics}");
        }
        h.stop().await;
    })
    .await;
}

const ENTRY: &str = r#"{"kv_cache_percentage": 0.1, "input_token_length": 200,
    "num_request_waiting": 0, "num_request_running": 1, "num_tokens_generated": 0,
    "prefix_cache_score": 0.0}"#;

#[tokio::test(flavor = "multi_thread")]
async fn successful_predictor_calls_are_not_errors() {
    within(async {
        let h = Harness::start(Some(config()), |_| {}).await;
        let answer = h.http_post("/predict", ENTRY).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let answer = h
            .http_post(
                "/predict/bulk/strict",
                &format!("{{\"requests\": [{ENTRY}]}}"),
            )
            .await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let refused = h.http_post("/predict", "{}").await;
        assert!(refused.starts_with("HTTP/1.1 422"), "{refused}");
        let metrics = h.metrics().await;
        let errors: Vec<&str> = metrics
            .lines()
            .filter(|line| line.starts_with("ditto_rpc_errors_total{"))
            .collect();
        assert_eq!(
            errors,
            ["ditto_rpc_errors_total{code=\"InvalidArgument\",rpc=\"http:/predict\"} 1"],
            "{metrics}"
        );
        for (series, count) in [
            (
                "ditto_rpc_requests_total{code=\"Ok\",rpc=\"http:/predict\"}",
                1.0,
            ),
            (
                "ditto_rpc_requests_total{code=\"Ok\",rpc=\"http:/predict/bulk/strict\"}",
                1.0,
            ),
            (
                "ditto_http_requests_total{code=\"200\",route=\"/predict\"}",
                1.0,
            ),
            (
                "ditto_http_requests_total{code=\"422\",route=\"/predict\"}",
                1.0,
            ),
        ] {
            assert_eq!(sample(&metrics, series), Some(count), "{series}\n{metrics}");
        }
        h.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn error_paths_are_the_messages_own_field_names() {
    within(async {
        let mut h = Harness::start(Some(config()), |_| {}).await;
        let forecast = |rate_rps: f64| proto::ForecastCapacityRequest {
            stages: vec![proto::RateStage {
                rate_rps,
                duration_s: 10.0,
            }],
            input_tokens: Some(proto::LengthDistribution {
                dist: Some(proto::length_distribution::Dist::Constant(100)),
            }),
            output_tokens: Some(proto::LengthDistribution {
                dist: Some(proto::length_distribution::Dist::Constant(10)),
            }),
            variants: vec![proto::VariantCandidates {
                template_instance_id: A.to_owned(),
                replica_counts: vec![1],
            }],
            replications: 1,
            ..proto::ForecastCapacityRequest::default()
        };
        for rate in [1e300, 0.0, 2e6] {
            let status = h.twin.forecast_capacity(forecast(rate)).await.unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{rate}: {status:?}");
            assert!(
                status.message().starts_with("stages[0].rate_rps: "),
                "{rate}: {status:?}"
            );
        }
        let mut unknown = question("q");
        unknown.candidate_instance_ids = vec![A.to_owned(), "ns/absent:8000".to_owned()];
        let status = h.twin.predict_routing(unknown).await.unwrap_err();
        assert!(
            status.message().starts_with("candidate_instance_ids[1]: "),
            "{status:?}"
        );
        let mut hashes = question("q");
        if let Some(request) = hashes.request.as_mut() {
            request.block_hashes = vec![7, 7];
        }
        let status = h.twin.predict_routing(hashes).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        let path = status.message().split(": ").next().unwrap();
        assert_field_path("ditto.v1.PredictRoutingRequest", path);
        h.stop().await;
    })
    .await;
}

#[test]
#[should_panic(expected = "is not a field of .ditto.v1.RateStage")]
fn a_path_outside_the_wire_message_is_caught() {
    assert_field_path("ditto.v1.ForecastCapacityRequest", "stages[0].rate_rps");
    assert_field_path("ditto.v1.ForecastCapacityRequest", "stages[0].rate");
}
