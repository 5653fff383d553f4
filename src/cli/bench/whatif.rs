//! `ditto bench`'s case 2: routing questions on the what-if snapshot, asked in-process
//! (repeatedly, after a push, first on a fresh snapshot) and through the real servers on
//! loopback (the Twin service over gRPC, the latency predictor's HTTP API).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{BenchArgs, latency_row};
use crate::bench::{whatif_now_us, whatif_question, whatif_snapshot};
use crate::cli::error::CliError;
use crate::server::loadgen::grpc_whatif_latencies;
use crate::twin::predict::predict_routing;
use crate::twin::{Limits, MirrorSnapshot};

/// Case 2: the what-if latencies, in-process, over gRPC and through the latency predictor
/// API.
pub(super) fn whatif_cases(
    out: &mut String,
    args: &BenchArgs,
    calls: u32,
    known: &MirrorSnapshot,
) -> Result<(), CliError> {
    let _ = writeln!(
        out,
        "\n== what-if: 4 instances x (128 running + 64 waiting), 2,000-token prompt, 256 output tokens, 4 candidates, {calls} calls"
    );
    let _ = writeln!(
        out,
        "{:<52} {:>9} {:>9} {:>9}",
        "case", "p50 ms", "p99 ms", "max ms"
    );
    let sampled = whatif_snapshot(false);
    // "Repeated" asks many questions of one snapshot, each at a new "now" up to 100 ms after
    // the observation, as a gateway does between state pushes (restored engines and baseline
    // forks are memoised); "after a push" asks once per new generation in which one instance
    // (in turn) was pushed again, the others keeping their memo as the store hands it on;
    // "first question" clones a fresh snapshot for every call (nothing memoised).
    for (label, snapshot, replications, asking) in [
        (
            "in-process, 1 replication (known), repeated",
            known,
            1,
            Asking::Repeated,
        ),
        (
            "in-process, 1 replication (known), after a push",
            known,
            1,
            Asking::AfterPush,
        ),
        (
            "in-process, 1 replication (known), first question",
            known,
            1,
            Asking::First,
        ),
        (
            "in-process, 16 replications (sampled), repeated",
            &sampled,
            16,
            Asking::Repeated,
        ),
        (
            "in-process, 16 replications, after a push",
            &sampled,
            16,
            Asking::AfterPush,
        ),
        (
            "in-process, 16 replications, first question",
            &sampled,
            16,
            Asking::First,
        ),
    ] {
        if !args.runs(asking.case())
            || !(args.replications.is_empty() || args.replications.contains(&replications))
        {
            continue;
        }
        let mut latencies = asked_latencies(snapshot, replications, asking, calls)?;
        let _ = writeln!(out, "{}", latency_row(label, &mut latencies));
    }
    loopback_cases(out, args, calls, known)
}

/// The latencies of `calls` routing questions of `replications` on `snapshot`, asked as
/// `asking` says.
fn asked_latencies(
    snapshot: &MirrorSnapshot,
    replications: u32,
    asking: Asking,
    calls: u32,
) -> Result<Vec<Duration>, CliError> {
    let mut question = whatif_question(replications);
    let mut latencies = Vec::with_capacity(calls as usize);
    let mut current = snapshot.clone();
    if asking == Asking::AfterPush {
        // Warm the memo first, as the questions before the push did.
        predict_routing(&current, &question, &Limits::DEFAULT)
            .map_err(|err| CliError::flag("bench", err.to_string()))?;
    }
    for call in 0..calls {
        let fresh;
        let target: &MirrorSnapshot = match asking {
            Asking::Repeated => {
                question.now_us = whatif_now_us(call);
                snapshot
            }
            Asking::AfterPush => {
                question.now_us = whatif_now_us(call);
                let mut next = current.clone();
                let pushed = call as usize % next.instances.len();
                next.instances[pushed] = Arc::new((*current.instances[pushed]).clone());
                next.generation += 1;
                next.inherit_memo(&current);
                current = next;
                &current
            }
            Asking::First => {
                fresh = snapshot.clone();
                &fresh
            }
        };
        let started = Instant::now();
        predict_routing(target, &question, &Limits::DEFAULT)
            .map_err(|err| CliError::flag("bench", err.to_string()))?;
        latencies.push(started.elapsed());
    }
    Ok(latencies)
}

/// The what-if cases through the real servers on loopback: the Twin service over gRPC and
/// the latency predictor's HTTP API.
fn loopback_cases(
    out: &mut String,
    args: &BenchArgs,
    calls: u32,
    known: &MirrorSnapshot,
) -> Result<(), CliError> {
    if args.runs("grpc") {
        let mut grpc = grpc_whatif_latencies(known, &whatif_question(1), calls, whatif_now_us)
            .map_err(|err| CliError::flag("bench", err.to_string()))?;
        let _ = writeln!(
            out,
            "{}",
            latency_row("gRPC loopback, 1 replication (known), repeated", &mut grpc)
        );
    }
    if !args.runs("predictor") {
        return Ok(());
    }
    // The latency predictor API (llm-d's predicted-latency routing): one strict bulk call
    // per routed request, one entry per candidate pod, with the default replications.
    let defaults = crate::server::predictor::PredictorOptions::default();
    for entries in [4, 100] {
        let replications = (defaults.forks_per_call / entries)
            .clamp(2, defaults.replications as usize)
            .min(defaults.replications as usize);
        let mut http = crate::server::loadgen::predictor::http_bulk_latencies(entries, calls)
            .map_err(|err| CliError::flag("bench", err.to_string()))?;
        let _ = writeln!(
            out,
            "{}",
            latency_row(
                &format!("HTTP /predict/bulk/strict, {entries} pods x {replications} replications"),
                &mut http
            )
        );
    }
    Ok(())
}

/// How the what-if cases ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Asking {
    /// Many questions on one snapshot, each at a new "now".
    Repeated,
    /// One question per new generation, in which one instance was pushed again.
    AfterPush,
    /// One question per fresh copy of the snapshot (nothing memoised).
    First,
}

impl Asking {
    /// The `--cases` name of this asking.
    fn case(self) -> &'static str {
        match self {
            Asking::Repeated => "whatif-repeated",
            Asking::AfterPush => "whatif-push",
            Asking::First => "whatif-first",
        }
    }
}
