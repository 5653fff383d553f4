//! The cluster: many instances behind an llm-d-style router, with admission and stale
//! signals.
//!
//! `config` holds the resolved domain configuration, `spec` parses the cluster YAML,
//! `signals` models what the router sees and how stale it is, `router` and `admission` are
//! the gateway's decisions, and `sim` runs it all on one global clock. Pure and deterministic
//! like `sim`: no I/O (the YAML arrives as text), no wall clock.

pub mod admission;
pub mod autoscale;
pub mod config;
pub mod disagg;
pub mod transfer_fit;
pub use sim::PdProgress;
pub mod router;
pub mod signals;
pub mod sim;
pub mod spec;

pub use config::ClusterConfig;
pub use sim::{Cluster, ClusterSummary, Dispatch};
