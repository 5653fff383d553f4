//! The wait queue's sort key of a request: the scheduling policy's order, with a
//! disaggregated decode half that holds its pulled KV first. Shared by every part of the
//! engine that puts a request into the queue (arrival, preemption, a P/D hand-over, late
//! entry, restore, admission).

use crate::sim::config::SchedulingPolicy;
use crate::sim::queue::QueueKey;
use crate::sim::state::{PdMode, Phase, RequestState};

/// The wait-queue sort key of a request under `policy`.
#[inline]
pub(super) fn queue_key(policy: SchedulingPolicy, state: &RequestState) -> QueueKey {
    // A disaggregated decode half waiting with its reserved blocks after its pull goes
    // first under every policy (under fcfs it is put at the front): otherwise a more urgent
    // request that cannot reserve blocks, which such halves hold, could stall the pool with
    // nothing running (vLLM keeps its priority order here).
    let primary = if state.pd == (PdMode::RemoteKv { pulled: true })
        && state.phase == Phase::Waiting
        && !state.blocks.is_empty()
    {
        i64::MIN
    } else {
        policy_primary(policy, state)
    };
    (
        primary,
        state.spec.arrival_us,
        state.spec.id.0,
        state.serial,
    )
}

/// [`queue_key`] of a request that cannot be a pulled decode half holding its blocks: one
/// entering the queue from arrival, or admitted as a local request. The key is the same;
/// the plain path skips the test.
#[inline(always)]
pub(super) fn local_queue_key(policy: SchedulingPolicy, state: &RequestState) -> QueueKey {
    debug_assert!(
        state.pd != (PdMode::RemoteKv { pulled: true }) || state.blocks.is_empty(),
        "a pulled half holding blocks keyed as local"
    );
    (
        policy_primary(policy, state),
        state.spec.arrival_us,
        state.spec.id.0,
        state.serial,
    )
}

/// The policy's part of a queue key.
#[inline(always)]
fn policy_primary(policy: SchedulingPolicy, state: &RequestState) -> i64 {
    match policy {
        SchedulingPolicy::Fcfs => 0,
        SchedulingPolicy::Priority => i64::from(state.spec.priority),
        SchedulingPolicy::Sjf => i64::from(state.spec.input_tokens),
    }
}
