//! Telemetry of the server: Prometheus metrics (one registry per server, so servers in one
//! process never collide), the tracing subscriber of the binary, and OpenTelemetry trace
//! export (`otel`, off unless the OTEL_* environment asks for it).
//!
//! Knows the domain's snapshot (to export signal ages) but nothing about gRPC.

pub mod clock;
pub mod families;
pub mod live;
pub mod metrics;
pub mod otel;

pub use metrics::Metrics;

/// Installs a `tracing` subscriber writing to stderr, filtered by `filter` (an
/// `EnvFilter` directive such as `info` or `ditto=debug`). A second call, or a bad filter,
/// leaves things as they are and returns false.
pub fn init_tracing(filter: &str) -> bool {
    let Ok(filter) = tracing_subscriber::EnvFilter::try_new(filter) else {
        return false;
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init()
        .is_ok()
}

/// What [`init_logs_and_traces`] set up.
#[derive(Debug)]
pub struct TracingSetup {
    /// Whether the log filter was valid and the subscriber installed (else logging is off).
    pub logging: bool,
    /// The OTLP exporter, when the environment asked for one and it started; keep it until
    /// the server stopped (dropping it flushes the last spans).
    pub traces: Option<otel::OtelGuard>,
    /// Why trace export was asked for but could not start.
    pub traces_error: Option<otel::OtelError>,
}

/// Installs the subscriber of `ditto serve`: logs to stderr filtered by `filter` (as
/// [`init_tracing`]) and, when the OTEL_* environment asks for it, spans of `ditto` itself
/// (info and up, whatever the log filter) exported over OTLP/gRPC.
pub fn init_logs_and_traces(filter: &str) -> TracingSetup {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let parsed = tracing_subscriber::EnvFilter::try_new(filter);
    let filter_ok = parsed.is_ok();
    let log_filter = parsed.unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .with_filter(log_filter);
    let (layer, traces, traces_error) = if otel::requested_by_env() {
        match otel::start() {
            Ok((guard, tracer)) => {
                let ours = tracing_subscriber::filter::Targets::new()
                    .with_target("ditto", tracing::Level::INFO);
                let layer = tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(ours);
                (Some(layer), Some(guard), None)
            }
            Err(err) => (None, None, Some(err)),
        }
    } else {
        (None, None, None)
    };
    let installed = tracing_subscriber::registry()
        .with(logs)
        .with(layer)
        .try_init()
        .is_ok();
    TracingSetup {
        logging: filter_ok && installed,
        traces,
        traces_error,
    }
}
