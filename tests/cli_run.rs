//! The `ditto run` binary end to end: default run, determinism, golden digest, bad input.
#![allow(clippy::unwrap_used)]

mod common;

use common::cli::ditto;
use std::process::Output;

fn fnv1a64(bytes: &[u8]) -> u64 {
    ditto::sim::rng::fnv1a64(bytes)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Digest of the default run's stdout. A change to it must be deliberate: re-pin it in the
/// same commit as the behaviour change, and say why in the commit message.
const DEFAULT_RUN_DIGEST: &str = "a45eab6ca73462c1";

#[test]
fn default_run_prints_the_summary_and_is_byte_identical() {
    let first = ditto(&["run"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let second = ditto(&["run"]);
    assert_eq!(first.stdout, second.stdout, "same command, different bytes");
    let summary: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    for field in [
        "injected_requests",
        "completed_requests",
        "still_queued",
        "still_running",
        "dropped_requests",
        "timed_out_requests",
        "preemptions",
        "input_tokens",
        "output_tokens",
        "sim_duration_s",
        "requests_per_s",
        "output_tokens_per_s",
        "prefix_cache_hit_rate",
    ] {
        assert!(summary[field].is_number(), "missing {field}");
    }
    for stats in [
        "ttft_ms",
        "e2e_ms",
        "itl_ms",
        "tpot_ms",
        "scheduling_delay_ms",
    ] {
        for key in ["mean", "p50", "p90", "p95", "p99"] {
            assert!(summary[stats][key].is_number(), "missing {stats}.{key}");
        }
    }
    assert_eq!(summary["injected_requests"], 1000);
    assert_eq!(summary["completed_requests"], 1000);
    assert_eq!(summary["run"]["model"], "llama-3.1-8b-instruct");
    assert_eq!(summary["run"]["latency_model"], "calibrated");
    let digest = format!("{:016x}", fnv1a64(&first.stdout));
    assert_eq!(
        digest,
        DEFAULT_RUN_DIGEST,
        "the default run's output changed; if deliberate, re-pin. Output:\n{}",
        String::from_utf8_lossy(&first.stdout)
    );
    assert!(stderr(&first).contains("wall"), "wall time goes to stderr");
}

#[test]
fn other_seed_changes_the_output() {
    let a = ditto(&["run", "--num-requests", "50"]);
    let b = ditto(&["run", "--num-requests", "50", "--seed", "7"]);
    assert!(a.status.success() && b.status.success());
    assert_ne!(a.stdout, b.stdout);
}

#[test]
fn every_latency_model_runs() {
    for model in ["roofline", "blackbox", "physics"] {
        let out = ditto(&["run", "--num-requests", "40", "--latency-model", model]);
        assert!(out.status.success(), "{model}: {}", stderr(&out));
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["completed_requests"], 40, "{model}");
        assert!(summary["e2e_ms"]["mean"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn per_request_file_has_one_line_per_request() {
    let dir = std::env::temp_dir().join(format!("ditto-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("requests.jsonl");
    let out = ditto(&[
        "run",
        "--num-requests",
        "30",
        "--per-request",
        path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 30);
    for line in &lines {
        let output_tokens = line["output_tokens"].as_u64().unwrap();
        assert_eq!(
            line["itl_us"].as_array().unwrap().len() as u64,
            output_tokens - 1
        );
        assert!(line["ttft_ms"].as_f64().unwrap() <= line["e2e_ms"].as_f64().unwrap());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["run", "--latency-model", "magic"], "--latency-model"),
        (&["run", "--model", "no-such-model"], "no-such-model"),
        (&["run", "--gpu", "Z999"], "Z999"),
        (&["run", "--input-tokens", "512,256"], "--input-tokens"),
        (&["run", "--rate=-3"], "--rate"),
        (&["run", "--rate", "0"], "--rate"),
        (&["run", "--num-requests", "0"], "--num-requests"),
        (
            &["run", "--scheduling-policy", "lifo"],
            "--scheduling-policy",
        ),
        (&["run", "--max-num-seqs", "0"], "--max-num-seqs"),
        (
            &["run", "--gpu-memory-utilization", "1.5"],
            "--gpu-memory-utilization",
        ),
        (&["run", "--no-such-flag"], "--no-such-flag"),
        (
            &["run", "--trace", "/nonexistent/trace.csv"],
            "/nonexistent/trace.csv",
        ),
        (
            &["run", "--workload", "/nonexistent/w.yaml"],
            "/nonexistent/w.yaml",
        ),
    ];
    for (args, needle) in cases {
        let out = ditto(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(needle),
            "{args:?}: stderr lacks {needle}: {}",
            stderr(&out)
        );
        assert!(out.stdout.is_empty(), "{args:?} printed a summary");
    }
}

#[test]
fn bad_workload_file_names_the_field() {
    let dir = std::env::temp_dir().join(format!("ditto-wl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    std::fs::write(&path, "seed: 1\nnum_requests: 10\nrate: 5\ninput_tokens: {type: gaussian, mean: 100, stdev: -1, min: 1, max: 200}\noutput_tokens: {type: constant, value: 10}\n").unwrap();
    let out = ditto(&["run", "--workload", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("stdev"), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn repo_path(relative: &str) -> String {
    format!("{}/{relative}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn workload_file_with_shared_prefixes_hits_the_cache() {
    let out = ditto(&["run", "--workload", &repo_path("docs/examples/chat.yaml")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["injected_requests"], 2000);
    assert!(summary["prefix_cache_hit_rate"].as_f64().unwrap() > 0.05);
    assert_eq!(
        summary["run"]["seed"], 42,
        "the spec's seed is used and echoed"
    );
}

#[test]
fn replay_trace_applies_the_recorded_server_settings() {
    let out = ditto(&[
        "run",
        "--trace",
        &repo_path("tests/data/replay_requests_excerpt.json"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = &summary["run"];
    assert_eq!(run["model"], "llama-2-7b-hf", "the trace's model is used");
    assert_eq!(run["num_gpu_blocks"], 7462);
    assert_eq!(run["max_num_seqs"], 128);
    assert_eq!(summary["injected_requests"], summary["completed_requests"]);
    // Explicit flags win over the recorded settings.
    let out = ditto(&[
        "run",
        "--trace",
        &repo_path("tests/data/replay_requests_excerpt.json"),
        "--max-num-seqs",
        "4",
        "--model",
        "llama-3.1-8b-instruct",
    ]);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["run"]["max_num_seqs"], 4);
    assert_eq!(summary["run"]["model"], "llama-3.1-8b-instruct");
}

#[test]
fn csv_and_jsonl_traces_replay_identically() {
    let csv = ditto(&["run", "--trace", &repo_path("tests/data/trace_small.csv")]);
    let jsonl = ditto(&["run", "--trace", &repo_path("tests/data/trace_small.jsonl")]);
    assert!(csv.status.success(), "{}", stderr(&csv));
    assert!(jsonl.status.success(), "{}", stderr(&jsonl));
    let a: serde_json::Value = serde_json::from_slice(&csv.stdout).unwrap();
    let b: serde_json::Value = serde_json::from_slice(&jsonl.stdout).unwrap();
    assert_eq!(a["e2e_ms"], b["e2e_ms"]);
    assert!(a["completed_requests"].as_u64().unwrap() > 0);
}

#[test]
fn traces_with_absolute_times_run_from_their_first_arrival() {
    // Regression: Unix-µs arrival times used to make the KV timeline (single instance) and
    // the signal refresh ticks (cluster) walk every interval since time 0.
    let dir = std::env::temp_dir().join(format!("ditto-abs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("absolute.csv");
    std::fs::write(
        &path,
        "arrival_us,input_tokens,output_tokens\n1700000000000000,500,50\n1700000000500000,700,40\n",
    )
    .unwrap();
    for extra in [&[][..], &["--instances", "2"][..]] {
        let mut args = vec!["run", "--trace", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = ditto(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(
            out.stdout.len() < 100_000,
            "{args:?}: {} bytes of output",
            out.stdout.len()
        );
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["completed_requests"], 2);
        assert!(
            summary["sim_duration_s"].as_f64().unwrap() < 10.0,
            "{args:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
