//! The load sampler: once a step it reads the latest snapshot's traffic summary, turns it
//! into each pool's observed arrival rate for the step, feeds the pool's
//! [`LoadForecaster`] and exports the observation, the forecast and its measured error in
//! `/metrics`. The KEDA scaler reads the forecasters between steps.
//!
//! Two sources of arrivals, the larger taken (they mostly see the same requests, so they are
//! not added): the mirror's traffic summary of the pool's own instances (arrivals its pods or
//! the pushes about them reported; the store keeps them per pool), and the routing questions
//! the twin is asked (`ditto_predictions_total`: beside the EPP, one per request it places),
//! which are the cluster's: a pool gets their share by current replicas.
//!
//! A prefill/decode (P/D) pool: every request visits both roles, so the rate of a pool taking
//! part in a P/D pair is the pair's, the higher of its two pools' rates (and its share of
//! the questions by both roles' replicas). The pair is the prefill and decode variants of
//! one pool name (llm-d's way: one InferencePool over two Deployments, the pods told apart
//! by `llm-d.ai/role`), else a prefill variant with the first unpaired decode variant of
//! its model and namespace (`twin::desired::pd_pairs`).
//!
//! The store summarises arrivals as a rate over the last window of *client* time ending at
//! the latest arrival, which stays put while nothing arrives. So a step with no change of a
//! pool's rate counts as quiet for it, and after `quiet` seconds the rate observed is the
//! summary's times `1 - quiet / window` (the window sliding past the last arrivals),
//! reaching zero once a full window passed without an arrival.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus::{GaugeVec, IntGaugeVec, Opts};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster::config::InstanceRole;
use crate::telemetry::Metrics;
use crate::twin::MirrorSnapshot;
use crate::twin::desired::{Variant, in_flight, observed_rate, pair_rate, pd_pairs, variants};
use crate::twin::store::MirrorStore;
use crate::workload::load_forecast::{LoadForecastSettings, LoadForecaster};

/// A pool: (namespace, name); the namespace is empty for ids without one.
pub type PoolKey = (String, String);

/// One pool's load as last sampled.
#[derive(Clone, Debug)]
pub struct PoolLoad {
    /// The pool (its first variant when its pods serve several roles).
    pub variant: Variant,
    /// The roles its pods serve (one per variant of the pool's name).
    pub roles: Vec<InstanceRole>,
    /// The P/D pair it takes part in, (prefill, decode), if any.
    pub split: Option<(Variant, Variant)>,
    /// Its forecaster.
    pub forecaster: LoadForecaster,
    /// Requests in flight on it at the last sample.
    pub in_flight: u64,
    /// How long its summary rate has stayed put.
    pub quiet: Quiet,
}

/// A pool's summary rate as last sampled and how long it has stayed put.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Quiet {
    last_summary_rate: Option<f64>,
    quiet_s: f64,
}

impl Quiet {
    /// Takes the summary rate of one step of `step_s`; returns the factor the rate observed
    /// is the summary's times: 1 while it moves, falling to 0 over `window_s` of quiet.
    fn step(&mut self, summary: f64, step_s: f64, window_s: f64) -> f64 {
        if self.last_summary_rate == Some(summary) {
            self.quiet_s += step_s;
        } else {
            self.quiet_s = 0.0;
            self.last_summary_rate = Some(summary);
        }
        (1.0 - self.quiet_s / window_s).clamp(0.0, 1.0)
    }
}

#[derive(Debug, Default)]
struct State {
    pools: BTreeMap<PoolKey, PoolLoad>,
    last_questions: Option<u64>,
    samples: u64,
}

/// The pools' forecasters and the sampler's gauges.
#[derive(Debug)]
pub struct LoadTracker {
    settings: LoadForecastSettings,
    window_s: f64,
    state: Mutex<State>,
    samples: watch::Sender<u64>,
    gauges: Gauges,
}

#[derive(Clone, Debug)]
struct Gauges {
    observed: GaugeVec,
    forecast: GaugeVec,
    error_relative: GaugeVec,
    error_abs: GaugeVec,
    error_last: GaugeVec,
    error_samples: IntGaugeVec,
    seasonal: IntGaugeVec,
}

const LABELS: [&str; 2] = ["namespace", "pool"];

impl Gauges {
    fn register(metrics: &Metrics) -> Result<Self, prometheus::Error> {
        let gauge = |name: &str, help: &str| GaugeVec::new(Opts::new(name, help), &LABELS);
        let gauges = Self {
            observed: gauge(
                "ditto_load_observed_arrivals_per_second",
                "Arrival rate the pool was observed at over the last load-forecast step.",
            )?,
            forecast: gauge(
                "ditto_load_forecast_arrivals_per_second",
                "Arrival rate the load forecast expects one error horizon (120 s) ahead.",
            )?,
            error_relative: gauge(
                "ditto_load_forecast_error_ratio",
                "Load forecast error: sum of |forecast - observed| over the sum of observed \
                 rates, for the forecasts made one error horizon before (recent window).",
            )?,
            error_abs: gauge(
                "ditto_load_forecast_abs_error_arrivals_per_second",
                "Mean absolute error of the load forecast one error horizon ahead (recent window).",
            )?,
            error_last: gauge(
                "ditto_load_forecast_last_error_arrivals_per_second",
                "The last load forecast's error one error horizon ahead (forecast - observed).",
            )?,
            error_samples: IntGaugeVec::new(
                Opts::new(
                    "ditto_load_forecast_error_samples",
                    "Forecasts compared with the observed rate in the error window.",
                ),
                &LABELS,
            )?,
            seasonal: IntGaugeVec::new(
                Opts::new(
                    "ditto_load_forecast_seasonal",
                    "1 once the load forecast uses a daily season (a day observed), else 0.",
                ),
                &LABELS,
            )?,
        };
        metrics.register(Box::new(gauges.observed.clone()))?;
        metrics.register(Box::new(gauges.forecast.clone()))?;
        metrics.register(Box::new(gauges.error_relative.clone()))?;
        metrics.register(Box::new(gauges.error_abs.clone()))?;
        metrics.register(Box::new(gauges.error_last.clone()))?;
        metrics.register(Box::new(gauges.error_samples.clone()))?;
        metrics.register(Box::new(gauges.seasonal.clone()))?;
        Ok(gauges)
    }

    fn export(&self, pools: &BTreeMap<PoolKey, PoolLoad>) {
        for vec in [
            &self.observed,
            &self.forecast,
            &self.error_relative,
            &self.error_abs,
            &self.error_last,
        ] {
            vec.reset();
        }
        self.error_samples.reset();
        self.seasonal.reset();
        for ((namespace, pool), load) in pools {
            let labels = [namespace.as_str(), pool.as_str()];
            let forecaster = &load.forecaster;
            let error = forecaster.error();
            let ahead = forecaster.settings().error_horizon_steps as f64;
            self.observed
                .with_label_values(&labels)
                .set(forecaster.last_observed());
            self.forecast
                .with_label_values(&labels)
                .set(forecaster.forecast_steps(ahead));
            self.error_relative
                .with_label_values(&labels)
                .set(error.relative);
            self.error_abs
                .with_label_values(&labels)
                .set(error.mean_abs);
            self.error_last.with_label_values(&labels).set(error.last);
            self.error_samples
                .with_label_values(&labels)
                .set(i64::try_from(error.samples).unwrap_or(i64::MAX));
            self.seasonal
                .with_label_values(&labels)
                .set(i64::from(forecaster.seasonal()));
        }
    }
}

impl LoadTracker {
    /// A tracker stepping every `step` over the store's arrival window `window`.
    pub fn new(
        step: Duration,
        window: Duration,
        metrics: &Metrics,
    ) -> Result<Self, prometheus::Error> {
        let (samples, _) = watch::channel(0);
        Ok(Self {
            settings: LoadForecastSettings::for_step(step.as_secs_f64()),
            window_s: window.as_secs_f64().max(1e-3),
            state: Mutex::new(State::default()),
            samples,
            gauges: Gauges::register(metrics)?,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain numbers behind: still usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Samples taken so far; changes when a new one is taken.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.samples.subscribe()
    }

    /// Samples taken so far.
    pub fn samples(&self) -> u64 {
        self.lock().samples
    }

    /// The pools matching `name` (and `namespace` when given), as last sampled.
    pub fn find(&self, name: &str, namespace: Option<&str>) -> Vec<PoolLoad> {
        self.lock()
            .pools
            .iter()
            .filter(|((ns, pool), _)| {
                pool == name && namespace.is_none_or(|want| ns.is_empty() || ns == want)
            })
            .map(|(_, load)| load.clone())
            .collect()
    }

    /// The pools' names, as last sampled.
    pub fn pool_names(&self) -> Vec<String> {
        self.lock()
            .pools
            .keys()
            .map(|(_, pool)| pool.clone())
            .collect()
    }

    /// One step: observes every pool of `snapshot`, with `questions` routing questions
    /// answered so far, and exports the gauges.
    pub fn sample(&self, snapshot: &MirrorSnapshot, questions: u64) {
        let mut state = self.lock();
        let step_s = self.settings.step_s;
        let asked = state
            .last_questions
            .map_or(0, |last| questions.saturating_sub(last));
        state.last_questions = Some(questions);
        let questions_rate = asked as f64 / step_s;
        let pools_now = variants(snapshot, "");
        let replicas: u32 = pools_now.iter().map(|v| v.current).sum();
        let pairs = role_pairs(&pools_now);
        let key_of = |v: &Variant| (v.namespace.clone(), v.name.clone());
        let mut pools = BTreeMap::new();
        for variant in &pools_now {
            let key = key_of(variant);
            if pools.contains_key(&key) {
                continue;
            }
            let own: Vec<&Variant> = pools_now.iter().filter(|v| key_of(v) == key).collect();
            let split = pairs
                .iter()
                .find(|(p, d)| key_of(p) == key || key_of(d) == key)
                .cloned();
            // Replicas on its requests' path: its own, and a pair partner's of another name.
            let partner = split.as_ref().map_or(0, |(p, d)| {
                [p, d]
                    .iter()
                    .filter(|v| key_of(v) != key)
                    .map(|v| v.current)
                    .sum()
            });
            let weight = own.iter().map(|v| v.current).sum::<u32>() + partner;
            // Its own arrivals: a pair's, else its variants' (one per role it serves).
            let summary = match &split {
                Some((p, d)) => pair_rate(snapshot, p, d, ""),
                None => own.iter().map(|v| observed_rate(snapshot, v, "")).sum(),
            };
            let mut load = state.pools.remove(&key).unwrap_or_else(|| PoolLoad {
                variant: variant.clone(),
                roles: Vec::new(),
                split: None,
                forecaster: LoadForecaster::new(self.settings),
                in_flight: 0,
                quiet: Quiet::default(),
            });
            let decay = load.quiet.step(summary, step_s, self.window_s);
            let share = f64::from(weight) / f64::from(replicas.max(1));
            load.forecaster
                .observe((summary * decay).max(questions_rate * share));
            load.in_flight = in_flight(snapshot, variant, "");
            load.variant = variant.clone();
            load.roles = own.iter().map(|v| v.role).collect();
            load.split = split;
            pools.insert(key, load);
        }
        state.pools = pools;
        state.samples += 1;
        self.gauges.export(&state.pools);
        let samples = state.samples;
        drop(state);
        self.samples.send_replace(samples);
    }

    /// Starts the sampler: one sample per step on the latest snapshot, with the routing
    /// questions counted in `metrics`, until `draining`.
    pub fn spawn(
        self: &Arc<Self>,
        store: Arc<MirrorStore>,
        metrics: Arc<Metrics>,
        mut draining: watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        let tracker = Arc::clone(self);
        let step = Duration::from_secs_f64(self.settings.step_s);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(step);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = draining.wait_for(|draining| *draining) => break,
                    _ = ticker.tick() => {}
                }
                if let Some(stored) = store.latest() {
                    tracker.sample(&stored.snapshot, metrics.predictions.get());
                }
            }
            tracing::info!("load sampler stopped");
        })
    }
}

/// The P/D pairs among `variants` as (prefill, decode): a pool name's own prefill and decode
/// variants first, then `pd_pairs` (model and namespace) for the prefill variants left.
fn role_pairs(variants: &[Variant]) -> Vec<(Variant, Variant)> {
    let same_pool = |a: &Variant, b: &Variant| a.name == b.name && a.namespace == b.namespace;
    let mut pairs: Vec<(Variant, Variant)> = Vec::new();
    for prefill in variants.iter().filter(|v| v.role == InstanceRole::Prefill) {
        if let Some(decode) = variants
            .iter()
            .find(|v| v.role == InstanceRole::Decode && same_pool(v, prefill))
        {
            pairs.push((prefill.clone(), decode.clone()));
        }
    }
    let taken = |v: &Variant, pairs: &[(Variant, Variant)]| {
        pairs
            .iter()
            .any(|(p, d)| p.template_id == v.template_id || d.template_id == v.template_id)
    };
    let left: Vec<Variant> = variants
        .iter()
        .filter(|v| !taken(v, &pairs))
        .cloned()
        .collect();
    for (p, d) in pd_pairs(&left) {
        pairs.push((left[p].clone(), left[d].clone()));
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variant(name: &str, template: &str, role: InstanceRole) -> Variant {
        Variant {
            name: name.to_owned(),
            namespace: "ns".to_owned(),
            model: "m".to_owned(),
            template_id: template.to_owned(),
            current: 1,
            role,
        }
    }

    #[test]
    fn a_pool_s_own_roles_pair_first_then_model_and_namespace() {
        let names = |pairs: Vec<(Variant, Variant)>| -> Vec<(String, String)> {
            pairs
                .into_iter()
                .map(|(p, d)| (p.template_id, d.template_id))
                .collect()
        };
        // Two pools of one model, each with both roles: each pairs within itself, whatever
        // the order.
        let two_pools = vec![
            variant("blue", "blue-0", InstanceRole::Decode),
            variant("green", "green-0", InstanceRole::Decode),
            variant("green", "green-1", InstanceRole::Prefill),
            variant("blue", "blue-1", InstanceRole::Prefill),
            variant("vllm", "vllm-0", InstanceRole::Both),
        ];
        assert_eq!(
            names(role_pairs(&two_pools)),
            [("green-1", "green-0"), ("blue-1", "blue-0")]
                .map(|(p, d)| (p.to_owned(), d.to_owned()))
        );
        // Roles named apart: paired by model and namespace.
        let apart = vec![
            variant("prefill", "prefill-0", InstanceRole::Prefill),
            variant("decode", "decode-0", InstanceRole::Decode),
        ];
        assert_eq!(
            names(role_pairs(&apart)),
            [("prefill-0".to_owned(), "decode-0".to_owned())]
        );
        assert!(role_pairs(&[variant("vllm", "vllm-0", InstanceRole::Both)]).is_empty());
    }
}
