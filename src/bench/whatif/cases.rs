//! The what-if cases asked in-process: routing questions on the what-if snapshot (repeatedly,
//! after a push, first on a fresh snapshot), the P/D snapshot's first question, and the
//! memory of one restored instance.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{pd_snapshot, whatif_instance, whatif_now_us, whatif_question, whatif_snapshot};
use crate::bench::{BenchError, BenchPlan, latency_row};
use crate::cluster::spec;
use crate::twin::build::restore_instance;
use crate::twin::predict::predict_routing;
use crate::twin::sampling::{output_draw, stream};
use crate::twin::{Limits, MirrorSnapshot};

/// The what-if table's header and its in-process rows: latencies with 1 replication (known
/// lengths) and 16 (sampled), each asked as the plan asks.
pub(in crate::bench) fn whatif_cases(
    out: &mut String,
    plan: &BenchPlan,
    known: &MirrorSnapshot,
) -> Result<(), BenchError> {
    let calls = plan.calls;
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
        if !plan.runs(asking.case())
            || !(plan.replications.is_empty() || plan.replications.contains(&replications))
        {
            continue;
        }
        let mut latencies = asked_latencies(snapshot, replications, asking, calls)?;
        let _ = writeln!(out, "{}", latency_row(label, &mut latencies));
    }
    Ok(())
}

/// The latencies of `calls` routing questions of `replications` on `snapshot`, asked as
/// `asking` says.
fn asked_latencies(
    snapshot: &MirrorSnapshot,
    replications: u32,
    asking: Asking,
    calls: u32,
) -> Result<Vec<Duration>, BenchError> {
    let mut question = whatif_question(replications);
    let mut latencies = Vec::with_capacity(calls as usize);
    let mut current = snapshot.clone();
    if asking == Asking::AfterPush {
        // Warm the memo first, as the questions before the push did.
        predict_routing(&current, &question, &Limits::DEFAULT).map_err(BenchError::failed)?;
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
        predict_routing(target, &question, &Limits::DEFAULT).map_err(BenchError::failed)?;
        latencies.push(started.elapsed());
    }
    Ok(latencies)
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
    /// The case name of this asking.
    fn case(self) -> &'static str {
        match self {
            Asking::Repeated => "whatif-repeated",
            Asking::AfterPush => "whatif-push",
            Asking::First => "whatif-first",
        }
    }
}

/// The P/D case: a first PredictRouting question (nothing memoised) over 8 prefill x 2
/// decode pods, answered for every pair and decode only (issue 35's goal: p99 under 5 ms).
pub(in crate::bench) fn pd_case(out: &mut String, calls: u32) -> Result<(), BenchError> {
    let snapshot = pd_snapshot(8, 2);
    let question = whatif_question(1);
    let _ = writeln!(
        out,
        "\n== P/D what-if: 8 prefill (4 running + 4 waiting) x 2 decode (64 + 16), 2,000-token prompt, 256 output tokens, 16 pairs + 2 decode only, {calls} calls"
    );
    let mut latencies = Vec::with_capacity(calls as usize);
    for _ in 0..calls {
        let fresh = snapshot.clone();
        let started = Instant::now();
        let answer =
            predict_routing(&fresh, &question, &Limits::DEFAULT).map_err(BenchError::failed)?;
        latencies.push(started.elapsed());
        if answer.pairs.len() != 16 {
            return Err(BenchError::Failed(format!(
                "the P/D case answered {} pairs, not 16",
                answer.pairs.len()
            )));
        }
    }
    let _ = writeln!(
        out,
        "{}",
        latency_row("in-process, 1 replication, first question", &mut latencies)
    );
    Ok(())
}

/// The memory case: one restored instance of 256 requests on 30,000 blocks.
pub(in crate::bench) fn memory_case(
    out: &mut String,
    known: &MirrorSnapshot,
) -> Result<(), BenchError> {
    let _ = writeln!(
        out,
        "\n== memory: one mirrored instance (256 requests, 30,000 blocks)"
    );
    let mut config = spec::default_cluster().instances[0].clone();
    config.engine.num_gpu_blocks = 30_000;
    let state = whatif_instance(&config.id, 192, 64, true, 9);
    let outputs = output_draw(known).map_err(BenchError::failed)?;
    let mut rng = stream(1, 0, "bench");
    let engine = restore_instance(&config, &state, 0, &outputs, &mut rng, "bench")
        .map_err(BenchError::failed)?;
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
