//! One mirrored pod: the state its tasks share ([`Pod`]: its identity, its health (why each
//! signal holds it stale), where its KV batches are in the store's sequence), what it tells
//! the coordinator, and its scrape loop (`scrape_loop.rs`: gauges, cache info, state rebuilt
//! when nobody pushes per-request state). The KV-event loops (`live::kv`) and the scrape
//! loop both build on this file; it imports neither.

mod scrape_loop;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::config::LiveConfig;
use crate::telemetry::live::LiveMetrics;
use crate::twin::store::MirrorStore;

pub use scrape_loop::{ScrapeFailure, cap_to_limits, scrape_loop};

/// What a pod tells the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodNews {
    /// The pod publishes these cache settings (`vllm:cache_config_info`).
    CacheInfo {
        /// The pod.
        id: String,
        /// `block_size`.
        block_size: Option<u32>,
        /// `num_gpu_blocks` (per engine).
        num_gpu_blocks: Option<u32>,
        /// Data-parallel engines behind the pod (see [`crate::live::text::PodMetrics::engines`]).
        engines: u32,
        /// The served model (`model_name` of its vLLM series).
        model: Option<String>,
    },
}

/// Why each signal holds a pod stale (`None`: fresh).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// The scrape path.
    pub metrics: Option<String>,
    /// The KV-event stream.
    pub kv_events: Option<String>,
    /// A mismatch between the pod and its config.
    pub config: Option<String>,
    /// Discovery: the pod is gone or NotReady, or its source cannot be followed (Kubernetes).
    pub discovery: Option<String>,
    /// Inference: what the pod runs cannot be inferred (names the missing piece).
    pub inference: Option<String>,
}

impl Health {
    /// All reasons, `; `-joined (`None` when healthy).
    pub fn reason(&self) -> Option<String> {
        let parts: Vec<&str> = [
            &self.metrics,
            &self.kv_events,
            &self.config,
            &self.discovery,
            &self.inference,
        ]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// State shared by a pod's tasks.
#[derive(Debug)]
pub struct Pod {
    /// Instance id: its `host:port`, or `namespace/name` for a Kubernetes-discovered pod.
    pub id: String,
    /// Where its `/metrics` is served (`host:port`).
    pub address: String,
    /// The host part of `address`.
    pub host: String,
    /// Index of its source in the config.
    pub source: usize,
    /// The mirror.
    pub store: Arc<MirrorStore>,
    /// Live metrics.
    pub metrics: LiveMetrics,
    /// The settings.
    pub config: Arc<LiveConfig>,
    /// Health per signal.
    pub health: Mutex<Health>,
    /// Observation time of the last rebuilt state written (µs; 0: none).
    pub last_rebuild_us: AtomicU64,
    /// Deprecated names this pod has used (to drop their series at retirement).
    pub deprecated: Mutex<Vec<&'static str>>,
    /// Process restarts seen on its `/metrics` (another start time, a counter reset).
    pub restarts: AtomicU64,
    /// Holds the restart count, sent at each restart: every KV loop clears the pod's blocks
    /// (its cache died with it) and replays the new publisher.
    pub restarted: tokio::sync::watch::Sender<u64>,
    /// Where the pod's instance is in the store's KV-event sequence (all ranks write there).
    pub kv_sink: Mutex<KvSink>,
    /// Unknown KV event types seen (to count them by type, boundedly, and drop their series).
    pub unknown_types: Mutex<Vec<String>>,
    /// `ditto_live_arrivals_total`: arrivals counted from each pod's counters
    /// ([`crate::live::arrivals`]).
    pub arrivals_total: prometheus::IntCounterVec,
}

impl Pod {
    /// Updates one signal's reason and publishes the combined reason (no-op if unchanged).
    pub fn set_health(&self, update: impl FnOnce(&mut Health)) {
        let (reason, health) = {
            let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
            let before = health.clone();
            update(&mut health);
            if *health == before {
                return;
            }
            (health.reason(), health.clone())
        };
        for (signal, value) in [
            ("metrics", &health.metrics),
            ("kv_events", &health.kv_events),
            ("config", &health.config),
            ("discovery", &health.discovery),
            ("inference", &health.inference),
        ] {
            self.metrics
                .stale
                .with_label_values(&[self.id.as_str(), signal])
                .set(i64::from(value.is_some()));
        }
        if let Some(reason) = &reason {
            tracing::warn!(pod = %self.id, %reason, "live mirror: pod stale");
        } else {
            tracing::info!(pod = %self.id, "live mirror: pod fresh");
        }
        // Before the pod's first config sync the store does not know it: the reason is
        // published again with the next change.
        let _ = self.store.set_stale_reason(&self.id, reason);
    }

    /// Re-publishes the current reason (after a config sync created the instance).
    pub fn republish_health(&self) {
        let reason = self
            .health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reason();
        let _ = self.store.set_stale_reason(&self.id, reason);
    }
}

/// Where the pod's instance is in the store: every rank's batches go through it, in order.
#[derive(Debug, Default)]
pub struct KvSink {
    /// The store sequence number of the next batch.
    pub(in crate::live) next_seq: u64,
    /// Last `ts_us` written (the store wants it non-decreasing).
    pub(in crate::live) last_ts_us: u64,
}

/// Sleeps `duration` (a named helper so loops read as prose).
pub async fn pause(duration: Duration) {
    tokio::time::sleep(duration).await;
}
