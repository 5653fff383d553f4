//! Workloads: what requests arrive, when, and with which shapes.
//!
//! Two sources feed the engine with [`RequestSpec`](crate::sim::request::RequestSpec)s:
//! - a YAML [`WorkloadSpec`] (seed, rate or rate stages, arrival process, clients with
//!   length distributions, shared prefixes, SLO classes and deadlines), validated into a
//!   lazy [`WorkloadGenerator`] that streams requests in arrival order in O(1) memory per
//!   request;
//! - a recorded [`Trace`] (CSV, JSONL or the ground-truth `replay_requests.json`), parsed
//!   from text by [`TraceFormat::parse`].
//!
//! [`load_forecast`] forecasts the arrival rate a pool will see from the rates observed (the
//! KEDA scaler's and the predictive autoscaling policy's forecaster).
//!
//! All randomness comes from named streams of [`RngStreams`](crate::sim::rng::RngStreams),
//! one per client and purpose, so a spec and seed always yield the same requests.
//! docs/workload.md documents the YAML fields and trace formats.
//!
//! Knows nothing about the engine, latency models or the CLI; does no IO (callers pass text).

mod arrival;
mod dist;
mod diurnal;
mod error;
mod generator;
pub mod load_forecast;
mod spec;
mod trace;

pub use arrival::{ArrivalProcess, GAMMA_CV_MAX};
pub use dist::{EMPIRICAL_VALUES_MAX, LengthDist, LengthDraw};
pub use error::WorkloadError;
pub use generator::WorkloadGenerator;
pub use spec::Diurnal;
pub use spec::{
    CLIENTS_MAX, ClientSpec, DEFAULT_CLIENT_ID, DURATION_S_MAX, PrefixSpec, RATE_PER_S_MAX,
    STAGES_MAX, Stage, WorkloadSpec,
};
pub use trace::{LostRequest, ReplayConfig, TRACE_COLUMNS, Trace, TraceFormat};
