//! A loopback load run against the real server, for `ditto bench` and the CI load test:
//! many concurrent clients mixing PredictRouting calls and `/metrics` scrapes while an
//! agent pushes instance state at a fixed rate, for a fixed time after a warm-up.
//!
//! Reports calls per second, prediction latency quantiles, every error (none expected),
//! and the process's resident memory before and after the measured phase (flat when
//! nothing leaks). The state pushed is the production pattern: observations stamped with
//! the wall clock, questions without `now_us` (the server's clock).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex;

use super::convert::config::cluster_to_proto;
use super::deadline::wall_now_us;
use super::loadgen::LoadgenError;
use super::proto;
use super::proto::twin_client::TwinClient;
use super::run::{ServerOptions, start};
use crate::cluster::spec;
use crate::twin::snapshot::TwinSettings;

/// What a load run does.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Concurrent clients asking questions and scraping.
    pub clients: usize,
    /// Untimed warm-up before the memory baseline.
    pub warmup: Duration,
    /// Measured phase.
    pub duration: Duration,
    /// State pushes per second (one instance each, in turn).
    pub pushes_per_second: u32,
    /// Every this many operations of a client is a `/metrics` scrape (0: none).
    pub scrape_every: u32,
}

/// What a load run measured (the measured phase only).
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    /// PredictRouting calls answered.
    pub predictions: u64,
    /// State pushes accepted.
    pub pushes: u64,
    /// `/metrics` scrapes answered 200.
    pub scrapes: u64,
    /// Failed operations of any kind.
    pub errors: u64,
    /// The first failure, for the report.
    pub first_error: Option<String>,
    /// Length of the measured phase.
    pub elapsed: Duration,
    /// Prediction latencies, sorted.
    pub latencies: Vec<Duration>,
    /// Resident memory after the warm-up, bytes (None off Linux).
    pub rss_before_bytes: Option<u64>,
    /// Resident memory after the measured phase, bytes.
    pub rss_after_bytes: Option<u64>,
}

impl LoadReport {
    /// Operations (predictions, pushes, scrapes) per second.
    pub fn ops_per_second(&self) -> f64 {
        (self.predictions + self.pushes + self.scrapes) as f64
            / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile of prediction latency (zero without predictions).
    pub fn latency(&self, q: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let index = ((self.latencies.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        self.latencies[index]
    }
}

/// The resident memory of this process now, bytes (Linux `VmRSS`).
pub fn current_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Counts of one phase, shared by its tasks.
#[derive(Default)]
struct Tally {
    predictions: AtomicU64,
    pushes: AtomicU64,
    scrapes: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    latencies: Mutex<Vec<Duration>>,
}

impl Tally {
    async fn fail(&self, what: &str, err: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().await;
        if first.is_none() {
            *first = Some(format!("{what}: {err}"));
        }
    }
}

/// Runs the load against a fresh in-process server mirroring the default cluster.
pub fn run_load(options: &LoadOptions) -> Result<LoadReport, LoadgenError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let local = "127.0.0.1:0"
            .parse()
            .map_err(|err| LoadgenError::Rpc(format!("{err}")))?;
        let mut server_options = ServerOptions::new(local, local);
        server_options.drain = Duration::from_secs(5);
        let server = start(server_options).await?;
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr()))
                .map_err(|err| LoadgenError::Rpc(err.to_string()))?
                .connect()
                .await
                .map_err(|err| LoadgenError::Rpc(err.to_string()))?;
        let twin = TwinClient::new(channel);
        let cluster = spec::default_cluster();
        let ids: Vec<String> = cluster.instances.iter().map(|i| i.id.clone()).collect();
        twin.clone()
            .sync_cluster_config(cluster_to_proto(&cluster, &TwinSettings::defaults(), &[]))
            .await
            .map_err(|err| LoadgenError::Rpc(err.to_string()))?;
        let pushes = ids.iter().map(|id| busy_state(id, wall_now_us()));
        twin.clone()
            .push_instance_state(tokio_stream::iter(pushes.collect::<Vec<_>>()))
            .await
            .map_err(|err| LoadgenError::Rpc(err.to_string()))?;
        let http = server.http_addr();
        phase(&twin, http, &ids, options, options.warmup).await;
        let rss_before_bytes = current_rss_bytes();
        let started = Instant::now();
        let tally = phase(&twin, http, &ids, options, options.duration).await;
        let elapsed = started.elapsed();
        let rss_after_bytes = current_rss_bytes();
        server
            .shutdown()
            .await
            .map_err(|err| LoadgenError::Rpc(err.to_string()))?;
        let mut latencies = std::mem::take(&mut *tally.latencies.lock().await);
        latencies.sort();
        let first_error = tally.first_error.lock().await.clone();
        Ok(LoadReport {
            predictions: tally.predictions.load(Ordering::Relaxed),
            pushes: tally.pushes.load(Ordering::Relaxed),
            scrapes: tally.scrapes.load(Ordering::Relaxed),
            errors: tally.errors.load(Ordering::Relaxed),
            first_error,
            elapsed,
            latencies,
            rss_before_bytes,
            rss_after_bytes,
        })
    })
}

/// One phase of `length`: the clients and the pusher until the end.
async fn phase(
    twin: &TwinClient<tonic::transport::Channel>,
    http: std::net::SocketAddr,
    ids: &[String],
    options: &LoadOptions,
    length: Duration,
) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let end = tokio::time::Instant::now() + length;
    let mut tasks = Vec::new();
    for client in 0..options.clients {
        let (mut twin, tally) = (twin.clone(), Arc::clone(&tally));
        let scrape_every = options.scrape_every;
        tasks.push(tokio::spawn(async move {
            let mut operation: u32 = client as u32;
            while tokio::time::Instant::now() < end {
                operation = operation.wrapping_add(1);
                if scrape_every > 0 && operation.is_multiple_of(scrape_every) {
                    match scrape(http).await {
                        Ok(()) => {
                            tally.scrapes.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(err) => tally.fail("scrape", err).await,
                    }
                    continue;
                }
                let mut request = tonic::Request::new(question(operation));
                request.set_timeout(Duration::from_secs(30));
                let started = Instant::now();
                match twin.predict_routing(request).await {
                    Ok(_) => {
                        tally.predictions.fetch_add(1, Ordering::Relaxed);
                        tally.latencies.lock().await.push(started.elapsed());
                    }
                    Err(status) => tally.fail("PredictRouting", status).await,
                }
            }
        }));
    }
    if options.pushes_per_second > 0 {
        let (mut twin, tally, ids) = (twin.clone(), Arc::clone(&tally), ids.to_vec());
        let period = Duration::from_secs_f64(1.0 / f64::from(options.pushes_per_second));
        tasks.push(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(period);
            let mut turn = 0;
            while tokio::time::Instant::now() < end {
                ticker.tick().await;
                let update = busy_state(&ids[turn % ids.len()], wall_now_us());
                turn += 1;
                match twin.push_instance_state(tokio_stream::iter([update])).await {
                    Ok(_) => {
                        tally.pushes.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(status) => tally.fail("PushInstanceState", status).await,
                }
            }
        }));
    }
    for task in tasks {
        if let Err(err) = task.await {
            tally.fail("client task", err).await;
        }
    }
    tally
}

/// One `/metrics` scrape over a fresh HTTP/1.1 connection; Ok on a 200 with a body.
async fn scrape(http: std::net::SocketAddr) -> Result<(), String> {
    let mut stream = tokio::net::TcpStream::connect(http)
        .await
        .map_err(|err| err.to_string())?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: ditto\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|err| err.to_string())?;
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .await
        .map_err(|err| err.to_string())?;
    if reply.starts_with(b"HTTP/1.1 200") && reply.len() > 200 {
        Ok(())
    } else {
        let head = String::from_utf8_lossy(&reply[..reply.len().min(64)]).into_owned();
        Err(format!("unexpected reply {head:?}"))
    }
}

/// A routing question over every instance, its prompt varying with `operation`.
fn question(operation: u32) -> proto::PredictRoutingRequest {
    proto::PredictRoutingRequest {
        request: Some(proto::CandidateRequest {
            prompt_tokens: 256 + i64::from(operation % 8) * 128,
            expected_output: Some(proto::candidate_request::ExpectedOutput::OutputTokens(64)),
            ..proto::CandidateRequest::default()
        }),
        options: Some(proto::PredictOptions {
            replications: 1,
            ..proto::PredictOptions::default()
        }),
        request_id: format!("load-{operation}"),
        ..proto::PredictRoutingRequest::default()
    }
}

/// An instance decoding 8 requests with 4 waiting, observed at `now_us`.
fn busy_state(id: &str, now_us: u64) -> proto::InstanceStateUpdate {
    let now = i64::try_from(now_us).unwrap_or(i64::MAX);
    let running = (0..8)
        .map(|i| proto::RequestState {
            request_id: format!("r{i}"),
            arrival_us: now - 2_000_000,
            prompt_tokens: 1_000,
            computed_tokens: 1_000 + i,
            output_tokens: 1 + i,
            max_tokens: 400,
            ..proto::RequestState::default()
        })
        .collect();
    let waiting = (0..4)
        .map(|i| proto::RequestState {
            request_id: format!("w{i}"),
            arrival_us: now - 500_000,
            prompt_tokens: 2_000,
            max_tokens: 400,
            ..proto::RequestState::default()
        })
        .collect();
    proto::InstanceStateUpdate {
        instance_id: id.to_owned(),
        observed_at_us: now,
        requests: Some(proto::RequestLists {
            waiting,
            running,
            step_end_us: 0,
        }),
        ..proto::InstanceStateUpdate::default()
    }
}
