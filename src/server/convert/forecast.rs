//! Capacity forecasts between the wire and `twin::question`: decoding with the per-call
//! limits (stages against the horizon, replica-count combinations, replications), resolving
//! template ids against the snapshot, and encoding the answer.

use crate::twin::TwinError;
use crate::twin::forecast::STAGE_RATE_MAX_RPS;
use crate::twin::limits::Limits;
use crate::twin::question::{
    ForecastAnswer, ForecastCandidate, ForecastQuestion, ForecastStart, VariantCandidates,
};
use crate::twin::store::StoredSnapshot;
use crate::workload::Stage;

use super::prediction::distribution_to;
use super::question::{
    DEFAULT_FORECAST_REPLICATIONS, DEFAULT_SEED, DEFAULT_TARGET_ATTAINMENT, REPLICAS_MAX,
    exhausted, quantiles_from, replications_from, resolve_now, slo_from,
};
use super::{count_in, join, length_dist_from, non_negative, positive, time_us};
use crate::server::proto;

/// A capacity question decoded from the wire, not yet checked against a snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedForecast {
    /// Snapshot generation asked for (0: latest).
    pub generation: u64,
    /// The question (`now_us` is a placeholder until [`DecodedForecast::resolve`]).
    pub question: ForecastQuestion,
    /// "Now", if the question gave it.
    pub now_us: Option<u64>,
}

fn stages_from(stages: &[proto::RateStage], limits: &Limits) -> Result<Vec<Stage>, TwinError> {
    if stages.is_empty() {
        return Err(TwinError::invalid("stages", "needs at least one stage"));
    }
    let mut total_s = 0.0;
    let mut out = Vec::with_capacity(stages.len());
    for (index, stage) in stages.iter().enumerate() {
        let path = format!("stages[{index}]");
        // Checked here, not only in the twin, so the error names the wire's field.
        let rate = positive(stage.rate_rps, &join(&path, "rate_rps"))?;
        if rate > STAGE_RATE_MAX_RPS {
            return Err(TwinError::invalid(
                join(&path, "rate_rps"),
                format!(
                    "{} must be at most {} requests per second",
                    super::num(rate),
                    super::num(STAGE_RATE_MAX_RPS)
                ),
            ));
        }
        let duration = positive(stage.duration_s, &join(&path, "duration_s"))?;
        total_s += duration;
        out.push(Stage {
            rate,
            duration_s: duration,
        });
    }
    let limit_s = limits.max_horizon_us as f64 / 1e6;
    if total_s > limit_s {
        return Err(TwinError::OverLimit(format!(
            "stages: {} s in all exceed the horizon limit of {} s",
            super::num(total_s),
            super::num(limit_s)
        )));
    }
    Ok(out)
}

fn variants_from(
    variants: &[proto::VariantCandidates],
    limits: &Limits,
) -> Result<Vec<VariantCandidates>, TwinError> {
    if variants.is_empty() {
        return Err(TwinError::invalid("variants", "needs at least one variant"));
    }
    let mut out = Vec::with_capacity(variants.len());
    let mut combinations: u64 = 1;
    for (index, variant) in variants.iter().enumerate() {
        let path = format!("variants[{index}]");
        if variant.template_instance_id.is_empty() {
            return Err(TwinError::invalid(
                join(&path, "template_instance_id"),
                "required",
            ));
        }
        super::id(
            &variant.template_instance_id,
            &join(&path, "template_instance_id"),
        )?;
        if variants[..index]
            .iter()
            .any(|other| other.template_instance_id == variant.template_instance_id)
        {
            return Err(TwinError::invalid(
                join(&path, "template_instance_id"),
                format!("duplicate variant {:?}", variant.template_instance_id),
            ));
        }
        let counts = variant
            .replica_counts
            .iter()
            .enumerate()
            .map(|(i, &count)| {
                count_in(count, REPLICAS_MAX, &format!("{path}.replica_counts[{i}]"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        combinations = combinations.saturating_mul(counts.len().max(1) as u64);
        out.push(VariantCandidates {
            template_instance_id: variant.template_instance_id.clone(),
            replica_counts: counts,
        });
    }
    if combinations > u64::from(limits.max_forecast_candidates) {
        return Err(exhausted(
            "variants (replica-count combinations)",
            combinations,
            u64::from(limits.max_forecast_candidates),
        ));
    }
    Ok(out)
}

/// Decodes a capacity question and checks it against the per-call limits.
pub fn forecast_from_proto(
    message: &proto::ForecastCapacityRequest,
    limits: &Limits,
) -> Result<DecodedForecast, TwinError> {
    let start = match proto::ForecastStart::try_from(message.start) {
        Ok(proto::ForecastStart::Snapshot) => ForecastStart::Snapshot,
        Ok(proto::ForecastStart::Empty) => ForecastStart::Empty,
        Err(_) => {
            return Err(TwinError::invalid(
                "start",
                format!("unknown start {}", message.start),
            ));
        }
    };
    let target_attainment = match message.target_attainment {
        0.0 => DEFAULT_TARGET_ATTAINMENT,
        t if t.is_finite() && (0.0..=1.0).contains(&t) => t,
        t => {
            return Err(TwinError::invalid(
                "target_attainment",
                format!("{} must be in [0, 1]", super::num(t)),
            ));
        }
    };
    let question = ForecastQuestion {
        start,
        stages: stages_from(&message.stages, limits)?,
        input_tokens: length_dist_from(message.input_tokens.as_ref(), "input_tokens")?,
        output_tokens: length_dist_from(message.output_tokens.as_ref(), "output_tokens")?,
        variants: variants_from(&message.variants, limits)?,
        max_cost_per_hour: non_negative(message.max_cost_per_hour, "max_cost_per_hour")?,
        slo: slo_from(message.slo.as_ref(), "slo")?,
        target_attainment,
        replications: replications_from(
            message.replications,
            DEFAULT_FORECAST_REPLICATIONS,
            limits.max_replications,
            "replications",
        )?,
        quantiles: quantiles_from(&message.quantiles, "quantiles")?,
        seed: message.seed.unwrap_or(DEFAULT_SEED),
        now_us: 0,
    };
    let now_us = time_us(message.now_us, "now_us")?;
    Ok(DecodedForecast {
        generation: message.snapshot_generation,
        question,
        now_us: (now_us > 0).then_some(now_us),
    })
}

impl DecodedForecast {
    /// Checks the template ids against the snapshot's config and resolves "now".
    pub fn resolve(
        self,
        stored: &StoredSnapshot,
        server_now_us: u64,
    ) -> Result<ForecastQuestion, TwinError> {
        let config = &stored.snapshot.config;
        for (index, variant) in self.question.variants.iter().enumerate() {
            if !config
                .instances
                .iter()
                .any(|i| i.id == variant.template_instance_id)
            {
                return Err(TwinError::invalid(
                    format!("variants[{index}].template_instance_id"),
                    format!("unknown instance {:?}", variant.template_instance_id),
                ));
            }
        }
        let mut question = self.question;
        question.now_us = resolve_now(self.now_us, stored, server_now_us)?;
        Ok(question)
    }
}

fn replicas_to(replicas: &[(String, u32)]) -> Vec<proto::VariantReplicas> {
    replicas
        .iter()
        .map(|(id, count)| proto::VariantReplicas {
            template_instance_id: id.clone(),
            replicas: *count,
        })
        .collect()
}

/// Encodes a forecast answer.
pub fn forecast_answer_to_proto(answer: &ForecastAnswer) -> proto::ForecastCapacityResponse {
    let candidate = |c: &ForecastCandidate| proto::ForecastCandidate {
        replicas: replicas_to(&c.replicas),
        ttft_ms: Some(distribution_to(&c.ttft_ms)),
        itl_ms: Some(distribution_to(&c.itl_ms)),
        e2e_ms: Some(distribution_to(&c.e2e_ms)),
        slo_attainment: c.slo_attainment,
        slo_attainment_ci_low: c.slo_attainment_ci.0,
        slo_attainment_ci_high: c.slo_attainment_ci.1,
        max_queue_depth: c.max_queue_depth,
        kv_usage_mean: c.kv_usage_mean,
        throughput_rps: c.throughput_rps,
        cost_per_hour: c.cost_per_hour,
    };
    proto::ForecastCapacityResponse {
        candidates: answer.candidates.iter().map(candidate).collect(),
        desired_replicas: replicas_to(&answer.desired_replicas),
        snapshot_generation: answer.generation,
        seed: answer.seed,
        state_age_ms: answer.state_age_us as f64 / 1e3,
    }
}
