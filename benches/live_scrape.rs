//! The live mirror's per-scrape work in-process, on the realistic page of a busy vLLM pod
//! (`ditto::live::bench::vllm_page_at`, a new page at every scrape): reading the page
//! (`parse_metrics`) and rebuilding the pod's request lists from it (`rebuild`). `ditto bench
//! --cases live` measures the whole path (HTTP, store, publish) as CPU per pod-second.
#![allow(clippy::unwrap_used)]

/// The allocator the `ditto` binary uses, so the benches measure what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
use ditto::cluster::spec::default_cluster;
use ditto::live::bench::vllm_page_at;
use ditto::live::rebuild::rebuild;
use ditto::live::text::parse_metrics;

fn bench_scrape(c: &mut Criterion) {
    let mut group = c.benchmark_group("live_scrape");
    // A few pages of a busy pod, read in turn (a page is never the same twice).
    let pages: Vec<String> = (0..8).map(vllm_page_at).collect();
    let mut at = 0;
    group.bench_function("parse_metrics", |b| {
        b.iter(|| {
            at = (at + 1) % pages.len();
            parse_metrics(&pages[at]).unwrap()
        })
    });
    let engine = default_cluster().instances[0].engine.clone();
    let metrics: Vec<_> = pages.iter().map(|p| parse_metrics(p).unwrap()).collect();
    group.bench_function("rebuild", |b| {
        b.iter(|| {
            at = (at + 1) % metrics.len();
            rebuild("pod-0", &metrics[at], &engine, 1_000_000 + at as u64)
        })
    });
    group.finish();
}

criterion_group!(benches, bench_scrape);
criterion_main!(benches);
