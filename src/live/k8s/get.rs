//! One bounded GET of a Kubernetes object (the InferencePool looked up before it is watched,
//! a pod's node): sent and read through [`super::lines`] as lists and watches are, the body
//! at most [`MAX_OBJECT_BYTES`] and the whole exchange at most a timeout. kube-rs's own `get`
//! reads an answer whole, however large, before it decodes it.

use std::time::Duration;

use kube::Client;
use kube::client::Body;
use thiserror::Error;
use tokio::time::Instant;

use super::lines::{ReadError, read_all};

/// The largest object read (2 MiB): etcd stores no object over 1.5 MiB (its default
/// `--max-request-bytes`), and an InferencePool or a Node is a few KiB.
pub const MAX_OBJECT_BYTES: usize = 2 << 20;
/// How long one GET may take, answer read in full.
pub const GET_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest error body read (a `Status` is a few hundred bytes).
const MAX_STATUS_BYTES: usize = 64 << 10;

/// Why a GET failed.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum GetError {
    /// The request could not be built.
    #[error("kubernetes API request: {0}")]
    Request(String),
    /// The request failed before an answer (connection, TLS, auth).
    #[error("kubernetes API: {0}")]
    Send(String),
    /// No answer within the timeout.
    #[error("kubernetes API: no answer within {0:?}")]
    NoAnswer(Duration),
    /// An error status, with the `Status` message (at most 512 characters).
    #[error("kubernetes API answered {code}: {message}")]
    Status {
        /// The HTTP status code.
        code: u16,
        /// The `Status` object's message.
        message: String,
    },
    /// The answer's body could not be read within the bounds.
    #[error("kubernetes API: {0}")]
    Read(ReadError),
}

impl GetError {
    /// The failure's kind, as `ditto_live_kube_failures_total` labels it.
    pub fn kind(&self) -> &'static str {
        match self {
            GetError::Request(_) | GetError::Send(_) => "error",
            GetError::NoAnswer(_) => "idle",
            GetError::Status { code: 403, .. } => "forbidden",
            GetError::Status { .. } => "status",
            GetError::Read(ReadError::LineTooLong(_) | ReadError::BodyTooLarge(_)) => "too_large",
            GetError::Read(ReadError::Idle(_) | ReadError::Deadline) => "idle",
            GetError::Read(ReadError::Body(_)) => "error",
        }
    }
}

/// GETs the object at `path` (an API path, e.g. `/api/v1/nodes/NAME`): its JSON, at most
/// [`MAX_OBJECT_BYTES`], or `None` when the API server answers 404. The whole exchange is
/// given up after `timeout`; a larger answer is dropped as soon as it passes the cap.
pub async fn get_object(
    client: &Client,
    path: &str,
    timeout: Duration,
) -> Result<Option<Vec<u8>>, GetError> {
    let deadline = Instant::now() + timeout;
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, "application/json")
        .body(Body::empty())
        .map_err(|err| GetError::Request(err.to_string()))?;
    let answer = tokio::time::timeout_at(deadline, client.send(request))
        .await
        .map_err(|_| GetError::NoAnswer(timeout))?
        .map_err(|err| GetError::Send(err.to_string()))?;
    let code = answer.status().as_u16();
    if answer.status().is_success() {
        return read_all(answer.into_body(), MAX_OBJECT_BYTES, timeout, deadline)
            .await
            .map(Some)
            .map_err(GetError::Read);
    }
    if code == 404 {
        return Ok(None);
    }
    let body = read_all(answer.into_body(), MAX_STATUS_BYTES, timeout, deadline)
        .await
        .unwrap_or_default();
    let message = serde_json::from_slice::<kube::core::Status>(&body)
        .map(|status| status.message)
        .unwrap_or_default()
        .chars()
        .take(512)
        .collect();
    Err(GetError::Status { code, message })
}
