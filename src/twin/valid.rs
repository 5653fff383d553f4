//! The one place a routing question is checked: [`ValidRouting::new`] takes a question, the
//! snapshot it will run on and the call's limits, and returns a question the forks can trust
//! (candidates resolved to instance indices, every default decided) or an error naming the
//! field. `predict` only takes a [`ValidRouting`], so no unchecked question reaches a fork, and
//! the server decodes the wire into a plain [`RoutingQuestion`] without checking its meaning a
//! second time.
//!
//! Field paths are the wire's (`request.prompt_tokens`, `candidate_instance_ids[2]`,
//! `options.horizon_ms`): the gRPC API is where a caller reads them. Over-limit values are
//! [`TwinError::OverLimit`] (RESOURCE_EXHAUSTED), everything else
//! [`TwinError::InvalidField`] (INVALID_ARGUMENT).

use foldhash::{HashSet, HashSetExt};

use super::error::{TwinError, short_num};
use super::limits::Limits;
use super::question::{OutputLength, RoutingQuestion};
use super::snapshot::MirrorSnapshot;
use super::stats::validate_quantiles;

/// A routing question checked against one snapshot and one set of limits.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidRouting {
    question: RoutingQuestion,
    candidates: Vec<usize>,
    max_signal_age_us: u64,
    generation: u64,
}

impl ValidRouting {
    /// Checks `question` against `snapshot` and `limits`: the request's lengths and prompt
    /// keys, the options' ranges and limits, the candidates (known, distinct, not too many;
    /// none means every instance) and the decision time (not before any candidate's
    /// observation). Decides the signal-age limit (the snapshot's setting when the question
    /// gives none).
    pub fn new(
        question: RoutingQuestion,
        snapshot: &MirrorSnapshot,
        limits: &Limits,
    ) -> Result<Self, TwinError> {
        check_request(&question)?;
        check_options(&question, limits)?;
        let candidates = candidate_indices(&question, snapshot, limits)?;
        for &index in &candidates {
            let state = &snapshot.instances[index];
            if state.observed_at_us > question.now_us {
                return Err(TwinError::invalid(
                    "now_us",
                    format!(
                        "{} precedes instance {:?}'s observation at {}",
                        question.now_us, state.instance_id, state.observed_at_us
                    ),
                ));
            }
        }
        let max_signal_age_us = question
            .options
            .max_signal_age_us
            .unwrap_or(snapshot.settings.max_signal_age_us);
        Ok(ValidRouting {
            question,
            candidates,
            max_signal_age_us,
            generation: snapshot.generation,
        })
    }

    /// The question as asked.
    pub fn question(&self) -> &RoutingQuestion {
        &self.question
    }

    /// The candidates as indices into the snapshot's instances, in the question's order.
    pub fn candidates(&self) -> &[usize] {
        &self.candidates
    }

    /// Signals older than this are stale (µs): the question's limit, or the snapshot's.
    pub fn max_signal_age_us(&self) -> u64 {
        self.max_signal_age_us
    }

    /// The generation of the snapshot the question was checked against; it must run on that
    /// snapshot (the indices are that snapshot's).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// The request's lengths and prompt keys.
fn check_request(question: &RoutingQuestion) -> Result<(), TwinError> {
    let request = &question.request;
    if request.prompt_tokens == 0 {
        return Err(TwinError::invalid(
            "request.prompt_tokens",
            "must be at least 1",
        ));
    }
    match &request.output {
        OutputLength::Point(0) => {
            return Err(TwinError::invalid(
                "request.output_tokens",
                "must be at least 1",
            ));
        }
        OutputLength::Point(_) => {}
        OutputLength::Histogram(bins) => check_histogram(bins)?,
    }
    if request.max_tokens == 0 {
        return Err(TwinError::invalid(
            "request.max_tokens",
            "must be at least 1",
        ));
    }
    if let Some(tokens) = &request.token_ids
        && tokens.len() != request.prompt_tokens as usize
    {
        return Err(TwinError::invalid(
            "request.token_ids",
            format!(
                "{} token ids for prompt_tokens {}",
                tokens.len(),
                request.prompt_tokens
            ),
        ));
    }
    let mut seen = HashSet::with_capacity(request.block_hashes.len());
    if let Some(duplicate) = request.block_hashes.iter().find(|h| !seen.insert(**h)) {
        return Err(TwinError::invalid(
            "request.block_hashes",
            format!("hash {duplicate} appears twice (a prompt's block keys are a hash chain)"),
        ));
    }
    Ok(())
}

/// An output-length histogram: positive lengths, finite non-negative weights, a positive sum.
fn check_histogram(bins: &[(u32, f64)]) -> Result<(), TwinError> {
    const PATH: &str = "request.output_histogram.bins";
    if bins.is_empty() {
        return Err(TwinError::invalid(PATH, "needs at least 1 bin"));
    }
    for (index, &(tokens, weight)) in bins.iter().enumerate() {
        if tokens == 0 {
            return Err(TwinError::invalid(
                format!("{PATH}[{index}].tokens"),
                "must be at least 1",
            ));
        }
        if !(weight.is_finite() && weight >= 0.0) {
            return Err(TwinError::invalid(
                format!("{PATH}[{index}].weight"),
                format!("{} must be a finite number >= 0", short_num(weight)),
            ));
        }
    }
    if bins.iter().map(|&(_, weight)| weight).sum::<f64>() <= 0.0 {
        return Err(TwinError::invalid(
            PATH,
            "the weights must have a positive sum",
        ));
    }
    Ok(())
}

/// Replications, horizon and quantiles, within the call's limits.
fn check_options(question: &RoutingQuestion, limits: &Limits) -> Result<(), TwinError> {
    let options = &question.options;
    if options.replications == 0 {
        return Err(TwinError::invalid(
            "options.replications",
            "must be at least 1",
        ));
    }
    if options.replications > limits.max_replications {
        return Err(over_limit(
            "options.replications",
            u64::from(options.replications),
            u64::from(limits.max_replications),
        ));
    }
    if options.horizon_us == 0 {
        return Err(TwinError::invalid("options.horizon_ms", "must be positive"));
    }
    if options.horizon_us > limits.max_horizon_us {
        return Err(over_limit(
            "options.horizon_ms",
            options.horizon_us / 1000,
            limits.max_horizon_us / 1000,
        ));
    }
    if options.max_signal_age_us == Some(0) {
        return Err(TwinError::invalid(
            "options.max_signal_age_ms",
            "must be positive",
        ));
    }
    validate_quantiles(&options.quantiles, "options.quantiles")
}

/// The candidates as instance indices: every instance when the question names none.
fn candidate_indices(
    question: &RoutingQuestion,
    snapshot: &MirrorSnapshot,
    limits: &Limits,
) -> Result<Vec<usize>, TwinError> {
    let instances = &snapshot.config.instances;
    let (count, path) = if question.candidates.is_empty() {
        (
            instances.len(),
            "candidate_instance_ids (empty: every instance)",
        )
    } else {
        (question.candidates.len(), "candidate_instance_ids")
    };
    // The count first: the checks below are quadratic in it.
    if count > limits.max_candidates as usize {
        return Err(over_limit(
            path,
            count as u64,
            u64::from(limits.max_candidates),
        ));
    }
    if question.candidates.is_empty() {
        return Ok((0..instances.len()).collect());
    }
    let mut indices = Vec::with_capacity(count);
    for (position, id) in question.candidates.iter().enumerate() {
        let path = || format!("candidate_instance_ids[{position}]");
        if question.candidates[..position].contains(id) {
            return Err(TwinError::invalid(
                path(),
                format!("duplicate candidate {id:?}"),
            ));
        }
        let index = instances
            .iter()
            .position(|instance| &instance.id == id)
            .ok_or_else(|| TwinError::invalid(path(), format!("unknown instance {id:?}")))?;
        indices.push(index);
    }
    Ok(indices)
}

fn over_limit(field: &str, value: u64, limit: u64) -> TwinError {
    TwinError::OverLimit(format!("{field}: {value} exceeds the limit of {limit}"))
}
