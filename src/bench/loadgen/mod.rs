//! The cases that measure the real servers on loopback: the what-if question through the
//! Twin service over gRPC (start a server on free local ports, sync a snapshot's config and
//! state, then time routing questions one after another from a tonic client), the latency
//! predictor's HTTP API (`predictor.rs`), and the load run of many concurrent clients
//! (`server::load`, which tests/server_load.rs runs too).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::runtime::on_runtime;
use super::whatif::{whatif_now_us, whatif_question};
use super::{BenchError, BenchPlan, latency_row};
use crate::server::convert::config::cluster_to_proto;
use crate::server::convert::question::routing_to_proto;
use crate::server::convert::state::request_to_proto;
use crate::server::load::{LoadOptions, run_load};
use crate::server::predictor::PredictorOptions;
use crate::server::proto;
use crate::server::proto::twin_client::TwinClient;
use crate::server::run::{ServerOptions, start};
use crate::twin::question::RoutingQuestion;
use crate::twin::snapshot::MirrorSnapshot;

mod predictor;

/// The what-if cases through the real servers on loopback: the Twin service over gRPC and
/// the latency predictor's HTTP API.
pub(super) fn loopback_cases(
    out: &mut String,
    plan: &BenchPlan,
    known: &MirrorSnapshot,
) -> Result<(), BenchError> {
    let calls = plan.calls;
    if plan.runs("grpc") {
        let mut grpc = on_runtime(grpc_whatif_latencies(
            known,
            &whatif_question(1),
            calls,
            whatif_now_us,
        ))?;
        let _ = writeln!(
            out,
            "{}",
            latency_row("gRPC loopback, 1 replication (known), repeated", &mut grpc)
        );
    }
    if !plan.runs("predictor") {
        return Ok(());
    }
    // The latency predictor API (llm-d's predicted-latency routing): one strict bulk call
    // per routed request, one entry per candidate pod, with the default replications.
    let defaults = PredictorOptions::default();
    for entries in [4, 100] {
        let replications = (defaults.forks_per_call / entries)
            .clamp(2, defaults.replications as usize)
            .min(defaults.replications as usize);
        let mut http = on_runtime(predictor::http_bulk_latencies(entries, calls))?;
        let _ = writeln!(
            out,
            "{}",
            latency_row(
                &format!("HTTP /predict/bulk/strict, {entries} pods x {replications} replications"),
                &mut http
            )
        );
    }
    Ok(())
}

/// Latency of `calls` sequential `PredictRouting` calls for `question` on a server mirroring
/// `snapshot`, call `i` asking at `now_of_call(i)`.
async fn grpc_whatif_latencies(
    snapshot: &MirrorSnapshot,
    question: &RoutingQuestion,
    calls: u32,
    now_of_call: fn(u32) -> u64,
) -> Result<Vec<Duration>, BenchError> {
    let local = "127.0.0.1:0".parse().map_err(BenchError::failed)?;
    let server = start(ServerOptions::new(local, local))
        .await
        .map_err(BenchError::failed)?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr()))
        .map_err(BenchError::failed)?
        .connect()
        .await
        .map_err(BenchError::failed)?;
    let mut client = TwinClient::new(channel);
    client
        .sync_cluster_config(cluster_to_proto(&snapshot.config, &snapshot.settings, &[]))
        .await
        .map_err(BenchError::failed)?;
    let updates: Vec<proto::InstanceStateUpdate> = snapshot
        .instances
        .iter()
        .map(|state| proto::InstanceStateUpdate {
            instance_id: state.instance_id.clone(),
            observed_at_us: state.observed_at_us as i64,
            requests: Some(proto::RequestLists {
                waiting: state.waiting.iter().map(request_to_proto).collect(),
                running: state.running.iter().map(request_to_proto).collect(),
                step_end_us: state.step_end_us.map_or(0, |t| t as i64),
            }),
            ..proto::InstanceStateUpdate::default()
        })
        .collect();
    client
        .push_instance_state(tokio_stream::iter(updates))
        .await
        .map_err(BenchError::failed)?;
    let mut message = routing_to_proto(question, 0, "bench");
    let mut latencies = Vec::with_capacity(calls as usize);
    for call in 0..calls {
        message.now_us = now_of_call(call) as i64;
        let started = Instant::now();
        client
            .predict_routing(message.clone())
            .await
            .map_err(BenchError::failed)?;
        latencies.push(started.elapsed());
    }
    server.shutdown().await.map_err(BenchError::failed)?;
    Ok(latencies)
}

/// The load case: `clients` concurrent clients on loopback for `seconds` (see
/// `server::load`).
pub(super) fn load_case(out: &mut String, clients: usize, seconds: u64) -> Result<(), BenchError> {
    let _ = writeln!(
        out,
        "\n== load: {clients} clients on loopback for {seconds} s (after a 2 s warm-up), PredictRouting over 4 instances with every 10th operation a /metrics scrape, state pushes at 20/s"
    );
    let report = run_load(&LoadOptions {
        clients,
        warmup: Duration::from_secs(2),
        duration: Duration::from_secs(seconds),
        pushes_per_second: 20,
        scrape_every: 10,
    })
    .map_err(BenchError::failed)?;
    let mb =
        |bytes: Option<u64>| bytes.map_or("n/a".to_owned(), |b| format!("{:.0}", b as f64 / 1e6));
    let _ = writeln!(
        out,
        "operations/s {:.0} (predictions {}, pushes {}, scrapes {}), errors {}, prediction p50 {:.2} ms p99 {:.2} ms, RSS before {} MB after {} MB",
        report.ops_per_second(),
        report.predictions,
        report.pushes,
        report.scrapes,
        report.errors,
        report.latency(0.5).as_secs_f64() * 1e3,
        report.latency(0.99).as_secs_f64() * 1e3,
        mb(report.rss_before_bytes),
        mb(report.rss_after_bytes),
    );
    if let Some(err) = &report.first_error {
        let _ = writeln!(out, "first error: {err}");
    }
    Ok(())
}
