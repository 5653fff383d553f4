#![allow(clippy::unwrap_used)]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use ditto::bench::whatif_snapshot;
use ditto::sim::{RequestId, RequestSpec};
use ditto::twin::build::{draw_lengths, restore_base};
use ditto::twin::sampling::{output_draw, stream};
use std::time::Instant;

fn main() {
    let known = std::env::args().nth(1).is_none();
    let snapshot = whatif_snapshot(known);
    let outputs = output_draw(&snapshot).unwrap();
    let instance = &snapshot.config.instances[0];
    let state = &snapshot.instances[0];
    let base = restore_base(instance, state, 0, "i").unwrap();
    let n = 300;
    let (mut t_clone, mut t_draw, mut t_run, mut t_base) = (0f64, 0f64, 0f64, 0f64);
    let (mut steps, mut lazy, mut mixed) = (0, 0, 0);
    for i in 0..n {
        let t0 = Instant::now();
        let mut with = base.clone();
        let t1 = Instant::now();
        let mut rng = stream(42, i % 16, "x");
        draw_lengths(&mut with, state, 0, &outputs, &mut rng, "i").unwrap();
        let mut without = with.clone();
        let t2 = Instant::now();
        let mut spec = RequestSpec::synthetic(0, 10_000_000, 2000, 256);
        spec.id = RequestId(0);
        with.submit(spec).unwrap();
        while with.process_next_event().is_some() {}
        let t3 = Instant::now();
        while without.process_next_event().is_some() {}
        let t4 = Instant::now();
        t_clone += (t1 - t0).as_secs_f64();
        t_draw += (t2 - t1).as_secs_f64();
        t_run += (t3 - t2).as_secs_f64();
        t_base += (t4 - t3).as_secs_f64();
        steps = with.counts().steps;
        lazy = with.lazy_steps();
        mixed = with.mixed_lazy_steps();
    }
    let us = |t: f64| t / n as f64 * 1e6;
    println!(
        "clone {:.0} µs, draw+clone {:.0} µs, question run {:.0} µs, baseline run {:.0} µs; steps {steps} lazy {lazy} mixed {mixed}",
        us(t_clone),
        us(t_draw),
        us(t_run),
        us(t_base)
    );
}
