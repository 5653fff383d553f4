//! The peer's service endpoints, in the shapes of llm-d's `prediction_server.py` and
//! `training_server.py`, mapped onto ditto's calibration: the JSON probes, `GET /`,
//! `/status`, `/reload`, `/data/status`, `/flush`, `/models/list`, `/model/{name}/info`,
//! `/model/download/info`, the refused downloads, and the peer's `/metrics` series.
//!
//! The mapping (docs/latency-predictor.md has the table): the peer's models are its TTFT and
//! TPOT regressors; ditto's are the two phases of its calibration (`measured = overhead +
//! scale × simulated`), listed but not downloadable. Its training data are the samples the
//! calibration absorbed; its test data the samples in the rolling error window (each scored
//! before it was absorbed); its metrics the per-phase rejected counts. There is no ensemble
//! and nothing to sync: a training sample applies at once.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use prometheus::{Gauge, GaugeVec, Opts};
use serde_json::{Map, Value, json};

use super::Predictor;
use super::calibration::{FlushRequest, Flushed};
use super::handlers::{MODEL_TYPE, detail, json_response, objective_type, ok_json, unprocessable};

/// The `model_type` of the service descriptions (`/status`, `/model/download/info`, `/`,
/// `/readyz`, the model listings, `model_type{type}`): `lightgbm`, the peer's type that its
/// client (llm-d's EPP, `latencypredictorclient`) treats as "predictions over HTTP, nothing to
/// download". Its 60 s refresh logs any type it does not know ("Unknown model type"),
/// predicts `bayesian_ridge` in process from coefficients scraped off `/metrics`, and
/// downloads `xgboost` trees (`/model/{ttft,tpot}/xgb/json`) unless
/// `LATENCY_USE_NATIVE_XGBOOST=false`. What ditto really is stays in `engine`.
pub const PEER_MODEL_TYPE: &str = "lightgbm";
use super::schema::{self, FieldError, iso8601, loc};
use crate::server::deadline::wall_now_us;
use crate::sim::latency::online::Phase;
use crate::telemetry::Metrics;

/// The peer's model names: its regressors (here the calibration's phases), then the scalers
/// and gated ensembles that ditto does not have.
const MODEL_NAMES: [&str; 6] = [
    "ttft",
    "tpot",
    "ttft_scaler",
    "tpot_scaler",
    "ttft_gated",
    "tpot_gated",
];

fn phase_of(name: &str) -> Option<Phase> {
    match name {
        "ttft" => Some(Phase::Ttft),
        "tpot" => Some(Phase::Tpot),
        _ => None,
    }
}

/// Registers the peer's model-description series (`model_type{type}`,
/// `objective_type{type}`, `model_quantile`, `ensemble_active`, `ensemble_mode`) beside
/// ditto's own; `training_samples_count{model}` is the calibration's.
pub fn register_peer_metrics(
    metrics: &Metrics,
    objective: &'static str,
    quantile: f64,
) -> Result<(), prometheus::Error> {
    let model_type = GaugeVec::new(
        Opts::new(
            "model_type",
            "llm-d latency predictor compatibility: the model answering (1 for its type).",
        ),
        &["type"],
    )?;
    model_type.with_label_values(&[PEER_MODEL_TYPE]).set(1.0);
    let objective_type = GaugeVec::new(
        Opts::new(
            "objective_type",
            "llm-d latency predictor compatibility: what answers report (1 for mean or quantile).",
        ),
        &["type"],
    )?;
    objective_type.with_label_values(&[objective]).set(1.0);
    let model_quantile = Gauge::new(
        "model_quantile",
        "llm-d latency predictor compatibility: the quantile reported (LATENCY_QUANTILE_ALPHA).",
    )?;
    model_quantile.set(quantile);
    let ensemble_active = Gauge::new(
        "ensemble_active",
        "llm-d latency predictor compatibility: 0, ditto has no gated ensemble.",
    )?;
    let ensemble_mode = Gauge::new(
        "ensemble_mode",
        "llm-d latency predictor compatibility: 0, ditto has no gated ensemble.",
    )?;
    metrics.register(Box::new(model_type))?;
    metrics.register(Box::new(objective_type))?;
    metrics.register(Box::new(model_quantile))?;
    metrics.register(Box::new(ensemble_active))?;
    metrics.register(Box::new(ensemble_mode))?;
    Ok(())
}

/// This server's own URL as the client reached it (ditto is its own training server), or
/// "" without a usable `Host` header.
fn own_url(headers: &HeaderMap) -> String {
    headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .filter(|host| {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b))
        })
        .map_or_else(String::new, |host| format!("http://{host}"))
}

/// `GET /healthz`: the process is up (the peer's `{"status": "ok"}`).
pub fn healthz() -> Response {
    ok_json(json!({ "status": "ok", "service": "ditto" }))
}

/// `GET /readyz`: a config is synced and the server is not shutting down (the peer's
/// `{"status": "ready", ...}`, else 503 with `detail`).
pub fn readyz(predictor: &Predictor) -> Response {
    if predictor.shared().is_ready() {
        ok_json(json!({
            "status": "ready",
            "model_type": PEER_MODEL_TYPE,
            "engine": MODEL_TYPE,
            "objective_type": objective_type(predictor.options().objective),
            "quantile": predictor.options().quantile,
        }))
    } else {
        detail(StatusCode::SERVICE_UNAVAILABLE, "Models are not ready")
    }
}

/// `GET /`: the service description of the peer's prediction server.
pub async fn root(State(predictor): State<Arc<Predictor>>, headers: HeaderMap) -> Response {
    let options = predictor.options();
    ok_json(json!({
        "message": "ditto is running: latency predictions by simulating the pod",
        "model_type": PEER_MODEL_TYPE,
        "engine": MODEL_TYPE,
        "objective_type": objective_type(options.objective),
        "quantile": options.quantile,
        "is_ready": predictor.shared().is_ready(),
        "sync_interval": 0,
        "training_server": own_url(&headers),
    }))
}

/// `GET /status`.
pub async fn status(State(predictor): State<Arc<Predictor>>, headers: HeaderMap) -> Response {
    let options = predictor.options();
    ok_json(json!({
        "is_ready": predictor.shared().is_ready(),
        "model_type": PEER_MODEL_TYPE,
        "engine": MODEL_TYPE,
        "objective_type": objective_type(options.objective),
        "quantile": options.quantile,
        "last_model_load": iso8601(predictor.started_at_us()),
        "training_server_url": own_url(&headers),
        "models_exist": { "ttft_model": true, "tpot_model": true },
        "ensemble_active": false,
        "replications": options.replications,
        "calibration": predictor.calibrator().summary(),
    }))
}

/// `POST /reload`: re-reads the calibration file (there is no model to sync).
pub async fn reload(State(predictor): State<Arc<Predictor>>) -> Response {
    match predictor.calibrator().reload() {
        Ok(loaded) => ok_json(json!({
            "synced": false,
            "loaded": loaded,
            "is_ready": predictor.shared().is_ready(),
            "model_type": PEER_MODEL_TYPE,
            "engine": MODEL_TYPE,
            "objective_type": objective_type(predictor.options().objective),
            "quantile": predictor.options().quantile,
            "last_load_time": iso8601(predictor.started_at_us()),
        })),
        Err(err) => detail(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Error reloading models: {err}"),
        ),
    }
}

fn counts(ttft: u64, tpot: u64) -> Value {
    json!({ "ttft_samples": ttft, "tpot_samples": tpot, "total_samples": ttft + tpot })
}

/// `GET /data/status`: the peer's training data, test data and ensemble sections, mapped
/// onto the calibration (see the module doc), and ditto's own `calibration` summary.
pub async fn data_status(State(predictor): State<Arc<Predictor>>) -> Response {
    let ((ttft, tpot), (ttft_test, tpot_test)) = predictor.calibrator().sample_counts();
    ok_json(json!({
        "training_data": counts(ttft, tpot),
        "test_data": counts(ttft_test, tpot_test),
        "ensemble": { "ensemble_mode": false, "ensemble_active": false },
        "bucket_distribution": {},
        "model_ready": predictor.shared().is_ready(),
        "last_retrain": predictor.calibrator().trained_at_us().map(iso8601),
        "model_type": PEER_MODEL_TYPE,
        "engine": MODEL_TYPE,
        "calibration": predictor.calibrator().summary(),
    }))
}

/// A pydantic (lax mode) boolean.
fn lax_bool(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Some(false),
            Some(1.0) => Some(true),
            _ => None,
        },
        Value::String(text) => match text.to_ascii_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Some(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Some(true),
            _ => None,
        },
        _ => None,
    }
}

/// The peer's `FlushRequest` (every flag defaults to true; an empty body is all defaults),
/// validated as FastAPI would.
fn flush_request(body: &[u8]) -> Result<(FlushRequest, Option<String>), Vec<FieldError>> {
    let empty = Map::new();
    let value;
    let object = if body.iter().all(u8::is_ascii_whitespace) {
        &empty
    } else {
        value = schema::parse_body(body)?;
        schema::object(&value, &[Value::from("body")])?
    };
    let base = [Value::from("body")];
    let mut errors = Vec::new();
    let mut flag = |name: &str| match object.get(name) {
        None => true,
        Some(value) => lax_bool(value).unwrap_or_else(|| {
            let (kind, msg) = if value.is_string() {
                (
                    "bool_parsing",
                    "Input should be a valid boolean, unable to interpret input",
                )
            } else {
                ("bool_type", "Input should be a valid boolean")
            };
            errors.push(FieldError::new(kind, loc(&base, name), msg, value.clone()));
            true
        }),
    };
    let request = FlushRequest {
        training: flag("flush_training_data"),
        test: flag("flush_test_data"),
        metrics: flag("flush_metrics"),
    };
    let reason = match object.get("reason") {
        None | Some(Value::Null) => None,
        Some(Value::String(reason)) => Some(reason.clone()),
        Some(other) => {
            errors.push(FieldError::new(
                "string_type",
                loc(&base, "reason"),
                "Input should be a valid string",
                other.clone(),
            ));
            None
        }
    };
    if errors.is_empty() {
        Ok((request, reason))
    } else {
        Err(errors)
    }
}

fn flush_message(request: FlushRequest, flushed: Flushed) -> String {
    let mut parts = Vec::new();
    if request.training {
        parts.push(format!(
            "{} TTFT and {} TPOT training samples (the calibration is back to the \
             uncalibrated simulation)",
            flushed.ttft_training, flushed.tpot_training
        ));
    }
    if request.test {
        parts.push(format!(
            "{} TTFT and {} TPOT test samples",
            flushed.ttft_test, flushed.tpot_test
        ));
    }
    if request.metrics {
        parts.push("the rejected-sample counts".to_owned());
    }
    if parts.is_empty() {
        "No data flushed".to_owned()
    } else {
        format!("Successfully flushed: {}", parts.join(", "))
    }
}

/// `POST /flush`: the peer's `FlushRequest` mapped onto the calibration (module doc).
pub async fn flush(State(predictor): State<Arc<Predictor>>, body: Bytes) -> Response {
    let (request, reason) = match flush_request(&body) {
        Ok(parsed) => parsed,
        Err(errors) => return unprocessable(errors),
    };
    let flushed = predictor.calibrator().flush(request);
    ok_json(json!({
        "success": true,
        "flushed_at": iso8601(wall_now_us()),
        "reason": reason,
        "ttft_training_samples_flushed": flushed.ttft_training,
        "tpot_training_samples_flushed": flushed.tpot_training,
        "ttft_test_samples_flushed": flushed.ttft_test,
        "tpot_test_samples_flushed": flushed.tpot_test,
        "metrics_cleared": request.metrics,
        "message": flush_message(request, flushed),
    }))
}

/// The calibration file (or "" without one): where the peer names its model file.
fn model_path(predictor: &Predictor) -> String {
    predictor
        .options
        .calibration_file
        .as_ref()
        .map_or_else(String::new, |path| path.display().to_string())
}

/// `GET /models/list`: the calibration's phases as the peer's models.
pub async fn models_list(State(predictor): State<Arc<Predictor>>) -> Response {
    let mut models = Map::new();
    for name in MODEL_NAMES {
        let entry = match phase_of(name) {
            Some(phase) => {
                let file = predictor.calibrator().model_file(phase);
                json!({
                    "exists": true,
                    "size_bytes": file.size_bytes,
                    "last_modified": iso8601(file.last_modified_us),
                })
            }
            None => json!({ "exists": false, "size_bytes": 0, "last_modified": null }),
        };
        models.insert(name.to_owned(), entry);
    }
    ok_json(json!({
        "models": models,
        "model_type": PEER_MODEL_TYPE,
        "engine": MODEL_TYPE,
        "quantile": predictor.options().quantile,
        "server_time": iso8601(wall_now_us()),
        "downloadable": false,
    }))
}

/// `GET /model/{name}/info`: one phase of the calibration as the peer's model file info;
/// 404 for the peer's models ditto does not have, and for unknown names.
pub async fn model_info(
    State(predictor): State<Arc<Predictor>>,
    Path(name): Path<String>,
) -> Response {
    if !MODEL_NAMES.contains(&name.as_str()) {
        return detail(StatusCode::NOT_FOUND, format!("Unknown model: {name}"));
    }
    let Some(phase) = phase_of(&name) else {
        return detail(StatusCode::NOT_FOUND, format!("Model {name} not found"));
    };
    let file = predictor.calibrator().model_file(phase);
    ok_json(json!({
        "model_name": name,
        "path": model_path(&predictor),
        "size_bytes": file.size_bytes,
        "last_modified": iso8601(file.last_modified_us),
        "exists": true,
        "model_type": PEER_MODEL_TYPE,
        "engine": MODEL_TYPE,
        "quantile": predictor.options().quantile,
        "downloadable": false,
    }))
}

/// `GET /model/download/info`, read by the EPP's refresh: `model_type` [`PEER_MODEL_TYPE`]
/// (remote predictions, no download), the objective and quantile; there is nothing to
/// download.
pub async fn download_info(State(predictor): State<Arc<Predictor>>) -> Response {
    ok_json(json!({
        "model_type": PEER_MODEL_TYPE,
        "engine": MODEL_TYPE,
        "objective_type": objective_type(predictor.options().objective),
        "quantile": predictor.options().quantile,
        "downloadable": false,
        "available_endpoints": {},
        "model_status": { "ttft_model_ready": true, "tpot_model_ready": true },
        "message": "ditto predicts by simulating the pod, not with a regressor: there is no \
                    model to download; call /predict/bulk/strict",
        "calibration": predictor.calibrator().summary(),
    }))
}

/// `GET /model/{name}/download` and `/model/{name}/xgb/json`: 404, there is nothing to
/// download.
pub async fn not_downloadable(Path(name): Path<String>) -> Response {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({
            "detail": crate::server::error::shorten(&format!(
                "no {name} model to download: ditto predicts by simulation"
            ))
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_bodies_follow_the_peer_defaults_and_types() {
        let all = FlushRequest {
            training: true,
            test: true,
            metrics: true,
        };
        assert_eq!(flush_request(b"").expect("empty"), (all, None));
        assert_eq!(flush_request(b"{}").expect("object"), (all, None));
        let (request, reason) = flush_request(
            br#"{"flush_test_data": "no", "flush_metrics": 0, "reason": "redeploy"}"#,
        )
        .expect("lax");
        assert_eq!(
            request,
            FlushRequest {
                training: true,
                test: false,
                metrics: false
            }
        );
        assert_eq!(reason.as_deref(), Some("redeploy"));
        let errors =
            flush_request(br#"{"flush_training_data": [], "reason": 3}"#).expect_err("bad types");
        let kinds: Vec<_> = errors.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["bool_type", "string_type"]);
    }

    #[test]
    fn the_own_url_comes_only_from_a_plain_host() {
        let mut headers = HeaderMap::new();
        assert_eq!(own_url(&headers), "");
        headers.insert(header::HOST, "127.0.0.1:9011".parse().expect("host"));
        assert_eq!(own_url(&headers), "http://127.0.0.1:9011");
        headers.insert(header::HOST, "evil\"<host>".parse().expect("host"));
        assert_eq!(own_url(&headers), "");
    }
}
