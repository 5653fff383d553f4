//! The cluster's domain configuration: instances, router policy, admission, staleness.
//!
//! Plain data built from the cluster YAML (`cluster::spec`) or, in the twin, from the gRPC
//! `SyncClusterConfig` message. Everything is resolved: each instance carries its own engine
//! config and latency model, so heterogeneous pools need no lookups at run time.

use crate::sim::EngineConfig;
use crate::sim::latency::LatencyModel;

/// What an instance serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum InstanceRole {
    /// Prefill and decode (the only role simulated so far).
    #[default]
    Both,
    /// Prefill only (disaggregated serving).
    Prefill,
    /// Decode only (disaggregated serving).
    Decode,
}

/// One vLLM instance (pod) of the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceConfig {
    /// Stable id (for a pod: `namespace/pod:port`).
    pub id: String,
    /// Model name (for reporting).
    pub model: String,
    /// The HuggingFace `config.json` text the model was read from, when it is not an
    /// embedded one (`model_config`, `--model-dir`, SyncClusterConfig's `model_config_json`):
    /// kept so that GetSnapshot can hand back a config that re-syncs as it came. Shared, not
    /// copied, when instances are cloned.
    pub model_config_json: Option<std::sync::Arc<str>>,
    /// GPU name (for reporting).
    pub gpu: String,
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Role.
    pub role: InstanceRole,
    /// vLLM limits and switches.
    pub engine: EngineConfig,
    /// Step-time model.
    pub latency: LatencyModel,
    /// Cost of running the instance, per hour (any currency; used for capacity forecasts).
    pub cost_per_hour: f64,
}

/// An instance-side signal the router reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// Requests waiting (`vllm:num_requests_waiting`).
    QueueDepth,
    /// Requests running (`vllm:num_requests_running`).
    Running,
    /// KV-cache usage (`vllm:kv_cache_usage_perc`).
    KvUsage,
    /// The instance's cached prefix blocks (from KV events).
    PrefixCache,
}

/// How stale each signal is: a signal refreshes only every interval (µs); 0 means live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StalenessConfig {
    /// Refresh interval of the queue depth.
    pub queue_depth_us: u64,
    /// Refresh interval of the running count.
    pub running_us: u64,
    /// Refresh interval of the KV usage.
    pub kv_usage_us: u64,
    /// Refresh interval of the prefix-cache view (the KV-event delay).
    pub prefix_cache_us: u64,
}

impl StalenessConfig {
    /// Every signal refreshed every `interval_us` (the EPP's 50 ms poll tick by default).
    pub fn uniform(interval_us: u64) -> Self {
        Self {
            queue_depth_us: interval_us,
            running_us: interval_us,
            kv_usage_us: interval_us,
            prefix_cache_us: interval_us,
        }
    }

    /// The refresh interval of `signal`.
    pub fn interval_us(&self, signal: Signal) -> u64 {
        match signal {
            Signal::QueueDepth => self.queue_depth_us,
            Signal::Running => self.running_us,
            Signal::KvUsage => self.kv_usage_us,
            Signal::PrefixCache => self.prefix_cache_us,
        }
    }
}

/// The EPP's default poll tick: 50 ms.
pub const DEFAULT_REFRESH_INTERVAL_US: u64 = 50_000;

/// How the router estimates which instance holds a request's prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefixMode {
    /// A router-side LRU index of the blocks it sent to each instance (llm-d's default
    /// `approx-prefix-cache-producer`), holding at most this many blocks per instance.
    Approximate {
        /// Capacity of each instance's index, in blocks.
        blocks_per_instance: u32,
    },
    /// The instance's real cached blocks, as llm-d learns them from KV events.
    Precise,
}

/// One scorer of the weighted router; each scores an instance in [0, 1].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scorer {
    /// `(max_q − q) / (max_q − min_q)`, all equal → 1.
    QueueDepth,
    /// `1 − kv_usage`.
    KvCacheUtilization,
    /// Matched prefix blocks / request blocks.
    PrefixCache(PrefixMode),
    /// 0.5 at an empty queue, falling linearly to 0 at `threshold` waiting requests.
    LoadAware {
        /// Queue length that scores 0 (llm-d default 128).
        threshold: u32,
    },
    /// `(max − n) / max` over router-local in-flight requests, all 0 → 1.
    ActiveRequests,
    /// Min-max scaling of the running count, like the queue scorer.
    RunningRequests,
}

/// A scorer and its weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WeightedScorer {
    /// The scorer.
    pub scorer: Scorer,
    /// Its weight (non-negative).
    pub weight: f64,
}

/// How the weighted router picks among scored instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Picker {
    /// The highest score; ties broken by a seeded random choice.
    #[default]
    MaxScore,
    /// Random, with probability proportional to score.
    WeightedRandom,
}

/// The router's policy.
#[derive(Clone, Debug, PartialEq)]
pub enum RoutingPolicy {
    /// Instances in turn.
    RoundRobin,
    /// Uniformly at random (seeded).
    Random,
    /// Least queue + running + router in-flight; ties broken at random (seeded).
    LeastLoaded,
    /// vLLM's own data-parallel load balancer (`DPLBAsyncMPClient`, one API server): the
    /// lowest 4 · waiting + running from the counts the ranks last reported (the queue-depth
    /// and running signals, as stale as configured, assumed to refresh together; vLLM's
    /// coordinator publishes at most every 100 ms), plus 4 for each request sent to a rank
    /// since its queue depth was last refreshed; ties to the lowest index. What spreads
    /// requests over the ranks of one `--data-parallel-size` server.
    VllmDataParallel,
    /// A weighted sum of scorers, then a picker.
    Weighted {
        /// The scorers.
        scorers: Vec<WeightedScorer>,
        /// The picker.
        picker: Picker,
    },
}

impl RoutingPolicy {
    /// llm-d's default profile: queue 2, kv-cache 2, prefix 3 (approximate), max-score.
    pub fn llm_d_default() -> Self {
        RoutingPolicy::Weighted {
            scorers: vec![
                WeightedScorer {
                    scorer: Scorer::QueueDepth,
                    weight: 2.0,
                },
                WeightedScorer {
                    scorer: Scorer::KvCacheUtilization,
                    weight: 2.0,
                },
                WeightedScorer {
                    scorer: Scorer::PrefixCache(PrefixMode::Approximate {
                        blocks_per_instance: DEFAULT_PREFIX_INDEX_BLOCKS,
                    }),
                    weight: 3.0,
                },
            ],
            picker: Picker::MaxScore,
        }
    }
}

/// Blocks per instance in the router's approximate prefix index (llm-d's LRU size).
pub const DEFAULT_PREFIX_INDEX_BLOCKS: u32 = 31_250;

/// Which requests the gateway lets in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AdmissionPolicy {
    /// Admit everything.
    Always,
    /// A token bucket charged each request's prompt tokens.
    TokenBucket {
        /// Bucket size in tokens.
        capacity_tokens: f64,
        /// Refill rate in tokens per second.
        refill_tokens_per_s: f64,
    },
    /// The gateway's legacy flow control: reject `sheddable` and `background` requests while
    /// the pool's mean saturation `max(queue / queue_threshold, kv / kv_threshold)` is >= 1.
    SaturationShedding {
        /// Queue depth at which an instance counts as saturated (5).
        queue_threshold: f64,
        /// KV usage at which an instance counts as saturated (0.8).
        kv_threshold: f64,
    },
}

/// The whole cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterConfig {
    /// The instances, in a fixed order (their index is their tie-break rank).
    pub instances: Vec<InstanceConfig>,
    /// Routing policy.
    pub routing: RoutingPolicy,
    /// Admission policy.
    pub admission: AdmissionPolicy,
    /// Signal staleness.
    pub staleness: StalenessConfig,
}
