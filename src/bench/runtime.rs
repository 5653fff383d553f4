//! The tokio runtime `ditto bench`'s loopback cases run on (they serve, scrape and publish
//! over real sockets): built here, at the edge, so the CLI never knows tokio.

use std::future::Future;

use super::BenchError;

/// Runs `case` to completion on a fresh multi-threaded tokio runtime with I/O and timers.
pub(super) fn on_runtime<T>(
    case: impl Future<Output = Result<T, BenchError>>,
) -> Result<T, BenchError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BenchError::failed)?;
    runtime.block_on(case)
}
