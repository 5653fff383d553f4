#![allow(clippy::unwrap_used)]
use ditto::bench::whatif_snapshot;
use ditto::twin::build::restore_instance;
use ditto::twin::sampling::{output_draw, stream};
use std::time::Instant;

fn main() {
    let snapshot = whatif_snapshot(true);
    let outputs = output_draw(&snapshot).unwrap();
    let mut rng = stream(42, 0, "x");
    let engine = restore_instance(
        &snapshot.config.instances[0],
        &snapshot.instances[0],
        0,
        &outputs,
        &mut rng,
        "i",
    )
    .unwrap();
    let n = 500;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(engine.kv().clone());
    }
    let kv = t.elapsed().as_secs_f64() / n as f64 * 1e6;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(engine.metrics().clone());
    }
    let m = t.elapsed().as_secs_f64() / n as f64 * 1e6;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(engine.clone());
    }
    let e = t.elapsed().as_secs_f64() / n as f64 * 1e6;
    println!(
        "kv {kv:.1} µs metrics {m:.1} µs engine {e:.1} µs; mem {} bytes",
        engine.memory_bytes()
    );
}
