//! llm-d's P/D guide as a cluster file (docs/examples/pd-guide-gpt-oss-120b.yaml): it loads,
//! sizes gpt-oss-120b's hybrid KV cache (one group's page per block, the sliding group's
//! blocks set aside), prices its pulls from the full-attention layers, and a short stretch of
//! the guide's workload runs with every cluster invariant checked after every event. The
//! guide's full run (5,400 requests) is a release-build command in docs/disaggregation.md.
#![allow(clippy::unwrap_used)]

use ditto::catalog;
use ditto::cluster::Cluster;
use ditto::cluster::spec::{self, ClusterFileConfig};
use ditto::sim::RequestSpec;
use ditto::sim::capacity;

const GUIDE: &str = include_str!("../docs/examples/pd-guide-gpt-oss-120b.yaml");

fn guide_cluster() -> Cluster {
    let ClusterFileConfig {
        config,
        disaggregation,
        ..
    } = spec::parse_cluster_file(GUIDE, None).unwrap();
    Cluster::new_disaggregated(config, disaggregation.unwrap(), 7).unwrap()
}

#[test]
fn the_guide_file_loads_with_hybrid_kv_sizing() {
    let ClusterFileConfig { disaggregation, .. } = spec::parse_cluster_file(GUIDE, None).unwrap();
    let disagg = disaggregation.unwrap();
    let arch = catalog::model("gpt-oss-120b").unwrap();
    assert_eq!((arch.num_layers, arch.sliding_window_layers), (36, 18));
    // 8 prefill pods at TP 1 then 2 decode pods at TP 4, block size 128 each; a pull moves
    // the 18 full-attention layers' KV (2 x 64 x 8 heads x 2 bytes each, split over the
    // ranks), the sliding layers' window being a few blocks.
    assert_eq!(disagg.kv.len(), 10);
    for (index, kv) in disagg.kv.iter().enumerate() {
        let tp = if index < 8 { 1 } else { 4 };
        assert_eq!((kv.tp, kv.block_size), (tp, 128), "instance {index}");
        assert_eq!(
            kv.bytes_per_token_per_rank,
            18.0 * 2.0 * 64.0 * 8.0 * 2.0 / f64::from(tp)
        );
    }
    let cluster = guide_cluster();
    let engines = cluster.engines();
    let gpu = catalog::gpu("H200").unwrap();
    for (index, engine) in engines.iter().enumerate() {
        let tp = if index < 8 { 1 } else { 4 };
        let blocks = engine.config().num_gpu_blocks;
        assert_eq!(
            blocks,
            capacity::num_gpu_blocks(&arch, &gpu, tp, 0.9, 128).unwrap()
        );
        // Paging one group of 18 layers holds about twice the tokens all 36 would.
        let mut flat = arch.clone();
        flat.sliding_window_layers = 0;
        let flat_blocks = capacity::num_gpu_blocks(&flat, &gpu, tp, 0.9, 128).unwrap();
        let reserve = capacity::sliding_reserve(&arch, 128) as u32;
        assert_eq!(reserve, 3 * 256);
        assert!(
            blocks + reserve >= 2 * flat_blocks && blocks + reserve <= 2 * flat_blocks + 1,
            "{blocks} + {reserve} vs {flat_blocks}"
        );
    }
}

#[test]
fn gpt_oss_prices_mxfp4_experts_and_bf16_rest() {
    let arch = catalog::model("gpt-oss-120b").unwrap();
    // 36 x 128 x 3 x 2880^2 expert parameters at 4.25 bits, the rest (attention, router,
    // embeddings, LM head, norms) in bf16: 64.7 GB (the checkpoint is about 65 GB: BLIS's
    // attention count takes the query width as hidden, 2880, not 4096).
    let experts = 36.0 * 128.0 * 3.0 * 2880.0 * 2880.0;
    let expert_bytes = capacity::routed_expert_weight_bytes(&arch) as f64;
    assert!(
        (expert_bytes - experts * 0.53125).abs() < 1.0,
        "{expert_bytes}"
    );
    let weights = capacity::model_weight_bytes(&arch) as f64;
    assert!((weights / 1e9 - 64.66).abs() < 0.01, "{weights}");
}

#[test]
fn a_stretch_of_the_guide_workload_runs_with_every_invariant() {
    let mut cluster = guide_cluster();
    // The guide's `20_1_isl_osl` at 45 req/s constant: 5,151-token random prompts, 250
    // output tokens; 20 requests (under half a second) keep a debug build quick.
    let requests = 20u64;
    for id in 0..requests {
        let arrival_us = id * 1_000_000 / 45;
        cluster
            .submit(RequestSpec::synthetic(id, arrival_us, 5_151, 250))
            .unwrap();
    }
    let mut events = 0u64;
    while cluster.process_next_event().is_some() {
        events += 1;
        assert!(events < 5_000_000, "runaway");
        if let Err(err) = cluster.check_invariants() {
            panic!("after event {events} at {} µs: {err}", cluster.now_us());
        }
    }
    let summary = cluster.summary();
    assert_eq!(summary.total.counts.completed, requests);
    let pd = summary.disaggregation.unwrap();
    assert_eq!((pd.disaggregated, pd.decode_only), (requests, 0));
    assert_eq!(pd.failed_pulls, 0);
    // Every request ended on one of the two decode pods; the prefill pods shared them.
    let routed = cluster.routed_counts();
    assert_eq!(
        routed[8..].iter().map(|&n| u64::from(n)).sum::<u64>(),
        requests
    );
    assert_eq!(
        routed[..8].iter().map(|&n| u64::from(n)).sum::<u64>(),
        requests
    );
    // Spread across the prefill pods: twenty requests in under half a second reach at least
    // six of the eight (since stop 40's refit a 5,151-token prefill is dearer, so a pod stays
    // busy longer and one may take none in this stretch).
    assert!(
        routed[..8].iter().filter(|&&n| n > 0).count() >= 6,
        "{routed:?}"
    );
    // The client's TTFT holds the prefill pod's token and the hand-over after it.
    assert!(summary.total.ttft.mean >= pd.prefill_ttft.mean + pd.handover.mean - 1e-6);
    assert!(pd.transfer.mean > 3.0, "NIXL's setup alone is 3 ms");
    // Nothing is left held or reserved.
    for engine in cluster.engines() {
        assert_eq!(engine.kv().used_blocks(), 0);
    }
}

mod common;

#[test]
fn the_pd_sweep_reports_attainment_and_gpus_per_split() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/cluster_pd.yaml");
    let args = [
        "run",
        "--cluster",
        path,
        "--num-requests",
        "60",
        "--rate",
        "20",
        "--input-tokens",
        "2000,500,100,4000",
        "--output-tokens",
        "50,10,1,100",
        "--pd-sweep",
        "1-2:1-2",
        "--pd-sweep-slo",
        "ttft_ms=400,tpot_ms=50,attainment=0.8",
    ];
    let out = common::cli::ditto(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let splits = json["splits"].as_array().unwrap();
    let shape: Vec<(u64, u64, u64)> = splits
        .iter()
        .map(|s| {
            (
                s["prefill"].as_u64().unwrap(),
                s["decode"].as_u64().unwrap(),
                s["gpus"].as_u64().unwrap(),
            )
        })
        .collect();
    // The file's prefill pods run at TP 1, its decode pods at TP 2.
    assert_eq!(shape, vec![(1, 1, 3), (1, 2, 5), (2, 1, 4), (2, 2, 6)]);
    for split in splits {
        assert_eq!(split["completed"], 60);
        let attainment = split["slo_attainment"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&attainment));
        assert_eq!(split["meets_target"], attainment >= 0.8);
    }
    // More prefill pods never lengthen the median TTFT here.
    let ttft = |i: usize| splits[i]["ttft_ms"]["p50"].as_f64().unwrap();
    assert!(ttft(2) <= ttft(0), "{} vs {}", ttft(2), ttft(0));
    // `best` is the fewest-GPU split meeting the target, if any.
    let meeting: Vec<&serde_json::Value> = splits
        .iter()
        .filter(|s| s["meets_target"] == true)
        .collect();
    match meeting.iter().min_by_key(|s| s["gpus"].as_u64().unwrap()) {
        Some(best) => assert_eq!(json["best"]["gpus"], best["gpus"]),
        None => assert!(json["best"].is_null()),
    }
    // Bad ranges name the flag and exit 2.
    let mut bad = args;
    bad[14] = "3-1:1";
    let out = common::cli::ditto(&bad);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--pd-sweep"));
}
