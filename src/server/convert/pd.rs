//! Prefill/decode disaggregation on the wire: the config's `disaggregation` section to and
//! from the twin's [`PdSettings`], and the pair answers of PredictRouting.

use crate::cluster::spec::{DeciderSpec, DisaggSpec};
use crate::twin::TwinError;
use crate::twin::question::{DeciderChoice, PairPrediction};
use crate::twin::snapshot::PdSettings;

use super::prediction::{candidate_from, candidate_to};
use super::tokens;
use crate::server::proto;

/// Decodes the `disaggregation` section by the same resolver as the cluster YAML (empty
/// strings and unset numbers take its defaults); errors name `disaggregation.*` fields.
pub fn disaggregation_from_proto(
    message: Option<&proto::Disaggregation>,
) -> Result<Option<PdSettings>, TwinError> {
    let Some(message) = message else {
        return Ok(None);
    };
    let text = |value: &str| Some(value.trim().to_owned()).filter(|v| !v.is_empty());
    let count = |value: Option<i64>, field: &str| {
        value
            .map(|v| tokens(v, &format!("disaggregation.{field}")))
            .transpose()
    };
    let setup_us = match message.setup_us {
        None => None,
        Some(us) if us.is_finite() && (0.0..=1e9).contains(&us) => Some(us.round() as u64),
        Some(_) => {
            return Err(TwinError::invalid(
                "disaggregation.setup_us",
                "must be a number of µs in [0, 1e9]",
            ));
        }
    };
    let spec = DisaggSpec {
        handler: text(&message.handler),
        stage_order: text(&message.stage_order),
        decider: Some(DeciderSpec {
            non_cached_tokens: count(message.non_cached_tokens, "non_cached_tokens")?,
            prompt_tokens: count(message.prompt_tokens, "prompt_tokens")?,
        }),
        prefill_routing: None,
        connector: text(&message.connector),
        link: text(&message.link),
        bandwidth_gb_s: message.bandwidth_gb_s,
        descriptor_us: message.descriptor_us,
        setup_us,
        abort_request_timeout_s: message.abort_request_timeout_s,
        // Failure rates and retries have no proto field: none (a twin's pair answers assume
        // no failures).
        ..DisaggSpec::default()
    };
    PdSettings::resolve(&spec)
        .map(Some)
        .map_err(|err| match err {
            crate::cluster::spec::ClusterSpecError::Invalid { field, reason } => {
                TwinError::invalid(field, reason)
            }
            other => TwinError::invalid("disaggregation", other.to_string()),
        })
}

/// Encodes the settings in force with every value resolved.
pub fn disaggregation_to_proto(settings: &PdSettings) -> proto::Disaggregation {
    let config = &settings.config;
    // Prefill-first has no decider (a value set is refused): none echoed.
    let decider = (config.stage_order == crate::cluster::disagg::StageOrder::DecodeFirst)
        .then_some(config.decider);
    proto::Disaggregation {
        handler: "disagg-profile-handler".to_owned(),
        stage_order: config.stage_order.as_str().to_owned(),
        non_cached_tokens: decider.map(|d| i64::from(d.non_cached_tokens)),
        prompt_tokens: decider.map(|d| i64::from(d.prompt_tokens)),
        connector: settings.connector.clone(),
        link: settings.link.clone(),
        bandwidth_gb_s: Some(config.transfer.bandwidth_gb_s),
        descriptor_us: Some(config.transfer.descriptor_us),
        setup_us: Some(config.transfer.setup_us as f64),
        abort_request_timeout_s: Some(config.hold_timeout_us as f64 / 1e6),
    }
}

/// Encodes one pair's answer.
pub fn pair_to(pair: &PairPrediction) -> proto::PairPrediction {
    proto::PairPrediction {
        prefill_instance_id: pair.prefill_instance_id.clone(),
        decode_instance_id: pair.decode_instance_id.clone(),
        prediction: Some(candidate_to(&pair.prediction)),
        prefill_ttft_ms: pair.prefill_ttft_ms,
        transfer_ms: pair.transfer_ms,
        handover_ms: pair.handover_ms,
        prefill_others_delta_e2e_ms: pair.prefill_others_delta_e2e_ms,
        decode_others_delta_e2e_ms: pair.decode_others_delta_e2e_ms,
    }
}

/// Decodes one pair's answer (for clients).
pub fn pair_from(pair: &proto::PairPrediction) -> PairPrediction {
    PairPrediction {
        prefill_instance_id: pair.prefill_instance_id.clone(),
        decode_instance_id: pair.decode_instance_id.clone(),
        prediction: candidate_from(&pair.prediction.clone().unwrap_or_default()),
        prefill_ttft_ms: pair.prefill_ttft_ms,
        transfer_ms: pair.transfer_ms,
        handover_ms: pair.handover_ms,
        prefill_others_delta_e2e_ms: pair.prefill_others_delta_e2e_ms,
        decode_others_delta_e2e_ms: pair.decode_others_delta_e2e_ms,
    }
}

/// Encodes the decider's choice on one decode pod.
pub fn decider_to(choice: &DeciderChoice) -> proto::DeciderChoice {
    proto::DeciderChoice {
        decode_instance_id: choice.decode_instance_id.clone(),
        uncached_tokens: i64::from(choice.uncached_tokens),
        remote_prefill: choice.remote_prefill,
    }
}

/// Decodes the decider's choice on one decode pod (for clients).
pub fn decider_from(choice: &proto::DeciderChoice) -> DeciderChoice {
    DeciderChoice {
        decode_instance_id: choice.decode_instance_id.clone(),
        uncached_tokens: u32::try_from(choice.uncached_tokens.max(0)).unwrap_or(u32::MAX),
        remote_prefill: choice.remote_prefill,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_resolves_like_the_yaml_and_echoes() {
        let message = proto::Disaggregation {
            non_cached_tokens: Some(32),
            link: "tcp-25g".to_owned(),
            ..proto::Disaggregation::default()
        };
        let settings = disaggregation_from_proto(Some(&message)).unwrap().unwrap();
        assert_eq!(settings.connector, "nixl");
        assert_eq!(settings.link, "tcp-25g");
        assert_eq!(settings.config.decider.non_cached_tokens, 32);
        let echoed = disaggregation_to_proto(&settings);
        let again = disaggregation_from_proto(Some(&echoed)).unwrap().unwrap();
        assert_eq!(again, settings);
        assert_eq!(disaggregation_from_proto(None).unwrap(), None);
    }

    #[test]
    fn errors_name_the_field() {
        for (message, field) in [
            (
                proto::Disaggregation {
                    link: "carrier-pigeon".to_owned(),
                    ..proto::Disaggregation::default()
                },
                "disaggregation.link",
            ),
            (
                proto::Disaggregation {
                    non_cached_tokens: Some(-1),
                    ..proto::Disaggregation::default()
                },
                "disaggregation.non_cached_tokens",
            ),
            (
                proto::Disaggregation {
                    setup_us: Some(f64::NAN),
                    ..proto::Disaggregation::default()
                },
                "disaggregation.setup_us",
            ),
        ] {
            let err = disaggregation_from_proto(Some(&message)).unwrap_err();
            assert!(err.to_string().contains(field), "{err} names {field}");
        }
    }
}
