//! The predictor case: the latency predictor API measured through the real HTTP server on
//! loopback: start a server with the embedded default cluster, then time
//! `POST /predict/bulk/strict` calls one after another from a minimal HTTP/1.1 client on one
//! keep-alive connection (as the router's client reuses its connections).

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::bench::BenchError;
use crate::cluster::spec::default_cluster;
use crate::server::run::{InitialConfig, ServerOptions, start};
use crate::twin::snapshot::TwinSettings;

fn failed(err: impl std::fmt::Display) -> BenchError {
    BenchError::failed(err)
}

/// A bulk body of `entries` candidate pods with loads spread as a busy pool's are (pod `i`
/// of call `call`: deterministic, different across calls so no answer is reused).
fn bulk_body(entries: usize, call: u32) -> String {
    let items: Vec<String> = (0..entries)
        .map(|i| {
            let i = i as u64 + u64::from(call) * 7;
            let running = 4 + (i * 13) % 48;
            let waiting = (i * 5) % 4;
            format!(
                "{{\"kv_cache_percentage\":{:.3},\"input_token_length\":{},\"num_request_waiting\":{waiting},\
                 \"num_request_running\":{running},\"num_tokens_generated\":0,\"prefix_cache_score\":{:.2},\
                 \"pod_type\":\"\",\"prefill_tokens_in_flight\":{},\"decode_tokens_in_flight\":0}}",
                (running as f64 * 0.012).min(0.9),
                600 + (i * 97) % 1_400,
                ((i * 37) % 100) as f64 / 100.0,
                waiting * 900,
            )
        })
        .collect();
    format!("{{\"requests\":[{}]}}", items.join(","))
}

async fn call(
    stream: &mut TcpStream,
    path: &str,
    body: &str,
) -> Result<(u16, Vec<u8>), BenchError> {
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.map_err(failed)?;
    let mut buffer = Vec::with_capacity(64 * 1024);
    let mut chunk = [0u8; 16 * 1024];
    let header_end = loop {
        let read = stream.read(&mut chunk).await.map_err(failed)?;
        if read == 0 {
            return Err(failed("connection closed"));
        }
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).to_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| failed("no status line"))?;
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| failed("no content-length"))?;
    while buffer.len() < header_end + length {
        let read = stream.read(&mut chunk).await.map_err(failed)?;
        if read == 0 {
            return Err(failed("connection closed mid-body"));
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    Ok((status, buffer[header_end..header_end + length].to_vec()))
}

/// Latency of `calls` sequential strict bulk calls of `entries` entries each (after 20
/// untimed warm-up calls).
pub(super) async fn http_bulk_latencies(
    entries: usize,
    calls: u32,
) -> Result<Vec<Duration>, BenchError> {
    let local = "127.0.0.1:0".parse().map_err(failed)?;
    let mut options = ServerOptions::new(local, local);
    options.initial_config = Some(InitialConfig {
        cluster: default_cluster(),
        settings: TwinSettings::defaults(),
    });
    let server = start(options).await.map_err(failed)?;
    let mut stream = TcpStream::connect(server.http_addr())
        .await
        .map_err(failed)?;
    stream.set_nodelay(true).map_err(failed)?;
    let mut latencies = Vec::with_capacity(calls as usize);
    for index in 0..calls + 20 {
        let body = bulk_body(entries, index);
        let started = Instant::now();
        let (status, reply) = call(&mut stream, "/predict/bulk/strict", &body).await?;
        let elapsed = started.elapsed();
        if status != 200 {
            return Err(failed(format!(
                "status {status}: {}",
                String::from_utf8_lossy(&reply)
            )));
        }
        if index >= 20 {
            latencies.push(elapsed);
        }
    }
    drop(stream);
    server.shutdown().await.map_err(failed)?;
    Ok(latencies)
}
