//! `ditto run --cpu-offload-gb`: weights held in host memory slow every step by their bytes
//! over the GPU's host link and give their GPU memory to the KV cache; bad values exit 2.
//!
//! The expected figures are worked out here from the model's config.json and
//! data/gpu_host_link.json, walking the parameters as vLLM's offloader does (decoder layers
//! in order, whole parameters, checked before each), not taken from ditto's code.
#![allow(clippy::unwrap_used)]

mod common;

use common::cli::ditto;
use std::process::Output;

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn repo_json(relative: &str) -> serde_json::Value {
    let path = format!("{}/{relative}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Bytes vLLM moves to the host for Llama-3.1-8B at TP 1 under `gib` GiB, from its config.
fn llama_8b_offloaded_bytes(gib: u64) -> u64 {
    let config = repo_json("data/model_configs/llama-3.1-8b-instruct/config.json");
    let field = |name: &str| config[name].as_u64().unwrap();
    let (d, heads, kv_heads, d_ff) = (
        field("hidden_size"),
        field("num_attention_heads"),
        field("num_key_value_heads"),
        field("intermediate_size"),
    );
    let head_dim = d / heads;
    // bf16; per layer: qkv_proj, o_proj, gate_up_proj, down_proj, two RMSNorms.
    let layer = [
        d * (heads + 2 * kv_heads) * head_dim * 2,
        heads * head_dim * d * 2,
        2 * d_ff * d * 2,
        d_ff * d * 2,
        d * 2,
        d * 2,
    ];
    let budget = gib << 30;
    let mut moved = 0;
    for _ in 0..field("num_hidden_layers") {
        for bytes in layer {
            if moved >= budget {
                return moved;
            }
            moved += bytes;
        }
    }
    moved
}

/// One request alone, with every inter-token gap written to a per-request file.
fn single_request(extra: &[&str], tag: &str) -> (serde_json::Value, Vec<u64>) {
    let dir = std::env::temp_dir().join(format!("ditto-offload-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("requests.jsonl");
    let mut args = vec![
        "run",
        "--num-requests",
        "1",
        "--input-tokens",
        "300,0,300,300",
        "--output-tokens",
        "24,0,24,24",
        "--per-request",
        path.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = ditto(&args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let line: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&path).unwrap().trim()).unwrap();
    let gaps = line["itl_us"]
        .as_array()
        .unwrap()
        .iter()
        .map(|gap| gap.as_u64().unwrap())
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    (summary, gaps)
}

#[test]
fn offloaded_weights_slow_every_step_by_their_pcie_time_and_grow_the_kv_cache() {
    let bytes = llama_8b_offloaded_bytes(2);
    let link_gbs = repo_json("data/gpu_host_link.json")["H100"]["HostLinkGBs"]
        .as_f64()
        .unwrap();
    let per_step_us = bytes as f64 / (link_gbs * 1e3);
    let block_bytes = 32 * 2 * 8 * 128 * 2 * 16; // layers · K,V · kv heads · head dim · bf16 · tokens
    for model in ["calibrated", "roofline", "physics"] {
        let (plain, plain_gaps) = single_request(&["--latency-model", model], model);
        let flags = ["--latency-model", model, "--cpu-offload-gb", "2"];
        let (offloaded, gaps) = single_request(&flags, &format!("{model}-2"));
        assert_eq!(gaps.len(), plain_gaps.len());
        for (slow, fast) in gaps.iter().zip(&plain_gaps) {
            let added = *slow as f64 - *fast as f64;
            assert!(
                (added - per_step_us).abs() <= 1.0,
                "{model}: a decode step grew by {added} µs, expected {per_step_us:.1}"
            );
        }
        let grown = offloaded["run"]["num_gpu_blocks"].as_i64().unwrap()
            - plain["run"]["num_gpu_blocks"].as_i64().unwrap();
        let expected = (bytes / block_bytes) as i64;
        assert!(
            (grown - expected).abs() <= 1,
            "{model}: {grown} more KV blocks, expected {expected}"
        );
    }
}

#[test]
fn zero_offload_changes_nothing() {
    let plain = ditto(&["run", "--num-requests", "40"]);
    let zero = ditto(&["run", "--num-requests", "40", "--cpu-offload-gb", "0"]);
    assert!(plain.status.success() && zero.status.success());
    assert_eq!(plain.stdout, zero.stdout);
}

#[test]
fn bad_offloads_exit_2_naming_the_flag() {
    let cases: &[&[&str]] = &[
        &["run", "--cpu-offload-gb=-1"],
        &["run", "--cpu-offload-gb", "NaN"],
        &["run", "--cpu-offload-gb", "inf"],
        // Llama-3.1-8B has 13 GiB of decoder layers (~15 GiB of weights): 20 is more.
        &["run", "--cpu-offload-gb", "20"],
        // Blackbox coefficients are fitted per run and have no weights term.
        &[
            "run",
            "--latency-model",
            "blackbox",
            "--cpu-offload-gb",
            "1",
        ],
    ];
    for args in cases {
        let out = ditto(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("cpu-offload-gb"),
            "{args:?}: stderr lacks the flag: {}",
            stderr(&out)
        );
        assert!(out.stdout.is_empty(), "{args:?} printed a summary");
    }
}

#[test]
fn a_cluster_pool_offloads_and_refuses_bad_values_by_field_path() {
    let dir = std::env::temp_dir().join(format!("ditto-offload-yaml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, offload: &str| {
        let path = dir.join(name);
        let yaml = format!(
            "pools:\n  - name: p\n    replicas: 1\n    engine:\n      cpu_offload_gb: {offload}\n"
        );
        std::fs::write(&path, yaml).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let good = write("good.yaml", "2");
    let out = ditto(&["run", "--cluster", &good, "--num-requests", "20"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for (name, value) in [("negative.yaml", "-2"), ("too_much.yaml", "40")] {
        let path = write(name, value);
        let out = ditto(&["run", "--cluster", &path, "--num-requests", "20"]);
        assert_eq!(out.status.code(), Some(2), "{value}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("pools[0].engine.cpu_offload_gb"),
            "{value}: {}",
            stderr(&out)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
