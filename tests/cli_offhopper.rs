//! `ditto run` against published vLLM measurements off the runs ditto was fitted on
//! (data/offhopper_measurements.tsv; sources in data/PROVENANCE.md, the replay and what the
//! errors mean in docs/fidelity/off-hopper.md): each row is replayed as the burst it was and
//! ditto's signed error on the run's duration, mean TTFT and mean TPOT must stay inside the band
//! stated below for that row; the A100 : H100 duration ratio of each workload likewise.
//!
//! The bands are regression pins, not fidelity goals: ditto's error when they were set (issue
//! 36, re-pinned at stop 40 with the refitted calibrated model, `flops` 0.628 -> 1.729) plus
//! and minus a margin. The A100's 2K and 4K bursts are now within 8% on every figure; the H100's
//! are 37-44% fast and both 128-token bursts 27-82% fast on duration and TTFT, which is what
//! ditto does not model yet (docs/fidelity/off-hopper.md: the API server serialising a burst,
//! and the H100 bursts' prefill at about half the efficiency the fit finds on the scored H100
//! runs). A change that moves a row out of its band fails here: re-pin with
//! docs/fidelity/off-hopper.md.
#![allow(clippy::unwrap_used)]

mod common;

use common::cli::ditto;
use serde_json::Value;

/// The measurement file, as the tests read it (it is not compiled into the binary).
const MEASUREMENTS: &str = include_str!("../data/offhopper_measurements.tsv");

/// Margin, in points of signed % error, each band leaves either side of the error at pin time.
const MARGIN_POINTS: f64 = 10.0;

/// Per row (id as in the file): ditto's signed % error on duration, mean TTFT and mean TPOT when
/// the bands were set (embedded calibrated model, issue 36 stop 40: the refit on the replay
/// that sends the measured runs' fixed prompts; stop 39's pins, at `flops` 0.628, were -42 to
/// -93 on every figure). Each band is that error ± `MARGIN_POINTS`. Source line: the row of
/// data/offhopper_measurements.tsv with that id.
const PINNED: [(&str, f64, f64, f64); 6] = [
    ("gpustack-a100-qwen3-14b-in2k", 4.5, 2.0, 7.8),
    ("gpustack-a100-qwen3-14b-in4k", 5.6, 4.7, -3.6),
    ("gpustack-a100-qwen3-14b-in128", -26.7, -48.7, 27.6),
    ("gpustack-h100-qwen3-14b-in2k", -39.4, -44.1, -38.6),
    ("gpustack-h100-qwen3-14b-in4k", -37.2, -39.6, -39.4),
    ("gpustack-h100-qwen3-14b-in128", -72.5, -81.9, -34.9),
];

/// Per workload: the A100 row, the H100 row, and ditto's signed % error on the ratio of their
/// durations when pinned (measured 1.776, 1.789 and 1.179; ditto 3.06, 3.01 and 3.15 at stop
/// 40, 2.92, 2.90 and 3.10 at stop 39). The band
/// is that error ± 15 points: the ratio cancels what both GPUs share (client, API server), so it
/// is the off-Hopper signal of these rows.
const RATIOS: [(&str, &str, f64); 3] = [
    (
        "gpustack-a100-qwen3-14b-in2k",
        "gpustack-h100-qwen3-14b-in2k",
        72.5,
    ),
    (
        "gpustack-a100-qwen3-14b-in4k",
        "gpustack-h100-qwen3-14b-in4k",
        68.2,
    ),
    (
        "gpustack-a100-qwen3-14b-in128",
        "gpustack-h100-qwen3-14b-in128",
        166.9,
    ),
];

/// Margin of the ratio bands, in points of signed % error.
const RATIO_MARGIN_POINTS: f64 = 15.0;

/// One measurement row.
struct Row {
    id: String,
    gpu: String,
    model: String,
    tp: String,
    max_num_batched_tokens: String,
    max_num_seqs: String,
    requests: String,
    input_tokens: String,
    output_tokens: String,
    duration_s: f64,
    ttft_ms: f64,
    tpot_ms: f64,
}

/// The rows of the measurement file (comment lines skipped, columns by header name).
fn rows() -> Vec<Row> {
    let mut lines = MEASUREMENTS
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty());
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    lines
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            assert_eq!(f.len(), header.len(), "row has a field per column: {line}");
            let text = |name: &str| f[column(name)].to_owned();
            let number = |name: &str| f[column(name)].parse::<f64>().unwrap();
            Row {
                id: text("id"),
                gpu: text("gpu"),
                model: text("model"),
                tp: text("tp"),
                max_num_batched_tokens: text("max_num_batched_tokens"),
                max_num_seqs: text("max_num_seqs"),
                requests: text("requests"),
                input_tokens: text("input_tokens"),
                output_tokens: text("output_tokens"),
                duration_s: number("duration_s"),
                ttft_ms: number("ttft_ms"),
                tpot_ms: number("tpot_ms"),
            }
        })
        .collect()
}

/// ditto's (duration s, mean TTFT ms, mean TPOT ms) for a row: its requests arrive 1 µs apart
/// (the benchmark's request rate inf), every prompt and output of the row's length.
fn replay(row: &Row) -> (f64, f64, f64) {
    let input = format!("{0},0,{0},{0}", row.input_tokens);
    let output = format!("{0},0,{0},{0}", row.output_tokens);
    let out = ditto(&[
        "run",
        "--model",
        &row.model,
        "--gpu",
        &row.gpu,
        "--tp",
        &row.tp,
        "--num-requests",
        &row.requests,
        "--rate",
        "1000000",
        "--arrival",
        "constant",
        "--input-tokens",
        &input,
        "--output-tokens",
        &output,
        "--max-num-batched-tokens",
        &row.max_num_batched_tokens,
        "--max-num-seqs",
        &row.max_num_seqs,
        "--kv-sample-interval-s",
        "0",
    ]);
    assert!(
        out.status.success(),
        "{}: {}",
        row.id,
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let completed = summary["completed_requests"].as_u64().unwrap();
    assert_eq!(
        completed.to_string(),
        row.requests,
        "{}: all complete",
        row.id
    );
    (
        summary["sim_duration_s"].as_f64().unwrap(),
        summary["ttft_ms"]["mean"].as_f64().unwrap(),
        summary["tpot_ms"]["mean"].as_f64().unwrap(),
    )
}

/// Signed % error of a prediction against a measurement.
fn error_pct(predicted: f64, measured: f64) -> f64 {
    100.0 * (predicted - measured) / measured
}

/// Fails unless `error` lies within `pinned` ± `margin`.
fn assert_in_band(what: &str, error: f64, pinned: f64, margin: f64) {
    assert!(
        (error - pinned).abs() <= margin,
        "{what}: ditto's error {error:+.1}% left its band {pinned:+.1} ± {margin} points \
         (docs/fidelity/off-hopper.md says how to re-pin)"
    );
}

#[test]
fn every_row_is_pinned_and_every_pin_has_a_row() {
    let ids: Vec<String> = rows().into_iter().map(|r| r.id).collect();
    let pinned: Vec<&str> = PINNED.iter().map(|p| p.0).collect();
    assert_eq!(ids, pinned, "rows and pins in the same order");
    for (a100, h100, _) in RATIOS {
        assert!(ids.iter().any(|i| i == a100) && ids.iter().any(|i| i == h100));
    }
}

#[test]
fn each_published_burst_stays_in_its_band() {
    for row in rows() {
        let (_, pin_duration, pin_ttft, pin_tpot) = *PINNED.iter().find(|p| p.0 == row.id).unwrap();
        let (duration, ttft, tpot) = replay(&row);
        let id = &row.id;
        assert_in_band(
            &format!("{id} duration"),
            error_pct(duration, row.duration_s),
            pin_duration,
            MARGIN_POINTS,
        );
        assert_in_band(
            &format!("{id} mean TTFT"),
            error_pct(ttft, row.ttft_ms),
            pin_ttft,
            MARGIN_POINTS,
        );
        assert_in_band(
            &format!("{id} mean TPOT"),
            error_pct(tpot, row.tpot_ms),
            pin_tpot,
            MARGIN_POINTS,
        );
    }
}

#[test]
fn a100_to_h100_duration_ratio_stays_in_its_band() {
    let all = rows();
    let find = |id: &str| all.iter().find(|r| r.id == id).unwrap();
    for (a100, h100, pinned) in RATIOS {
        let (a, h) = (find(a100), find(h100));
        let predicted = replay(a).0 / replay(h).0;
        let measured = a.duration_s / h.duration_s;
        assert_in_band(
            &format!("{a100} / {h100} duration ratio"),
            error_pct(predicted, measured),
            pinned,
            RATIO_MARGIN_POINTS,
        );
    }
}
