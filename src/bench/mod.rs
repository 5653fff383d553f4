//! Benchmark and load cases, in one place: the work `ditto bench` times and the criterion
//! benches under `benches/` share (so both measure exactly the same work), and the case
//! runners that time it and write `ditto bench`'s report. The CLI only parses the flags into
//! a [`BenchPlan`] and calls [`run`].
//!
//! An edge module like `server` and `live`: the loopback cases serve, scrape and publish on
//! tokio runtimes built here (`runtime.rs`); no layer below the CLI imports it. One file (or
//! folder) per case family:
//!
//! 1. `reference.rs`, offline: the BLIS reference run (llama-3.1-8b-instruct on one H100,
//!    TP1, roofline, Poisson 20 req/s, prompts and outputs gaussian 512 ± 256 in [2, 7000],
//!    26,312 GPU blocks) at 10,000, 100,000 and 1,000,000 requests: wall time, simulated
//!    requests, steps and events per wall-second, per-request cost, peak memory.
//! 2. `whatif/`: a mirrored 4-instance snapshot (128 running + 64 waiting each), one
//!    PredictRouting for a 2,000-token prompt with 256 output tokens over all 4 candidates:
//!    latency p50/p99 with 1 replication (known lengths) and 16 replications (sampled
//!    lengths), in-process (asked repeatedly on one snapshot, once after each push of one
//!    instance, and once on a fresh snapshot); the P/D snapshot's first question; the memory
//!    of one mirrored instance with 256 requests and 30,000 blocks.
//! 3. `loadgen/`: the same question through the gRPC server on loopback; the latency
//!    predictor API's strict bulk call over loopback HTTP with 4 and 100 candidate pods; many
//!    concurrent clients on loopback mixing PredictRouting, state pushes and `/metrics`
//!    scrapes for a fixed time (`server::load`): operations/s, p50/p99, errors, RSS.
//! 4. `scrape.rs`: the live mirror scraping 100 fake vLLM pods on loopback every 50 ms, and
//!    `kv.rs`: 100 fake KV-event publishers at 200 blocks/s each: CPU per pod per second,
//!    freshness lag, memory.
//! 5. `autoscale.rs`: a simulated day through an autoscaled pool, timed whole.
//!
//! No assertions: speed is reported, never tested.

use std::fmt::Write as _;
use std::time::Duration;

use thiserror::Error;

use crate::sim::SimError;
use crate::workload::WorkloadError;

mod autoscale;
mod kv;
mod loadgen;
mod process;
mod reference;
mod runtime;
mod scrape;
mod whatif;

pub use autoscale::{DAY_CAPACITY_PER_REPLICA, autoscale_day, autoscale_day_requests};
pub use kv::memory_probe as kv_memory_probe;
pub use reference::{
    REFERENCE_BLOCKS, offline_reference_engine, reference_engine, reference_requests,
};
pub use scrape::serve_fake_pods;
pub use whatif::{
    WHATIF_NOW_US, pd_snapshot, whatif_instance, whatif_now_us, whatif_question, whatif_snapshot,
};

/// Why a bench case could not run.
#[derive(Debug, Error)]
pub enum BenchError {
    /// A simulation refused its input or ran out of budget.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A case's workload is invalid.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The autoscaled day ran out of its event budget.
    #[error("{0}")]
    EventBudget(String),
    /// A case failed: a server, runtime, fixture, child process or answer.
    #[error("{0}")]
    Failed(String),
}

impl BenchError {
    /// A case's failure, from anything printable.
    fn failed(err: impl std::fmt::Display) -> Self {
        BenchError::Failed(err.to_string())
    }
}

/// The case names a plan may ask for.
pub const CASES: [&str; 13] = [
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

/// What a bench run measures (the flags of `ditto bench`, resolved).
#[derive(Clone, Debug, PartialEq)]
pub struct BenchPlan {
    /// A quick pass: a smoke run, not a measurement (smaller live-mirror caches, the
    /// autoscale case's first half hour).
    pub quick: bool,
    /// What-if calls per case.
    pub calls: u32,
    /// Offline run sizes, each at least 1.
    pub offline_sizes: Vec<u64>,
    /// Seconds the live-mirror cases run (at least 1).
    pub live_seconds: u64,
    /// Seconds of the loopback load case (0 skips it).
    pub load_seconds: u64,
    /// Concurrent clients of the load case.
    pub load_clients: usize,
    /// Cases to run, names from [`CASES`] (empty: every case).
    pub cases: Vec<String>,
    /// The in-process what-if rows to run by replications (empty: every row).
    pub replications: Vec<u32>,
}

impl BenchPlan {
    /// True if case `name` was asked for (every case when none was named; `whatif` asks for
    /// each of its askings).
    pub fn runs(&self, name: &str) -> bool {
        self.cases.is_empty()
            || self
                .cases
                .iter()
                .any(|case| case == name || (name.starts_with("whatif-") && case == "whatif"))
    }
}

/// Runs the cases `plan` asks for, in a fixed order, and returns the report.
pub fn run(plan: &BenchPlan) -> Result<String, BenchError> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ditto bench ({} cores available, load average {})",
        process::cores(),
        process::load_average()
    );
    if plan.runs("offline") {
        reference::offline_case(&mut out, &plan.offline_sizes)?;
    }
    let known = whatif_snapshot(true);
    if [
        "whatif-repeated",
        "whatif-push",
        "whatif-first",
        "grpc",
        "predictor",
    ]
    .iter()
    .any(|case| plan.runs(case))
    {
        whatif::whatif_cases(&mut out, plan, &known)?;
        loadgen::loopback_cases(&mut out, plan, &known)?;
    }
    if plan.runs("pd-first") {
        whatif::pd_case(&mut out, plan.calls)?;
    }
    if plan.runs("memory") {
        whatif::memory_case(&mut out, &known)?;
    }
    if plan.runs("live") {
        scrape::live_case(&mut out, plan.live_seconds)?;
    }
    if plan.runs("kv") {
        kv::kv_case(&mut out, plan.live_seconds, plan.quick)?;
    }
    if plan.runs("autoscale") {
        autoscale::autoscale_case(&mut out, plan.quick)?;
    }
    if plan.load_seconds > 0 && plan.runs("load") {
        loadgen::load_case(&mut out, plan.load_clients, plan.load_seconds)?;
    }
    Ok(out)
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
