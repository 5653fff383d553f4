//! Following one InferencePool's changes: a watch on it by name
//! (`fieldSelector=metadata.name=NAME`), read through [`super::lines`] as the pods' watches
//! are: each line at most [`MAX_OBJECT_BYTES`] (one object, parsed whole into a JSON tree:
//! a 16 MiB line of small values would take hundreds of MB), a silence or an answer past the
//! watch timeout plus a margin given up, an error body read up to a cap. The watch is reopened
//! from the last version seen when it ends, after a backoff (0.5 s doubling to 30 s) when it
//! failed or did not live [`KubeLimits::healthy_after`].

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use kube::Client;
use kube::api::{ApiResource, WatchParams};
use kube::client::Body;
use tokio::time::Instant;

use super::KubeLimits;
use super::follow::{FIRST_BACKOFF, MAX_BACKOFF};
use super::get::MAX_OBJECT_BYTES;
use super::lines::{Lines, ReadError, read_all};
use crate::telemetry::live::LiveMetrics;

/// The longest error body read from the API server (a `Status` is a few hundred bytes).
const MAX_STATUS_BYTES: usize = 64 << 10;

/// What the InferencePool's watch reports.
#[derive(Debug)]
pub(super) enum PoolEvent {
    /// The pool was added or changed: `{"spec": ...}`.
    Applied(serde_json::Value),
    /// The pool was deleted.
    Deleted,
    /// The watch failed (counted by kind in `ditto_live_kube_failures_total`); it is
    /// reopened after the backoff.
    Failed(String),
}

/// The watch on one InferencePool.
pub(super) struct PoolWatch {
    client: Client,
    namespace: String,
    name: String,
    resource: ApiResource,
    limits: KubeLimits,
    metrics: LiveMetrics,
    /// The version to watch from (`None`: the current state first).
    rv: Option<String>,
    /// The watch being opened: kept across cancellations (the caller selects on
    /// [`Self::next`]), so a request is never dropped half-sent and sent again.
    opening: Option<Opening>,
    /// The open watch and when it was opened.
    lines: Option<(Lines<Body>, Instant)>,
    retry_at: Option<Instant>,
    backoff: Duration,
}

impl PoolWatch {
    /// A watch on InferencePool `name` in `namespace`, of `resource`'s group and version.
    pub(super) fn new(
        client: Client,
        namespace: String,
        name: String,
        resource: ApiResource,
        limits: KubeLimits,
        metrics: LiveMetrics,
    ) -> Self {
        Self {
            client,
            namespace,
            name,
            resource,
            limits,
            metrics,
            rv: None,
            opening: None,
            lines: None,
            retry_at: None,
            backoff: FIRST_BACKOFF,
        }
    }

    /// The next change of the pool. Cancel-safe: a line read in part stays buffered, a
    /// backoff is remembered, a watch being opened stays in flight.
    pub(super) async fn next(&mut self) -> PoolEvent {
        loop {
            if let Some(at) = self.retry_at {
                tokio::time::sleep_until(at).await;
                self.retry_at = None;
            }
            if self.lines.is_none() {
                let opening = match self.opening.take() {
                    Some(opening) => opening,
                    None => match self.watch_request() {
                        Ok(request) => Box::pin(open(
                            self.client.clone(),
                            request,
                            self.namespace.clone(),
                            self.limits,
                        )),
                        Err(failure) => return self.failed(failure.0, failure.1),
                    },
                };
                let opening = self.opening.insert(opening);
                let opened = opening.await;
                self.opening = None;
                match opened {
                    Ok(lines) => self.lines = Some((lines, Instant::now())),
                    Err((kind, reason)) => return self.failed(kind, reason),
                }
            }
            let Some((lines, since)) = &mut self.lines else {
                continue;
            };
            match lines.next().await {
                Ok(Some(line)) => match self.event(&line) {
                    Ok(Some(event)) => return event,
                    Ok(None) => {}
                    Err((kind, reason)) => return self.failed(kind, reason),
                },
                Ok(None) => {
                    // Closed by the server (as at `timeoutSeconds`): watch again.
                    let lived = since.elapsed();
                    self.lines = None;
                    if lived >= self.limits.healthy_after() {
                        self.backoff = FIRST_BACKOFF;
                    } else {
                        self.retry_later();
                    }
                }
                Err(err) => {
                    let kind = match err {
                        ReadError::LineTooLong(_) => "line_too_long",
                        ReadError::BodyTooLarge(_) => "too_large",
                        ReadError::Idle(_) | ReadError::Deadline => "idle",
                        ReadError::Body(_) => "error",
                    };
                    return self.failed(kind, format!("kubernetes API: {err}"));
                }
            }
        }
    }

    /// One watch line: the pool's change, or `None` for a bookmark (its version kept).
    fn event(&mut self, line: &[u8]) -> Result<Option<PoolEvent>, Failure> {
        let undecodable = |err: &dyn std::fmt::Display| {
            (
                "undecodable",
                format!("kubernetes API: undecodable InferencePool event: {err}"),
            )
        };
        let event: serde_json::Value =
            serde_json::from_slice(line).map_err(|err| undecodable(&err))?;
        let object = event.get("object").cloned().unwrap_or_default();
        let kind = event.get("type").and_then(serde_json::Value::as_str);
        if kind == Some("ERROR") {
            let code = object.get("code").and_then(serde_json::Value::as_u64);
            if code == Some(410) {
                // Expired: watch again from the current state.
                self.rv = None;
                self.lines = None;
                return Ok(None);
            }
            let message = object
                .get("message")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .chars()
                .take(512)
                .collect::<String>();
            return Err((
                "status",
                format!("kubernetes API: InferencePool watch error: {message}"),
            ));
        }
        if let Some(rv) = object
            .pointer("/metadata/resourceVersion")
            .and_then(serde_json::Value::as_str)
        {
            self.rv = Some(rv.to_owned());
        }
        match kind {
            Some("ADDED" | "MODIFIED") => Ok(Some(PoolEvent::Applied(serde_json::json!({
                "spec": object.get("spec").cloned().unwrap_or_default()
            })))),
            Some("DELETED") => Ok(Some(PoolEvent::Deleted)),
            Some("BOOKMARK") => Ok(None),
            other => Err(undecodable(&format!("event type {other:?}"))),
        }
    }

    /// The watch request, from the last version seen (the current state first when none).
    fn watch_request(&self) -> Result<http::Request<Vec<u8>>, Failure> {
        let seconds = u32::try_from(self.limits.watch_timeout.as_secs().max(1)).unwrap_or(290);
        let params = WatchParams::default()
            .fields(&format!("metadata.name={}", self.name))
            .timeout(seconds);
        let path = format!(
            "/apis/{}/namespaces/{}/{}",
            self.resource.api_version, self.namespace, self.resource.plural
        );
        kube::core::Request::new(path)
            .watch(&params, self.rv.as_deref().unwrap_or("0"))
            .map_err(|err| ("error", format!("kubernetes API request: {err}")))
    }

    /// A failure: the watch dropped (its memory freed), counted, retried after the backoff.
    fn failed(&mut self, kind: &'static str, reason: String) -> PoolEvent {
        self.lines = None;
        self.metrics.kube_failures.with_label_values(&[kind]).inc();
        self.retry_later();
        PoolEvent::Failed(reason)
    }

    /// The next attempt waits out the backoff, which doubles.
    fn retry_later(&mut self) {
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }
}

/// A failure's kind (a `ditto_live_kube_failures_total` label) and reason.
type Failure = (&'static str, String);

/// A watch being opened.
type Opening = Pin<Box<dyn Future<Output = Result<Lines<Body>, Failure>> + Send>>;

/// Sends the watch request; its answer's lines bounded by [`MAX_OBJECT_BYTES`] and its
/// silence by [`KubeLimits::idle`], an error answer read up to a cap and named.
async fn open(
    client: Client,
    request: http::Request<Vec<u8>>,
    namespace: String,
    limits: KubeLimits,
) -> Result<Lines<Body>, Failure> {
    let deadline = Instant::now() + limits.idle();
    let sent = tokio::time::timeout_at(deadline, client.send(request.map(Body::from)))
        .await
        .map_err(|_| {
            (
                "idle",
                "kubernetes API: no answer before the watch timeout".to_owned(),
            )
        })?
        .map_err(|err| ("error", format!("kubernetes API: {err}")))?;
    if sent.status().is_success() {
        return Ok(Lines::new(
            sent.into_body(),
            MAX_OBJECT_BYTES,
            limits.idle(),
            deadline,
        ));
    }
    let code = sent.status().as_u16();
    let body = read_all(sent.into_body(), MAX_STATUS_BYTES, limits.idle(), deadline)
        .await
        .unwrap_or_default();
    let message = serde_json::from_slice::<kube::core::Status>(&body)
        .map(|status| status.message)
        .unwrap_or_default();
    Err(match code {
        403 => (
            "forbidden",
            format!(
                "kubernetes API forbids watch on inferencepools in namespace {namespace:?}: \
                 grant get, list and watch on inferencepools to ditto's service account"
            ),
        ),
        code => (
            "status",
            format!(
                "kubernetes API answered {code}: {}",
                message.chars().take(512).collect::<String>()
            ),
        ),
    })
}
