//! Capacity forecasts: simulate candidate replica counts under an arrival forecast, from the
//! current snapshot or from idle instances, and recommend the cheapest count that meets the
//! target SLO attainment (llm-d's `desired_replicas`).
//!
//! A variant is the set of instances configured like its template instance (same model, GPU,
//! TP, limits and latency model). Starting from the snapshot, the variant's existing
//! instances keep their in-flight requests (in config order); extra replicas start idle, and
//! the in-flight requests of instances beyond a smaller count arrive again at `now` to be
//! routed. Each candidate runs `replications` times with its own arrival seed, in parallel.
//!
//! `replication.rs` runs and measures one candidate replication; `pd.rs` forecasts a
//! prefill/decode pool and searches its split; `trim.rs` cuts the met split to the fewest
//! pods of each role that still meet the target (the answer's desired split).

mod pd;
mod pd_cluster;
mod replication;
mod trim;

pub use replication::REPLICAS_MAX;
use replication::{evaluate, same_variant, summarize};

use crate::twin::error::TwinError;
use crate::twin::limits::Limits;
use crate::twin::question::{ForecastAnswer, ForecastCandidate, ForecastQuestion, ForecastStart};
use crate::twin::run::EventBudget;
use crate::twin::snapshot::MirrorSnapshot;
use crate::twin::stats::validate_quantiles;
use crate::workload::Stage;

/// Answers `question` on `snapshot` within `limits`.
pub fn forecast_capacity(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
    limits: &Limits,
) -> Result<ForecastAnswer, TwinError> {
    let templates = validate(snapshot, question, limits)?;
    let budget = EventBudget::for_call(limits);
    if let Some(split) = pd::split_roles(snapshot, question, &templates)? {
        let mut evaluated =
            pd::search_split(snapshot, question, &templates, split, limits, &budget)?;
        let trimmed = trim::trim_search(snapshot, question, &templates, split, limits, &evaluated)?;
        let Some(trimmed) = trimmed else {
            return Ok(answer(snapshot, question, evaluated));
        };
        evaluated.extend(trimmed.evaluated);
        let mut answered = answer(snapshot, question, evaluated);
        // The trimmed split, not the cheapest met candidate: a count below one that misses
        // meets only by chance.
        answered.desired_replicas = templates
            .iter()
            .zip(&trimmed.counts)
            .map(|(&t, &count)| (snapshot.config.instances[t].id.clone(), count))
            .collect();
        return Ok(answered);
    }
    let candidates = candidate_counts(snapshot, question, &templates, limits)?;
    let mut evaluated: Vec<ForecastCandidate> = Vec::new();
    let searching = question
        .variants
        .iter()
        .any(|v| v.replica_counts.is_empty());
    // Explicit counts are evaluated together; a search goes up one replica at a time and
    // stops at the first count meeting the target.
    let batches: Vec<Vec<Vec<u32>>> = if searching {
        candidates.into_iter().map(|c| vec![c]).collect()
    } else {
        vec![candidates]
    };
    for batch in batches {
        for (counts, reps) in batch
            .iter()
            .zip(evaluate(snapshot, question, &templates, &batch, &budget)?)
        {
            evaluated.push(summarize(snapshot, question, &templates, counts, &reps));
        }
        if searching
            && evaluated
                .last()
                .is_some_and(|c| c.slo_attainment >= question.target_attainment)
        {
            break;
        }
    }
    Ok(answer(snapshot, question, evaluated))
}

/// The answer from the evaluated candidates: the cheapest meeting the target is desired.
fn answer(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
    evaluated: Vec<ForecastCandidate>,
) -> ForecastAnswer {
    let desired = evaluated
        .iter()
        .filter(|c| c.slo_attainment >= question.target_attainment)
        .min_by(|a, b| {
            a.cost_per_hour
                .total_cmp(&b.cost_per_hour)
                .then_with(|| total(&a.replicas).cmp(&total(&b.replicas)))
        })
        .map(|c| c.replicas.clone())
        .unwrap_or_default();
    // How old the state the forecast forked from is: its oldest instance's request state
    // (none when it starts from idle instances).
    let state_age_us = match question.start {
        ForecastStart::Empty => 0,
        ForecastStart::Snapshot => snapshot
            .instances
            .iter()
            .map(|state| question.now_us.saturating_sub(state.observed_at_us))
            .max()
            .unwrap_or(0),
    };
    ForecastAnswer {
        candidates: evaluated,
        desired_replicas: desired,
        generation: snapshot.generation,
        seed: question.seed,
        state_age_us,
    }
}

fn total(replicas: &[(String, u32)]) -> u32 {
    replicas.iter().map(|(_, n)| n).sum()
}

/// Highest arrival rate of a forecast stage, requests per second.
pub const STAGE_RATE_MAX_RPS: f64 = 1e6;

/// Checks the question; returns the template instance index of each variant.
fn validate(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
    limits: &Limits,
) -> Result<Vec<usize>, TwinError> {
    validate_stages(question, limits)?;
    question
        .input_tokens
        .compile("input_tokens")
        .map_err(|err| TwinError::invalid("input_tokens", err.to_string()))?;
    question
        .output_tokens
        .compile("output_tokens")
        .map_err(|err| TwinError::invalid("output_tokens", err.to_string()))?;
    if question.replications == 0 {
        return Err(TwinError::invalid("replications", "must be at least 1"));
    }
    if question.replications > limits.max_replications {
        return Err(TwinError::OverLimit(format!(
            "{} replications exceed the limit of {}",
            question.replications, limits.max_replications
        )));
    }
    if !(question.target_attainment > 0.0 && question.target_attainment <= 1.0) {
        return Err(TwinError::invalid("target_attainment", "must be in (0, 1]"));
    }
    if !(question.max_cost_per_hour.is_finite() && question.max_cost_per_hour >= 0.0) {
        return Err(TwinError::invalid(
            "max_cost_per_hour",
            "must be a non-negative number",
        ));
    }
    validate_quantiles(&question.quantiles, "quantiles")?;
    variant_templates(snapshot, question)
}

/// Checks the stages (rates, durations) and that the work they ask for is within `limits`.
fn validate_stages(question: &ForecastQuestion, limits: &Limits) -> Result<(), TwinError> {
    if question.stages.is_empty() {
        return Err(TwinError::invalid("stages", "needs at least one stage"));
    }
    let mut horizon_us: u64 = 0;
    let mut expected_arrivals = 0.0;
    for (index, &Stage { rate, duration_s }) in question.stages.iter().enumerate() {
        if !(rate.is_finite() && rate > 0.0 && rate <= STAGE_RATE_MAX_RPS) {
            return Err(TwinError::invalid(
                format!("stages[{index}].rate"),
                "must be in (0, 1e6] requests per second",
            ));
        }
        if !(duration_s.is_finite() && duration_s > 0.0) {
            return Err(TwinError::invalid(
                format!("stages[{index}].duration_s"),
                "must be positive",
            ));
        }
        horizon_us = horizon_us.saturating_add((duration_s * 1e6) as u64);
        expected_arrivals += rate * duration_s;
    }
    if horizon_us > limits.max_horizon_us {
        return Err(TwinError::OverLimit(format!(
            "the forecast spans {} s, beyond the limit of {} s",
            horizon_us / 1_000_000,
            limits.max_horizon_us / 1_000_000
        )));
    }
    if expected_arrivals * f64::from(question.replications)
        > limits.max_events_per_call as f64 / 10.0
    {
        return Err(TwinError::OverLimit(format!(
            "about {expected_arrivals:.0} arrivals per replication is too much work for one call"
        )));
    }
    Ok(())
}

/// The template instance index of each variant: known, distinct, configured differently,
/// with replica counts in range.
fn variant_templates(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
) -> Result<Vec<usize>, TwinError> {
    if question.variants.is_empty() {
        return Err(TwinError::invalid("variants", "needs at least one variant"));
    }
    let mut templates = Vec::with_capacity(question.variants.len());
    for (index, variant) in question.variants.iter().enumerate() {
        let template = snapshot
            .config
            .instances
            .iter()
            .position(|i| i.id == variant.template_instance_id)
            .ok_or_else(|| {
                TwinError::invalid(
                    format!("variants[{index}].template_instance_id"),
                    format!("unknown instance id {:?}", variant.template_instance_id),
                )
            })?;
        let config = &snapshot.config.instances;
        if let Some(other) = templates
            .iter()
            .position(|&t| same_variant(&config[t], &config[template]))
        {
            return Err(TwinError::invalid(
                format!("variants[{index}].template_instance_id"),
                format!(
                    "configured exactly like variants[{other}]'s template: one variant would \
                     claim the other's instances"
                ),
            ));
        }
        if templates.contains(&template) {
            return Err(TwinError::invalid(
                format!("variants[{index}].template_instance_id"),
                "names the same template twice",
            ));
        }
        for (position, &count) in variant.replica_counts.iter().enumerate() {
            if count == 0 || count > REPLICAS_MAX {
                return Err(TwinError::invalid(
                    format!("variants[{index}].replica_counts[{position}]"),
                    format!("must be in 1..={REPLICAS_MAX}"),
                ));
            }
        }
        templates.push(template);
    }
    Ok(templates)
}

/// Replica counts (one per variant) to evaluate, in evaluation order.
fn candidate_counts(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
    templates: &[usize],
    limits: &Limits,
) -> Result<Vec<Vec<u32>>, TwinError> {
    let searching: Vec<usize> = (0..question.variants.len())
        .filter(|&i| question.variants[i].replica_counts.is_empty())
        .collect();
    if searching.len() > 1 {
        return Err(TwinError::invalid(
            "variants",
            "a search (empty replica_counts) is possible for one variant at a time",
        ));
    }
    let max = limits.max_forecast_candidates as usize;
    if let Some(&searched) = searching.first() {
        let fixed: Vec<u32> = question
            .variants
            .iter()
            .map(|v| v.replica_counts.first().copied().unwrap_or(0))
            .collect();
        let fixed_cost: f64 = (0..fixed.len())
            .filter(|&i| i != searched)
            .map(|i| f64::from(fixed[i]) * snapshot.config.instances[templates[i]].cost_per_hour)
            .sum();
        let unit_cost = snapshot.config.instances[templates[searched]].cost_per_hour;
        let mut out = Vec::new();
        for count in 1..=REPLICAS_MAX.min(max as u32) {
            let cost = fixed_cost + f64::from(count) * unit_cost;
            if question.max_cost_per_hour > 0.0 && cost > question.max_cost_per_hour {
                break;
            }
            let mut counts = fixed.clone();
            counts[searched] = count;
            out.push(counts);
        }
        if out.is_empty() {
            return Err(TwinError::invalid(
                "max_cost_per_hour",
                "not even one replica fits the cost bound",
            ));
        }
        return Ok(out);
    }
    let mut combos: Vec<Vec<u32>> = vec![Vec::new()];
    for variant in &question.variants {
        let mut next = Vec::new();
        for combo in &combos {
            for &count in &variant.replica_counts {
                let mut extended = combo.clone();
                extended.push(count);
                next.push(extended);
                if next.len() > max {
                    return Err(TwinError::OverLimit(format!(
                        "more than {max} replica combinations"
                    )));
                }
            }
        }
        combos = next;
    }
    Ok(combos)
}
