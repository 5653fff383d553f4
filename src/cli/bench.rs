//! `ditto bench`: its flags, resolved into a [`BenchPlan`] and run by `bench` (every case,
//! its fixtures, timing and report live there), and its errors named by flag.

use clap::Args;

use crate::bench::{BenchError, BenchPlan, CASES};
use crate::cli::error::CliError;

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

/// Runs the cases asked for (every case by default) and returns the report; the internal
/// flags run their child-process part instead.
pub fn execute(args: &BenchArgs) -> Result<String, CliError> {
    if let Some(pods) = args.fake_pods {
        return crate::bench::serve_fake_pods(pods)
            .map(|()| String::new())
            .map_err(|err| CliError::flag("fake-pods", err.to_string()));
    }
    if let Some(blocks) = args.kv_memory_probe {
        if blocks == 0 {
            return Err(CliError::flag("kv-memory-probe", "must be at least 1"));
        }
        return crate::bench::kv_memory_probe(blocks)
            .map(|bytes| format!("{bytes:.1}"))
            .map_err(|err| CliError::flag("kv-memory-probe", err.to_string()));
    }
    let plan = plan(args)?;
    crate::bench::run(&plan).map_err(|err| match err {
        BenchError::Sim(err) => CliError::Sim(err),
        BenchError::Workload(err) => CliError::Workload(err),
        BenchError::EventBudget(reason) => CliError::flag("cases", reason),
        BenchError::Failed(reason) => CliError::flag("bench", reason),
    })
}

/// The flags resolved: defaults (and `--quick`'s) filled in, case names and sizes checked.
fn plan(args: &BenchArgs) -> Result<BenchPlan, CliError> {
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
    let offline_sizes: Vec<u64> = match (&args.offline_requests[..], args.quick) {
        ([], true) => vec![10_000, 100_000],
        ([], false) => vec![10_000, 100_000, 1_000_000],
        (given, _) => given.to_vec(),
    };
    let plan = BenchPlan {
        quick: args.quick,
        calls: args.calls.unwrap_or(if args.quick { 100 } else { 1_000 }),
        offline_sizes,
        live_seconds: args
            .live_seconds
            .unwrap_or(if args.quick { 2 } else { 10 })
            .max(1),
        load_seconds: args.load_seconds.unwrap_or(if args.quick { 2 } else { 10 }),
        load_clients: args.load_clients,
        cases: args.cases.clone(),
        replications: args.replications.clone(),
    };
    if plan.runs("offline") && plan.offline_sizes.contains(&0) {
        return Err(CliError::flag(
            "offline-requests",
            "sizes must be at least 1",
        ));
    }
    Ok(plan)
}
