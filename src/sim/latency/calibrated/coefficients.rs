//! The calibrated model's coefficient vector: its names (the coefficients file's keys), the
//! ones a file may omit, their indices, and the pure-roofline values.

/// Number of coefficients.
pub const COEFFICIENTS: usize = 27;

/// The coefficients' names, in [`CalibratedCoefficients::values`] order (the coefficients
/// file uses them as keys).
pub const COEFFICIENT_NAMES: [&str; COEFFICIENTS] = [
    "queue_us",
    "queue_us_per_token",
    "output_token_us",
    "post_decode_us",
    "step_us",
    "seq_us",
    "layer_us",
    "allreduce_us",
    "weights",
    "flops",
    "attention",
    "kv",
    "first_token_us_per_seq",
    "moe_flops",
    "allreduce_link",
    "first_token_steps",
    "waiting_us",
    "waiting_cap",
    "allreduce_peer_us",
    "allreduce_base_peers",
    "first_token_peer_share",
    "sampler_passes",
    "token_us",
    "allreduce_peer_cap",
    "moe_weights",
    "fp8_weights",
    "allreduce_measured",
];

/// Coefficients a file may omit (added after files were written), with the value that keeps
/// such a file's predictions what they were.
pub const OPTIONAL_COEFFICIENTS: [(&str, f64); 13] = [
    ("allreduce_link", 0.0),
    ("first_token_steps", 0.0),
    ("waiting_us", 0.0),
    ("waiting_cap", 0.0),
    ("allreduce_peer_us", 0.0),
    ("allreduce_base_peers", 0.0),
    ("first_token_peer_share", 1.0),
    ("sampler_passes", 0.0),
    ("token_us", 0.0),
    ("allreduce_peer_cap", 0.0),
    ("moe_weights", 1.0),
    ("fp8_weights", 1.0),
    ("allreduce_measured", 0.0),
];

/// Index of each coefficient in [`CalibratedCoefficients::values`].
#[allow(missing_docs)]
pub mod idx {
    pub const QUEUE_US: usize = 0;
    pub const QUEUE_US_PER_TOKEN: usize = 1;
    pub const OUTPUT_TOKEN_US: usize = 2;
    pub const POST_DECODE_US: usize = 3;
    pub const STEP_US: usize = 4;
    pub const SEQ_US: usize = 5;
    pub const LAYER_US: usize = 6;
    pub const ALLREDUCE_US: usize = 7;
    pub const WEIGHTS: usize = 8;
    pub const FLOPS: usize = 9;
    pub const ATTENTION: usize = 10;
    pub const KV: usize = 11;
    pub const FIRST_TOKEN_US_PER_SEQ: usize = 12;
    pub const MOE_FLOPS: usize = 13;
    pub const ALLREDUCE_LINK: usize = 14;
    pub const FIRST_TOKEN_STEPS: usize = 15;
    pub const WAITING_US: usize = 16;
    pub const WAITING_CAP: usize = 17;
    pub const ALLREDUCE_PEER_US: usize = 18;
    pub const ALLREDUCE_BASE_PEERS: usize = 19;
    pub const FIRST_TOKEN_PEER_SHARE: usize = 20;
    pub const SAMPLER_PASSES: usize = 21;
    pub const TOKEN_US: usize = 22;
    pub const ALLREDUCE_PEER_CAP: usize = 23;
    pub const MOE_WEIGHTS: usize = 24;
    pub const FP8_WEIGHTS: usize = 25;
    pub const ALLREDUCE_MEASURED: usize = 26;
}

/// The calibrated model's coefficients (all finite and ≥ 0).
#[derive(Clone, Debug, PartialEq)]
pub struct CalibratedCoefficients {
    /// Values in [`COEFFICIENT_NAMES`] order.
    pub values: [f64; COEFFICIENTS],
}

impl CalibratedCoefficients {
    /// Pure roofline: efficiencies 1, no overheads.
    pub const ROOFLINE: CalibratedCoefficients = CalibratedCoefficients {
        values: [
            0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0,
            0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0,
        ],
    };

    /// The value named `name`, if it is one.
    pub fn get(&self, name: &str) -> Option<f64> {
        COEFFICIENT_NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| self.values[i])
    }
}
