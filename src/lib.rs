//! ditto: a deterministic digital twin of an LLM serving cluster.
//!
//! The crate is organised as layers (see `ARCHITECTURE.md`):
//! - [`sim`]: the pure, deterministic, forkable vLLM v1 engine simulator;
//! - [`workload`]: workload specs, generators and trace replay that feed it;
//! - [`catalog`]: embedded data (model configs, GPU specs, coefficients) and their parsing;
//! - [`cli`]: the `ditto` command line, a thin driver over the layers above;
//! - [`server`]: the gRPC API types (and, later, the tonic services).

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

pub mod bench;
pub mod catalog;
pub mod cli;
pub mod cluster;
pub mod server;
pub mod sim;
pub mod telemetry;
pub mod twin;
pub mod workload;
