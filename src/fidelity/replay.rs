//! Replaying a measured run through the engine: same arrivals, token counts, vLLM limits and
//! GPU blocks, and the latency model under test.
//!
//! Which output length is simulated: with `ignore_eos` and a configured `output_len` (the
//! published runs: 248 or 247), the server generated exactly that many tokens for every
//! request, so that is what the engine generates ([`OutputLength::Configured`]). The
//! per-request `output_tokens` in `replay_requests.json` is the client's recount of the
//! streamed text, which differs (on the Llama-2 run it averages 209 with some 0s, because
//! the detokenized text re-tokenizes to fewer tokens); simulating it would shorten every
//! request's decode by the recount error. [`OutputLength::Recount`] is there for runs
//! without `ignore_eos`.
//!
//! Shared prefixes: the workloads send one of P fixed prompts (G system prompts, each ahead of
//! P / G questions) in turn, request number `n` prompt `n mod P` ([`super::prompts`]); vLLM's
//! prefix cache holds a prompt's full blocks between its sendings, so the replay gives each
//! request its prompt's block keys (`repeated_prompts`). Without them (`--no-repeated-prompts`)
//! only the system prompt is shared: request `i` gets group `i mod G`.
//!
//! Failed requests (the overloaded runs: the client's timeout) are replayed too: they loaded
//! the server until the client abandoned them. Every replayed request carries the load
//! generator's timeout as its deadline ([`MeasuredRun::client_timeout_us`]), at which the
//! engine aborts it (KV freed, out of the batch or queue, counted as timed out). A failed
//! request whose lengths were lost keeps its arrival; with the load generator's fixed
//! prompts it gets its own prompt's length (that of a succeeded request of the same number
//! mod P), else lengths drawn (seeded, stream
//! `fidelity-lost-lengths`) from the run's own succeeded requests: a succeeded request is
//! drawn and its prompt shifted by the multi-turn growth per round times the rounds between
//! the two (a user's `r`-th request is request `r · users + u`; the growth is the slope of
//! the succeeded prompts over their round, which the published runs measure as ~0: their
//! prompts stay at system + question + template in every round), and it generates the
//! configured output length under `ignore_eos` (else the drawn request's recount).
//!
//! A data-parallel server (`dp` > 1 in the run's records: one vLLM server of `dp` ranks of
//! `tp` GPUs, its own load balancer spreading the requests) is replayed as `dp` replicas of
//! the measured server in a [`Cluster`] (see `replicas`).
//!
//! Summary-only runs (no replay files) get seeded Poisson arrivals per stage, prompts of
//! system + question + [`TEMPLATE_TOKENS`] ± 16 tokens, and the configured output length;
//! runs known from `/metrics` histograms draw prompt and output lengths from the histograms
//! (uniform inside a bucket, corrected toward the exact means: `prom_text::sample`).

use rand_core::Rng;

use crate::catalog;
use crate::cluster::config::{
    AdmissionPolicy, InstanceConfig, InstanceRole, RoutingPolicy, StalenessConfig,
};
use crate::cluster::{Cluster, ClusterConfig};
use crate::sim::latency::{GpuSpec, LatencyModel};
use crate::sim::metrics::Outcome;
use crate::sim::rng::RngStreams;
use crate::sim::rng::unit;
use crate::sim::{Engine, EngineConfig, OffloadConnector, RequestSpec};

use super::FidelityError;
use super::prompts::PromptPool;
use super::run::{MeasuredRun, SharedPrefix};
use crate::prom_text::{self, Histogram};

/// Prompt tokens the chat template and BOS add to system prompt + question (measured on the
/// H100 "general" runs: 575.5 mean prompt for 100 + 447 configured).
pub const TEMPLATE_TOKENS: u32 = 28;

/// Event budget of one replay (a 20k-request run needs about 10M).
const REPLAY_EVENTS_MAX: u64 = 200_000_000;

/// Which output length each replayed request generates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputLength {
    /// The configured `output_len` when the server ignored EOS, else the recount.
    Auto,
    /// The configured `output_len` (requires one).
    Configured,
    /// The client's per-request recount.
    Recount,
}

/// How to replay a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Output length choice.
    pub output_length: OutputLength,
    /// Give requests their shared system prompt (prefix caching hits).
    pub shared_prefix: bool,
    /// With `shared_prefix`: give each request the whole prompt the load generator sent it,
    /// one of the P prompts it cycles through ([`super::prompts`]), so a prompt seen before
    /// hits the prefix cache in full; else only the system prompt is shared.
    pub repeated_prompts: bool,
    /// Seed of what a replay draws: summary-only runs' arrivals and lengths, and lost lengths
    /// of failed requests.
    pub seed: u64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            output_length: OutputLength::Auto,
            shared_prefix: true,
            repeated_prompts: true,
            seed: 42,
        }
    }
}

/// One completed request's prediction, beside its measurement when the run has one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplayedRequest {
    /// Stage index.
    pub stage: usize,
    /// Predicted TTFT (µs).
    pub ttft_us: f64,
    /// Predicted E2E (µs).
    pub e2e_us: f64,
    /// Measured TTFT and E2E (µs), for requests that succeeded in a per-request run (`None`
    /// for one that failed in the measurement, and in summary-only runs).
    pub measured: Option<(f64, f64)>,
    /// Tokens the client counted (the measured run's recount, or the simulated length).
    pub output_recount: u32,
    /// The request's place in the order the load generator sent them (the measured index;
    /// in a summary-only run the generated order): with a prompt pool of P, a request whose
    /// number is below P carries a prompt never sent before.
    pub sent: u64,
}

/// A replayed run.
#[derive(Clone, Debug, PartialEq)]
pub struct Replayed {
    /// Requests that completed in the simulation, in arrival order.
    pub requests: Vec<ReplayedRequest>,
    /// Requests that did not complete (dropped, timed out).
    pub unfinished: u64,
    /// Of those, requests the simulated client abandoned at its timeout.
    pub timed_out: u64,
    /// Requests replayed (succeeded and failed in the measurement, or generated).
    pub total: u64,
    /// The GPU blocks simulated.
    pub num_gpu_blocks: u32,
    /// The output length simulated per request, when uniform.
    pub output_len: Option<u32>,
}

/// Resolves the run's GPU: `override_name`, else the recorded hardware (`A100-80GB` is
/// `A100-80`), else a catalog GPU named at the start of the run's name (`h100-...`).
pub fn resolve_gpu(
    run: &MeasuredRun,
    override_name: Option<&str>,
) -> Result<GpuSpec, FidelityError> {
    let mut names: Vec<String> = Vec::new();
    if let Some(name) = override_name {
        return Ok(catalog::gpu(name)?);
    }
    if let Some(hardware) = &run.gpu {
        names.push(hardware.clone());
        names.push(
            hardware
                .trim_end_matches("GB")
                .trim_end_matches('-')
                .to_string(),
        );
    }
    if let Some(prefix) = run.name.split(['-', '_']).next() {
        names.push(prefix.to_string());
    }
    names
        .iter()
        .find_map(|name| catalog::gpu(name).ok())
        .ok_or_else(|| FidelityError::Missing {
            what: "GPU",
            reason: format!(
                "run `{}` records no known GPU ({:?}); pass --gpu",
                run.name, run.gpu
            ),
        })
}

/// The engine configuration the measured server ran with.
pub fn engine_config(run: &MeasuredRun, gpu: &GpuSpec) -> Result<EngineConfig, FidelityError> {
    let num_gpu_blocks = match run.num_gpu_blocks {
        Some(blocks) => blocks,
        None => super::blocks::derived_gpu_blocks_per_rank(
            &run.arch,
            gpu,
            run.tp,
            run.dp,
            run.gpu_memory_utilization,
            run.block_size,
        )?,
    };
    let max_model_len = run
        .max_model_len
        .unwrap_or(run.arch.max_position_embeddings);
    let mut config = EngineConfig::vllm_defaults(num_gpu_blocks, max_model_len);
    config.block_size = run.block_size;
    config.max_num_seqs = run.max_num_seqs;
    config.max_num_batched_tokens = run.max_num_batched_tokens;
    config.kv_sample_interval_us = 0;
    config.offload_connector = run
        .offload_connector_bytes
        .map(|bytes| OffloadConnector::of_bytes(bytes, &run.arch, run.tp, run.block_size));
    config.validate().map_err(|err| FidelityError::Missing {
        what: "engine limits",
        reason: format!("{}: {}", err.field, err.reason),
    })?;
    Ok(config)
}

/// Replays `run` with `latency` on an engine configured as the measured server.
pub fn replay(
    run: &MeasuredRun,
    config: &EngineConfig,
    latency: LatencyModel,
    options: ReplayOptions,
) -> Result<Replayed, FidelityError> {
    let output_len = simulated_output_len(run, options.output_length)?;
    let (mut requests, measured, sent) = if run.has_requests() {
        measured_requests(run, output_len, options)
    } else {
        let requests = requests(run, output_len, options);
        let n = requests.len();
        (requests, vec![None; n], (0..n as u64).collect())
    };
    if let Some(timeout) = run.client_timeout_us {
        for request in &mut requests {
            request.deadline_us = Some(request.arrival_us.saturating_add(timeout));
        }
    }
    let arrivals: Vec<u64> = requests.iter().map(|r| r.arrival_us).collect();
    let generated: Vec<u32> = requests.iter().map(|r| r.output_tokens).collect();
    let engines = if run.dp > 1 {
        // A mixture of experts at dp > 1 runs expert-parallel (the dataset's pipeline adds
        // `--enable-expert-parallel`); a dense model's ranks are independent.
        let latency = if run.arch.is_moe() {
            latency.with_expert_parallel(run.dp)
        } else {
            latency
        };
        replicas(run, config, latency, options.seed, requests)?
    } else {
        let mut engine = Engine::new(config.clone(), latency)?;
        engine.run(requests, REPLAY_EVENTS_MAX)?;
        vec![engine]
    };
    let mut by_id: Vec<Option<(f64, f64)>> = vec![None; arrivals.len()];
    let mut timed_out = 0;
    for record in engines.iter().flat_map(|engine| &engine.metrics().records) {
        if record.outcome == Outcome::TimedOut {
            timed_out += 1;
        }
        let (Some(ttft), Some(e2e)) = (record.ttft_us(), record.e2e_us()) else {
            continue;
        };
        if let Some(slot) = usize::try_from(record.id.0)
            .ok()
            .and_then(|i| by_id.get_mut(i))
        {
            *slot = Some((ttft as f64, e2e as f64));
        }
    }
    let mut replayed = Replayed {
        requests: Vec::with_capacity(arrivals.len()),
        unfinished: 0,
        timed_out,
        total: arrivals.len() as u64,
        num_gpu_blocks: config.num_gpu_blocks,
        output_len,
    };
    for (i, predicted) in by_id.into_iter().enumerate() {
        let Some((ttft_us, e2e_us)) = predicted else {
            replayed.unfinished += 1;
            continue;
        };
        let truth = measured[i];
        replayed.requests.push(ReplayedRequest {
            stage: run.stage_of(arrivals[i]),
            ttft_us,
            e2e_us,
            measured: truth.and_then(|(t, e, _)| t.zip(e)),
            output_recount: truth.map_or(generated[i], |(_, _, n)| n),
            sent: sent[i],
        });
    }
    Ok(replayed)
}

/// A data-parallel run (`run.dp` > 1): `dp` replicas of the measured server, each with
/// its limits and blocks, behind vLLM's data-parallel load balancer
/// ([`RoutingPolicy::VllmDataParallel`]: the rank with the lowest waiting × 4 + running
/// from the counts reported every [`DP_STATS_INTERVAL_US`], plus 4 for each request sent
/// since, ties to the first rank). Returns the replicas once every request has finished.
fn replicas(
    run: &MeasuredRun,
    config: &EngineConfig,
    latency: LatencyModel,
    seed: u64,
    requests: Vec<RequestSpec>,
) -> Result<Vec<Engine>, FidelityError> {
    let instance = |index: u32| InstanceConfig {
        id: format!("dp{index}"),
        model: run.arch.name.clone(),
        model_config_json: None,
        gpu: run.gpu.clone().unwrap_or_default(),
        tp: run.tp,
        role: InstanceRole::Both,
        engine: config.clone(),
        latency: latency.clone(),
        cost_per_hour: 0.0,
    };
    let cluster_config = ClusterConfig {
        instances: (0..run.dp).map(instance).collect(),
        routing: RoutingPolicy::VllmDataParallel,
        admission: AdmissionPolicy::Always,
        staleness: StalenessConfig::uniform(DP_STATS_INTERVAL_US),
    };
    // The balancer draws nothing; the seed only names the cluster's streams.
    let mut cluster = Cluster::new(cluster_config, seed)?;
    cluster.run(requests, REPLAY_EVENTS_MAX)?;
    Ok(cluster.into_engines())
}

/// How often vLLM's data-parallel replicas report their queue and running counts to the
/// load balancer (its coordinator publishes them every 100 ms).
pub const DP_STATS_INTERVAL_US: u64 = 100_000;

/// The uniform output length to simulate, or `None` for the per-request recount.
fn simulated_output_len(
    run: &MeasuredRun,
    choice: OutputLength,
) -> Result<Option<u32>, FidelityError> {
    match choice {
        OutputLength::Recount if run.has_requests() => Ok(None),
        OutputLength::Auto | OutputLength::Recount if run.output_lengths.is_some() => Ok(None),
        OutputLength::Auto if run.has_requests() && !run.ignore_eos => Ok(None),
        _ => run
            .configured_output_len
            .map(Some)
            .ok_or_else(|| FidelityError::Missing {
                what: "output length",
                reason: format!(
                    "run `{}` records no configured output_len (summary-only runs need one)",
                    run.name
                ),
            }),
    }
}

/// Measured TTFT, E2E (µs; `None` for a request that failed) and the client's recount.
type Truth = Option<(Option<f64>, Option<f64>, u32)>;

/// A per-request run's requests to simulate, succeeded and failed, in arrival order (ids =
/// position), each beside its measurement. Failed requests with lost lengths get them drawn
/// (see the module doc).
fn measured_requests(
    run: &MeasuredRun,
    output_len: Option<u32>,
    options: ReplayOptions,
) -> (Vec<RequestSpec>, Vec<Truth>, Vec<u64>) {
    // (arrival, measured id, input, recount, measurement)
    let mut rows: Vec<(u64, u64, u32, u32, Truth)> = run
        .requests
        .iter()
        .map(|r| {
            let truth = (Some(r.ttft_us), Some(r.e2e_us), r.output_recount);
            (
                r.arrival_us,
                r.id,
                r.input_tokens,
                r.output_recount,
                Some(truth),
            )
        })
        .collect();
    let users = run.shared_prefix.map_or(1, |s| s.prompts());
    // Estimated from the data whether or not the profile says multi-turn (what ran,
    // `results/config.yaml`, does not record the flag): single-turn prompts give ~0.
    let growth = prompt_growth_per_round(run, users);
    let mut rng = RngStreams::new(options.seed).stream("fidelity-lost-lengths");
    // A user's context that grows from round to round (multi-turn chat) is not one of P
    // fixed prompts; the published runs' prompts do not grow (~0 tokens a round).
    let repeats = growth < 0.5 && repeated_shape(run, options).is_some();
    // With the load generator's fixed prompts, a failed request's prompt is the one its
    // number names, whose length the succeeded requests of the same prompt show.
    let mut prompt_lengths = std::collections::BTreeMap::new();
    if repeats {
        for r in &run.requests {
            prompt_lengths.entry(r.id % users).or_insert(r.input_tokens);
        }
    }
    for failed in &run.failed {
        let known = prompt_lengths.get(&(failed.id % users)).copied();
        let (input, recount) = match failed.input_tokens.or(known) {
            Some(input) => (input, output_len.unwrap_or(1)),
            None => {
                // `run.requests` is non-empty for a per-request run.
                let pick = (rng.next_u64() % run.requests.len().max(1) as u64) as usize;
                let donor = &run.requests[pick.min(run.requests.len().saturating_sub(1))];
                let rounds = (failed.id / users) as f64 - (donor.id / users) as f64;
                let input = (f64::from(donor.input_tokens) + growth * rounds).round();
                (
                    input.clamp(1.0, f64::from(u32::MAX / 4)) as u32,
                    donor.output_recount,
                )
            }
        };
        let truth = (None, failed.e2e_us, recount);
        rows.push((failed.arrival_us, failed.id, input, recount, Some(truth)));
    }
    rows.sort_by_key(|row| (row.0, row.1));
    let prefix = run.shared_prefix.filter(|_| options.shared_prefix);
    let max_input = rows.iter().map(|row| row.2).max().unwrap_or(0);
    let pool = prompt_pool(run, options, max_input).filter(|_| repeats);
    let mut specs = Vec::with_capacity(rows.len());
    let mut truths = Vec::with_capacity(rows.len());
    let mut sent = Vec::with_capacity(rows.len());
    for (i, (arrival_us, measured_id, input, recount, truth)) in rows.into_iter().enumerate() {
        sent.push(measured_id);
        let out = output_len.unwrap_or(recount).max(1);
        let mut spec = RequestSpec::synthetic(i as u64, arrival_us, input, out);
        match (&pool, prefix) {
            // The measured index is the order the load generator sent the requests in.
            (Some(pool), _) => spec.content = pool.content(measured_id),
            (None, Some(shape)) if shape.system_prompt_len < input => {
                spec = spec.with_prefix(i as u64 % u64::from(shape.groups), shape.system_prompt_len)
            }
            _ => {}
        }
        specs.push(spec);
        truths.push(truth);
    }
    (specs, truths, sent)
}

/// The load generator's fixed prompts, when the run's workload is a shared-prefix one and
/// the options ask for whole prompts.
fn prompt_pool(run: &MeasuredRun, options: ReplayOptions, max_input: u32) -> Option<PromptPool> {
    repeated_shape(run, options).map(|shape| PromptPool::new(shape, run.block_size, max_input))
}

/// The run's shared-prefix shape when the options replay its prompts whole.
fn repeated_shape(run: &MeasuredRun, options: ReplayOptions) -> Option<SharedPrefix> {
    run.shared_prefix
        .filter(|_| options.shared_prefix && options.repeated_prompts)
}

/// Multi-turn growth: the least-squares slope of the succeeded requests' prompt length
/// over their round (`id / users`), never negative. 0 with fewer than two rounds.
pub fn prompt_growth_per_round(run: &MeasuredRun, users: u64) -> f64 {
    let points: Vec<(f64, f64)> = run
        .requests
        .iter()
        .map(|r| ((r.id / users.max(1)) as f64, f64::from(r.input_tokens)))
        .collect();
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 }
}

/// The requests to simulate, ids = position (0-based) in arrival order.
fn requests(
    run: &MeasuredRun,
    output_len: Option<u32>,
    options: ReplayOptions,
) -> Vec<RequestSpec> {
    let prefix = run.shared_prefix.filter(|_| options.shared_prefix);
    let with_prefix = |spec: RequestSpec, i: usize| match prefix {
        Some(shape) if shape.system_prompt_len < spec.input_tokens => {
            let group = i as u64 % u64::from(shape.groups);
            spec.with_prefix(group, shape.system_prompt_len)
        }
        _ => spec,
    };
    let shape = run.shared_prefix;
    let base = shape.map_or(512, |s| {
        s.system_prompt_len + s.question_len + TEMPLATE_TOKENS
    });
    let streams = RngStreams::new(options.seed);
    let mut rng = streams.stream("fidelity-arrivals");
    let mut arrivals = Vec::new();
    let limit = run.num_requests.unwrap_or(u64::MAX);
    for stage in &run.stages {
        let mut t = stage.start_us as f64;
        let end = (stage.start_us + stage.duration_us) as f64;
        loop {
            let u = unit(&mut rng);
            t += -(1.0 - u).ln() / stage.rate * 1e6;
            if t >= end || arrivals.len() as u64 >= limit {
                break;
            }
            let jitter = (rng.next_u64() % 33) as u32;
            arrivals.push((t as u64, (base + jitter).saturating_sub(16).max(1)));
        }
    }
    let n = arrivals.len();
    let prompts = run
        .prompt_lengths
        .as_ref()
        .map(|h| draw_lengths(h, n, &mut streams.stream("fidelity-prompt-lengths")));
    let outputs = run
        .output_lengths
        .as_ref()
        .map(|h| draw_lengths(h, n, &mut streams.stream("fidelity-output-lengths")));
    let mut inputs: Vec<u32> = (0..n)
        .map(|i| prompts.as_ref().map_or(arrivals[i].1, |p| p[i]))
        .collect();
    // Request `i` sends prompt `i mod P`: a prompt keeps the length it was drawn with first.
    let pool = prompt_pool(run, options, inputs.iter().copied().max().unwrap_or(0));
    if let Some(pool) = &pool {
        for i in pool.len()..n {
            inputs[i] = inputs[i % pool.len()];
        }
    }
    arrivals
        .into_iter()
        .zip(inputs)
        .enumerate()
        .map(|(i, ((arrival_us, _), input))| {
            let out = match (output_len, &outputs) {
                (Some(len), _) => len,
                (None, Some(outputs)) => outputs[i],
                (None, None) => 1,
            };
            let spec = RequestSpec::synthetic(i as u64, arrival_us, input, out.max(1));
            match &pool {
                Some(pool) => RequestSpec {
                    content: pool.content(i as u64),
                    ..spec
                },
                None => with_prefix(spec, i),
            }
        })
        .collect()
}

/// `n` lengths drawn from `histogram` (inverse CDF, uniform inside a bucket), corrected
/// toward the histogram's exact mean as the live mirror's rebuild does.
fn draw_lengths(histogram: &Histogram, n: usize, rng: &mut impl Rng) -> Vec<u32> {
    let correction = prom_text::mean_correction(histogram);
    (0..n)
        .map(|_| {
            let length = prom_text::sample(histogram, unit(rng)).map_or(1.0, |v| v * correction);
            length.round().clamp(1.0, f64::from(u32::MAX / 4)) as u32
        })
        .collect()
}
