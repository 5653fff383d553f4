//! One mirrored pod: its scrape loop (gauges, cache info, state rebuilt when nobody pushes
//! per-request state) and its health (why each signal holds it stale), written to the store
//! through the same entry points the push RPCs use (`MirrorStore::write_state`,
//! `apply_kv_events_capped`, staged: published once per tick) plus `set_stale_reason`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::config::LiveConfig;
use super::rebuild::rebuild;
use super::scrape::{ScrapeError, Scraper, page_text};
use super::text::{RestartMarks, TextError, parse_metrics};
use crate::telemetry::live::LiveMetrics;
use crate::twin::TwinError;
use crate::twin::snapshot::Gauges;
use crate::twin::store::{InstanceUpdate, MirrorStore, Publish};

/// The wall clock in µs since the Unix epoch (the mirror's client clock in live mode).
pub fn wall_now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

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
        /// Data-parallel engines behind the pod (see [`super::text::PodMetrics::engines`]).
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
    pub kv_sink: Mutex<super::kv::KvSink>,
    /// Unknown KV event types seen (to count them by type, boundedly, and drop their series).
    pub unknown_types: Mutex<Vec<String>>,
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

/// Why a scrape left nothing new in the mirror.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeFailure {
    /// The page could not be fetched.
    #[error(transparent)]
    Fetch(#[from] ScrapeError),
    /// The page is not the Prometheus text format vLLM serves.
    #[error(transparent)]
    Parse(#[from] TextError),
    /// No config is synced yet.
    #[error("the mirror has no config yet")]
    NoConfig,
    /// The synced config does not list this pod yet.
    #[error("the pod is not in the synced config yet")]
    NotInConfig,
    /// The store refused the state built from the page.
    #[error("the mirror rejected the scraped state: {0}")]
    Rejected(#[source] TwinError),
}

impl ScrapeFailure {
    /// The `result` label of `ditto_live_scrapes_total` (and the span) for this failure.
    pub fn result(&self) -> &'static str {
        match self {
            ScrapeFailure::Fetch(ScrapeError::Timeout(_)) => "timeout",
            ScrapeFailure::Fetch(ScrapeError::Connection(_)) => "connection",
            ScrapeFailure::Fetch(ScrapeError::Status(_)) => "status",
            ScrapeFailure::Fetch(ScrapeError::Body(_)) => "body",
            ScrapeFailure::Parse(_) => "parse",
            ScrapeFailure::NoConfig | ScrapeFailure::NotInConfig => "pending",
            ScrapeFailure::Rejected(_) => "rejected",
        }
    }
}

/// What a pod's scrape loop remembers from earlier pages.
#[derive(Debug, Default)]
struct Seen {
    /// The cache settings (and engines) last reported to the coordinator.
    cache: Option<(Option<u32>, Option<u32>, u32)>,
    /// The served model last reported to the coordinator.
    model: Option<String>,
    /// The last page's process-run marks.
    marks: Option<RestartMarks>,
    /// The pod's series written on every scrape, looked up once (a lookup hashes the labels
    /// under a lock): `ditto_live_scrapes_total{result="ok"}` and the `max_num_seqs`
    /// mismatch gauge.
    scrapes_ok: Option<prometheus::IntCounter>,
    seqs_mismatch: Option<prometheus::IntGauge>,
}

/// The scrape loop: one scrape in flight, every `scrape_interval` (a late scrape delays the
/// next tick instead of bursting).
pub async fn scrape_loop(pod: Arc<Pod>, news: mpsc::Sender<PodNews>) {
    let config = Arc::clone(&pod.config);
    let mut scraper = Scraper::new(
        pod.address.clone(),
        config.metrics_path.clone(),
        config.scrape_timeout,
    );
    let period = config
        .sources
        .get(pod.source)
        .map_or(config.scrape_interval, |source| {
            source.scrape_period(config.scrape_interval)
        });
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut seen = Seen::default();
    let mut last_at_us = 0;
    loop {
        ticker.tick().await;
        let started = Instant::now();
        let span = scrape_span(&pod.id);
        let outcome = tracing::Instrument::instrument(
            scrape_once(&pod, &mut scraper, last_at_us, &mut seen, &news),
            span.clone(),
        )
        .await;
        span.record(
            "ditto.scrape.result",
            outcome
                .as_ref()
                .map_or_else(ScrapeFailure::result, |_| "ok"),
        );
        drop(span);
        pod.metrics
            .scrape_duration
            .observe(started.elapsed().as_secs_f64());
        match outcome {
            Ok(at_us) => {
                last_at_us = at_us;
                seen.scrapes_ok
                    .get_or_insert_with(|| {
                        pod.metrics
                            .scrapes
                            .with_label_values(&[pod.id.as_str(), "ok"])
                    })
                    .inc();
                pod.metrics
                    .publish_lag
                    .observe(started.elapsed().as_secs_f64());
                pod.set_health(|h| h.metrics = None);
            }
            Err(failure) => {
                pod.metrics
                    .scrapes
                    .with_label_values(&[pod.id.as_str(), failure.result()])
                    .inc();
                pod.set_health(|h| h.metrics = Some(format!("metrics: {failure}")));
            }
        }
    }
}

/// The trace span of one scrape (a root: no request caused it), built only when trace export
/// is on (`telemetry::otel::active`); its result (`ok`, or why not) is recorded at the end.
fn scrape_span(pod: &str) -> tracing::Span {
    if !crate::telemetry::otel::active() {
        return tracing::Span::none();
    }
    tracing::info_span!(
        parent: None,
        "scrape",
        otel.kind = "client",
        ditto.pod = %pod,
        ditto.scrape.result = tracing::field::Empty,
    )
}

async fn scrape_once(
    pod: &Arc<Pod>,
    scraper: &mut Scraper,
    last_at_us: u64,
    seen: &mut Seen,
    news: &mpsc::Sender<PodNews>,
) -> Result<u64, ScrapeFailure> {
    let body = scraper.scrape().await?;
    let metrics = parse_metrics(page_text(&body)?)?;
    let marks = metrics.restart_marks();
    if seen
        .marks
        .is_some_and(|before| marks.restarted_since(&before))
    {
        tracing::info!(pod = %pod.id, "live mirror: the pod's process restarted");
        let restarts = pod.restarts.fetch_add(1, Ordering::Relaxed) + 1;
        pod.metrics
            .restarts
            .with_label_values(&[pod.id.as_str()])
            .inc();
        pod.restarted.send_replace(restarts);
    }
    seen.marks = Some(marks);
    {
        let mut known = pod
            .deprecated
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for &name in &metrics.deprecated {
            if !known.contains(&name) {
                known.push(name);
                pod.metrics
                    .deprecated_names
                    .with_label_values(&[pod.id.as_str(), name])
                    .set(1);
            }
        }
    }
    let cache = (metrics.block_size, metrics.num_gpu_blocks, metrics.engines);
    if seen.cache != Some(cache) || seen.model != metrics.model_name {
        seen.cache = Some(cache);
        seen.model.clone_from(&metrics.model_name);
        let _ = news
            .send(PodNews::CacheInfo {
                id: pod.id.clone(),
                block_size: cache.0,
                num_gpu_blocks: cache.1,
                engines: cache.2,
                model: metrics.model_name.clone(),
            })
            .await;
    }
    // Observed now, after the page arrived: as close as possible to what it describes.
    let at_us = wall_now_us().max(last_at_us + 1);
    let (config, index, state) = match pod.store.current_instance(&pod.id) {
        Ok(current) => current,
        Err(TwinError::NotSynced) => return Err(ScrapeFailure::NoConfig),
        Err(_) => return Err(ScrapeFailure::NotInConfig),
    };
    let engine = &config.instances[index].engine;
    seen.seqs_mismatch
        .get_or_insert_with(|| {
            pod.metrics
                .config_mismatch
                .with_label_values(&[pod.id.as_str(), "max_num_seqs"])
        })
        .set(i64::from(metrics.running > engine.max_num_seqs));
    let (metrics, capped) = cap_to_limits(metrics, engine, pod.store.limits());
    for (field, _) in &capped {
        pod.metrics
            .state_capped
            .with_label_values(&[pod.id.as_str(), field])
            .inc();
    }
    let note = (!capped.is_empty()).then(|| {
        capped
            .iter()
            .map(|(_, what)| what.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    });
    // Pushed per-request state is preferred while it is fresh.
    let last_rebuild = pod.last_rebuild_us.load(Ordering::Relaxed);
    let max_age_us = u64::try_from(pod.config.max_age.metrics.as_micros()).unwrap_or(u64::MAX);
    let pushed = state.observed_at_us != 0
        && state.observed_at_us != last_rebuild
        && at_us.saturating_sub(state.observed_at_us) <= max_age_us;
    let requests = (!pushed).then(|| rebuild(&pod.id, &metrics, engine, at_us));
    let rebuilt = requests.is_some();
    let update = InstanceUpdate {
        instance_id: pod.id.clone(),
        observed_at_us: at_us,
        requests,
        gauges: Some(Gauges {
            running: metrics.running,
            waiting: metrics.waiting,
            kv_usage: metrics.kv_usage,
        }),
        events: Vec::new(),
    };
    // A small update (one instance's gauges and a rebuilt list): applied inline, the store
    // holds its lock for microseconds.
    let with_requests = update.requests.is_some();
    let (observed_at_us, gauges) = (update.observed_at_us, update.gauges);
    // Staged: published with the other pods' writes at the next publish tick.
    let applied = match pod.store.write_state(update, Publish::Staged) {
        Ok(_) => Ok(with_requests),
        // A push newer than this scrape won the race: keep it, take the gauges only.
        Err(_) if with_requests => pod
            .store
            .write_state(
                InstanceUpdate {
                    instance_id: pod.id.clone(),
                    observed_at_us,
                    requests: None,
                    gauges,
                    events: Vec::new(),
                },
                Publish::Staged,
            )
            .map(|_| false),
        Err(err) => Err(err),
    };
    match applied {
        Ok(true) if rebuilt => pod.last_rebuild_us.store(at_us, Ordering::Relaxed),
        Ok(_) => {}
        Err(err) => return Err(ScrapeFailure::Rejected(err)),
    }
    // After the write: a changed note is published at once, with the capped values it
    // describes (staged just above), never before them.
    if state.capped != note {
        let _ = pod.store.set_capped_note(&pod.id, note);
    }
    Ok(at_us)
}

/// The page's counts capped to what the instance can hold, so a pod busier than its pool's
/// configured limits (or than vLLM's defaults the pool assumed) is still mirrored, never
/// refused: running requests to `max_num_seqs`, waiting ones to the store's per-instance
/// request limit. Returns the capped page and (field, what was capped) for each cap.
pub fn cap_to_limits(
    mut metrics: super::text::PodMetrics,
    engine: &crate::sim::EngineConfig,
    limits: &crate::twin::store::StoreLimits,
) -> (super::text::PodMetrics, Vec<(&'static str, String)>) {
    let mut capped = Vec::new();
    if metrics.running > engine.max_num_seqs {
        capped.push((
            "gauges.running",
            format!(
                "gauges.running {} capped to max_num_seqs {}",
                metrics.running, engine.max_num_seqs
            ),
        ));
        metrics.running = engine.max_num_seqs;
    }
    let room = u32::try_from(limits.max_requests_per_instance)
        .unwrap_or(u32::MAX)
        .saturating_sub(metrics.running);
    if metrics.waiting > room {
        capped.push((
            "requests.waiting",
            format!(
                "requests.waiting {} capped to {room} (max requests per instance {})",
                metrics.waiting, limits.max_requests_per_instance
            ),
        ));
        metrics.waiting = room;
    }
    (metrics, capped)
}

/// Sleeps `duration` (a named helper so loops read as prose).
pub async fn pause(duration: Duration) {
    tokio::time::sleep(duration).await;
}
