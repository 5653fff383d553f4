//! Predictions from a pod's aggregates alone: the question llm-d's latency predictor
//! answers ("this pod has W waiting, R running, KV at k %, the new prompt has L tokens with a
//! prefix score s: what TTFT and TPOT will it see?"), answered by simulation.
//!
//! The aggregates are turned into a plausible per-request state of one instance of the
//! template pool ([`instance_from_aggregates`]): R running requests holding the resident KV
//! blocks between them, W waiting requests, and the cached part of the new prompt as cached
//! blocks. That state is forked and simulated with the new request like any mirrored
//! instance (PredictRouting's fork, without the second fork that measures the others); the
//! replications give the mean or a quantile and the spread. On a pod that serves both phases
//! every request that ends while the new one is served is replaced by an arrival, so the pod
//! keeps the load its aggregates describe (`replacement`). When the mirror knows the pod,
//! callers predict on the mirrored state instead ([`predict_on_mirrored`]).

use std::sync::Arc;

use crate::cluster::config::{ClusterConfig, InstanceConfig};
use crate::sim::{Outcome, RequestId, RequestSpec, SloClass};
use crate::workload::LengthDraw;

use super::build::{QUESTION_REQUEST_ID, draw_lengths, prompt_content, restore_base};
use super::cached::CachedBlocks;
use super::error::TwinError;
use super::limits::Limits;
use super::question::{CandidateRequest, OutputLength, SloTargets};
use super::run::{EventBudget, run_fork, run_until_done};
use super::sampling::{output_draw, stream};
use super::snapshot::{
    Gauges, InstanceState, MirrorSnapshot, ObservedRequest, TrafficStats, TwinSettings,
};
use super::stats::distribution;

mod pod_type;
mod replacement;

pub use pod_type::{POD_TYPES, PodType};
use replacement::{Replacement, run_replacing, stream_outputs};

/// The observation time of a synthesized instance (any fixed value: the state has no past).
pub const SYNTHETIC_NOW_US: u64 = 1_000_000;

/// First block key of the new prompt (keys of synthesized prompts never collide with it).
const PROMPT_KEY_BASE: u64 = 0xD170_0000_0000_0000;

/// First block key of the waiting requests' prompts on a decode pod (each its own 2^32 keys).
const WAITING_KEY_BASE: u64 = 0xD171_0000_0000_0000;

/// The aggregate features of one candidate pod and the new request, as the llm-d router
/// sends them (field names and meaning as in the peer's `PredictionRequest`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PodAggregates {
    /// KV cache usage in [0, 1].
    pub kv_cache_percentage: f64,
    /// The new request's prompt length.
    pub input_token_length: u32,
    /// Requests waiting on the pod.
    pub num_request_waiting: u32,
    /// Requests running on the pod.
    pub num_request_running: u32,
    /// Output tokens the new request has generated so far (0 before it starts).
    pub num_tokens_generated: u32,
    /// Fraction of the new prompt already cached on the pod, in [0, 1].
    pub prefix_cache_score: f64,
    /// The pod's role.
    pub pod_type: PodType,
    /// Prompt tokens dispatched to the pod and not yet prefilled.
    pub prefill_tokens_in_flight: u64,
    /// Tokens of the requests decoding on the pod.
    pub decode_tokens_in_flight: u64,
    /// Multimodal encoder input size (not simulated: ditto models text prompts).
    pub encoder_input_size: u64,
    /// Multimodal encoder cache hits (not simulated).
    pub encoder_matched_size: u64,
}

/// How an aggregate prediction is summarised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Objective {
    /// The mean over replications.
    Mean,
    /// This quantile over replications, in (0, 1).
    Quantile(f64),
}

/// Options of an aggregate prediction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AggregateOptions {
    /// Replications (each draws the in-flight requests' remaining lengths anew).
    pub replications: u32,
    /// Seed (same inputs and seed give the same answer).
    pub seed: u64,
    /// Simulated time after which a replication stops (µs).
    pub horizon_us: u64,
    /// Expected output length of the new request, tokens.
    pub output_tokens: u32,
    /// Mean or quantile.
    pub objective: Objective,
}

/// One predicted latency with its spread over replications, in ms.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Estimate {
    /// The mean or the configured quantile.
    pub value: f64,
    /// The mean over replications (the centre a conformal quantile is added to).
    pub mean: f64,
    /// Half the distance between the 16th and 84th percentiles (one standard deviation for a
    /// normal spread).
    pub uncertainty: f64,
    /// The 5th and 95th percentiles.
    pub bounds: (f64, f64),
}

/// What one aggregate prediction answers.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct AggregatePrediction {
    /// Time to first token of the new request.
    pub ttft: Estimate,
    /// Time per output token of the new request.
    pub tpot: Estimate,
    /// False when the pod could not serve the request (too long for it).
    pub valid: bool,
    /// Simulation events processed.
    pub events: u64,
}

/// The quantiles every aggregate prediction asks for (the objective's is added).
const SPREAD_QUANTILES: [f64; 4] = [0.05, 0.16, 0.84, 0.95];

/// The config holding only `config.instances[index]`: the pool template aggregates are
/// simulated on. Built once per config and reused for every entry.
pub fn single_instance_config(config: &ClusterConfig, index: usize) -> Option<ClusterConfig> {
    let instance = config.instances.get(index)?.clone();
    Some(ClusterConfig {
        instances: vec![instance],
        ..config.clone()
    })
}

/// A per-request state of `instance` that matches `aggregates`, observed at
/// [`SYNTHETIC_NOW_US`], and the new request with its cached prefix.
///
/// - KV usage becomes resident blocks shared evenly by the running requests (each decoding,
///   its context that many blocks long); with no usage reported, the decode tokens in flight
///   give the running requests' context instead.
/// - Waiting requests each carry an equal share of the prefill tokens in flight, or a prompt
///   as long as the new one when none are reported.
/// - The prefix score is the fraction of the new prompt's full blocks cached on the pod.
/// - By `pod_type`: a prefill pod's running requests are prompts half computed and every
///   request there, the new one too, ends at its first token; a decode pod holds the new
///   prompt's KV whole (pulled from its prefill pod), so it computes only the last token; so
///   do its waiting requests, their pulled blocks cached as far as the free blocks go.
pub fn instance_from_aggregates(
    instance: &InstanceConfig,
    aggregates: &PodAggregates,
    output_tokens: u32,
) -> (InstanceState, CandidateRequest) {
    let engine = &instance.engine;
    let block = u64::from(engine.block_size.max(1));
    let total_blocks = u64::from(engine.num_gpu_blocks);
    let max_len = u64::from(engine.effective_max_model_len().max(2));
    let prefill_pod = aggregates.pod_type == PodType::Prefill;
    let running_count = aggregates
        .num_request_running
        .min(engine.max_num_seqs.max(1));
    let kv = aggregates.kv_cache_percentage.clamp(0.0, 1.0);
    let resident_blocks = ((kv * total_blocks as f64).round() as u64).min(total_blocks);
    let running = synthetic_running(aggregates, running_count, resident_blocks * block, max_len);
    let waiting = synthetic_waiting(aggregates, block, max_len);
    let prompt_tokens = aggregates.input_token_length.max(1);
    // A prompt longer than the pod holds is refused before simulation: no more keys.
    let full_blocks = u64::from(prompt_tokens).min(max_len) / block;
    let block_hashes: Vec<u64> = (0..full_blocks).map(|i| PROMPT_KEY_BASE + i).collect();
    let free_blocks = total_blocks.saturating_sub(resident_blocks);
    // A decode pod receives the prompt's KV from its prefill pod: all of it is there when
    // the request is scheduled, and it computes only the prompt's last token.
    let cached_fraction = match aggregates.pod_type {
        PodType::Decode => 1.0,
        PodType::Monolithic | PodType::Prefill => aggregates.prefix_cache_score.clamp(0.0, 1.0),
    };
    let hit_blocks = ((cached_fraction * full_blocks as f64).floor() as u64).min(free_blocks);
    // A decode pod's waiting requests hold their pulled KV in what the new prompt leaves.
    let pulled = waiting
        .iter()
        .flat_map(|request| request.block_hashes.iter().copied())
        .take(free_blocks.saturating_sub(hit_blocks) as usize);
    let cached_blocks = CachedBlocks::from_keys(
        block_hashes[..hit_blocks as usize]
            .iter()
            .copied()
            .chain(pulled),
    );
    let state = InstanceState {
        instance_id: instance.id.clone(),
        observed_at_us: SYNTHETIC_NOW_US,
        waiting,
        running,
        step_end_us: None,
        gauges: Some(Gauges {
            running: aggregates.num_request_running,
            waiting: aggregates.num_request_waiting,
            kv_usage: kv,
            transfers: None,
        }),
        gauges_at_us: SYNTHETIC_NOW_US,
        cached_blocks,
        ..InstanceState::default()
    };
    // A prefill pod is sent the prompt with `max_tokens = 1` (llm-d's routing sidecar).
    let output = if prefill_pod {
        1
    } else {
        output_tokens
            .max(aggregates.num_tokens_generated.saturating_add(1))
            .max(1)
    };
    let request = CandidateRequest {
        prompt_tokens,
        token_ids: None,
        block_hashes,
        output: OutputLength::Point(output),
        max_tokens: output,
        priority: 0,
        slo_class: SloClass::Standard,
        slo: SloTargets::default(),
    };
    (state, request)
}

/// A pod's running requests from its aggregates: each a share of the resident KV (or of
/// the decode tokens in flight), at most half the model length; a prefill pod's are prompts
/// half computed, each ending at its first token.
fn synthetic_running(
    aggregates: &PodAggregates,
    running_count: u32,
    resident_tokens: u64,
    max_len: u64,
) -> Vec<ObservedRequest> {
    let prefill_pod = aggregates.pod_type == PodType::Prefill;
    let mut running = Vec::with_capacity(running_count as usize);
    if running_count > 0 {
        let per_request_tokens = if resident_tokens > 0 {
            resident_tokens / u64::from(running_count)
        } else {
            aggregates.decode_tokens_in_flight / u64::from(running_count)
        };
        // Leave room to decode: a context at most half the model length.
        let context = per_request_tokens.clamp(1, max_len / 2) as u32;
        for index in 0..running_count {
            let id = format!("running-{index}");
            running.push(if prefill_pod {
                // A prefill pod's running requests are prompts half computed (chunked
                // prefill), each ending at its first token.
                let mut request = synthetic_request(id, context, context.div_ceil(2), 0, max_len);
                request.max_tokens = 1;
                request
            } else {
                synthetic_request(id, context, context, 1, max_len)
            });
        }
    }
    running
}

/// A pod's waiting requests from its aggregates: an equal share of the prefill tokens in
/// flight each (or the new prompt's length); a decode pod's with pulled, keyed blocks.
fn synthetic_waiting(aggregates: &PodAggregates, block: u64, max_len: u64) -> Vec<ObservedRequest> {
    let prefill_pod = aggregates.pod_type == PodType::Prefill;
    let waiting_prompt = waiting_prompt(aggregates, max_len);
    let decode_pod = aggregates.pod_type == PodType::Decode;
    (0..aggregates.num_request_waiting)
        .map(|index| {
            let mut request =
                synthetic_request(format!("waiting-{index}"), waiting_prompt, 0, 0, max_len);
            if prefill_pod {
                request.max_tokens = 1;
            }
            if decode_pod {
                // Its KV is pulled from a prefill pod too: keyed blocks, cached below.
                let base = WAITING_KEY_BASE + (u64::from(index) << 32);
                request.block_hashes = (0..u64::from(waiting_prompt) / block)
                    .map(|i| base + i)
                    .collect();
            }
            request
        })
        .collect()
}

/// The prompt length of each waiting request: an equal share of the prefill tokens in
/// flight, or the new prompt's length when none are reported.
fn waiting_prompt(aggregates: &PodAggregates, max_len: u64) -> u32 {
    if aggregates.num_request_waiting > 0 && aggregates.prefill_tokens_in_flight > 0 {
        aggregates.prefill_tokens_in_flight / u64::from(aggregates.num_request_waiting)
    } else {
        u64::from(aggregates.input_token_length)
    }
    .clamp(1, (max_len / 2).max(1)) as u32
}

/// A synthesized request of the pod, arrived before the observation: the new request, which
/// arrives at [`SYNTHETIC_NOW_US`], must find it queued ahead of it whatever their prompts'
/// lengths (the front end's per-token delay would otherwise let a shorter new prompt reach
/// vLLM's FCFS queue first).
fn synthetic_request(
    id: String,
    prompt: u32,
    computed: u32,
    generated: u32,
    max_len: u64,
) -> ObservedRequest {
    ObservedRequest {
        request_id: id,
        arrival_us: 0,
        prompt_tokens: prompt,
        computed_tokens: computed,
        cached_tokens: 0,
        output_tokens: generated,
        max_tokens: (max_len.saturating_sub(u64::from(prompt)).max(1)).min(u64::from(u32::MAX))
            as u32,
        known_output_tokens: None,
        priority: 0,
        slo_class: SloClass::Standard,
        scheduled_tokens: 0,
        block_hashes: Vec::new(),
        token_ids: None,
    }
}

/// Predicts the new request's TTFT and TPOT on the state [`instance_from_aggregates`]
/// builds on `template` (a config with one instance, see [`single_instance_config`]).
pub fn predict_aggregates(
    template: &Arc<ClusterConfig>,
    settings: &Arc<TwinSettings>,
    aggregates: &PodAggregates,
    options: &AggregateOptions,
    limits: &Limits,
) -> Result<AggregatePrediction, TwinError> {
    let instance = template
        .instances
        .first()
        .ok_or_else(|| TwinError::invalid("config.instances", "the pool template is empty"))?;
    let (state, request) = instance_from_aggregates(instance, aggregates, options.output_tokens);
    // A pod that serves both phases keeps its load while the new request is served (see
    // `replacement`); a disaggregated pod's arrivals come through its peer and stay closed.
    let max_len = u64::from(instance.engine.effective_max_model_len().max(2));
    let replaced =
        (aggregates.pod_type == PodType::Monolithic).then(|| waiting_prompt(aggregates, max_len));
    let snapshot = MirrorSnapshot {
        generation: 0,
        config_generation: 0,
        config: Arc::clone(template),
        settings: Arc::clone(settings),
        instances: vec![Arc::new(state)],
        traffic: Arc::new(TrafficStats::default()),
        memo: Default::default(),
    };
    predict_on_state(
        &snapshot,
        0,
        request,
        SYNTHETIC_NOW_US,
        options,
        limits,
        replaced,
    )
    .map(|prediction| aggregates.pod_type.neutralise(prediction))
}

/// Predicts `request` on instance `index` of `snapshot` at `now_us` (the mirrored state of a
/// pod an entry was matched to, or a synthesized one).
///
/// Each replication restores the instance (unknown output lengths drawn from the
/// replication's stream), rolls it forward to `now_us`, submits the request and runs to its
/// end (closed form once only time changes the batch). This is PredictRouting's fork with
/// the request, without the fork that measures the impact on the others: the predictor API
/// asks only about the new request.
pub fn predict_on_mirrored(
    snapshot: &MirrorSnapshot,
    index: usize,
    request: CandidateRequest,
    now_us: u64,
    options: &AggregateOptions,
    limits: &Limits,
) -> Result<AggregatePrediction, TwinError> {
    predict_on_state(snapshot, index, request, now_us, options, limits, None)
}

/// [`predict_on_mirrored`], with every request that ends replaced by an arrival of
/// `replaced` prompt tokens when it is set (the pod's load held, see `replacement`).
fn predict_on_state(
    snapshot: &MirrorSnapshot,
    index: usize,
    request: CandidateRequest,
    now_us: u64,
    options: &AggregateOptions,
    limits: &Limits,
    replaced: Option<u32>,
) -> Result<AggregatePrediction, TwinError> {
    let instance = snapshot
        .config
        .instances
        .get(index)
        .ok_or_else(|| TwinError::invalid("instance", format!("no instance at {index}")))?;
    let state = &snapshot.instances[index];
    check_asked(state, now_us, options, limits)?;
    let output = match request.output {
        OutputLength::Point(tokens) => tokens.max(1),
        OutputLength::Histogram(_) => options.output_tokens.max(1),
    };
    let needed = u64::from(request.prompt_tokens) + u64::from(request.max_tokens.max(output));
    if needed > u64::from(instance.engine.effective_max_model_len()) {
        // vLLM would refuse it at arrival: nothing to simulate.
        return Ok(AggregatePrediction::default());
    }
    let outputs = outputs_of(snapshot, replaced.is_some(), options.output_tokens)?;
    let replacement = replaced.map(|prompt_tokens| Replacement {
        prompt_tokens,
        outputs: &outputs,
        max_len: instance.engine.effective_max_model_len(),
    });
    let base = restore_base(instance, state, index, "instance")?;
    let budget = EventBudget::new(limits.max_events_per_call, limits.deadline);
    let horizon_end = now_us.saturating_add(options.horizon_us.min(limits.max_horizon_us));
    let spec = RequestSpec {
        id: RequestId(QUESTION_REQUEST_ID),
        arrival_us: now_us,
        input_tokens: request.prompt_tokens,
        output_tokens: output,
        max_tokens: request.max_tokens.max(output),
        slo_class: request.slo_class,
        priority: request.priority,
        deadline_us: None,
        content: prompt_content(&request.block_hashes, request.token_ids.as_ref()),
    };
    let mut ttft = Vec::with_capacity(options.replications as usize);
    let mut tpot = Vec::with_capacity(options.replications as usize);
    let mut events = 0;
    let mut dropped = 0;
    let mut base = Some(base);
    for replication in 0..options.replications {
        // The last replication takes the restored engine itself (a clone is most of a fork's
        // cost).
        let mut engine = if replication + 1 == options.replications {
            base.take()
        } else {
            base.clone()
        }
        .ok_or_else(|| TwinError::invalid("replications", "no engine left to fork"))?;
        let mut rng = stream(options.seed, replication, "twin/aggregate-lengths");
        draw_lengths(&mut engine, state, index, &outputs, &mut rng, "instance")?;
        events += run_until_done(&mut engine, now_us, &budget)?;
        engine.run_until(now_us);
        // Watched: its record and first token are read in O(1), not by scanning.
        engine
            .submit_watched(spec.clone())
            .map_err(|err| TwinError::invalid("request", err.to_string()))?;
        let drained = match &replacement {
            Some(replacement) => {
                events += run_replacing(&mut engine, replacement, &mut rng, horizon_end, &budget)?;
                None
            }
            None => {
                let run = run_fork(&mut engine, spec.id, horizon_end, &budget)?;
                events += run.events;
                run.question
            }
        };
        let record = engine.watched_record().or(drained.as_ref());
        match record {
            Some(record) if record.outcome == Outcome::Dropped => dropped += 1,
            _ => {
                let (first, per_token) = latencies_ms(&engine, record, now_us, horizon_end);
                ttft.push(first);
                tpot.push(per_token);
            }
        }
    }
    let mut quantiles = SPREAD_QUANTILES.to_vec();
    if let Objective::Quantile(alpha) = options.objective {
        quantiles.push(alpha);
    }
    Ok(AggregatePrediction {
        ttft: estimate(&distribution(&ttft, &quantiles), options.objective),
        tpot: estimate(&distribution(&tpot, &quantiles), options.objective),
        valid: dropped == 0,
        events,
    })
}

/// The output lengths a pod's requests are drawn from: on a pod whose load is held, its
/// stream's, around the new request's expected output (the aggregates carry none:
/// `replacement::stream_outputs`); otherwise the mirror's learned lengths or the twin
/// settings' distribution.
fn outputs_of(
    snapshot: &MirrorSnapshot,
    held: bool,
    expected: u32,
) -> Result<LengthDraw, TwinError> {
    if held {
        stream_outputs(expected)
    } else {
        output_draw(snapshot)
    }
}

/// Checks a question on a pod's state: asked at or after its observation, within the
/// replication limit.
fn check_asked(
    state: &InstanceState,
    now_us: u64,
    options: &AggregateOptions,
    limits: &Limits,
) -> Result<(), TwinError> {
    if state.observed_at_us > now_us {
        return Err(TwinError::invalid(
            "now_us",
            format!(
                "{now_us} precedes the observation at {}",
                state.observed_at_us
            ),
        ));
    }
    if options.replications == 0 || options.replications > limits.max_replications {
        return Err(TwinError::invalid(
            "replications",
            format!("must be in 1..={}", limits.max_replications),
        ));
    }
    Ok(())
}

/// The question's TTFT and TPOT (ms) in one replication: measured when it completed; when it
/// had not finished by the horizon, the TTFT censored there and the TPOT the pod's own decode
/// pace in that simulation.
fn latencies_ms(
    engine: &crate::sim::Engine,
    record: Option<&crate::sim::RequestRecord>,
    now_us: u64,
    horizon_end: u64,
) -> (f64, f64) {
    let ms = |us: u64| us as f64 / 1000.0;
    match record {
        Some(record) if record.outcome == Outcome::Completed => (
            record.ttft_us().map_or(0.0, ms),
            record.tpot_us().unwrap_or(0.0) / 1000.0,
        ),
        _ => {
            // Not finished within the horizon: its TTFT is censored there; its TPOT is the pace
            // the pod's other requests decoded at in the same simulation (the horizon is no
            // inter-token time), the horizon only when none of them finished either.
            let censored = ms(super::fork::elapsed_us(now_us, horizon_end));
            let first = engine.watched_first_token_us();
            let paces: Vec<f64> = engine
                .metrics()
                .records
                .iter()
                .filter(|r| r.outcome == Outcome::Completed)
                .filter_map(|r| r.tpot_us())
                .collect();
            let pace = if paces.is_empty() {
                censored
            } else {
                paces.iter().sum::<f64>() / paces.len() as f64 / 1000.0
            };
            (
                first.map_or(censored, |t| ms(super::fork::elapsed_us(now_us, t))),
                pace,
            )
        }
    }
}

fn estimate(distribution: &super::question::Distribution, objective: Objective) -> Estimate {
    let at = |q: f64| {
        distribution
            .quantiles
            .iter()
            .find(|level| (level.quantile - q).abs() < 1e-12)
            .map_or(distribution.mean, |level| level.value)
    };
    let value = match objective {
        Objective::Mean => distribution.mean,
        Objective::Quantile(alpha) => at(alpha),
    };
    Estimate {
        value,
        mean: distribution.mean,
        uncertainty: ((at(0.84) - at(0.16)) / 2.0).max(0.0),
        bounds: (at(0.05), at(0.95)),
    }
}
