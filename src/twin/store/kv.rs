//! KV-event bookkeeping of one instance: the cached blocks in storage order with O(log n)
//! updates, the checks on a batch (sequence numbers, times, event shapes) and its
//! application.

use std::collections::{BTreeMap, HashMap};

use crate::cluster::config::InstanceConfig;
use crate::twin::error::TwinError;
use crate::twin::snapshot::InstanceState;

use super::{KvEvent, KvEventBatch, KvGap};

/// One instance's cached blocks in storage order, with O(log n) updates.
#[derive(Clone, Debug, Default)]
pub(super) struct KvIndex {
    stamp_of: HashMap<u64, u64>,
    pub(super) by_stamp: BTreeMap<u64, u64>,
    next_stamp: u64,
}

impl KvIndex {
    fn store(&mut self, hash: u64) {
        if let Some(old) = self.stamp_of.insert(hash, self.next_stamp) {
            self.by_stamp.remove(&old);
        }
        self.by_stamp.insert(self.next_stamp, hash);
        self.next_stamp += 1;
    }

    fn remove(&mut self, hash: u64) {
        if let Some(stamp) = self.stamp_of.remove(&hash) {
            self.by_stamp.remove(&stamp);
        }
    }

    fn clear(&mut self) {
        self.stamp_of.clear();
        self.by_stamp.clear();
    }

    pub(super) fn blocks(&self) -> Vec<u64> {
        self.by_stamp.values().copied().collect()
    }
}

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

pub(super) fn apply_kv(index: &mut KvIndex, events: &[KvEvent]) {
    for event in events {
        match event {
            KvEvent::Stored { block_hashes, .. } => {
                for &hash in block_hashes {
                    index.store(hash);
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
