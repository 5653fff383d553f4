//! Prefill/decode disaggregation: llm-d's `disagg-profile-handler` with the
//! `prefix-based-pd-decider`, and the KV transfer time model (docs/disaggregation.md).
//!
//! Plain data and pure functions: the decider's rule, the transfer time of a pull, the
//! per-instance KV geometry the model reads. `sim/pd/` runs it inside a `Cluster`.

use super::config::{InstanceRole, RoutingPolicy};
use crate::sim::metrics::LatencyStats;

/// llm-d's `prefix-based-pd-decider`: whether a request's prefill runs on a separate prefill
/// pod, from its prompt length and the tokens the chosen decode pod is believed to hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PdDecider {
    /// `nonCachedTokens`: the least uncached prompt tokens worth a remote prefill; 0 turns
    /// disaggregation off (llm-d's default 0; its sample P/D config sets 16).
    pub non_cached_tokens: u32,
    /// `promptTokens`: prompts shorter than this stay decode-only; 0 disables the gate.
    pub prompt_tokens: u32,
}

impl PdDecider {
    /// llm-d's sample P/D configuration (`deploy/config/pd-epp-config.yaml`):
    /// `nonCachedTokens: 16`, no prompt gate.
    pub const LLM_D_SAMPLE: PdDecider = PdDecider {
        non_cached_tokens: 16,
        prompt_tokens: 0,
    };

    /// True if a prompt of `input_tokens` with `hit_tokens` believed cached on the decode pod
    /// should prefill remotely (llm-d's rule, in its order).
    pub fn disaggregate(&self, input_tokens: u32, hit_tokens: u32) -> bool {
        if self.non_cached_tokens == 0 {
            return false;
        }
        if self.prompt_tokens > 0 && input_tokens < self.prompt_tokens {
            return false;
        }
        if input_tokens < self.non_cached_tokens {
            return false;
        }
        input_tokens.saturating_sub(hit_tokens) >= self.non_cached_tokens
    }
}

/// The time model of one KV pull: a fixed setup, the bytes over the link, and a cost per
/// transfer descriptor (so small blocks cost more for the same prompt).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransferModel {
    /// Link bandwidth per direction per GPU pair, GB/s (catalog `links`).
    pub bandwidth_gb_s: f64,
    /// Cost of one descriptor, µs (catalog `connectors`; fitted to vLLM RFC 50913).
    pub descriptor_us: f64,
    /// Fixed cost of one request's transfer, µs (catalog `connectors`).
    pub setup_us: u64,
}

/// What the transfer model reads of an instance: its KV geometry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InstanceKv {
    /// KV bytes one token occupies on one of its GPUs (`ModelArch::kv_bytes_per_token(tp)`).
    pub bytes_per_token_per_rank: f64,
    /// Attention layers (one descriptor per block per layer per plane).
    pub layers: u32,
    /// Planes per layer: 2 (K and V) for standard attention, 1 for MLA's latent.
    pub planes: u32,
    /// Tensor-parallel degree.
    pub tp: u32,
    /// KV block size, tokens.
    pub block_size: u32,
}

impl TransferModel {
    /// µs to pull `tokens` prompt tokens of KV from `prefill` into `decode`: 0 for nothing,
    /// else `setup + bytes / bandwidth + descriptors × descriptor_us`. Each decode rank
    /// pulls its own shard (`tokens × decode's per-rank bytes`) in parallel with the others;
    /// a prefill GPU serves `ceil(tp_d / tp_p)` of them through its one link. Each decode
    /// rank posts one descriptor per block, layer and plane for each prefill rank it reads
    /// from (`max(1, tp_p / tp_d)`).
    pub fn transfer_us(&self, prefill: &InstanceKv, decode: &InstanceKv, tokens: u32) -> u64 {
        if tokens == 0 {
            return 0;
        }
        let fan_in = decode.tp.div_ceil(prefill.tp.max(1)).max(1);
        let bytes = f64::from(tokens) * decode.bytes_per_token_per_rank * f64::from(fan_in);
        let wire_us = bytes / (self.bandwidth_gb_s * 1e3);
        let sources = (prefill.tp / decode.tp.max(1)).max(1);
        let blocks = tokens.div_ceil(decode.block_size.max(1));
        let descriptors = u64::from(blocks)
            * u64::from(decode.layers)
            * u64::from(decode.planes)
            * u64::from(sources);
        let descriptor_us = descriptors as f64 * self.descriptor_us;
        self.setup_us
            .saturating_add((wire_us + descriptor_us).ceil() as u64)
    }
}

/// The order llm-d's `disagg-profile-handler` runs its profiles in (`stageOrder`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StageOrder {
    /// `decode-first` (llm-d's default): the decode profile picks a decode pod, the decider
    /// looks at the prompt's uncached tokens there, and only then the prefill profile runs.
    #[default]
    DecodeFirst,
    /// `prefill-first`: the prefill profile runs first, for every request (llm-d refuses a
    /// prefill decider in this order), then the decode profile (where llm-d's topology
    /// affinity scorers may compare against the prefill pick; not modelled).
    PrefillFirst,
}

impl StageOrder {
    /// llm-d's name for the order.
    pub fn as_str(self) -> &'static str {
        match self {
            StageOrder::DecodeFirst => "decode-first",
            StageOrder::PrefillFirst => "prefill-first",
        }
    }
}

/// Failures on the P/D path and what llm-d and vLLM do about them (docs/disaggregation.md,
/// "Failures and retries"). The default fails nothing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PdFaults {
    /// Probability that one prefill request from the decode pod's routing sidecar to the
    /// prefill pod fails with a retryable 5xx (502, 503, 504: a reset connection, a full
    /// accept queue) before the prefill pod admits it.
    pub prefill_failure_rate: f64,
    /// The sidecar's `--prefill-max-retries`: further attempts on the same prefill pod after
    /// a retryable failure (llm-d's default 0); after the last, the error goes to the client.
    pub prefill_max_retries: u32,
    /// The sidecar's `--prefill-retry-backoff`: the wait before each retry, µs (200 ms).
    pub prefill_retry_backoff_us: u64,
    /// Probability that one KV pull fails in transport (a NIXL transfer error): the decode
    /// pod recomputes the prompt (vLLM's `kv_load_failure_policy: recompute`), and the
    /// prefill pod, never notified, holds the KV until its hold expires.
    pub transfer_failure_rate: f64,
}

impl PdFaults {
    /// No failures; llm-d's retry defaults (0 retries, 200 ms backoff).
    pub const NONE: PdFaults = PdFaults {
        prefill_failure_rate: 0.0,
        prefill_max_retries: 0,
        prefill_retry_backoff_us: DEFAULT_PREFILL_RETRY_BACKOFF_US,
        transfer_failure_rate: 0.0,
    };
}

impl Default for PdFaults {
    fn default() -> Self {
        PdFaults::NONE
    }
}

/// The routing sidecar's `--prefill-retry-backoff` default: 200 ms.
pub const DEFAULT_PREFILL_RETRY_BACKOFF_US: u64 = 200_000;

/// Disaggregated serving: the decider, the prefill profile, the transfer model.
#[derive(Clone, Debug, PartialEq)]
pub struct DisaggConfig {
    /// The decider (decode-first only: prefill-first has none).
    pub decider: PdDecider,
    /// The order the handler runs its profiles in.
    pub stage_order: StageOrder,
    /// Failures and the sidecar's retries.
    pub faults: PdFaults,
    /// The prefill profile's policy (the decode profile is the cluster's `routing`).
    pub prefill_routing: RoutingPolicy,
    /// The KV transfer time model.
    pub transfer: TransferModel,
    /// Each instance's KV geometry, in the cluster's instance order.
    pub kv: Vec<InstanceKv>,
    /// How long a prefill pod holds a finished request's KV for its pull before freeing it
    /// (vLLM's `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`, 480 s); a pull that ends after that
    /// fails and the decode pod recomputes the prompt.
    pub hold_timeout_us: u64,
}

impl DisaggConfig {
    /// True if a request of `input_tokens`, `hit_tokens` of them believed cached on its
    /// decode pod, prefills on a separate pod (given one is picked): the decider's answer
    /// decode-first, always prefill-first (llm-d runs the prefill profile for every request
    /// in that order).
    pub fn remote_prefill(&self, input_tokens: u32, hit_tokens: u32) -> bool {
        match self.stage_order {
            StageOrder::DecodeFirst => self.decider.disaggregate(input_tokens, hit_tokens),
            StageOrder::PrefillFirst => true,
        }
    }
}

/// vLLM's `VLLM_NIXL_ABORT_REQUEST_TIMEOUT` default: 480 s.
pub const DEFAULT_HOLD_TIMEOUT_US: u64 = 480_000_000;

/// llm-d's P/D profiles (`deploy/config/pd-epp-config.yaml`): prefix-cache 2, queue 1,
/// max-score, the same for the prefill and the decode profile.
pub fn llm_d_pd_profile() -> RoutingPolicy {
    use super::config::{DEFAULT_PREFIX_INDEX_BLOCKS, Picker, PrefixMode, Scorer, WeightedScorer};
    RoutingPolicy::Weighted {
        scorers: vec![
            WeightedScorer {
                scorer: Scorer::PrefixCache(PrefixMode::Approximate {
                    blocks_per_instance: DEFAULT_PREFIX_INDEX_BLOCKS,
                }),
                weight: 2.0,
            },
            WeightedScorer {
                scorer: Scorer::QueueDepth,
                weight: 1.0,
            },
        ],
        picker: Picker::MaxScore,
    }
}

/// llm-d's `decode-filter`: decode or both (an unlabelled pod counts as both).
pub fn serves_decode(role: InstanceRole) -> bool {
    matches!(role, InstanceRole::Decode | InstanceRole::Both)
}

/// llm-d's `prefill-filter`: prefill or both.
pub fn serves_prefill(role: InstanceRole) -> bool {
    matches!(role, InstanceRole::Prefill | InstanceRole::Both)
}

/// Per-role metrics of a disaggregated run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PdSummary {
    /// Requests the decider sent to a prefill pod.
    pub disaggregated: u64,
    /// Requests served decode-only (decider said no, no prefill pod, or the prefill
    /// profile picked the decode pod itself).
    pub decode_only: u64,
    /// Disaggregated requests that ended on their prefill pod (dropped or timed out there).
    pub failed_on_prefill: u64,
    /// Pulls that failed (the prefill pod's hold expired first, or a transport failure):
    /// the decode pod recomputed the prompt.
    pub failed_pulls: u64,
    /// Of those, pulls failed in transport (`transfer_failure_rate`).
    pub transfer_failures: u64,
    /// Prefill attempts that failed with a retryable error (`prefill_failure_rate`).
    pub prefill_attempt_failures: u64,
    /// Retries the sidecars sent (`prefill_max_retries`).
    pub prefill_retries: u64,
    /// Requests whose last prefill attempt failed: the error went to the client, the
    /// request ended on its decode pod's sidecar without reaching either engine (counted
    /// dropped).
    pub prefill_errors: u64,
    /// Arrival to admission on the prefill pod (ms).
    pub prefill_queue: LatencyStats,
    /// Arrival to the prefill pod's first token (ms).
    pub prefill_ttft: LatencyStats,
    /// Decode pod arrival to its blocks reserved and the pull started (ms).
    pub decode_wait: LatencyStats,
    /// The pull itself (ms).
    pub transfer: LatencyStats,
    /// Prefill's first token to the decode pod's first token (ms): decode wait, transfer,
    /// step alignment and the first-token recompute.
    pub handover: LatencyStats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decider_follows_llm_d_rules() {
        let decider = PdDecider::LLM_D_SAMPLE;
        assert!(!decider.disaggregate(15, 0), "shorter than the threshold");
        assert!(decider.disaggregate(16, 0));
        assert!(!decider.disaggregate(1000, 990), "mostly cached");
        assert!(decider.disaggregate(1000, 984));
        let off = PdDecider {
            non_cached_tokens: 0,
            prompt_tokens: 0,
        };
        assert!(!off.disaggregate(100_000, 0), "0 disables");
        let gated = PdDecider {
            non_cached_tokens: 16,
            prompt_tokens: 512,
        };
        assert!(!gated.disaggregate(511, 0));
        assert!(gated.disaggregate(512, 0));
    }

    #[test]
    fn transfer_costs_bytes_descriptors_and_setup() {
        let model = TransferModel {
            bandwidth_gb_s: 10.0,
            descriptor_us: 2.0,
            setup_us: 100,
        };
        let kv = InstanceKv {
            bytes_per_token_per_rank: 1000.0,
            layers: 4,
            planes: 2,
            tp: 1,
            block_size: 16,
        };
        assert_eq!(model.transfer_us(&kv, &kv, 0), 0);
        // 160 tokens: 160,000 bytes at 10,000 bytes/µs = 16 µs; 10 blocks × 8 = 80
        // descriptors = 160 µs; + 100.
        assert_eq!(model.transfer_us(&kv, &kv, 160), 276);
        // TP 1 prefill to TP 4 decode: four quarter shards through one link.
        let decode = InstanceKv {
            bytes_per_token_per_rank: 250.0,
            tp: 4,
            ..kv
        };
        assert_eq!(model.transfer_us(&kv, &decode, 160), 276);
    }
}
