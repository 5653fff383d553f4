//! What the store's writers hand it and what they get back: state updates, KV-event
//! batches, and the outcomes of a config sync or a KV batch.

use crate::twin::snapshot::{Gauges, ObservedRequest};

/// The full request lists of an instance.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RequestLists {
    /// Waiting requests, in queue order.
    pub waiting: Vec<ObservedRequest>,
    /// Running requests, in batch order.
    pub running: Vec<ObservedRequest>,
    /// End of the engine step in flight, if known (client clock, µs).
    pub step_end_us: Option<u64>,
}

/// A request lifecycle event on one instance.
#[derive(Clone, Debug, PartialEq)]
pub enum RequestEvent {
    /// The request was routed to the instance and joins its wait queue.
    Routed(ObservedRequest),
    /// A known request produced its first token (its prompt is computed).
    FirstToken {
        /// The request.
        request_id: String,
    },
    /// A known request finished.
    Finished {
        /// The request.
        request_id: String,
        /// Its final output length.
        output_tokens: u32,
    },
}

/// A lifecycle event and when it happened (client clock, µs).
#[derive(Clone, Debug, PartialEq)]
pub struct TimedRequestEvent {
    /// When it happened.
    pub at_us: u64,
    /// What happened.
    pub event: RequestEvent,
}

/// One observation of one instance: events first, then the lists, then the gauges.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceUpdate {
    /// The instance.
    pub instance_id: String,
    /// When it was observed (client clock, µs, > 0).
    pub observed_at_us: u64,
    /// The full request lists, if this is a full update. A request's `max_tokens` of 0 means
    /// "unset" and is resolved to `max_model_len - prompt_tokens`.
    pub requests: Option<RequestLists>,
    /// The gauges, if scraped.
    pub gauges: Option<Gauges>,
    /// Lifecycle events, in order.
    pub events: Vec<TimedRequestEvent>,
    /// Whether the requests this update reveals (routed events, ids new to the instance's
    /// lists) count as arrivals in the observed traffic: true for a feeder that sees every
    /// request (pushes); false for one that counts arrivals itself and hands them to
    /// [`MirrorStore::record_arrivals`](super::MirrorStore::record_arrivals) (the live
    /// mirror's rebuilt lists, whose ids name positions, not requests).
    pub counts_arrivals: bool,
}

/// One vLLM KV-cache event.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    /// Blocks stored (chain order).
    Stored {
        /// Their hashes (at least one).
        block_hashes: Vec<u64>,
        /// The block before the first, if any.
        parent_block_hash: Option<u64>,
        /// Their token ids (empty or `block_size` per block).
        token_ids: Vec<u32>,
        /// Tokens per block (0: the instance's).
        block_size: u32,
    },
    /// Blocks evicted (unknown hashes are ignored: their store may have been missed).
    Removed {
        /// Their hashes.
        block_hashes: Vec<u64>,
    },
    /// Every block dropped.
    AllCleared,
}

/// A batch of KV events from one instance.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventBatch {
    /// The instance.
    pub instance_id: String,
    /// Sequence number.
    pub seq: u64,
    /// Emission time (client clock, µs, > 0).
    pub ts_us: u64,
    /// The events, in order.
    pub events: Vec<KvEvent>,
}

/// Missed KV batches on one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGap {
    /// The instance.
    pub instance_id: String,
    /// The sequence number expected next.
    pub expected_seq: u64,
    /// The one that arrived.
    pub received_seq: u64,
}

/// The result of an accepted KV batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvApplied {
    /// Generation after the batch.
    pub generation: u64,
    /// The gap this batch revealed, if any.
    pub gap: Option<KvGap>,
    /// Blocks evicted to fit the instance's `num_gpu_blocks` (capped application only).
    pub evicted: u64,
}

/// The result of a config sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Generation after the sync.
    pub generation: u64,
    /// Generation at which the config in force was accepted.
    pub config_generation: u64,
    /// False when the config was identical to the one in force.
    pub changed: bool,
    /// Instances whose state was reset because it no longer fits their new limits.
    pub reset_instance_ids: Vec<String>,
}
