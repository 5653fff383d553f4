//! The live-mirror case (`ditto bench`, case `live`): N fake pods on loopback serving a realistic
//! vLLM `/metrics` page (static bytes, served by axum in *another process*: `ditto bench
//! --fake-pods N`, see [`serve_fake_pods`]), mirrored at a given scrape interval for a while.
//! Reports ditto's own CPU per pod per second (this process's, from /proc: scrape, parse,
//! rebuild and publish, nothing of the serving), the fake pods' CPU beside it, the freshness
//! lag (mean age of the mirrored gauges, sampled every 10 ms, and mean scrape-start-to-publish
//! time), and resident memory at the start and the end of the run (flat memory means no
//! growth per scrape).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;

use super::BenchError;
use super::process::{cpu_s_of, process_cpu_s, rss_mb};
use super::runtime::on_runtime;
use crate::cluster::spec::default_cluster;
use crate::live::bench::{vllm_page, vllm_page_at};
use crate::live::config::{Discovery, LiveConfig, LiveSource};
use crate::telemetry::Metrics;
use crate::telemetry::clock::wall_now_us;
use crate::twin::snapshot::TwinSettings;
use crate::twin::store::{MirrorStore, StoreLimits};

/// What one run measured.
#[derive(Clone, Debug, PartialEq)]
struct ScrapeBench {
    /// Pods mirrored.
    pods: usize,
    /// Scrape interval.
    interval: Duration,
    /// Wall time measured.
    wall: Duration,
    /// Successful scrapes.
    scrapes: u64,
    /// ditto's own CPU seconds (this process) per pod per wall second.
    cpu_per_pod_s: f64,
    /// The fake pods' process CPU seconds per pod per wall second (serving the pages).
    fake_cpu_per_pod_s: f64,
    /// Mean age of the mirrored gauges when sampled, ms.
    mean_gauge_age_ms: f64,
    /// Mean scrape start → publish, ms.
    mean_publish_lag_ms: f64,
    /// Resident memory after the warm-up, at each quarter of the run and at the end, MB
    /// (flat when the later steps stop growing).
    rss_mb: Vec<f64>,
    /// Size of the served page, bytes.
    page_bytes: usize,
}

impl ScrapeBench {
    /// One report line.
    fn row(&self) -> String {
        let mut out = String::new();
        let _ = write!(
            out,
            "{} pods @ {} ms for {:.1} s: {} scrapes, ditto's CPU {:.3} ms per pod per s (fake pods' own process {:.3}), gauge age {:.1} ms mean, publish lag {:.2} ms mean, RSS {} MB by quarter (page {} kB)",
            self.pods,
            self.interval.as_millis(),
            self.wall.as_secs_f64(),
            self.scrapes,
            self.cpu_per_pod_s * 1e3,
            self.fake_cpu_per_pod_s * 1e3,
            self.mean_gauge_age_ms,
            self.mean_publish_lag_ms,
            self.rss_mb
                .iter()
                .map(|mb| format!("{mb:.1}"))
                .collect::<Vec<_>>()
                .join(" -> "),
            self.page_bytes / 1024
        );
        out
    }
}

/// `ditto bench --fake-pods N`: serves N fake vLLM pods (the realistic page) on loopback,
/// prints their addresses on stdout, one a line, then serves until stdin closes, so that
/// the live case measures ditto's CPU apart from the serving.
pub fn serve_fake_pods(pods: usize) -> Result<(), BenchError> {
    on_runtime(async {
        fake_pods_until_stdin_closes(pods)
            .await
            .map_err(BenchError::Failed)
    })
}

/// The live case: 100 fake pods mirrored every 50 ms for `seconds`.
pub(super) fn live_case(out: &mut String, seconds: u64) -> Result<(), BenchError> {
    let _ = writeln!(
        out,
        "\n== live mirror: 100 fake vLLM pods on loopback, /metrics every 50 ms, {seconds} s (the fake pods in their own process: the CPU is ditto's own)"
    );
    let live = on_runtime(async {
        scrape_bench(100, Duration::from_millis(50), Duration::from_secs(seconds))
            .await
            .map_err(BenchError::Failed)
    })?;
    let _ = writeln!(out, "{}", live.row());
    Ok(())
}

/// Serves `pods` fake pods, prints their addresses and serves until stdin closes.
async fn fake_pods_until_stdin_closes(pods: usize) -> Result<(), String> {
    let (addresses, servers) = start_fake_pods(pods).await?;
    let mut out = String::new();
    for address in &addresses {
        let _ = writeln!(out, "{address}");
    }
    {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|err| err.to_string())?;
    }
    // Until the parent closes stdin (or dies).
    let _ = tokio::task::spawn_blocking(|| {
        use std::io::Read as _;
        let mut sink = Vec::new();
        std::io::stdin().read_to_end(&mut sink)
    })
    .await;
    for server in servers {
        server.abort();
    }
    Ok(())
}

/// N axum servers of the realistic page of a busy pod (a new page at every scrape) on
/// 127.0.0.1 (ephemeral ports).
async fn start_fake_pods(
    pods: usize,
) -> Result<(Vec<String>, Vec<tokio::task::JoinHandle<()>>), String> {
    let mut addresses = Vec::with_capacity(pods);
    let mut servers = Vec::with_capacity(pods);
    for _ in 0..pods {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|err| err.to_string())?;
        addresses.push(
            listener
                .local_addr()
                .map_err(|err| err.to_string())?
                .to_string(),
        );
        let scrapes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let router = Router::new().route(
            "/metrics",
            get(move || {
                let scrape = scrapes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                async move { vllm_page_at(scrape) }
            }),
        );
        servers.push(tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        }));
    }
    Ok((addresses, servers))
}

/// The fake pods' process: its addresses, its pid, and its stdin (closing it ends it).
struct FakePods {
    child: std::process::Child,
    addresses: Vec<String>,
}

impl FakePods {
    fn start(pods: usize) -> Result<Self, String> {
        use std::io::BufRead as _;
        let exe = std::env::current_exe().map_err(|err| format!("the ditto binary: {err}"))?;
        let mut child = std::process::Command::new(exe)
            .args(["bench", "--fake-pods", &pods.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|err| format!("the fake pods did not start: {err}"))?;
        let stdout = child.stdout.take().ok_or("the fake pods' stdout")?;
        let addresses: Vec<String> = std::io::BufReader::new(stdout)
            .lines()
            .take(pods)
            .collect::<Result<_, _>>()
            .map_err(|err| format!("the fake pods' addresses: {err}"))?;
        if addresses.len() != pods {
            let _ = child.kill();
            return Err(format!(
                "the fake pods printed {} addresses",
                addresses.len()
            ));
        }
        Ok(Self { child, addresses })
    }

    fn cpu_s(&self) -> f64 {
        cpu_s_of(&self.child.id().to_string())
    }
}

impl Drop for FakePods {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Mirrors `pods` fake pods (in their own process) at `interval` for `duration` (after a
/// 1 s warm-up).
async fn scrape_bench(
    pods: usize,
    interval: Duration,
    duration: Duration,
) -> Result<ScrapeBench, String> {
    let fakes = FakePods::start(pods)?;
    let addresses = fakes.addresses.clone();
    let page_bytes = vllm_page().len();
    let cluster = default_cluster();
    let template = cluster.instances[0].clone();
    let source = LiveSource {
        name: "bench".to_owned(),
        discovery: Discovery::Static(addresses),
        template,
        kv: None,
        scrape_interval: None,
        infer: None,
    };
    let mut config = LiveConfig::new(vec![source], cluster, TwinSettings::defaults());
    config.scrape_interval = interval;
    let metrics = Metrics::new().map_err(|err| err.to_string())?;
    let store = Arc::new(MirrorStore::new(StoreLimits::DEFAULT));
    let live =
        crate::live::start(config, Arc::clone(&store), &metrics).map_err(|err| err.to_string())?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let scrapes_before = metrics_scrapes(&metrics);
    let lag_before = (live_lag(&metrics), metrics_lag_count(&metrics));
    let mut rss = vec![rss_mb()];
    let cpu_start = process_cpu_s();
    let fake_cpu_start = fakes.cpu_s();
    let started = Instant::now();
    // Running sums (a sample buffer would grow the very memory measured).
    let (mut age_sum_ms, mut age_count) = (0.0, 0u64);
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if let Some(stored) = store.latest() {
            let now = wall_now_us();
            for state in &stored.snapshot.instances {
                if state.gauges_at_us > 0 {
                    age_sum_ms += now.saturating_sub(state.gauges_at_us) as f64 / 1e3;
                    age_count += 1;
                }
            }
        }
        let quarter = started.elapsed().as_secs_f64() / duration.as_secs_f64().max(1e-9);
        if rss.len() < 4 && quarter >= rss.len() as f64 / 4.0 {
            rss.push(rss_mb());
        }
    }
    let wall = started.elapsed();
    let cpu = process_cpu_s() - cpu_start;
    let fake_cpu = fakes.cpu_s() - fake_cpu_start;
    rss.push(rss_mb());
    let scrapes = metrics_scrapes(&metrics) - scrapes_before;
    let lag_sum = live_lag(&metrics) - lag_before.0;
    let lag_count = metrics_lag_count(&metrics) - lag_before.1;
    drop(live);
    drop(fakes);
    Ok(ScrapeBench {
        pods,
        interval,
        wall,
        scrapes,
        cpu_per_pod_s: cpu / pods as f64 / wall.as_secs_f64(),
        fake_cpu_per_pod_s: fake_cpu / pods as f64 / wall.as_secs_f64(),
        mean_gauge_age_ms: age_sum_ms / age_count.max(1) as f64,
        mean_publish_lag_ms: if lag_count > 0 {
            lag_sum / lag_count as f64 * 1e3
        } else {
            0.0
        },
        rss_mb: rss,
        page_bytes,
    })
}

fn family<'a>(
    families: &'a [prometheus::proto::MetricFamily],
    name: &str,
) -> Option<&'a prometheus::proto::MetricFamily> {
    families.iter().find(|f| f.name() == name)
}

fn metrics_scrapes(metrics: &Metrics) -> u64 {
    let families = metrics.registry().gather();
    family(&families, "ditto_live_scrapes_total").map_or(0, |f| {
        f.get_metric()
            .iter()
            .filter(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == "result" && l.value() == "ok")
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    })
}

fn live_lag(metrics: &Metrics) -> f64 {
    let families = metrics.registry().gather();
    family(&families, "ditto_live_publish_lag_seconds")
        .and_then(|f| {
            f.get_metric()
                .first()
                .map(|m| m.get_histogram().get_sample_sum())
        })
        .unwrap_or(0.0)
}

fn metrics_lag_count(metrics: &Metrics) -> u64 {
    let families = metrics.registry().gather();
    family(&families, "ditto_live_publish_lag_seconds")
        .and_then(|f| {
            f.get_metric()
                .first()
                .map(|m| m.get_histogram().get_sample_count())
        })
        .unwrap_or(0)
}
