//! What a request is, as the engine receives it.
//!
//! A [`RequestSpec`] is immutable input: arrival time, prompt length and content, how many
//! tokens the request will generate, its limits and its priority. The engine's mutable
//! per-request state lives in `sim::state`; nothing here changes during a run.

use std::sync::Arc;

/// Stable identifier of a request, given by the workload or the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// Service-level class of a request, as the llm-d gateway names them.
///
/// Each class maps to a vLLM priority (lower is more urgent), the same mapping BLIS uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum SloClass {
    /// Latency-critical traffic (priority 0).
    Critical,
    /// Ordinary interactive traffic (priority 1); the default.
    #[default]
    Standard,
    /// Batch traffic (priority 5).
    Batch,
    /// Traffic the gateway may shed under saturation (priority 6).
    Sheddable,
    /// Best-effort background traffic (priority 7).
    Background,
}

impl SloClass {
    /// Every class, in priority order.
    pub const ALL: [SloClass; 5] = [
        SloClass::Critical,
        SloClass::Standard,
        SloClass::Batch,
        SloClass::Sheddable,
        SloClass::Background,
    ];

    /// The vLLM priority of the class (lower value is scheduled first).
    pub fn priority(self) -> i32 {
        match self {
            SloClass::Critical => 0,
            SloClass::Standard => 1,
            SloClass::Batch => 5,
            SloClass::Sheddable => 6,
            SloClass::Background => 7,
        }
    }

    /// The lower-case name used in specs, traces and output.
    pub fn as_str(self) -> &'static str {
        match self {
            SloClass::Critical => "critical",
            SloClass::Standard => "standard",
            SloClass::Batch => "batch",
            SloClass::Sheddable => "sheddable",
            SloClass::Background => "background",
        }
    }

    /// Parses a class name (case-insensitive); the empty string means `standard`.
    pub fn parse(name: &str) -> Option<SloClass> {
        let lowered = name.trim().to_ascii_lowercase();
        if lowered.is_empty() {
            return Some(SloClass::Standard);
        }
        SloClass::ALL
            .into_iter()
            .find(|class| class.as_str() == lowered)
    }
}

/// The prompt's token content, which decides which KV blocks it shares with others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptContent {
    /// Only lengths are known. Token ids are derived: the first `prefix_len` tokens are
    /// shared by every request of `prefix_group`, the rest are unique to the request.
    Synthetic {
        /// Shared-prefix group, if any.
        prefix_group: Option<u64>,
        /// Length of the shared prefix in tokens (ignored without a group).
        prefix_len: u32,
    },
    /// Real token ids; the length equals the request's `input_tokens`.
    Tokens(Arc<[u32]>),
    /// Keys of the prompt's full blocks, given by the caller (opaque chained hashes, such as
    /// vLLM's KV-event block hashes); at most `input_tokens / block_size` of them. Blocks
    /// past the given keys are unique to the request.
    BlockKeys(Arc<[u64]>),
}

/// A request as submitted to an engine: immutable for the whole run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSpec {
    /// Stable identifier (unique within a run).
    pub id: RequestId,
    /// When the request reaches the engine's API server, in simulated microseconds.
    pub arrival_us: u64,
    /// Prompt length in tokens (at least 1).
    pub input_tokens: u32,
    /// Tokens the request generates before it finishes (0 is treated as 1: the prefill
    /// always emits one token).
    pub output_tokens: u32,
    /// The request's `max_tokens` limit, checked against `max_model_len` at enqueue;
    /// at least `output_tokens`.
    pub max_tokens: u32,
    /// SLO class (reporting, and the default priority).
    pub slo_class: SloClass,
    /// vLLM priority, lower first; normally `slo_class.priority()`.
    pub priority: i32,
    /// Absolute deadline: if still unfinished then, the request is timed out.
    pub deadline_us: Option<u64>,
    /// Prompt token content (for prefix caching).
    pub content: PromptContent,
}

impl RequestSpec {
    /// A request with synthetic content, standard class, no deadline and
    /// `max_tokens == output_tokens`: the common case for generated workloads and tests.
    pub fn synthetic(id: u64, arrival_us: u64, input_tokens: u32, output_tokens: u32) -> Self {
        Self {
            id: RequestId(id),
            arrival_us,
            input_tokens,
            output_tokens,
            max_tokens: output_tokens,
            slo_class: SloClass::Standard,
            priority: SloClass::Standard.priority(),
            deadline_us: None,
            content: PromptContent::Synthetic {
                prefix_group: None,
                prefix_len: 0,
            },
        }
    }

    /// Sets a shared prefix of `prefix_len` tokens for group `group` (builder style).
    pub fn with_prefix(mut self, group: u64, prefix_len: u32) -> Self {
        self.content = PromptContent::Synthetic {
            prefix_group: Some(group),
            prefix_len,
        };
        self
    }

    /// Sets the SLO class and the matching priority (builder style).
    pub fn with_class(mut self, class: SloClass) -> Self {
        self.slo_class = class;
        self.priority = class.priority();
        self
    }

    /// Tokens the request generates, counting the token the prefill always emits.
    pub fn generated_tokens(&self) -> u32 {
        self.output_tokens.max(1)
    }
}
