//! KV-event bookkeeping of one instance: the checks on a batch (sequence numbers, times,
//! event shapes) and its application to the instance's [`CachedBlocks`].

use crate::cluster::config::InstanceConfig;
use crate::sim::kv::hash::{ROOT_KEY, token_block_key};
use crate::twin::cached::CachedBlocks;
use crate::twin::error::TwinError;
use crate::twin::snapshot::InstanceState;

use super::{KvEvent, KvEventBatch, KvGap};

/// Checks a KV batch's sequence, time and event shapes; returns the gap it reveals.
pub(super) fn check_kv_batch(
    old: &InstanceState,
    config: &InstanceConfig,
    batch: &KvEventBatch,
) -> Result<Option<KvGap>, TwinError> {
    if batch.ts_us == 0 {
        return Err(TwinError::invalid("ts_us", "must be positive"));
    }
    if batch.ts_us < old.kv_events_at_us {
        return Err(TwinError::invalid(
            "ts_us",
            format!(
                "{} is older than the instance's last KV batch {}",
                batch.ts_us, old.kv_events_at_us
            ),
        ));
    }
    let block_size = config.engine.block_size;
    for (index, event) in batch.events.iter().enumerate() {
        if let KvEvent::Stored {
            block_hashes,
            token_ids,
            block_size: given,
            ..
        } = event
        {
            let path = format!("events[{index}].stored");
            if block_hashes.is_empty() {
                return Err(TwinError::invalid(
                    format!("{path}.block_hashes"),
                    "must not be empty",
                ));
            }
            if *given != 0 && *given != block_size {
                return Err(TwinError::invalid(
                    format!("{path}.block_size"),
                    format!("{given} differs from the instance's block_size {block_size}"),
                ));
            }
            let expected = block_hashes.len() as u64 * u64::from(block_size);
            if !token_ids.is_empty() && token_ids.len() as u64 != expected {
                return Err(TwinError::invalid(
                    format!("{path}.token_ids"),
                    format!(
                        "{} token ids for {} blocks of {block_size}",
                        token_ids.len(),
                        block_hashes.len()
                    ),
                ));
            }
        }
    }
    if old.kv_events_at_us == 0 {
        return Ok(None);
    }
    let expected = old.kv_event_seq.saturating_add(1);
    if batch.seq == expected {
        Ok(None)
    } else if matches!(batch.events.first(), Some(KvEvent::AllCleared)) {
        // A clear first (a publisher restart): whatever was missed before it is gone anyway.
        Ok(None)
    } else if batch.seq > expected {
        Ok(Some(KvGap {
            instance_id: batch.instance_id.clone(),
            expected_seq: expected,
            received_seq: batch.seq,
        }))
    } else {
        Err(TwinError::invalid(
            "seq",
            format!(
                "{} does not follow the last applied batch {} (a publisher restart must \
                 start with AllBlocksCleared)",
                batch.seq, old.kv_event_seq
            ),
        ))
    }
}

/// Applies `events` to `index`; token ids key blocks of `block_size` tokens (the instance's,
/// which [`check_kv_batch`] holds every event to).
pub(super) fn apply_kv(index: &mut CachedBlocks, events: &[KvEvent], block_size: u32) {
    for event in events {
        match event {
            KvEvent::Stored {
                block_hashes,
                parent_block_hash,
                token_ids,
                ..
            } => {
                // The chain's key before the first block: the root for a first block, the
                // parent's key when the parent is cached here; an unknown parent (its store
                // was missed) leaves the run keyed by publisher hashes only.
                let mut parent = match parent_block_hash {
                    None => Some(ROOT_KEY),
                    Some(hash) => index.key_of(*hash),
                };
                let size = block_size as usize;
                let with_tokens = size > 0 && token_ids.len() == block_hashes.len() * size;
                for (position, &hash) in block_hashes.iter().enumerate() {
                    let key = match parent.filter(|_| with_tokens) {
                        Some(parent_key) => {
                            let tokens = &token_ids[position * size..(position + 1) * size];
                            token_block_key(parent_key, tokens)
                        }
                        None => hash,
                    };
                    parent = parent.and(Some(key));
                    index.store(hash, key);
                }
            }
            KvEvent::Removed { block_hashes } => {
                for &hash in block_hashes {
                    index.remove(hash);
                }
            }
            KvEvent::AllCleared => index.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sim::kv::hash::block_key;
    use crate::sim::{PromptContent, RequestId, RequestSpec, SloClass};

    fn stored(hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>) -> KvEvent {
        KvEvent::Stored {
            block_hashes: hashes,
            parent_block_hash: parent,
            token_ids: tokens,
            block_size: 4,
        }
    }

    #[test]
    fn blocks_published_with_tokens_are_keyed_as_the_engine_keys_a_prompt() {
        let tokens: Vec<u32> = (100..112).collect();
        let mut index = CachedBlocks::default();
        // Two events chained by the publisher's (seeded, unknowable) hashes.
        apply_kv(
            &mut index,
            &[stored(vec![901, 902], None, tokens[..8].to_vec())],
            4,
        );
        apply_kv(
            &mut index,
            &[stored(vec![903], Some(902), tokens[8..].to_vec())],
            4,
        );
        let spec = RequestSpec {
            id: RequestId(1),
            arrival_us: 0,
            input_tokens: 12,
            output_tokens: 1,
            max_tokens: 1,
            slo_class: SloClass::default(),
            priority: 0,
            deadline_us: None,
            content: PromptContent::Tokens(Arc::from(tokens.as_slice())),
        };
        let mut parent = ROOT_KEY;
        let mut expected = Vec::new();
        for block in 0..3 {
            parent = block_key(&spec, parent, block, 4);
            expected.push(parent);
        }
        assert_eq!(index.to_keys(), expected);
        assert_eq!(index.key_of(903), Some(expected[2]));
        // Removal and parents still go by the publisher's hash.
        apply_kv(
            &mut index,
            &[KvEvent::Removed {
                block_hashes: vec![901],
            }],
            4,
        );
        assert_eq!(index.to_keys(), expected[1..].to_vec());
        // A run whose parent was never seen keeps its publisher hashes.
        apply_kv(
            &mut index,
            &[stored(vec![990], Some(777), tokens[..4].to_vec())],
            4,
        );
        assert_eq!(index.to_keys().last(), Some(&990));
        assert_eq!(index.evict_to(1), 2);
        assert_eq!(index.to_keys(), vec![990]);
        assert!(!index.has_aliases());
    }
}
