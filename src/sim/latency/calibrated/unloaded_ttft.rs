//! The parts of an idle server's TTFT as the calibrated model prices them.

/// What makes up the TTFT of one request on an idle server, as the calibrated model prices
/// it (µs; the parts add up to the TTFT the engine simulates). Each part is its own term, so
/// a fit moves them apart: the front end is host time the GPU does not change, the prefill
/// is GPU work that scales with the model, the GPU and the TP degree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnloadedTtft {
    /// Before the scheduler sees the request: HTTP, tokenisation, the API server's hand-off
    /// to the engine core (`queue_us + queue_us_per_token·prompt`).
    pub front_end_us: u64,
    /// The steps' fixed host and launch part, per prefill chunk: the scheduler, input
    /// preparation, sampling, kernel launches, the fixed latency of the all-reduces
    /// (`step_us + seq_us + layer_us·L + allreduce_us·2L`).
    pub scheduler_us: u64,
    /// The prefill chunks' GPU work: weights or GEMM FLOPs, attention, KV writes, all-reduce
    /// bytes over the link (the rest of each chunk's step).
    pub prefill_us: u64,
    /// The first sampled token's way to the client: detokenisation, the API server's
    /// streaming path, and the decode step after the prefill, which the client waits for
    /// before it sees the first token (`first_token_us_per_seq·1 + first_token_steps·(one
    /// decode step of the one sequence, reading its prompt's KV) + output_token_us`).
    pub first_token_us: u64,
}

impl UnloadedTtft {
    /// The whole TTFT.
    pub fn total_us(&self) -> u64 {
        self.front_end_us + self.scheduler_us + self.prefill_us + self.first_token_us
    }
}
