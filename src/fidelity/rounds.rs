//! The first round of a shared-prefix run against the second: how much a prompt's first
//! sending costs over its repeat.
//!
//! inference-perf sends P fixed prompts in turn ([`super::prompts`]), so a request numbered
//! below P carries a prompt the server has never seen and computes its whole prefill, and
//! one numbered P..2P finds that prompt in vLLM's prefix cache. The two rounds run at the
//! same load (the first stage), so the difference of their TTFT is the price of the prefill
//! the cache saves: a measured figure of the GEMMs' and attention's prefill cost that the
//! whole-run means, dominated by warm requests, barely see.
//!
//! Each round is summarised by its lower quartile of TTFT, not its median: a mixture of
//! experts' server stalls now and then in its first requests (Mixtral-8x7B "general": six
//! stalls of ~1 s in its first 65 requests, each followed by its queue draining, which puts
//! the first round's median at 240 ms against a lower quartile of 77), and the lower quartile
//! is clear of them where the median is not.

use super::replay::Replayed;
use super::run::MeasuredRun;
use crate::sim::metrics::interpolate_sorted;

/// Requests skipped at the start of a run: the server's first requests run slower for
/// reasons outside the model (a new batch shape's first launch; Llama-2-7b codegen's first
/// four take 130 / 80 / 68 / 67 ms against ~33 for the rest of its first round).
pub const WARM_UP_REQUESTS: u64 = 10;

/// One round's lower-quartile TTFT (ms), predicted and measured, over the same requests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundTtft {
    /// Requests in the round that succeeded in the measurement and in the replay.
    pub count: usize,
    /// Lower quartile of the predicted TTFT (ms).
    pub predicted_ms: f64,
    /// Lower quartile of the measured TTFT (ms).
    pub measured_ms: f64,
}

/// The first round (prompts new to the server, past the warm-up) and the second (the same
/// prompts again).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PromptRounds {
    /// Requests `WARM_UP_REQUESTS..P`.
    pub first: RoundTtft,
    /// Requests `P..2P`.
    pub second: RoundTtft,
}

impl PromptRounds {
    /// What the first round costs over the second (ms), predicted and measured.
    pub fn cold_extra_ms(&self) -> (f64, f64) {
        (
            self.first.predicted_ms - self.second.predicted_ms,
            self.first.measured_ms - self.second.measured_ms,
        )
    }
}

/// The two rounds of a per-request shared-prefix run (`None` for other runs, or when a
/// round has no request scored).
pub fn prompt_rounds(run: &MeasuredRun, replayed: &Replayed) -> Option<PromptRounds> {
    let shape = run.shared_prefix.filter(|_| run.has_requests())?;
    let pool = shape.prompts();
    let round = |from: u64, to: u64| -> Option<RoundTtft> {
        let (mut predicted, mut measured): (Vec<f64>, Vec<f64>) = replayed
            .requests
            .iter()
            .filter(|r| (from..to).contains(&r.sent))
            .filter_map(|r| r.measured.map(|(ttft, _)| (r.ttft_us / 1e3, ttft / 1e3)))
            .unzip();
        predicted.sort_by(f64::total_cmp);
        measured.sort_by(f64::total_cmp);
        (!predicted.is_empty()).then(|| RoundTtft {
            count: predicted.len(),
            predicted_ms: interpolate_sorted(&predicted, 25.0),
            measured_ms: interpolate_sorted(&measured, 25.0),
        })
    };
    Some(PromptRounds {
        first: round(WARM_UP_REQUESTS.min(pool), pool)?,
        second: round(pool, 2 * pool)?,
    })
}
