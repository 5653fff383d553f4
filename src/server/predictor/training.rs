//! What training entries teach the calibration: the measured TTFT of monolithic and prefill
//! pods, the measured TPOT of monolithic and decode pods (`pod_type`), each beside its
//! simulated value; and whether a call's "TTFT" is really E2E (a router that does not
//! stream).

use super::Simulated;
use super::schema::TrainingEntry;
use crate::sim::latency::online::{LoadFeatures, Phase, load_features};
use crate::twin::aggregate::{AggregatePrediction, Estimate};

/// One measured latency beside its simulation: what the calibration learns from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainingSample {
    /// Which latency was measured (TTFT, or E2E when the router does not stream).
    pub phase: Phase,
    /// The latency simulated for the entry's features, ms.
    pub simulated_ms: f64,
    /// The load the entry was measured under (its tokens in flight, in thousands).
    pub load: LoadFeatures,
    /// The latency the router measured, ms.
    pub measured_ms: f64,
}

/// Entries in one training call that must all lack a TPOT before the calibration takes the
/// router for one that does not stream (a lone 1-token request must not flip the mode).
const E2E_EVIDENCE: usize = 5;

/// Whether a training call's TTFT samples measure end-to-end latency: a router with
/// llm-d's `streamingMode: false` records E2E as TTFT and trains no TPOT, so every entry of
/// a pod that decodes has `actual_tpot_ms` 0. Needs [`E2E_EVIDENCE`] such entries; fewer
/// keep the current mode.
pub(super) fn ttft_measures_e2e(entries: &[TrainingEntry], current: bool) -> bool {
    let both: Vec<&TrainingEntry> = entries
        .iter()
        .filter(|e| e.aggregates.pod_type.carries_ttft() && e.aggregates.pod_type.carries_tpot())
        .collect();
    if both.len() < E2E_EVIDENCE {
        return current;
    }
    both.iter().all(|e| e.actual_tpot_ms == 0.0)
}

/// A prediction's end-to-end estimate for `output_tokens` tokens: TTFT plus the remaining
/// tokens at the predicted TPOT (spreads and bounds added the same way).
pub(crate) fn e2e_estimate(prediction: &AggregatePrediction, output_tokens: u32) -> Estimate {
    let tokens = f64::from(output_tokens.saturating_sub(1));
    let (ttft, tpot) = (prediction.ttft, prediction.tpot);
    Estimate {
        value: ttft.value + tpot.value * tokens,
        mean: ttft.mean + tpot.mean * tokens,
        uncertainty: ttft.uncertainty + tpot.uncertainty * tokens,
        bounds: (
            ttft.bounds.0 + tpot.bounds.0 * tokens,
            ttft.bounds.1 + tpot.bounds.1 * tokens,
        ),
    }
}

/// The calibration samples of `entries` from their simulated `results`, and how many entries could not be simulated. When the router does not
/// stream (`e2e`), its "TTFT" is matched against the simulated E2E of `output_tokens`.
pub(super) fn samples(
    entries: &[TrainingEntry],
    results: Simulated,
    e2e: bool,
    output_tokens: u32,
) -> (Vec<TrainingSample>, u64) {
    let mut samples = Vec::with_capacity(entries.len() * 2);
    let mut unsimulated = 0;
    for (entry, result) in entries.iter().zip(results) {
        match result {
            Ok((prediction, _)) if prediction.valid => {
                let load = load_features(
                    entry.aggregates.prefill_tokens_in_flight,
                    entry.aggregates.decode_tokens_in_flight,
                );
                if entry.aggregates.pod_type.carries_ttft() {
                    let simulated = if e2e {
                        e2e_estimate(&prediction, output_tokens).value
                    } else {
                        prediction.ttft.value
                    };
                    samples.push(TrainingSample {
                        phase: Phase::Ttft,
                        simulated_ms: simulated,
                        load,
                        measured_ms: entry.actual_ttft_ms,
                    });
                }
                if entry.aggregates.pod_type.carries_tpot() {
                    samples.push(TrainingSample {
                        phase: Phase::Tpot,
                        simulated_ms: prediction.tpot.value,
                        load,
                        measured_ms: entry.actual_tpot_ms,
                    });
                }
            }
            _ => unsimulated += 1,
        }
    }
    (samples, unsimulated)
}
