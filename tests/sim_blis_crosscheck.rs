//! Cross-check against the published Go simulator (BLIS) on its reference run:
//! llama-3.1-8b-instruct, H100, TP1, roofline, 10,000 Poisson requests at 20 req/s, input and
//! output gaussian 512/256 clamped to [2, 7000], 26,312 GPU blocks, defaults otherwise.
//! BLIS reported TTFT mean 21.05 ms, E2E mean 3303 ms, ITL mean 6.45 ms and 0 preemptions.
//! Arrivals differ by RNG, so only means compare: E2E and ITL within 3 %, TTFT within 10 %.
#![allow(clippy::unwrap_used)]

use clap::Parser;
use ditto::cli::{Cli, Command, run};

const BLIS_TTFT_MEAN_MS: f64 = 21.05;
const BLIS_E2E_MEAN_MS: f64 = 3303.0;
const BLIS_ITL_MEAN_MS: f64 = 6.45;

fn relative_error(ours: f64, theirs: f64) -> f64 {
    (ours - theirs).abs() / theirs
}

#[test]
fn reference_run_matches_blis_means() {
    let cli = Cli::try_parse_from([
        "ditto",
        "run",
        "--model",
        "llama-3.1-8b-instruct",
        "--gpu",
        "H100",
        "--tp",
        "1",
        "--latency-model",
        "roofline",
        "--num-requests",
        "10000",
        "--rate",
        "20",
        "--arrival",
        "poisson",
        "--input-tokens",
        "512,256,2,7000",
        "--output-tokens",
        "512,256,2,7000",
        "--seed",
        "42",
    ])
    .unwrap();
    let Command::Run(args) = cli.command else {
        panic!("parsed a run command");
    };
    let result = run::execute(&args).unwrap();
    let summary = &result.output.summary;
    // The KV capacity is derived from GPU memory exactly as BLIS derives it.
    assert_eq!(result.output.run.num_gpu_blocks, 26_312);
    assert_eq!(summary.completed_requests, 10_000);
    assert_eq!(summary.preemptions, 0);
    let e2e = relative_error(summary.e2e_ms.mean, BLIS_E2E_MEAN_MS);
    let itl = relative_error(summary.itl_ms.mean, BLIS_ITL_MEAN_MS);
    let ttft = relative_error(summary.ttft_ms.mean, BLIS_TTFT_MEAN_MS);
    eprintln!(
        "ditto vs BLIS: E2E {:.1} vs {BLIS_E2E_MEAN_MS} ms ({:.2} %), ITL {:.3} vs {BLIS_ITL_MEAN_MS} ms ({:.2} %), TTFT {:.2} vs {BLIS_TTFT_MEAN_MS} ms ({:.2} %)",
        summary.e2e_ms.mean,
        e2e * 100.0,
        summary.itl_ms.mean,
        itl * 100.0,
        summary.ttft_ms.mean,
        ttft * 100.0
    );
    assert!(e2e < 0.03, "E2E mean off by {:.2} %", e2e * 100.0);
    assert!(itl < 0.03, "ITL mean off by {:.2} %", itl * 100.0);
    assert!(ttft < 0.10, "TTFT mean off by {:.2} %", ttft * 100.0);
}
