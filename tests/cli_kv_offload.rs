//! vLLM's native KV-offload connector (`OffloadingConnector`, `cpu_bytes_to_use`) from
//! `ditto run --kv-offload-cpu-bytes N` and from a cluster pool's `engine.offload_connector`
//! map: a CPU tier smaller than the running requests' own blocks makes every step's failed
//! stores walk the whole tier (slower runs), one that never fills changes nothing, and bad
//! values exit 2 naming the flag or the field path.
//!
//! The sizes: Llama-3.1-8B's 16-token block is 2 MiB of KV (K and V, bf16, 32 layers x 8
//! KV heads x 128), so 8 GiB is a 4096-entry tier, fewer blocks than 40 requests/s of
//! ~1000-token sequences keep running on an H100; 1 TiB (524288 entries) is more than the
//! GPU's ~26000 blocks and every block the run ever stores.
#![allow(clippy::unwrap_used)]

mod common;

use common::cli::ditto;
use std::process::Output;

const SMALL_TIER: &str = "8589934592";
const HUGE_TIER: &str = "1099511627776";

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The summary of a loaded run (300 requests at 40/s) with `extra` flags.
fn summary(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["run", "--num-requests", "300", "--rate", "40"];
    args.extend_from_slice(extra);
    let out = ditto(&args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What a run's requests saw (not its wall-clock `run` section).
fn latencies(summary: &serde_json::Value) -> [serde_json::Value; 5] {
    ["sim_duration_s", "ttft_ms", "e2e_ms", "itl_ms", "steps"].map(|key| summary[key].clone())
}

#[test]
fn a_full_cpu_tier_slows_the_run_and_one_that_never_fills_changes_nothing() {
    let none = summary(&[]);
    let small = summary(&["--kv-offload-cpu-bytes", SMALL_TIER]);
    let huge = summary(&["--kv-offload-cpu-bytes", HUGE_TIER]);
    let duration = |s: &serde_json::Value| s["sim_duration_s"].as_f64().unwrap();
    let p90_e2e = |s: &serde_json::Value| s["e2e_ms"]["p90"].as_f64().unwrap();
    assert_eq!(small["completed_requests"], 300);
    assert!(
        duration(&small) > 1.2 * duration(&none),
        "{} vs {}",
        duration(&small),
        duration(&none)
    );
    assert!(p90_e2e(&small) > 1.2 * p90_e2e(&none));
    assert_eq!(latencies(&huge), latencies(&none));
}

#[test]
fn bad_connector_sizes_exit_2_naming_the_flag() {
    for value in ["0", "-1", "lots", "1.5"] {
        let flag = format!("--kv-offload-cpu-bytes={value}");
        let out = ditto(&["run", "--num-requests", "3", &flag]);
        assert_eq!(out.status.code(), Some(2), "{value}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("--kv-offload-cpu-bytes"),
            "{value}: {}",
            stderr(&out)
        );
        assert!(out.stdout.is_empty(), "{value} printed a summary");
    }
}

#[test]
fn a_cluster_pool_s_connector_slows_it_and_bad_maps_name_the_field_path() {
    let dir = std::env::temp_dir().join(format!("ditto-kv-offload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, engine: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("pools:\n  - name: p\n    engine:\n{engine}")).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let plain = write("plain.yaml", "      max_num_seqs: 256\n");
    let small = write(
        "small.yaml",
        &format!("      offload_connector:\n        cpu_bytes_to_use: {SMALL_TIER}\n"),
    );
    let huge = write(
        "huge.yaml",
        &format!("      offload_connector: {{cpu_bytes_to_use: {HUGE_TIER}}}\n"),
    );
    let [plain, small, huge] = [plain, small, huge].map(|file| summary(&["--cluster", &file]));
    let duration = |s: &serde_json::Value| s["sim_duration_s"].as_f64().unwrap();
    assert!(duration(&small) > 1.2 * duration(&plain));
    assert_eq!(latencies(&huge), latencies(&plain));
    for (name, engine, field) in [
        (
            "zero.yaml",
            "      offload_connector: {cpu_bytes_to_use: 0}\n",
            "pools[0].engine.offload_connector.cpu_bytes_to_use",
        ),
        (
            "price.yaml",
            "      offload_connector: {cpu_bytes_to_use: 8, walk_ns_per_entry: -3}\n",
            "pools[0].engine.offload_connector.walk_ns_per_entry",
        ),
        (
            "blocks.yaml",
            "      offload_connector: {num_cpu_blocks: 8}\n",
            "num_cpu_blocks",
        ),
    ] {
        let path = write(name, engine);
        let out = ditto(&["run", "--cluster", &path, "--num-requests", "20"]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(field), "{name}: {}", stderr(&out));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
