//! `ditto bench`'s autoscale case: a simulated day at 45 req/s on average through an
//! autoscaled pool (`bench::autoscale_day`), timed whole.

use std::fmt::Write as _;
use std::time::Instant;

use super::error::CliError;
use crate::bench::{DAY_CAPACITY_PER_REPLICA, autoscale_day, autoscale_day_requests};
use crate::cluster::autoscale::{AutoscaleError, PolicyRun, run_policy};

/// The span `--quick` simulates instead of the day: its first half hour (a smoke run).
const QUICK_SPAN_S: f64 = 1_800.0;

/// Runs the day (with `quick`, its first half hour) and appends its row.
pub fn autoscale_case(out: &mut String, quick: bool) -> Result<(), CliError> {
    let span = if quick {
        "the first half hour of a simulated day"
    } else {
        "a simulated day"
    };
    let _ = writeln!(
        out,
        "\n== autoscale: {span}, diurnal 15-75 req/s (mean 45), llama-3.1-8b-instruct H100 roofline, predictive policy, replicas 1-8 (goal for the day < 10 s)"
    );
    let (base, config, policy) = autoscale_day()?;
    let requests = autoscale_day_requests(quick.then_some(QUICK_SPAN_S))?;
    let started = Instant::now();
    let run = PolicyRun {
        base: &base,
        config: &config,
        policy: &policy,
        capacity: DAY_CAPACITY_PER_REPLICA,
        seed: 42,
        max_events: u64::MAX,
    };
    let outcome = run_policy(&run, requests, &mut |_, _| {}).map_err(|err| match err {
        AutoscaleError::Sim(err) => CliError::from(err),
        AutoscaleError::EventBudget(_) => CliError::flag("cases", err.to_string()),
    })?;
    let wall = started.elapsed().as_secs_f64();
    let _ = writeln!(
        out,
        "{:>10} {:>9} {:>12} {:>13} {:>11} {:>10} {:>8}",
        "requests", "wall s", "req/s", "events/s", "SLO att.", "replica-h", "up/down"
    );
    let _ = writeln!(
        out,
        "{:>10} {wall:>9.3} {:>12.0} {:>13.0} {:>10.2}% {:>10.1} {:>8}",
        outcome.requests,
        outcome.requests as f64 / wall,
        outcome.events as f64 / wall,
        100.0 * outcome.attainment(),
        outcome.replica_hours,
        format!("{}/{}", outcome.scale_ups, outcome.scale_downs)
    );
    Ok(())
}
