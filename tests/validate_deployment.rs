//! `ditto validate` honours how the measured server was deployed, as the published error
//! records say it (`s2r_error_records.csv`, the dataset's own columns): `dp` data-parallel
//! replicas sharing the load, and the weights' `precision`. Each variant is the A100 dev run
//! (tests/data/gt) with one column or the load changed, written to a temporary directory;
//! the predictions, not the scores, are compared.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

mod common;

use common::cli::ditto;
use serde_json::Value;

const RUN: &str = "a100-llama3.1-8b-tp1-general-lite";

/// A run directory under a temporary parent, removed when dropped (pass or fail).
struct Variant {
    dir: PathBuf,
}

impl Drop for Variant {
    fn drop(&mut self) {
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(parent);
        }
    }
}

/// A copy of the A100 run in a fresh temporary directory named `tag`, with the CSV's `column`
/// set to `value` on every record and the workload's rates and request count multiplied by
/// `load`.
fn variant(tag: &str, column: Option<(&str, &str)>, load: f64) -> Variant {
    let copy = copy_with(RUN, tag, column);
    let path = copy.dir.join("workload_general_lite.json");
    let mut workload: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for stage in workload["stages"].as_array_mut().unwrap() {
        stage["rate"] = (stage["rate"].as_f64().unwrap() * load).into();
    }
    workload["num_requests"] = ((workload["num_requests"].as_f64().unwrap() * load) as u64).into();
    std::fs::write(&path, workload.to_string()).unwrap();
    copy
}

/// `ditto validate --json` of one run directory: the run's report.
fn validate(variant: &Variant) -> Value {
    let dir: &Path = &variant.dir;
    let out = ditto(&["validate", "--json", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    report["runs"][0].clone()
}

/// The whole run's predicted `metric` (ms).
fn predicted(run: &Value, metric: &str) -> f64 {
    run["stages"][0]["predicted_ms"][metric].as_f64().unwrap()
}

#[test]
fn data_parallel_replicas_share_the_load() {
    let one = variant("dp1", None, 1.0);
    let doubled = variant("dp1-x2", None, 2.0);
    let two = variant("dp2-x2", Some(("dp", "2")), 2.0);
    let (one_run, doubled_run, two_run) = (validate(&one), validate(&doubled), validate(&two));
    assert_eq!(one_run["dp"], 1, "an empty dp is one replica");
    assert_eq!(two_run["dp"], 2);
    // With the dp cells empty, the dataset's folder name gives the degree.
    let named = variant(
        "named",
        Some(("experiment_folder", "38-llama-3-1-8b-tp1-general-lite-1-2")),
        2.0,
    );
    let named_run = validate(&named);
    assert_eq!(named_run["dp"], 2);
    assert_eq!(named_run["stages"][0], two_run["stages"][0]);
    // Every request of the doubled load is replayed and scored: the two replicas' records
    // are all read.
    assert_eq!(two_run["unfinished_requests"], 0);
    assert_eq!(
        two_run["stages"][0]["count"], doubled_run["stages"][0]["count"],
        "the same requests, scored"
    );

    // Twice the load on one replica runs bigger batches: a slower token.
    let tpot = |run: &Value| predicted(run, "tpot_mean");
    assert!(
        tpot(&doubled_run) > tpot(&one_run) * 1.10,
        "one replica at twice the load: TPOT {} vs {}",
        tpot(&doubled_run),
        tpot(&one_run)
    );
    // Two replicas at twice the load each see about the original load.
    for metric in ["tpot_mean", "e2e_mean", "ttft_mean"] {
        let (a, b) = (predicted(&two_run, metric), predicted(&one_run, metric));
        assert!(
            (a / b - 1.0).abs() < 0.04,
            "{metric}: two replicas at twice the load {a} vs one at the original {b}"
        );
    }
}

#[test]
fn a_mixture_of_experts_at_dp_2_runs_expert_parallel() {
    // The Mixtral dev run (per-request arrivals) with its record saying dp 2: two ranks
    // share the same requests, and with expert parallelism each GPU reads a quarter of
    // the routed experts instead of half, so the token is about twice as fast; halving the
    // load alone on TP-only ranks would barely move it (Mixtral's step is its weights:
    // 19.1 against 20.7 ms when this test was written, 10.8 with expert parallelism).
    let mixtral = "h100-mixtral8x7b-tp2-general";
    let one = copy_with(mixtral, "moe-dp1", None);
    let two = copy_with(mixtral, "moe-dp2", Some(("dp", "2")));
    let (one_run, two_run) = (validate(&one), validate(&two));
    assert_eq!(two_run["dp"], 2);
    assert_eq!(two_run["unfinished_requests"], 0);
    let tpot = |run: &Value| predicted(run, "tpot_mean");
    assert!(
        tpot(&two_run) < 0.7 * tpot(&one_run),
        "dp 2 with expert parallelism: TPOT {} vs {} at dp 1",
        tpot(&two_run),
        tpot(&one_run)
    );
}

/// A copy of dev run `name` (every file) under a temporary parent named `tag`, with the
/// CSV's `column` set to `value` on every record.
fn copy_with(name: &str, tag: &str, column: Option<(&str, &str)>) -> Variant {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gt")
        .join(name);
    let dir = std::env::temp_dir()
        .join(format!("ditto-deploy-{}-{tag}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&source, &dir);
    if let Some((column, value)) = column {
        let path = dir.join("s2r_error_records.csv");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, with_column(&text, column, value)).unwrap();
    }
    Variant { dir }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// `csv` with `column` set to `value` on every record.
fn with_column(csv: &str, column: &str, value: &str) -> String {
    let mut lines = csv.lines();
    let header = lines.next().unwrap();
    let index = header.split(',').position(|h| h == column).unwrap();
    let mut out = format!("{header}\n");
    for line in lines {
        let mut cells: Vec<&str> = line.split(',').collect();
        cells[index] = value;
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

#[test]
fn fp8_precision_reads_one_byte_weights() {
    let fp16 = variant("fp16", None, 1.0);
    let fp8 = variant("fp8", Some(("precision", "FP8")), 1.0);
    let (fp16_run, fp8_run) = (validate(&fp16), validate(&fp8));
    assert_eq!(fp16_run["weight_bytes_per_param"], 2.0);
    assert_eq!(fp8_run["weight_bytes_per_param"], 1.0);
    // Half the weights' memory goes to the KV cache: ~8 GB of Llama-3.1-8B, 2 MiB a block.
    let blocks = |run: &Value| run["num_gpu_blocks"].as_f64().unwrap();
    let extra = blocks(&fp8_run) - blocks(&fp16_run);
    assert!(
        (3_500.0..4_300.0).contains(&extra),
        "FP8 weights free {extra} blocks"
    );
    // A decode step streams the weights: half the bytes, a faster token (A100 has no FP8
    // tensor cores, so the prefill's FLOPs stay at the 16-bit peak).
    let tpot = |run: &Value| predicted(run, "tpot_mean");
    assert!(
        tpot(&fp8_run) < tpot(&fp16_run) * 0.85,
        "FP8 TPOT {} vs FP16 {}",
        tpot(&fp8_run),
        tpot(&fp16_run)
    );
}

#[test]
fn bad_deployment_columns_exit_2_naming_the_column() {
    for (tag, column, value) in [
        ("bad", "dp", "two"),
        ("zero", "dp", "0"),
        ("huge", "dp", "100000"),
        ("fp4", "precision", "FP4"),
    ] {
        let run = variant(tag, Some((column, value)), 1.0);
        let out = ditto(&["validate", run.dir.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{tag}: {stderr}");
        // The column and the value as written, after the run's path.
        let named = format!("{column} `{value}`");
        assert!(stderr.contains(&named), "{tag}: {stderr}");
    }
}
