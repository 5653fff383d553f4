//! The mirror's data: what the twin knows about each live instance, as plain immutable
//! values. A [`MirrorSnapshot`] is one consistent view (one generation) that predictions run
//! on while updates keep streaming into the store.
//!
//! Times are microseconds on the client's clock (for a live cluster: Unix time in µs), the
//! same clock as the request arrival times and observation times the cluster pushes.

use std::sync::Arc;

use crate::cluster::config::ClusterConfig;
use crate::sim::SloClass;
use crate::twin::cached::CachedBlocks;
use crate::twin::question::StalePolicy;
use crate::workload::LengthDist;

/// One request as observed on an instance (waiting or running).
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedRequest {
    /// The cluster's request id.
    pub request_id: String,
    /// When the request arrived (client clock, µs).
    pub arrival_us: u64,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Tokens whose KV is computed (vLLM `num_computed_tokens`); < prompt while prefilling.
    pub computed_tokens: u32,
    /// Prompt tokens served from the prefix cache when it was admitted.
    pub cached_tokens: u32,
    /// Output tokens generated so far.
    pub output_tokens: u32,
    /// The request's `max_tokens`.
    pub max_tokens: u32,
    /// The real final output length, when known (tests, replays); otherwise it is sampled.
    pub known_output_tokens: Option<u32>,
    /// vLLM priority (lower first).
    pub priority: i32,
    /// SLO class.
    pub slo_class: SloClass,
    /// Tokens it computes in the step in flight (0 if unknown or not in that step).
    pub scheduled_tokens: u32,
    /// Keys of the prompt's full blocks (opaque hashes, e.g. from vLLM KV events), if known.
    pub block_hashes: Vec<u64>,
    /// Prompt token ids, if known.
    pub token_ids: Option<Arc<[u32]>>,
}

/// Aggregate gauges an instance exports (`/metrics`).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Gauges {
    /// `vllm:num_requests_running`.
    pub running: u32,
    /// `vllm:num_requests_waiting`.
    pub waiting: u32,
    /// `vllm:kv_cache_usage_perc`, in [0, 1].
    pub kv_usage: f64,
    /// The pod's NIXL transfer counters, if it exports them (a decode pod pulling KV).
    pub transfers: Option<crate::cluster::transfer_fit::TransferCounters>,
}

/// What the mirror knows about one instance.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct InstanceState {
    /// The instance id (as in the config).
    pub instance_id: String,
    /// When the per-request state was observed (client clock, µs); 0 = never.
    pub observed_at_us: u64,
    /// Waiting requests, in the scheduler's queue order.
    pub waiting: Vec<ObservedRequest>,
    /// Running requests, in batch order.
    pub running: Vec<ObservedRequest>,
    /// End of the engine step in flight at the observation, when the observer knows it
    /// (client clock, µs); otherwise a new step is assumed to start at the observation.
    pub step_end_us: Option<u64>,
    /// Latest gauges, if any were pushed.
    pub gauges: Option<Gauges>,
    /// When the gauges were observed (client clock, µs).
    pub gauges_at_us: u64,
    /// Blocks cached on the GPU (from KV events), least recently stored first, under their
    /// keys, with the publisher's hashes so that a question naming them still hits (see
    /// [`CachedBlocks`]). Shared between snapshots: a copy costs O(1).
    pub cached_blocks: CachedBlocks,
    /// When the last KV event batch arrived (client clock, µs).
    pub kv_events_at_us: u64,
    /// Sequence number of the last KV event batch applied.
    pub kv_event_seq: u64,
    /// KV event sequence gaps detected so far (missed batches).
    pub kv_event_gaps: u64,
    /// Why the edge that feeds this instance (the live mirror) holds it stale, e.g. "metrics:
    /// GET /metrics timed out"; `None` when healthy or fed by pushes only. A stale instance
    /// is treated by the stale policy whatever its ages.
    pub stale_reason: Option<String>,
    /// What the feeding edge capped to the instance's limits in its last observation (a
    /// busier pod than the configured limits), e.g. `gauges.running 300 capped to
    /// max_num_seqs 256`; the state stays usable, so this does not make it stale.
    pub capped: Option<String>,
    /// The KV transfer model fitted to the pod's pulls (from the increments of its gauges'
    /// transfer counters); `None` when it never reported any.
    pub transfer_fit: Option<crate::cluster::transfer_fit::TransferFit>,
}

/// Traffic the mirror has observed, for background arrivals and output-length sampling.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TrafficStats {
    /// Observed arrival rate over the recent window, requests per second.
    pub arrivals_per_s: f64,
    /// Recent finished requests' (prompt tokens, output tokens), oldest first (bounded).
    pub recent_lengths: Vec<(u32, u32)>,
    /// The same, per pool: what each pool's own instances observed (a pool's forecast reads
    /// its own, `twin::desired`). One entry per pool that saw arrivals or finished requests.
    pub pools: Vec<PoolTraffic>,
}

/// Traffic one pool's instances observed. A pool: the instances of one name (the id's base
/// name, or the one `TwinSettings::variants` records), namespace and role.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PoolTraffic {
    /// The namespace the instance ids carry (empty when they carry none).
    pub namespace: String,
    /// The pool's name.
    pub name: String,
    /// The role its instances serve.
    pub role: crate::cluster::config::InstanceRole,
    /// Arrival rate over the recent window, requests per second.
    pub arrivals_per_s: f64,
    /// Recent finished requests' (prompt tokens, output tokens), oldest first (bounded).
    pub recent_lengths: Vec<(u32, u32)>,
}

/// Twin-level settings that come with the cluster config.
#[derive(Clone, Debug, PartialEq)]
pub struct TwinSettings {
    /// Stale-signal policy when a question names none.
    pub default_stale_policy: StalePolicy,
    /// Observed state older than this is stale (µs).
    pub max_signal_age_us: u64,
    /// Output-length distribution for requests whose length is unknown (in-flight requests
    /// are sampled from it conditioned on the tokens already generated), used until enough
    /// finished requests have been observed.
    pub output_tokens: LengthDist,
    /// Variant (pool) of the instances whose id does not say it: the live mirror names pods
    /// `host:port` and records their source's pool here, so the forecast loop groups a
    /// pool's pods into one variant. Empty when fed by pushes.
    pub variants: std::collections::BTreeMap<String, String>,
    /// What the live mirror inferred about each instance (pod) from what it can read (its
    /// args, its node, its `/metrics`), by instance id; shown on GetSnapshot. Empty when
    /// nothing is inferred (pushed configs, pools taken as configured).
    pub inferred: std::collections::BTreeMap<String, InferredSetup>,
    /// Prefill/decode disaggregation (the cluster YAML's `disaggregation:` section or
    /// SyncClusterConfig's `disaggregation`); `None` when not configured. A pool with
    /// prefill pods but no section is answered with every default (docs/disaggregation.md).
    pub disaggregation: Option<PdSettings>,
}

/// The disaggregation settings the twin answers pair questions with: the section as
/// resolved, its connector and link by name. The KV geometry is each instance's own
/// (computed per question from its model, TP and block size).
#[derive(Clone, Debug, PartialEq)]
pub struct PdSettings {
    /// The KV connector (`data/kv_connectors.json`).
    pub connector: String,
    /// The link (`data/kv_connectors.json`).
    pub link: String,
    /// The decider, prefill profile, transfer model and hold timeout (its `kv` empty).
    pub config: crate::cluster::disagg::DisaggConfig,
}

impl PdSettings {
    /// Resolves a `disaggregation:` section (YAML or wire) as `ditto run` does; errors name
    /// `disaggregation.*` fields.
    pub fn resolve(
        spec: &crate::cluster::spec::DisaggSpec,
    ) -> Result<Self, crate::cluster::spec::ClusterSpecError> {
        let config = crate::cluster::spec::resolve_disaggregation(spec, Vec::new())?;
        let name = |value: &Option<String>, default: &str| {
            value
                .as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .unwrap_or(default)
                .to_owned()
        };
        Ok(Self {
            connector: name(&spec.connector, crate::cluster::spec::DEFAULT_CONNECTOR),
            link: name(&spec.link, crate::cluster::spec::DEFAULT_LINK),
            config,
        })
    }
}

/// What the live mirror inferred about one pod, each value with where it came from
/// (`pod-args`, `metrics`, `gpu-request`, `node-label`, `default-gpu`, `pool`,
/// `vllm-default`; the config: `catalog`, `model-dir`, `hf-cache`, `pool`). A value that
/// could not be inferred is empty (the pod is then stale, its reason naming what is missing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InferredSetup {
    /// The served model (as the pod names it).
    pub model: String,
    /// Where the model name came from.
    pub model_source: String,
    /// Where the model's config.json came from.
    pub config_source: String,
    /// The catalog GPU.
    pub gpu: String,
    /// Where the GPU came from.
    pub gpu_source: String,
    /// Tensor-parallel degree (0: unknown).
    pub tp: u32,
    /// Where the TP came from.
    pub tp_source: String,
    /// The pool (variant) the pod is counted in: pods with the same settings share it.
    pub pool: String,
}

impl TwinSettings {
    /// Defaults: roll stale instances forward, 200 ms age limit (the EPP flow control's
    /// staleness threshold), outputs gaussian 256 ± 128 in [1, 4096].
    pub fn defaults() -> Self {
        Self {
            default_stale_policy: StalePolicy::RollForward,
            max_signal_age_us: 200_000,
            output_tokens: LengthDist::gaussian(256.0, 128.0, 1, 4096),
            variants: std::collections::BTreeMap::new(),
            inferred: std::collections::BTreeMap::new(),
            disaggregation: None,
        }
    }
}

/// One consistent view of the mirrored cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct MirrorSnapshot {
    /// Generation: increases with every accepted update (config, state, KV events).
    pub generation: u64,
    /// Generation of the cluster config in force.
    pub config_generation: u64,
    /// The cluster config.
    pub config: Arc<ClusterConfig>,
    /// Twin settings synced with the config.
    pub settings: Arc<TwinSettings>,
    /// Per-instance state, index-aligned with `config.instances`.
    pub instances: Vec<Arc<InstanceState>>,
    /// Observed traffic.
    pub traffic: Arc<TrafficStats>,
    /// Baseline forks already computed on this snapshot (a cache; cloning empties it).
    pub memo: crate::twin::memo::BaselineMemo,
}

impl MirrorSnapshot {
    /// Takes over what stays valid of `previous`'s memo (the snapshot this one was derived
    /// from): the memo entries of every instance whose state and config are the same objects,
    /// and their length-dependent entries only if the output-length distribution's inputs
    /// are equal too (see `twin::sampling::output_draw`).
    pub fn inherit_memo(&mut self, previous: &MirrorSnapshot) {
        if !Arc::ptr_eq(&self.config, &previous.config)
            || !Arc::ptr_eq(&self.settings, &previous.settings)
            || self.instances.len() != previous.instances.len()
        {
            return;
        }
        let unchanged: Vec<bool> = self
            .instances
            .iter()
            .zip(&previous.instances)
            .map(|(now, before)| Arc::ptr_eq(now, before))
            .collect();
        let lengths_unchanged = self.traffic.recent_lengths == previous.traffic.recent_lengths;
        self.memo = previous
            .memo
            .inherit(|index| unchanged[index], lengths_unchanged);
    }
}
