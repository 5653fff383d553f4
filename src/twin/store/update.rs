//! Validation and application of one instance update: lifecycle events, full request lists
//! and gauges, checked against the instance's limits. Pure functions over values: the store
//! calls them on a copy of the instance state and publishes the result only if they succeed.

use foldhash::HashSet;
use foldhash::HashSetExt;

use crate::cluster::config::InstanceConfig;
use crate::twin::error::TwinError;
use crate::twin::snapshot::{Gauges, InstanceState, ObservedRequest};

use super::{InstanceUpdate, RequestEvent, StoreLimits, TimedRequestEvent};

/// An instance state after an accepted update, with the traffic it revealed.
pub(super) struct AppliedUpdate {
    pub(super) state: InstanceState,
    pub(super) arrivals: Vec<u64>,
    pub(super) finished: Vec<(u32, u32)>,
}

pub(super) fn build_state(
    old: &InstanceState,
    config: &InstanceConfig,
    update: InstanceUpdate,
    limits: &StoreLimits,
) -> Result<AppliedUpdate, TwinError> {
    let at = update.observed_at_us;
    if at == 0 {
        return Err(TwinError::invalid("observed_at_us", "must be positive"));
    }
    let touches_requests = update.requests.is_some() || !update.events.is_empty();
    if !touches_requests && update.gauges.is_none() {
        return Err(TwinError::invalid(
            "instance_id",
            "the update carries no requests, gauges or events",
        ));
    }
    if touches_requests && at < old.observed_at_us {
        return Err(TwinError::Superseded {
            path: "observed_at_us".to_owned(),
            why: format!(
                "{at} is older than the instance's last observation {}",
                old.observed_at_us
            ),
        });
    }
    if update.gauges.is_some() && at < old.gauges_at_us {
        return Err(TwinError::invalid(
            "observed_at_us",
            format!(
                "{at} is older than the instance's last gauges {}",
                old.gauges_at_us
            ),
        ));
    }
    // Lists that the update replaces whole are not copied first.
    let replaced = update.events.is_empty() && update.requests.is_some();
    let mut applied = AppliedUpdate {
        state: if replaced {
            clone_without_requests(old)
        } else {
            old.clone()
        },
        arrivals: Vec::new(),
        finished: Vec::new(),
    };
    apply_events(&mut applied, config, &update.events, at)?;
    if let Some(mut lists) = update.requests {
        for (name, list) in [
            ("waiting", &mut lists.waiting),
            ("running", &mut lists.running),
        ] {
            for (index, request) in list.iter_mut().enumerate() {
                // Formatted only for an error (this runs on every scrape).
                let path = format_args!("requests.{name}[{index}]");
                normalize_request(request, config, at, &path, name == "waiting")?;
            }
        }
        if update.counts_arrivals {
            let before = if replaced { old } else { &applied.state };
            let known: HashSet<&str> = before
                .waiting
                .iter()
                .chain(&before.running)
                .map(|request| request.request_id.as_str())
                .collect();
            let new_arrivals: Vec<u64> = lists
                .waiting
                .iter()
                .chain(&lists.running)
                .filter(|request| !known.contains(request.request_id.as_str()))
                .map(|request| request.arrival_us)
                .collect();
            applied.arrivals.extend(new_arrivals);
        }
        applied.state.waiting = lists.waiting;
        applied.state.running = lists.running;
        applied.state.step_end_us = lists.step_end_us;
    }
    if !update.counts_arrivals {
        applied.arrivals.clear();
    }
    if touches_requests {
        applied.state.observed_at_us = at;
        check_state(&applied.state, config, limits)?;
    }
    if let Some(gauges) = update.gauges {
        check_gauges(&gauges, config)?;
        fit_transfers(&mut applied.state, &gauges);
        applied.state.gauges = Some(gauges);
        applied.state.gauges_at_us = at;
    }
    Ok(applied)
}

/// `old` without its waiting and running lists (the fields are listed exhaustively, so a new
/// field of [`InstanceState`] cannot be forgotten here).
fn clone_without_requests(old: &InstanceState) -> InstanceState {
    let InstanceState {
        instance_id,
        observed_at_us,
        waiting: _,
        running: _,
        step_end_us,
        gauges,
        gauges_at_us,
        cached_blocks,
        kv_events_at_us,
        kv_event_seq,
        kv_event_gaps,
        stale_reason,
        capped,
        transfer_fit,
    } = old;
    InstanceState {
        instance_id: instance_id.clone(),
        observed_at_us: *observed_at_us,
        waiting: Vec::new(),
        running: Vec::new(),
        step_end_us: *step_end_us,
        gauges: *gauges,
        gauges_at_us: *gauges_at_us,
        cached_blocks: cached_blocks.clone(),
        kv_events_at_us: *kv_events_at_us,
        kv_event_seq: *kv_event_seq,
        kv_event_gaps: *kv_event_gaps,
        stale_reason: stale_reason.clone(),
        transfer_fit: *transfer_fit,
        capped: capped.clone(),
    }
}

fn apply_events(
    applied: &mut AppliedUpdate,
    config: &InstanceConfig,
    events: &[TimedRequestEvent],
    observed_at_us: u64,
) -> Result<(), TwinError> {
    let mut previous = 0;
    for (index, timed) in events.iter().enumerate() {
        let path = format!("events[{index}]");
        let at = timed.at_us;
        if at == 0 || at < previous || at > observed_at_us {
            return Err(TwinError::invalid(
                format!("{path}.at_us"),
                format!(
                    "{at} must be positive, not before the previous event ({previous}) and \
                     not after observed_at_us ({observed_at_us})"
                ),
            ));
        }
        previous = at;
        let state = &mut applied.state;
        match &timed.event {
            RequestEvent::Routed(request) => {
                let path = format!("{path}.routed.request");
                let mut request = request.clone();
                normalize_request(&mut request, config, at, &path, true)?;
                if find(&state.waiting, &request.request_id).is_some()
                    || find(&state.running, &request.request_id).is_some()
                {
                    return Err(TwinError::invalid(
                        format!("{path}.request_id"),
                        format!(
                            "request {:?} is already on the instance",
                            request.request_id
                        ),
                    ));
                }
                applied.arrivals.push(request.arrival_us);
                state.waiting.push(request);
            }
            RequestEvent::FirstToken { request_id } => {
                if let Some(position) = find(&state.waiting, request_id) {
                    let mut request = state.waiting.remove(position);
                    request.computed_tokens = request.computed_tokens.max(request.prompt_tokens);
                    request.output_tokens = request.output_tokens.max(1);
                    // The step that produced the token is over.
                    request.scheduled_tokens = 0;
                    state.running.push(request);
                } else if let Some(position) = find(&state.running, request_id) {
                    let request = &mut state.running[position];
                    request.computed_tokens = request.computed_tokens.max(request.prompt_tokens);
                    request.output_tokens = request.output_tokens.max(1);
                    request.scheduled_tokens = 0;
                } else {
                    return Err(unknown_request(&path, "first_token", request_id));
                }
            }
            RequestEvent::Finished {
                request_id,
                output_tokens,
            } => {
                let request = if let Some(position) = find(&state.waiting, request_id) {
                    state.waiting.remove(position)
                } else if let Some(position) = find(&state.running, request_id) {
                    state.running.remove(position)
                } else {
                    return Err(unknown_request(&path, "finished", request_id));
                };
                if *output_tokens < request.output_tokens.max(1)
                    || *output_tokens > request.max_tokens
                {
                    return Err(TwinError::invalid(
                        format!("{path}.finished.output_tokens"),
                        format!(
                            "{output_tokens} must be in {}..={} (tokens already generated \
                             ..= max_tokens)",
                            request.output_tokens.max(1),
                            request.max_tokens
                        ),
                    ));
                }
                applied
                    .finished
                    .push((request.prompt_tokens, *output_tokens));
            }
        }
    }
    Ok(())
}

fn find(list: &[ObservedRequest], id: &str) -> Option<usize> {
    list.iter().position(|request| request.request_id == id)
}

fn unknown_request(path: &str, kind: &str, id: &str) -> TwinError {
    TwinError::invalid(
        format!("{path}.{kind}.request_id"),
        format!("unknown request {id:?} (not waiting or running on the instance)"),
    )
}

/// Resolves `max_tokens` of 0 and checks one request against the instance's limits.
fn normalize_request(
    request: &mut ObservedRequest,
    config: &InstanceConfig,
    at_us: u64,
    path: &dyn std::fmt::Display,
    waiting: bool,
) -> Result<(), TwinError> {
    let field_error =
        |field: &str, reason: String| TwinError::invalid(format!("{path}.{field}"), reason);
    if request.request_id.is_empty() {
        return Err(field_error("request_id", "must not be empty".to_owned()));
    }
    if request.arrival_us > at_us {
        return Err(field_error(
            "arrival_us",
            format!(
                "{} is after the observation time {at_us}",
                request.arrival_us
            ),
        ));
    }
    let usable = config.engine.effective_max_model_len();
    let prompt = request.prompt_tokens;
    if prompt == 0 || prompt >= usable {
        return Err(field_error(
            "prompt_tokens",
            format!("{prompt} must be in 1..{usable} (below the instance's usable max_model_len)"),
        ));
    }
    if request.max_tokens == 0 {
        request.max_tokens = usable - prompt;
    }
    check_request(request, config, path, waiting)
}

/// Checks one (normalised) request against the instance's limits; errors name the field
/// under `path`.
fn check_request(
    request: &ObservedRequest,
    config: &InstanceConfig,
    path: &dyn std::fmt::Display,
    waiting: bool,
) -> Result<(), TwinError> {
    let engine = &config.engine;
    check_token_counts(request, engine.effective_max_model_len(), waiting)
        .and_then(|()| check_prompt_keys(request, engine.block_size))
        .map_err(|(field, reason)| TwinError::invalid(format!("{path}.{field}"), reason))
}

/// A field of a request and why its value is refused.
type FieldError = (&'static str, String);

/// The request's token counts: within `usable` (the usable max_model_len), consistent with
/// one another, none computed while waiting.
fn check_token_counts(
    request: &ObservedRequest,
    usable: u32,
    waiting: bool,
) -> Result<(), FieldError> {
    let prompt = u64::from(request.prompt_tokens);
    let output = u64::from(request.output_tokens);
    let usable = u64::from(usable);
    if request.max_tokens == 0 || prompt + u64::from(request.max_tokens) > usable {
        return Err((
            "max_tokens",
            format!(
                "prompt_tokens {prompt} + max_tokens {} must be at most the instance's usable \
                 max_model_len {usable}",
                request.max_tokens
            ),
        ));
    }
    if request.output_tokens >= request.max_tokens {
        return Err((
            "output_tokens",
            format!(
                "{output} must be below max_tokens {} (a request reaching it has finished)",
                request.max_tokens
            ),
        ));
    }
    let computed = u64::from(request.computed_tokens);
    let scheduled = u64::from(request.scheduled_tokens);
    if computed >= prompt + output {
        return Err((
            "computed_tokens",
            format!(
                "{computed} must be below prompt_tokens + output_tokens = {}",
                prompt + output
            ),
        ));
    }
    if computed + scheduled > prompt + output {
        return Err((
            "scheduled_tokens",
            format!(
                "computed {computed} + scheduled {scheduled} exceed prompt_tokens + \
                 output_tokens = {}",
                prompt + output
            ),
        ));
    }
    if waiting && (computed > 0 || scheduled > 0) {
        return Err((
            if computed > 0 {
                "computed_tokens"
            } else {
                "scheduled_tokens"
            },
            "must be 0 for a waiting request (vLLM v1 recomputes preempted requests)".to_owned(),
        ));
    }
    if u64::from(request.cached_tokens) > prompt {
        return Err((
            "cached_tokens",
            format!("{} exceeds prompt_tokens {prompt}", request.cached_tokens),
        ));
    }
    if let Some(known) = request.known_output_tokens
        && (known <= request.output_tokens || known > request.max_tokens)
    {
        return Err((
            "known_output_tokens",
            format!(
                "{known} must be in {}..={} (above the tokens already generated, at most \
                 max_tokens)",
                request.output_tokens + 1,
                request.max_tokens
            ),
        ));
    }
    Ok(())
}

/// The prompt's block keys (distinct, no more than its full blocks of `block_size`) and
/// token ids (one per prompt token).
fn check_prompt_keys(request: &ObservedRequest, block_size: u32) -> Result<(), FieldError> {
    let prompt = u64::from(request.prompt_tokens);
    let full_blocks = request.prompt_tokens / block_size;
    if let Some(duplicate) = first_duplicate(&request.block_hashes) {
        return Err((
            "block_hashes",
            format!("hash {duplicate} appears twice (a prompt's block keys are a hash chain)"),
        ));
    }
    if request.block_hashes.len() > full_blocks as usize {
        return Err((
            "block_hashes",
            format!(
                "{} hashes for a prompt of {full_blocks} full blocks",
                request.block_hashes.len()
            ),
        ));
    }
    if let Some(ids) = &request.token_ids
        && ids.len() as u64 != prompt
    {
        return Err((
            "token_ids",
            format!("{} token ids for prompt_tokens {prompt}", ids.len()),
        ));
    }
    Ok(())
}

/// KV blocks the running requests hold: blocks with the same key (from block hashes or
/// token ids) count once, the rest per request.
fn running_blocks(running: &[ObservedRequest], block_size: u32) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let block_size = u64::from(block_size);
    let mut keyed: HashSet<(bool, u64)> = HashSet::new();
    let mut unshared = 0;
    for request in running {
        let total =
            (u64::from(request.computed_tokens) + u64::from(request.scheduled_tokens)).max(1);
        let full = total / block_size;
        let mut shared = 0;
        if !request.block_hashes.is_empty() {
            for &hash in request.block_hashes.iter().take(full as usize) {
                keyed.insert((false, hash));
                shared += 1;
            }
        } else if let Some(ids) = &request.token_ids {
            // A chain hash of the token blocks, only to count distinct blocks.
            let mut hasher = DefaultHasher::new();
            for chunk in ids.chunks_exact(block_size as usize).take(full as usize) {
                chunk.hash(&mut hasher);
                keyed.insert((true, hasher.finish()));
                shared += 1;
            }
        }
        unshared += total.div_ceil(block_size) - shared;
    }
    keyed.len() as u64 + unshared
}

/// Checks a whole instance state against its config (used after updates and on re-sync).
pub(super) fn check_state(
    state: &InstanceState,
    config: &InstanceConfig,
    limits: &StoreLimits,
) -> Result<(), TwinError> {
    let total = state.waiting.len() + state.running.len();
    if total > limits.max_requests_per_instance {
        return Err(TwinError::OverLimit(format!(
            "requests: {total} requests on one instance exceed the limit of {}",
            limits.max_requests_per_instance
        )));
    }
    if state.running.len() > config.engine.max_num_seqs as usize {
        return Err(TwinError::invalid(
            "requests.running",
            format!(
                "{} running requests exceed the instance's max_num_seqs {}",
                state.running.len(),
                config.engine.max_num_seqs
            ),
        ));
    }
    let mut ids = HashSet::with_capacity(total);
    for (name, list) in [("waiting", &state.waiting), ("running", &state.running)] {
        for (index, request) in list.iter().enumerate() {
            // The field path is formatted only for an error (this runs on every scrape).
            let path = format_args!("requests.{name}[{index}]");
            if !ids.insert(request.request_id.as_str()) {
                return Err(TwinError::invalid(
                    format!("{path}.request_id"),
                    format!("duplicate request id {:?}", request.request_id),
                ));
            }
            check_request(request, config, &path, name == "waiting")?;
        }
    }
    let blocks = running_blocks(&state.running, config.engine.block_size);
    if blocks > u64::from(config.engine.num_gpu_blocks) {
        return Err(TwinError::invalid(
            "requests.running",
            format!(
                "the running requests hold {blocks} KV blocks; the instance has {}",
                config.engine.num_gpu_blocks
            ),
        ));
    }
    Ok(())
}

fn check_gauges(gauges: &Gauges, config: &InstanceConfig) -> Result<(), TwinError> {
    if !(gauges.kv_usage.is_finite() && (0.0..=1.0).contains(&gauges.kv_usage)) {
        return Err(TwinError::invalid(
            "gauges.kv_usage",
            format!("{} must be in [0, 1]", gauges.kv_usage),
        ));
    }
    if let Some(field) = gauges
        .transfers
        .as_ref()
        .and_then(|transfers| transfers.invalid_field())
    {
        return Err(TwinError::invalid(
            format!("gauges.transfers.{field}"),
            "must be finite and >= 0",
        ));
    }
    if gauges.running > config.engine.max_num_seqs {
        return Err(TwinError::invalid(
            "gauges.running",
            format!(
                "{} exceeds the instance's max_num_seqs {}",
                gauges.running, config.engine.max_num_seqs
            ),
        ));
    }
    Ok(())
}

/// Folds what the pod's transfer counters moved since its last gauges into its transfer fit
/// (a counter that went back is a restart: the new values are the next baseline).
fn fit_transfers(state: &mut InstanceState, gauges: &Gauges) {
    let Some(now) = gauges.transfers else {
        return;
    };
    let fit = state.transfer_fit.get_or_insert_with(Default::default);
    let before = state.gauges.and_then(|old| old.transfers);
    if let Some(delta) = before.and_then(|before| now.since(&before)) {
        fit.observe(&delta);
    }
}

/// The first value that occurs twice in `values`, if any.
pub(crate) fn first_duplicate(values: &[u64]) -> Option<u64> {
    let mut seen = HashSet::with_capacity(values.len());
    values.iter().copied().find(|value| !seen.insert(*value))
}
