//! Capacity forecasts of a prefill/decode (P/D) pool (docs/disaggregation.md): candidates
//! run as disaggregated clusters (llm-d's `disagg-profile-handler` with its defaults: the
//! `prefix-based-pd-decider` at 16 uncached tokens, NIXL over one 400 Gb/s NIC per GPU), and
//! a search over a prefill and a decode variant grows each role's replicas on its own
//! objective until the split meets the target: the prefill count while too few requests
//! meet the TTFT objective, the decode count while too few meet TPOT and end-to-end.
//!
//! A P/D candidate starts from idle instances: the engines' restore does not carry requests
//! whose KV is held for a pull or in transfer yet, so the snapshot's in-flight requests are
//! not carried into it (a `start: snapshot` question is answered as `start: empty`).

use crate::cluster::config::InstanceRole;

use super::replication::{REPLICAS_MAX, Replication, evaluate, summarize};
use crate::twin::error::TwinError;
use crate::twin::limits::Limits;
use crate::twin::question::{ForecastCandidate, ForecastQuestion};
use crate::twin::run::EventBudget;
use crate::twin::snapshot::MirrorSnapshot;

/// The two searched variants of a P/D split: indices into the question's variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitRoles {
    /// The prefill variant.
    pub prefill: usize,
    /// The decode variant.
    pub decode: usize,
}

/// The P/D split the question searches, if it searches one: exactly two variants with
/// empty `replica_counts`, one prefill and one decode. Searching two variants otherwise is
/// an error naming `variants`.
pub(super) fn split_roles(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
    templates: &[usize],
) -> Result<Option<SplitRoles>, TwinError> {
    let searched: Vec<usize> = (0..question.variants.len())
        .filter(|&i| question.variants[i].replica_counts.is_empty())
        .collect();
    if searched.len() != 2 {
        return Ok(None);
    }
    let role = |i: usize| snapshot.config.instances[templates[i]].role;
    match (role(searched[0]), role(searched[1])) {
        (InstanceRole::Prefill, InstanceRole::Decode) => Ok(Some(SplitRoles {
            prefill: searched[0],
            decode: searched[1],
        })),
        (InstanceRole::Decode, InstanceRole::Prefill) => Ok(Some(SplitRoles {
            prefill: searched[1],
            decode: searched[0],
        })),
        _ => Err(TwinError::invalid(
            "variants",
            "two variants can be searched together only as a P/D split (one prefill, one \
             decode template)",
        )),
    }
}

/// Searches the split: from one replica of each role, adds a prefill replica while the TTFT
/// objective's attainment is under the target and a decode replica while the TPOT and
/// end-to-end objectives' is (the one with the lower attainment when only their conjunction
/// falls short), until a candidate meets the target, the cost bound or the candidate limit
/// stops it. Every evaluated candidate is returned in order.
pub(super) fn search_split(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
    templates: &[usize],
    split: SplitRoles,
    limits: &Limits,
    budget: &EventBudget,
) -> Result<Vec<ForecastCandidate>, TwinError> {
    let mut counts: Vec<u32> = question
        .variants
        .iter()
        .map(|v| v.replica_counts.first().copied().unwrap_or(1))
        .collect();
    let cost = |counts: &[u32]| -> f64 {
        templates
            .iter()
            .zip(counts)
            .map(|(&t, &c)| f64::from(c) * snapshot.config.instances[t].cost_per_hour)
            .sum()
    };
    if question.max_cost_per_hour > 0.0 && cost(&counts) > question.max_cost_per_hour {
        return Err(TwinError::invalid(
            "max_cost_per_hour",
            "not even one replica of each role fits the cost bound",
        ));
    }
    let target = question.target_attainment;
    let mut evaluated = Vec::new();
    for _ in 0..limits.max_forecast_candidates.max(1) {
        let batch = vec![counts.clone()];
        let reps = evaluate(snapshot, question, templates, &batch, budget)?
            .pop()
            .unwrap_or_default();
        let candidate = summarize(snapshot, question, templates, &counts, &reps);
        let met = candidate.slo_attainment >= target;
        evaluated.push(candidate);
        if met {
            break;
        }
        let (ttft, decode) = role_attainments(&reps);
        let mut next = counts.clone();
        if ttft < target {
            next[split.prefill] += 1;
        }
        if decode < target {
            next[split.decode] += 1;
        }
        if next == counts {
            // Each side alone meets the target, their conjunction does not.
            let role = if ttft <= decode {
                split.prefill
            } else {
                split.decode
            };
            next[role] += 1;
        }
        let over_cost =
            question.max_cost_per_hour > 0.0 && cost(&next) > question.max_cost_per_hour;
        if over_cost || next.iter().any(|&c| c > REPLICAS_MAX) {
            break;
        }
        counts = next;
    }
    Ok(evaluated)
}

/// Mean TTFT-side and decode-side attainments over the replications.
fn role_attainments(reps: &[Replication]) -> (f64, f64) {
    let n = reps.len().max(1) as f64;
    (
        reps.iter().map(|r| r.ttft_attainment).sum::<f64>() / n,
        reps.iter().map(|r| r.decode_attainment).sum::<f64>() / n,
    )
}
