//! `ditto run` in cluster mode, end to end through the binary.
#![allow(clippy::unwrap_used)]

mod common;

use common::cli::ditto;
use std::process::Output;

fn json(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn default_cluster_run_is_byte_identical_and_complete() {
    let args = [
        "run",
        "--cluster",
        "default",
        "--num-requests",
        "400",
        "--rate",
        "30",
    ];
    let first = ditto(&args);
    let second = ditto(&args);
    assert_eq!(first.stdout, second.stdout);
    let summary = json(&first);
    assert_eq!(summary["injected_requests"], 400);
    assert_eq!(summary["completed_requests"], 400);
    assert_eq!(summary["rejected_requests"], 0);
    let instances = summary["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 4);
    let routed: u64 = instances
        .iter()
        .map(|i| i["routed_requests"].as_u64().unwrap())
        .sum();
    assert_eq!(routed, 400);
    let completed: u64 = instances
        .iter()
        .map(|i| i["completed_requests"].as_u64().unwrap())
        .sum();
    assert_eq!(
        completed, 400,
        "the cluster summary aggregates its instances"
    );
    for field in [
        "ttft_ms",
        "e2e_ms",
        "itl_ms",
        "tpot_ms",
        "scheduling_delay_ms",
    ] {
        assert!(
            instances[0][field]["p99"].is_number(),
            "instances carry the same fields"
        );
    }
    assert_eq!(summary["run"]["cluster"]["instances"], 4);
}

#[test]
fn quick_cluster_flags() {
    let summary = json(&ditto(&[
        "run",
        "--instances",
        "3",
        "--routing",
        "round-robin",
        "--num-requests",
        "90",
        "--refresh-interval-ms",
        "0",
    ]));
    let routed: Vec<u64> = summary["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["routed_requests"].as_u64().unwrap())
        .collect();
    assert_eq!(routed, vec![30, 30, 30]);
    assert_eq!(summary["run"]["cluster"]["routing"], "round-robin");
}

#[test]
fn cluster_flag_errors_exit_2() {
    for (args, needle) in [
        (vec!["run", "--instances", "0"], "--instances"),
        (
            vec!["run", "--instances", "2", "--routing", "fastest"],
            "--routing",
        ),
        (
            vec!["run", "--cluster", "/nonexistent/cluster.yaml"],
            "/nonexistent/cluster.yaml",
        ),
        (
            vec!["run", "--instances", "2", "--refresh-interval-ms=-1"],
            "--refresh-interval-ms",
        ),
    ] {
        let out = ditto(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let dir = std::env::temp_dir().join(format!("ditto-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "pools:\n  - name: a\n    engine: {max_num_batched_tokens: 0}\n",
    )
    .unwrap();
    let out = ditto(&["run", "--cluster", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pools[0].engine.max_num_batched_tokens")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn per_request_lines_name_the_instance() {
    let dir = std::env::temp_dir().join(format!("ditto-cluster-pr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("requests.jsonl");
    let out = ditto(&[
        "run",
        "--instances",
        "2",
        "--num-requests",
        "20",
        "--per-request",
        path.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 20);
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(value["instance"].as_str().unwrap().starts_with("instance-"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
