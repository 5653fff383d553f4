#![allow(clippy::unwrap_used)]
//! Property-based fuzzing (proptest) of every request decoder of the server: the pushed
//! state (`InstanceStateUpdate`), KV events (`KvEventBatch`), configs (`ClusterConfig`),
//! routing questions and capacity questions. Inputs are valid messages whose encoded bytes
//! are mutated (flipped, inserted, deleted, truncated bytes: huge varints, wrong wire types,
//! cut fields), plus structured updates with adversarial numbers and ids.
//!
//! For every input: no panic; bytes that do not decode are the client's fault
//! (INVALID_ARGUMENT, `server::codec`); a decoded message that is refused gets a clear
//! error (a client-fault code, a short non-empty message, the field named when invalid) and
//! leaves the mirror exactly as it was (the same snapshot, no new generation). The decoders
//! of bytes from outside the gRPC API (vLLM's KV-event wire format, the latency predictor
//! API's JSON) are fuzzed in `tests/fuzz_wire.rs`.

mod common;

use std::sync::Arc;

use ditto::server::convert::config::cluster_from_proto;
use ditto::server::convert::forecast::forecast_from_proto;
use ditto::server::convert::question::routing_from_proto;
use ditto::server::convert::state::{kv_batch_from_proto, update_from_proto};
use ditto::server::proto;
use ditto::server::status_from;
use ditto::twin::store::{MirrorStore, StoreLimits};
use ditto::twin::{Limits, TwinError};
use proptest::prelude::*;
use prost::Message;
use tonic::Code;

const A: &str = "ns/vllm-0:8000";
const B: &str = "ns/vllm-1:8000";
const NOW_US: u64 = 5_000_000;

fn instance(id: &str) -> proto::InstanceSpec {
    proto::InstanceSpec {
        id: id.to_owned(),
        address: "10.0.0.1:8000".to_owned(),
        engine: Some(proto::EngineLimits {
            num_gpu_blocks: Some(512),
            max_num_seqs: Some(8),
            max_model_len: Some(4096),
            ..proto::EngineLimits::default()
        }),
        ..proto::InstanceSpec::default()
    }
}

fn seed_config() -> proto::ClusterConfig {
    proto::ClusterConfig {
        instances: vec![instance(A), instance(B)],
        ..proto::ClusterConfig::default()
    }
}

fn request(id: &str, running: bool) -> proto::RequestState {
    proto::RequestState {
        request_id: id.to_owned(),
        arrival_us: 900_000,
        prompt_tokens: 100,
        computed_tokens: if running { 100 } else { 0 },
        output_tokens: i64::from(running),
        max_tokens: 50,
        ..proto::RequestState::default()
    }
}

fn seed_update() -> proto::InstanceStateUpdate {
    proto::InstanceStateUpdate {
        instance_id: A.to_owned(),
        observed_at_us: 2_000_000,
        requests: Some(proto::RequestLists {
            waiting: vec![request("w", false)],
            running: vec![request("r", true)],
            step_end_us: 0,
        }),
        ..proto::InstanceStateUpdate::default()
    }
}

fn seed_kv() -> proto::KvEventBatch {
    proto::KvEventBatch {
        instance_id: A.to_owned(),
        seq: 1,
        ts_us: 2_000_000,
        events: vec![
            proto::KvEvent {
                event: Some(proto::kv_event::Event::Stored(proto::BlockStored {
                    block_hashes: vec![11, 12],
                    parent_block_hash: Some(10),
                    ..proto::BlockStored::default()
                })),
            },
            proto::KvEvent {
                event: Some(proto::kv_event::Event::Removed(proto::BlockRemoved {
                    block_hashes: vec![11],
                })),
            },
        ],
    }
}

fn seed_question() -> proto::PredictRoutingRequest {
    proto::PredictRoutingRequest {
        request: Some(proto::CandidateRequest {
            prompt_tokens: 500,
            expected_output: Some(proto::candidate_request::ExpectedOutput::OutputTokens(16)),
            ..proto::CandidateRequest::default()
        }),
        candidate_instance_ids: vec![A.to_owned(), B.to_owned()],
        options: Some(proto::PredictOptions {
            replications: 2,
            ..proto::PredictOptions::default()
        }),
        now_us: NOW_US as i64,
        request_id: "q".to_owned(),
        ..proto::PredictRoutingRequest::default()
    }
}

fn seed_forecast() -> proto::ForecastCapacityRequest {
    let constant = |value| proto::LengthDistribution {
        dist: Some(proto::length_distribution::Dist::Constant(value)),
    };
    proto::ForecastCapacityRequest {
        stages: vec![proto::RateStage {
            rate_rps: 5.0,
            duration_s: 10.0,
        }],
        input_tokens: Some(constant(256)),
        output_tokens: Some(constant(32)),
        variants: vec![proto::VariantCandidates {
            template_instance_id: A.to_owned(),
            replica_counts: vec![1, 2],
        }],
        replications: 1,
        now_us: NOW_US as i64,
        ..proto::ForecastCapacityRequest::default()
    }
}

/// A mirror of the seed config with one state pushed.
fn store() -> MirrorStore {
    let store = MirrorStore::new(StoreLimits::DEFAULT);
    let decoded = cluster_from_proto(&seed_config()).unwrap();
    store
        .sync_config(decoded.cluster, decoded.settings, decoded.addresses)
        .unwrap();
    store
        .apply_state(update_from_proto(&seed_update()).unwrap())
        .unwrap();
    store
}

/// One byte-level edit of an encoded message.
#[derive(Clone, Debug)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Edit::Flip(at, byte)),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Edit::Insert(at, byte)),
        any::<usize>().prop_map(Edit::Delete),
        any::<usize>().prop_map(Edit::Truncate),
    ];
    prop::collection::vec(edit, 1..6)
}

fn mutate(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for edit in edits {
        let len = bytes.len();
        match *edit {
            Edit::Flip(at, byte) if len > 0 => bytes[at % len] ^= byte.max(1),
            Edit::Insert(at, byte) => bytes.insert(at % (len + 1), byte),
            Edit::Delete(at) if len > 0 => {
                bytes.remove(at % len);
            }
            Edit::Truncate(at) => bytes.truncate(at % (len + 1)),
            _ => {}
        }
    }
    bytes
}

/// A refusal is the client's fault, short, non-empty, and names the field when invalid: a
/// path in `message`, the type the client sent.
fn assert_clear(err: &TwinError, message: &str) {
    let status = status_from(err);
    assert!(
        matches!(
            status.code(),
            Code::InvalidArgument
                | Code::NotFound
                | Code::FailedPrecondition
                | Code::ResourceExhausted
        ),
        "{status:?}"
    );
    assert!(!status.message().is_empty());
    assert!(status.message().chars().count() <= 300, "{status:?}");
    if let TwinError::InvalidField { path: field, .. } = err {
        assert!(!field.is_empty(), "{err:?} names no field");
        common::wire::assert_field_path(message, field);
    }
}

/// Runs `write` on the store; on refusal the error must be clear and the mirror unchanged.
fn write_checked<T>(
    store: &MirrorStore,
    message: &str,
    write: impl FnOnce(&MirrorStore) -> Result<T, TwinError>,
) {
    let before = store.latest().unwrap();
    if let Err(err) = write(store) {
        assert_clear(&err, message);
        let after = store.latest().unwrap();
        assert!(
            Arc::ptr_eq(&before.snapshot, &after.snapshot),
            "a refused write changed the mirror: {err:?}"
        );
    }
}

fn update_checked(message: &proto::InstanceStateUpdate) {
    let store = store();
    match update_from_proto(message) {
        Ok(update) => write_checked(&store, "ditto.v1.InstanceStateUpdate", |store| {
            store.apply_state(update)
        }),
        Err(err) => assert_clear(&err, "ditto.v1.InstanceStateUpdate"),
    }
}

fn kv_checked(message: &proto::KvEventBatch) {
    let store = store();
    match kv_batch_from_proto(message) {
        Ok(batch) => write_checked(&store, "ditto.v1.KvEventBatch", |store| {
            store.apply_kv_events(batch)
        }),
        Err(err) => assert_clear(&err, "ditto.v1.KvEventBatch"),
    }
}

fn config_checked(message: &proto::ClusterConfig) {
    let store = store();
    match cluster_from_proto(message) {
        Ok(decoded) => write_checked(&store, "ditto.v1.ClusterConfig", |store| {
            store.sync_config(decoded.cluster, decoded.settings, decoded.addresses)
        }),
        Err(err) => assert_clear(&err, "ditto.v1.ClusterConfig"),
    }
}

fn question_checked(message: &proto::PredictRoutingRequest) {
    let store = store();
    let limits = Limits::DEFAULT;
    match routing_from_proto(message, &limits) {
        Ok(decoded) => {
            if let Err(err) = decoded.resolve(&store.latest().unwrap(), &limits, NOW_US) {
                assert_clear(&err, "ditto.v1.PredictRoutingRequest");
            }
        }
        Err(err) => assert_clear(&err, "ditto.v1.PredictRoutingRequest"),
    }
}

fn forecast_checked(message: &proto::ForecastCapacityRequest) {
    let store = store();
    let limits = Limits::DEFAULT;
    match forecast_from_proto(message, &limits) {
        Ok(decoded) => {
            if let Err(err) = decoded.resolve(&store.latest().unwrap(), NOW_US) {
                assert_clear(&err, "ditto.v1.ForecastCapacityRequest");
            }
        }
        Err(err) => assert_clear(&err, "ditto.v1.ForecastCapacityRequest"),
    }
}

fn ids() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(A.to_owned()),
        Just(B.to_owned()),
        Just(String::new()),
        Just("ghost".to_owned()),
        Just("x".repeat(300)),
        Just("a\u{0}b".to_owned()),
        Just("é".to_owned()),
        "[ -~]{0,24}",
    ]
}

fn numbers() -> impl Strategy<Value = i64> {
    prop_oneof![
        any::<i64>(),
        -10i64..5_000,
        Just(i64::MAX),
        Just(i64::MIN),
        Just(0i64),
    ]
}

fn requests() -> impl Strategy<Value = proto::RequestState> {
    (
        ids(),
        numbers(),
        numbers(),
        numbers(),
        numbers(),
        numbers(),
        proptest::option::of(numbers()),
    )
        .prop_map(
            |(request_id, arrival_us, prompt, computed, output, max_tokens, known)| {
                proto::RequestState {
                    request_id,
                    arrival_us,
                    prompt_tokens: prompt,
                    computed_tokens: computed,
                    output_tokens: output,
                    max_tokens,
                    known_output_tokens: known,
                    ..proto::RequestState::default()
                }
            },
        )
}

fn updates() -> impl Strategy<Value = proto::InstanceStateUpdate> {
    (
        ids(),
        numbers(),
        proptest::option::of((
            prop::collection::vec(requests(), 0..4),
            prop::collection::vec(requests(), 0..4),
            numbers(),
        )),
        prop::collection::vec((numbers(), ids(), 0u8..3), 0..4),
    )
        .prop_map(
            |(instance_id, observed_at_us, lists, events)| proto::InstanceStateUpdate {
                instance_id,
                observed_at_us,
                requests: lists.map(|(waiting, running, step_end_us)| proto::RequestLists {
                    waiting,
                    running,
                    step_end_us,
                }),
                events: events
                    .into_iter()
                    .map(|(at_us, request_id, kind)| proto::RequestEvent {
                        at_us,
                        event: Some(match kind {
                            0 => {
                                proto::request_event::Event::FirstToken(proto::RequestFirstToken {
                                    request_id,
                                })
                            }
                            1 => proto::request_event::Event::Finished(proto::RequestFinished {
                                request_id,
                                ..proto::RequestFinished::default()
                            }),
                            _ => proto::request_event::Event::Routed(proto::RequestRouted {
                                request: Some(proto::RequestState {
                                    request_id,
                                    ..proto::RequestState::default()
                                }),
                            }),
                        }),
                    })
                    .collect(),
                ..proto::InstanceStateUpdate::default()
            },
        )
}

fn kv_batches() -> impl Strategy<Value = proto::KvEventBatch> {
    let event = prop_oneof![
        (
            prop::collection::vec(any::<u64>(), 0..4),
            proptest::option::of(any::<u64>()),
            prop::collection::vec(any::<u32>(), 0..8),
            numbers(),
        )
            .prop_map(|(block_hashes, parent_block_hash, token_ids, block_size)| {
                proto::kv_event::Event::Stored(proto::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                })
            }),
        prop::collection::vec(any::<u64>(), 0..4).prop_map(|block_hashes| {
            proto::kv_event::Event::Removed(proto::BlockRemoved { block_hashes })
        }),
        Just(proto::kv_event::Event::Cleared(proto::AllBlocksCleared {})),
    ];
    (
        ids(),
        any::<u64>(),
        numbers(),
        prop::collection::vec(proptest::option::of(event), 0..5),
    )
        .prop_map(|(instance_id, seq, ts_us, events)| proto::KvEventBatch {
            instance_id,
            seq,
            ts_us,
            events: events
                .into_iter()
                .map(|event| proto::KvEvent { event })
                .collect(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn mutated_state_updates(edits in edits()) {
        if let Ok(message) = proto::InstanceStateUpdate::decode(&mutate(seed_update().encode_to_vec(), &edits)[..]) {
            update_checked(&message);
        }
    }

    #[test]
    fn mutated_kv_batches(edits in edits()) {
        if let Ok(message) = proto::KvEventBatch::decode(&mutate(seed_kv().encode_to_vec(), &edits)[..]) {
            kv_checked(&message);
        }
    }

    #[test]
    fn mutated_configs(edits in edits()) {
        if let Ok(message) = proto::ClusterConfig::decode(&mutate(seed_config().encode_to_vec(), &edits)[..]) {
            config_checked(&message);
        }
    }

    #[test]
    fn mutated_routing_questions(edits in edits()) {
        if let Ok(message) = proto::PredictRoutingRequest::decode(&mutate(seed_question().encode_to_vec(), &edits)[..]) {
            question_checked(&message);
        }
    }

    #[test]
    fn mutated_capacity_questions(edits in edits()) {
        if let Ok(message) = proto::ForecastCapacityRequest::decode(&mutate(seed_forecast().encode_to_vec(), &edits)[..]) {
            forecast_checked(&message);
        }
    }

    #[test]
    fn adversarial_state_updates(message in updates()) {
        update_checked(&message);
    }

    #[test]
    fn adversarial_kv_batches(message in kv_batches()) {
        kv_checked(&message);
    }
}

#[test]
fn the_seeds_are_accepted() {
    // Guards the fuzzers' starting points: each seed decodes and is applied or answered.
    let store = store();
    let before = store.latest().unwrap().snapshot.generation;
    store
        .apply_kv_events(kv_batch_from_proto(&seed_kv()).unwrap())
        .unwrap();
    assert!(store.latest().unwrap().snapshot.generation > before);
    let limits = Limits::DEFAULT;
    routing_from_proto(&seed_question(), &limits)
        .unwrap()
        .resolve(&store.latest().unwrap(), &limits, NOW_US)
        .unwrap();
    forecast_from_proto(&seed_forecast(), &limits)
        .unwrap()
        .resolve(&store.latest().unwrap(), NOW_US)
        .unwrap();
}
