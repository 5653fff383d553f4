#![allow(clippy::unwrap_used)]
//! Property-based fuzzing (proptest) of the decoders that take bytes from outside the gRPC
//! API: vLLM's KV-event wire format (`live::kv_wire`: the ZMQ sequence frame and the msgpack
//! `EventBatch`, positional and map forms) and the latency predictor API's JSON
//! (`server::predictor::schema`: bodies, prediction entries, training entries).
//!
//! Inputs are valid messages whose bytes are mutated (flipped, inserted, deleted, truncated),
//! arbitrary bytes, and structured entries with adversarial numbers and types. For every
//! input: no panic, and a refusal is a short error that says what is wrong (the KV decoder's
//! message; the FastAPI-style error's `loc` naming the body field).

use ditto::live::kv_wire::{decode_batch, decode_seq};
use ditto::server::predictor::schema::{aggregates, parse_body, training_entry};
use proptest::prelude::*;
use rmpv::Value as Msg;
use serde_json::{Value, json};

/// A valid batch: positional (`[ts, [[tag, ...], ...], rank]`) or map form.
fn batch(map_form: bool, hashes: &[u64]) -> Vec<u8> {
    let hash_list = Msg::Array(hashes.iter().map(|&h| Msg::from(h)).collect());
    let value = if map_form {
        Msg::Map(vec![
            (Msg::from("ts"), Msg::F64(1.7e9)),
            (
                Msg::from("events"),
                Msg::Array(vec![
                    Msg::Map(vec![
                        (Msg::from("type"), Msg::from("BlockStored")),
                        (Msg::from("block_hashes"), hash_list.clone()),
                        (Msg::from("parent_block_hash"), Msg::Nil),
                        (Msg::from("token_ids"), Msg::Array(vec![Msg::from(1); 16])),
                        (Msg::from("block_size"), Msg::from(16)),
                    ]),
                    Msg::Map(vec![
                        (Msg::from("type"), Msg::from("BlockRemoved")),
                        (Msg::from("block_hashes"), hash_list),
                    ]),
                ]),
            ),
            (Msg::from("data_parallel_rank"), Msg::from(0)),
        ])
    } else {
        Msg::Array(vec![
            Msg::F64(1.7e9),
            Msg::Array(vec![
                Msg::Array(vec![
                    Msg::from("BlockStored"),
                    hash_list.clone(),
                    Msg::Nil,
                    Msg::Array(vec![Msg::from(1); 16]),
                    Msg::from(16),
                    Msg::Nil,
                ]),
                Msg::Array(vec![Msg::from("BlockRemoved"), hash_list]),
                Msg::Array(vec![Msg::from("AllBlocksCleared")]),
            ]),
            Msg::from(0),
        ])
    };
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, &value).unwrap();
    bytes
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        if bytes.is_empty() {
            break;
        }
        match *m {
            Mutation::Flip(i, b) => {
                let n = bytes.len();
                bytes[i % n] ^= b | 1;
            }
            Mutation::Insert(i, b) => {
                let n = bytes.len();
                bytes.insert(i % (n + 1), b);
            }
            Mutation::Delete(i) => {
                let n = bytes.len();
                bytes.remove(i % n);
            }
            Mutation::Truncate(i) => {
                let n = bytes.len();
                bytes.truncate(i % n);
            }
        }
    }
    bytes
}

/// A valid prediction entry with every field.
fn entry() -> Value {
    json!({
        "kv_cache_percentage": 0.4,
        "input_token_length": 512,
        "num_request_waiting": 2,
        "num_request_running": 6,
        "num_tokens_generated": 0,
        "prefix_cache_score": 0.25,
        "pod_type": "",
        "prefill_tokens_in_flight": 1024,
        "decode_tokens_in_flight": 300,
    })
}

/// Adversarial JSON values for one field.
fn bad_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |v| v.is_finite())
            .prop_map(Value::from),
        "[a-z0-9 ]{0,12}".prop_map(Value::from),
        Just(json!([1, 2])),
        Just(json!({"nested": 1})),
        Just(json!(1e300)),
        Just(json!(-1)),
    ]
}

const FIELDS: [&str; 9] = [
    "kv_cache_percentage",
    "input_token_length",
    "num_request_waiting",
    "num_request_running",
    "num_tokens_generated",
    "prefix_cache_score",
    "pod_type",
    "prefill_tokens_in_flight",
    "decode_tokens_in_flight",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mutated_kv_batches_never_panic(
        map_form in any::<bool>(),
        hashes in prop::collection::vec(any::<u64>(), 1..6),
        mutations in prop::collection::vec(mutation(), 1..6),
        seq in any::<u64>(),
    ) {
        let bytes = mutate(batch(map_form, &hashes), &mutations);
        match decode_batch(seq, &bytes) {
            Ok(batch) => prop_assert_eq!(batch.seq, seq),
            Err(err) => {
                let text = err.to_string();
                prop_assert!(text.starts_with("KV event message: "), "{}", text);
                prop_assert!(text.len() < 400, "{}", text);
            }
        }
    }

    #[test]
    fn arbitrary_kv_frames_never_panic(frame in prop::collection::vec(any::<u8>(), 0..64)) {
        match decode_seq(&frame) {
            Ok(_) => prop_assert_eq!(frame.len(), 8),
            Err(err) => prop_assert!(err.to_string().contains("sequence frame")),
        }
        let _ = decode_batch(0, &frame);
    }

    #[test]
    fn mutated_predictor_bodies_never_panic(
        mutations in prop::collection::vec(mutation(), 1..6),
        training in any::<bool>(),
    ) {
        let mut body = entry();
        if training {
            body["actual_ttft_ms"] = json!(120.5);
            body["actual_tpot_ms"] = json!(12.5);
        }
        let bytes = mutate(serde_json::to_vec(&json!({"requests": [body]})).unwrap(), &mutations);
        match parse_body(&bytes) {
            Ok(value) => {
                let item = value.get("requests").and_then(|r| r.get(0)).cloned()
                    .unwrap_or(Value::Null);
                let base = [json!("body"), json!("requests"), json!(0)];
                let refused = if training {
                    training_entry(&item, &base).err()
                } else {
                    aggregates(&item, &base).err()
                };
                for error in refused.unwrap_or_default() {
                    prop_assert!(!error.line().is_empty());
                }
            }
            Err(errors) => {
                prop_assert_eq!(errors.len(), 1);
                prop_assert!(errors[0].line().contains("JSON"), "{}", errors[0].line());
            }
        }
    }

    #[test]
    fn a_bad_field_is_refused_naming_it_or_accepted_in_range(
        field in 0..FIELDS.len(),
        value in bad_value(),
    ) {
        let name = FIELDS[field];
        let mut item = entry();
        item[name] = value.clone();
        let base = [json!("body")];
        match aggregates(&item, &base) {
            Ok(parsed) => {
                // Accepted only when it is a value the peer accepts too.
                prop_assert!(parsed.kv_cache_percentage >= 0.0 && parsed.kv_cache_percentage <= 1.0);
                prop_assert!(parsed.prefix_cache_score >= 0.0 && parsed.prefix_cache_score <= 1.0);
                prop_assert!(!value.is_array() && !value.is_object(), "{} = {}", name, value);
            }
            Err(errors) => {
                prop_assert!(!errors.is_empty());
                for error in &errors {
                    let line = error.line();
                    prop_assert!(line.contains(name), "{} = {}: {}", name, value, line);
                    prop_assert!(line.len() < 600, "{}", line);
                }
            }
        }
    }
}
