//! The engine: a pure, deterministic, forkable simulator of one vLLM v1 instance.

pub mod capacity;
pub mod latency;
pub mod request;
pub mod rng;
