//! From a mirrored instance to a restored engine: observed requests become engine requests
//! (with known or sampled final lengths), cached blocks and the step in flight carry over.

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

/// The engine id of the request a routing question is about.
pub const QUESTION_REQUEST_ID: u64 = 0;

/// Engine ids of mirrored instance `index`'s requests start here: ids stay unique across
/// instances (requests may move between them in a forecast).
pub fn mirrored_id_base(index: usize) -> u64 {
    MIRRORED_ID_BASE + ((index as u64) << 24)
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
    let id_base = mirrored_id_base(index);
    let mut next_id = id_base;
    let mut convert = |observed: &ObservedRequest| {
        let request = to_restored(observed, next_id, outputs, rng);
        next_id += 1;
        request
    };
    let running: Vec<RestoredRequest> = state.running.iter().map(&mut convert).collect();
    let waiting: Vec<RestoredRequest> = state.waiting.iter().map(&mut convert).collect();
    let restore = RestoreState {
        now_us: state.observed_at_us,
        cached_keys: state.cached_blocks.clone(),
        running,
        waiting,
        step_end_us: state.step_end_us.filter(|&end| end > state.observed_at_us),
    };
    let mut config = instance.engine.clone();
    config.kv_sample_interval_us = 0;
    Engine::restore(config, instance.latency.clone(), restore).map_err(|err| match err {
        SimError::InvalidRequest { id, field, reason } => {
            let index = id.0.saturating_sub(id_base) as usize;
            let (list, position) = if index < state.running.len() {
                ("running", index)
            } else {
                ("waiting", index - state.running.len())
            };
            TwinError::invalid(format!("{path}.{list}[{position}].{field}"), reason)
        }
        // The store accepted this state, so a mismatch here is the mirror's, not the caller's.
        SimError::InvalidState { field, reason } => TwinError::FailedPrecondition(format!(
            "mirrored state of {path}.{field} cannot be simulated: {reason}"
        )),
        other => TwinError::invalid(path, other.to_string()),
    })
}

fn to_restored(
    observed: &ObservedRequest,
    id: u64,
    outputs: &LengthDraw,
    rng: &mut SimRng,
) -> RestoredRequest {
    let generated = observed.output_tokens;
    let final_length = match observed.known_output_tokens {
        Some(known) => known.max(generated + 1),
        None => conditioned_length(outputs, generated, observed.max_tokens, rng),
    };
    let content = if !observed.block_hashes.is_empty() {
        PromptContent::BlockKeys(observed.block_hashes.clone().into())
    } else if let Some(tokens) = &observed.token_ids {
        PromptContent::Tokens(tokens.clone())
    } else {
        PromptContent::Synthetic {
            prefix_group: None,
            prefix_len: 0,
        }
    };
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
        scheduled_tokens: observed.scheduled_tokens,
    }
}
