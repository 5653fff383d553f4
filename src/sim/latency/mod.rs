//! Step-time and overhead models, chosen by name.
//!
//! A latency model answers four questions for the engine: how long one batch step takes
//! ([`LatencyModel::step_us`]), how long a request spends in the API server before it reaches
//! the scheduler ([`LatencyModel::queueing_us`]), how much time each output token adds on its
//! way to the client ([`LatencyModel::output_token_us`]), and a fixed per-request overhead
//! after the last token ([`LatencyModel::post_decode_us`]).
//!
//! Models are plain data (an enum, no trait objects) so an engine clones cheaply and the hot
//! loop dispatches with a `match`. Knows nothing about queues, KV blocks or requests beyond
//! the per-request shape of one step ([`BatchEntry`]).

pub mod arch;
pub mod blackbox;
pub mod physics;
pub mod roofline;

pub use arch::{GpuSpec, ModelArch};
pub use blackbox::BlackboxCoefficients;
pub use physics::{PhysicsCoefficients, PhysicsModel};
pub use roofline::RooflineModel;

/// One request's share of a step: the shape every latency model prices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchEntry {
    /// Tokens whose KV already exists before this step (prefix hits and earlier chunks).
    pub context_tokens: u32,
    /// Tokens computed in this step (a prefill chunk, or 1 for a decode).
    pub new_tokens: u32,
    /// Tokens the request's prefill covers in total (prompt, plus generated tokens when a
    /// preempted request recomputes).
    pub prompt_tokens: u32,
    /// True while the request is prefilling (including a chunk of length 1).
    pub is_prefill: bool,
}

/// Which latency model to build, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LatencyKind {
    /// Linear alpha/beta coefficients per (model, GPU, TP).
    Blackbox,
    /// BLIS's roofline from the HF config and GPU spec.
    Roofline,
    /// BLIS's "trained physics" basis with global coefficients.
    Physics,
}

impl LatencyKind {
    /// Every kind, in the order the CLI lists them.
    pub const ALL: [LatencyKind; 3] = [
        LatencyKind::Roofline,
        LatencyKind::Blackbox,
        LatencyKind::Physics,
    ];

    /// The model's name as the CLI and configs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            LatencyKind::Blackbox => "blackbox",
            LatencyKind::Roofline => "roofline",
            LatencyKind::Physics => "physics",
        }
    }

    /// Parses a model name (`roofline`, `blackbox`, `physics`; `trained-physics` is accepted).
    pub fn parse(name: &str) -> Option<LatencyKind> {
        match name.trim().to_ascii_lowercase().as_str() {
            "blackbox" => Some(LatencyKind::Blackbox),
            "roofline" => Some(LatencyKind::Roofline),
            "physics" | "trained-physics" => Some(LatencyKind::Physics),
            _ => None,
        }
    }
}

/// A built latency model.
#[derive(Clone, Debug, PartialEq)]
pub enum LatencyModel {
    /// `step = b0 + b1 * uncached prefill tokens + b2 * decode tokens`.
    Blackbox(BlackboxCoefficients),
    /// max(compute, memory) for the whole mixed batch.
    Roofline(RooflineModel),
    /// Weighted roofline-style basis terms plus overheads.
    Physics(PhysicsModel),
}

impl LatencyModel {
    /// Which kind this is.
    pub fn kind(&self) -> LatencyKind {
        match self {
            LatencyModel::Blackbox(_) => LatencyKind::Blackbox,
            LatencyModel::Roofline(_) => LatencyKind::Roofline,
            LatencyModel::Physics(_) => LatencyKind::Physics,
        }
    }

    /// Duration of one step over `batch` (entries with `new_tokens > 0` only), in whole
    /// microseconds, at least 1.
    pub fn step_us(&self, batch: &[BatchEntry]) -> u64 {
        let step = match self {
            LatencyModel::Blackbox(model) => model.step_us(batch),
            LatencyModel::Roofline(model) => model.step_us(batch),
            LatencyModel::Physics(model) => model.step_us(batch),
        };
        step.max(1)
    }

    /// Delay between a request's arrival and its entry into the scheduler's wait queue.
    pub fn queueing_us(&self, input_tokens: u32) -> u64 {
        match self {
            LatencyModel::Blackbox(model) => model.queueing_us(input_tokens),
            LatencyModel::Roofline(_) => 0,
            LatencyModel::Physics(model) => model.queueing_us(input_tokens),
        }
    }

    /// Time added to the first token and to every inter-token gap on the way to the client.
    pub fn output_token_us(&self) -> u64 {
        match self {
            LatencyModel::Blackbox(model) => model.output_token_us(),
            LatencyModel::Roofline(_) => 0,
            LatencyModel::Physics(model) => model.output_token_us(),
        }
    }

    /// Fixed time added after a request's last token before it counts as complete.
    pub fn post_decode_us(&self) -> u64 {
        match self {
            LatencyModel::Blackbox(_) | LatencyModel::Roofline(_) => 0,
            LatencyModel::Physics(model) => model.post_decode_us(),
        }
    }
}

/// Converts a non-negative float of microseconds to whole microseconds, rounding half up and
/// saturating on overflow or NaN (so a bad coefficient can never wrap time around).
pub fn us_from_f64(micros: f64) -> u64 {
    if micros.is_nan() {
        return u64::MAX;
    }
    if micros <= 0.0 {
        return 0;
    }
    let rounded = micros.round();
    if rounded >= u64::MAX as f64 {
        u64::MAX
    } else {
        rounded as u64
    }
}
