//! The engine: a pure, deterministic, forkable simulator of one vLLM v1 instance.
//!
//! Nothing under `sim` performs I/O, reads the wall clock or the environment, or uses
//! global state; time is integer microseconds and all randomness comes from named streams
//! ([`rng`]). Every type here is plain data that clones.

pub mod capacity;
pub mod config;
pub mod driver;
pub mod engine;
pub mod error;
pub mod kv;
pub mod latency;
pub mod metrics;
pub mod queue;
pub mod request;
pub mod rng;
pub mod state;

pub use config::{ConfigError, EngineConfig, OffloadConnector, SchedulingPolicy};
pub use engine::Engine;
pub use error::SimError;
pub use metrics::{Outcome, RequestRecord, Summary};
pub use request::{PromptContent, RequestId, RequestSpec, SloClass};
