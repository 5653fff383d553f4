//! The BLIS reference run (llama-3.1-8b-instruct, H100, TP1, roofline, Poisson 20 req/s,
//! gaussian 512/256 in [2, 7000] in and out, 26,312 blocks) at 10,000 and 100,000 requests,
//! timed end to end: workload generation, simulation and summary. `ditto bench` also runs
//! 1,000,000.
#![allow(clippy::unwrap_used)]

/// The allocator the `ditto` binary uses, so the benches measure what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
use ditto::bench::{reference_engine, reference_requests};

fn bench_reference_run(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim_reference");
    group.sample_size(10);
    for size in [10_000u64, 100_000] {
        group.bench_function(format!("blis_reference_{size}"), |b| {
            b.iter(|| {
                let mut engine = reference_engine().unwrap();
                engine
                    .run(reference_requests(size).unwrap(), u64::MAX)
                    .unwrap();
                assert_eq!(engine.counts().completed, size);
                engine.summary().e2e.mean
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_reference_run);
criterion_main!(benches);
