//! What-if latency in-process: a 4-instance snapshot (128 running + 64 waiting each), one
//! routing prediction for a 2,000-token prompt with 256 output tokens over all 4 candidates,
//! with 1 replication (known lengths) and 16 replications (sampled lengths). `ditto bench`
//! adds the same call through the gRPC server on loopback.
#![allow(clippy::unwrap_used)]

/// The allocator the `ditto` binary uses, so the benches measure what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
use ditto::bench::{whatif_now_us, whatif_question, whatif_snapshot};
use ditto::twin::Limits;
use ditto::twin::predict::predict_routing;

fn bench_predict(c: &mut Criterion) {
    let mut group = c.benchmark_group("twin_predict");
    group.sample_size(20);
    // Repeated questions on one snapshot, each at a new "now" (as `ditto bench` asks).
    let known = whatif_snapshot(true);
    let mut one = whatif_question(1);
    let mut call = 0;
    group.bench_function("4_candidates_1_replication_known", |b| {
        b.iter(|| {
            call += 1;
            one.now_us = whatif_now_us(call);
            predict_routing(&known, &one, &Limits::DEFAULT)
                .unwrap()
                .events
        })
    });
    let sampled = whatif_snapshot(false);
    let mut sixteen = whatif_question(16);
    group.bench_function("4_candidates_16_replications_sampled", |b| {
        b.iter(|| {
            call += 1;
            sixteen.now_us = whatif_now_us(call);
            predict_routing(&sampled, &sixteen, &Limits::DEFAULT)
                .unwrap()
                .events
        })
    });
    group.finish();
}

criterion_group!(benches, bench_predict);
criterion_main!(benches);
