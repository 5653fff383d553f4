//! `AddTrainingSamples`: the gRPC twin of `POST /add_training_data_bulk`. Samples are
//! validated by the HTTP entries' one validator (`schema::aggregates`) with field paths
//! (`TwinError::InvalidField`, INVALID_ARGUMENT naming the first bad field), then simulated
//! and absorbed like the HTTP entries (`Predictor::train`).

use std::sync::Arc;

use tonic::Status;

use super::Predictor;
use serde_json::{Value, json};

use super::schema::{self, TrainingEntry};
use crate::server::error::status_from;
use crate::server::proto;
use crate::twin::TwinError;

fn invalid(field: String, reason: &str) -> TwinError {
    TwinError::invalid(field, reason)
}

/// A sample's aggregates in the HTTP entry's JSON shape, so that one validator
/// ([`schema::aggregates`]) checks both APIs' entries (the encoder sizes are HTTP-only: 0).
fn aggregates_json(sample: &proto::TrainingSample) -> Value {
    json!({
        "kv_cache_percentage": sample.kv_cache_percentage,
        "input_token_length": sample.input_token_length,
        "num_request_waiting": sample.num_request_waiting,
        "num_request_running": sample.num_request_running,
        "num_tokens_generated": sample.num_tokens_generated,
        "prefix_cache_score": sample.prefix_cache_score,
        "pod_type": sample.pod_type,
        "prefill_tokens_in_flight": sample.prefill_tokens_in_flight,
        "decode_tokens_in_flight": sample.decode_tokens_in_flight,
    })
}

/// The samples of `message` as training entries, or INVALID_ARGUMENT naming the first bad
/// field (`samples[i].<field>`, the HTTP validator's message).
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
            let aggregates =
                schema::aggregates(&aggregates_json(sample), &[]).map_err(|errors| {
                    let first = errors.into_iter().next();
                    let field = first
                        .as_ref()
                        .and_then(|e| e.loc.last())
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned();
                    let reason = first.map_or_else(String::new, |e| e.msg);
                    invalid(format!("samples[{index}].{field}"), &reason)
                })?;
            Ok(TrainingEntry {
                aggregates,
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
    let absorbed = predictor.train(&entries).await.map_err(Status::from)?;
    Ok(proto::AddTrainingSamplesResponse {
        samples_absorbed: absorbed.accepted,
        samples_rejected: absorbed.rejected,
    })
}
