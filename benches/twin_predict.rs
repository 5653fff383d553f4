//! What-if latency in-process: a 4-instance snapshot (128 running + 64 waiting each), one
//! routing prediction for a 2,000-token prompt with 256 output tokens over all 4 candidates,
//! with 1 replication (known lengths) and 16 replications (sampled lengths), asked repeatedly
//! on one snapshot (memoised) and as a first question (a fresh snapshot each time: nothing
//! memoised, the case that counts in serving); and one fork (a copy of a restored instance).
//! `ditto bench` adds the same call through the gRPC server on loopback.
#![allow(clippy::unwrap_used)]

/// The allocator the `ditto` binary uses, so the benches measure what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
use ditto::bench::{whatif_now_us, whatif_question, whatif_snapshot};
use ditto::twin::Limits;
use ditto::twin::build::restore_instance;
use ditto::twin::predict::predict_routing;
use ditto::twin::sampling::{output_draw, stream};

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
    // First questions: a fresh copy of the snapshot per call, so nothing is memoised.
    for (name, snapshot, replications) in [
        ("first_question_1_replication_known", &known, 1),
        ("first_question_16_replications_sampled", &sampled, 16),
    ] {
        let question = whatif_question(replications);
        group.bench_function(name, |b| {
            b.iter_batched(
                || snapshot.clone(),
                |fresh| {
                    predict_routing(&fresh, &question, &Limits::DEFAULT)
                        .unwrap()
                        .events
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

/// One fork: a copy of a restored what-if instance (128 running + 64 waiting), what every
/// replication of every candidate starts from.
fn bench_fork(c: &mut Criterion) {
    let snapshot = whatif_snapshot(false);
    let outputs = output_draw(&snapshot).unwrap();
    let restored = restore_instance(
        &snapshot.config.instances[0],
        &snapshot.instances[0],
        0,
        &outputs,
        &mut stream(1, 0, "bench"),
        "instances[0]",
    )
    .unwrap();
    let mut group = c.benchmark_group("twin_fork");
    group.bench_function("clone_restored_instance", |b| {
        b.iter(|| restored.clone().num_running())
    });
    group.finish();
}

criterion_group!(benches, bench_predict, bench_fork);
criterion_main!(benches);
