//! A synthesized pod's fork with its load held: every request that ends is replaced by a
//! new arrival at that moment, so the pod keeps the population its aggregates describe
//! while the new request waits, prefills and decodes.
//!
//! Why: the aggregates describe a pod in the middle of a stream of arrivals, not one that
//! is left to drain. Simulated as a closed system, the requests ahead of the new one are
//! served and nothing takes their place, so by the time it decodes the queue is empty and
//! its steps carry no prefill: its TPOT came out 1.3 to 1.9 times too fast on llm-d's
//! long-prompt traces. What arrives is not in the aggregates as a rate, but the population
//! is (the EPP's in-flight count): a pod whose load holds steady admits as many requests as
//! it finishes (Little's law), which is what the replacements do. Each arrives with the
//! prompt length of the pod's queued prompts and an output length drawn like the in-flight
//! requests'.
//!
//! Those output lengths are the stream's: the aggregates carry none (the EPP sends no output
//! length, and a synthesized pod has no mirrored traffic to learn them from), so they are
//! drawn around the one output length the predictor is told, the new request's expected
//! output (`--predictor-output-tokens`): the new request is one of the same stream. How long
//! the outputs are sets how often requests end and prompts arrive to prefill beside the
//! decode, so it sets the batch the new request decodes in (docs/fidelity/cold-traces.md).

use crate::sim::driver::{self, Supervisor};
use crate::sim::rng::SimRng;
use crate::sim::{Engine, PromptContent, RequestId, RequestSpec, SimError, SloClass};
use crate::workload::{LengthDist, LengthDraw};

use super::super::build::BACKGROUND_ARRIVALS_MAX;
use super::super::error::TwinError;
use super::super::run::EventBudget;

/// Events charged to the call's budget at a time.
const CHARGE_EVERY: u64 = 2048;

/// What replaces a request that ends: its prompt length and the draw of its output length.
#[derive(Clone, Copy, Debug)]
pub struct Replacement<'a> {
    /// Prompt tokens of each arrival.
    pub prompt_tokens: u32,
    /// Output lengths, drawn per arrival.
    pub outputs: &'a LengthDraw,
    /// The pod's longest sequence (prompt plus output), tokens.
    pub max_len: u32,
}

/// The output lengths of the stream a synthesized pod serves (its running requests'
/// final lengths and its arrivals'): normal around `expected` tokens with half of it as the
/// spread, at least 1 and at most `max(4096, 2 * expected)` (at the predictor's default 256
/// this is the twin's default output distribution, `TwinSettings::defaults`).
pub fn stream_outputs(expected: u32) -> Result<LengthDraw, TwinError> {
    let mean = f64::from(expected.max(1));
    LengthDist::gaussian(mean, mean / 2.0, 1, expected.saturating_mul(2).max(4096))
        .compile("output_tokens")
        .map_err(|err| TwinError::invalid("output_tokens", err.to_string()))
}

/// Runs `engine` until the watched request has a record (it finished or was dropped) or the
/// next event is after `end_us`, submitting one arrival per request that ends (drawn with
/// `rng`); returns the events processed.
pub fn run_replacing(
    engine: &mut Engine,
    replacement: &Replacement<'_>,
    rng: &mut SimRng,
    end_us: u64,
    budget: &EventBudget,
) -> Result<u64, TwinError> {
    let mut supervisor = Charged {
        budget,
        uncharged: 0,
        processed: 0,
        ended: ended(engine),
        spent: false,
    };
    let mut next_id = 1u64;
    loop {
        driver::drive(
            engine,
            std::iter::empty(),
            end_us,
            u64::MAX,
            &mut supervisor,
        )?;
        if supervisor.spent {
            return Err(TwinError::EventBudget {
                events: supervisor.processed,
            });
        }
        if engine.watched_record().is_some() || engine.next_event_us().is_none_or(|t| t > end_us) {
            break;
        }
        // Stopped on requests ending: as many arrive now.
        let now = engine.now_us();
        let ended_now = ended(engine);
        for _ in supervisor.ended..ended_now {
            if next_id >= BACKGROUND_ARRIVALS_MAX {
                break;
            }
            let spec = replacement.arrival(next_id, now, rng);
            next_id += 1;
            engine
                .submit(spec)
                .map_err(|err| TwinError::invalid("replacement", err.to_string()))?;
        }
        supervisor.ended = ended_now;
    }
    budget.charge(supervisor.uncharged, supervisor.processed)?;
    Ok(supervisor.processed)
}

impl Replacement<'_> {
    /// Arrival `id` at `now_us`.
    fn arrival(&self, id: u64, now_us: u64, rng: &mut SimRng) -> RequestSpec {
        let prompt = self.prompt_tokens.clamp(1, (self.max_len / 2).max(1));
        let output = self
            .outputs
            .sample(rng)
            .clamp(1, self.max_len.saturating_sub(prompt).max(1));
        RequestSpec {
            id: RequestId(id),
            arrival_us: now_us,
            input_tokens: prompt,
            output_tokens: output,
            max_tokens: output,
            slo_class: SloClass::Standard,
            priority: 0,
            deadline_us: None,
            content: PromptContent::Synthetic {
                prefix_group: None,
                prefix_len: 0,
            },
        }
    }
}

/// Requests that finished or timed out (a dropped arrival is not replaced: it never ran).
fn ended(engine: &Engine) -> u64 {
    let counts = engine.counts();
    counts.completed + counts.timed_out
}

/// The fork's run under the call's budget, stopping after each event that ends a request.
struct Charged<'a> {
    budget: &'a EventBudget,
    uncharged: u64,
    processed: u64,
    /// Requests ended when arrivals were last submitted.
    ended: u64,
    /// The call's event budget ran out.
    spent: bool,
}

impl Supervisor<Engine> for Charged<'_> {
    type Error = TwinError;
    const CHECK_EVERY: u64 = 256;

    fn check_events(&mut self, _processed: u64) -> Result<(), TwinError> {
        self.budget.check(self.processed)
    }

    fn after_event(&mut self, engine: &Engine) -> bool {
        self.processed += 1;
        self.uncharged += 1;
        if self.uncharged >= CHARGE_EVERY {
            if self.budget.charge(self.uncharged, self.processed).is_err() {
                self.spent = true;
                return true;
            }
            self.uncharged = 0;
        }
        engine.watched_record().is_some() || ended(engine) > self.ended
    }

    fn refused(&mut self, err: SimError) -> TwinError {
        TwinError::invalid("replacement", err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{
        AggregateOptions, AggregatePrediction, Objective, PodAggregates, PodType, SYNTHETIC_NOW_US,
        instance_from_aggregates, predict_on_state, single_instance_config,
    };
    use crate::cluster::spec::default_cluster;
    use crate::twin::Limits;
    use crate::twin::snapshot::{MirrorSnapshot, TrafficStats, TwinSettings};

    /// A busy pod with long prompts queued, its new request (128 output tokens) predicted
    /// with the pod's load held (`replaced`) or left to drain; the predictor's expected
    /// output length (the stream's, when the load is held) is `expected_output`.
    fn predict(replaced: Option<u32>, expected_output: u32) -> AggregatePrediction {
        let template = Arc::new(single_instance_config(&default_cluster(), 0).expect("one"));
        let aggregates = PodAggregates {
            kv_cache_percentage: 0.3,
            input_token_length: 4_000,
            num_request_waiting: 6,
            num_request_running: 24,
            num_tokens_generated: 0,
            prefix_cache_score: 0.0,
            pod_type: PodType::Monolithic,
            prefill_tokens_in_flight: 24_000,
            decode_tokens_in_flight: 0,
            encoder_input_size: 0,
            encoder_matched_size: 0,
        };
        let options = AggregateOptions {
            replications: 4,
            seed: 5,
            horizon_us: 600_000_000,
            output_tokens: expected_output,
            objective: Objective::Mean,
        };
        let (state, request) = instance_from_aggregates(&template.instances[0], &aggregates, 128);
        let snapshot = MirrorSnapshot {
            generation: 0,
            config_generation: 0,
            config: Arc::clone(&template),
            settings: Arc::new(TwinSettings::defaults()),
            instances: vec![Arc::new(state)],
            traffic: Arc::new(TrafficStats::default()),
            memo: Default::default(),
        };
        predict_on_state(
            &snapshot,
            0,
            request,
            SYNTHETIC_NOW_US,
            &options,
            &Limits::DEFAULT,
            replaced,
        )
        .expect("predicts")
    }

    /// With its load held the pod keeps prefilling arrivals while the new request decodes,
    /// so its TPOT is slower than on a pod left to drain; its TTFT, with the arrivals queued
    /// behind it, barely moves.
    #[test]
    fn a_pod_that_keeps_its_load_decodes_slower_than_one_left_to_drain() {
        let closed = predict(None, 128);
        let held = predict(Some(4_000), 128);
        assert!(closed.valid && held.valid);
        assert!(
            held.tpot.value > 1.08 * closed.tpot.value,
            "held {:?} closed {:?}",
            held.tpot,
            closed.tpot
        );
        let ttft_change = (held.ttft.value / closed.ttft.value - 1.0).abs();
        assert!(
            ttft_change < 0.1,
            "held {:?} closed {:?}",
            held.ttft,
            closed.ttft
        );
        // Deterministic: the same inputs give the same answer.
        assert_eq!(predict(Some(4_000), 128), held);
    }

    /// The stream's outputs set how often its requests end and prompts arrive to prefill
    /// beside the new request's decode: the same request (128 tokens) on the same held pod
    /// decodes faster in a stream of 1,024-token outputs than in one of 128-token outputs,
    /// and a pod left to drain does not depend on the stream at all.
    #[test]
    fn a_stream_of_longer_outputs_prefills_less_beside_the_decode() {
        let short = predict(Some(4_000), 128);
        let long = predict(Some(4_000), 1_024);
        assert!(short.valid && long.valid);
        assert!(
            long.tpot.value < 0.9 * short.tpot.value,
            "long {:?} short {:?}",
            long.tpot,
            short.tpot
        );
        assert_eq!(predict(None, 128), predict(None, 1_024));
    }
}
