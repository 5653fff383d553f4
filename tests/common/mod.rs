//! What the integration tests share, one harness per boundary: `server` (a `ditto serve`
//! started in-process on free loopback ports, a tonic client, raw HTTP/1.1 requests) and
//! `cli` (the `ditto` binary). Each test crate uses part of it, hence `dead_code` allowed.
#![allow(dead_code, clippy::unwrap_used)]

pub mod cli;
pub mod pd;
pub mod server;
pub mod wire;

use std::time::Duration;

/// Runs a test body with an upper bound, so a bug shows as a failure, not a hang.
pub async fn within<F: std::future::Future<Output = ()>>(body: F) {
    tokio::time::timeout(Duration::from_secs(120), body)
        .await
        .expect("the test finished within its bound");
}
