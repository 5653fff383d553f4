//! The key correctness test, through the public API: run a cluster simulation to time T,
//! push its state to a real `ditto` server over gRPC (requests, the step in flight, cached
//! blocks as KV events), ask PredictRouting about a new request with known lengths and one
//! replication, then continue the original simulation with the request routed to each
//! candidate: the predicted TTFT and E2E equal the continued simulation's exactly. Also: the
//! same snapshot, question and seed give byte-identical responses.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ditto::cluster::{Cluster, spec};
use ditto::server::proto;
use ditto::server::proto::twin_client::TwinClient;
use ditto::server::{ServerOptions, start};
use ditto::sim::engine::RestoredRequest;
use ditto::sim::kv::hash::prompt_block_keys;
use ditto::sim::{Engine, RequestSpec};
use ditto::workload::{ArrivalProcess, LengthDist, PrefixSpec, WorkloadSpec};
use prost::Message;

const LATENCY_MODEL: &str = "calibrated";
const CLUSTER_YAML: &str = "
pools:
  - name: vllm
    replicas: 3
    latency_model: calibrated
    engine: {max_num_seqs: 64}
routing: {policy: round-robin}
staleness: {refresh_interval_ms: 0}
";

fn proto_config() -> proto::ClusterConfig {
    let instance = |index: usize| proto::InstanceSpec {
        id: format!("vllm-{index}"),
        engine: Some(proto::EngineLimits {
            max_num_seqs: Some(64),
            ..proto::EngineLimits::default()
        }),
        latency_model: LATENCY_MODEL.into(),
        ..proto::InstanceSpec::default()
    };
    proto::ClusterConfig {
        instances: (0..3).map(instance).collect(),
        router: Some(proto::RouterPolicy {
            policy: "round-robin".into(),
            ..proto::RouterPolicy::default()
        }),
        ..proto::ClusterConfig::default()
    }
}

fn requests() -> Vec<RequestSpec> {
    let mut spec = WorkloadSpec::single_client(
        11,
        3_000,
        40.0,
        ArrivalProcess::Poisson,
        LengthDist::gaussian(800.0, 400.0, 2, 4000),
        LengthDist::gaussian(220.0, 120.0, 2, 1000),
    );
    spec.prefix = Some(PrefixSpec {
        groups: 4,
        length: 320,
    });
    spec.generator().unwrap().collect()
}

fn request_state(r: &RestoredRequest) -> proto::RequestState {
    proto::RequestState {
        request_id: r.spec.id.0.to_string(),
        arrival_us: r.spec.arrival_us as i64,
        prompt_tokens: i64::from(r.spec.input_tokens),
        computed_tokens: i64::from(r.computed_tokens),
        cached_tokens: i64::from(r.cached_tokens),
        output_tokens: i64::from(r.generated),
        max_tokens: i64::from(r.spec.max_tokens),
        known_output_tokens: Some(i64::from(r.spec.output_tokens)),
        priority: Some(r.spec.priority),
        slo_class: r.spec.slo_class.as_str().into(),
        block_hashes: prompt_block_keys(&r.spec, 16),
        scheduled_tokens: i64::from(r.scheduled_tokens),
        ..proto::RequestState::default()
    }
}

/// What an observer of each vLLM instance would push at `now`.
fn observations(
    engine: &Engine,
    id: &str,
    now: u64,
) -> (proto::InstanceStateUpdate, proto::KvEventBatch) {
    let observed = engine.observe();
    let update = proto::InstanceStateUpdate {
        instance_id: id.into(),
        observed_at_us: now as i64,
        requests: Some(proto::RequestLists {
            waiting: observed.waiting.iter().map(request_state).collect(),
            running: observed.running.iter().map(request_state).collect(),
            step_end_us: observed.step_end_us.map_or(0, |t| t as i64),
        }),
        ..proto::InstanceStateUpdate::default()
    };
    let mut hashes = observed.cached_keys;
    let mut seen = std::collections::HashSet::new();
    hashes.retain(|h| seen.insert(*h));
    let kv = proto::KvEventBatch {
        instance_id: id.into(),
        seq: 1,
        ts_us: now as i64,
        events: vec![proto::KvEvent {
            event: Some(proto::kv_event::Event::Stored(proto::BlockStored {
                block_hashes: hashes,
                ..proto::BlockStored::default()
            })),
        }],
    };
    (update, kv)
}

fn question(now: u64, seed: u64) -> proto::PredictRoutingRequest {
    proto::PredictRoutingRequest {
        request: Some(proto::CandidateRequest {
            prompt_tokens: 2_000,
            expected_output: Some(proto::candidate_request::ExpectedOutput::OutputTokens(256)),
            max_tokens: 256,
            ..proto::CandidateRequest::default()
        }),
        options: Some(proto::PredictOptions {
            replications: 1,
            horizon_ms: 600_000.0,
            seed: Some(seed),
            ..proto::PredictOptions::default()
        }),
        now_us: now as i64,
        request_id: "self-consistency".into(),
        ..proto::PredictRoutingRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_prediction_equals_the_continued_simulation() {
    tokio::time::timeout(Duration::from_secs(300), async {
        let local = "127.0.0.1:0".parse().unwrap();
        let server = start(ServerOptions::new(local, local)).await.unwrap();
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr()))
                .unwrap()
                .connect()
                .await
                .unwrap();
        let mut twin = TwinClient::new(channel);
        twin.sync_cluster_config(proto_config()).await.unwrap();

        let config = spec::parse_cluster_yaml(CLUSTER_YAML).unwrap();
        let mut cluster = Cluster::new(config, 1).unwrap();
        let mut arrivals = requests().into_iter().peekable();
        let mut kv_seq = 0;
        for cut in [15_000_321u64, 31_000_777] {
            while let Some(spec) = arrivals.next_if(|s| s.arrival_us <= cut) {
                cluster.run_before(spec.arrival_us);
                cluster.submit(spec).unwrap();
            }
            cluster.run_until(cut);
            let mut updates = Vec::new();
            let mut batches = Vec::new();
            kv_seq += 1;
            for (engine, instance) in cluster.engines().iter().zip(&cluster.config().instances) {
                let (update, mut kv) = observations(engine, &instance.id, cut);
                kv.seq = kv_seq;
                // Each cut re-sends the whole cache: clear first.
                kv.events.insert(
                    0,
                    proto::KvEvent {
                        event: Some(proto::kv_event::Event::Cleared(proto::AllBlocksCleared {})),
                    },
                );
                updates.push(update);
                batches.push(kv);
            }
            twin.push_instance_state(tokio_stream::iter(updates))
                .await
                .unwrap();
            twin.push_kv_events(tokio_stream::iter(batches))
                .await
                .unwrap();

            let answer = twin
                .predict_routing(question(cut, 5))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(answer.candidates.len(), 3);
            assert_eq!(answer.seed, 5);
            for (index, prediction) in answer.candidates.iter().enumerate() {
                assert_eq!(prediction.instance_id, format!("vllm-{index}"));
                let mut fork = cluster.clone();
                fork.dispatch_to(index, RequestSpec::synthetic(u64::MAX / 4, cut, 2_000, 256))
                    .unwrap();
                fork.run(Vec::new(), u64::MAX).unwrap();
                let record = fork.engines()[index]
                    .metrics()
                    .records
                    .iter()
                    .find(|r| r.id.0 == u64::MAX / 4)
                    .unwrap()
                    .clone();
                let ttft = prediction.ttft_ms.as_ref().unwrap().mean;
                let e2e = prediction.e2e_ms.as_ref().unwrap().mean;
                assert_eq!(
                    (ttft * 1000.0).round() as u64,
                    record.ttft_us().unwrap(),
                    "cut {cut}, vllm-{index} TTFT"
                );
                assert_eq!(
                    (e2e * 1000.0).round() as u64,
                    record.e2e_us().unwrap(),
                    "cut {cut}, vllm-{index} E2E"
                );
            }
            // Determinism: the same snapshot, question and seed give byte-identical responses.
            let generation = answer.snapshot_generation;
            let mut again = question(cut, 5);
            again.snapshot_generation = generation;
            let second = twin.predict_routing(again).await.unwrap().into_inner();
            assert_eq!(second.encode_to_vec(), answer.encode_to_vec());
        }
        server.shutdown().await.unwrap();
    })
    .await
    .unwrap();
}
