//! The live mirror: ditto keeps its mirror current from a running llm-d cluster by pulling
//! what every vLLM pod already exposes, the way the EPP does (docs/live.md).
//!
//! Pods come from sources (a static `host:port` list, or a headless Service's A records,
//! re-resolved every few seconds; vanished addresses are retired after a grace period). Each
//! pod becomes an instance (id = its `host:port`) built from its source's pool settings, with
//! `block_size`/`num_gpu_blocks` taken from `vllm:cache_config_info`. Per pod, one task
//! scrapes `/metrics` (`pod`), one follows the ZMQ KV-event stream (`kv`). Everything is
//! written to the mirror store through the entry points the push RPCs use, so push and pull
//! can feed one mirror. This is an edge module: it knows tokio, the wall clock and the
//! network; `text`, `rebuild`, `arrivals` and `kv_wire` are pure.

pub mod arrivals;
pub mod bench;
pub mod config;
pub mod infer;
mod inferred;
pub mod k8s;
mod kube;
pub mod kv;
pub mod kv_frames;
mod kv_replay;
pub mod kv_wire;
mod limit;
pub mod pod;
pub mod rebuild;
mod runtime;
pub mod scrape;
pub mod text;
pub mod vllm_defaults;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use thiserror::Error;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::cluster::config::{ClusterConfig, InstanceConfig};
use crate::telemetry::Metrics;
use crate::telemetry::live::LiveMetrics;
use crate::twin::TwinError;
use crate::twin::store::MirrorStore;

pub use config::{Discovery, KvEndpoints, LiveConfig, LiveSource, MaxAges};
use pod::{Health, Pod, PodNews};
use runtime::publish_loop;
pub use runtime::start;

/// Why the live mirror could not start.
#[derive(Debug, Error)]
pub enum LiveError {
    /// Its metrics could not be registered.
    #[error("live mirror metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The initial instance set was rejected by the mirror.
    #[error("live mirror config: {0}")]
    Config(#[source] TwinError),
    /// Its runtime or thread could not be started.
    #[error("live mirror runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// The running live mirror; dropping it stops every task and its thread.
#[derive(Debug)]
pub struct LiveHandle {
    coordinator: JoinHandle<()>,
    /// Publishes the pods' staged writes once per `publish_interval`.
    publisher: JoinHandle<()>,
    /// Ends the mirror's thread (its runtime drops every task left).
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Changes after every config sync the live mirror makes (value: the generation).
    pub synced: watch::Receiver<u64>,
}

impl Drop for LiveHandle {
    fn drop(&mut self) {
        self.coordinator.abort();
        self.publisher.abort();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// One discovered pod and its tasks.
#[derive(Debug)]
struct Entry {
    pod: Arc<Pod>,
    tasks: Vec<JoinHandle<()>>,
    /// (block_size, num_gpu_blocks per engine, engines) the pod publishes.
    cache: (Option<u32>, Option<u32>, u32),
    vanished_since: Option<Instant>,
    /// What the pod's spec, node and `/metrics` say about what it runs.
    inputs: infer::PodInputs,
    /// What was inferred from `inputs` (`None`: its source does not infer).
    inferred: Option<infer::Inferred>,
    /// The labels of its `ditto_live_inferred` series (to replace or drop it).
    inferred_labels: Option<Vec<String>>,
    /// Its `llm-d.ai/role` label (Kubernetes discovery), over its pool's role.
    role: Option<crate::cluster::config::InstanceRole>,
}

impl Entry {
    /// The inferred instance, when its source infers and inference succeeded.
    fn inferred_instance(&self) -> Option<&InstanceConfig> {
        self.inferred
            .as_ref()
            .and_then(|inferred| inferred.instance.as_ref().ok())
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

struct Coordinator {
    config: Arc<LiveConfig>,
    store: Arc<MirrorStore>,
    metrics: LiveMetrics,
    pods: BTreeMap<String, Entry>,
    news: mpsc::Sender<PodNews>,
    synced: watch::Sender<u64>,
    /// The Kubernetes discovery tasks (aborted with the coordinator).
    kube_tasks: tokio::task::JoinSet<()>,
    /// `ditto_live_inferred`: what each pod was inferred to run (see [`infer`]).
    inferred_gauge: prometheus::IntGaugeVec,
    /// What each Kubernetes source last reported: its pods and why it is degraded.
    kube_views: BTreeMap<usize, (Vec<k8s::PodView>, Option<String>)>,
    /// Served pods of each source left out over `--max-instances`, in their order.
    left_out: BTreeMap<usize, Vec<String>>,
    /// The left-out pods marked `ditto_live_stale{signal="over_limit"}`.
    marked_left_out: std::collections::BTreeSet<String>,
    /// `ditto_live_arrivals_total` (see [`arrivals`]).
    arrivals_total: prometheus::IntCounterVec,
}

/// The coordinator's and the publisher's tasks, and the receiver of the sync generations.
type Spawned = (JoinHandle<()>, JoinHandle<()>, watch::Receiver<u64>);

/// The coordinator, the publisher and the pods' tasks, spawned on the entered runtime.
fn spawn_tasks(
    config: LiveConfig,
    store: Arc<MirrorStore>,
    metrics: &Metrics,
) -> Result<Spawned, LiveError> {
    let live_metrics = LiveMetrics::register(metrics.registry())?;
    let (news, mut news_rx) = mpsc::channel(256);
    let (synced, synced_rx) = watch::channel(0);
    let mut coordinator = Coordinator {
        config: Arc::new(config),
        store,
        metrics: live_metrics,
        pods: BTreeMap::new(),
        news,
        synced,
        kube_tasks: tokio::task::JoinSet::new(),
        inferred_gauge: inferred::register_gauge(metrics.registry())?,
        kube_views: BTreeMap::new(),
        left_out: BTreeMap::new(),
        marked_left_out: std::collections::BTreeSet::new(),
        arrivals_total: arrivals::register_counter(metrics.registry())?,
    };
    coordinator.add_statics();
    if !coordinator.pods.is_empty() {
        coordinator.sync().map_err(LiveError::Config)?;
    }
    let has_dns = coordinator
        .config
        .sources
        .iter()
        .any(|source| matches!(source.discovery, Discovery::Dns { .. }));
    let (kube_news, mut kube_rx) = mpsc::channel(64);
    for (index, source) in coordinator.config.sources.iter().enumerate() {
        if let Discovery::Kubernetes(spec) = &source.discovery {
            coordinator.kube_tasks.spawn(k8s::watch::run(
                index,
                spec.clone(),
                kube_news.clone(),
                coordinator.config.kube,
                coordinator.metrics.clone(),
            ));
        }
    }
    let has_kube = !coordinator.kube_tasks.is_empty();
    drop(kube_news);
    let publisher = tokio::spawn(publish_loop(
        Arc::clone(&coordinator.store),
        coordinator.config.publish_interval,
    ));
    let task = tokio::spawn(async move {
        let mut ticker = tokio::time::interval(coordinator.config.dns_interval);
        let mut retire_ticker = tokio::time::interval(KUBE_RETIRE_CHECK);
        loop {
            tokio::select! {
                _ = ticker.tick(), if has_dns => coordinator.resolve().await,
                _ = retire_ticker.tick(), if has_kube => coordinator.retire_kube(),
                Some(news) = kube_rx.recv(), if has_kube => coordinator.on_kube(news),
                Some(news) = news_rx.recv() => coordinator.on_news(news),
            }
        }
    });
    Ok((task, publisher, synced_rx))
}

/// How often pods that Kubernetes discovery lost are checked for retirement.
const KUBE_RETIRE_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// Of one source's known pods (id, when it was first found missing), the ids to retire now:
/// a pod missing from `found` is remembered as vanished at `now`, and retired once it has been
/// missing for `grace`; a pod found again is forgotten as vanished.
fn to_retire(
    known: Vec<(&String, &mut Option<Instant>)>,
    found: &[String],
    now: Instant,
    grace: std::time::Duration,
) -> Vec<String> {
    let mut retired = Vec::new();
    for (id, vanished_since) in known {
        if found.contains(id) {
            *vanished_since = None;
            continue;
        }
        let since = *vanished_since.get_or_insert(now);
        if now.duration_since(since) >= grace {
            retired.push(id.clone());
        }
    }
    retired
}

impl Coordinator {
    /// Starts mirroring pod `id` of source `source`, scraped at `address` (`host:port`).
    fn add(&mut self, source: usize, id: String, address: String) {
        let host = address
            .rsplit_once(':')
            .map_or(address.as_str(), |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let pod = Arc::new(Pod {
            id: id.clone(),
            address,
            host,
            source,
            store: Arc::clone(&self.store),
            metrics: self.metrics.clone(),
            config: Arc::clone(&self.config),
            health: Mutex::new(Health::default()),
            last_rebuild_us: AtomicU64::new(0),
            deprecated: Mutex::new(Vec::new()),
            restarts: AtomicU64::new(0),
            restarted: watch::channel(0).0,
            kv_sink: Mutex::new(pod::KvSink::default()),
            unknown_types: Mutex::new(Vec::new()),
            arrivals_total: self.arrivals_total.clone(),
        });
        let mut tasks = vec![tokio::spawn(pod::scrape_loop(
            Arc::clone(&pod),
            self.news.clone(),
        ))];
        if let Some(endpoints) = &self.config.sources[source].kv {
            for rank in 0..endpoints.dp_size.max(1) {
                tasks.push(tokio::spawn(kv::kv_loop(
                    Arc::clone(&pod),
                    endpoints.clone(),
                    rank,
                )));
            }
        }
        tracing::info!(pod = %id, source = %self.config.sources[source].name, "live mirror: pod added");
        self.pods.insert(
            id,
            Entry {
                pod,
                tasks,
                cache: (None, None, 1),
                vanished_since: None,
                inputs: infer::PodInputs::default(),
                inferred: None,
                inferred_labels: None,
                role: None,
            },
        );
        self.metrics.pods.set(self.pods.len() as i64);
    }

    /// The instance config of one pod: its source's template with the cache settings it
    /// publishes; a published value that differs from the configured one is reported.
    fn instance(&self, entry: &Entry) -> InstanceConfig {
        let source = &self.config.sources[entry.pod.source];
        // An inferred pod starts from what it runs; one that cannot be inferred is held
        // stale (its reason says why) on its source's pool.
        let base = entry.inferred_instance().unwrap_or(&source.template);
        let inferred = entry.inferred_instance().is_some();
        let mut instance = base.clone();
        instance.id = entry.pod.id.clone();
        instance.role = entry.role.unwrap_or(instance.role);
        let mut mismatches = Vec::new();
        for (field, published, configured) in [
            ("block_size", entry.cache.0, &mut instance.engine.block_size),
            (
                "num_gpu_blocks",
                entry.cache.1,
                &mut instance.engine.num_gpu_blocks,
            ),
        ] {
            let differs = published.is_some_and(|value| value != *configured);
            // An inferred pool has no configured value to differ from: the pod's is taken.
            self.metrics
                .config_mismatch
                .with_label_values(&[entry.pod.id.as_str(), field])
                .set(i64::from(differs && !inferred));
            if let Some(value) = published.filter(|_| differs) {
                if !inferred {
                    mismatches.push(format!("{field} {value} (configured {configured})"));
                }
                *configured = value;
            }
        }
        if !mismatches.is_empty() {
            tracing::warn!(
                pod = %entry.pod.id,
                published = %mismatches.join(", "),
                "live mirror: the pod's cache config differs from its pool's; using the pod's"
            );
        }
        // A data-parallel pod is one instance (the gateway routes to the pod, not to an
        // engine) with the pool's per-engine limits times its engines.
        let engines = entry.cache.2.max(1);
        if engines > 1 {
            let engine = &mut instance.engine;
            engine.max_num_seqs = engine.max_num_seqs.saturating_mul(engines);
            engine.max_num_batched_tokens = engine.max_num_batched_tokens.saturating_mul(engines);
            engine.num_gpu_blocks = engine.num_gpu_blocks.saturating_mul(engines);
        }
        if instance.engine.validate().is_err() {
            // The published values do not make a valid engine: keep the pool's.
            let mut fallback = base.clone();
            fallback.id = entry.pod.id.clone();
            fallback.role = entry.role.unwrap_or(fallback.role);
            return fallback;
        }
        instance
    }

    /// Syncs the current pod set into the store.
    fn sync(&mut self) -> Result<(), TwinError> {
        let instances: Vec<InstanceConfig> = self
            .pods
            .values()
            .map(|entry| self.instance(entry))
            .collect();
        let addresses: Vec<String> = self
            .pods
            .values()
            .map(|entry| entry.pod.address.clone())
            .collect();
        if instances.is_empty() {
            // Every pod is gone: answer "not synced" (as before the first pod) rather than
            // simulate pods that no longer exist. Nothing was ever synced when none was found.
            if self.store.latest().is_some() {
                self.store.clear();
                tracing::warn!("live mirror: no pods left; the mirror is empty until one appears");
            }
            return Ok(());
        }
        let cluster = ClusterConfig {
            instances,
            ..self.config.cluster.clone()
        };
        // The forecast loop groups pods by their source's pool (their ids are addresses).
        let mut settings = self.config.settings.clone();
        // An inferred pod counts in the pool of its inferred setup.
        settings.variants = self
            .pods
            .iter()
            .map(|(id, entry)| {
                let pool = match &entry.inferred {
                    Some(inferred) if !inferred.setup.pool.is_empty() => {
                        inferred.setup.pool.clone()
                    }
                    _ => self.config.sources[entry.pod.source].name.clone(),
                };
                (id.clone(), pool)
            })
            .collect();
        settings.inferred = self
            .pods
            .iter()
            .filter_map(|(id, entry)| Some((id.clone(), entry.inferred.as_ref()?.setup.clone())))
            .collect();
        let outcome = self.store.sync_config(cluster, settings, addresses)?;
        for entry in self.pods.values() {
            entry.pod.republish_health();
        }
        self.synced.send_replace(outcome.generation);
        Ok(())
    }

    fn resync(&mut self) {
        if let Err(err) = self.sync() {
            tracing::error!(%err, "live mirror: config sync rejected");
        }
    }

    fn on_news(&mut self, news: PodNews) {
        match news {
            PodNews::CacheInfo {
                id,
                block_size,
                num_gpu_blocks,
                engines,
                model,
            } => {
                let Some(entry) = self.pods.get_mut(&id) else {
                    return;
                };
                let cache_changed = entry.cache != (block_size, num_gpu_blocks, engines);
                entry.cache = (block_size, num_gpu_blocks, engines);
                let model_changed = entry.inputs.served_model != model;
                entry.inputs.served_model = model;
                let inference_changed = model_changed && self.refresh_inference(&id);
                if cache_changed || inference_changed {
                    self.resync();
                }
            }
        }
    }

    /// Stops mirroring pod `id` (its tasks end, its series are dropped); false if unknown.
    fn retire(&mut self, id: &str) -> bool {
        let Some(entry) = self.pods.remove(id) else {
            return false;
        };
        let deprecated = entry
            .pod
            .deprecated
            .lock()
            .map(|names| names.clone())
            .unwrap_or_default();
        let unknown = entry
            .pod
            .unknown_types
            .lock()
            .map(|types| types.clone())
            .unwrap_or_default();
        self.metrics.forget(id, &deprecated, &unknown);
        let _ = self.arrivals_total.remove_label_values(&[id]);
        let _ = self
            .metrics
            .state_capped
            .remove_label_values(&[id, "arrivals"]);
        self.forget_inference(id, &entry);
        tracing::info!(pod = %id, "live mirror: pod retired");
        self.metrics.pods.set(self.pods.len() as i64);
        true
    }

    /// Re-resolves every DNS source; adds new addresses, retires long-vanished ones.
    async fn resolve(&mut self) {
        let mut changed = false;
        let now = Instant::now();
        for index in 0..self.config.sources.len() {
            let Discovery::Dns { name, port } = &self.config.sources[index].discovery else {
                continue;
            };
            let found: Vec<String> = match tokio::net::lookup_host((name.as_str(), *port)).await {
                Ok(addresses) => {
                    let mut found: Vec<String> = addresses.map(|a| a.to_string()).collect();
                    found.sort();
                    found.dedup();
                    found
                }
                Err(err) => {
                    // Keep what we have: a DNS outage must not empty the mirror.
                    tracing::warn!(%name, %err, "live mirror: DNS resolution failed");
                    continue;
                }
            };
            let vanished: Vec<(&String, &mut Option<Instant>)> = self
                .pods
                .iter_mut()
                .filter(|(_, entry)| entry.pod.source == index)
                .map(|(id, entry)| (id, &mut entry.vanished_since))
                .collect();
            let retired = to_retire(vanished, &found, now, self.config.retire_after);
            for id in retired {
                changed |= self.retire(&id);
            }
            changed |= self.admit_found(index, &found);
        }
        self.metrics.pods.set(self.pods.len() as i64);
        if changed {
            self.resync();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn vanished_pods_are_retired_after_the_grace_period_only() {
        let (a, b) = ("10.0.0.1:8000".to_owned(), "10.0.0.2:8000".to_owned());
        let (mut va, mut vb) = (None, None);
        let start = Instant::now();
        let grace = Duration::from_secs(30);
        // b vanishes: remembered, not retired.
        let found = vec![a.clone()];
        assert!(to_retire(vec![(&a, &mut va), (&b, &mut vb)], &found, start, grace).is_empty());
        assert_eq!((va, vb), (None, Some(start)));
        // Still gone within the grace period: kept.
        let later = start + Duration::from_secs(10);
        assert!(to_retire(vec![(&a, &mut va), (&b, &mut vb)], &found, later, grace).is_empty());
        // Back again: forgotten as vanished; gone again later: the clock restarts.
        let back = vec![a.clone(), b.clone()];
        assert!(to_retire(vec![(&a, &mut va), (&b, &mut vb)], &back, later, grace).is_empty());
        assert_eq!(vb, None);
        let again = start + Duration::from_secs(20);
        assert!(to_retire(vec![(&a, &mut va), (&b, &mut vb)], &found, again, grace).is_empty());
        let past = again + grace;
        assert_eq!(
            to_retire(vec![(&a, &mut va), (&b, &mut vb)], &found, past, grace),
            vec![b.clone()]
        );
    }
}
