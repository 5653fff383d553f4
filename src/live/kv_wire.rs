//! vLLM's KV-event wire format → the store's [`KvEvent`]s.
//!
//! A ZMQ message is 3 frames: topic, an 8-byte big-endian sequence number, and a msgpack
//! `EventBatch[ts, events, data_parallel_rank]` (msgspec, `array_like`; or a map). Events are
//! tagged structs, decoded in every encoding vLLM has used: positional (`["BlockStored",
//! block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
//! extra_keys, group_idx]`, from the legacy 5 fields on) and map (`{"type": "BlockStored",
//! "block_hashes": ..., ...}`). Block hashes are ints (any sign: kept as their 64 bits) or
//! bytes, folded as vLLM's `maybe_convert_block_hash` does: the low 64 bits, big-endian (the
//! last 8 bytes). Events on a `medium` other than GPU (the CPU offload tier) and events of a
//! KV-cache group other than the full-attention group 0 (`group_idx`, hybrid models) are
//! skipped; an event type this decoder does not know is skipped alone (and named in
//! [`WireBatch::unknown`]), so a new event type in vLLM does not lose a batch's other events.
//! Token ids are passed on: the mirror keys each stored block by its tokens too.

mod msgpack_count;

use rmpv::Value;
use thiserror::Error;

use msgpack_count::{CountError, count_values};

use crate::twin::store::KvEvent;

/// A message that is not a vLLM KV-event batch.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("KV event message: {0}")]
pub struct KvWireError(pub String);

fn wire_error(reason: impl Into<String>) -> KvWireError {
    KvWireError(reason.into())
}

/// One decoded batch.
#[derive(Clone, Debug, PartialEq)]
pub struct WireBatch {
    /// Sequence number (frame 2).
    pub seq: u64,
    /// Emission time, seconds since the epoch.
    pub ts_s: f64,
    /// The GPU-tier events.
    pub events: Vec<KvEvent>,
    /// The data-parallel rank, if sent.
    pub dp_rank: Option<i64>,
    /// Events skipped because their type is unknown, by type name.
    pub unknown: Vec<String>,
    /// Events skipped because they belong to another KV-cache group than group 0.
    pub other_groups: u64,
}

/// What one event decodes to.
enum Decoded {
    /// A GPU-tier event of the full-attention group.
    Event(KvEvent),
    /// An event for another tier or another KV-cache group.
    OtherTierOrGroup { group: bool },
    /// An event type this decoder does not know.
    Unknown(String),
}

/// Decodes the 8-byte big-endian sequence frame (−1 ends a replay: `None`).
pub fn decode_seq(frame: &[u8]) -> Result<Option<u64>, KvWireError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| wire_error(format!("sequence frame has {} bytes, not 8", frame.len())))?;
    let seq = i64::from_be_bytes(bytes);
    Ok(u64::try_from(seq).ok())
}

/// The largest batch payload decoded, bytes: a step's events (its prompts' block hashes and
/// token ids, bounded by the token budget) are kilobytes to a few megabytes.
pub const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// The most msgpack values a batch payload may hold (checked before it is decoded). A value
/// costs ~80 bytes decoded (measured: 2.09 M values in one list took the server's peak
/// resident memory from 61 to 226 MB), so this bounds a batch's decoding to ~85 MB; a
/// step's events hold a value per token id and block hash, tens of thousands.
pub const MAX_BATCH_VALUES: usize = 1 << 20;

/// The most block hashes a batch's events may name together (stored and removed, every
/// tier): a step stores at most its token budget's worth of blocks and evicts as many (2^17
/// is a 1M-token step of 16-token blocks, twice). Checked before the events are decoded: one
/// event of 1M blocks, under the value cap, peaked at 1.07 GB in the mirror's maps.
pub const MAX_BATCH_BLOCKS: usize = 1 << 17;

/// Decodes a msgpack `EventBatch` payload with sequence `seq`; a payload over
/// [`MAX_BATCH_BYTES`] or [`MAX_BATCH_VALUES`] is refused before it is decoded, and one
/// naming more than [`MAX_BATCH_BLOCKS`] block hashes before its events are.
pub fn decode_batch(seq: u64, payload: &[u8]) -> Result<WireBatch, KvWireError> {
    if payload.len() > MAX_BATCH_BYTES {
        return Err(wire_error(format!(
            "batch of {} bytes, over the limit of {MAX_BATCH_BYTES}",
            payload.len()
        )));
    }
    match count_values(payload, MAX_BATCH_VALUES) {
        Ok(_) => {}
        Err(CountError::TooMany { limit }) => {
            return Err(wire_error(format!(
                "batch holds more than {limit} msgpack values"
            )));
        }
        Err(CountError::Malformed) => {
            return Err(wire_error("msgpack: truncated, or a reserved marker"));
        }
    }
    let mut reader = payload;
    let value = rmpv::decode::read_value(&mut reader)
        .map_err(|err| wire_error(format!("msgpack: {err}")))?;
    if !reader.is_empty() {
        return Err(wire_error(format!(
            "msgpack: {} trailing bytes after the batch",
            reader.len()
        )));
    }
    let (ts, events, rank) = match &value {
        Value::Array(items) if items.len() >= 2 => (&items[0], &items[1], items.get(2)),
        Value::Map(_) => (
            field(&value, "ts").ok_or_else(|| wire_error("batch map has no ts"))?,
            field(&value, "events").ok_or_else(|| wire_error("batch map has no events"))?,
            field(&value, "data_parallel_rank"),
        ),
        other => {
            return Err(wire_error(format!(
                "batch is {}, not [ts, events, rank]",
                kind(other)
            )));
        }
    };
    let ts_s = ts
        .as_f64()
        .or_else(|| ts.as_i64().map(|v| v as f64))
        .or_else(|| ts.as_u64().map(|v| v as f64))
        .filter(|ts| ts.is_finite() && *ts >= 0.0)
        .ok_or_else(|| wire_error(format!("ts is {}, not a time", kind(ts))))?;
    let Value::Array(list) = events else {
        return Err(wire_error(format!(
            "events is {}, not a list",
            kind(events)
        )));
    };
    let blocks: usize = list.iter().map(block_count).sum();
    if blocks > MAX_BATCH_BLOCKS {
        return Err(wire_error(format!(
            "{blocks} blocks in one batch, over the limit of {MAX_BATCH_BLOCKS}"
        )));
    }
    let mut decoded = Vec::with_capacity(list.len());
    let mut unknown = Vec::new();
    let mut other_groups = 0;
    for (index, event) in list.iter().enumerate() {
        match decode_event(event)
            .map_err(|err| wire_error(format!("events[{index}]: {}", err.0)))?
        {
            Decoded::Event(event) => decoded.push(event),
            Decoded::OtherTierOrGroup { group } => other_groups += u64::from(group),
            Decoded::Unknown(kind) => unknown.push(kind),
        }
    }
    Ok(WireBatch {
        seq,
        ts_s,
        events: decoded,
        dp_rank: rank.and_then(Value::as_i64),
        unknown,
        other_groups,
    })
}

/// How many block hashes an event names (its `block_hashes` list, positional or by name).
fn block_count(event: &Value) -> usize {
    let hashes = match event {
        Value::Array(items) => items.get(1),
        Value::Map(_) => field(event, "block_hashes"),
        _ => None,
    };
    match hashes {
        Some(Value::Array(hashes)) => hashes.len(),
        _ => 0,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::F32(_) | Value::F64(_) => "a float",
        Value::String(_) => "a string",
        Value::Binary(_) => "bytes",
        Value::Array(_) => "a list",
        Value::Map(_) => "a map",
        Value::Ext(..) => "an extension",
    }
}

fn field<'a>(map: &'a Value, name: &str) -> Option<&'a Value> {
    match map {
        Value::Map(entries) => entries
            .iter()
            .find(|(key, _)| key.as_str() == Some(name))
            .map(|(_, value)| value),
        _ => None,
    }
}

/// (tag, positional fields after the tag) or the map; field `i` by position or by name.
struct Fields<'a> {
    positional: Option<&'a [Value]>,
    map: Option<&'a Value>,
}

impl<'a> Fields<'a> {
    fn get(&self, position: usize, name: &str) -> Option<&'a Value> {
        match (self.positional, self.map) {
            (Some(items), _) => items.get(position),
            (None, Some(map)) => field(map, name),
            _ => None,
        }
        .filter(|value| !value.is_nil())
    }
}

fn decode_event(event: &Value) -> Result<Decoded, KvWireError> {
    let (tag, fields) = match event {
        Value::Array(items) => {
            let tag = items
                .first()
                .and_then(Value::as_str)
                .ok_or_else(|| wire_error("event list has no tag"))?;
            (
                tag,
                Fields {
                    positional: Some(&items[1..]),
                    map: None,
                },
            )
        }
        Value::Map(_) => {
            let tag = field(event, "type")
                .and_then(Value::as_str)
                .ok_or_else(|| wire_error("event map has no type"))?;
            (
                tag,
                Fields {
                    positional: None,
                    map: Some(event),
                },
            )
        }
        other => return Err(wire_error(format!("event is {}", kind(other)))),
    };
    let on_gpu = |position: usize| {
        fields
            .get(position, "medium")
            .and_then(Value::as_str)
            .is_none_or(|medium| medium.eq_ignore_ascii_case("gpu"))
    };
    // vLLM's KV-cache group of the event (hybrid models: full attention, sliding window,
    // mamba); absent (older vLLM) or nil means the only group, 0.
    let group = |position: usize| -> Result<u64, KvWireError> {
        match fields.get(position, "group_idx") {
            None => Ok(0),
            Some(value) => value
                .as_u64()
                .ok_or_else(|| wire_error(format!("group_idx is {}", kind(value)))),
        }
    };
    match tag {
        "BlockStored" => {
            let block_hashes = hashes(fields.get(0, "block_hashes"), "block_hashes")?;
            if block_hashes.is_empty() {
                return Err(wire_error("block_hashes: empty"));
            }
            let parent_block_hash = fields.get(1, "parent_block_hash").map(hash).transpose()?;
            let token_ids = token_ids(fields.get(2, "token_ids"))?;
            let block_size = match fields.get(3, "block_size") {
                None => 0,
                Some(value) => value
                    .as_u64()
                    .and_then(|size| u32::try_from(size).ok())
                    .ok_or_else(|| wire_error(format!("block_size is {}", kind(value))))?,
            };
            if !on_gpu(5) {
                return Ok(Decoded::OtherTierOrGroup { group: false });
            }
            if group(8)? != 0 {
                return Ok(Decoded::OtherTierOrGroup { group: true });
            }
            // Token ids that do not fill the blocks (a publisher that sends none, or a
            // partial list) cannot key them: the blocks keep their hashes only.
            let whole = block_size > 0
                && token_ids.len() as u64 == block_hashes.len() as u64 * u64::from(block_size);
            Ok(Decoded::Event(KvEvent::Stored {
                block_hashes,
                parent_block_hash,
                token_ids: if whole { token_ids } else { Vec::new() },
                block_size: if whole { block_size } else { 0 },
            }))
        }
        "BlockRemoved" => {
            let block_hashes = hashes(fields.get(0, "block_hashes"), "block_hashes")?;
            if !on_gpu(1) {
                return Ok(Decoded::OtherTierOrGroup { group: false });
            }
            if group(2)? != 0 {
                return Ok(Decoded::OtherTierOrGroup { group: true });
            }
            Ok(Decoded::Event(KvEvent::Removed { block_hashes }))
        }
        "AllBlocksCleared" => Ok(Decoded::Event(KvEvent::AllCleared)),
        other => Ok(Decoded::Unknown(other.chars().take(64).collect())),
    }
}

fn token_ids(value: Option<&Value>) -> Result<Vec<u32>, KvWireError> {
    match value {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_u64()
                    .and_then(|token| u32::try_from(token).ok())
                    .ok_or_else(|| wire_error(format!("a token id is {}", kind(item))))
            })
            .collect(),
        Some(other) => Err(wire_error(format!(
            "token_ids is {}, not a list",
            kind(other)
        ))),
    }
}

fn hashes(value: Option<&Value>, name: &str) -> Result<Vec<u64>, KvWireError> {
    match value {
        Some(Value::Array(items)) => items.iter().map(hash).collect(),
        Some(other) => Err(wire_error(format!("{name} is {}, not a list", kind(other)))),
        None => Err(wire_error(format!("{name} missing"))),
    }
}

fn hash(value: &Value) -> Result<u64, KvWireError> {
    match value {
        Value::Integer(int) => int
            .as_u64()
            .or_else(|| int.as_i64().map(|v| v as u64))
            .ok_or_else(|| wire_error("hash out of range")),
        // vLLM's `maybe_convert_block_hash`: `int.from_bytes(hash, "big") & (2**64 - 1)`,
        // the last 8 bytes read big-endian (shorter hashes are zero-extended).
        Value::Binary(bytes) => Ok(bytes
            .iter()
            .skip(bytes.len().saturating_sub(8))
            .fold(0u64, |acc, &byte| (acc << 8) | u64::from(byte))),
        other => Err(wire_error(format!("a block hash is {}", kind(other)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_batch_is_refused_before_it_is_decoded() {
        // [ts, events] with an events array declaring 3 M entries of which a few follow:
        // refused by the count, not decoded.
        let mut payload = vec![0x92, 0xcb];
        payload.extend_from_slice(&1.5f64.to_be_bytes());
        payload.extend_from_slice(&[0xdd, 0x00, 0x2d, 0xc6, 0xc0]);
        payload.extend_from_slice(&[0x90; 4096]);
        let err = decode_batch(1, &payload).expect_err("refused").to_string();
        assert!(err.contains("more than 1048576 msgpack values"), "{err}");
        let err = decode_batch(1, &vec![0x90; MAX_BATCH_BYTES + 1])
            .expect_err("refused")
            .to_string();
        assert!(err.contains("over the limit"), "{err}");
    }

    fn encode(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).expect("in-memory write");
        out
    }

    fn s(text: &str) -> Value {
        Value::from(text)
    }

    #[test]
    fn positional_and_map_forms_decode_alike() {
        let positional = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Array(vec![
                    s("BlockStored"),
                    Value::Array(vec![Value::from(7), Value::from(-1)]),
                    Value::Nil,
                    Value::Array(vec![]),
                    Value::from(16),
                    Value::Nil,
                    s("GPU"),
                ]),
                Value::Array(vec![
                    s("BlockRemoved"),
                    Value::Array(vec![Value::from(7)]),
                    s("CPU"),
                ]),
                Value::Array(vec![s("AllBlocksCleared")]),
            ]),
            Value::from(0),
        ]);
        let map = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Map(vec![
                    (s("type"), s("BlockStored")),
                    (
                        s("block_hashes"),
                        Value::Array(vec![Value::from(7), Value::from(-1)]),
                    ),
                    (s("parent_block_hash"), Value::Nil),
                    (s("medium"), s("GPU")),
                ]),
                Value::Map(vec![
                    (s("type"), s("BlockRemoved")),
                    (s("block_hashes"), Value::Array(vec![Value::from(7)])),
                    (s("medium"), s("CPU")),
                ]),
                Value::Map(vec![(s("type"), s("AllBlocksCleared"))]),
            ]),
            Value::from(0),
        ]);
        let a = decode_batch(3, &encode(&positional)).expect("positional");
        let b = decode_batch(3, &encode(&map)).expect("map");
        assert_eq!(a, b);
        assert_eq!(a.events.len(), 2, "the CPU-tier removal is skipped");
        assert_eq!(
            a.events[0],
            KvEvent::Stored {
                block_hashes: vec![7, u64::MAX],
                parent_block_hash: None,
                token_ids: vec![],
                block_size: 0
            }
        );
    }

    #[test]
    fn a_batch_naming_too_many_blocks_is_refused() {
        let stored = |count: usize| {
            Value::Array(vec![
                s("BlockStored"),
                Value::Array((0..count as u64).map(Value::from).collect()),
            ])
        };
        let removed = |count: usize| {
            Value::Map(vec![
                (s("type"), s("BlockRemoved")),
                (
                    s("block_hashes"),
                    Value::Array((0..count as u64).map(Value::from).collect()),
                ),
            ])
        };
        let half = MAX_BATCH_BLOCKS / 2;
        let batch = |events| Value::Array(vec![Value::F64(1.0), Value::Array(events)]);
        let at_limit = decode_batch(0, &encode(&batch(vec![stored(half), removed(half)])));
        assert_eq!(at_limit.map(|b| b.events.len()), Ok(2));
        let err = decode_batch(0, &encode(&batch(vec![stored(half), removed(half + 1)])))
            .expect_err("over the limit")
            .to_string();
        assert!(
            err.contains(&format!(
                "{} blocks in one batch, over the limit of 131072",
                MAX_BATCH_BLOCKS + 1
            )),
            "{err}"
        );
    }

    #[test]
    fn malformed_payloads_are_errors() {
        assert!(decode_batch(0, b"\xc1garbage").is_err());
        assert!(decode_batch(0, &encode(&Value::from(3))).is_err());
        assert_eq!(decode_seq(&(-1i64).to_be_bytes()), Ok(None));
        assert_eq!(decode_seq(&5i64.to_be_bytes()), Ok(Some(5)));
        assert!(decode_seq(b"123").is_err());
    }

    #[test]
    fn unknown_events_and_other_groups_are_skipped_one_by_one() {
        let batch = Value::Array(vec![
            Value::F64(1.0),
            Value::Array(vec![
                Value::Array(vec![s("Nope"), Value::from(1)]),
                Value::Map(vec![(s("type"), s("BlockTransferred"))]),
                // Legacy 5 fields: no medium.
                Value::Array(vec![
                    s("BlockStored"),
                    Value::Array(vec![Value::from(5)]),
                    Value::Nil,
                    Value::Array((0..4).map(Value::from).collect()),
                    Value::from(4),
                    Value::Nil,
                ]),
                // Newest: group 1 (sliding window) removal does not touch group 0.
                Value::Array(vec![
                    s("BlockRemoved"),
                    Value::Array(vec![Value::from(5)]),
                    s("GPU"),
                    Value::from(1),
                ]),
            ]),
        ]);
        let decoded = decode_batch(0, &encode(&batch)).expect("decodes");
        assert_eq!(
            decoded.unknown,
            vec!["Nope".to_owned(), "BlockTransferred".to_owned()]
        );
        assert_eq!(decoded.other_groups, 1);
        assert_eq!(
            decoded.events,
            vec![KvEvent::Stored {
                block_hashes: vec![5],
                parent_block_hash: None,
                token_ids: vec![0, 1, 2, 3],
                block_size: 4,
            }]
        );
    }

    #[test]
    fn byte_hashes_fold_to_their_low_64_bits_big_endian() {
        let digest: Vec<u8> = (1..=32).collect();
        let value = Value::Binary(digest.clone());
        let expected = u64::from_be_bytes(digest[24..].try_into().expect("8 bytes"));
        assert_eq!(hash(&value), Ok(expected));
        assert_eq!(hash(&Value::Binary(vec![1, 2])), Ok(0x0102));
    }
}
