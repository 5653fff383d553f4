//! Routing questions between the wire and `twin::question`, and the decoding helpers the
//! capacity forecasts share.
//!
//! A routing question is decoded in two steps. [`routing_from_proto`] turns the wire into
//! domain values: integer ranges, enums, defaults, and caps on the sizes of repeated fields.
//! [`DecodedRouting::resolve`] then decides "now" from the snapshot it will run on and hands
//! the question to `twin::valid::ValidRouting::new`, the one place its meaning is checked
//! (lengths, limits, candidates, decision time). Capacity forecasts
//! (`forecast::forecast_from_proto`) check what the message alone decides here and the template
//! ids in `resolve`. Over-limit requests are RESOURCE_EXHAUSTED; everything else is
//! INVALID_ARGUMENT with the field path.

use std::sync::Arc;

use crate::twin::TwinError;
use crate::twin::limits::Limits;
use crate::twin::question::{
    Background, CandidateRequest, OutputLength, PredictOptions, RoutingAnswer, RoutingQuestion,
    SloTargets,
};
use crate::twin::store::StoredSnapshot;
use crate::twin::valid::ValidRouting;

use super::prediction::{candidate_from, candidate_to};
use super::state::{latest_observation_us, slo_class_from};
use super::{
    join, ms_to_us, positive, stale_policy_from, stale_policy_to, time_us, tokens, us_to_ms,
};
use crate::server::proto;

/// Replications per candidate when the question names none.
pub const DEFAULT_REPLICATIONS: u32 = 8;
/// Replications per forecast candidate when the question names none.
pub const DEFAULT_FORECAST_REPLICATIONS: u32 = 4;
/// Quantiles reported when the question names none.
pub const DEFAULT_QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];
/// Most quantiles per question.
pub const QUANTILES_MAX: usize = 32;
/// Simulated horizon when the question names none (µs), capped by the limit.
pub const DEFAULT_HORIZON_US: u64 = 60_000_000;
/// Seed when the question names none.
pub const DEFAULT_SEED: u64 = 42;
/// Target attainment of a forecast when the question names none.
pub const DEFAULT_TARGET_ATTAINMENT: f64 = 0.95;
/// Most bins of an output-length histogram.
pub const HISTOGRAM_BINS_MAX: usize = 4096;
/// Most replicas of one variant in a forecast candidate.
pub const REPLICAS_MAX: u32 = crate::twin::forecast::REPLICAS_MAX;

/// A routing question decoded from the wire, not yet checked against a snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedRouting {
    /// Snapshot generation asked for (0: latest).
    pub generation: u64,
    /// The request.
    pub request: CandidateRequest,
    /// Candidate instance ids; empty means every instance.
    pub candidates: Vec<String>,
    /// Options (the age limit `None` when the question gave none: the snapshot's setting).
    pub options: PredictOptions,
    /// "Now", if the question gave it (0 on the wire: the server's clock).
    pub now_us: Option<u64>,
    /// The caller's correlation id.
    pub request_id: String,
}

pub(super) fn exhausted(field: &str, value: u64, limit: u64) -> TwinError {
    TwinError::OverLimit(format!("{field}: {value} exceeds the limit of {limit}"))
}

pub(super) fn quantiles_from(values: &[f64], path: &str) -> Result<Vec<f64>, TwinError> {
    if values.is_empty() {
        return Ok(DEFAULT_QUANTILES.to_vec());
    }
    if values.len() > QUANTILES_MAX {
        return Err(TwinError::invalid(
            path,
            format!("{} quantiles; at most {QUANTILES_MAX}", values.len()),
        ));
    }
    for (index, &q) in values.iter().enumerate() {
        if !(q.is_finite() && q > 0.0 && q < 1.0) {
            return Err(TwinError::invalid(
                format!("{path}[{index}]"),
                format!("{} must be in (0, 1)", super::num(q)),
            ));
        }
    }
    Ok(values.to_vec())
}

pub(super) fn replications_from(
    value: i64,
    default: u32,
    limit: u32,
    path: &str,
) -> Result<u32, TwinError> {
    match value {
        0 => Ok(default.min(limit.max(1))),
        v if v < 0 => Err(TwinError::invalid(
            path,
            format!("{v} must not be negative"),
        )),
        v if v > i64::from(limit) => Err(exhausted(path, v as u64, u64::from(limit))),
        v => Ok(v as u32),
    }
}

pub(super) fn slo_from(
    message: Option<&proto::SloTargets>,
    path: &str,
) -> Result<SloTargets, TwinError> {
    let Some(message) = message else {
        return Ok(SloTargets::default());
    };
    let target = |value: Option<f64>, field: &str| {
        value.map(|v| positive(v, &join(path, field))).transpose()
    };
    Ok(SloTargets {
        ttft_ms: target(message.ttft_ms, "ttft_ms")?,
        tpot_ms: target(message.tpot_ms, "tpot_ms")?,
        e2e_ms: target(message.e2e_ms, "e2e_ms")?,
    })
}

fn output_from(message: &proto::CandidateRequest) -> Result<OutputLength, TwinError> {
    use proto::candidate_request::ExpectedOutput;
    match &message.expected_output {
        Some(ExpectedOutput::OutputTokens(value)) => Ok(OutputLength::Point(tokens(
            *value,
            "request.output_tokens",
        )?)),
        Some(ExpectedOutput::OutputHistogram(histogram)) => {
            let path = "request.output_histogram.bins";
            if histogram.bins.len() > HISTOGRAM_BINS_MAX {
                return Err(TwinError::invalid(
                    path,
                    format!(
                        "{} bins; at most {HISTOGRAM_BINS_MAX}",
                        histogram.bins.len()
                    ),
                ));
            }
            let bins = histogram
                .bins
                .iter()
                .enumerate()
                .map(|(index, bin)| {
                    let path = format!("{path}[{index}].tokens");
                    Ok((tokens(bin.tokens, &path)?, bin.weight))
                })
                .collect::<Result<_, TwinError>>()?;
            Ok(OutputLength::Histogram(bins))
        }
        None => Err(TwinError::invalid(
            "request.expected_output",
            "required: output_tokens or output_histogram",
        )),
    }
}

fn candidate_request_from(
    message: Option<&proto::CandidateRequest>,
) -> Result<CandidateRequest, TwinError> {
    let message = message.ok_or_else(|| TwinError::invalid("request", "required"))?;
    let prompt_tokens = tokens(message.prompt_tokens, "request.prompt_tokens")?;
    let output = output_from(message)?;
    let largest = match &output {
        OutputLength::Point(tokens) => *tokens,
        OutputLength::Histogram(bins) => bins.iter().map(|(tokens, _)| *tokens).max().unwrap_or(1),
    };
    let max_tokens = match tokens(message.max_tokens, "request.max_tokens")? {
        0 => largest,
        given => given,
    };
    let slo_class = slo_class_from(&message.slo_class, "request.slo_class")?;
    Ok(CandidateRequest {
        prompt_tokens,
        token_ids: (!message.token_ids.is_empty())
            .then(|| Arc::<[u32]>::from(message.token_ids.as_slice())),
        block_hashes: message.block_hashes.clone(),
        output,
        max_tokens,
        priority: message.priority.unwrap_or_else(|| slo_class.priority()),
        slo_class,
        slo: slo_from(message.slo.as_ref(), "request.slo")?,
    })
}

/// Decodes a routing question: wire ranges, defaults and size caps; its meaning is checked by
/// [`DecodedRouting::resolve`].
pub fn routing_from_proto(
    message: &proto::PredictRoutingRequest,
    limits: &Limits,
) -> Result<DecodedRouting, TwinError> {
    let request = candidate_request_from(message.request.as_ref())?;
    super::id(&message.request_id, "request_id")?;
    for (index, id) in message.candidate_instance_ids.iter().enumerate() {
        super::id(id, &format!("candidate_instance_ids[{index}]"))?;
    }
    // A size cap before anything is copied; `ValidRouting` checks the count again once an
    // empty list has become every instance.
    let candidates = message.candidate_instance_ids.len() as u64;
    if candidates > u64::from(limits.max_candidates) {
        return Err(exhausted(
            "candidate_instance_ids",
            candidates,
            u64::from(limits.max_candidates),
        ));
    }
    let default_options = proto::PredictOptions::default();
    let options = message.options.as_ref().unwrap_or(&default_options);
    let horizon_us = match ms_to_us(options.horizon_ms, "options.horizon_ms")? {
        0 => DEFAULT_HORIZON_US.min(limits.max_horizon_us),
        us => us,
    };
    let background = match proto::BackgroundArrivals::try_from(options.background) {
        Ok(proto::BackgroundArrivals::None) => Background::None,
        Ok(proto::BackgroundArrivals::ObservedPoisson) => Background::ObservedPoisson,
        Err(_) => {
            return Err(TwinError::invalid(
                "options.background",
                format!("unknown background {}", options.background),
            ));
        }
    };
    let max_signal_age_us = options
        .max_signal_age_ms
        .map(|ms| {
            let path = "options.max_signal_age_ms";
            positive(ms, path).and_then(|ms| ms_to_us(ms, path))
        })
        .transpose()?;
    let replications = match options.replications {
        0 => DEFAULT_REPLICATIONS.min(limits.max_replications.max(1)),
        given => u32::try_from(given).map_err(|_| {
            if given < 0 {
                TwinError::invalid(
                    "options.replications",
                    format!("{given} must not be negative"),
                )
            } else {
                exhausted(
                    "options.replications",
                    given as u64,
                    u64::from(limits.max_replications),
                )
            }
        })?,
    };
    let quantiles = if options.quantiles.is_empty() {
        DEFAULT_QUANTILES.to_vec()
    } else if options.quantiles.len() > QUANTILES_MAX {
        return Err(TwinError::invalid(
            "options.quantiles",
            format!(
                "{} quantiles; at most {QUANTILES_MAX}",
                options.quantiles.len()
            ),
        ));
    } else {
        options.quantiles.clone()
    };
    let now_us = time_us(message.now_us, "now_us")?;
    Ok(DecodedRouting {
        generation: message.snapshot_generation,
        request,
        candidates: message.candidate_instance_ids.clone(),
        options: PredictOptions {
            replications,
            quantiles,
            horizon_us,
            background,
            stale_policy: stale_policy_from(options.stale_policy, "options.stale_policy")?,
            max_signal_age_us,
            seed: options.seed.unwrap_or(DEFAULT_SEED),
        },
        now_us: (now_us > 0).then_some(now_us),
        request_id: message.request_id.clone(),
    })
}

/// "Now" for a question: the given time (not before the snapshot's observations), or the
/// server's clock raised to the latest observation.
pub(super) fn resolve_now(
    given: Option<u64>,
    stored: &StoredSnapshot,
    server_now_us: u64,
) -> Result<u64, TwinError> {
    let latest = latest_observation_us(stored);
    match given {
        Some(now) if now < latest => Err(TwinError::invalid(
            "now_us",
            format!("{now} precedes the snapshot's latest observation {latest}"),
        )),
        Some(now) => Ok(now),
        None => Ok(server_now_us.max(latest)),
    }
}

impl DecodedRouting {
    /// Decides "now" on the snapshot the question will run on and checks the question
    /// against it (`ValidRouting::new`).
    pub fn resolve(
        self,
        stored: &StoredSnapshot,
        limits: &Limits,
        server_now_us: u64,
    ) -> Result<ValidRouting, TwinError> {
        let question = RoutingQuestion {
            request: self.request,
            candidates: self.candidates,
            options: self.options,
            now_us: resolve_now(self.now_us, stored, server_now_us)?,
        };
        ValidRouting::new(question, &stored.snapshot, limits)
    }
}

/// Encodes a routing question (for clients).
pub fn routing_to_proto(
    question: &RoutingQuestion,
    generation: u64,
    request_id: &str,
) -> proto::PredictRoutingRequest {
    use proto::candidate_request::ExpectedOutput;
    let request = &question.request;
    let output = match &request.output {
        OutputLength::Point(tokens) => ExpectedOutput::OutputTokens(i64::from(*tokens)),
        OutputLength::Histogram(bins) => ExpectedOutput::OutputHistogram(proto::LengthHistogram {
            bins: bins
                .iter()
                .map(|&(tokens, weight)| proto::HistogramBin {
                    tokens: i64::from(tokens),
                    weight,
                })
                .collect(),
        }),
    };
    let options = &question.options;
    proto::PredictRoutingRequest {
        snapshot_generation: generation,
        request: Some(proto::CandidateRequest {
            prompt_tokens: i64::from(request.prompt_tokens),
            token_ids: request
                .token_ids
                .as_deref()
                .map(<[u32]>::to_vec)
                .unwrap_or_default(),
            block_hashes: request.block_hashes.clone(),
            expected_output: Some(output),
            max_tokens: i64::from(request.max_tokens),
            priority: Some(request.priority),
            slo_class: request.slo_class.as_str().to_owned(),
            slo: Some(proto::SloTargets {
                ttft_ms: request.slo.ttft_ms,
                tpot_ms: request.slo.tpot_ms,
                e2e_ms: request.slo.e2e_ms,
            }),
        }),
        candidate_instance_ids: question.candidates.clone(),
        options: Some(proto::PredictOptions {
            replications: i64::from(options.replications),
            quantiles: options.quantiles.clone(),
            horizon_ms: us_to_ms(options.horizon_us),
            background: match options.background {
                Background::None => proto::BackgroundArrivals::None,
                Background::ObservedPoisson => proto::BackgroundArrivals::ObservedPoisson,
            } as i32,
            stale_policy: stale_policy_to(options.stale_policy),
            max_signal_age_ms: options.max_signal_age_us.map(us_to_ms),
            seed: Some(options.seed),
        }),
        // 0 on the wire: the server's clock.
        now_us: question.now_us as i64,
        request_id: request_id.to_owned(),
    }
}

/// Encodes a routing answer.
pub fn routing_answer_to_proto(
    answer: &RoutingAnswer,
    request_id: &str,
) -> proto::PredictRoutingResponse {
    let candidates = answer.candidates.iter().map(candidate_to).collect();
    proto::PredictRoutingResponse {
        candidates,
        recommended_instance_id: answer.recommended_instance_id.clone().unwrap_or_default(),
        snapshot_generation: answer.generation,
        seed: answer.seed,
        simulation_events: answer.events,
        request_id: request_id.to_owned(),
        state_age_ms: answer
            .candidates
            .iter()
            .map(|c| c.input_age_ms)
            .fold(0.0, f64::max),
        pairs: answer.pairs.iter().map(super::pd::pair_to).collect(),
        recommended_prefill_instance_id: answer
            .recommended_prefill_instance_id
            .clone()
            .unwrap_or_default(),
        decider: answer.decider.iter().map(super::pd::decider_to).collect(),
    }
}

/// Decodes a routing answer (for clients).
pub fn routing_answer_from_proto(message: &proto::PredictRoutingResponse) -> RoutingAnswer {
    let candidates = message.candidates.iter().map(candidate_from).collect();
    RoutingAnswer {
        candidates,
        recommended_instance_id: (!message.recommended_instance_id.is_empty())
            .then(|| message.recommended_instance_id.clone()),
        generation: message.snapshot_generation,
        seed: message.seed,
        events: message.simulation_events,
        pairs: message.pairs.iter().map(super::pd::pair_from).collect(),
        recommended_prefill_instance_id: (!message.recommended_prefill_instance_id.is_empty())
            .then(|| message.recommended_prefill_instance_id.clone()),
        decider: message
            .decider
            .iter()
            .map(super::pd::decider_from)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question() -> proto::PredictRoutingRequest {
        proto::PredictRoutingRequest {
            request: Some(proto::CandidateRequest {
                prompt_tokens: 2000,
                expected_output: Some(proto::candidate_request::ExpectedOutput::OutputTokens(256)),
                ..proto::CandidateRequest::default()
            }),
            ..proto::PredictRoutingRequest::default()
        }
    }

    #[test]
    fn defaults_fill_in() {
        let decoded = routing_from_proto(&question(), &Limits::DEFAULT).unwrap();
        let options = &decoded.options;
        assert_eq!(options.replications, DEFAULT_REPLICATIONS);
        assert_eq!(options.quantiles, DEFAULT_QUANTILES.to_vec());
        assert_eq!(options.horizon_us, DEFAULT_HORIZON_US);
        assert_eq!(options.seed, DEFAULT_SEED);
        assert_eq!(options.max_signal_age_us, None);
        assert_eq!(decoded.now_us, None);
        assert_eq!(decoded.request.max_tokens, 256);
    }

    #[test]
    fn the_client_encoding_decodes_to_the_same_question() {
        let decoded = routing_from_proto(&question(), &Limits::DEFAULT).unwrap();
        let mut question = RoutingQuestion {
            request: decoded.request,
            candidates: vec!["a".into(), "b".into()],
            options: decoded.options,
            now_us: 77,
        };
        question.options.max_signal_age_us = Some(200_000);
        let again =
            routing_from_proto(&routing_to_proto(&question, 3, "id"), &Limits::DEFAULT).unwrap();
        assert_eq!(again.generation, 3);
        assert_eq!(again.now_us, Some(77));
        assert_eq!(again.request, question.request);
        assert_eq!(again.candidates, question.candidates);
        assert_eq!(again.options, question.options);
    }

    #[test]
    fn oversized_messages_give_resource_exhausted_at_decoding() {
        let mut message = question();
        message.candidate_instance_ids = (0..=Limits::DEFAULT.max_candidates)
            .map(|i| format!("i{i}"))
            .collect();
        let err = routing_from_proto(&message, &Limits::DEFAULT).unwrap_err();
        assert!(matches!(err, TwinError::OverLimit(_)), "{err}");
        let mut message = question();
        message.options = Some(proto::PredictOptions {
            replications: i64::from(u32::MAX) + 1,
            ..proto::PredictOptions::default()
        });
        let err = routing_from_proto(&message, &Limits::DEFAULT).unwrap_err();
        assert!(matches!(err, TwinError::OverLimit(_)), "{err}");
    }

    #[test]
    fn undecodable_fields_are_named() {
        let mut message = question();
        if let Some(request) = message.request.as_mut() {
            request.prompt_tokens = -1;
        }
        let err = routing_from_proto(&message, &Limits::DEFAULT).unwrap_err();
        assert!(
            err.to_string().starts_with("request.prompt_tokens: "),
            "{err}"
        );
        let mut message = question();
        message.options = Some(proto::PredictOptions {
            replications: -3,
            ..proto::PredictOptions::default()
        });
        let err = routing_from_proto(&message, &Limits::DEFAULT).unwrap_err();
        assert!(
            err.to_string().starts_with("options.replications: "),
            "{err}"
        );
        // Repeated fields are capped before they are copied.
        let mut message = question();
        message.options = Some(proto::PredictOptions {
            quantiles: vec![0.5; QUANTILES_MAX + 1],
            ..proto::PredictOptions::default()
        });
        let err = routing_from_proto(&message, &Limits::DEFAULT).unwrap_err();
        assert!(err.to_string().starts_with("options.quantiles: "), "{err}");
    }
}
