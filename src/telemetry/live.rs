//! Metrics of the live mirror (`ditto_live_*`): scrapes, KV-event batches and replays, and
//! which signal holds an instance stale. Label values are bounded: instances follow the
//! discovered pods (removed when a pod is retired), results and signals are fixed sets.

use prometheus::{Histogram, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::families::{counter_vec, gauge, gauge_vec, histogram};

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
    /// 1 while `signal` (`metrics`, `kv_events`, `config`, `discovery`, `inference`) holds
    /// `instance` stale; `over_limit` marks a served pod left out of the mirror by
    /// `--max-instances` (never an instance, never scraped).
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
        let scrape = ScrapeFamilies::register(registry)?;
        let kv = KvFamilies::register(registry)?;
        let pod = PodFamilies::register(registry)?;
        Ok(Self {
            scrapes: scrape.scrapes,
            scrape_duration: scrape.scrape_duration,
            publish_lag: scrape.publish_lag,
            kv_batches: kv.kv_batches,
            kv_replays: kv.kv_replays,
            stale: pod.stale,
            config_mismatch: scrape.config_mismatch,
            deprecated_names: scrape.deprecated_names,
            pods: pod.pods,
            restarts: scrape.restarts,
            state_capped: scrape.state_capped,
            kv_unknown_events: kv.kv_unknown_events,
            kv_gaps: kv.kv_gaps,
            kv_connections: kv.kv_connections,
            kube_failures: pod.kube_failures,
            kube_skipped: pod.kube_skipped,
            pods_over_limit: pod.pods_over_limit,
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
        for signal in ["metrics", "kv_events", "config", "discovery", "inference"] {
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

/// What each pod's scrape saw: results, timings, mismatches, restarts, caps.
struct ScrapeFamilies {
    scrapes: IntCounterVec,
    scrape_duration: Histogram,
    publish_lag: Histogram,
    config_mismatch: IntGaugeVec,
    deprecated_names: IntGaugeVec,
    restarts: IntCounterVec,
    state_capped: IntCounterVec,
}

impl ScrapeFamilies {
    fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let lag_buckets = (0.0005, 2.0, 14);
        Ok(Self {
            scrapes: counter_vec(
                registry,
                "ditto_live_scrapes_total",
                "Pod /metrics scrapes by result.",
                &["instance", "result"],
            )?,
            scrape_duration: histogram(
                registry,
                "ditto_live_scrape_duration_seconds",
                "Pod /metrics scrape duration.",
                lag_buckets,
            )?,
            publish_lag: histogram(
                registry,
                "ditto_live_publish_lag_seconds",
                "From a scrape's start to its state being in the mirror.",
                lag_buckets,
            )?,
            config_mismatch: gauge_vec(
                registry,
                "ditto_live_config_mismatch",
                "1 when a pod publishes a setting that differs from the configured one.",
                &["instance", "field"],
            )?,
            deprecated_names: gauge_vec(
                registry,
                "ditto_live_deprecated_metric_names",
                "Deprecated metric names a pod uses.",
                &["instance", "name"],
            )?,
            restarts: counter_vec(
                registry,
                "ditto_live_pod_restarts_total",
                "Pod process restarts seen on /metrics (new start time or a counter reset).",
                &["instance"],
            )?,
            state_capped: counter_vec(
                registry,
                "ditto_live_state_capped_total",
                "Observations capped to the instance's limits, by field.",
                &["instance", "field"],
            )?,
        })
    }
}

/// What each pod's KV-event streams saw: batches, replays, gaps, connections.
struct KvFamilies {
    kv_batches: IntCounterVec,
    kv_replays: IntCounterVec,
    kv_unknown_events: IntCounterVec,
    kv_gaps: IntCounterVec,
    kv_connections: IntCounterVec,
}

impl KvFamilies {
    fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        Ok(Self {
            kv_batches: counter_vec(
                registry,
                "ditto_live_kv_batches_total",
                "KV-event batches received, by result.",
                &["instance", "result"],
            )?,
            kv_replays: counter_vec(
                registry,
                "ditto_live_kv_replays_total",
                "KV-event replays after a gap, by result.",
                &["instance", "result"],
            )?,
            kv_unknown_events: counter_vec(
                registry,
                "ditto_live_kv_unknown_events_total",
                "KV events of an unknown type, skipped one by one.",
                &["instance", "type"],
            )?,
            kv_gaps: counter_vec(
                registry,
                "ditto_live_kv_gaps_total",
                "KV-event batches missed and not recovered by a replay.",
                &["instance"],
            )?,
            kv_connections: counter_vec(
                registry,
                "ditto_live_kv_connections_total",
                "KV-event stream connections by result.",
                &["instance", "result"],
            )?,
        })
    }
}

/// Which pods are mirrored: their staleness, Kubernetes discovery, the instance cap.
struct PodFamilies {
    stale: IntGaugeVec,
    pods: IntGauge,
    kube_failures: IntCounterVec,
    kube_skipped: IntCounterVec,
    pods_over_limit: IntGauge,
}

impl PodFamilies {
    fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        Ok(Self {
            stale: gauge_vec(
                registry,
                "ditto_live_stale",
                "1 while the signal holds the instance stale.",
                &["instance", "signal"],
            )?,
            pods: gauge(
                registry,
                "ditto_live_pods",
                "Pods mirrored by the live mirror.",
            )?,
            kube_failures: counter_vec(
                registry,
                "ditto_live_kube_failures_total",
                "Kubernetes discovery failures (list, watch) by kind.",
                &["kind"],
            )?,
            kube_skipped: counter_vec(
                registry,
                "ditto_live_kube_pods_skipped_total",
                "Pod objects from the Kubernetes API skipped or not served, by reason.",
                &["reason"],
            )?,
            pods_over_limit: gauge(
                registry,
                "ditto_live_pods_over_limit",
                "Served pods left out of the mirror because it holds --max-instances.",
            )?,
        })
    }
}
