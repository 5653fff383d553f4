//! ditto: a deterministic digital twin of an LLM serving cluster.
//!
//! The crate is organised as layers (see `ARCHITECTURE.md`):
//! - [`sim`]: the pure, deterministic, forkable vLLM v1 engine simulator;
//! - [`cluster`]: many engines behind an llm-d-style router with admission and stale signals;
//! - [`workload`]: workload specs, generators and trace replay that feed it;
//! - [`catalog`]: embedded data (model configs, GPU specs, coefficients) and their parsing;
//! - [`fidelity`]: replaying measured vLLM runs, scoring predictions, fitting coefficients;
//! - [`cli`]: the `ditto` command line, a thin driver over the layers above;
//! - [`twin`]: the mirror itself, pure: a validated store of what each instance was observed
//!   doing, immutable snapshots of it, and the what-if questions answered by forking engines
//!   restored from a snapshot;
//! - [`live`]: the pull edge that keeps the mirror current without a gateway: scrapes pods'
//!   /metrics and reads their KV events (tokio, HTTP, ZMQ), writing into `twin`'s store;
//! - [`prom_text`]: the Prometheus text format of model servers (pure parsing, histogram draws);
//! - [`server`]: the gRPC service (tonic), health, reflection and HTTP `/metrics`;
//! - [`telemetry`]: Prometheus metrics;
//! - [`bench`]: the benchmark and load cases of `ditto bench` (an edge like `server`: tokio,
//!   loopback servers) and the fixtures the criterion benches share with it.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![warn(clippy::unwrap_used)]

pub mod bench;
pub mod catalog;
pub mod cli;
pub mod cluster;
pub mod fidelity;
pub mod live;
pub mod prom_text;
pub mod server;
pub mod sim;
pub mod telemetry;
pub mod twin;
pub mod workload;
