//! A `ditto serve` on free loopback ports, a connected tonic client, and raw HTTP/1.1
//! requests to its HTTP side (written by hand, so nothing of ours parses them).

use std::time::Duration;

use ditto::server::proto;
use ditto::server::proto::twin_client::TwinClient;
use ditto::server::{RunningServer, ServerOptions, start};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

/// A server on free local ports and a connected client.
pub struct Harness {
    /// The server.
    pub server: RunningServer,
    /// A channel to its gRPC port.
    pub channel: Channel,
    /// A Twin client on that channel (64 MiB message limits both ways).
    pub twin: TwinClient<Channel>,
}

impl Harness {
    /// Starts a server with the default options changed by `edit` (drain 500 ms first),
    /// connects, and syncs `config` when given.
    pub async fn start(
        config: Option<proto::ClusterConfig>,
        edit: impl FnOnce(&mut ServerOptions),
    ) -> Harness {
        let local = "127.0.0.1:0".parse().unwrap();
        let mut options = ServerOptions::new(local, local);
        options.drain = Duration::from_millis(500);
        edit(&mut options);
        let server = start(options).await.unwrap();
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr()))
                .unwrap()
                .connect()
                .await
                .unwrap();
        let mut twin = TwinClient::new(channel.clone())
            .max_decoding_message_size(64 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024);
        if let Some(config) = config {
            let ack = twin.sync_cluster_config(config).await.unwrap();
            assert!(ack.get_ref().changed);
        }
        Harness {
            server,
            channel,
            twin,
        }
    }

    /// The snapshot of `generation` (0: latest) at a fixed "now", with block hashes.
    pub async fn snapshot(
        &mut self,
        generation: u64,
    ) -> Result<proto::ClusterSnapshot, tonic::Status> {
        let request = proto::GetSnapshotRequest {
            generation,
            now_us: 2_000_000,
            include_block_hashes: true,
        };
        self.twin
            .get_snapshot(request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// The latest snapshot's generation.
    pub async fn generation(&mut self) -> u64 {
        self.snapshot(0).await.unwrap().generation
    }

    /// `GET path` on the HTTP port: the whole response, status line first.
    pub async fn http_get(&self, path: &str) -> String {
        http_get(self.server.http_addr(), path).await
    }

    /// `POST path` with a JSON `body` on the HTTP port: the whole response.
    pub async fn http_post(&self, path: &str, body: &str) -> String {
        http_request(
            self.server.http_addr(),
            &format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        )
        .await
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.http_get("/metrics").await
    }

    /// Shuts the server down.
    pub async fn stop(self) {
        self.server.shutdown().await.unwrap();
    }
}

/// `GET path` on `addr` over raw HTTP/1.1: the whole response, status line first.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    http_request(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
    .await
}

async fn http_request(addr: std::net::SocketAddr, request: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text
}

/// The value of the first sample of `series` (its name and labels exactly as exported) in
/// a `/metrics` text, if any.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    })
}

/// A codec sending and receiving raw bytes, to put undecodable messages on the wire.
#[derive(Clone, Copy, Debug, Default)]
pub struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let bytes = bytes::Buf::chunk(buf).to_vec();
        bytes::Buf::advance(buf, bytes.len());
        Ok(Some(bytes))
    }
}

impl Harness {
    /// Pushes `updates` on one `PushInstanceState` stream.
    pub async fn push(
        &mut self,
        updates: Vec<proto::InstanceStateUpdate>,
    ) -> Result<proto::PushAck, tonic::Status> {
        self.twin
            .push_instance_state(tokio_stream::iter(updates))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Pushes `batches` on one `PushKvEvents` stream.
    pub async fn push_kv(
        &mut self,
        batches: Vec<proto::KvEventBatch>,
    ) -> Result<proto::PushAck, tonic::Status> {
        self.twin
            .push_kv_events(tokio_stream::iter(batches))
            .await
            .map(tonic::Response::into_inner)
    }

    /// The gRPC health status of `service` ("" for the server).
    pub async fn health(&self, service: &str) -> i32 {
        let mut health = tonic_health::pb::health_client::HealthClient::new(self.channel.clone());
        let request = tonic_health::pb::HealthCheckRequest {
            service: service.to_owned(),
        };
        health.check(request).await.unwrap().into_inner().status
    }
}
