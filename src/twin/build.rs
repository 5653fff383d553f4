//! From a mirrored instance to a restored engine: observed requests become engine requests
//! (with known or sampled final lengths), cached blocks and the step in flight carry over.

use std::sync::Arc;

use crate::cluster::config::InstanceConfig;
use crate::sim::engine::{RestoreState, RestoredRequest};
use crate::sim::rng::SimRng;
use crate::sim::{Engine, PromptContent, RequestId, RequestSpec, SimError};
use crate::workload::LengthDraw;

use super::error::TwinError;
use super::sampling::conditioned_length;
use super::snapshot::{InstanceState, ObservedRequest};

/// Engine request ids of mirrored requests start here; the question's request uses
/// [`QUESTION_REQUEST_ID`].
pub const MIRRORED_ID_BASE: u64 = 1 << 40;

pub use super::question::QUESTION_REQUEST_ID;

/// Bits of a mirrored request's id that number it within its instance: each instance has
/// `1 << MIRRORED_ID_BITS` ids.
pub const MIRRORED_ID_BITS: u32 = 24;

/// Most background arrivals one fork may simulate (their ids stay below the mirrored ones).
pub const BACKGROUND_ARRIVALS_MAX: u64 = 200_000;

// The id ranges never overlap: the question's request and synthetic arrivals (background
// traffic, forecast workloads: ids from 1, at most one per store-limited request) stay below
// the mirrored ids, each instance's requests (at most the store's per-instance limit) fit its
// range, and every instance's range fits a u64.
const _: () = {
    assert!(QUESTION_REQUEST_ID < MIRRORED_ID_BASE);
    assert!(BACKGROUND_ARRIVALS_MAX < MIRRORED_ID_BASE);
    assert!(super::store::StoreLimits::DEFAULT.max_requests_per_instance < 1 << MIRRORED_ID_BITS);
    assert!(
        (super::store::StoreLimits::DEFAULT.max_instances as u64)
            < (u64::MAX - MIRRORED_ID_BASE) >> MIRRORED_ID_BITS
    );
};

/// Engine ids of mirrored instance `index`'s requests start here: ids stay unique across
/// instances (requests may move between them in a forecast).
pub fn mirrored_id_base(index: usize) -> u64 {
    MIRRORED_ID_BASE + ((index as u64) << MIRRORED_ID_BITS)
}

/// An engine in the state `state` (mirrored instance `index`) describes, at its observation
/// time. Unknown output lengths are drawn from `outputs` with `rng`.
pub fn restore_instance(
    instance: &InstanceConfig,
    state: &InstanceState,
    index: usize,
    outputs: &LengthDraw,
    rng: &mut SimRng,
    path: &str,
) -> Result<Engine, TwinError> {
    let mut engine = restore_base(instance, state, index, path)?;
    draw_lengths(&mut engine, state, index, outputs, rng, path)?;
    Ok(engine)
}

/// The engine `state` describes with every final length at its least valid value: the
/// length-independent part of [`restore_instance`], restored once and cloned per replication
/// before [`draw_lengths`].
pub fn restore_base(
    instance: &InstanceConfig,
    state: &InstanceState,
    index: usize,
    path: &str,
) -> Result<Engine, TwinError> {
    let id_base = mirrored_id_base(index);
    let total = state.running.len() + state.waiting.len();
    if total >= 1 << MIRRORED_ID_BITS {
        return Err(TwinError::invalid(
            path,
            format!(
                "{total} requests exceed the {} one instance can mirror",
                1u64 << MIRRORED_ID_BITS
            ),
        ));
    }
    let mut next_id = id_base;
    let mut convert = |observed: &ObservedRequest| {
        let request = to_restored(observed, next_id, observed.output_tokens.saturating_add(1));
        next_id += 1;
        request
    };
    let running: Vec<RestoredRequest> = state.running.iter().map(&mut convert).collect();
    let waiting: Vec<RestoredRequest> = state.waiting.iter().map(&mut convert).collect();
    let restore = RestoreState {
        now_us: state.observed_at_us,
        cached_keys: state.cached_blocks.to_keys(),
        running,
        waiting,
        step_end_us: state.step_end_us.filter(|&end| end > state.observed_at_us),
    };
    let mut config = instance.engine.clone();
    config.kv_sample_interval_us = 0;
    Engine::restore(config, instance.latency.clone(), restore)
        .map_err(|err| restore_error(err, state, index, path))
}

/// Sets the final lengths of a just-restored [`restore_base`] of `state`: known ones as
/// observed, unknown ones drawn from `outputs` with `rng` (conditioned on the tokens already
/// generated), in restore order.
pub fn draw_lengths(
    engine: &mut Engine,
    state: &InstanceState,
    index: usize,
    outputs: &LengthDraw,
    rng: &mut SimRng,
    path: &str,
) -> Result<(), TwinError> {
    let lengths = final_lengths(state, outputs, rng);
    set_lengths(engine, &lengths, state, index, path)
}

/// The final lengths [`draw_lengths`] would set, as (output, max tokens) in restore order:
/// drawn once, they can be set on several copies of the same restored engine.
pub fn final_lengths(
    state: &InstanceState,
    outputs: &LengthDraw,
    rng: &mut SimRng,
) -> Vec<(u32, u32)> {
    state
        .running
        .iter()
        .chain(&state.waiting)
        .map(|observed| {
            let final_length = final_length(observed, outputs, rng);
            (final_length, observed.max_tokens.max(final_length))
        })
        .collect()
}

/// Sets `lengths` (from [`final_lengths`] of `state`) on a just-restored [`restore_base`].
pub fn set_lengths(
    engine: &mut Engine,
    lengths: &[(u32, u32)],
    state: &InstanceState,
    index: usize,
    path: &str,
) -> Result<(), TwinError> {
    engine
        .set_final_lengths(lengths)
        .map_err(|err| restore_error(err, state, index, path))
}

/// Names the mirrored field a restore error is about.
fn restore_error(err: SimError, state: &InstanceState, index: usize, path: &str) -> TwinError {
    match err {
        SimError::InvalidRequest { id, field, reason } => {
            let position = id.0.saturating_sub(mirrored_id_base(index)) as usize;
            let (list, position) = if position < state.running.len() {
                ("running", position)
            } else {
                ("waiting", position - state.running.len())
            };
            TwinError::invalid(format!("{path}.{list}[{position}].{field}"), reason)
        }
        // The store accepted this state, so a mismatch here is the mirror's, not the caller's.
        SimError::InvalidState { field, reason } => TwinError::Unsimulable(format!(
            "mirrored state of {path}.{field} cannot be simulated: {reason}"
        )),
        other => TwinError::invalid(path, other.to_string()),
    }
}

/// The final output length of an observed request: as known, or drawn.
fn final_length(observed: &ObservedRequest, outputs: &LengthDraw, rng: &mut SimRng) -> u32 {
    let generated = observed.output_tokens;
    match observed.known_output_tokens {
        Some(known) => known.max(generated + 1),
        None => conditioned_length(outputs, generated, observed.max_tokens, rng),
    }
}

/// A prompt's content as the engine keys it: the given block hashes, else the token ids,
/// else synthetic (unique to the request).
pub(super) fn prompt_content(
    block_hashes: &[u64],
    token_ids: Option<&Arc<[u32]>>,
) -> PromptContent {
    if !block_hashes.is_empty() {
        PromptContent::BlockKeys(block_hashes.to_vec().into())
    } else if let Some(tokens) = token_ids {
        PromptContent::Tokens(tokens.clone())
    } else {
        PromptContent::Synthetic {
            prefix_group: None,
            prefix_len: 0,
        }
    }
}

fn to_restored(observed: &ObservedRequest, id: u64, final_length: u32) -> RestoredRequest {
    let generated = observed.output_tokens;
    let content = prompt_content(&observed.block_hashes, observed.token_ids.as_ref());
    RestoredRequest {
        spec: RequestSpec {
            id: RequestId(id),
            arrival_us: observed.arrival_us,
            input_tokens: observed.prompt_tokens,
            output_tokens: final_length,
            max_tokens: observed.max_tokens.max(final_length),
            slo_class: observed.slo_class,
            priority: observed.priority,
            deadline_us: None,
            content,
        },
        computed_tokens: observed.computed_tokens,
        generated,
        cached_tokens: observed.cached_tokens,
        // A pod does not publish its clients' view; it only shifts that request's own times.
        client_lag_us: 0,
        scheduled_tokens: observed.scheduled_tokens,
    }
}
