//! Disaggregated clusters (docs/disaggregation.md): llm-d's decider keeps short and mostly
//! cached prompts decode-only, the transfer model prices block size as vLLM measured, a P/D
//! run conserves requests per role, and randomized P/D pools keep every invariant after every
//! event.
#![allow(clippy::unwrap_used)]

use ditto::catalog;
use ditto::catalog::kv_connectors::{kv_connector, kv_link};
use ditto::cluster::Cluster;
use ditto::cluster::disagg::{InstanceKv, TransferModel};
use ditto::cluster::spec::{self, ClusterFileConfig};
use ditto::sim::metrics::Outcome;
use ditto::sim::{RequestSpec, SloClass};

fn yaml(prefill: u32, decode: u32, extra: &str) -> String {
    format!(
        "{}disaggregation:
  decider: {{non_cached_tokens: 256}}
{extra}",
        common::pd::pools_yaml(prefill, decode)
    )
}

fn cluster(text: &str, seed: u64) -> Cluster {
    let ClusterFileConfig {
        config,
        disaggregation,
        ..
    } = spec::parse_cluster_file(text, None).unwrap();
    Cluster::new_disaggregated(config, disaggregation.unwrap(), seed).unwrap()
}

fn run_checked(cluster: &mut Cluster, requests: Vec<RequestSpec>) {
    for spec in requests {
        cluster.submit(spec).unwrap();
    }
    let mut events = 0u64;
    while cluster.process_next_event().is_some() {
        events += 1;
        assert!(events < 2_000_000, "runaway");
        if let Err(err) = cluster.check_invariants() {
            panic!("after event {events} at {} µs: {err}", cluster.now_us());
        }
    }
}

#[test]
fn short_or_mostly_cached_prompts_stay_decode_only() {
    let mut pd = cluster(&yaml(2, 1, ""), 1);
    let requests = vec![
        // Short: 200 uncached tokens < 256.
        RequestSpec::synthetic(1, 0, 200, 4),
        // Long and uncached: remote prefill.
        RequestSpec::synthetic(2, 1_000, 2_000, 4).with_prefix(5, 1_984),
        // The same 1,984-token prefix, now believed cached on the decode pod (the decode
        // profile's approximate index recorded it): 16 + a partial block uncached.
        RequestSpec::synthetic(3, 2_000_000, 2_000, 4).with_prefix(5, 1_984),
        // A long prompt with a different prefix: remote again.
        RequestSpec::synthetic(4, 2_001_000, 2_000, 4).with_prefix(6, 1_984),
    ];
    run_checked(&mut pd, requests);
    let summary = pd.summary();
    let disagg = summary.disaggregation.unwrap();
    assert_eq!((disagg.disaggregated, disagg.decode_only), (2, 2));
    assert_eq!(summary.total.counts.completed, 4);
    assert_eq!(summary.total.counts.injected, 4);
    // The prefill pods served only the two long, uncached prompts.
    let routed: u32 = pd.routed_counts()[..2].iter().sum();
    assert_eq!(routed, 2);
    // Every client request ended once, on the decode pod.
    let decode_records = &pd.engines()[2].metrics().records;
    assert_eq!(decode_records.len(), 4);
    assert!(
        decode_records
            .iter()
            .all(|r| r.outcome == Outcome::Completed)
    );
}

#[test]
fn the_decider_threshold_zero_turns_disaggregation_off() {
    let text = yaml(1, 1, "").replace("non_cached_tokens: 256", "non_cached_tokens: 0");
    let mut pd = cluster(&text, 3);
    run_checked(
        &mut pd,
        (0..20)
            .map(|i| RequestSpec::synthetic(i, i * 10_000, 3_000, 3))
            .collect(),
    );
    let disagg = pd.summary().disaggregation.unwrap();
    assert_eq!((disagg.disaggregated, disagg.decode_only), (0, 20));
    assert_eq!(pd.routed_counts()[0], 0, "the prefill pod got nothing");
}

#[test]
fn a_disaggregated_request_pays_prefill_transfer_and_a_one_token_recompute() {
    let text = yaml(
        1,
        1,
        "  bandwidth_gb_s: 1.0\n  descriptor_us: 0\n  setup_us: 500\n",
    );
    let mut pd = cluster(&text, 1);
    run_checked(&mut pd, vec![RequestSpec::synthetic(1, 0, 1_000, 3)]);
    let summary = pd.summary();
    let disagg = summary.disaggregation.unwrap();
    // The pull: 999 tokens of llama-3.1-8b KV (131,072 bytes a token at TP 1) at 1 GB/s
    // = 130,940 µs (rounded up) + 500 µs setup.
    let expected_us = 500 + (999.0_f64 * 131_072.0 / 1e3).ceil() as u64;
    assert_eq!(disagg.transfer.count, 1);
    assert!((disagg.transfer.mean - expected_us as f64 / 1e3).abs() < 1e-9);
    // The client's TTFT: prefill (1000 + 1000 µs) + pull + the one-token step (1001 µs).
    let record = &pd.engines()[1].metrics().records[0];
    assert_eq!(record.first_token_us, Some(2_000 + expected_us + 1_001));
    assert_eq!(
        summary.total.ttft.mean,
        (2_000 + expected_us + 1_001) as f64 / 1e3
    );
    assert_eq!(summary.total.counts.completed, 1);
}

/// vLLM RFC 50913: a ~5k-token pull takes a ~105 ms transfer window at block size 16 and
/// ~58 ms less at 64 (~8 KB descriptors). The catalog's NIXL descriptor cost reproduces the
/// difference on the geometry it was fitted on (Llama-3.1-70B at TP 4: 8 KB per block per
/// layer per plane per rank at block size 16).
#[test]
fn block_size_16_pulls_cost_more_than_64_as_vllm_measured() {
    let arch = catalog::model("llama-3.1-70b-instruct").unwrap();
    let connector = kv_connector("nixl").unwrap();
    let link = kv_link("rdma-400g").unwrap();
    let model = TransferModel {
        bandwidth_gb_s: link.bandwidth_gb_s,
        descriptor_us: connector.descriptor_us,
        setup_us: connector.setup_us,
    };
    let kv = |block_size| InstanceKv {
        bytes_per_token_per_rank: arch.kv_bytes_per_token(4),
        layers: arch.num_layers,
        planes: 2,
        tp: 4,
        block_size,
    };
    assert_eq!(arch.kv_bytes_per_block(4, 16), 16 * 80 * 2 * 512);
    let at16 = model.transfer_us(&kv(16), &kv(16), 5_000);
    let at64 = model.transfer_us(&kv(64), &kv(64), 5_000);
    let saved_ms = (at16 - at64) as f64 / 1e3;
    assert!((saved_ms - 58.0).abs() < 58.0 * 0.05, "saved {saved_ms} ms");
    // And the window at 16 lands near the measured ~105 ms (the link is an assumption).
    assert!((80_000..=120_000).contains(&at16), "{at16} µs");
}

#[test]
fn randomized_pd_pools_keep_every_invariant() {
    let policies = [
        "",
        "  prefill_routing: {policy: round-robin}\n",
        "  prefill_routing: {policy: least-loaded}\n",
    ];
    for seed in 0..4u64 {
        let prefill = 1 + (seed % 3) as u32;
        let decode = 1 + (seed / 3 % 2) as u32;
        let mut text = yaml(prefill, decode, policies[seed as usize % 3]);
        if seed % 4 == 1 {
            // A pool of both roles joins: it serves either half.
            text = text.replace(
                "disaggregation:",
                "  - name: b
    role: both
    latency_model: blackbox
    coefficients: {alpha: [0, 0, 0], beta: [1000, 1, 10]}
    engine: {num_gpu_blocks: 600, max_model_len: 16384}
disaggregation:",
            );
        }
        if seed % 3 == 2 {
            text.push_str("staleness: {refresh_interval_ms: 0}\n");
        }
        let mut pd = cluster(&text, seed);
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
        let mut arrival = 0;
        let requests: Vec<RequestSpec> = (0..40u64)
            .map(|id| {
                arrival += next(20_000);
                let input = 1 + next(4_000) as u32;
                let output = next(60) as u32;
                let mut spec = RequestSpec::synthetic(id, arrival, input, output);
                if next(3) == 0 {
                    spec = spec.with_prefix(next(4), input.min(1 + next(3_000) as u32));
                }
                if next(5) == 0 {
                    spec.deadline_us = Some(arrival + next(400_000));
                }
                if next(4) == 0 {
                    spec = spec.with_class(SloClass::Batch);
                }
                spec
            })
            .collect();
        run_checked(&mut pd, requests);
        let summary = pd.summary();
        let counts = summary.total.counts;
        assert!(counts.is_conserved(), "seed {seed}: {counts:?}");
        assert_eq!(counts.injected, 40, "seed {seed}");
        assert_eq!(counts.queued + counts.running, 0, "seed {seed}");
        for engine in pd.engines() {
            assert_eq!(
                engine.kv().used_blocks(),
                0,
                "seed {seed}: blocks left held"
            );
            assert!(engine.transferring_ids().is_empty());
        }
        let disagg = summary.disaggregation.unwrap();
        assert_eq!(disagg.disaggregated + disagg.decode_only, 40, "seed {seed}");
        assert!(
            disagg.disaggregated > 0,
            "seed {seed}: nothing disaggregated"
        );
    }
}

#[test]
fn the_yaml_names_bad_roles_links_and_orders() {
    let cases = [
        (
            yaml(1, 1, "").replace("role: prefill", "role: encode"),
            "pools[0].role",
        ),
        (
            yaml(1, 1, "  link: carrier-pigeon\n"),
            "disaggregation.link",
        ),
        (
            yaml(1, 1, "  connector: smoke-signals\n"),
            "disaggregation.connector",
        ),
        (
            yaml(1, 1, "  stage_order: sideways-first\n"),
            "disaggregation.stage_order",
        ),
        (
            // llm-d refuses a prefill decider in the prefill-first order.
            yaml(1, 1, "  stage_order: prefill-first\n"),
            "disaggregation.decider",
        ),
        (
            yaml(1, 1, "  prefill_failure_rate: 1.5\n"),
            "disaggregation.prefill_failure_rate",
        ),
        (
            yaml(1, 1, "  transfer_failure_rate: -0.1\n"),
            "disaggregation.transfer_failure_rate",
        ),
        (
            yaml(1, 1, "  prefill_max_retries: 1000\n"),
            "disaggregation.prefill_max_retries",
        ),
        (
            yaml(1, 1, "  prefill_retry_backoff_ms: 0\n"),
            "disaggregation.prefill_retry_backoff_ms",
        ),
        (
            yaml(1, 1, "  bandwidth_gb_s: 0\n"),
            "disaggregation.bandwidth_gb_s",
        ),
        (
            yaml(1, 1, "  prefill_routing: {policy: teleport}\n"),
            "disaggregation.prefill_routing",
        ),
        (
            yaml(1, 1, "").replace("role: decode", "role: prefill"),
            "pools",
        ),
    ];
    for (text, field) in cases {
        let err = spec::parse_cluster_file(&text, None)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(field), "{field}: {err}");
    }
    // A pool with an unknown field is still refused.
    let text = yaml(1, 1, "").replace("replicas: 1", "replicas: 1\n    colour: red");
    assert!(spec::parse_cluster_file(&text, None).is_err());
}

mod common;

#[test]
fn ditto_run_with_a_pd_cluster_file_reports_per_role_metrics() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/cluster_pd.yaml");
    let args = [
        "run",
        "--cluster",
        path,
        "--num-requests",
        "200",
        "--rate",
        "8",
        "--input-tokens",
        "2000,500,100,4000",
        "--output-tokens",
        "100,20,1,200",
    ];
    let out = common::cli::ditto(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["completed_requests"], 200);
    let pd = &json["disaggregation"];
    assert_eq!(pd["roles"], serde_json::json!([2, 1, 0]));
    assert_eq!(pd["disaggregated_requests"], 200, "every prompt is long");
    for key in [
        "prefill_queue_ms",
        "transfer_ms",
        "decode_wait_ms",
        "handover_ms",
    ] {
        assert_eq!(pd[key]["count"], 200, "{key}");
    }
    assert!(
        pd["transfer_ms"]["mean"].as_f64().unwrap() > 3.0,
        "setup is 3 ms"
    );
    assert!(
        json["run"]["cluster"]["routing"]
            .as_str()
            .unwrap()
            .starts_with("disagg-profile-handler"),
    );
    // The same run twice is byte-identical.
    assert_eq!(out.stdout, common::cli::ditto(&args).stdout);
    // The decode pod saw every request; the prefill pods shared them.
    let routed: Vec<u64> = json["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["routed_requests"].as_u64().unwrap())
        .collect();
    assert_eq!(routed[2], 200);
    assert_eq!(routed[0] + routed[1], 200);
}

#[test]
fn routing_pd_needs_a_cluster_file() {
    let out = common::cli::ditto(&["run", "--instances", "2", "--routing", "pd"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--routing"));
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/cluster_pd.yaml");
    let out = common::cli::ditto(&["run", "--cluster", path, "--routing", "round-robin"]);
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        json.get("disaggregation").is_none(),
        "--routing replaces the handler"
    );
    // A file with roles but no disaggregation section: `--routing pd` adds llm-d's defaults.
    let text = std::fs::read_to_string(path).unwrap();
    let plain = text[..text.find("disaggregation:").unwrap()].to_owned();
    let file = std::env::temp_dir().join(format!("ditto-pd-roles-{}.yaml", std::process::id()));
    std::fs::write(&file, plain).unwrap();
    let file_arg = file.to_str().unwrap();
    let out = common::cli::ditto(&["run", "--cluster", file_arg, "--num-requests", "20"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        json.get("disaggregation").is_none(),
        "roles alone do not disaggregate"
    );
    let args = [
        "run",
        "--cluster",
        file_arg,
        "--num-requests",
        "20",
        "--routing",
        "pd",
    ];
    let out = common::cli::ditto(&args);
    std::fs::remove_file(&file).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["disaggregation"]["non_cached_tokens"], 16);
    assert_eq!(json["disaggregation"]["bandwidth_gb_s"], 50.0);
    assert_eq!(json["completed_requests"], 20);
}

#[test]
fn disaggregated_runs_match_the_reference_stepper() {
    // The engines' shortcuts (lazy decode windows with prefills and admissions beside them)
    // give byte-identical records with held, reserved and pulled requests about.
    for seed in 0..4u64 {
        let text = yaml(2, 1 + (seed % 2) as u32, "");
        let requests: Vec<RequestSpec> = (0..80u64)
            .map(|i| {
                let input = 50 + ((i * 7919 + seed * 31) % 3_000) as u32;
                let output = 1 + ((i * 104_729 + seed) % 120) as u32;
                RequestSpec::synthetic(i, i * 4_000, input, output).with_prefix(i % 3, 512)
            })
            .collect();
        let mut fast = cluster(&text, seed);
        let mut reference = cluster(&text, seed);
        reference.set_reference_stepper(true);
        fast.run(requests.clone(), u64::MAX).unwrap();
        reference.run(requests, u64::MAX).unwrap();
        let lazy: u64 = fast.engines().iter().map(|e| e.lazy_steps()).sum();
        assert!(lazy > 0, "seed {seed}: no window opened");
        for (a, b) in fast.engines().iter().zip(reference.engines()) {
            assert_eq!(a.metrics().records, b.metrics().records, "seed {seed}");
        }
        assert_eq!(fast.summary(), reference.summary(), "seed {seed}");
    }
}

#[test]
fn a_pull_outlasting_the_prefill_hold_fails_and_the_decode_recomputes() {
    // The pull takes ~131 ms (1 GB/s); the prefill pod holds the KV for 50 ms only
    // (VLLM_NIXL_ABORT_REQUEST_TIMEOUT), then frees it: the pull fails at its end and the
    // decode pod computes the whole prompt itself.
    let extra = "  bandwidth_gb_s: 1.0\n  descriptor_us: 0\n  setup_us: 500\n  abort_request_timeout_s: 0.05\n";
    let mut pd = cluster(&yaml(1, 1, extra), 1);
    run_checked(&mut pd, vec![RequestSpec::synthetic(1, 0, 1_000, 3)]);
    let summary = pd.summary();
    let disagg = summary.disaggregation.unwrap();
    assert_eq!(disagg.failed_pulls, 1);
    assert_eq!(summary.total.counts.completed, 1);
    // The prefill freed its KV at 2,000 + 50,000 µs, long before the pull's end.
    assert_eq!(pd.engines()[0].kv().used_blocks(), 0);
    // After the failed pull (ends at 2,000 + 131,441 µs) the decode pod prefills 1,000
    // tokens (1,000 + 1,000 µs).
    let record = &pd.engines()[1].metrics().records[0];
    assert_eq!(record.first_token_us, Some(2_000 + 131_441 + 2_000));
    let text = yaml(1, 1, "  abort_request_timeout_s: -1\n");
    let err = spec::parse_cluster_file(&text, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("disaggregation.abort_request_timeout_s"),
        "{err}"
    );
}
