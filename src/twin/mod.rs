//! The twin: the live mirror of a cluster and the what-if questions answered on it.
//!
//! The store keeps the latest cluster config and per-instance observed state (requests,
//! gauges, KV blocks) and hands out immutable [`MirrorSnapshot`]s; `predict` and `forecast`
//! build simulations from a snapshot, fork them per candidate and replication, and never
//! touch the mirror itself. Knows nothing about gRPC or tokio: `server` adapts it.

pub mod aggregate;
pub mod build;
pub mod cached;
pub mod desired;
pub mod error;
pub mod forecast;
mod fork;
pub mod limits;
pub mod matching;
pub mod memo;
mod outcome;
pub mod parallel;
mod pd;
pub mod predict;
pub mod question;
pub mod run;
pub mod sampling;
pub mod snapshot;
pub mod stats;
pub mod store;
mod summary;
pub mod transfer;
pub mod valid;

pub use error::TwinError;
pub use limits::Limits;
pub use snapshot::MirrorSnapshot;
