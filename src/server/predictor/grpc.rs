//! `AddTrainingSamples`: the gRPC twin of `POST /add_training_data_bulk`. Samples are
//! validated with field paths (`TwinError::InvalidField`, INVALID_ARGUMENT naming the first bad field), then simulated
//! and absorbed like the HTTP entries.

use std::sync::Arc;

use tonic::Status;

use super::Predictor;
use super::handlers::train_entries;
use super::schema::{MAX_REQUESTS_PER_POD, MAX_TOKENS_PER_POD, TrainingEntry};
use crate::server::error::status_from;
use crate::server::proto;
use crate::twin::TwinError;
use crate::twin::aggregate::{PodAggregates, PodType};

fn invalid(field: String, reason: &str) -> TwinError {
    TwinError::invalid(field, reason)
}

/// The samples of `message` as training entries, or INVALID_ARGUMENT naming the field.
pub fn samples_from_proto(
    message: &proto::AddTrainingSamplesRequest,
    max_samples: usize,
) -> Result<Vec<TrainingEntry>, TwinError> {
    if message.samples.is_empty() {
        return Err(invalid("samples".to_owned(), "at least one sample"));
    }
    if message.samples.len() > max_samples {
        return Err(TwinError::OverLimit(format!(
            "samples: {} exceed the limit of {max_samples}",
            message.samples.len()
        )));
    }
    message
        .samples
        .iter()
        .enumerate()
        .map(|(index, sample)| {
            let at = |field: &str| format!("samples[{index}].{field}");
            let unit = |value: f64, field: &str| {
                if (0.0..=1.0).contains(&value) {
                    Ok(value)
                } else {
                    Err(invalid(at(field), "must be in [0, 1]"))
                }
            };
            let count = |value: u32, field: &str| {
                if u64::from(value) <= MAX_REQUESTS_PER_POD {
                    Ok(value)
                } else {
                    Err(invalid(at(field), "must be at most 4096"))
                }
            };
            let tokens = |value: u64, field: &str| {
                if value <= MAX_TOKENS_PER_POD {
                    Ok(value)
                } else {
                    Err(invalid(at(field), "must be at most 4294967295"))
                }
            };
            let pod_type = PodType::parse(&sample.pod_type).ok_or_else(|| {
                invalid(at("pod_type"), "must be \"\", \"prefill\" or \"decode\"")
            })?;
            Ok(TrainingEntry {
                aggregates: PodAggregates {
                    kv_cache_percentage: unit(sample.kv_cache_percentage, "kv_cache_percentage")?,
                    input_token_length: sample.input_token_length,
                    num_request_waiting: count(sample.num_request_waiting, "num_request_waiting")?,
                    num_request_running: count(sample.num_request_running, "num_request_running")?,
                    num_tokens_generated: sample.num_tokens_generated,
                    prefix_cache_score: unit(sample.prefix_cache_score, "prefix_cache_score")?,
                    pod_type,
                    prefill_tokens_in_flight: tokens(
                        sample.prefill_tokens_in_flight,
                        "prefill_tokens_in_flight",
                    )?,
                    decode_tokens_in_flight: tokens(
                        sample.decode_tokens_in_flight,
                        "decode_tokens_in_flight",
                    )?,
                    encoder_input_size: 0,
                    encoder_matched_size: 0,
                },
                // Measurements are the calibration's to judge: bad ones are counted.
                actual_ttft_ms: sample.actual_ttft_ms,
                actual_tpot_ms: sample.actual_tpot_ms,
            })
        })
        .collect()
}

/// Validates, simulates and absorbs `message`'s samples.
pub async fn add_training_samples(
    predictor: &Arc<Predictor>,
    message: &proto::AddTrainingSamplesRequest,
) -> Result<proto::AddTrainingSamplesResponse, Status> {
    let entries = samples_from_proto(message, predictor.options().max_bulk_entries)
        .map_err(|err| status_from(&err))?;
    let absorbed = train_entries(predictor, &entries)
        .await
        .map_err(Status::from)?;
    Ok(proto::AddTrainingSamplesResponse {
        samples_absorbed: absorbed.accepted,
        samples_rejected: absorbed.rejected,
    })
}
