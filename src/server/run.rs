//! Startup and shutdown of the server: the gRPC listener (Twin, KEDA's external scaler,
//! health, reflection v1 and v1alpha), the HTTP listener (the latency predictor API, metrics, liveness, readiness) and,
//! with `--metrics-addr`, a second HTTP listener with only metrics and the probes, under its
//! own connection cap.
//!
//! Order: the initial config is validated and synced before anything binds (a bad config
//! fails fast); health reports SERVING as soon as a config is in. On shutdown new Twin calls
//! are refused with UNAVAILABLE and health turns NOT_SERVING while both listeners stay up
//! (probes see the drain); calls in flight get at most `drain` to finish (by default the
//! longest call plus a margin, so no call the server accepted is cut); then the listeners
//! close and remaining connections are dropped after a short grace.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Server;

use super::FILE_DESCRIPTOR_SET;
use super::auth::{AuthGate, AuthPolicy};
use super::error::ServeError;
use super::forecast_loop::{self, ForecastLoopOptions};
use super::gate::Gated;
use super::http;
use super::keda::KedaService;
use super::keda::load::LoadTracker;
use super::keda::proto::external_scaler_server::ExternalScalerServer;
use super::lifecycle::{DrainGate, Lifecycle};
use super::listeners::{bind_all, serve_main, serve_probes, stopped};
use super::observe::ObserveGrpc;
use super::proto::twin_server::TwinServer;
use super::service::{ServerState, ServiceLimits, TwinService};
use super::tls::{TlsAcceptors, TlsFiles};
use crate::cluster::config::ClusterConfig;
use crate::telemetry::Metrics;
use crate::twin::limits::Limits;
use crate::twin::snapshot::TwinSettings;
use crate::twin::store::{MirrorStore, StoreLimits};

/// Default gRPC address of `ditto serve`.
pub const DEFAULT_GRPC_ADDR: &str = "0.0.0.0:9010";
/// Default HTTP address of `ditto serve`.
pub const DEFAULT_HTTP_ADDR: &str = "0.0.0.0:9011";
/// Default longest call (a prediction or forecast without a shorter grpc-timeout).
pub const DEFAULT_MAX_CALL: Duration = Duration::from_secs(30);
/// Default time between load samples (`--load-forecast-step-s`).
pub const DEFAULT_LOAD_FORECAST_STEP: Duration = Duration::from_secs(10);
/// Default bound on the calls waiting for a simulation slot (beyond: RESOURCE_EXHAUSTED).
pub const DEFAULT_MAX_QUEUED_SIMULATIONS: usize = 64;
/// What the default drain adds to the longest call: encoding and sending the last reply.
pub const DRAIN_MARGIN: Duration = Duration::from_secs(5);
/// Longest the listeners wait for connections to close once no call is in flight (idle
/// keep-alives close at once; a health `Watch` stream would wait forever).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// A config to sync before the server starts.
#[derive(Clone, Debug, PartialEq)]
pub struct InitialConfig {
    /// The cluster.
    pub cluster: ClusterConfig,
    /// Twin settings.
    pub settings: TwinSettings,
}

/// Everything the server needs to start.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// gRPC listen address (port 0: any free port).
    pub grpc_addr: SocketAddr,
    /// HTTP listen address (port 0: any free port).
    pub http_addr: SocketAddr,
    /// Work bounds of the service.
    pub service: ServiceLimits,
    /// Bounds of the mirror.
    pub store: StoreLimits,
    /// Largest gRPC request message accepted, bytes (replies are the server's own and are
    /// bounded by the other limits; clients set their own receive limit).
    pub max_message_bytes: usize,
    /// Longest the shutdown waits for in-flight calls.
    pub drain: Duration,
    /// Config synced at startup (then the server is ready at once).
    pub initial_config: Option<InitialConfig>,
    /// The live mirror (pod sources to pull from), if any; it owns the instance set.
    pub live: Option<crate::live::LiveConfig>,
    /// The forecast loop exporting desired replicas (None: off).
    pub forecast_loop: Option<ForecastLoopOptions>,
    /// Time between the load sampler's samples (the KEDA scaler's load forecast).
    pub load_forecast_step: Duration,
    /// The latency predictor HTTP API (`server::predictor`).
    pub predictor: super::predictor::PredictorOptions,
    /// Bearer-token authentication (default: off).
    pub auth: AuthPolicy,
    /// TLS on both listeners (default: off, plain TCP).
    pub tls: Option<TlsFiles>,
    /// Bounds of the HTTP listener (connections, header and body reads).
    pub http: super::http_conn::HttpLimits,
    /// The metrics and probes listener (`/metrics`, `/healthz`, `/readyz` only), if any
    /// (port 0: any free port).
    pub metrics_addr: Option<SocketAddr>,
    /// Most connections open at once on the metrics listener.
    pub metrics_max_connections: usize,
    /// Bounds of the plaintext gRPC listener (connections, silence).
    pub grpc: super::grpc_conn::GrpcLimits,
}

/// Default cap on the metrics listener's connections (the kubelet and a few scrapers).
pub const DEFAULT_METRICS_MAX_CONNECTIONS: usize = 64;

impl ServerOptions {
    /// Defaults on the given addresses, with no initial config.
    pub fn new(grpc_addr: SocketAddr, http_addr: SocketAddr) -> Self {
        Self {
            grpc_addr,
            http_addr,
            service: ServiceLimits {
                twin: Limits::DEFAULT,
                max_call: DEFAULT_MAX_CALL,
                max_concurrent_simulations: std::thread::available_parallelism()
                    .map_or(2, |n| n.get()),
                max_queued_simulations: DEFAULT_MAX_QUEUED_SIMULATIONS,
                stream_in_flight: 8,
            },
            store: StoreLimits::DEFAULT,
            max_message_bytes: 16 * 1024 * 1024,
            drain: DEFAULT_MAX_CALL + DRAIN_MARGIN,
            initial_config: None,
            live: None,
            forecast_loop: None,
            load_forecast_step: DEFAULT_LOAD_FORECAST_STEP,
            predictor: super::predictor::PredictorOptions::default(),
            auth: AuthPolicy::default(),
            tls: None,
            http: super::http_conn::HttpLimits::DEFAULT,
            metrics_addr: None,
            metrics_max_connections: DEFAULT_METRICS_MAX_CONNECTIONS,
            grpc: super::grpc_conn::GrpcLimits::DEFAULT,
        }
    }
}

/// A started server. Dropping it without [`RunningServer::shutdown`] leaves the listeners
/// running until the runtime stops.
#[derive(Debug)]
pub struct RunningServer {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    shared: Arc<ServerState>,
    stop: watch::Sender<bool>,
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    http: JoinHandle<std::io::Result<()>>,
    metrics_addr: Option<SocketAddr>,
    metrics: Option<JoinHandle<std::io::Result<()>>>,
    drain: Duration,
    /// The live mirror's tasks (stopped when the server is dropped).
    _live: Option<crate::live::LiveHandle>,
    lifecycle: Arc<Lifecycle>,
    background: Vec<JoinHandle<()>>,
}

/// Syncs the initial config, binds both listeners and starts serving.
pub async fn start(options: ServerOptions) -> Result<RunningServer, ServeError> {
    let tls = options.tls.as_ref().map(TlsAcceptors::load).transpose()?;
    let metrics = Arc::new(Metrics::new()?);
    let in_flight = Lifecycle::in_flight_gauge()?;
    metrics.register(Box::new(in_flight.clone()))?;
    let rejections = auth_rejections(&metrics)?;
    let lifecycle = Arc::new(Lifecycle::new(in_flight));
    let store = mirror_store(options.store, options.initial_config)?;
    let (health, health_service) = tonic_health::server::health_reporter();
    let (load, background) = spawn_background(
        options.forecast_loop,
        (options.load_forecast_step, options.store.arrivals_window_us),
        &store,
        &options.service,
        &metrics,
        &lifecycle,
    )?;
    let shared = Arc::new(ServerState::new(store, metrics, health, options.service));
    shared
        .set_health(tonic_health::ServingStatus::NotServing)
        .await;
    let live = options
        .live
        .map(|config| start_live(config, &shared))
        .transpose()?;
    shared.report_serving().await;
    let predictor = Arc::new(super::predictor::Predictor::new(
        Arc::clone(&shared),
        super::predictor::PredictorOptions {
            body: options.http.body,
            ..options.predictor.clone()
        },
    )?);
    let auth_mode = auth_mode(&options.auth);
    let auth = Arc::new(options.auth);
    let gates = Gates::new(&auth, &rejections, &lifecycle);
    let routes = grpc_routes(
        &shared,
        &predictor,
        load,
        &gates,
        health_service,
        options.max_message_bytes,
    )?;
    let (listeners, metrics_listener) =
        bind_all(options.grpc_addr, options.http_addr, options.metrics_addr).await?;
    let (grpc_addr, http_addr) = (listeners.grpc_addr, listeners.http_addr);
    let (stop, stop_rx) = watch::channel(false);
    let connections = super::http_conn::ConnectionMetrics::register(&shared.metrics)?;
    let probes = http::observed(
        http::probe_router(
            Arc::clone(&shared),
            Arc::clone(&predictor),
            Arc::clone(&auth),
            rejections.clone(),
        ),
        &shared,
    );
    let router = http::router(Arc::clone(&shared), predictor, auth, rejections);
    let (metrics_addr, metrics) = match metrics_listener {
        None => (None, None),
        Some((addr, listener)) => serve_probes(
            addr,
            listener,
            probes,
            (options.http, options.metrics_max_connections),
            &shared,
            tls.as_ref(),
            stopped(stop_rx.clone()),
        )
        .map(|(bound, task)| (Some(bound), Some(task)))?,
    };
    let (grpc, http) = serve_main(
        listeners,
        routes,
        router,
        (options.grpc, options.http),
        (&shared, connections),
        tls.as_ref(),
        &stop_rx,
    )?;
    let transport = transport(options.tls.as_ref(), tls.is_some());
    let metrics_listen = metrics_addr.map_or_else(|| "off".to_owned(), |addr| addr.to_string());
    tracing::info!(%grpc_addr, %http_addr, metrics_addr = %metrics_listen, auth = auth_mode, transport, "ditto serving");
    Ok(RunningServer {
        grpc_addr,
        http_addr,
        shared,
        stop,
        grpc,
        http,
        metrics_addr,
        metrics,
        drain: options.drain,
        _live: live,
        lifecycle,
        background,
    })
}

/// What every exposed gRPC service sits behind: the bearer-token gate (counting its
/// rejections) and the drain gate.
struct Gates {
    auth: Arc<AuthPolicy>,
    rejections: prometheus::IntCounterVec,
    lifecycle: Arc<Lifecycle>,
}

impl Gates {
    fn new(
        auth: &Arc<AuthPolicy>,
        rejections: &prometheus::IntCounterVec,
        lifecycle: &Arc<Lifecycle>,
    ) -> Self {
        Self {
            auth: Arc::clone(auth),
            rejections: rejections.clone(),
            lifecycle: Arc::clone(lifecycle),
        }
    }
}

/// The mirror store, with the initial config synced when there is one (a bad config fails
/// before anything binds).
fn mirror_store(
    limits: StoreLimits,
    initial: Option<InitialConfig>,
) -> Result<Arc<MirrorStore>, ServeError> {
    let store = Arc::new(MirrorStore::new(limits));
    if let Some(initial) = initial {
        store
            .sync_config(initial.cluster, initial.settings, Vec::new())
            .map_err(ServeError::Config)?;
    }
    Ok(store)
}

/// The gRPC listener's services: health, reflection (v1 and v1alpha), and the Twin and
/// KEDA services, each behind the gates and observed (`server::observe`).
fn grpc_routes(
    shared: &Arc<ServerState>,
    predictor: &Arc<super::predictor::Predictor>,
    load: Arc<LoadTracker>,
    gates: &Gates,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    max_message_bytes: usize,
) -> Result<tonic::transport::server::Router, ServeError> {
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let twin = TwinServer::new(TwinService::new(Arc::clone(shared), Arc::clone(predictor)))
        .max_decoding_message_size(max_message_bytes);
    let auth = AuthGate::new(Arc::clone(&gates.auth), gates.rejections.clone());
    let drain = DrainGate::new(Arc::clone(&gates.lifecycle));
    let observe = ObserveGrpc::new(Arc::clone(&shared.metrics));
    let twin = Gated::new(twin, auth.clone());
    let twin = Gated::new(twin, drain.clone());
    let twin = Gated::new(twin, observe.clone());
    let keda = ExternalScalerServer::new(KedaService::new(
        Arc::clone(shared),
        load,
        gates.lifecycle.draining(),
    )?)
    .max_decoding_message_size(max_message_bytes);
    let keda = Gated::new(Gated::new(Gated::new(keda, auth), drain), observe);
    Ok(Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(twin)
        .add_service(keda))
}

/// `ditto_auth_rejections_total`, registered.
fn auth_rejections(metrics: &Metrics) -> Result<prometheus::IntCounterVec, ServeError> {
    let rejections = prometheus::IntCounterVec::new(
        prometheus::Opts::new(
            "ditto_auth_rejections_total",
            "Calls refused for a missing or wrong bearer token, by gRPC method or HTTP path.",
        ),
        &["method"],
    )?;
    metrics.register(Box::new(rejections.clone()))?;
    Ok(rejections)
}

/// The listeners' transport, for the start-up line.
fn transport(files: Option<&TlsFiles>, loaded: bool) -> &'static str {
    match files {
        Some(files) if loaded && files.client_ca.is_some() => "TLS, client certificates on gRPC",
        Some(_) if loaded => "TLS",
        _ => "plain",
    }
}

/// How the bearer token applies, for the start-up line.
fn auth_mode(auth: &AuthPolicy) -> &'static str {
    match (&auth.token, auth.reads) {
        (None, _) => "off",
        (Some(_), false) => "bearer token on writes",
        (Some(_), true) => "bearer token on writes and reads",
    }
}

/// The background loops: the optional forecast loop and the load sampler (KEDA's and the
/// load forecast's), each stopping when the server drains. Returns the load tracker and
/// their tasks.
fn spawn_background(
    forecast: Option<ForecastLoopOptions>,
    (load_step, arrivals_window_us): (Duration, u64),
    store: &Arc<MirrorStore>,
    service: &ServiceLimits,
    metrics: &Arc<Metrics>,
    lifecycle: &Lifecycle,
) -> Result<(Arc<LoadTracker>, Vec<JoinHandle<()>>), ServeError> {
    let mut background = Vec::new();
    if let Some(forecast) = forecast {
        background.push(forecast_loop::spawn(
            forecast,
            Arc::clone(store),
            service.twin.clone(),
            service.max_call,
            metrics,
            lifecycle.draining(),
        )?);
    }
    let window = Duration::from_micros(arrivals_window_us);
    let load = Arc::new(LoadTracker::new(load_step, window, metrics)?);
    background.push(load.spawn(Arc::clone(store), Arc::clone(metrics), lifecycle.draining()));
    Ok((load, background))
}

/// Starts the live mirror and reports SERVING after each instance set it syncs.
fn start_live(
    config: crate::live::LiveConfig,
    shared: &Arc<ServerState>,
) -> Result<crate::live::LiveHandle, ServeError> {
    let live =
        crate::live::start(config, Arc::clone(&shared.store), &shared.metrics).map_err(|err| {
            match err {
                crate::live::LiveError::Config(err) => ServeError::Config(err),
                crate::live::LiveError::Metrics(err) => ServeError::Metrics(err),
                crate::live::LiveError::Runtime(err) => ServeError::Runtime(err),
            }
        })?;
    let mut synced = live.synced.clone();
    let watcher = Arc::clone(shared);
    tokio::spawn(async move {
        while synced.changed().await.is_ok() {
            watcher.report_serving().await;
        }
    });
    Ok(live)
}

impl RunningServer {
    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The bound metrics listener's address, if `--metrics-addr` is set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The mirror.
    pub fn store(&self) -> &Arc<MirrorStore> {
        &self.shared.store
    }

    /// The drain state: calls in flight, and the signal background loops stop on.
    pub fn lifecycle(&self) -> &Arc<Lifecycle> {
        &self.lifecycle
    }

    /// Refuse new Twin calls, NOT_SERVING, let in-flight calls finish for at most the drain
    /// time, then close the listeners.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        let deadline = tokio::time::Instant::now() + self.drain;
        self.lifecycle.begin_drain();
        self.shared.begin_shutdown().await;
        tracing::info!(
            in_flight = self.lifecycle.in_flight(),
            drain_ms = u64::try_from(self.drain.as_millis()).unwrap_or(u64::MAX),
            "shutting down: NOT_SERVING, refusing new calls, draining"
        );
        if tokio::time::timeout_at(deadline, self.lifecycle.idle())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = self.lifecycle.in_flight(),
                "drain time over: cutting the calls still in flight"
            );
        }
        // Background loops stopped on the drain signal; a panicked one has nothing to wait for.
        for task in self.background {
            let _ = task.await;
        }
        // Send fails only if both servers already stopped, which is fine.
        let _ = self.stop.send(true);
        let grpc_abort = self.grpc.abort_handle();
        let http_abort = self.http.abort_handle();
        let metrics_abort = self.metrics.as_ref().map(JoinHandle::abort_handle);
        let grace = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(CLOSE_GRACE);
        let drained = tokio::time::timeout(grace, async {
            let grpc = self.grpc.await;
            let http = self.http.await;
            let metrics = match self.metrics {
                Some(task) => Some(task.await),
                None => None,
            };
            (grpc, http, metrics)
        })
        .await;
        match drained {
            Ok((grpc, http, metrics)) => {
                if let Some(Ok(result)) = metrics {
                    result.map_err(ServeError::Http)?;
                }
                if let Ok(result) = grpc {
                    result?;
                }
                if let Ok(result) = http {
                    result.map_err(ServeError::Http)?;
                }
                Ok(())
            }
            Err(_) => {
                tracing::debug!("dropping the connections still open");
                grpc_abort.abort();
                http_abort.abort();
                if let Some(abort) = metrics_abort {
                    abort.abort();
                }
                Ok(())
            }
        }
    }
}

async fn termination() -> Result<(), ServeError> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ServeError::Signal)?;
    tokio::select! {
        _ = terminate.recv() => Ok(()),
        result = tokio::signal::ctrl_c() => result.map_err(ServeError::Signal),
    }
}

/// Runs the server on its own runtime until SIGTERM or SIGINT, then shuts it down
/// gracefully. `on_ready` gets the bound gRPC, HTTP and metrics addresses once all listen.
pub fn serve_until_signal(
    options: ServerOptions,
    on_ready: impl FnOnce(SocketAddr, SocketAddr, Option<SocketAddr>),
) -> Result<(), ServeError> {
    let drain = options.drain;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let mut signalled_at = None;
    let result = runtime.block_on(async {
        // Install the handlers before reporting ready, so an early signal is not lost.
        let signal = tokio::spawn(termination());
        let server = start(options).await?;
        on_ready(
            server.grpc_addr(),
            server.http_addr(),
            server.metrics_addr(),
        );
        let signalled = signal.await;
        signalled_at = Some(std::time::Instant::now());
        let shutdown = server.shutdown().await;
        match signalled {
            Ok(result) => result?,
            Err(_) => {
                return Err(ServeError::Signal(std::io::Error::other(
                    "signal task failed",
                )));
            }
        }
        shutdown
    });
    // Blocking work still running is waited for only up to the drain's end, then abandoned.
    let left = signalled_at.map_or(Duration::ZERO, |at| drain.saturating_sub(at.elapsed()));
    runtime.shutdown_timeout(left);
    result
}
