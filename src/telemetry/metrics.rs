//! The server's Prometheus metrics, behind one struct with its own registry.
//!
//! Names are `ditto_*`, in base units, counters end in `_total`. Label values are bounded:
//! RPC names and status codes are fixed sets, instance labels follow the synced config (the
//! per-instance gauges are rebuilt from the snapshot at every scrape, so removed instances
//! disappear).

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use super::families::{counter, counter_vec, gauge, gauge_vec, registered};
use crate::twin::snapshot::MirrorSnapshot;

/// Every metric the server exports.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    /// Finished RPCs by method and status code.
    pub rpc_requests: IntCounterVec,
    /// RPC duration by method, seconds.
    pub rpc_duration: HistogramVec,
    /// Messages accepted on the push streams, by method.
    pub pushed_messages: IntCounterVec,
    /// KV events applied, by type (`stored`, `removed`, `cleared`).
    pub kv_events: IntCounterVec,
    /// Missed KV event batches (sequence gaps).
    pub kv_event_seq_gaps: IntCounter,
    /// Simulation events processed for predictions and forecasts.
    pub simulation_events: IntCounter,
    /// Latest snapshot generation.
    pub snapshot_generation: IntGauge,
    /// Generation of the config in force.
    pub config_generation: IntGauge,
    /// Instances in the config.
    pub instances: IntGauge,
    /// Age of each signal of each instance at scrape time, seconds (-1: never observed).
    pub signal_age: GaugeVec,
    /// Instances whose request state is older than the age limit or never observed.
    pub stale_instances: IntGauge,
    /// Requests waiting + running in the mirror, per instance.
    pub mirrored_requests: IntGaugeVec,
    /// Build information (always 1): `ditto_build_info{version,git_sha}`.
    pub info: IntGaugeVec,
    /// Failed RPCs by method and status code.
    pub rpc_errors: IntCounterVec,
    /// Routing questions answered.
    pub predictions: IntCounter,
    /// Capacity forecasts answered.
    pub forecasts: IntCounter,
    /// Snapshot forks simulated (candidates x replications of each answer), by RPC.
    pub forks: IntCounterVec,
    /// Calls stopped because their simulation event budget ran out.
    pub event_budget_exhaustions: IntCounter,
    /// Refused writes (config syncs and push-stream messages), by RPC and reason.
    pub write_rejections: IntCounterVec,
    /// Instances by freshness of their request state (`fresh`, `stale`, `never_observed`).
    pub instances_by_freshness: IntGaugeVec,
    /// Finished HTTP requests by route and status code.
    pub http_requests: IntCounterVec,
    /// HTTP request duration by route and status code, seconds.
    pub http_duration: HistogramVec,
    /// Answers sent on prediction streams, by code (`Ok` or the question's error code).
    pub stream_answers: IntCounterVec,
    /// The KV transfer model fitted to each decode pod's NIXL metrics:
    /// `ditto_kv_transfer_fit{instance, quantity}` with quantity `transfers` (pulls observed),
    /// `scale` (measured over the configured model's time) and `failure_ratio`.
    pub kv_transfer_fit: GaugeVec,
    /// Simulations running now (each holds a slot).
    pub simulations_running: IntGauge,
    /// Calls waiting for a simulation slot now.
    pub simulations_waiting: IntGauge,
}

impl Metrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let r = &registry;
        let rpc_requests = counter_vec(
            r,
            "ditto_rpc_requests_total",
            "Finished RPCs by method and gRPC code.",
            &["rpc", "code"],
        )?;
        let rpc_duration = registered(
            r,
            HistogramVec::new(
                HistogramOpts::new(
                    "ditto_rpc_duration_seconds",
                    "RPC duration by method and gRPC code.",
                )
                .buckets(prometheus::exponential_buckets(0.0005, 2.0, 16)?),
                &["rpc", "code"],
            )?,
        )?;
        let info = gauge_vec(
            r,
            "ditto_build_info",
            "Build information (always 1).",
            &["version", "git_sha"],
        )?;
        let writes = Writes::new(r)?;
        let simulations = Simulations::new(r)?;
        let mirror = MirrorGauges::new(r)?;
        info.with_label_values(&[env!("CARGO_PKG_VERSION"), env!("DITTO_GIT_SHA")])
            .set(1);
        let more = More::new()?;
        more.register(&registry)?;
        // CPU, RSS, virtual memory, open and max fds, start time (Linux; elsewhere nothing).
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(Self {
            registry,
            rpc_requests,
            rpc_duration,
            pushed_messages: writes.pushed_messages,
            kv_events: writes.kv_events,
            kv_event_seq_gaps: writes.kv_event_seq_gaps,
            simulation_events: simulations.events,
            snapshot_generation: mirror.snapshot_generation,
            config_generation: mirror.config_generation,
            instances: mirror.instances,
            signal_age: mirror.signal_age,
            kv_transfer_fit: mirror.kv_transfer_fit,
            stale_instances: mirror.stale_instances,
            mirrored_requests: mirror.mirrored_requests,
            info,
            simulations_running: simulations.running,
            simulations_waiting: simulations.waiting,
            rpc_errors: more.rpc_errors,
            predictions: more.predictions,
            forecasts: more.forecasts,
            forks: more.forks,
            event_budget_exhaustions: more.event_budget_exhaustions,
            write_rejections: more.write_rejections,
            instances_by_freshness: more.instances_by_freshness,
            http_requests: more.http_requests,
            http_duration: more.http_duration,
            stream_answers: more.stream_answers,
        })
    }

    /// Registers a metric owned elsewhere (e.g. the drain gate's in-flight gauge) in this
    /// registry, so `/metrics` exports it.
    pub fn register(
        &self,
        collector: Box<dyn prometheus::core::Collector>,
    ) -> Result<(), prometheus::Error> {
        self.registry.register(collector)
    }

    /// Records one finished RPC (`code` "Ok" or the gRPC code's name).
    pub fn observe_rpc(&self, rpc: &str, code: &str, seconds: f64) {
        self.rpc_requests.with_label_values(&[rpc, code]).inc();
        self.rpc_duration
            .with_label_values(&[rpc, code])
            .observe(seconds);
        if code != "Ok" {
            self.rpc_errors.with_label_values(&[rpc, code]).inc();
        }
    }

    /// Records one finished HTTP request on `route` (a fixed set of paths).
    pub fn observe_http(&self, route: &str, status: u16, seconds: f64) {
        let code = status.to_string();
        self.http_requests
            .with_label_values(&[route, code.as_str()])
            .inc();
        self.http_duration
            .with_label_values(&[route, code.as_str()])
            .observe(seconds);
    }

    /// Sets the snapshot-derived gauges from `snapshot`, ages measured from `now_us`.
    pub fn observe_snapshot(&self, snapshot: &MirrorSnapshot, now_us: u64) {
        self.snapshot_generation
            .set(saturating_i64(snapshot.generation));
        self.config_generation
            .set(saturating_i64(snapshot.config_generation));
        self.instances
            .set(saturating_i64(snapshot.instances.len() as u64));
        self.signal_age.reset();
        self.mirrored_requests.reset();
        self.observe_transfer_fits(snapshot);
        let max_age_us = snapshot.settings.max_signal_age_us;
        let mut stale = 0;
        let mut never = 0;
        for state in &snapshot.instances {
            let id = state.instance_id.as_str();
            let signals = [
                ("requests", state.observed_at_us),
                ("gauges", state.gauges_at_us),
                ("kv_events", state.kv_events_at_us),
            ];
            for (signal, at_us) in signals {
                let age = if at_us == 0 {
                    -1.0
                } else {
                    now_us.saturating_sub(at_us) as f64 / 1e6
                };
                self.signal_age.with_label_values(&[signal, id]).set(age);
            }
            if state.observed_at_us == 0 {
                never += 1;
            } else if now_us.saturating_sub(state.observed_at_us) > max_age_us
                || state.stale_reason.is_some()
            {
                stale += 1;
            }
            self.mirrored_requests
                .with_label_values(&[id, "waiting"])
                .set(saturating_i64(state.waiting.len() as u64));
            self.mirrored_requests
                .with_label_values(&[id, "running"])
                .set(saturating_i64(state.running.len() as u64));
        }
        self.stale_instances.set(stale + never);
        let fresh = saturating_i64(snapshot.instances.len() as u64) - stale - never;
        for (freshness, count) in [
            ("fresh", fresh),
            ("stale", stale),
            ("never_observed", never),
        ] {
            self.instances_by_freshness
                .with_label_values(&[freshness])
                .set(count);
        }
    }

    /// Sets `ditto_kv_transfer_fit` from the pods that reported NIXL counters.
    fn observe_transfer_fits(&self, snapshot: &MirrorSnapshot) {
        self.kv_transfer_fit.reset();
        let fits: Vec<_> = snapshot
            .instances
            .iter()
            .filter_map(|state| Some((state.instance_id.as_str(), state.transfer_fit?)))
            .collect();
        if fits.is_empty() {
            return;
        }
        let configured = crate::twin::transfer::configured(snapshot)
            .ok()
            .map(|config| config.transfer);
        for (id, fit) in fits {
            let quantities = [
                ("transfers", Some(fit.total_transfers())),
                (
                    "scale",
                    configured.as_ref().and_then(|model| fit.raw_scale(model)),
                ),
                ("failure_ratio", fit.failure_ratio()),
            ];
            for (quantity, value) in quantities {
                if let Some(value) = value {
                    self.kv_transfer_fit
                        .with_label_values(&[id, quantity])
                        .set(value);
                }
            }
        }
    }

    /// The registry, for families registered elsewhere (the live mirror's).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        let mut buffer = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buffer)?;
        String::from_utf8(buffer).map_err(|err| prometheus::Error::Msg(err.to_string()))
    }
}

/// What was written into the mirror: push-stream messages and KV events.
struct Writes {
    pushed_messages: IntCounterVec,
    kv_events: IntCounterVec,
    kv_event_seq_gaps: IntCounter,
}

impl Writes {
    fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let pushed_messages = counter_vec(
            r,
            "ditto_pushed_messages_total",
            "Push-stream messages accepted.",
            &["rpc"],
        )?;
        let kv_events = counter_vec(
            r,
            "ditto_kv_events_total",
            "KV events applied, by type.",
            &["type"],
        )?;
        let kv_event_seq_gaps = counter(
            r,
            "ditto_kv_event_seq_gaps_total",
            "KV event batches missed (sequence gaps).",
        )?;
        Ok(Self {
            pushed_messages,
            kv_events,
            kv_event_seq_gaps,
        })
    }
}

/// The simulations run for answers: events processed, slots held and waited for.
struct Simulations {
    events: IntCounter,
    running: IntGauge,
    waiting: IntGauge,
}

impl Simulations {
    fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let simulation_events = counter(
            r,
            "ditto_simulation_events_total",
            "Simulation events processed for predictions and forecasts.",
        )?;
        let simulations_running = gauge(
            r,
            "ditto_simulations_running",
            "Simulations running now (each holds one of the simulation slots).",
        )?;
        let simulations_waiting = gauge(
            r,
            "ditto_simulations_waiting",
            "Calls waiting for a simulation slot now (bounded; beyond, RESOURCE_EXHAUSTED).",
        )?;
        Ok(Self {
            events: simulation_events,
            running: simulations_running,
            waiting: simulations_waiting,
        })
    }
}

/// The mirror's state at scrape time: generations, instances, signal ages, fits.
struct MirrorGauges {
    snapshot_generation: IntGauge,
    config_generation: IntGauge,
    instances: IntGauge,
    signal_age: GaugeVec,
    kv_transfer_fit: GaugeVec,
    stale_instances: IntGauge,
    mirrored_requests: IntGaugeVec,
}

impl MirrorGauges {
    fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let snapshot_generation = gauge(
            r,
            "ditto_snapshot_generation",
            "Latest snapshot generation.",
        )?;
        let config_generation = gauge(
            r,
            "ditto_config_generation",
            "Generation of the config in force.",
        )?;
        let instances = gauge(r, "ditto_instances", "Instances in the synced config.")?;
        let signal_age = registered(
            r,
            GaugeVec::new(
                Opts::new(
                    "ditto_signal_age_seconds",
                    "Age of each mirrored signal at scrape time (-1: never observed).",
                ),
                &["signal", "instance"],
            )?,
        )?;
        let kv_transfer_fit = registered(
            r,
            GaugeVec::new(
                Opts::new(
                    "ditto_kv_transfer_fit",
                    "KV transfer model fitted to each decode pod's NIXL metrics: pulls observed \
                         (transfers), measured over configured time (scale), failure_ratio.",
                ),
                &["instance", "quantity"],
            )?,
        )?;
        let stale_instances = gauge(
            r,
            "ditto_stale_instances",
            "Instances whose request state is stale or was never observed.",
        )?;
        let mirrored_requests = gauge_vec(
            r,
            "ditto_mirrored_requests",
            "Requests in the mirror per instance.",
            &["instance", "state"],
        )?;
        Ok(Self {
            snapshot_generation,
            config_generation,
            instances,
            signal_age,
            kv_transfer_fit,
            stale_instances,
            mirrored_requests,
        })
    }
}

/// The operator metrics added for issue 15, built and registered together.
struct More {
    rpc_errors: IntCounterVec,
    predictions: IntCounter,
    forecasts: IntCounter,
    forks: IntCounterVec,
    event_budget_exhaustions: IntCounter,
    write_rejections: IntCounterVec,
    instances_by_freshness: IntGaugeVec,
    http_requests: IntCounterVec,
    http_duration: HistogramVec,
    stream_answers: IntCounterVec,
}

impl More {
    fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            rpc_errors: IntCounterVec::new(
                Opts::new(
                    "ditto_rpc_errors_total",
                    "Failed RPCs by method and gRPC code.",
                ),
                &["rpc", "code"],
            )?,
            predictions: IntCounter::new(
                "ditto_predictions_total",
                "Routing questions answered (unary and streamed).",
            )?,
            forecasts: IntCounter::new("ditto_forecasts_total", "Capacity forecasts answered.")?,
            forks: IntCounterVec::new(
                Opts::new(
                    "ditto_forks_total",
                    "Snapshot forks simulated: candidates x replications of each answer.",
                ),
                &["rpc"],
            )?,
            event_budget_exhaustions: IntCounter::new(
                "ditto_event_budget_exhaustions_total",
                "Calls stopped because their simulation event budget ran out.",
            )?,
            write_rejections: IntCounterVec::new(
                Opts::new(
                    "ditto_write_rejections_total",
                    "Refused writes (config syncs, push streams) by method and reason (gRPC code).",
                ),
                &["rpc", "reason"],
            )?,
            instances_by_freshness: IntGaugeVec::new(
                Opts::new(
                    "ditto_instances_by_freshness",
                    "Instances by the age of their request state: fresh, stale, never_observed.",
                ),
                &["freshness"],
            )?,
            http_requests: IntCounterVec::new(
                Opts::new(
                    "ditto_http_requests_total",
                    "Finished HTTP requests by route and status code.",
                ),
                &["route", "code"],
            )?,
            http_duration: HistogramVec::new(
                HistogramOpts::new(
                    "ditto_http_request_duration_seconds",
                    "HTTP request duration by route and status code.",
                )
                .buckets(prometheus::exponential_buckets(0.0005, 2.0, 16)?),
                &["route", "code"],
            )?,
            stream_answers: IntCounterVec::new(
                Opts::new(
                    "ditto_stream_answers_total",
                    "Answers sent on PredictRoutingStream calls, by code (Ok or the question's gRPC code).",
                ),
                &["code"],
            )?,
        })
    }

    fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.rpc_errors.clone()))?;
        registry.register(Box::new(self.predictions.clone()))?;
        registry.register(Box::new(self.forecasts.clone()))?;
        registry.register(Box::new(self.forks.clone()))?;
        registry.register(Box::new(self.event_budget_exhaustions.clone()))?;
        registry.register(Box::new(self.write_rejections.clone()))?;
        registry.register(Box::new(self.instances_by_freshness.clone()))?;
        registry.register(Box::new(self.http_requests.clone()))?;
        registry.register(Box::new(self.http_duration.clone()))?;
        registry.register(Box::new(self.stream_answers.clone()))?;
        // Exported from the start, so the alert's ratio has a series before the first stream.
        self.stream_answers.with_label_values(&["Ok"]);
        Ok(())
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_servers_in_one_process_do_not_collide() {
        let first = Metrics::new().unwrap();
        let second = Metrics::new().unwrap();
        first.observe_rpc("GetSnapshot", "OK", 0.001);
        let text = first.encode().unwrap();
        assert!(
            text.contains("ditto_rpc_requests_total{code=\"OK\",rpc=\"GetSnapshot\"} 1"),
            "{text}"
        );
        assert!(!second.encode().unwrap().contains("GetSnapshot"));
    }
}
