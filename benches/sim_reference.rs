//! The BLIS reference run (llama-3.1-8b-instruct, H100, TP1, roofline, 10,000 Poisson
//! requests at 20 req/s, gaussian 512/256 in [2, 7000] in and out, 26,312 blocks), timed end
//! to end: workload generation, simulation and summary.
#![allow(clippy::unwrap_used)]

use clap::Parser;
use criterion::{Criterion, criterion_group, criterion_main};
use ditto::cli::{Cli, Command, run};

fn reference_args(num_requests: &str) -> ditto::cli::RunArgs {
    let cli = Cli::try_parse_from([
        "ditto",
        "run",
        "--rate",
        "20",
        "--num-requests",
        num_requests,
        "--latency-model",
        "roofline",
        "--kv-sample-interval-s",
        "0",
    ])
    .unwrap();
    let Command::Run(args) = cli.command else {
        panic!("parsed a run command");
    };
    *args
}

fn bench_reference_run(c: &mut Criterion) {
    let args = reference_args("10000");
    let mut group = c.benchmark_group("sim_reference");
    group.sample_size(10);
    group.bench_function("blis_reference_10k", |b| {
        b.iter(|| {
            let result = run::execute(&args).unwrap();
            assert_eq!(result.output.summary.completed_requests, 10_000);
            result.output.summary.e2e_ms.mean
        })
    });
    group.finish();
}

criterion_group!(benches, bench_reference_run);
criterion_main!(benches);
