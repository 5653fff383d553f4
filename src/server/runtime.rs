//! Async work run to completion from synchronous callers (`ditto bench`'s loopback cases,
//! which serve or scrape): the tokio runtime is built here, at the edge, so the CLI never
//! knows tokio (ARCHITECTURE: only `server`, `live` and `telemetry` do).

use std::future::Future;

/// Runs `future` to completion on a fresh multi-threaded tokio runtime with I/O and timers;
/// an error only when the runtime cannot be built.
pub fn block_on<F: Future>(future: F) -> Result<F::Output, std::io::Error> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    Ok(runtime.block_on(future))
}
