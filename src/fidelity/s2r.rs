//! `s2r_error_records.csv`, the published error records of a measured run: its hardware,
//! `gpu_mem_util`, TP, `max_num_batched_tokens`, `dp` and `precision` (how the server was
//! deployed), the measured summary per stage, and the published simulators' predictions and
//! errors. Text in, no I/O; errors name the file and the line.

use std::collections::BTreeMap;

use super::FidelityError;
use super::bad_file;
use super::deployment::MAX_DATA_PARALLEL;
use super::run::Published;

/// What `s2r_error_records.csv` says about the run.
#[derive(Debug, Default)]
pub(super) struct S2r {
    /// The `hardware` column (the GPU's name).
    pub(super) hardware: Option<String>,
    /// `gpu_mem_util`.
    pub(super) gpu_memory_utilization: Option<f64>,
    /// Tensor parallelism.
    pub(super) tp: Option<u32>,
    /// `dp`: data-parallel replicas (each of `tp` GPUs) the load was spread over; `None` when
    /// every cell is empty (the dataset's tooling then means one; the run's folder name may
    /// still say, see [`super::deployment::dp_from_name`]).
    pub(super) dp: Option<u32>,
    /// `experiment_folder`: the dataset's own name of the run (it may carry the TP-DP
    /// suffix a renamed copy lost).
    pub(super) experiment_folder: Option<String>,
    /// `precision`: the weights' precision the server ran (`FP16`, `FP8`).
    pub(super) precision: Option<String>,
    /// `max_num_batched_tokens`.
    pub(super) max_num_batched_tokens: Option<u32>,
    /// Measured value by (stage, metric).
    pub(super) actuals: BTreeMap<(i32, String), f64>,
    /// The published simulators' predictions.
    pub(super) published: Vec<Published>,
}

/// Parses the published error records (plain CSV with a header; no quoted fields).
pub(super) fn parse_s2r(text: &str) -> Result<S2r, FidelityError> {
    const FILE: &str = "s2r_error_records.csv";
    let mut lines = text.lines().filter(|line| !line.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| bad_file(FILE, "empty"))?
        .split(',')
        .map(str::trim)
        .collect();
    let column = |name: &str| header.iter().position(|h| *h == name);
    let (Some(sim), Some(stage), Some(metric), Some(predicted), Some(actual)) = (
        column("simulator"),
        column("stage_index"),
        column("metric_name"),
        column("predicted"),
        column("actual"),
    ) else {
        return Err(bad_file(
            FILE,
            "header needs simulator, stage_index, metric_name, predicted, actual",
        ));
    };
    let mape = column("mape");
    let mut s2r = S2r::default();
    for (n, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let cell = |i: usize| cells.get(i).copied().unwrap_or("");
        let number = |i: usize| cell(i).parse::<f64>().ok().filter(|v| v.is_finite());
        let (Ok(stage_index), Some(actual_value)) = (cell(stage).parse::<i32>(), number(actual))
        else {
            return Err(bad_file(
                FILE,
                format!("line {}: bad stage_index or actual", n + 2),
            ));
        };
        let metric_name = cell(metric).to_string();
        s2r.actuals
            .insert((stage_index, metric_name.clone()), actual_value);
        if let Some(predicted_value) = number(predicted) {
            s2r.published.push(Published {
                simulator: cell(sim).to_string(),
                stage: stage_index,
                metric: metric_name,
                predicted: predicted_value,
                ape: mape.and_then(number).unwrap_or(f64::NAN),
            });
        }
        // A non-empty cell of the column `name`; the first record that has one wins.
        let text = |name: &str| column(name).map(cell).filter(|c| !c.is_empty());
        let owned = |name: &str| text(name).map(String::from);
        s2r.hardware = s2r.hardware.take().or_else(|| owned("hardware"));
        s2r.experiment_folder = s2r
            .experiment_folder
            .take()
            .or_else(|| owned("experiment_folder"));
        s2r.precision = s2r.precision.take().or_else(|| owned("precision"));
        if s2r.gpu_memory_utilization.is_none() {
            s2r.gpu_memory_utilization = column("gpu_mem_util").and_then(number);
        }
        if s2r.tp.is_none() {
            s2r.tp = column("tp")
                .and_then(number)
                .map(|v| v as u32)
                .filter(|&t| t > 0);
        }
        if s2r.dp.is_none() {
            s2r.dp = text("dp").map_or(Ok(None), |d| match d.parse::<f64>() {
                Ok(v) if v >= 1.0 && v.fract() == 0.0 && v <= f64::from(MAX_DATA_PARALLEL) => {
                    Ok(Some(v as u32))
                }
                _ => Err(bad_file(
                    FILE,
                    format!(
                        "line {}: dp `{d}`: expected a whole number from 1 to {MAX_DATA_PARALLEL}",
                        n + 2
                    ),
                )),
            })?;
        }
        if s2r.max_num_batched_tokens.is_none() {
            s2r.max_num_batched_tokens = column("max_num_batched_tokens")
                .and_then(number)
                .filter(|&v| v >= 1.0 && v <= f64::from(u32::MAX))
                .map(|v| v as u32);
        }
    }
    Ok(s2r)
}
