//! Metrics of the live mirror (`ditto_live_*`): scrapes, KV-event batches and replays, and
//! which signal holds an instance stale. Label values are bounded: instances follow the
//! discovered pods (removed when a pod is retired), results and signals are fixed sets.

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// The live mirror's metric families.
#[derive(Clone, Debug)]
pub struct LiveMetrics {
    /// Scrapes by instance and result (`ok`, `timeout`, `connection`, `status`, `body`,
    /// `parse`, `pending` (not synced yet), `rejected` (by the mirror)).
    pub scrapes: IntCounterVec,
    /// Scrape duration, seconds (all pods).
    pub scrape_duration: Histogram,
    /// Freshness lag: time from a scrape's start to its state being published, seconds.
    pub publish_lag: Histogram,
    /// KV-event batches by instance and result (`applied`, `malformed`, `rejected`,
    /// `replayed`).
    pub kv_batches: IntCounterVec,
    /// KV replays by instance and result (`ok`, `unavailable`).
    pub kv_replays: IntCounterVec,
    /// 1 while `signal` (`metrics`, `kv_events`, `config`, `discovery`) holds `instance` stale.
    pub stale: IntGaugeVec,
    /// 1 when a pod publishes a cache setting (`block_size`, `num_gpu_blocks`) that differs
    /// from the configured one, or more running requests than `max_num_seqs`.
    pub config_mismatch: IntGaugeVec,
    /// 1 for each deprecated metric name a pod still uses.
    pub deprecated_names: IntGaugeVec,
    /// Pods currently mirrored.
    pub pods: IntGauge,
    /// Process restarts read from a pod's `/metrics` (its cached blocks were dropped).
    pub restarts: IntCounterVec,
    /// Scraped or streamed state capped to the instance's limits, by field
    /// (`gauges.running`, `requests.waiting`, `cached_blocks`).
    pub state_capped: IntCounterVec,
    /// KV events skipped because their type is unknown (vLLM added one), by type.
    pub kv_unknown_events: IntCounterVec,
    /// KV-event batches missed and not recovered by a replay.
    pub kv_gaps: IntCounterVec,
    /// KV-event stream (re)connections by result (`connected`, `failed`, `disconnected`).
    pub kv_connections: IntCounterVec,
    /// Kubernetes discovery failures by kind (`forbidden`, `status`, `error`, `idle`,
    /// `line_too_long`, `too_large`, `undecodable`).
    pub kube_failures: IntCounterVec,
    /// Pods from the Kubernetes API skipped or not served, by reason (`other_namespace`,
    /// `invalid_name`, `invalid_ip`), counted per object received.
    pub kube_skipped: IntCounterVec,
    /// Served pods left out because the instance set would pass `--max-instances`.
    pub pods_over_limit: IntGauge,
}

impl LiveMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let scrapes = IntCounterVec::new(
            Opts::new(
                "ditto_live_scrapes_total",
                "Pod /metrics scrapes by result.",
            ),
            &["instance", "result"],
        )?;
        let scrape_duration = Histogram::with_opts(
            HistogramOpts::new(
                "ditto_live_scrape_duration_seconds",
                "Pod /metrics scrape duration.",
            )
            .buckets(prometheus::exponential_buckets(0.0005, 2.0, 14)?),
        )?;
        let publish_lag = Histogram::with_opts(
            HistogramOpts::new(
                "ditto_live_publish_lag_seconds",
                "From a scrape's start to its state being in the mirror.",
            )
            .buckets(prometheus::exponential_buckets(0.0005, 2.0, 14)?),
        )?;
        let kv_batches = IntCounterVec::new(
            Opts::new(
                "ditto_live_kv_batches_total",
                "KV-event batches received, by result.",
            ),
            &["instance", "result"],
        )?;
        let kv_replays = IntCounterVec::new(
            Opts::new(
                "ditto_live_kv_replays_total",
                "KV-event replays after a gap, by result.",
            ),
            &["instance", "result"],
        )?;
        let stale = IntGaugeVec::new(
            Opts::new(
                "ditto_live_stale",
                "1 while the signal holds the instance stale.",
            ),
            &["instance", "signal"],
        )?;
        let config_mismatch = IntGaugeVec::new(
            Opts::new(
                "ditto_live_config_mismatch",
                "1 when a pod publishes a setting that differs from the configured one.",
            ),
            &["instance", "field"],
        )?;
        let deprecated_names = IntGaugeVec::new(
            Opts::new(
                "ditto_live_deprecated_metric_names",
                "Deprecated metric names a pod uses.",
            ),
            &["instance", "name"],
        )?;
        let pods = IntGauge::new("ditto_live_pods", "Pods mirrored by the live mirror.")?;
        let restarts = IntCounterVec::new(
            Opts::new(
                "ditto_live_pod_restarts_total",
                "Pod process restarts seen on /metrics (new start time or a counter reset).",
            ),
            &["instance"],
        )?;
        let state_capped = IntCounterVec::new(
            Opts::new(
                "ditto_live_state_capped_total",
                "Observations capped to the instance's limits, by field.",
            ),
            &["instance", "field"],
        )?;
        let kv_unknown_events = IntCounterVec::new(
            Opts::new(
                "ditto_live_kv_unknown_events_total",
                "KV events of an unknown type, skipped one by one.",
            ),
            &["instance", "type"],
        )?;
        let kv_gaps = IntCounterVec::new(
            Opts::new(
                "ditto_live_kv_gaps_total",
                "KV-event batches missed and not recovered by a replay.",
            ),
            &["instance"],
        )?;
        let kv_connections = IntCounterVec::new(
            Opts::new(
                "ditto_live_kv_connections_total",
                "KV-event stream connections by result.",
            ),
            &["instance", "result"],
        )?;
        let kube_failures = IntCounterVec::new(
            Opts::new(
                "ditto_live_kube_failures_total",
                "Kubernetes discovery failures (list, watch) by kind.",
            ),
            &["kind"],
        )?;
        let kube_skipped = IntCounterVec::new(
            Opts::new(
                "ditto_live_kube_pods_skipped_total",
                "Pod objects from the Kubernetes API skipped or not served, by reason.",
            ),
            &["reason"],
        )?;
        let pods_over_limit = IntGauge::new(
            "ditto_live_pods_over_limit",
            "Served pods left out of the mirror because it holds --max-instances.",
        )?;
        registry.register(Box::new(kube_failures.clone()))?;
        registry.register(Box::new(kube_skipped.clone()))?;
        registry.register(Box::new(pods_over_limit.clone()))?;
        registry.register(Box::new(state_capped.clone()))?;
        registry.register(Box::new(kv_unknown_events.clone()))?;
        registry.register(Box::new(kv_gaps.clone()))?;
        registry.register(Box::new(kv_connections.clone()))?;
        registry.register(Box::new(scrapes.clone()))?;
        registry.register(Box::new(scrape_duration.clone()))?;
        registry.register(Box::new(publish_lag.clone()))?;
        registry.register(Box::new(kv_batches.clone()))?;
        registry.register(Box::new(kv_replays.clone()))?;
        registry.register(Box::new(stale.clone()))?;
        registry.register(Box::new(config_mismatch.clone()))?;
        registry.register(Box::new(deprecated_names.clone()))?;
        registry.register(Box::new(pods.clone()))?;
        registry.register(Box::new(restarts.clone()))?;
        Ok(Self {
            scrapes,
            scrape_duration,
            publish_lag,
            kv_batches,
            kv_replays,
            stale,
            config_mismatch,
            deprecated_names,
            pods,
            restarts,
            state_capped,
            kv_unknown_events,
            kv_gaps,
            kv_connections,
            kube_failures,
            kube_skipped,
            pods_over_limit,
        })
    }

    /// Drops every series of a retired instance (`deprecated`: the names it had set).
    pub fn forget(&self, instance: &str, deprecated: &[&str], unknown_types: &[String]) {
        for field in ["gauges.running", "requests.waiting", "cached_blocks"] {
            let _ = self.state_capped.remove_label_values(&[instance, field]);
        }
        for kind in unknown_types {
            let _ = self
                .kv_unknown_events
                .remove_label_values(&[instance, kind]);
        }
        let _ = self.kv_gaps.remove_label_values(&[instance]);
        for result in ["connected", "failed", "disconnected"] {
            let _ = self.kv_connections.remove_label_values(&[instance, result]);
        }
        for result in [
            "ok",
            "timeout",
            "connection",
            "status",
            "body",
            "parse",
            "pending",
            "rejected",
        ] {
            let _ = self.scrapes.remove_label_values(&[instance, result]);
        }
        for result in ["applied", "malformed", "rejected", "replayed"] {
            let _ = self.kv_batches.remove_label_values(&[instance, result]);
        }
        for result in ["ok", "unavailable"] {
            let _ = self.kv_replays.remove_label_values(&[instance, result]);
        }
        for signal in ["metrics", "kv_events", "config", "discovery"] {
            let _ = self.stale.remove_label_values(&[instance, signal]);
        }
        for field in ["block_size", "num_gpu_blocks", "max_num_seqs"] {
            let _ = self.config_mismatch.remove_label_values(&[instance, field]);
        }
        for name in deprecated {
            let _ = self.deprecated_names.remove_label_values(&[instance, name]);
        }
        let _ = self.restarts.remove_label_values(&[instance]);
    }
}
