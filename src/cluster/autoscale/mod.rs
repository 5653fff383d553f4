//! Closed-loop autoscaling in the simulator (docs/autoscaling.md): a pool of replica slots
//! under a scaling policy and the Kubernetes HPA's arithmetic, replicas that become
//! routable after a warm-up and leave after they drain, on any time-varying load.
//!
//! `config` holds the resolved settings and the policies, `hpa` the HPA's stabilization
//! windows, rate policies and bounds, `policy` each policy's signal (llm-d's SLO-aware KEDA
//! rule, queue depth, WVA's saturation rule, ditto's forecast), `capacity` the predictive
//! policy's per-replica capacity from a calibration simulation (what the
//! [`crate::cluster::Cluster`] needs, a routable mask and fresh engines in stopped slots, is
//! the cluster's own: `cluster/sim/slots.rs`), `run` the loop and `outcome` its result. Pure and deterministic: the warm-ups are drawn
//! from the "autoscale-warmup" stream.

pub mod capacity;
pub mod config;
pub mod hpa;
pub mod outcome;
pub mod policy;
pub mod run;

pub use config::{AutoscaleConfig, Objectives, Policy, WarmUp};
pub use hpa::{Hpa, HpaConfig, RatePolicy, ScalingRules, SelectPolicy};
pub use outcome::{PolicyOutcome, Sample, SlotChange, SlotState};
pub use run::{AutoscaleError, PolicyRun, run_policy};
