#![allow(clippy::unwrap_used)]
//! The CI-sized load run (`ditto bench` has the full one): concurrent clients mixing
//! PredictRouting calls and `/metrics` scrapes while state is pushed at 20/s, against the
//! real server on loopback, for a fixed time after a warm-up. Every operation must succeed,
//! each kind must have happened, and resident memory must stay bounded across the measured
//! phase (a leak per call would grow it with the thousands of calls made).

use std::time::Duration;

use ditto::server::load::{LoadOptions, run_load};

/// Resident-memory growth allowed across the measured phase: allocator slack and caches
/// settling, far below what a leak per call adds over thousands of calls.
const RSS_GROWTH_MAX_BYTES: u64 = 96 * 1024 * 1024;

#[test]
fn concurrent_clients_pushes_and_scrapes_run_without_errors_and_memory_stays_flat() {
    let report = run_load(&LoadOptions {
        clients: 8,
        warmup: Duration::from_secs(1),
        duration: Duration::from_secs(4),
        pushes_per_second: 20,
        scrape_every: 10,
    })
    .unwrap();
    assert_eq!(report.errors, 0, "first error: {:?}", report.first_error);
    assert!(report.predictions > 0, "{report:?}");
    assert!(report.pushes > 0, "{report:?}");
    assert!(report.scrapes > 0, "{report:?}");
    let (before, after) = (
        report.rss_before_bytes.unwrap(),
        report.rss_after_bytes.unwrap(),
    );
    assert!(
        after <= before + RSS_GROWTH_MAX_BYTES,
        "RSS grew from {before} to {after} bytes"
    );
}
