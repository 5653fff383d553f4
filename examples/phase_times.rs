#![allow(clippy::unwrap_used)]
use ditto::bench::{whatif_question, whatif_snapshot};
use ditto::sim::{RequestId, RequestSpec};
use ditto::twin::build::restore_instance;
use ditto::twin::sampling::{output_draw, stream};
use std::time::Instant;

fn main() {
    let snapshot = whatif_snapshot(true);
    let _q = whatif_question(1);
    let outputs = output_draw(&snapshot).unwrap();
    let instance = &snapshot.config.instances[0];
    let state = &snapshot.instances[0];
    let n = 200;
    let (mut t_restore, mut t_clone, mut t_run, mut t_base) = (0f64, 0f64, 0f64, 0f64);
    let mut steps = 0;
    let mut t_pre = 0f64;
    let mut pre_steps = 0;
    let mut lazy = 0;
    let mut events = 0;
    for _ in 0..n {
        let mut rng = stream(42, 0, "x");
        let t0 = Instant::now();
        let engine = restore_instance(instance, state, 0, &outputs, &mut rng, "i").unwrap();
        let t1 = Instant::now();
        let mut with = engine.clone();
        let mut without = engine.clone();
        let t2 = Instant::now();
        let mut spec = RequestSpec::synthetic(0, 10_000_000, 2000, 256);
        spec.id = RequestId(0);
        with.submit(spec).unwrap();
        while with.lazy_steps() == 0 && with.process_next_event().is_some() {}
        let tm = Instant::now();
        t_pre += (tm - t2).as_secs_f64();
        pre_steps = with.counts().steps;
        while with.process_next_event().is_some() {}
        let t3 = Instant::now();
        while without.process_next_event().is_some() {}
        let t4 = Instant::now();
        t_restore += (t1 - t0).as_secs_f64();
        t_clone += (t2 - t1).as_secs_f64() / 2.0;
        t_run += (t3 - t2).as_secs_f64();
        t_base += (t4 - t3).as_secs_f64();
        steps = with.counts().steps;
        lazy = with.lazy_steps();
        events = with.events_processed();
    }
    let us = |t: f64| t / n as f64 * 1e6;
    println!("non-lazy prefix: {:.0} µs for {pre_steps} steps", us(t_pre));
    println!(
        "restore {:.0} µs, clone {:.0} µs, question run {:.0} µs, baseline run {:.0} µs; steps {steps} lazy {lazy} events {events}",
        us(t_restore),
        us(t_clone),
        us(t_run),
        us(t_base)
    );
}
