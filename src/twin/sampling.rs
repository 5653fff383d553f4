//! Randomness of predictions: per-replication seeds and output lengths of requests whose
//! length is unknown.
//!
//! A replication's seed derives from the question's seed and the replication index only, so
//! the same question always gets the same answer. An in-flight request that has generated `g`
//! tokens has more than `g`: its final length is drawn from the output-length distribution
//! conditioned on exceeding `g` (rejection sampling with a bounded number of tries, then the
//! smallest consistent length), capped at its `max_tokens`.

use crate::sim::rng::{RngStreams, SimRng};
use crate::workload::{LengthDist, LengthDraw};

use super::error::TwinError;
use super::snapshot::{MirrorSnapshot, TrafficStats};

/// Draws before giving up on exceeding the generated count.
const CONDITIONED_TRIES: u32 = 64;

/// Finished requests needed before the observed output lengths replace the configured ones.
pub const LEARNED_LENGTHS_MIN: usize = 32;

/// The seed of replication `index` of a question seeded with `seed`.
pub fn replication_seed(seed: u64, index: u32) -> u64 {
    let mut x = seed ^ (u64::from(index) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 29)
}

/// The random stream of one replication for one purpose.
pub fn stream(seed: u64, index: u32, purpose: &str) -> SimRng {
    RngStreams::new(replication_seed(seed, index)).stream(purpose)
}

/// The output-length distribution for unknown lengths: the observed lengths of recently
/// finished requests once there are enough of them, the configured one otherwise.
pub fn output_draw(snapshot: &MirrorSnapshot) -> Result<LengthDraw, TwinError> {
    let dist = learned_outputs(&snapshot.traffic)
        .unwrap_or_else(|| snapshot.settings.output_tokens.clone());
    dist.compile("settings.output_tokens")
        .map_err(|err| TwinError::invalid("settings.output_tokens", err.to_string()))
}

fn learned_outputs(traffic: &TrafficStats) -> Option<LengthDist> {
    if traffic.recent_lengths.len() < LEARNED_LENGTHS_MIN {
        return None;
    }
    let values = traffic
        .recent_lengths
        .iter()
        .map(|&(_, output)| output.max(1))
        .collect();
    Some(LengthDist::empirical(values, None))
}

/// A final output length above `generated` (and at most `max_tokens` when that is above
/// `generated`). When the distribution has (almost) no mass above `generated`, the request
/// has outlived it: its remaining length is then drawn from an exponential tail with mean
/// `max(16, generated / 4)` rather than assuming it ends at once.
pub fn conditioned_length(
    draw: &LengthDraw,
    generated: u32,
    max_tokens: u32,
    rng: &mut SimRng,
) -> u32 {
    let mut found = None;
    for _ in 0..CONDITIONED_TRIES {
        let candidate = draw.sample(rng);
        if candidate > generated {
            found = Some(candidate);
            break;
        }
    }
    let length = found.unwrap_or_else(|| {
        let mean = f64::from((generated / 4).max(16));
        let unit = crate::sim::rng::unit(rng);
        let extra = (-(1.0 - unit).ln() * mean).min(f64::from(u32::MAX / 2)) as u32;
        generated.saturating_add(1).saturating_add(extra)
    });
    if max_tokens > generated {
        length.min(max_tokens)
    } else {
        length
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditioned_lengths_exceed_what_was_generated() {
        let draw = LengthDist::gaussian(200.0, 100.0, 1, 1000)
            .compile("x")
            .unwrap();
        let mut rng = stream(1, 0, "t");
        for generated in [0, 50, 300, 999, 5000] {
            for _ in 0..50 {
                let length = conditioned_length(&draw, generated, 10_000, &mut rng);
                assert!(length > generated, "{length} <= {generated}");
            }
        }
        assert_eq!(conditioned_length(&draw, 300, 301, &mut rng), 301);
    }

    #[test]
    fn replication_seeds_differ_and_repeat() {
        assert_ne!(replication_seed(7, 0), replication_seed(7, 1));
        assert_eq!(replication_seed(7, 3), replication_seed(7, 3));
        assert_ne!(replication_seed(7, 0), replication_seed(8, 0));
    }
}
