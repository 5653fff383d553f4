#![allow(clippy::unwrap_used)]
//! The live mirror runs on a thread of its own (`ditto-live`, a single-threaded runtime):
//! it scrapes a pod on loopback while the caller's runtime is busy elsewhere, and dropping
//! its handle ends the thread. The pod is a plain HTTP server of vLLM's page (the format is
//! tested against vLLM's own client library in tests/python).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto::cluster::spec::default_cluster;
use ditto::live::config::{Discovery, LiveConfig, LiveSource};
use ditto::telemetry::metrics::Metrics;
use ditto::twin::snapshot::TwinSettings;
use ditto::twin::store::{MirrorStore, StoreLimits};

/// Threads of this process named `name` (Linux: /proc/self/task/*/comm).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == name)
        })
        .count()
}

#[tokio::test(flavor = "current_thread")]
async fn the_mirror_scrapes_on_its_own_thread_and_stops_with_its_handle() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let page = ditto::live::bench::vllm_page_at(3);
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let page = page.clone();
            async move { page }
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    let cluster = default_cluster();
    let source = LiveSource {
        name: "pool".to_owned(),
        discovery: Discovery::Static(vec![address.clone()]),
        template: cluster.instances[0].clone(),
        kv: None,
        scrape_interval: None,
        infer: None,
    };
    let config = LiveConfig::new(vec![source], cluster, TwinSettings::defaults());
    let store = Arc::new(MirrorStore::new(StoreLimits::DEFAULT));
    let metrics = Metrics::new().unwrap();
    let before = threads_named("ditto-live");
    let live = ditto::live::start(config, Arc::clone(&store), &metrics).unwrap();
    // The new thread names itself once it runs.
    until(
        || threads_named("ditto-live") == before + 1,
        "no ditto-live thread",
    )
    .await;

    // This test's own runtime has one thread, which only the pod's server and this loop use:
    // the scrapes that fill the mirror run on the mirror's thread.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let gauges = store
            .latest()
            .and_then(|stored| stored.snapshot.instances[0].gauges);
        if let Some(gauges) = gauges {
            // vllm_page_at(3): 12 + 3 running, 3 waiting.
            assert_eq!((gauges.running, gauges.waiting), (15, 3));
            break;
        }
        assert!(Instant::now() < deadline, "no scrape reached the mirror");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    drop(live);
    until(
        || threads_named("ditto-live") == before,
        "the mirror's thread outlived its handle",
    )
    .await;
    server.abort();
}

/// Waits up to 10 s for `done`.
async fn until(done: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
