//! Engine configuration: the vLLM limits and switches of one instance.
//!
//! Names follow vLLM's engine arguments. Validation happens once, at engine construction,
//! and names the offending field.

use thiserror::Error;

/// Order in which the wait queue is served (vLLM's `--scheduling-policy`, plus `sjf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchedulingPolicy {
    /// First come, first served; preemption evicts the most recently admitted request.
    Fcfs,
    /// Lower priority value first, then earlier arrival, then lower id; preemption evicts the
    /// least urgent running request (highest priority value, latest arrival on ties).
    Priority,
    /// Shortest prompt first, then earlier arrival, then lower id; preemption as `fcfs`.
    Sjf,
}

impl SchedulingPolicy {
    /// The policy's name as configs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            SchedulingPolicy::Fcfs => "fcfs",
            SchedulingPolicy::Priority => "priority",
            SchedulingPolicy::Sjf => "sjf",
        }
    }

    /// Parses `fcfs`, `priority` or `sjf`.
    pub fn parse(name: &str) -> Option<SchedulingPolicy> {
        match name.trim().to_ascii_lowercase().as_str() {
            "fcfs" => Some(SchedulingPolicy::Fcfs),
            "priority" => Some(SchedulingPolicy::Priority),
            "sjf" => Some(SchedulingPolicy::Sjf),
            _ => None,
        }
    }
}

/// The limits and switches of one simulated vLLM instance.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Tokens per KV block (vLLM `--block-size`, default 16).
    pub block_size: u32,
    /// GPU KV blocks (vLLM's `num_gpu_blocks`, given or derived from memory).
    pub num_gpu_blocks: u32,
    /// CPU offload tier size in blocks; 0 disables the tier.
    pub num_cpu_blocks: u32,
    /// Cost of reloading one block from the CPU tier, added to the step that needs it.
    pub cpu_block_load_us: u64,
    /// Weights each GPU holds in host memory, GiB (vLLM's `--cpu-offload-gb`; 0: none).
    /// The engine does not read it: the KV blocks and the latency model are built with it
    /// ([`crate::sim::latency::offload`]); kept here so the instance's settings say it.
    pub cpu_offload_gb: f64,
    /// Most requests running at once (`--max-num-seqs`, default 256).
    pub max_num_seqs: u32,
    /// Token budget of one step (`--max-num-batched-tokens`, default 2048).
    pub max_num_batched_tokens: u32,
    /// Longest sequence (prompt + output) accepted (`--max-model-len`).
    pub max_model_len: u32,
    /// Largest prefill chunk per request per step; 0 means no cap beyond the budget
    /// (`--long-prefill-token-threshold`).
    pub long_prefill_token_threshold: u32,
    /// Split long prefills across steps (`--enable-chunked-prefill`, default on in v1).
    pub enable_chunked_prefill: bool,
    /// Hash-chained prefix caching (`--enable-prefix-caching`, default on in v1).
    pub enable_prefix_caching: bool,
    /// Wait-queue order and preemption victim choice.
    pub scheduling_policy: SchedulingPolicy,
    /// Interval of the KV-usage timeline samples in the summary; 0 disables the timeline.
    pub kv_sample_interval_us: u64,
    /// Keep every inter-token gap per request (for per-request output); aggregates are exact
    /// either way.
    pub record_token_gaps: bool,
    /// Keep a record per request that leaves (per-request output, the twin, validation).
    /// Off, only the samples the summary needs are kept (32 bytes per completed request
    /// instead of a 128-byte record), with the same summary: offline runs of millions of
    /// requests. A cluster needs records (its summary and routing read them), and so does
    /// watching a request ([`crate::sim::Engine::submit_watched`]).
    pub keep_request_records: bool,
}

impl EngineConfig {
    /// vLLM v1's defaults for an instance with `num_gpu_blocks` blocks and `max_model_len`.
    pub fn vllm_defaults(num_gpu_blocks: u32, max_model_len: u32) -> Self {
        Self {
            block_size: 16,
            num_gpu_blocks,
            num_cpu_blocks: 0,
            cpu_block_load_us: 0,
            cpu_offload_gb: 0.0,
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len,
            long_prefill_token_threshold: 0,
            enable_chunked_prefill: true,
            enable_prefix_caching: true,
            scheduling_policy: SchedulingPolicy::Fcfs,
            kv_sample_interval_us: 1_000_000,
            record_token_gaps: false,
            keep_request_records: true,
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("block_size", self.block_size),
            ("num_gpu_blocks", self.num_gpu_blocks),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_model_len", self.max_model_len),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(ConfigError::new(field, "must be at least 1"));
            }
        }
        if self.block_size > 1024 {
            return Err(ConfigError::new("block_size", "must be at most 1024"));
        }
        if u64::from(self.num_gpu_blocks) * u64::from(self.block_size) > u64::from(u32::MAX) {
            return Err(ConfigError::new(
                "num_gpu_blocks",
                "times block_size must fit in 32 bits of tokens",
            ));
        }
        if self.num_gpu_blocks > crate::sim::kv::MAX_BLOCKS {
            return Err(ConfigError::new(
                "num_gpu_blocks",
                &format!("must be at most {}", crate::sim::kv::MAX_BLOCKS),
            ));
        }
        if !(self.cpu_offload_gb.is_finite() && self.cpu_offload_gb >= 0.0) {
            return Err(ConfigError::new(
                "cpu_offload_gb",
                "must be a finite number >= 0 (GiB per GPU)",
            ));
        }
        if self.num_cpu_blocks > 0 && !self.enable_prefix_caching {
            return Err(ConfigError::new(
                "num_cpu_blocks",
                "the CPU offload tier needs prefix caching enabled",
            ));
        }
        Ok(())
    }

    /// The longest sequence the instance can actually hold: `max_model_len`, capped by the
    /// KV capacity and, without chunked prefill, by the token budget (a prefill must fit a
    /// step whole).
    pub fn effective_max_model_len(&self) -> u32 {
        let capacity = self.num_gpu_blocks.saturating_mul(self.block_size);
        let mut limit = self.max_model_len.min(capacity);
        if !self.enable_chunked_prefill {
            limit = limit.min(self.max_num_batched_tokens);
        }
        limit
    }
}

/// A configuration field with an invalid value.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    /// The field's name.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    fn new(field: &'static str, reason: &str) -> Self {
        Self {
            field,
            reason: reason.to_owned(),
        }
    }
}
