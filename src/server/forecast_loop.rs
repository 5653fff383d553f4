//! The optional forecast loop (`ditto serve --forecast-interval`): every interval it asks
//! a capacity forecast of each variant on the latest mirrored snapshot and the observed
//! arrival rate (`twin::desired`), and exports what an autoscaler scales on:
//! `ditto_desired_replicas`, `ditto_current_replicas` and
//! `ditto_forecast_slo_attainment_ratio`, labelled `{model_name,namespace,variant_name}` like
//! llm-d's variant autoscaler's `wva_desired_replicas`, plus `role` (`both`, `prefill` or
//! `decode`): a P/D pool's prefill and decode variants are forecast together, their split
//! searched (`twin::forecast`), and each role gets its own series.
//!
//! The forecasts run on the blocking pool (fanning out on the simulation pool), each round
//! bounded by the server's longest call as its deadline; ticks missed meanwhile are skipped,
//! so rounds never pile up. The loop stops as soon as the server starts draining.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::deadline::wall_now_us;
use crate::cluster::config::InstanceRole;
use crate::telemetry::Metrics;
use crate::twin::desired::{
    Desired, DesiredSettings, desired, desired_split, pd_pairs, question, split_question, variants,
};
use crate::twin::forecast::forecast_capacity;
use crate::twin::limits::Limits;
use crate::twin::store::MirrorStore;

/// How the loop runs.
#[derive(Clone, Debug, PartialEq)]
pub struct ForecastLoopOptions {
    /// Time between rounds.
    pub interval: Duration,
    /// What each round asks.
    pub settings: DesiredSettings,
}

/// The loop's gauges.
#[derive(Clone, Debug)]
struct Gauges {
    desired: IntGaugeVec,
    current: IntGaugeVec,
    attainment: GaugeVec,
    rounds: IntCounterVec,
}

const LABELS: [&str; 4] = ["model_name", "namespace", "variant_name", "role"];

/// The `role` label of a variant (llm-d's `llm-d.ai/role` values).
fn role_label(role: InstanceRole) -> &'static str {
    match role {
        InstanceRole::Both => "both",
        InstanceRole::Prefill => "prefill",
        InstanceRole::Decode => "decode",
    }
}

impl Gauges {
    fn register(metrics: &Metrics) -> Result<Self, prometheus::Error> {
        let gauges = Self {
            desired: IntGaugeVec::new(
                Opts::new(
                    "ditto_desired_replicas",
                    "Fewest replicas whose forecast meets the SLO target at the observed arrival rate.",
                ),
                &LABELS,
            )?,
            current: IntGaugeVec::new(
                Opts::new(
                    "ditto_current_replicas",
                    "Replicas in the mirrored cluster.",
                ),
                &LABELS,
            )?,
            attainment: GaugeVec::new(
                Opts::new(
                    "ditto_forecast_slo_attainment_ratio",
                    "Forecast fraction of requests meeting every objective at the desired replicas.",
                ),
                &LABELS,
            )?,
            rounds: IntCounterVec::new(
                Opts::new(
                    "ditto_forecast_rounds_total",
                    "Forecast loop rounds by outcome (ok, error, skipped).",
                ),
                &["outcome"],
            )?,
        };
        metrics.register(Box::new(gauges.desired.clone()))?;
        metrics.register(Box::new(gauges.current.clone()))?;
        metrics.register(Box::new(gauges.attainment.clone()))?;
        metrics.register(Box::new(gauges.rounds.clone()))?;
        Ok(gauges)
    }

    /// Replaces every series with this round's (variants gone from the config disappear).
    fn export(&self, round: &[Desired]) {
        self.desired.reset();
        self.current.reset();
        self.attainment.reset();
        for entry in round {
            let variant = &entry.variant;
            let labels = [
                variant.model.as_str(),
                variant.namespace.as_str(),
                variant.name.as_str(),
                role_label(variant.role),
            ];
            self.desired
                .with_label_values(&labels)
                .set(i64::from(entry.desired));
            self.current
                .with_label_values(&labels)
                .set(i64::from(variant.current));
            self.attainment
                .with_label_values(&labels)
                .set(entry.attainment);
        }
    }
}

/// One round on the latest snapshot: None when nothing is mirrored yet.
fn round(
    store: &MirrorStore,
    settings: &DesiredSettings,
    limits: &Limits,
) -> Option<Result<Vec<Desired>, String>> {
    let stored = store.latest()?;
    let snapshot = &stored.snapshot;
    let now_us = wall_now_us();
    let mut out = Vec::new();
    let all = variants(snapshot, &settings.namespace);
    let pairs = pd_pairs(&all);
    for &(p, d) in &pairs {
        let (prefill, decode) = (&all[p], &all[d]);
        let answer = match split_question(snapshot, prefill, decode, settings, now_us) {
            None => None,
            Some(asked) => match forecast_capacity(snapshot, &asked, limits) {
                Ok(answer) => Some(answer),
                Err(err) => {
                    return Some(Err(format!(
                        "P/D split {}/{}: {err}",
                        prefill.name, decode.name
                    )));
                }
            },
        };
        out.extend(desired_split(prefill, decode, answer.as_ref()));
    }
    let paired = |index: usize| pairs.iter().any(|&(p, d)| p == index || d == index);
    for (index, variant) in all.into_iter().enumerate() {
        if paired(index) {
            continue;
        }
        let answer = match question(snapshot, &variant, settings, now_us) {
            None => None,
            Some(asked) => match forecast_capacity(snapshot, &asked, limits) {
                Ok(answer) => Some(answer),
                Err(err) => return Some(Err(format!("variant {}: {err}", variant.name))),
            },
        };
        out.push(desired(&variant, answer.as_ref()));
    }
    Some(Ok(out))
}

/// Registers the loop's metrics and starts it; it ends when `draining` turns true.
pub fn spawn(
    options: ForecastLoopOptions,
    store: Arc<MirrorStore>,
    limits: Limits,
    max_call: Duration,
    metrics: &Metrics,
    mut draining: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, prometheus::Error> {
    let gauges = Gauges::register(metrics)?;
    Ok(tokio::spawn(async move {
        let mut ticker = tokio::time::interval(options.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = draining.wait_for(|draining| *draining) => break,
                _ = ticker.tick() => {}
            }
            let store = Arc::clone(&store);
            let settings = options.settings.clone();
            let limits = Limits {
                deadline: Some(Instant::now() + max_call),
                ..limits.clone()
            };
            let work = tokio::task::spawn_blocking(move || round(&store, &settings, &limits));
            let outcome = tokio::select! {
                // A round in progress is bounded by its deadline; nobody waits for it.
                _ = draining.wait_for(|draining| *draining) => break,
                outcome = work => outcome,
            };
            match outcome {
                Ok(Some(Ok(round))) => {
                    gauges.export(&round);
                    gauges.rounds.with_label_values(&["ok"]).inc();
                }
                Ok(None) => gauges.rounds.with_label_values(&["skipped"]).inc(),
                Ok(Some(Err(reason))) => {
                    tracing::warn!(%reason, "forecast round failed");
                    gauges.rounds.with_label_values(&["error"]).inc();
                }
                Err(err) => {
                    tracing::warn!(%err, "forecast round panicked");
                    gauges.rounds.with_label_values(&["error"]).inc();
                }
            }
        }
        tracing::info!("forecast loop stopped");
    }))
}
