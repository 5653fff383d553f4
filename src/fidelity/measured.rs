//! A measured run's files → [`MeasuredRun`]: what the server was, what was sent, what was
//! measured.
//!
//! Which file says what (each optional unless stated):
//! - `model_config.json` (required): the model's HF config;
//! - `exp-config.yaml`: TP, `max_model_len`, `max_num_batched_tokens`, `max_num_seqs`;
//! - `replay_requests.json`: the measured arrivals and token counts, and `config` (TP, limits,
//!   `kv_blocks_total_gpu`, block size);
//! - `replay_ground_truth.json`: per request `ttft_s`, `e2e_s`, `has_error` (same `index`);
//! - `results/config.yaml` (what ran) or else `profile.yaml` (what was asked): the
//!   inference-perf workload: shared-prefix shape, configured `output_len`, `ignore_eos`,
//!   rate stages;
//! - `workload_*.json`: the workload of a summary-only run (no replay files);
//! - `s2r_error_records.csv`: the run's hardware, `gpu_mem_util`, TP and
//!   `max_num_batched_tokens` (when `exp-config.yaml` does not say), `dp` (data-parallel
//!   replicas), the weights' `precision`, summary actuals per stage, and the published
//!   simulators' predictions and errors;
//! - `metrics_before.txt`, `metrics_after.txt`, `scrape.yaml`: a run known only from vLLM's
//!   own `/metrics` ([`super::scraped`]).
//!
//! Text in, no I/O. Errors name the file and the field.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::catalog;
use crate::workload::TraceFormat;

use super::run::{
    FailedRequest, INFERENCE_PERF_TIMEOUT_S, MeasuredRequest, MeasuredRun, SharedPrefix, Stage,
};
use super::s2r::{S2r, parse_s2r};
use super::{FidelityError, bad_file, deployment};

/// The text of a run directory's files (the caller reads them).
#[derive(Clone, Debug, Default)]
pub struct RunFiles {
    /// The run's name (its directory name).
    pub name: String,
    /// `model_config.json`.
    pub model_config: Option<String>,
    /// `exp-config.yaml`.
    pub exp_config: Option<String>,
    /// `replay_requests.json`.
    pub replay_requests: Option<String>,
    /// `replay_ground_truth.json`.
    pub ground_truth: Option<String>,
    /// `results/config.yaml`, or else `profile.yaml`.
    pub profile: Option<String>,
    /// `workload_*.json` (summary-only runs).
    pub workload: Option<String>,
    /// `s2r_error_records.csv`.
    pub s2r_records: Option<String>,
    /// `metrics_before.txt`: vLLM's `/metrics` before the load (see [`super::scraped`]).
    pub metrics_before: Option<String>,
    /// `metrics_after.txt`: vLLM's `/metrics` after the load.
    pub metrics_after: Option<String>,
    /// `scrape.yaml`: the interval between the scrapes and the GPU.
    pub scrape: Option<String>,
}

impl MeasuredRun {
    /// Parses a run from its files.
    pub fn parse(files: &RunFiles) -> Result<MeasuredRun, FidelityError> {
        let model_text = files
            .model_config
            .as_deref()
            .ok_or_else(|| missing_file("model_config.json", "the model's HF config is needed"))?;
        let arch = catalog::parse_model_config(&files.name, model_text).map_err(|err| {
            FidelityError::BadFile {
                file: "model_config.json".into(),
                reason: err.to_string(),
            }
        })?;
        let exp = match &files.exp_config {
            Some(text) => yaml_value("exp-config.yaml", text)?,
            None => Value::Null,
        };
        let profile = match (&files.profile, &files.workload) {
            (Some(text), _) => Some(("profile.yaml", yaml_value("profile.yaml", text)?)),
            (None, Some(text)) => Some(("workload json", json_value("workload json", text)?)),
            (None, None) => None,
        };
        let s2r = match &files.s2r_records {
            Some(text) => parse_s2r(text)?,
            None => S2r::default(),
        };
        let mut run = MeasuredRun {
            name: files.name.clone(),
            arch,
            gpu: s2r.hardware.clone(),
            tp: u32_at(&exp, "tensor_parallelism").or(s2r.tp).unwrap_or(1),
            dp: 1,
            precision: s2r.precision.clone(),
            max_num_seqs: u32_at(&exp, "max_num_seqs").unwrap_or(256),
            max_num_batched_tokens: u32_at(&exp, "max_num_batched_tokens")
                .or(s2r.max_num_batched_tokens)
                .unwrap_or(2048),
            max_model_len: u32_at(&exp, "max_model_len"),
            block_size: 16,
            num_gpu_blocks: None,
            gpu_memory_utilization: s2r.gpu_memory_utilization.unwrap_or(0.9),
            configured_output_len: None,
            ignore_eos: false,
            shared_prefix: None,
            stages: Vec::new(),
            requests: Vec::new(),
            failed: Vec::new(),
            client_timeout_us: None,
            multi_turn: false,
            num_requests: None,
            actuals: s2r.actuals,
            published: s2r.published,
            prompt_lengths: None,
            output_lengths: None,
            offload_connector_bytes: None,
        };
        if let Some(precision) = &run.precision {
            deployment::apply_precision(&mut run.arch, precision)?;
        }
        if let Some((file, profile)) = &profile {
            apply_profile(&mut run, file, profile)?;
        }
        if let Some(text) = &files.replay_requests {
            apply_replay(&mut run, text, files.ground_truth.as_deref())?;
        }
        if let Some(after) = &files.metrics_after {
            super::scraped::apply_scrapes(
                &mut run,
                files.scrape.as_deref(),
                files.metrics_before.as_deref(),
                after,
            )?;
        }
        // After the replay config, which may set TP.
        run.dp = s2r
            .dp
            .or_else(|| {
                s2r.experiment_folder
                    .as_deref()
                    .and_then(|folder| deployment::dp_from_name(folder, run.tp))
            })
            .or_else(|| deployment::dp_from_name(&run.name, run.tp))
            .unwrap_or(1);
        if run.stages.is_empty() {
            return Err(FidelityError::Missing {
                what: "rate stages",
                reason: "neither profile.yaml nor a workload json gives `load.stages`".into(),
            });
        }
        if run.requests.is_empty() && run.actuals.is_empty() {
            return Err(FidelityError::Missing {
                what: "measurements",
                reason: "need replay_ground_truth.json or s2r_error_records.csv actuals".into(),
            });
        }
        Ok(run)
    }
}

fn missing_file(file: &str, reason: &str) -> FidelityError {
    FidelityError::BadFile {
        file: file.into(),
        reason: format!("missing: {reason}"),
    }
}

fn yaml_value(file: &str, text: &str) -> Result<Value, FidelityError> {
    serde_saphyr::from_str::<Value>(text).map_err(|err| bad_file(file, err.to_string()))
}

fn json_value(file: &str, text: &str) -> Result<Value, FidelityError> {
    serde_json::from_str::<Value>(text).map_err(|err| bad_file(file, err.to_string()))
}

fn u32_at(value: &Value, key: &str) -> Option<u32> {
    value
        .get(key)
        .and_then(Value::as_f64)
        .filter(|v| v.is_finite() && *v >= 0.0 && *v <= f64::from(u32::MAX))
        .map(|v| v as u32)
}

/// Reads the workload shape, output length, EOS handling and stages from an inference-perf
/// profile (`data.shared_prefix`, `server.ignore_eos`, `load.stages`) or a workload json
/// (`shared_prefix`, `api.ignore_eos`, `stages`, `num_requests`).
fn apply_profile(run: &mut MeasuredRun, file: &str, profile: &Value) -> Result<(), FidelityError> {
    let shared = profile
        .pointer("/data/shared_prefix")
        .or_else(|| profile.get("shared_prefix"))
        .filter(|v| v.is_object());
    if let Some(shared) = shared {
        let groups = u32_at(shared, "num_groups").or(u32_at(shared, "num_unique_system_prompts"));
        let users = u32_at(shared, "num_prompts_per_group")
            .or(u32_at(shared, "num_users_per_system_prompt"));
        let system = u32_at(shared, "system_prompt_len");
        if let (Some(groups), Some(users), Some(system)) = (groups, users, system) {
            run.shared_prefix = Some(SharedPrefix {
                groups: groups.max(1),
                users_per_group: users.max(1),
                system_prompt_len: system,
                question_len: u32_at(shared, "question_len").unwrap_or(0),
            });
        }
        run.configured_output_len = u32_at(shared, "output_len").filter(|&n| n > 0);
        run.multi_turn = shared
            .get("enable_multi_turn_chat")
            .and_then(Value::as_bool)
            .unwrap_or(false);
    }
    // What ran (`results/config.yaml`) names the timeout; `null` means the client's default.
    let timeout_s = profile
        .pointer("/load/request_timeout")
        .and_then(Value::as_f64)
        .filter(|t| *t > 0.0 && t.is_finite())
        .unwrap_or(INFERENCE_PERF_TIMEOUT_S);
    run.client_timeout_us = Some((timeout_s * 1e6).round() as u64);
    run.ignore_eos = profile
        .pointer("/server/ignore_eos")
        .or_else(|| profile.pointer("/api/ignore_eos"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let stages = profile
        .pointer("/load/stages")
        .or_else(|| profile.get("stages"))
        .and_then(Value::as_array);
    if let Some(stages) = stages {
        let mut start_us = 0u64;
        for (i, stage) in stages.iter().enumerate() {
            let rate = stage.get("rate").and_then(Value::as_f64);
            let duration = stage.get("duration").and_then(Value::as_f64);
            let (Some(rate), Some(duration)) = (rate, duration) else {
                return Err(bad_file(
                    file,
                    format!("stages[{i}]: needs `rate` and `duration`"),
                ));
            };
            if !(rate > 0.0 && rate.is_finite() && duration > 0.0 && duration < 1e7) {
                return Err(bad_file(
                    file,
                    format!("stages[{i}]: rate and duration must be > 0"),
                ));
            }
            let duration_us = (duration * 1e6).round() as u64;
            run.stages.push(Stage {
                rate,
                start_us,
                duration_us,
            });
            start_us += duration_us;
        }
    }
    run.num_requests = profile
        .get("num_requests")
        .and_then(Value::as_u64)
        .filter(|&n| n > 0 && n <= 10_000_000);
    Ok(())
}

/// The KV-offload connector's host memory in the campaign's runs that published per-request
/// data (`replay_requests.json`): "KV cache CPU offloading enabled (8 GiB via
/// `OffloadingConnector`, `recompute` failure policy)" for all sixteen original runs, in the
/// campaign's design document (inference-sim/sim-to-real-accuracy-validation,
/// `docs/plans/2026-03-04-sim-to-real-accuracy-validation-design.md`, section 1); the two of
/// them with an s2r record say `cpu_offload: True` too. `replay_requests.json` records no
/// connector setting itself (`docs/fidelity/knee-tp2.md`, section 5).
pub const CAMPAIGN_OFFLOAD_CONNECTOR_BYTES: u64 = 8 << 30;

/// Applies `replay_requests.json` (requests and server config) and, when given, the per
/// request ground truth. Requests the run marked `has_error` go to `failed` (with their
/// lengths when the data kept them).
fn apply_replay(
    run: &mut MeasuredRun,
    text: &str,
    ground_truth: Option<&str>,
) -> Result<(), FidelityError> {
    let trace = TraceFormat::ReplayJson
        .parse(text)
        .map_err(|err| bad_file("replay_requests.json", err.to_string()))?;
    run.offload_connector_bytes = Some(CAMPAIGN_OFFLOAD_CONNECTOR_BYTES);
    if let Some(config) = trace.replay_config {
        run.tp = config.tensor_parallelism.max(1);
        run.max_num_seqs = config.max_num_seqs;
        run.max_num_batched_tokens = config.max_num_batched_tokens;
        run.block_size = config.block_size.max(1);
        run.num_gpu_blocks = u32::try_from(config.kv_blocks_total_gpu)
            .ok()
            .filter(|&b| b > 0);
    }
    let Some(truth) = ground_truth else {
        return Err(missing_file(
            "replay_ground_truth.json",
            "replay_requests.json needs its ground truth",
        ));
    };
    let truth = parse_ground_truth(truth)?;
    let errored: std::collections::BTreeSet<u64> = trace.errored.iter().map(|id| id.0).collect();
    let failed_e2e = |id: u64| truth.get(&id).and_then(|t| t.1.map(|e2e| e2e * 1e6));
    for lost in &trace.lost {
        run.failed.push(FailedRequest {
            id: lost.id.0,
            arrival_us: lost.arrival_us,
            input_tokens: None,
            e2e_us: failed_e2e(lost.id.0),
        });
    }
    for request in &trace.requests {
        let id = request.id.0;
        let Some(&(ttft_s, e2e_s, has_error)) = truth.get(&id) else {
            continue;
        };
        let (Some(ttft_s), Some(e2e_s), false) =
            (ttft_s, e2e_s, has_error || errored.contains(&id))
        else {
            run.failed.push(FailedRequest {
                id,
                arrival_us: request.arrival_us,
                input_tokens: Some(request.input_tokens),
                e2e_us: failed_e2e(id),
            });
            continue;
        };
        run.requests.push(MeasuredRequest {
            id,
            arrival_us: request.arrival_us,
            input_tokens: request.input_tokens,
            output_recount: request.output_tokens,
            ttft_us: ttft_s * 1e6,
            e2e_us: e2e_s * 1e6,
        });
    }
    if run.requests.is_empty() {
        return Err(bad_file(
            "replay_ground_truth.json",
            "no request has a usable measurement",
        ));
    }
    run.failed
        .sort_by_key(|failed| (failed.arrival_us, failed.id));
    Ok(())
}

/// Per request measurements: `index` → (`ttft_s`, `e2e_s`, `has_error`); a failed request
/// may lack either time (it has no first token; its `e2e_s` is the time until it failed).
type Truth = BTreeMap<u64, (Option<f64>, Option<f64>, bool)>;

/// Parses `replay_ground_truth.json` (see [`Truth`]).
fn parse_ground_truth(text: &str) -> Result<Truth, FidelityError> {
    const FILE: &str = "replay_ground_truth.json";
    let value = json_value(FILE, text)?;
    let rows = value
        .as_array()
        .or_else(|| value.get("requests").and_then(Value::as_array))
        .ok_or_else(|| bad_file(FILE, "expected an array of {index, ttft_s, e2e_s}"))?;
    let mut truth = BTreeMap::new();
    for (i, row) in rows.iter().enumerate() {
        let index = row
            .get("index")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad_file(FILE, format!("[{i}].index: missing or not an integer")))?;
        let has_error = row
            .get("has_error")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let ttft = row.get("ttft_s").and_then(Value::as_f64);
        let e2e = row.get("e2e_s").and_then(Value::as_f64);
        match (ttft, e2e) {
            (Some(ttft), Some(e2e)) if ttft >= 0.0 && e2e >= ttft && e2e.is_finite() => {
                truth.insert(index, (Some(ttft), Some(e2e), has_error));
            }
            _ if has_error => {
                let e2e = e2e.filter(|e| e.is_finite() && *e >= 0.0);
                truth.insert(index, (None, e2e, true));
            }
            _ => {
                return Err(bad_file(
                    FILE,
                    format!("[{i}]: ttft_s and e2e_s must be numbers with 0 <= ttft_s <= e2e_s"),
                ));
            }
        }
    }
    Ok(truth)
}
