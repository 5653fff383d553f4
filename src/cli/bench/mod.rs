//! `ditto bench`: every performance case, measured and printed (no assertions: speed is
//! reported, never tested). The same cases back the criterion benches in `benches/`.
//!
//! 1. Offline: the BLIS reference run at 10,000, 100,000 and 1,000,000 requests: wall time,
//!    simulated requests, steps and events per wall-second, per-request cost, peak memory.
//! 2. What-if: a 4-instance snapshot (128 running + 64 waiting each), one PredictRouting for a
//!    2,000-token prompt with 256 output tokens over all 4 candidates: latency p50/p99 with 1
//!    replication (known lengths) and 16 replications (sampled lengths), in-process (asked
//!    repeatedly on one snapshot, once after each push of one instance, and once on a fresh
//!    snapshot) and through the gRPC server on loopback; the latency predictor API's strict
//!    bulk call over loopback HTTP with 4 and 100 candidate pods.
//! 3. Memory: one mirrored instance with 256 requests and 30,000 blocks.
//! 4. Live mirror: 100 fake vLLM pods on loopback scraped every 50 ms (`live::bench`), and
//!    100 fake KV-event publishers at 200 blocks/s each (`live::kv_bench`): CPU
//!    per pod per second, freshness lag, memory at the start and the end.
//! 5. Load: many concurrent clients on loopback mixing PredictRouting, state pushes and
//!    `/metrics` scrapes for a fixed time: operations/s, p50/p99, errors, RSS before/after.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use clap::Args;

use crate::bench::{
    offline_reference_engine, reference_requests, whatif_instance, whatif_question, whatif_snapshot,
};
use crate::cli::error::CliError;
use crate::cluster::spec;
use crate::server::load::{LoadOptions, run_load};
use crate::twin::build::restore_instance;
use crate::twin::predict::predict_routing;
use crate::twin::sampling::{output_draw, stream};
use crate::twin::{Limits, MirrorSnapshot};

mod whatif;

/// Flags of `ditto bench`.
#[derive(Clone, Debug, Args)]
pub struct BenchArgs {
    /// A quick pass (10k and 100k offline, 100 what-if calls): a smoke run, not a measurement.
    #[arg(long)]
    pub quick: bool,
    /// What-if calls per case (default 1,000; 100 with --quick).
    #[arg(long)]
    pub calls: Option<u32>,
    /// Offline run sizes, comma-separated (default 10000,100000,1000000).
    #[arg(long, value_delimiter = ',')]
    pub offline_requests: Vec<u64>,
    /// Seconds the live-mirror case runs (default 10; 2 with --quick).
    #[arg(long)]
    pub live_seconds: Option<u64>,
    /// Seconds of the loopback load case (default 10; 2 with --quick; 0 skips it).
    #[arg(long)]
    pub load_seconds: Option<u64>,
    /// Concurrent clients of the load case.
    #[arg(long, default_value_t = 32)]
    pub load_clients: usize,
    /// Internal: print the live mirror's resident bytes per cached block with this many
    /// blocks on one instance, measured in this (fresh) process, and exit. The KV-event case
    /// runs it as a child process.
    #[arg(long, hide = true)]
    pub kv_memory_probe: Option<u64>,
    /// Internal: serve this many fake vLLM pods on loopback, print their addresses, and
    /// serve until stdin closes. The live case runs it as a child process, so that its CPU
    /// is not ditto's.
    #[arg(long, hide = true)]
    pub fake_pods: Option<usize>,
    /// Cases to run, comma-separated (default all): offline, whatif (or one of its askings:
    /// whatif-repeated, whatif-push, whatif-first), grpc, predictor, memory, live, kv, load,
    /// pd-first, autoscale.
    /// One case alone is what a profiler should run.
    #[arg(long, value_delimiter = ',')]
    pub cases: Vec<String>,
    /// The in-process what-if rows to run by replications, comma-separated (default 1,16).
    #[arg(long, value_delimiter = ',')]
    pub replications: Vec<u32>,
}

/// The case names `--cases` accepts.
const CASES: [&str; 13] = [
    "offline",
    "whatif",
    "whatif-repeated",
    "whatif-push",
    "whatif-first",
    "grpc",
    "predictor",
    "memory",
    "live",
    "kv",
    "load",
    "pd-first",
    "autoscale",
];

impl BenchArgs {
    /// True if case `name` was asked for (every case when none was named).
    fn runs(&self, name: &str) -> bool {
        self.cases.is_empty()
            || self
                .cases
                .iter()
                .any(|case| case == name || (name.starts_with("whatif-") && case == "whatif"))
    }
}

/// Runs the cases asked for (every case by default) and returns the report.
pub fn execute(args: &BenchArgs) -> Result<String, CliError> {
    if let Some(pods) = args.fake_pods {
        return crate::server::runtime::block_on(crate::live::bench::serve_fake_pods(pods))
            .map_err(|err| CliError::flag("fake-pods", err.to_string()))?
            .map(|()| String::new())
            .map_err(|err| CliError::flag("fake-pods", err));
    }
    if let Some(blocks) = args.kv_memory_probe {
        if blocks == 0 {
            return Err(CliError::flag("kv-memory-probe", "must be at least 1"));
        }
        return crate::live::kv_bench::memory_probe(blocks)
            .map(|bytes| format!("{bytes:.1}"))
            .map_err(|err| CliError::flag("kv-memory-probe", err));
    }
    if let Some(unknown) = args
        .cases
        .iter()
        .find(|case| !CASES.contains(&case.as_str()))
    {
        return Err(CliError::flag(
            "cases",
            format!("unknown case {unknown:?}; known: {}", CASES.join(", ")),
        ));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ditto bench ({} cores available, load average {})",
        cores(),
        load_average()
    );
    if args.runs("offline") {
        offline_case(&mut out, args)?;
    }
    let calls = args.calls.unwrap_or(if args.quick { 100 } else { 1_000 });
    let known = whatif_snapshot(true);
    if [
        "whatif-repeated",
        "whatif-push",
        "whatif-first",
        "grpc",
        "predictor",
    ]
    .iter()
    .any(|case| args.runs(case))
    {
        whatif::whatif_cases(&mut out, args, calls, &known)?;
    }
    if args.runs("pd-first") {
        pd_case(&mut out, calls)?;
    }
    if args.runs("memory") {
        memory_case(&mut out, &known)?;
    }
    if args.runs("live") {
        live_case(&mut out, args)?;
    }
    if args.runs("kv") {
        kv_case(&mut out, args)?;
    }
    if args.runs("autoscale") {
        super::autoscale_bench::autoscale_case(&mut out, args.quick)?;
    }
    let seconds = args.load_seconds.unwrap_or(if args.quick { 2 } else { 10 });
    if seconds > 0 && args.runs("load") {
        load_case(&mut out, args.load_clients, seconds)?;
    }
    Ok(out)
}

/// Case 1: the BLIS reference run at each size, with per-request, per-event and per-step
/// costs.
fn offline_case(out: &mut String, args: &BenchArgs) -> Result<(), CliError> {
    let _ = writeln!(
        out,
        "\n== offline: BLIS reference run (llama-3.1-8b-instruct, H100, TP1, roofline, 20 req/s), after an untimed warm-up run"
    );
    let _ = writeln!(
        out,
        "{:>10} {:>9} {:>12} {:>12} {:>13} {:>11} {:>9} {:>9} {:>12}",
        "requests",
        "wall s",
        "req/s",
        "steps/s",
        "events/s",
        "µs/request",
        "µs/event",
        "µs/step",
        "peak RSS MB"
    );
    let sizes: Vec<u64> = match (&args.offline_requests[..], args.quick) {
        ([], true) => vec![10_000, 100_000],
        ([], false) => vec![10_000, 100_000, 1_000_000],
        (given, _) => given.to_vec(),
    };
    if sizes.contains(&0) {
        return Err(CliError::flag(
            "offline-requests",
            "sizes must be at least 1",
        ));
    }
    // One untimed run first: the first simulation in a process pays one-time costs (page
    // faults of fresh memory, the embedded catalog's parse) that are not per-request work.
    let warm_up = sizes.first().map_or(10_000, |&size| size.min(10_000));
    offline_reference_engine()?.run(reference_requests(warm_up), u64::MAX)?;
    let mut per_request = Vec::new();
    for &size in &sizes {
        let mut engine = offline_reference_engine()?;
        let started = Instant::now();
        engine.run(reference_requests(size), u64::MAX)?;
        let wall = started.elapsed().as_secs_f64();
        let counts = engine.counts();
        let us_per_request = wall * 1e6 / size as f64;
        per_request.push(us_per_request);
        let events = engine.events_processed().max(1) as f64;
        let steps = counts.steps.max(1) as f64;
        let _ = writeln!(
            out,
            "{size:>10} {wall:>9.3} {:>12.0} {:>12.0} {:>13.0} {us_per_request:>11.2} {:>9.3} {:>9.3} {:>12}",
            size as f64 / wall,
            counts.steps as f64 / wall,
            engine.events_processed() as f64 / wall,
            wall * 1e6 / events,
            wall * 1e6 / steps,
            peak_rss_mb().map_or("n/a".to_owned(), |mb| format!("{mb:.0}"))
        );
    }
    if let (Some(first), Some(last)) = (per_request.first(), per_request.last()) {
        let _ = writeln!(
            out,
            "per-request cost, largest run / smallest run: {:.2}x",
            last / first
        );
    }
    Ok(())
}

/// Case 3: the memory of one restored instance.
fn memory_case(out: &mut String, known: &MirrorSnapshot) -> Result<(), CliError> {
    let _ = writeln!(
        out,
        "\n== memory: one mirrored instance (256 requests, 30,000 blocks)"
    );
    let mut config = spec::default_cluster().instances[0].clone();
    config.engine.num_gpu_blocks = 30_000;
    let state = whatif_instance(&config.id, 192, 64, true, 9);
    let outputs = output_draw(known).map_err(|err| CliError::flag("bench", err.to_string()))?;
    let mut rng = stream(1, 0, "bench");
    let engine = restore_instance(&config, &state, 0, &outputs, &mut rng, "bench")
        .map_err(|err| CliError::flag("bench", err.to_string()))?;
    let _ = writeln!(
        out,
        "engine state: {:.2} MB ({} requests, {} blocks, {} in use)",
        engine.memory_bytes() as f64 / 1e6,
        engine.num_running() + engine.num_waiting(),
        engine.kv().total_blocks(),
        engine.kv().used_blocks()
    );
    Ok(())
}

/// Seconds the live cases run (`--live-seconds`; 10, or 2 with `--quick`).
fn live_seconds(args: &BenchArgs) -> u64 {
    args.live_seconds
        .unwrap_or(if args.quick { 2 } else { 10 })
        .max(1)
}

/// Runs a case that serves or scrapes on loopback on its own runtime (`server::runtime`).
fn on_runtime<T>(
    case: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, CliError> {
    crate::server::runtime::block_on(case)
        .map_err(|err| CliError::flag("bench", err.to_string()))?
        .map_err(|err| CliError::flag("bench", err))
}

/// Case 4: the live mirror scraping fake pods.
fn live_case(out: &mut String, args: &BenchArgs) -> Result<(), CliError> {
    let seconds = live_seconds(args);
    let _ = writeln!(
        out,
        "\n== live mirror: 100 fake vLLM pods on loopback, /metrics every 50 ms, {seconds} s (the fake pods in their own process: the CPU is ditto's own)"
    );
    let live = on_runtime(crate::live::bench::scrape_bench(
        100,
        Duration::from_millis(50),
        Duration::from_secs(seconds),
    ))?;
    let _ = writeln!(out, "{}", live.row());
    Ok(())
}

/// The live mirror's KV-event case (see `live::kv_bench`).
fn kv_case(out: &mut String, args: &BenchArgs) -> Result<(), CliError> {
    let seconds = live_seconds(args);
    let _ = writeln!(
        out,
        "\n== live mirror KV events: 100 fake vLLM publishers on loopback (ZMQ), 200 blocks/s each with token ids, {seconds} s"
    );
    // A busy pod's cache is full: llama-3.1-8b on an H100 holds 26,312 blocks.
    let (cached, memory_blocks) = if args.quick {
        (2_000, 20_000)
    } else {
        (26_312, 200_000)
    };
    let kv = on_runtime(crate::live::kv_bench::kv_bench(
        100,
        200,
        cached,
        memory_blocks,
        Duration::from_secs(seconds),
    ))?;
    let _ = writeln!(out, "{}", kv.rows());
    Ok(())
}

/// Case 5: the loopback load run (see `server::load`).
fn load_case(out: &mut String, clients: usize, seconds: u64) -> Result<(), CliError> {
    let _ = writeln!(
        out,
        "\n== load: {clients} clients on loopback for {seconds} s (after a 2 s warm-up), PredictRouting over 4 instances with every 10th operation a /metrics scrape, state pushes at 20/s"
    );
    let report = run_load(&LoadOptions {
        clients,
        warmup: Duration::from_secs(2),
        duration: Duration::from_secs(seconds),
        pushes_per_second: 20,
        scrape_every: 10,
    })
    .map_err(|err| CliError::flag("bench", err.to_string()))?;
    let mb =
        |bytes: Option<u64>| bytes.map_or("n/a".to_owned(), |b| format!("{:.0}", b as f64 / 1e6));
    let _ = writeln!(
        out,
        "operations/s {:.0} (predictions {}, pushes {}, scrapes {}), errors {}, prediction p50 {:.2} ms p99 {:.2} ms, RSS before {} MB after {} MB",
        report.ops_per_second(),
        report.predictions,
        report.pushes,
        report.scrapes,
        report.errors,
        report.latency(0.5).as_secs_f64() * 1e3,
        report.latency(0.99).as_secs_f64() * 1e3,
        mb(report.rss_before_bytes),
        mb(report.rss_after_bytes),
    );
    if let Some(err) = &report.first_error {
        let _ = writeln!(out, "first error: {err}");
    }
    Ok(())
}

/// The P/D case: a first PredictRouting question (nothing memoised) over 8 prefill x 2
/// decode pods, answered for every pair and decode only (issue 35's goal: p99 under 5 ms).
fn pd_case(out: &mut String, calls: u32) -> Result<(), CliError> {
    let snapshot = crate::bench::pd_snapshot(8, 2);
    let question = whatif_question(1);
    let _ = writeln!(
        out,
        "\n== P/D what-if: 8 prefill (4 running + 4 waiting) x 2 decode (64 + 16), 2,000-token prompt, 256 output tokens, 16 pairs + 2 decode only, {calls} calls"
    );
    let mut latencies = Vec::with_capacity(calls as usize);
    for _ in 0..calls {
        let fresh = snapshot.clone();
        let started = Instant::now();
        let answer = predict_routing(&fresh, &question, &Limits::DEFAULT)
            .map_err(|err| CliError::flag("bench", err.to_string()))?;
        latencies.push(started.elapsed());
        if answer.pairs.len() != 16 {
            return Err(CliError::flag(
                "bench",
                format!("the P/D case answered {} pairs, not 16", answer.pairs.len()),
            ));
        }
    }
    let _ = writeln!(
        out,
        "{}",
        latency_row("in-process, 1 replication, first question", &mut latencies)
    );
    Ok(())
}

/// One table row: the label and the latencies' p50, p99 and max (ms).
fn latency_row(label: &str, latencies: &mut [Duration]) -> String {
    latencies.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |p: f64| {
        let index = ((latencies.len() - 1) as f64 * p).round() as usize;
        ms(latencies[index])
    };
    format!(
        "{label:<52} {:>9.3} {:>9.3} {:>9.3}",
        at(0.5),
        at(0.99),
        latencies.last().map_or(0.0, |d| ms(*d))
    )
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "n/a".to_owned())
}

/// The process's peak resident memory so far (Linux `VmHWM`).
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
