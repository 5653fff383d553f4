//! Where the live mirror runs: its own thread (`ditto-live`) with a single-threaded tokio
//! runtime, and the tick that publishes the pods' staged writes.

use std::sync::Arc;

use super::{LiveConfig, LiveError, LiveHandle, spawn_tasks};
use crate::telemetry::Metrics;
use crate::twin::store::MirrorStore;

/// Starts the live mirror on a thread of its own (`ditto-live`, a single-threaded tokio
/// runtime): static pods are synced into `store` before this returns (so the server is ready
/// at once); DNS and Kubernetes sources follow.
///
/// Why a thread of its own: a hundred pods scraped every 50 ms are thousands of small wake-ups
/// a second; on the server's multi-threaded runtime they hop between workers (a futex wake
/// and a context switch each), a quarter of the mirror's CPU (docs/performance.md). On one
/// thread they do not, and the scrapes never queue behind the questions' tasks.
pub fn start(
    config: LiveConfig,
    store: Arc<MirrorStore>,
    metrics: &Metrics,
) -> Result<LiveHandle, LiveError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LiveError::Runtime)?;
    // Every task `spawn_tasks` starts goes to this runtime, driven below on its own thread.
    let parts = {
        let _entered = runtime.enter();
        spawn_tasks(config, store, metrics)
    };
    let (coordinator, publisher, synced) = match parts {
        Ok(parts) => parts,
        Err(err) => {
            // Not a blocking drop: the caller may be inside another runtime.
            runtime.shutdown_background();
            return Err(err);
        }
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("ditto-live".to_owned())
        .spawn(move || {
            runtime.block_on(async {
                let _ = stopped.await;
            });
        })
        .map_err(LiveError::Runtime)?;
    Ok(LiveHandle {
        coordinator,
        publisher,
        stop: Some(stop),
        synced,
    })
}

/// Publishes what the pods' tasks staged in the store (scrapes, KV batches) as one new
/// generation every `interval`: questions see a write at most one interval late, and the
/// mirror makes one snapshot per tick instead of one per write.
pub(super) async fn publish_loop(store: Arc<MirrorStore>, interval: std::time::Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        store.publish_staged();
    }
}
