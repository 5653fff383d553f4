//! A pod's scrape loop: one scrape in flight every `scrape_interval`, the page read into
//! gauges and cache info, state rebuilt from them when nobody pushes per-request state,
//! written to the store through the push RPCs' entry point (`MirrorStore::write_state`,
//! staged: published once per tick, with the capped note beside it). With a rebuilt state,
//! the arrivals the pod's counters show (`live::arrivals`) are recorded beside it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::{Pod, PodNews};
use crate::live::arrivals::{ArrivalCounter, spread};
use crate::live::rebuild::rebuild;
use crate::live::scrape::{ScrapeError, Scraper, page_text};
use crate::live::text::{PodMetrics, RestartMarks, TextError, parse_metrics};
use crate::telemetry::clock::wall_now_us;
use crate::twin::TwinError;
use crate::twin::snapshot::{Gauges, InstanceState};
use crate::twin::store::{InstanceUpdate, Publish};

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

/// A pod's cache settings as its page reports them (`vllm:cache_config_info`), compared
/// with the last ones reported to the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CacheSettings {
    /// Tokens per KV block, if the page says.
    block_size: Option<u32>,
    /// GPU KV blocks, if the page says.
    num_gpu_blocks: Option<u32>,
    /// Data-parallel engines the page's series come from.
    engines: u32,
}

/// What a pod's scrape loop remembers from earlier pages.
#[derive(Debug, Default)]
struct Seen {
    /// The cache settings (and engines) last reported to the coordinator.
    cache: Option<CacheSettings>,
    /// The served model last reported to the coordinator.
    model: Option<String>,
    /// The last page's process-run marks.
    marks: Option<RestartMarks>,
    /// The pod's series written on every scrape, looked up once (a lookup hashes the labels
    /// under a lock): `ditto_live_scrapes_total{result="ok"}` and the `max_num_seqs`
    /// mismatch gauge.
    scrapes_ok: Option<prometheus::IntCounter>,
    seqs_mismatch: Option<prometheus::IntGauge>,
    /// The finished-request counter's baseline.
    arrivals: ArrivalCounter,
    /// The pod's `ditto_live_arrivals_total` series, looked up once.
    arrivals_total: Option<prometheus::IntCounter>,
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

/// One scrape: the page read, what it says about the pod reported (restart, deprecated
/// names, cache settings), then the observation written. Returns its time (µs).
async fn scrape_once(
    pod: &Arc<Pod>,
    scraper: &mut Scraper,
    last_at_us: u64,
    seen: &mut Seen,
    news: &mpsc::Sender<PodNews>,
) -> Result<u64, ScrapeFailure> {
    let body = scraper.scrape().await?;
    let metrics = parse_metrics(page_text(&body)?)?;
    let restarted = note_restart(pod, seen, &metrics);
    note_deprecated(pod, &metrics);
    report_cache(pod, seen, &metrics, news).await;
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
    // Counted from the page as the pod published it (before the caps below).
    let in_pod = u64::from(metrics.waiting) + u64::from(metrics.running);
    let counted = seen
        .arrivals
        .observe(metrics.finished_requests(), in_pod, restarted);
    let (metrics, mut capped) = cap_to_limits(metrics, engine, pod.store.limits());
    let counted = counted.map(|count| cap_arrivals(count, pod.store.limits(), &mut capped));
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
    // With the counter read, the store does not count the rebuilt lists' ids as arrivals:
    // the counter's count is recorded instead.
    let written = write_observation(pod, &metrics, engine, &state, at_us, counted.is_none())?;
    if let (Some(count), true) = (counted, written.rebuilt) {
        seen.arrivals_total
            .get_or_insert_with(|| pod.arrivals_total.with_label_values(&[pod.id.as_str()]))
            .inc_by(count);
        record_arrivals(pod, count, (last_at_us, at_us));
    }
    // Staged after the capped values it describes: both published at the next tick.
    if written.written && state.capped != note {
        let _ = pod.store.set_capped_note(&pod.id, note, Publish::Staged);
    }
    Ok(at_us)
}

/// `count` arrivals counted in one scrape, capped to what the store keeps (`arrivals_max`):
/// a cut is said in `capped` (counted and noted as the other caps are).
fn cap_arrivals(
    count: u64,
    limits: &crate::twin::store::StoreLimits,
    capped: &mut Vec<(&'static str, String)>,
) -> u64 {
    let max = u64::try_from(limits.arrivals_max).unwrap_or(u64::MAX);
    if count > max {
        capped.push((
            "arrivals",
            format!("arrivals {count} counted in one scrape capped to {max} (arrivals_max)"),
        ));
    }
    count.min(max)
}

/// Records the `count` arrivals the pod's counters show over `(from_us, to_us]`, spread
/// evenly over the interval (staged: published with the scrape's write).
fn record_arrivals(pod: &Pod, count: u64, (from_us, to_us): (u64, u64)) {
    if count == 0 {
        return;
    }
    // No earlier observation written: the interval is unknown, all at this scrape.
    let from_us = if from_us == 0 { to_us } else { from_us };
    // Fails only without a config, and this scrape's write just found one.
    let _ = pod
        .store
        .record_arrivals(&pod.id, &spread(count, from_us, to_us));
}

/// A process restart read from the page (another start time, a counter reset): counted,
/// and told to the pod's KV loops (they clear its blocks and replay). Returns whether it
/// restarted.
fn note_restart(pod: &Pod, seen: &mut Seen, metrics: &PodMetrics) -> bool {
    let marks = metrics.restart_marks();
    let restarted = seen
        .marks
        .is_some_and(|before| marks.restarted_since(&before));
    if restarted {
        tracing::info!(pod = %pod.id, "live mirror: the pod's process restarted");
        let restarts = pod.restarts.fetch_add(1, Ordering::Relaxed) + 1;
        pod.metrics
            .restarts
            .with_label_values(&[pod.id.as_str()])
            .inc();
        pod.restarted.send_replace(restarts);
    }
    seen.marks = Some(marks);
    restarted
}

/// Each deprecated metric name the pod uses, remembered (its series dropped at retirement)
/// and shown once.
fn note_deprecated(pod: &Pod, metrics: &PodMetrics) {
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

/// Tells the coordinator the pod's cache settings and served model when they change.
async fn report_cache(
    pod: &Pod,
    seen: &mut Seen,
    metrics: &PodMetrics,
    news: &mpsc::Sender<PodNews>,
) {
    let cache = CacheSettings {
        block_size: metrics.block_size,
        num_gpu_blocks: metrics.num_gpu_blocks,
        engines: metrics.engines,
    };
    if seen.cache == Some(cache) && seen.model == metrics.model_name {
        return;
    }
    seen.cache = Some(cache);
    seen.model.clone_from(&metrics.model_name);
    let _ = news
        .send(PodNews::CacheInfo {
            id: pod.id.clone(),
            block_size: cache.block_size,
            num_gpu_blocks: cache.num_gpu_blocks,
            engines: cache.engines,
            model: metrics.model_name.clone(),
        })
        .await;
}

/// Writes one observation (staged: published with the other pods' writes at the next tick)
/// in one store call: its gauges, and its state rebuilt from them unless pushed per-request
/// state is fresh; the store counts the rebuilt lists' new ids as arrivals only when
/// `store_counts` (no finished-request counter to count them). A push newer than this
/// scrape that won the race in between (`TwinError::Superseded`) is kept and this
/// observation dropped (the next scrape sees the push and takes the gauges only); any other
/// refusal is the scrape's failure.
fn write_observation(
    pod: &Pod,
    metrics: &PodMetrics,
    engine: &crate::sim::EngineConfig,
    state: &InstanceState,
    at_us: u64,
    store_counts: bool,
) -> Result<Written, ScrapeFailure> {
    let last_rebuild = pod.last_rebuild_us.load(Ordering::Relaxed);
    let max_age_us = u64::try_from(pod.config.max_age.metrics.as_micros()).unwrap_or(u64::MAX);
    let pushed = state.observed_at_us != 0
        && state.observed_at_us != last_rebuild
        && at_us.saturating_sub(state.observed_at_us) <= max_age_us;
    let requests = (!pushed).then(|| rebuild(&pod.id, metrics, engine, at_us));
    let rebuilt = requests.is_some();
    let update = InstanceUpdate {
        instance_id: pod.id.clone(),
        observed_at_us: at_us,
        requests,
        gauges: Some(Gauges {
            running: metrics.running,
            waiting: metrics.waiting,
            kv_usage: metrics.kv_usage,
            transfers: metrics.transfers,
        }),
        events: Vec::new(),
        counts_arrivals: store_counts,
    };
    // A small update (one instance's gauges and a rebuilt list): applied inline, the store
    // holds its lock for microseconds.
    match pod.store.write_state(update, Publish::Staged) {
        Ok(_) => {
            if rebuilt {
                pod.last_rebuild_us.store(at_us, Ordering::Relaxed);
            }
            Ok(Written {
                written: true,
                rebuilt,
            })
        }
        Err(TwinError::Superseded { .. }) => Ok(Written {
            written: false,
            rebuilt: false,
        }),
        Err(err) => Err(ScrapeFailure::Rejected(err)),
    }
}

/// What [`write_observation`] wrote.
struct Written {
    /// The observation was written.
    written: bool,
    /// The observation written was a rebuilt state (false when pushed state was kept:
    /// pushes give every arrival; or when nothing was written).
    rebuilt: bool,
}

/// The page's counts capped to what the instance can hold, so a pod busier than its pool's
/// configured limits (or than vLLM's defaults the pool assumed) is still mirrored, never
/// refused: running requests to `max_num_seqs`, waiting ones to the store's per-instance
/// request limit. Returns the capped page and (field, what was capped) for each cap.
pub fn cap_to_limits(
    mut metrics: PodMetrics,
    engine: &crate::sim::EngineConfig,
    limits: &crate::twin::store::StoreLimits,
) -> (PodMetrics, Vec<(&'static str, String)>) {
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
