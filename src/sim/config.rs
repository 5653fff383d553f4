//! Engine configuration: the vLLM limits and switches of one instance.
//!
//! Names follow vLLM's engine arguments. Validation happens once, at engine construction,
//! and names the offending field.

use thiserror::Error;

use crate::sim::latency::ModelArch;

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

/// vLLM's native KV-offload connector (`--kv-transfer-config` with `OffloadingConnector`,
/// `cpu_bytes_to_use`) as the engine prices it: the host time its scheduler spends walking
/// the CPU tier for blocks to evict ([`crate::sim::kv::offload_store`]).
///
/// With async scheduling (vLLM 0.15.1's default with its `mp`/`uni` executors) the scheduler
/// forms the next step while the GPU runs this one, so that host time shows only where it
/// is longer than the step: a step lasts the longer of the two.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OffloadConnector {
    /// CPU tier entries: `cpu_bytes_to_use` over one block's KV bytes summed over layers and
    /// TP ranks (`CPUOffloadingSpec`; one CPU block per GPU block).
    pub cpu_blocks: u32,
    /// Host time per tier entry a store's eviction walk visits, ns (one iteration of
    /// `LRUOffloadingManager.prepare_store`'s loop over its `OrderedDict`).
    pub walk_ns_per_entry: f64,
    /// Host time per failed store beyond its walk, ns (the `"cannot store"` warning it logs).
    pub failed_store_ns: f64,
    /// The rest of the scheduler's host time per scheduled request, ns (vLLM's
    /// `schedule()` and `update_from_output()`, on the same thread as the connector's
    /// walks). Counted only beside a connector: alone it is far under any GPU step.
    pub scheduler_ns_per_request: f64,
}

impl OffloadConnector {
    /// Host time per tier entry walked, ns, when none is given (see [`OffloadConnector`]).
    pub const DEFAULT_WALK_NS_PER_ENTRY: f64 = 68.0;
    /// Host time per failed store beyond its walk, ns, when none is given.
    pub const DEFAULT_FAILED_STORE_NS: f64 = 13_000.0;
    /// The scheduler's other host time per scheduled request, ns, when none is given.
    pub const DEFAULT_SCHEDULER_NS_PER_REQUEST: f64 = 9_000.0;

    /// A tier of `cpu_blocks` at the default prices.
    pub fn with_default_prices(cpu_blocks: u32) -> Self {
        OffloadConnector {
            cpu_blocks,
            walk_ns_per_entry: Self::DEFAULT_WALK_NS_PER_ENTRY,
            failed_store_ns: Self::DEFAULT_FAILED_STORE_NS,
            scheduler_ns_per_request: Self::DEFAULT_SCHEDULER_NS_PER_REQUEST,
        }
    }

    /// The connector `cpu_bytes_to_use = bytes` makes for `arch` on `tp` ranks at
    /// `block_size` tokens a block, at the default prices: as many CPU blocks as
    /// `CPUOffloadingSpec` makes (the bytes over one block's KV summed over layers and
    /// ranks), at least one.
    pub fn of_bytes(bytes: u64, arch: &ModelArch, tp: u32, block_size: u32) -> Self {
        let per_block = Self::block_bytes(arch, tp, block_size);
        let blocks = u32::try_from(bytes / per_block).unwrap_or(u32::MAX).max(1);
        Self::with_default_prices(blocks)
    }

    /// Host bytes one tier block takes: one block's KV summed over layers and `tp` ranks
    /// (what `CPUOffloadingSpec` divides `cpu_bytes_to_use` by), at least 1.
    pub fn block_bytes(arch: &ModelArch, tp: u32, block_size: u32) -> u64 {
        arch.kv_bytes_per_block(tp.max(1), block_size.max(1))
            .saturating_mul(u64::from(tp.max(1)))
            .max(1)
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cpu_blocks == 0 {
            return Err(ConfigError::new(
                "offload_connector.cpu_blocks",
                "must be at least 1",
            ));
        }
        let prices = [
            (
                "offload_connector.walk_ns_per_entry",
                self.walk_ns_per_entry,
            ),
            ("offload_connector.failed_store_ns", self.failed_store_ns),
            (
                "offload_connector.scheduler_ns_per_request",
                self.scheduler_ns_per_request,
            ),
        ];
        for (field, value) in prices {
            if !(value.is_finite() && (0.0..=1e9).contains(&value)) {
                return Err(ConfigError::new(
                    field,
                    "must be a number of ns in [0, 1e9]",
                ));
            }
        }
        Ok(())
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
    /// vLLM's KV-offload connector (`OffloadingConnector` with a CPU tier), whose
    /// scheduler-side stores cost host time ([`crate::sim::kv::offload_store`]); `None`: no
    /// connector.
    pub offload_connector: Option<OffloadConnector>,
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
            offload_connector: None,
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
        if let Some(connector) = &self.offload_connector {
            connector.validate()?;
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
