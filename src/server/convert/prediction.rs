//! The pieces every answer shares on the wire: distributions (mean and quantiles) and one
//! candidate's prediction, encoded and decoded (PredictRouting's candidates and pairs,
//! ForecastCapacity's candidates).

use crate::server::proto;
use crate::twin::question::{CandidatePrediction, Distribution, QuantileValue};

/// Encodes a distribution (mean and quantiles).
pub(super) fn distribution_to(dist: &Distribution) -> proto::Distribution {
    proto::Distribution {
        mean: dist.mean,
        quantiles: dist
            .quantiles
            .iter()
            .map(|q| proto::QuantileValue {
                quantile: q.quantile,
                value: q.value,
            })
            .collect(),
    }
}

/// Decodes a distribution (a missing one is empty).
pub(super) fn distribution_from(dist: Option<&proto::Distribution>) -> Distribution {
    dist.map(|dist| Distribution {
        mean: dist.mean,
        quantiles: dist
            .quantiles
            .iter()
            .map(|q| QuantileValue {
                quantile: q.quantile,
                value: q.value,
            })
            .collect(),
    })
    .unwrap_or_default()
}

/// Encodes one candidate's prediction.
pub(super) fn candidate_to(c: &CandidatePrediction) -> proto::CandidatePrediction {
    proto::CandidatePrediction {
        instance_id: c.instance_id.clone(),
        valid: c.valid,
        invalid_reason: c.invalid_reason.clone(),
        ttft_ms: Some(distribution_to(&c.ttft_ms)),
        tpot_ms: Some(distribution_to(&c.tpot_ms)),
        e2e_ms: Some(distribution_to(&c.e2e_ms)),
        slo_probability: c.slo_probability,
        ttft_slo_probability: c.ttft_slo_probability,
        tpot_slo_probability: c.tpot_slo_probability,
        queue_wait_ms: c.queue_wait_ms,
        prefix_hit_tokens: c.prefix_hit_tokens,
        kv_usage_after: c.kv_usage_after,
        others_delta_e2e_ms: c.others_delta_e2e_ms,
        input_age_ms: c.input_age_ms,
    }
}

/// Decodes one candidate's prediction.
pub(super) fn candidate_from(c: &proto::CandidatePrediction) -> CandidatePrediction {
    CandidatePrediction {
        instance_id: c.instance_id.clone(),
        valid: c.valid,
        invalid_reason: c.invalid_reason.clone(),
        ttft_ms: distribution_from(c.ttft_ms.as_ref()),
        tpot_ms: distribution_from(c.tpot_ms.as_ref()),
        e2e_ms: distribution_from(c.e2e_ms.as_ref()),
        slo_probability: c.slo_probability,
        ttft_slo_probability: c.ttft_slo_probability,
        tpot_slo_probability: c.tpot_slo_probability,
        queue_wait_ms: c.queue_wait_ms,
        prefix_hit_tokens: c.prefix_hit_tokens,
        kv_usage_after: c.kv_usage_after,
        others_delta_e2e_ms: c.others_delta_e2e_ms,
        input_age_ms: c.input_age_ms,
    }
}
