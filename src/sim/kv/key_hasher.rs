//! The hasher of the key→block map: block keys are already hashes, so one multiply and a
//! fold suffice (deterministic, and robust to crafted keys whose low bits collide).

use std::hash::{BuildHasher, Hasher};

/// A cheap, fixed hasher for 64-bit block keys: one multiply and a fold (deterministic, and
/// robust to crafted keys whose low bits collide).
#[derive(Clone, Copy, Debug, Default)]
pub struct IdentityBuildHasher;

/// The hasher built by [`IdentityBuildHasher`].
#[derive(Clone, Copy, Debug, Default)]
pub struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        // Keys may come from clients (vLLM block hashes): mix them so crafted keys cannot pile
        // into one bucket.
        let x = value.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 32);
    }
}

impl BuildHasher for IdentityBuildHasher {
    type Hasher = IdentityHasher;
    fn build_hasher(&self) -> IdentityHasher {
        IdentityHasher(0)
    }
}
