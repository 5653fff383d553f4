//! Measuring the twin through its real gRPC server on loopback, for `ditto bench`: start a
//! server on free local ports, sync a snapshot's config and state, then time routing
//! questions one after another from a tonic client. `predictor.rs` does the same for the
//! latency predictor's HTTP API.

use std::time::{Duration, Instant};

use thiserror::Error;

pub mod predictor;

use crate::server::convert::config::cluster_to_proto;
use crate::server::convert::question::routing_to_proto;
use crate::server::convert::state::request_to_proto;
use crate::server::error::ServeError;
use crate::server::proto;
use crate::server::proto::twin_client::TwinClient;
use crate::server::run::{ServerOptions, start};
use crate::twin::question::RoutingQuestion;
use crate::twin::snapshot::MirrorSnapshot;

/// Why a load run failed.
#[derive(Debug, Error)]
pub enum LoadgenError {
    /// The server could not start.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The async runtime could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// A call failed.
    #[error("{0}")]
    Rpc(String),
}

fn rpc(err: impl std::fmt::Display) -> LoadgenError {
    LoadgenError::Rpc(err.to_string())
}

/// Latency of `calls` sequential `PredictRouting` calls for `question` on a server mirroring
/// `snapshot`, call `i` asking at `now_of_call(i)`.
pub fn grpc_whatif_latencies(
    snapshot: &MirrorSnapshot,
    question: &RoutingQuestion,
    calls: u32,
    now_of_call: fn(u32) -> u64,
) -> Result<Vec<Duration>, LoadgenError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let local = "127.0.0.1:0".parse().map_err(rpc)?;
        let server = start(ServerOptions::new(local, local)).await?;
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr()))
                .map_err(rpc)?
                .connect()
                .await
                .map_err(rpc)?;
        let mut client = TwinClient::new(channel);
        client
            .sync_cluster_config(cluster_to_proto(&snapshot.config, &snapshot.settings, &[]))
            .await
            .map_err(rpc)?;
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
            .map_err(rpc)?;
        let mut message = routing_to_proto(question, 0, "bench");
        let mut latencies = Vec::with_capacity(calls as usize);
        for call in 0..calls {
            message.now_us = now_of_call(call) as i64;
            let started = Instant::now();
            client.predict_routing(message.clone()).await.map_err(rpc)?;
            latencies.push(started.elapsed());
        }
        server.shutdown().await.map_err(rpc)?;
        Ok(latencies)
    })
}
