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
//! the per-request shape of one step ([`BatchEntry`]), and nothing about where coefficients,
//! model configs or GPU specs come from (`crate::catalog` parses those).
//!
//! All three models follow BLIS (inference-sim/inference-sim) formula for formula, including
//! its float-to-integer conversion: a model's microseconds are truncated toward zero
//! ([`us_trunc_from_f64`], Go's `int64(x)`), not rounded.

pub mod allreduce;
pub mod arch;
pub mod blackbox;
pub mod calibrated;
pub mod conformal;
pub mod fit;
pub mod offload;
pub mod online;
pub mod physics;
pub mod roofline;
mod validate;

pub use arch::{GpuSpec, MOE_MIN_EXPERTS, ModelArch};
pub use blackbox::BlackboxCoefficients;
pub use calibrated::{CalibratedCoefficients, CalibratedModel};
pub use offload::{OffloadError, WeightOffload};
pub use physics::{PhysicsCoefficients, PhysicsModel};
pub use roofline::RooflineModel;

/// Why a latency model could not be built from the given inputs.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LatencyError {
    /// The embedded measured all-reduce table (`data/allreduce_latency.tsv`) is malformed.
    #[error("data/allreduce_latency.tsv: {problem}")]
    AllreduceTable {
        /// What is wrong, and where.
        problem: String,
    },
    /// Tensor parallelism must be at least 1.
    #[error("tensor parallelism must be >= 1, got {tp}")]
    InvalidTp {
        /// The rejected value.
        tp: u32,
    },
    /// A model-architecture field is missing or out of range.
    #[error("model `{model}`: {field} {problem}")]
    InvalidModel {
        /// Model name.
        model: String,
        /// The `ModelArch` field at fault.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A GPU field is not a finite positive number (or is out of range).
    #[error("GPU `{gpu}`: {field} must be {expected}, got {value}")]
    InvalidGpu {
        /// GPU name.
        gpu: String,
        /// The `GpuSpec` field at fault.
        field: &'static str,
        /// What the field must be.
        expected: &'static str,
        /// The rejected value.
        value: f64,
    },
    /// A coefficient list is too short.
    #[error("{what}: need at least {needed} values, got {got}")]
    TooFewCoefficients {
        /// Which list (e.g. `blackbox beta`).
        what: &'static str,
        /// Minimum length.
        needed: usize,
        /// Actual length.
        got: usize,
    },
    /// A coefficient is negative, NaN or infinite.
    #[error("{what}[{index}] must be finite and non-negative, got {value}")]
    InvalidCoefficient {
        /// Which list (e.g. `physics alpha`).
        what: &'static str,
        /// Position in the list.
        index: usize,
        /// The rejected value.
        value: f64,
    },
}

/// Checks that `values` has at least `needed` entries, all finite and non-negative (BLIS's
/// coefficient validation).
pub(crate) fn check_coefficients(
    what: &'static str,
    values: &[f64],
    needed: usize,
) -> Result<(), LatencyError> {
    if values.len() < needed {
        return Err(LatencyError::TooFewCoefficients {
            what,
            needed,
            got: values.len(),
        });
    }
    for (index, &value) in values.iter().enumerate() {
        if !value.is_finite() || value < 0.0 {
            return Err(LatencyError::InvalidCoefficient { what, index, value });
        }
    }
    Ok(())
}

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
    /// ditto's roofline basis with learned hardware-generic corrections (the default).
    Calibrated,
}

impl LatencyKind {
    /// Every kind, in the order the CLI lists them.
    pub const ALL: [LatencyKind; 4] = [
        LatencyKind::Calibrated,
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
            LatencyKind::Calibrated => "calibrated",
        }
    }

    /// Parses a model name (`calibrated`, `roofline`, `blackbox`, `physics`;
    /// `trained-physics` is accepted).
    pub fn parse(name: &str) -> Option<LatencyKind> {
        match name.trim().to_ascii_lowercase().as_str() {
            "blackbox" => Some(LatencyKind::Blackbox),
            "roofline" => Some(LatencyKind::Roofline),
            "physics" | "trained-physics" => Some(LatencyKind::Physics),
            "calibrated" => Some(LatencyKind::Calibrated),
            _ => None,
        }
    }
}

/// The terms of an all-decode step that its context does not change, for one batch size
/// ([`LatencyModel::decode_step_us`]): plain numbers a caller keeps while that size holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DecodeSteps {
    /// The calibrated model's.
    Calibrated(calibrated::DecodeSteps),
    /// The roofline's.
    Roofline(roofline::DecodeSteps),
}

impl DecodeSteps {
    /// Sequences the steps decode.
    #[inline]
    pub fn decodes(&self) -> u64 {
        match self {
            DecodeSteps::Calibrated(steps) => steps.decodes(),
            DecodeSteps::Roofline(steps) => steps.decodes(),
        }
    }

    /// The step at `context` tokens of context in total, at least 1 µs (as
    /// [`LatencyModel::step_with_decodes_us`]).
    #[inline]
    pub fn step_us(&self, context: u64) -> u64 {
        let step = match self {
            DecodeSteps::Calibrated(steps) => steps.step_us(context),
            DecodeSteps::Roofline(steps) => steps.step_us(context),
        };
        step.max(1)
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
    /// Roofline basis terms with learned corrections (see [`calibrated`]).
    Calibrated(CalibratedModel),
}

impl LatencyModel {
    /// The model for one rank of a data-parallel server that runs a mixture-of-experts model
    /// with expert parallelism: the calibrated model prices it
    /// ([`CalibratedModel::with_expert_parallel`]); the other kinds, fitted or derived per
    /// TP replica, are returned unchanged.
    pub fn with_expert_parallel(self, data_parallel: u32) -> Self {
        match self {
            LatencyModel::Calibrated(model) => {
                LatencyModel::Calibrated(model.with_expert_parallel(data_parallel))
            }
            other => other,
        }
    }

    /// The same model with `offload`'s weights read from host memory every step
    /// ([`offload`]: `bytes / host link` added to each step); no offload returns it
    /// unchanged. Refused for the blackbox model, whose fitted coefficients have no weights
    /// term to carry it.
    pub fn with_weight_offload(self, offload: &WeightOffload) -> Result<Self, OffloadError> {
        offload.check_priced_by(self.kind())?;
        if offload.bytes == 0 {
            return Ok(self);
        }
        let step_us = offload.step_us();
        Ok(match self {
            LatencyModel::Calibrated(model) => {
                LatencyModel::Calibrated(model.with_weight_offload(step_us))
            }
            LatencyModel::Roofline(model) => {
                LatencyModel::Roofline(model.with_weight_offload(step_us))
            }
            LatencyModel::Physics(model) => {
                LatencyModel::Physics(model.with_weight_offload(step_us))
            }
            other => other,
        })
    }

    /// Which kind this is.
    pub fn kind(&self) -> LatencyKind {
        match self {
            LatencyModel::Blackbox(_) => LatencyKind::Blackbox,
            LatencyModel::Roofline(_) => LatencyKind::Roofline,
            LatencyModel::Physics(_) => LatencyKind::Physics,
            LatencyModel::Calibrated(_) => LatencyKind::Calibrated,
        }
    }

    /// Duration of one step over `batch` (entries with `new_tokens > 0` only), in whole
    /// microseconds, at least 1.
    pub fn step_us(&self, batch: &[BatchEntry]) -> u64 {
        let step = match self {
            LatencyModel::Blackbox(model) => model.step_us(batch),
            LatencyModel::Roofline(model) => model.step_us(batch),
            LatencyModel::Physics(model) => model.step_us(batch),
            LatencyModel::Calibrated(model) => model.step_us(batch),
        };
        step.max(1)
    }

    /// Duration of a step over `batch` plus `decodes` decode requests (one token each) with
    /// `context` cached tokens in total, if the model prices decodes from those two numbers
    /// alone (then it equals [`LatencyModel::step_us`] of the batch with any such decodes
    /// added); `None` otherwise. Lazy decode windows price their steps with it.
    pub fn step_with_decodes_us(
        &self,
        batch: &[BatchEntry],
        decodes: u64,
        context: u64,
    ) -> Option<u64> {
        let step = match self {
            LatencyModel::Blackbox(model) => model.step_with_decodes_us(batch, decodes),
            LatencyModel::Roofline(model) => model.step_with_decodes_us(batch, decodes, context),
            LatencyModel::Calibrated(model) => model.step_with_decodes_us(batch, decodes, context),
            LatencyModel::Physics(_) => return None,
        };
        Some(step.max(1))
    }

    /// `step_with_decodes_us(&[], decodes, context)`, an all-decode step, through `kept`: for
    /// the calibrated and roofline models, the terms its context does not change, computed
    /// once per batch size and kept by the caller while that size holds (a drain's or a lazy
    /// window's successive steps); the other models price the whole formula. The same bits
    /// either way.
    #[inline]
    pub fn decode_step_us(
        &self,
        kept: &mut Option<DecodeSteps>,
        decodes: u64,
        context: u64,
    ) -> Option<u64> {
        if let Some(steps) = kept
            && steps.decodes() == decodes
        {
            return Some(steps.step_us(context));
        }
        let steps = match self {
            LatencyModel::Calibrated(model) => DecodeSteps::Calibrated(model.decode_steps(decodes)),
            LatencyModel::Roofline(model) => DecodeSteps::Roofline(model.decode_steps(decodes)),
            _ => return self.step_with_decodes_us(&[], decodes, context),
        };
        Some(kept.insert(steps).step_us(context))
    }

    /// Time a step takes longer while `waiting` requests wait in the scheduler's queue (host
    /// work that grows with the open requests; the engine adds it to every step's price). 0
    /// except for the calibrated model with its `waiting_us` term on.
    pub fn waiting_us(&self, waiting: u64) -> u64 {
        match self {
            LatencyModel::Calibrated(model) => model.waiting_us(waiting),
            _ => 0,
        }
    }

    /// True if the requests waiting in the queue change a step's price
    /// ([`LatencyModel::waiting_us`] is not always 0). A request that waits unreached then
    /// changes the steps it waits through, so putting it in the queue after the fact (the
    /// twin's late entry) is not exact.
    pub fn prices_waiting(&self) -> bool {
        match self {
            LatencyModel::Calibrated(model) => model.prices_waiting(),
            _ => false,
        }
    }

    /// Delay between a request's arrival and its entry into the scheduler's wait queue.
    pub fn queueing_us(&self, input_tokens: u32) -> u64 {
        match self {
            LatencyModel::Blackbox(model) => model.queueing_us(input_tokens),
            LatencyModel::Roofline(_) => 0,
            LatencyModel::Physics(model) => model.queueing_us(input_tokens),
            LatencyModel::Calibrated(model) => model.queueing_us(input_tokens),
        }
    }

    /// Time added to the first token and to every inter-token gap on the way to the client.
    pub fn output_token_us(&self) -> u64 {
        match self {
            LatencyModel::Blackbox(model) => model.output_token_us(),
            LatencyModel::Roofline(_) => 0,
            LatencyModel::Physics(model) => model.output_token_us(),
            LatencyModel::Calibrated(model) => model.output_token_us(),
        }
    }

    /// Extra time before the client sees a request's first token when the step that made it
    /// ran `batch` sequences holding `context()` tokens of KV once it had run (the serving
    /// front end streams every sequence's token, so a new stream's first token waits behind
    /// them; and the client sees it one decode step of that batch later). Later tokens
    /// inherit it. 0 except for the calibrated model; `context` is called only when the
    /// model prices it (summing it walks the batch).
    pub fn first_token_delay_us(&self, batch: u64, context: impl FnOnce() -> u64) -> u64 {
        match self {
            LatencyModel::Calibrated(model) => model.first_token_delay_us(batch, context()),
            _ => 0,
        }
    }

    /// Fixed time added after a request's last token before it counts as complete.
    pub fn post_decode_us(&self) -> u64 {
        match self {
            LatencyModel::Blackbox(_) | LatencyModel::Roofline(_) => 0,
            LatencyModel::Physics(model) => model.post_decode_us(),
            LatencyModel::Calibrated(model) => model.post_decode_us(),
        }
    }
}

/// `value` as f64, or `fallback` when the config left it at 0 (the HF configs' unset
/// sizes); shared by the analytic models.
fn nonzero_or(value: u32, fallback: f64) -> f64 {
    if value > 0 {
        f64::from(value)
    } else {
        fallback
    }
}

/// Converts a float of microseconds to whole microseconds the way BLIS does (Go `int64(x)`:
/// truncation toward zero), clamping negatives to 0 and saturating on overflow or NaN (so a
/// bad coefficient can never wrap time around). Every latency model uses this, so step times
/// match BLIS to the microsecond.
pub fn us_trunc_from_f64(micros: f64) -> u64 {
    if micros.is_nan() {
        return u64::MAX;
    }
    if micros <= 0.0 {
        return 0;
    }
    if micros >= u64::MAX as f64 {
        return u64::MAX;
    }
    // In range and non-negative: `as` truncates toward zero, which is the intent.
    micros as u64
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn us_conversions_saturate_and_clamp() {
        // Goal: neither conversion can wrap or go negative. Method: feed the edge values.
        for convert in [us_from_f64 as fn(f64) -> u64, us_trunc_from_f64] {
            assert_eq!(convert(f64::NAN), u64::MAX);
            assert_eq!(convert(f64::INFINITY), u64::MAX);
            assert_eq!(convert(1e30), u64::MAX);
            assert_eq!(convert(-5.0), 0);
            assert_eq!(convert(f64::NEG_INFINITY), 0);
            assert_eq!(convert(0.0), 0);
        }
        assert_eq!(us_from_f64(2.5), 3);
        assert_eq!(us_trunc_from_f64(2.5), 2);
        assert_eq!(us_trunc_from_f64(2.999), 2);
    }

    #[test]
    fn coefficient_check_names_the_bad_value() {
        assert_eq!(check_coefficients("x", &[1.0, 0.0, 2.0], 3), Ok(()));
        assert_eq!(
            check_coefficients("x", &[1.0, 2.0], 3),
            Err(LatencyError::TooFewCoefficients {
                what: "x",
                needed: 3,
                got: 2
            })
        );
        assert!(matches!(
            check_coefficients("x", &[1.0, -1.0, 2.0], 3),
            Err(LatencyError::InvalidCoefficient { index: 1, .. })
        ));
        assert!(matches!(
            check_coefficients("x", &[1.0, 1.0, f64::NAN], 3),
            Err(LatencyError::InvalidCoefficient { index: 2, .. })
        ));
    }

    #[test]
    fn step_is_at_least_one_microsecond() {
        let model = LatencyModel::Blackbox(BlackboxCoefficients {
            alpha: [0.0; 3],
            beta: [0.0; 3],
        });
        assert_eq!(model.step_us(&[]), 1);
    }
}
