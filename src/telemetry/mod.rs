//! Telemetry of the server: Prometheus metrics (one registry per server, so servers in one
//! process never collide) and the tracing subscriber of the binary.
//!
//! Knows the domain's snapshot (to export signal ages) but nothing about gRPC.

pub mod live;
pub mod metrics;

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
