//! From the replications' outcomes on each candidate to the answer: distributions, SLO
//! probabilities, means, validity, and the recommended instance.

use super::outcome::{ReplicationOutcome, Treatment};
use super::question::{CandidatePrediction, Distribution, RoutingQuestion};
use super::snapshot::MirrorSnapshot;
use super::stats::distribution;

/// One candidate's prediction from its replications' outcomes.
pub(super) fn summarize(
    snapshot: &MirrorSnapshot,
    question: &RoutingQuestion,
    index: usize,
    treatment: Treatment,
    reps: &[ReplicationOutcome],
) -> CandidatePrediction {
    let instance = &snapshot.config.instances[index];
    let age_ms = super::fork::elapsed_us(snapshot.instances[index].observed_at_us, question.now_us)
        as f64
        / 1000.0;
    let quantiles = &question.options.quantiles;
    let dropped = !reps.is_empty() && reps.iter().all(|r| r.dropped);
    let (valid, reason) = match treatment {
        _ if dropped => (
            false,
            "the instance cannot serve the request: prompt + max_tokens exceeds what it holds"
                .to_owned(),
        ),
        Treatment::Excluded => (
            false,
            "excluded: signals older than max_signal_age".to_owned(),
        ),
        Treatment::Saturated => (
            false,
            "treated as saturated: signals older than max_signal_age".to_owned(),
        ),
        Treatment::RollForward | Treatment::UseLast => (true, String::new()),
    };
    let pick = |f: fn(&ReplicationOutcome) -> f64| -> Vec<f64> { reps.iter().map(f).collect() };
    let slo = question.request.slo;
    let ttft_met =
        |r: &ReplicationOutcome| r.ttft_known && slo.ttft_ms.is_none_or(|t| r.ttft_ms <= t);
    let meets = |r: &ReplicationOutcome, target: Option<f64>, value: f64| {
        target.is_none_or(|t| r.completed && value <= t)
    };
    let fraction = |f: &dyn Fn(&ReplicationOutcome) -> bool| -> f64 {
        if reps.is_empty() {
            0.0
        } else {
            reps.iter().filter(|r| f(r)).count() as f64 / reps.len() as f64
        }
    };
    let mean = |values: Vec<f64>| -> f64 {
        if values.is_empty() {
            0.0
        } else {
            values.iter().sum::<f64>() / values.len() as f64
        }
    };
    if !valid {
        return CandidatePrediction {
            instance_id: instance.id.clone(),
            valid,
            invalid_reason: reason,
            ttft_ms: Distribution::default(),
            tpot_ms: Distribution::default(),
            e2e_ms: Distribution::default(),
            slo_probability: 0.0,
            ttft_slo_probability: 0.0,
            tpot_slo_probability: 0.0,
            queue_wait_ms: 0.0,
            prefix_hit_tokens: 0.0,
            kv_usage_after: 0.0,
            others_delta_e2e_ms: 0.0,
            input_age_ms: age_ms,
        };
    }
    CandidatePrediction {
        instance_id: instance.id.clone(),
        valid,
        invalid_reason: reason,
        ttft_ms: distribution(&pick(|r| r.ttft_ms), quantiles),
        tpot_ms: distribution(&pick(|r| r.tpot_ms), quantiles),
        e2e_ms: distribution(&pick(|r| r.e2e_ms), quantiles),
        slo_probability: fraction(&|r| {
            ttft_met(r) && meets(r, slo.tpot_ms, r.tpot_ms) && meets(r, slo.e2e_ms, r.e2e_ms)
        }),
        ttft_slo_probability: fraction(&ttft_met),
        tpot_slo_probability: fraction(&|r| meets(r, slo.tpot_ms, r.tpot_ms)),
        queue_wait_ms: mean(pick(|r| r.queue_wait_ms)),
        prefix_hit_tokens: mean(pick(|r| r.prefix_hit_tokens)),
        kv_usage_after: mean(pick(|r| r.kv_usage_after)),
        others_delta_e2e_ms: mean(pick(|r| r.others_delta_e2e_ms)),
        input_age_ms: age_ms,
    }
}

/// The valid candidate with the highest SLO probability, then the lowest mean E2E, then the
/// first in question order.
pub(super) fn recommend(predictions: &[CandidatePrediction]) -> Option<String> {
    let mut best: Option<&CandidatePrediction> = None;
    for prediction in predictions.iter().filter(|p| p.valid) {
        let better = match best {
            None => true,
            Some(current) => {
                prediction.slo_probability > current.slo_probability
                    || (prediction.slo_probability == current.slo_probability
                        && prediction.e2e_ms.mean < current.e2e_ms.mean)
            }
        };
        if better {
            best = Some(prediction);
        }
    }
    best.map(|p| p.instance_id.clone())
}
