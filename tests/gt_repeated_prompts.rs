//! The measured runs repeat their prompts (issue 36; docs/fidelity/repeated-prompts.md): a
//! guard on the data in tests/data/gt, read straight from the raw files (not through ditto's
//! `fidelity` decoder: this test stands for the measurement, not for our reading of it).
//!
//! inference-perf's `shared_prefix` generator builds P = `num_groups × num_prompts_per_group`
//! prompts once and request n carries prompt n mod P; vLLM's prefix cache then serves a
//! repeated prompt's full blocks. Two things in every per-request run say so:
//! - a request's prompt length (`input_tokens`, the server's count) equals that of the request
//!   P places earlier for nearly all requests, and at no other lag;
//! - the first P requests, whose prompts nothing has cached yet, have a longer TTFT than the
//!   later ones at the same load.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;

/// What inference-perf ran (`results/config.yaml`): only the fields read here.
#[derive(Deserialize)]
struct RanConfig {
    data: RanData,
    load: RanLoad,
}

#[derive(Deserialize)]
struct RanData {
    shared_prefix: RanSharedPrefix,
}

#[derive(Deserialize)]
struct RanSharedPrefix {
    num_groups: u64,
    num_prompts_per_group: u64,
}

#[derive(Deserialize)]
struct RanLoad {
    stages: Vec<RanStage>,
}

#[derive(Deserialize)]
struct RanStage {
    rate: f64,
    duration: f64,
}

/// `replay_requests.json`: the requests in the order they were sent.
#[derive(Deserialize)]
struct Requests {
    requests: Vec<Request>,
}

#[derive(Deserialize)]
struct Request {
    index: usize,
    input_tokens: u64,
    has_error: bool,
}

/// One row of `replay_ground_truth.json` (a failed request has no `ttft_s`).
#[derive(Deserialize)]
struct Truth {
    index: usize,
    has_error: bool,
    ttft_s: Option<f64>,
}

/// One measured run as this test reads it.
struct Run {
    name: String,
    /// P: how many prompts the generator cycles through.
    prompts: usize,
    /// Requests sent during the first load stage.
    first_stage: usize,
    /// The server's prompt length per request, `None` for a failed one (its counts are 0:
    /// the client never saw them).
    lengths: Vec<Option<u64>>,
    /// Measured TTFT (ms) per request, `None` for a failed one.
    ttft_ms: Vec<Option<f64>>,
}

fn gt_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gt")
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|err| panic!("{}/{file}: {err}", dir.display()))
}

/// Every run in tests/data/gt with per-request data (`replay_requests.json`), by name (read
/// once for all the tests).
fn per_request_runs() -> &'static [Run] {
    static RUNS: OnceLock<Vec<Run>> = OnceLock::new();
    RUNS.get_or_init(read_runs)
}

fn read_runs() -> Vec<Run> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(gt_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("replay_requests.json").is_file())
        .collect();
    dirs.sort();
    dirs.iter().map(|dir| load(dir)).collect()
}

fn load(dir: &Path) -> Run {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let config: RanConfig = serde_saphyr::from_str(&read(dir, "results/config.yaml"))
        .unwrap_or_else(|err| panic!("{name}: results/config.yaml: {err}"));
    let shape = &config.data.shared_prefix;
    let prompts = usize::try_from(shape.num_groups * shape.num_prompts_per_group).unwrap();
    let stage = &config.load.stages[0];
    let first_stage = (stage.rate * stage.duration).round() as usize;
    let requests: Requests = serde_json::from_str(&read(dir, "replay_requests.json")).unwrap();
    let truths: Vec<Truth> = serde_json::from_str(&read(dir, "replay_ground_truth.json")).unwrap();
    let n = requests.requests.len();
    assert_eq!(truths.len(), n, "{name}: one ground-truth row per request");
    // The lags below count in sending order: the files must list the requests by index.
    for (i, (request, truth)) in requests.requests.iter().zip(&truths).enumerate() {
        assert_eq!(
            (request.index, truth.index),
            (i, i),
            "{name}: row {i} out of order"
        );
    }
    let lengths = requests
        .requests
        .iter()
        .zip(&truths)
        .map(|(r, t)| {
            (!r.has_error && !t.has_error && r.input_tokens > 0).then_some(r.input_tokens)
        })
        .collect();
    let ttft_ms = truths
        .iter()
        .map(|t| t.ttft_s.filter(|_| !t.has_error).map(|s| s * 1e3))
        .collect();
    Run {
        name,
        prompts,
        first_stage,
        lengths,
        ttft_ms,
    }
}

/// The fraction of requests whose prompt length equals that of the request `lag` places
/// earlier, over the pairs where both succeeded.
fn lag_equality(lengths: &[Option<u64>], lag: usize) -> f64 {
    let (mut pairs, mut equal) = (0usize, 0usize);
    for (earlier, later) in lengths.iter().zip(&lengths[lag..]) {
        if let (Some(a), Some(b)) = (earlier, later) {
            pairs += 1;
            equal += usize::from(a == b);
        }
    }
    assert!(pairs > 0, "no succeeded pair at lag {lag}");
    equal as f64 / pairs as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    assert!(!values.is_empty(), "median of nothing");
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Median TTFT (ms) of the succeeded requests in `range`.
fn median_ttft(run: &Run, range: std::ops::Range<usize>) -> f64 {
    median(run.ttft_ms[range].iter().flatten().copied().collect())
}

/// The runs the README lists with per-request data: the guard must see all of them.
#[test]
fn every_per_request_run_is_read() {
    let runs = per_request_runs();
    assert_eq!(
        runs.len(),
        11,
        "per-request runs: {:?}",
        runs.iter().map(|r| &r.name).collect::<Vec<_>>()
    );
    for run in runs {
        assert_eq!(run.prompts, 100, "{}: P (10 × 10 ran)", run.name);
    }
}

/// Lag P is where the prompt lengths repeat, in every run. Failed requests are left out:
/// their recorded length is 0, equal at every lag (counted in, they made the overloaded
/// "reasoning" runs look ~85% equal at every lag). Lengths vary over 24-37 values in each run,
/// so two different prompts share a length only by chance (Σ p² ≈ 4-6%, up to ~11% at one lag
/// with 100 prompt pairs a lag); the ~1-2% of requests that miss at lag P are pairs sent at
/// nearly the same moment and recorded in swapped order (docs/fidelity/repeated-prompts.md).
#[test]
fn prompt_lengths_repeat_at_lag_p_and_no_other() {
    for run in per_request_runs() {
        let p = run.prompts;
        let at_p = lag_equality(&run.lengths, p);
        let (best_lag, best) = (1..p)
            .map(|lag| (lag, lag_equality(&run.lengths, lag)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap();
        assert!(at_p > 0.95, "{}: lag {p} equality {at_p:.4}", run.name);
        assert!(
            at_p - best >= 0.3,
            "{}: lag {p} equality {at_p:.4} vs {best:.4} at lag {best_lag}",
            run.name
        );
        // Only multiples of P repeat: lags P+1..2P-1 stay at chance as well.
        for lag in p + 1..2 * p {
            let other = lag_equality(&run.lengths, lag);
            assert!(
                at_p - other >= 0.3,
                "{}: lag {lag} equality {other:.4}",
                run.name
            );
        }
    }
}

/// The few requests that miss at lag P still carry a prompt of the cycle: each one's length is
/// the usual length (the most common one over the cycles) of a prompt at most three places
/// from its own, i.e. requests sent nearly at once were recorded in swapped order. So the
/// recorded index is inference-perf's request number up to such local swaps, which is what the
/// replay assumes when it gives request n prompt n mod P. Such requests are 0.1-1.0% of each
/// run; more than 2% would mean the order is not the sending order.
#[test]
fn off_cycle_lengths_belong_to_a_neighbouring_prompt() {
    for run in per_request_runs() {
        let p = run.prompts;
        let usual: Vec<u64> = (0..p)
            .map(|prompt| {
                let mut counts = std::collections::BTreeMap::new();
                for length in run.lengths.iter().skip(prompt).step_by(p).flatten() {
                    *counts.entry(*length).or_insert(0usize) += 1;
                }
                let most = counts.iter().max_by_key(|(_, count)| **count).unwrap();
                *most.0
            })
            .collect();
        let mut off_cycle = 0;
        for (i, length) in run.lengths.iter().enumerate() {
            let Some(length) = length else { continue };
            if *length == usual[i % p] {
                continue;
            }
            off_cycle += 1;
            let near =
                (1..=3).any(|k| *length == usual[(i + k) % p] || *length == usual[(i + p - k) % p]);
            assert!(
                near,
                "{}: request {i} has length {length}, no prompt within 3 places",
                run.name
            );
        }
        let succeeded = run.lengths.iter().flatten().count();
        assert!(
            off_cycle * 50 < succeeded,
            "{}: {off_cycle} of {succeeded} requests off their prompt's length",
            run.name
        );
    }
}

/// The first P requests find nothing cached; later ones find their whole prompt. Compared
/// within the first load stage (one arrival rate), for the runs in which no request failed:
/// in the three overloaded "reasoning" runs the running batch reaches `max_num_seqs` (or the
/// KV cache fills) near request 128, and from there TTFT is time in the queue (the page
/// shows their first 128 requests).
///
/// Windows: cold = requests 0.7P..P, the end of the first cycle (the Mixtral runs' first
/// ~40-70 requests show a separate warm-up, TTFT 300-900 ms, that must not count as a cache
/// miss); warm = the nine blocks of P requests that follow ([kP, (k+1)P), k = 1..9).
///
/// Margin, from the data: the nine warm blocks are samples of one steady state (same stage,
/// same rate, every prompt cached), so the range of their medians is how far a block's median
/// moves with no change of state (1.4-4.5 ms in these runs). The cold window must sit above
/// the slowest warm block by more than that range. At the time of writing the runs clear it by
/// 2.6x (Llama-2-7b general: 35.4 vs 28.5 ms, range 2.6) to 15x (CodeLlama-34B codegen).
#[test]
fn first_cycle_has_longer_ttft_than_the_cycles_after() {
    let mut checked = 0;
    for run in per_request_runs() {
        if run.lengths.iter().any(Option::is_none) {
            continue;
        }
        let p = run.prompts;
        assert!(
            run.first_stage >= 10 * p,
            "{}: first stage too short",
            run.name
        );
        let cold = median_ttft(run, p * 7 / 10..p);
        let warm: Vec<f64> = (1..10)
            .map(|k| median_ttft(run, k * p..(k + 1) * p))
            .collect();
        let slowest = warm.iter().copied().fold(f64::MIN, f64::max);
        let fastest = warm.iter().copied().fold(f64::MAX, f64::min);
        let range = slowest - fastest;
        assert!(
            cold - slowest > range,
            "{}: cold median {cold:.1} ms, warm block medians {warm:.1?} (range {range:.1})",
            run.name
        );
        checked += 1;
    }
    assert_eq!(checked, 8, "runs with no failed request");
}
