//! The predictor's HTTP handlers: decode and validate (`schema`), simulate on the
//! simulation pool (`Predictor::simulate`), calibrate, encode. Every error is JSON
//! with a `detail`, as FastAPI answers: 422 for validation, 413 over the bulk entry limit,
//! 503 before a config is synced or when the pool is saturated, 504 past the deadline.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};

use super::schema::{self, FieldError, TrainingEntry, iso8601};
use super::{Predictor, Simulated, Source};
use crate::server::deadline::wall_now_us;
use crate::server::error::CallError;
use crate::twin::aggregate::{AggregatePrediction, Objective, PodAggregates};
use crate::twin::{MirrorSnapshot, TwinError};

/// `model_type` in every answer: predictions come from simulation, not a regressor.
pub const MODEL_TYPE: &str = "ditto-simulation";

#[derive(Serialize)]
struct PredictionOut {
    ttft_ms: f64,
    tpot_ms: f64,
    ttft_uncertainty: f64,
    tpot_uncertainty: f64,
    ttft_prediction_bounds: [f64; 2],
    tpot_prediction_bounds: [f64; 2],
    predicted_at: String,
    model_type: &'static str,
    objective_type: &'static str,
    quantile: f64,
    last_model_load: String,
    /// Where the state came from (`mirrored:<instance id>` or `aggregates`): ditto's own
    /// field, ignored by the peer's clients.
    source: String,
}

#[derive(Serialize)]
struct BulkError {
    index: usize,
    error: String,
    request: Value,
}

/// A JSON response (axum's `Json` needs a feature the server does not otherwise use).
pub(super) fn json_response(status: StatusCode, body: &impl Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

pub(super) fn ok_json(body: impl Serialize) -> Response {
    json_response(StatusCode::OK, &body)
}

/// A FastAPI error body, `{"detail": "..."}`, the message cut to
/// [`crate::server::error::MESSAGE_CHARS_MAX`] characters.
pub(super) fn detail(status: StatusCode, detail: impl Into<String>) -> Response {
    json_response(
        status,
        &json!({ "detail": crate::server::error::shorten(&detail.into()) }),
    )
}

pub(super) fn unprocessable(errors: Vec<FieldError>) -> Response {
    json_response(
        StatusCode::UNPROCESSABLE_ENTITY,
        &json!({ "detail": errors }),
    )
}

pub(super) fn objective_type(objective: Objective) -> &'static str {
    match objective {
        Objective::Mean => "mean",
        Objective::Quantile(_) => "quantile",
    }
}

/// The HTTP status of a failed call, by its kind (the one mapping of `CallError` to HTTP):
/// bad input 422, a missing id 404, an overloaded or not yet ready server 503, a deadline
/// 504, anything else 500.
pub(crate) fn http_status(err: &CallError) -> StatusCode {
    match err.code() {
        tonic::Code::InvalidArgument => StatusCode::UNPROCESSABLE_ENTITY,
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::ResourceExhausted
        | tonic::Code::Unavailable
        | tonic::Code::FailedPrecondition => StatusCode::SERVICE_UNAVAILABLE,
        tonic::Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A failed call as the peer's JSON error: its HTTP status and `detail`.
pub(crate) fn error_response(err: &CallError) -> Response {
    detail(http_status(err), err.to_string())
}

async fn simulate(
    predictor: &Arc<Predictor>,
    entries: Vec<PodAggregates>,
    objective: Objective,
) -> Result<(Arc<MirrorSnapshot>, Simulated), Response> {
    predictor
        .simulate(entries, objective)
        .await
        .map_err(|err| error_response(&err))
}

/// One entry's answer in the peer's shape, its latencies passed through the calibration.
fn prediction_json(
    predictor: &Predictor,
    snapshot: &MirrorSnapshot,
    aggregates: &PodAggregates,
    prediction: &AggregatePrediction,
    source: Source,
) -> PredictionOut {
    let options = predictor.options();
    let (ttft, tpot) = predictor.calibrator().calibrate_prediction(
        prediction,
        aggregates,
        options.output_tokens,
        options.objective,
    );
    PredictionOut {
        ttft_ms: ttft.value,
        tpot_ms: tpot.value,
        ttft_uncertainty: ttft.uncertainty,
        tpot_uncertainty: tpot.uncertainty,
        ttft_prediction_bounds: [ttft.bounds.0, ttft.bounds.1],
        tpot_prediction_bounds: [tpot.bounds.0, tpot.bounds.1],
        predicted_at: iso8601(wall_now_us()),
        model_type: MODEL_TYPE,
        objective_type: objective_type(options.objective),
        quantile: options.quantile,
        last_model_load: iso8601(predictor.started_at_us()),
        source: match source {
            Source::Mirrored(index) => format!(
                "mirrored:{}",
                snapshot
                    .config
                    .instances
                    .get(index)
                    .map_or("", |i| i.id.as_str())
            ),
            Source::Aggregates => "aggregates".to_owned(),
        },
    }
}

const UNSERVABLE: &str =
    "the pod cannot hold this request: prompt plus output exceeds its model length or KV cache";

/// `POST /predict`: one entry.
pub async fn predict(State(predictor): State<Arc<Predictor>>, body: Bytes) -> Response {
    predict_one(&predictor, &body).await
}

async fn predict_one(predictor: &Arc<Predictor>, body: &[u8]) -> Response {
    let value = match schema::parse_body_within(body, schema::value_budget(1)) {
        Ok(value) => value,
        Err(err) => return body_error(err),
    };
    let entry = match schema::aggregates(&value, &[Value::from("body")]) {
        Ok(entry) => entry,
        Err(errors) => return unprocessable(errors),
    };
    let (snapshot, mut results) =
        match simulate(predictor, vec![entry], predictor.options().objective).await {
            Ok(done) => done,
            Err(response) => return response,
        };
    match results.pop() {
        Some(Ok((prediction, source))) if prediction.valid => ok_json(prediction_json(
            predictor,
            &snapshot,
            &entry,
            &prediction,
            source,
        )),
        Some(Ok(_)) => unprocessable(vec![unservable(vec![
            Value::from("body"),
            Value::from("input_token_length"),
        ])]),
        Some(Err(err)) => error_response(&err.into()),
        None => detail(StatusCode::INTERNAL_SERVER_ERROR, "no prediction"),
    }
}

/// A body refused before validation: 422 for invalid JSON, 413 over its value budget.
fn body_error(err: schema::BodyError) -> Response {
    match err {
        schema::BodyError::Invalid(errors) => unprocessable(errors),
        schema::BodyError::TooLarge(reason) => detail(StatusCode::PAYLOAD_TOO_LARGE, reason),
    }
}

fn unservable(loc: Vec<Value>) -> FieldError {
    FieldError {
        kind: "value_error",
        loc,
        msg: UNSERVABLE.to_owned(),
        input: Value::Null,
        ctx: None,
    }
}

/// `POST /predict/bulk`: errors met while predicting are reported per entry beside the
/// predictions; invalid entries fail the call (422).
pub async fn predict_bulk(State(predictor): State<Arc<Predictor>>, body: Bytes) -> Response {
    bulk_lenient(&predictor, &body).await
}

/// `POST /predict/bulk/strict`: one invalid entry fails the whole batch (the EPP's call).
pub async fn predict_bulk_strict(State(predictor): State<Arc<Predictor>>, body: Bytes) -> Response {
    bulk_strict(&predictor, &body).await
}

/// The entries of a bulk body under `field`, validated; 413 over the limit.
// The error is the finished response, built once per failed call: its size is no cost.
#[allow(clippy::result_large_err)]
fn bulk_entries<T>(
    predictor: &Predictor,
    body: &[u8],
    field: &str,
    parse: fn(&Value, &[Value]) -> Result<T, Vec<FieldError>>,
) -> Result<Vec<Result<T, Vec<FieldError>>>, Response> {
    let limit = predictor.options().max_bulk_entries;
    let value = schema::parse_body_within(body, schema::value_budget(limit)).map_err(body_error)?;
    let object = schema::object(&value, &[Value::from("body")]).map_err(unprocessable)?;
    let items = schema::list(object, field).map_err(unprocessable)?;
    if items.len() > limit {
        return Err(detail(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{field}: {} entries exceed the limit of {limit}",
                items.len()
            ),
        ));
    }
    let parsed = items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            parse(
                item,
                &[Value::from("body"), Value::from(field), Value::from(index)],
            )
        })
        .collect();
    Ok(parsed)
}

/// The entries of a bulk prediction body, every one validated: any invalid entry fails
/// the whole call with 422 naming each bad field (FastAPI validates the body before the
/// handler runs, on both bulk endpoints).
#[allow(clippy::result_large_err)]
fn valid_bulk_entries(predictor: &Predictor, body: &[u8]) -> Result<Vec<PodAggregates>, Response> {
    let parsed = bulk_entries(predictor, body, "requests", schema::aggregates)?;
    if parsed.iter().any(Result::is_err) {
        return Err(unprocessable(
            parsed
                .into_iter()
                .filter_map(Result::err)
                .flatten()
                .collect(),
        ));
    }
    Ok(parsed.into_iter().filter_map(Result::ok).collect())
}

/// What predicting one valid entry gave.
enum Outcome {
    /// A prediction.
    Predicted(Box<PredictionOut>),
    /// The pod cannot hold the request (a 422 in the strict call).
    Unservable(FieldError),
    /// The simulation failed.
    Failed(TwinError),
}

/// Simulates valid bulk entries and maps each result; a failure of the whole call (no
/// config yet, the pool saturated, the deadline) is the response.
#[allow(clippy::result_large_err)]
async fn predict_entries(
    predictor: &Arc<Predictor>,
    entries: Vec<PodAggregates>,
) -> Result<Vec<Outcome>, Response> {
    let (snapshot, results) =
        simulate(predictor, entries.clone(), predictor.options().objective).await?;
    Ok(results
        .into_iter()
        .zip(&entries)
        .enumerate()
        .map(|(index, (result, entry))| match result {
            Ok((prediction, source)) if prediction.valid => Outcome::Predicted(Box::new(
                prediction_json(predictor, &snapshot, entry, &prediction, source),
            )),
            Ok(_) => Outcome::Unservable(unservable(vec![
                Value::from("body"),
                Value::from("requests"),
                Value::from(index),
                Value::from("input_token_length"),
            ])),
            Err(err) => Outcome::Failed(err),
        })
        .collect())
}

/// The strict bulk call: every entry predicted, or the call fails (422 for invalid or
/// unservable entries, the simulation's status otherwise).
async fn bulk_strict(predictor: &Arc<Predictor>, body: &[u8]) -> Response {
    let started = Instant::now();
    let outcomes = match valid_bulk_entries(predictor, body) {
        Ok(entries) => match predict_entries(predictor, entries).await {
            Ok(outcomes) => outcomes,
            Err(response) => return response,
        },
        Err(response) => return response,
    };
    let total = outcomes.len();
    let mut predictions = Vec::with_capacity(total);
    let mut unservable = Vec::new();
    for outcome in outcomes {
        match outcome {
            Outcome::Predicted(prediction) => predictions.push(prediction),
            Outcome::Unservable(error) => unservable.push(error),
            Outcome::Failed(err) => return error_response(&err.into()),
        }
    }
    if !unservable.is_empty() {
        return unprocessable(unservable);
    }
    ok_json(json!({
        "predictions": predictions,
        "total_requests": total,
        "successful_predictions": total,
        "failed_predictions": 0,
        "processing_time_ms": started.elapsed().as_secs_f64() * 1000.0,
    }))
}

/// The lenient bulk call: an entry that cannot be predicted (unservable, or its simulation
/// failed) is reported in `errors` beside the others' predictions, with the request as the
/// peer echoes it (its known fields only).
async fn bulk_lenient(predictor: &Arc<Predictor>, body: &[u8]) -> Response {
    let started = Instant::now();
    let entries = match valid_bulk_entries(predictor, body) {
        Ok(entries) => entries,
        Err(response) => return response,
    };
    let echoes: Vec<Value> = entries.iter().map(schema::echo).collect();
    let outcomes = match predict_entries(predictor, entries).await {
        Ok(outcomes) => outcomes,
        Err(response) => return response,
    };
    let total = outcomes.len();
    let mut predictions = Vec::with_capacity(total);
    let mut errors = Vec::new();
    for ((index, outcome), request) in outcomes.into_iter().enumerate().zip(echoes) {
        let error = match outcome {
            Outcome::Predicted(prediction) => {
                predictions.push(Some(prediction));
                continue;
            }
            Outcome::Unservable(error) => error.line(),
            Outcome::Failed(err) => crate::server::error::shorten(&err.to_string()),
        };
        predictions.push(None);
        errors.push(BulkError {
            index,
            error,
            request,
        });
    }
    let failed = errors.len();
    ok_json(json!({
        "predictions": predictions,
        "errors": errors,
        "total_requests": total,
        "successful_predictions": total - failed,
        "failed_predictions": failed,
        "processing_time_ms": started.elapsed().as_secs_f64() * 1000.0,
    }))
}

/// `POST /add_training_data_bulk`: measured latencies calibrate the simulation. Malformed
/// entries fail the call (422, as the peer); bad measurements are rejected and counted.
pub async fn add_training_data_bulk(
    State(predictor): State<Arc<Predictor>>,
    body: Bytes,
) -> Response {
    train(&predictor, &body).await
}

async fn train(predictor: &Arc<Predictor>, body: &[u8]) -> Response {
    let parsed = match bulk_entries(predictor, body, "entries", schema::training_entry) {
        Ok(done) => done,
        Err(response) => {
            if response.status() == StatusCode::UNPROCESSABLE_ENTITY {
                predictor.calibrator().count_malformed(1);
            }
            return response;
        }
    };
    if parsed.iter().any(Result::is_err) {
        let bad = parsed.iter().filter(|r| r.is_err()).count() as u64;
        predictor.calibrator().count_malformed(bad);
        return unprocessable(
            parsed
                .into_iter()
                .filter_map(Result::err)
                .flatten()
                .collect(),
        );
    }
    let entries: Vec<TrainingEntry> = parsed.into_iter().filter_map(Result::ok).collect();
    let absorbed = match predictor.train(&entries).await {
        Ok(absorbed) => absorbed,
        Err(err) => return error_response(&err),
    };
    json_response(
        StatusCode::ACCEPTED,
        &json!({
            "message": format!("Accepted {} training samples.", entries.len()),
            "entries": entries.len(),
            "samples_absorbed": absorbed.accepted,
            "samples_rejected": absorbed.rejected,
        }),
    )
}
