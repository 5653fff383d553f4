//! Model architecture and GPU specification: the inputs of the analytic latency models.
//! (Placeholder: to be completed by the latency-model work.)

/// Architecture figures of a transformer model, read from its HF `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelArch {
    /// Model name.
    pub name: String,
}

/// GPU figures (peak FLOPS, bandwidth, memory, calibrated efficiencies).
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSpec {
    /// GPU name.
    pub name: String,
}
