//! The live mirror's bench case (`ditto bench`): N fake pods on loopback serving a realistic
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

use super::config::{Discovery, LiveConfig, LiveSource};
use crate::cluster::spec::default_cluster;
use crate::telemetry::Metrics;
use crate::telemetry::clock::wall_now_us;
use crate::twin::snapshot::TwinSettings;
use crate::twin::store::{MirrorStore, StoreLimits};

/// What one run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct ScrapeBench {
    /// Pods mirrored.
    pub pods: usize,
    /// Scrape interval.
    pub interval: Duration,
    /// Wall time measured.
    pub wall: Duration,
    /// Successful scrapes.
    pub scrapes: u64,
    /// ditto's own CPU seconds (this process) per pod per wall second.
    pub cpu_per_pod_s: f64,
    /// The fake pods' process CPU seconds per pod per wall second (serving the pages).
    pub fake_cpu_per_pod_s: f64,
    /// Mean age of the mirrored gauges when sampled, ms.
    pub mean_gauge_age_ms: f64,
    /// Mean scrape start → publish, ms.
    pub mean_publish_lag_ms: f64,
    /// Resident memory after the warm-up, at each quarter of the run and at the end, MB
    /// (flat when the later steps stop growing).
    pub rss_mb: Vec<f64>,
    /// Size of the served page, bytes.
    pub page_bytes: usize,
}

impl ScrapeBench {
    /// One report line.
    pub fn row(&self) -> String {
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

/// A vLLM v1 `/metrics` page of realistic size (the families of `vllm/v1/metrics/loggers.py`
/// with their label sets and 1-2-5 / latency buckets).
pub fn vllm_page() -> String {
    vllm_page_at(0)
}

/// [`vllm_page`] as a busy pod serves it at its `scrape`-th scrape: gauges move and every
/// counter and histogram has grown since the scrape before (a busy vLLM pod's page is never
/// the same twice at 50 ms), so nothing can be skipped as unchanged.
pub fn vllm_page_at(scrape: u64) -> String {
    let grown = scrape as f64;
    let labels = r#"engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct""#;
    let mut page = String::new();
    for (name, value) in [
        ("vllm:num_requests_running", 12.0 + (scrape % 7) as f64),
        ("vllm:num_requests_waiting", (scrape % 4) as f64),
        (
            "vllm:kv_cache_usage_perc",
            0.42 + (scrape % 10) as f64 / 100.0,
        ),
    ] {
        let _ = writeln!(
            page,
            "# HELP {name} gauge\n# TYPE {name} gauge\n{name}{{{labels}}} {value}"
        );
    }
    let _ = writeln!(
        page,
        "# HELP vllm:cache_config_info info\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"26312\",engine=\"0\"}} 1.0"
    );
    for name in [
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
    ] {
        let _ = writeln!(
            page,
            "# HELP {name} counter\n# TYPE {name} counter\n{name}_total{{{labels}}} {:?}",
            123_456.0 + 97.0 * grown
        );
    }
    let tokens = [
        1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000,
    ];
    let seconds = [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0,
    ];
    let histogram = |page: &mut String, name: &str, bounds: &[f64]| {
        let _ = writeln!(page, "# HELP {name} histogram\n# TYPE {name} histogram");
        for (i, le) in bounds.iter().enumerate() {
            let _ = writeln!(
                page,
                "{name}_bucket{{{labels},le=\"{le:?}\"}} {:?}",
                ((i + 1) * 10) as f64 + grown * (i + 1) as f64
            );
        }
        let total = ((bounds.len() + 1) * 10) as f64 + grown * (bounds.len() + 1) as f64;
        let _ = writeln!(page, "{name}_bucket{{{labels},le=\"+Inf\"}} {total:?}");
        let _ = writeln!(page, "{name}_count{{{labels}}} {total:?}");
        let _ = writeln!(page, "{name}_sum{{{labels}}} {:?}", 98_765.0 + 3.5 * grown);
    };
    let token_bounds: Vec<f64> = tokens.iter().map(|&t| f64::from(t)).collect();
    for name in [
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_params_max_tokens",
    ] {
        histogram(&mut page, name, &token_bounds);
    }
    for name in [
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ] {
        histogram(&mut page, name, &seconds);
    }
    page
}

pub(super) fn process_cpu_s() -> f64 {
    cpu_s_of("self")
}

/// User + system CPU seconds of process `pid` ("self" for this one), from /proc.
fn cpu_s_of(pid: &str) -> f64 {
    // /proc/PID/stat fields 14 and 15: user and system time in clock ticks (100 Hz on Linux).
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

pub(super) fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// `ditto bench --fake-pods N`: serves N fake vLLM pods (the realistic page) on loopback,
/// prints their addresses on stdout, one a line, then serves until stdin closes, so that
/// the live case measures ditto's CPU apart from the serving.
pub async fn serve_fake_pods(pods: usize) -> Result<(), String> {
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
pub async fn scrape_bench(
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
    let live = super::start(config, Arc::clone(&store), &metrics).map_err(|err| err.to_string())?;
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
