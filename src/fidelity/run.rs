//! A measured run as data ([`MeasuredRun`]): what the server was, what was sent, what was
//! measured. Parsed from its files by [`super::measured`] (with [`super::scraped`] for a run
//! known from `/metrics` only); read by the replay, the score and the calibration.

use std::collections::BTreeMap;

use crate::prom_text::Histogram;
use crate::sim::latency::ModelArch;

/// One constant-rate stage of the load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stage {
    /// Requests per second.
    pub rate: f64,
    /// Start, in µs from the first arrival.
    pub start_us: u64,
    /// Length in µs.
    pub duration_us: u64,
}

/// The shared-prefix ("general" chat) workload shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedPrefix {
    /// Distinct system prompts.
    pub groups: u32,
    /// Users per system prompt.
    pub users_per_group: u32,
    /// System-prompt length in tokens (the shared part).
    pub system_prompt_len: u32,
    /// Question length in tokens.
    pub question_len: u32,
}

impl SharedPrefix {
    /// How many distinct prompts the load generator builds and sends in turn (P = groups ×
    /// prompts per group, at least 1).
    pub fn prompts(&self) -> u64 {
        u64::from(self.groups.max(1)) * u64::from(self.users_per_group.max(1))
    }
}

/// One measured request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MeasuredRequest {
    /// The replay `index`.
    pub id: u64,
    /// Arrival in µs from the first.
    pub arrival_us: u64,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// The client's recount of the output text's tokens.
    pub output_recount: u32,
    /// Measured TTFT in µs.
    pub ttft_us: f64,
    /// Measured E2E in µs.
    pub e2e_us: f64,
}

/// A request that failed in the measurement (the client's timeout, in the overloaded runs).
/// A failed request's token counts are usually lost (0 in the data: the client never saw
/// them); the replay then draws them from the workload ([`super::replay`](mod@super::replay)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FailedRequest {
    /// The replay `index`.
    pub id: u64,
    /// Arrival in µs from the first.
    pub arrival_us: u64,
    /// Prompt tokens, when the data kept them.
    pub input_tokens: Option<u32>,
    /// The measured E2E until the failure (µs), when recorded.
    pub e2e_us: Option<f64>,
}

/// inference-perf's client timeout when its config sets none (`load.request_timeout: null`):
/// every failed request of the published overloaded runs has `e2e_s` in [300.0, 301.0].
pub const INFERENCE_PERF_TIMEOUT_S: f64 = 300.0;

/// A published simulator's prediction of one summary metric.
#[derive(Clone, Debug, PartialEq)]
pub struct Published {
    /// Simulator name (`blis-trained-physics`, ...).
    pub simulator: String,
    /// Stage index, -1 for the whole run.
    pub stage: i32,
    /// Metric (`e2e_mean`, `ttft_p90`, `itl_mean`, ...).
    pub metric: String,
    /// Predicted value (ms).
    pub predicted: f64,
    /// Its absolute % error.
    pub ape: f64,
}

/// Everything known about a measured run.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredRun {
    /// Name (directory name).
    pub name: String,
    /// The model.
    pub arch: ModelArch,
    /// GPU name as recorded (`H100`, `A100-80GB`), if recorded.
    pub gpu: Option<String>,
    /// Tensor parallelism.
    pub tp: u32,
    /// Data-parallel replicas the load was spread over, each a server of `tp` GPUs with the
    /// limits and blocks below (`dp` in `s2r_error_records.csv`; 1 when not recorded). The
    /// replay simulates that many ([`super::replay`](mod@super::replay)).
    pub dp: u32,
    /// The weights' precision the server ran, as recorded (`precision`: `FP16`, `FP8`). A
    /// recorded FP8 sets 1-byte weights when the model's config declares no quantization
    /// (vLLM's `--quantization fp8` on a 16-bit checkpoint).
    pub precision: Option<String>,
    /// vLLM `max_num_seqs`.
    pub max_num_seqs: u32,
    /// vLLM `max_num_batched_tokens`.
    pub max_num_batched_tokens: u32,
    /// vLLM `max_model_len`, if recorded.
    pub max_model_len: Option<u32>,
    /// KV block size.
    pub block_size: u32,
    /// GPU KV blocks the server reported, if recorded.
    pub num_gpu_blocks: Option<u32>,
    /// vLLM `gpu_memory_utilization` (to derive blocks when not recorded).
    pub gpu_memory_utilization: f64,
    /// The configured output length (`output_len`), if recorded.
    pub configured_output_len: Option<u32>,
    /// Whether the server ignored EOS (then it generated exactly the configured length).
    pub ignore_eos: bool,
    /// The shared-prefix shape, if the workload had one.
    pub shared_prefix: Option<SharedPrefix>,
    /// Rate stages in order.
    pub stages: Vec<Stage>,
    /// Measured requests that succeeded (empty for a summary-only run), in arrival order.
    pub requests: Vec<MeasuredRequest>,
    /// Measured requests that failed (in the overloaded runs: the client's timeout), in
    /// arrival order. They are replayed (they loaded the server until abandoned) but not
    /// scored, as the field scores only requests that succeeded.
    pub failed: Vec<FailedRequest>,
    /// The load generator's client timeout (µs): at it the client abandons a request and
    /// vLLM aborts it. `None` when the run does not come from a known load generator.
    pub client_timeout_us: Option<u64>,
    /// The workload is inference-perf's multi-turn chat (`enable_multi_turn_chat`): a user's
    /// prompt may carry the conversation so far.
    pub multi_turn: bool,
    /// Requests to generate for a summary-only run.
    pub num_requests: Option<u64>,
    /// Summary actuals from `s2r_error_records.csv`: (stage, metric) → value in ms.
    pub actuals: BTreeMap<(i32, String), f64>,
    /// The published simulators' predictions.
    pub published: Vec<Published>,
    /// Prompt lengths of a run known from histograms only (scraped runs).
    pub prompt_lengths: Option<Histogram>,
    /// Output lengths of a run known from histograms only (scraped runs).
    pub output_lengths: Option<Histogram>,
    /// Host memory the server's KV-offload connector (`OffloadingConnector`) used, bytes
    /// (`cpu_bytes_to_use`); `None`: no connector.
    pub offload_connector_bytes: Option<u64>,
}

impl MeasuredRun {
    /// The stage a request arriving at `arrival_us` belongs to (the last one past its end).
    pub fn stage_of(&self, arrival_us: u64) -> usize {
        self.stages
            .iter()
            .rposition(|stage| arrival_us >= stage.start_us)
            .unwrap_or(0)
    }

    /// The run cut after stage `last`: later stages, their requests and their summary
    /// actuals (and the whole-run ones, which include them) removed. Warm calibration fits
    /// on such a cut.
    pub fn through_stage(&self, last: usize) -> MeasuredRun {
        let mut run = self.clone();
        run.stages.truncate(last + 1);
        if let Some(stage) = run.stages.last() {
            let end_us = stage.start_us + stage.duration_us;
            run.requests.retain(|r| r.arrival_us < end_us);
            run.failed.retain(|r| r.arrival_us < end_us);
        }
        run.actuals
            .retain(|(stage, _), _| *stage >= 0 && *stage as usize <= last);
        run
    }

    /// True when per-request measurements exist (else only summary actuals).
    pub fn has_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    /// The measured fraction of requests that failed (timed out at the client), for runs
    /// with per-request data.
    pub fn failed_fraction(&self) -> Option<f64> {
        let total = self.requests.len() + self.failed.len();
        (self.has_requests() && total > 0).then(|| self.failed.len() as f64 / total as f64)
    }
}
