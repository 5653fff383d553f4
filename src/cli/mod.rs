//! The `ditto` command line: argument parsing and the commands it runs.
//!
//! A thin driver: it turns flags and files into an engine configuration, a latency model and
//! a request stream, runs the engine, and prints JSON. File reading happens here and nowhere
//! below. Every user mistake becomes a [`CliError`] whose message names the flag or file,
//! and `main` turns it into exit code 2.

pub mod args;
pub mod autoscale_report;
pub mod autoscale_run;
pub mod bench;
pub mod calibrate;
pub mod check_config;
pub mod cluster_run;
pub mod error;
pub mod forecast_loop;
pub mod http_args;
pub mod latency;
pub mod model_files;
pub mod pd_sweep;
pub mod predict;
pub mod predictor_args;
pub mod progress;
pub mod report;
pub mod run;
pub mod run_config;
pub mod run_output;
pub mod run_source;
pub mod security;
pub mod serve;
pub mod serve_args;
pub mod serve_live;
pub mod serve_options;
pub mod validate;

pub use args::{Cli, Command, RunArgs};
pub use error::CliError;
