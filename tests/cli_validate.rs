//! `ditto validate` and `ditto calibrate` end to end on the measured dev runs in
//! `tests/data/gt` (see its README): the fidelity regression guard, the report's shape, the
//! default model's margin over the published-basis models, and bad input.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
mod common;

use common::cli::ditto;

use serde_json::Value;

/// Median absolute % errors across the four dev runs with the embedded calibrated model
/// when this guard was set (docs/fidelity.md). A change that makes a median worse than its
/// guard fails; re-pin only with a better fit, and update docs/fidelity.md with it.
const GUARD_E2E_MEAN: f64 = 3.5;
const GUARD_TTFT_MEAN: f64 = 1.5;
const GUARD_TPOT_MEAN: f64 = 3.5;

fn runs() -> Vec<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gt");
    let mut dirs: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    dirs
}

fn validate_json(model: &str) -> Value {
    let mut args = vec!["validate", "--json", "--latency-model", model];
    let dirs = runs();
    args.extend(dirs.iter().map(String::as_str));
    let out = ditto(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn median(report: &Value, metric: &str) -> f64 {
    report["median_ape_percent"][metric].as_f64().unwrap()
}

#[test]
fn calibrated_model_stays_within_the_fidelity_guard() {
    // Goal: the default model's median errors on the dev runs never regress past the
    // figures this work reached. Method: replay all four runs, read the medians.
    let report = validate_json("calibrated");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    let e2e = median(&report, "e2e_mean");
    let ttft = median(&report, "ttft_mean");
    let tpot = median(&report, "tpot_mean");
    assert!(
        e2e <= GUARD_E2E_MEAN,
        "median E2E error {e2e}% > {GUARD_E2E_MEAN}%"
    );
    assert!(
        ttft <= GUARD_TTFT_MEAN,
        "median TTFT error {ttft}% > {GUARD_TTFT_MEAN}%"
    );
    assert!(
        tpot <= GUARD_TPOT_MEAN,
        "median TPOT error {tpot}% > {GUARD_TPOT_MEAN}%"
    );
    // The report's shape: whole run first, then each stage; KS only with per-request truth.
    for run in runs {
        let stages = run["stages"].as_array().unwrap();
        let ids: Vec<i64> = stages
            .iter()
            .map(|s| s["stage"].as_i64().unwrap())
            .collect();
        assert_eq!(ids, vec![-1, 0, 1], "{}", run["name"]);
        let per_request = !run["name"].as_str().unwrap().starts_with("a100");
        for stage in stages {
            assert!(stage["count"].as_u64().unwrap() > 1000);
            assert_eq!(stage["ks_ttft"].is_number(), per_request, "{}", run["name"]);
            for metric in ["e2e_mean", "e2e_p90", "ttft_mean", "ttft_p90", "tpot_mean"] {
                assert!(stage["predicted_ms"][metric].as_f64().unwrap() > 0.0);
                assert!(stage["measured_ms"][metric].as_f64().unwrap() > 0.0);
            }
        }
        // The servers ignored EOS: every run simulates its configured output length.
        assert!(matches!(
            run["output_len_simulated"].as_u64(),
            Some(247 | 248)
        ));
        assert_eq!(run["unfinished_requests"].as_u64(), Some(0));
    }
}

#[test]
fn calibrated_model_beats_the_published_basis_models() {
    // Goal: the default is the better model (why it is the default). Method: the same
    // replay with BLIS's trained-physics coefficients and with the plain roofline.
    let calibrated = median(&validate_json("calibrated"), "e2e_mean");
    for other in ["physics", "roofline"] {
        let theirs = median(&validate_json(other), "e2e_mean");
        assert!(
            calibrated * 2.0 < theirs,
            "calibrated {calibrated}% vs {other} {theirs}%"
        );
    }
}

#[test]
fn calibrate_writes_coefficients_that_validate_accepts() {
    // Goal: `calibrate` output is a valid `--latency-model` file and the fit moves toward
    // the data. Method: a short warm fit of two coefficients on one run's first stage.
    let dir = runs()
        .into_iter()
        .find(|d| d.contains("codellama"))
        .unwrap();
    let out_file = std::env::temp_dir().join(format!("ditto-cal-{}.yaml", std::process::id()));
    let out_path = out_file.to_string_lossy().into_owned();
    let out = ditto(&[
        "calibrate",
        &dir,
        "--start",
        "roofline",
        "--through-stage",
        "0",
        "--free",
        "step_us,weights",
        "--evaluations",
        "16",
        "--out",
        &out_path,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("weights:"), "{report}");
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert!(
        text.contains("provenance:") && text.contains("step_us:"),
        "{text}"
    );
    let validated = ditto(&["validate", &dir, "--latency-model", &out_path, "--json"]);
    assert!(
        validated.status.success(),
        "{}",
        String::from_utf8_lossy(&validated.stderr)
    );
    let fitted: Value = serde_json::from_slice(&validated.stdout).unwrap();
    let roofline = ditto(&["validate", &dir, "--latency-model", "roofline", "--json"]);
    let roofline: Value = serde_json::from_slice(&roofline.stdout).unwrap();
    let e2e = |v: &Value| {
        v["runs"][0]["stages"][1]["ape_percent"]["e2e_mean"]
            .as_f64()
            .unwrap()
    };
    assert!(
        e2e(&fitted) < e2e(&roofline),
        "fit {} vs roofline {}",
        e2e(&fitted),
        e2e(&roofline)
    );
    let _ = std::fs::remove_file(out_file);
}

#[test]
fn bad_input_exits_2_naming_the_problem() {
    let out = ditto(&["validate", "/nonexistent/run"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/run"));

    let empty = std::env::temp_dir().join(format!("ditto-empty-run-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = ditto(&["validate", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("model_config.json"));
    std::fs::write(empty.join("model_config.json"), "{not json").unwrap();
    let out = ditto(&["validate", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("model_config.json"));
    let _ = std::fs::remove_dir_all(&empty);

    let dir = runs().pop().unwrap();
    let out = ditto(&["validate", &dir, "--output-length", "sometimes"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--output-length"));
    let out = ditto(&["validate", &dir, "--latency-model", "/nonexistent.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--latency-model"));
    let out = ditto(&["calibrate", &dir, "--free", "warp_factor"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("warp_factor"));
}
