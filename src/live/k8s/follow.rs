//! Following one source's pods: a paginated LIST, then a WATCH from its `resourceVersion`
//! (bookmarks on, `timeoutSeconds` from `--kube-watch-timeout-s`), every answer read through
//! [`super::lines`] so a line, a page and a silence are bounded. The full view goes to the
//! coordinator after every change.
//!
//! Failures back off (0.5 s doubling to 30 s) and the backoff is reset only by a watch that
//! has lived [`KubeLimits::healthy_after`]: a good LIST followed by a failing watch does not
//! reset it (so an API server that fails every watch gets a LIST at a bounded rate). Until
//! then the source stays *degraded*: its pods keep the failure as their discovery reason
//! (no stale/fresh flapping), and each kind of failure is logged once.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::client::Body;
use kube::core::ObjectList;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::endpoint::{PodView, pod_ip, view};
use super::get::{GET_TIMEOUT, GetError, get_object};
use super::lines::{Lines, ReadError, read_all};
use super::selector::LabelSelector;
use super::{KubeLimits, KubeNews, LIST_PAGE_LIMIT, MAX_LIST_PAGE_BYTES, MAX_WATCH_LINE_BYTES};
use crate::live::infer::NodeGpu;
use crate::telemetry::live::LiveMetrics;

/// The node label NVIDIA's GPU feature discovery sets to the GPU's product name.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";

/// First delay before retrying after a failure; doubled per failure up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest delay between attempts while the API server fails.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The longest error body read from the API server (a `Status` is a few hundred bytes).
const MAX_STATUS_BYTES: usize = 64 << 10;
/// The longest pod name or namespace (a DNS subdomain: 253 characters).
const MAX_NAME_LEN: usize = 253;

/// One failure: its kind (a metric label, logged once per kind) and the stale reason.
#[derive(Debug)]
struct Failure {
    kind: &'static str,
    reason: String,
}

/// How a watch ended.
enum End {
    /// The server closed it (as at `timeoutSeconds`): watch again from the last version.
    Closed,
    /// 410 Gone: relist.
    Gone,
    /// Anything else: relist after a backoff, the source degraded.
    Failed(Failure),
}

/// The pods of one source, as last listed and watched.
pub(super) struct Follower {
    pub(super) source: usize,
    pub(super) client: Client,
    pub(super) namespace: String,
    selector: LabelSelector,
    port: u16,
    /// The source's pods by id, as last seen.
    pods: BTreeMap<String, PodView>,
    /// The version to watch from (`None`: list first).
    rv: Option<String>,
    /// The open watch and when it was opened.
    watch: Option<(Lines<Body>, Instant)>,
    retry_at: Option<Instant>,
    backoff: Duration,
    /// The last failure, until a watch has lived long enough to call the source healthy.
    degraded: Option<String>,
    /// Failure kinds already logged (one warning each until the source recovers).
    warned: Vec<&'static str>,
    tx: mpsc::Sender<KubeNews>,
    /// Read pods' nodes for their GPU label (the source infers its pool).
    read_nodes: bool,
    /// What each node read said (a node's GPU does not change while it exists).
    nodes: BTreeMap<String, NodeGpu>,
    /// Why nodes cannot be read at all (403: no `get` on `nodes`), once known.
    nodes_forbidden: Option<String>,
    limits: KubeLimits,
    metrics: LiveMetrics,
}

impl Follower {
    /// A follower of `selector` in `namespace` (nothing listed yet).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        source: usize,
        client: Client,
        namespace: String,
        selector: LabelSelector,
        port: u16,
        read_nodes: bool,
        tx: mpsc::Sender<KubeNews>,
        limits: KubeLimits,
        metrics: LiveMetrics,
    ) -> Self {
        Self {
            source,
            client,
            namespace,
            selector,
            port,
            pods: BTreeMap::new(),
            rv: None,
            watch: None,
            retry_at: None,
            backoff: FIRST_BACKOFF,
            degraded: None,
            warned: Vec::new(),
            tx,
            read_nodes,
            nodes: BTreeMap::new(),
            nodes_forbidden: None,
            limits,
            metrics,
        }
    }

    /// Tells the coordinator this source is failing (its pods turn stale with `reason`).
    pub(super) async fn outage(&mut self, reason: String) {
        let _ = self
            .tx
            .send(KubeNews::Outage {
                source: self.source,
                reason,
            })
            .await;
    }

    /// Follows `selector` from now on (a fresh list).
    pub(super) fn retarget(&mut self, selector: LabelSelector, port: u16) {
        self.selector = selector;
        self.port = port;
        self.pods.clear();
        self.rv = None;
        self.watch = None;
        self.retry_at = None;
    }

    /// One step: waits out a backoff, lists, opens a watch, or applies its next line.
    /// Cancel-safe between steps (state lives in `self`; a dropped step is redone).
    pub(super) async fn step(&mut self) {
        if let Some(at) = self.retry_at {
            tokio::time::sleep_until(at).await;
            self.retry_at = None;
        }
        let Some(rv) = self.rv.clone() else {
            match self.list().await {
                Ok((pods, rv)) => {
                    self.pods = pods;
                    self.rv = Some(rv);
                    self.publish().await;
                }
                Err(failure) => self.failed(failure).await,
            }
            return;
        };
        let Some((lines, since)) = self.watch.as_mut() else {
            match self.open_watch(&rv).await {
                Ok(lines) => self.watch = Some((lines, Instant::now())),
                Err(End::Failed(failure)) => {
                    self.rv = None;
                    self.failed(failure).await;
                }
                Err(end) => self.end_watch(end).await,
            }
            return;
        };
        let healthy_at = *since + self.limits.healthy_after();
        let recovering = self.degraded.is_some() || self.backoff > FIRST_BACKOFF;
        if recovering && Instant::now() >= healthy_at {
            self.recovered().await;
            return;
        }
        let next = if recovering {
            tokio::select! {
                next = lines.next() => next,
                () = tokio::time::sleep_until(healthy_at) => return,
            }
        } else {
            lines.next().await
        };
        match next {
            Ok(Some(line)) => match self.on_line(&line) {
                Ok(true) => self.publish().await,
                Ok(false) => {}
                Err(end) => self.end_watch(end).await,
            },
            Ok(None) => self.end_watch(End::Closed).await,
            Err(err) => self.end_watch(End::Failed(read_failure(&err))).await,
        }
    }

    /// The source is healthy again: backoff reset, its pods' discovery reason cleared.
    async fn recovered(&mut self) {
        self.backoff = FIRST_BACKOFF;
        if self.degraded.take().is_some() || !self.warned.is_empty() {
            tracing::info!(namespace = %self.namespace, "live mirror: Kubernetes discovery recovered");
            self.warned.clear();
            self.publish().await;
        }
    }

    /// The next attempt waits out the backoff, which doubles.
    fn retry_later(&mut self) {
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// A failure: counted, logged once per kind, the source's pods stale with its reason,
    /// and a relist after the backoff.
    async fn failed(&mut self, failure: Failure) {
        self.metrics
            .kube_failures
            .with_label_values(&[failure.kind])
            .inc();
        if !self.warned.contains(&failure.kind) {
            tracing::warn!(namespace = %self.namespace, reason = %failure.reason, "live mirror: Kubernetes discovery failing; pods keep their last state, stale");
            self.warned.push(failure.kind);
        }
        self.degraded = Some(failure.reason.clone());
        self.retry_later();
        self.outage(failure.reason).await;
    }

    /// A watch ended: watch again (closed), relist (410, failure), after a backoff unless it
    /// had lived long enough to count as healthy.
    async fn end_watch(&mut self, end: End) {
        let lived = self
            .watch
            .take()
            .map_or(Duration::ZERO, |(_, since)| since.elapsed());
        let healthy = lived >= self.limits.healthy_after();
        match end {
            End::Closed | End::Gone => {
                if matches!(end, End::Gone) {
                    tracing::debug!(namespace = %self.namespace, "live mirror: watch expired (410 Gone), relisting");
                    self.rv = None;
                }
                if healthy {
                    self.recovered().await;
                } else {
                    self.retry_later();
                }
            }
            End::Failed(failure) => {
                self.rv = None;
                self.failed(failure).await;
            }
        }
    }

    /// Sends the request, bounded by `deadline`; a non-2xx answer is a failure naming it.
    /// (Takes clones, not `&self`: the follower is not `Sync`, its watch body is not.)
    async fn send(
        client: Client,
        namespace: String,
        idle: Duration,
        request: http::Request<Vec<u8>>,
        deadline: Instant,
    ) -> Result<http::Response<Body>, End> {
        let sent = tokio::time::timeout_at(deadline, client.send(request.map(Body::from)))
            .await
            .map_err(|_| {
                End::Failed(Failure {
                    kind: "idle",
                    reason: "kubernetes API: no answer before the watch timeout".to_owned(),
                })
            })?
            .map_err(|err| {
                End::Failed(Failure {
                    kind: "error",
                    reason: format!("kubernetes API: {err}"),
                })
            })?;
        if sent.status().is_success() {
            return Ok(sent);
        }
        let code = sent.status().as_u16();
        let body = read_all(sent.into_body(), MAX_STATUS_BYTES, idle, deadline)
            .await
            .unwrap_or_default();
        let message = serde_json::from_slice::<kube::core::Status>(&body)
            .map(|status| status.message)
            .unwrap_or_default();
        Err(status_end(&namespace, code, &message))
    }

    /// Sends a request for this source (see [`Self::send`]).
    async fn request(
        &mut self,
        request: http::Request<Vec<u8>>,
        deadline: Instant,
    ) -> Result<http::Response<Body>, End> {
        let (client, namespace) = (self.client.clone(), self.namespace.clone());
        Self::send(client, namespace, self.limits.idle(), request, deadline).await
    }
}

/// What an error status means: 410 relists, 403 names the missing permission.
fn status_end(namespace: &str, code: u16, message: &str) -> End {
    {
        match code {
            410 => End::Gone,
            403 => End::Failed(Failure {
                kind: "forbidden",
                reason: format!(
                    "kubernetes API forbids list/watch on pods in namespace {namespace:?}: \
                     grant get, list and watch on pods to ditto's service account"
                ),
            }),
            code => End::Failed(Failure {
                kind: "status",
                reason: format!(
                    "kubernetes API answered {code}: {}",
                    message.chars().take(512).collect::<String>()
                ),
            }),
        }
    }
}

impl Follower {
    fn pods_request(&self) -> kube::core::Request {
        kube::core::Request::new(format!("/api/v1/namespaces/{}/pods", self.namespace))
    }

    /// Lists the source's pods, page by page ([`LIST_PAGE_LIMIT`] pods, at most
    /// [`MAX_LIST_PAGE_BYTES`] each): the views and the list's resourceVersion.
    async fn list(&mut self) -> Result<(BTreeMap<String, PodView>, String), Failure> {
        let deadline = Instant::now() + self.limits.idle();
        let selector = self.selector.to_string();
        let mut pods = BTreeMap::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = ListParams::default()
                .labels(&selector)
                .limit(LIST_PAGE_LIMIT);
            if let Some(token) = &token {
                params = params.continue_token(token);
            }
            let request = self.pods_request().list(&params).map_err(|err| Failure {
                kind: "error",
                reason: format!("kubernetes API request: {err}"),
            })?;
            let response = self
                .request(request, deadline)
                .await
                .map_err(|end| match end {
                    End::Failed(failure) => failure,
                    _ => Failure {
                        kind: "status",
                        reason: "kubernetes API answered 410 to a list".to_owned(),
                    },
                })?;
            let body = read_all(
                response.into_body(),
                MAX_LIST_PAGE_BYTES,
                self.limits.idle(),
                deadline,
            )
            .await
            .map_err(|err| read_failure(&err))?;
            let page: ObjectList<Pod> = serde_json::from_slice(&body).map_err(|err| Failure {
                kind: "undecodable",
                reason: format!("kubernetes API: undecodable pod list: {err}"),
            })?;
            drop(body);
            for pod in &page.items {
                if let Some(view) = self.admit(pod) {
                    pods.insert(view.id.clone(), view);
                }
            }
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(next) => token = Some(next),
                None => return Ok((pods, page.metadata.resource_version.unwrap_or_default())),
            }
        }
    }

    /// Opens a watch from `rv`, its lines bounded by [`MAX_WATCH_LINE_BYTES`] and its
    /// silence by [`KubeLimits::idle`].
    async fn open_watch(&mut self, rv: &str) -> Result<Lines<Body>, End> {
        let seconds = u32::try_from(self.limits.watch_timeout.as_secs().max(1)).unwrap_or(290);
        let params = WatchParams::default()
            .labels(&self.selector.to_string())
            .timeout(seconds);
        let request = self.pods_request().watch(&params, rv).map_err(|err| {
            End::Failed(Failure {
                kind: "error",
                reason: format!("kubernetes API request: {err}"),
            })
        })?;
        let deadline = Instant::now() + self.limits.idle();
        let response = self.request(request, deadline).await?;
        Ok(Lines::new(
            response.into_body(),
            MAX_WATCH_LINE_BYTES,
            self.limits.idle(),
            deadline,
        ))
    }

    /// The view of a pod, or `None` (counted) for one from another namespace or without a
    /// usable name; a pod whose IP is not an IP literal is counted and kept unserved.
    fn admit(&self, pod: &Pod) -> Option<PodView> {
        let skip = |reason: &str| {
            self.metrics.kube_skipped.with_label_values(&[reason]).inc();
            None
        };
        if pod
            .metadata
            .namespace
            .as_deref()
            .is_some_and(|namespace| namespace != self.namespace)
        {
            return skip("other_namespace");
        }
        if pod
            .metadata
            .name
            .as_deref()
            .is_none_or(|name| name.is_empty() || name.len() > MAX_NAME_LEN)
        {
            return skip("invalid_name");
        }
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        if ip.is_some_and(|ip| !ip.is_empty() && pod_ip(ip).is_err()) {
            self.metrics
                .kube_skipped
                .with_label_values(&["invalid_ip"])
                .inc();
        }
        view(pod, &self.namespace, &self.selector, self.port)
    }

    /// Applies one watch line: whether the pod set changed, or how the watch ends.
    fn on_line(&mut self, line: &[u8]) -> Result<bool, End> {
        let event: WatchEvent<Pod> = serde_json::from_slice(line).map_err(|err| {
            End::Failed(Failure {
                kind: "undecodable",
                reason: format!("kubernetes API: undecodable watch event: {err}"),
            })
        })?;
        match event {
            WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                self.follow_version(&pod);
                let Some(view) = self.admit(&pod) else {
                    return Ok(false);
                };
                let changed = self.pods.get(&view.id) != Some(&view);
                self.pods.insert(view.id.clone(), view);
                Ok(changed)
            }
            WatchEvent::Deleted(pod) => {
                self.follow_version(&pod);
                let Some(view) = self.admit(&pod) else {
                    return Ok(false);
                };
                Ok(self.pods.remove(&view.id).is_some())
            }
            WatchEvent::Bookmark(bookmark) => {
                self.rv = Some(bookmark.metadata.resource_version);
                Ok(false)
            }
            WatchEvent::Error(status) => {
                Err(status_end(&self.namespace, status.code, &status.message))
            }
        }
    }

    fn follow_version(&mut self, pod: &Pod) {
        if let Some(rv) = &pod.metadata.resource_version {
            self.rv = Some(rv.clone());
        }
    }

    /// Sends the coordinator the source's pods (with their nodes' GPUs when it infers).
    async fn publish(&mut self) {
        let mut pods: Vec<PodView> = self.pods.values().cloned().collect();
        if self.read_nodes {
            for pod in &mut pods {
                if let Some(node) = pod.facts.node.clone() {
                    pod.node_gpu = Some(self.node_gpu(&node).await);
                }
            }
        }
        let _ = self
            .tx
            .send(KubeNews::Pods {
                source: self.source,
                pods,
                degraded: self.degraded.clone(),
            })
            .await;
    }

    /// What node `name`'s `nvidia.com/gpu.product` label says, read once per node. A 403
    /// (no `get` on `nodes`) is said once and not asked again; a 404 is remembered per node;
    /// other failures are retried with the next change.
    async fn node_gpu(&mut self, name: &str) -> NodeGpu {
        if let Some(reason) = &self.nodes_forbidden {
            return NodeGpu::Unreadable(reason.clone());
        }
        if let Some(known) = self.nodes.get(name) {
            return known.clone();
        }
        if name.is_empty()
            || name.len() > MAX_NAME_LEN
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            // Not a node name (a DNS subdomain): never put in a path.
            return NodeGpu::Unreadable(format!(
                "node name {:?} is not a DNS name",
                name.chars().take(64).collect::<String>()
            ));
        }
        let path = format!("/api/v1/nodes/{name}");
        let read = get_object(&self.client, &path, GET_TIMEOUT)
            .await
            .and_then(|body| {
                body.map(|body| {
                    serde_json::from_slice::<Node>(&body)
                        .map_err(|err| GetError::Read(ReadError::Body(err.to_string())))
                })
                .transpose()
            });
        match read {
            Ok(Some(node)) => {
                let found = node
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get(GPU_PRODUCT_LABEL))
                    .map_or(NodeGpu::NoLabel, |product| {
                        NodeGpu::Product(product.clone())
                    });
                if found == NodeGpu::NoLabel {
                    tracing::info!(node = %name, "live mirror: node has no {GPU_PRODUCT_LABEL} label; its pods' GPU is --default-gpu or the pool's");
                }
                self.nodes.insert(name.to_owned(), found.clone());
                found
            }
            Err(GetError::Status { code: 403, .. }) => {
                let reason = "kubernetes API forbids get on nodes: GPU from --default-gpu or \
                              the pool (grant get on nodes, a ClusterRole, to read \
                              nvidia.com/gpu.product)"
                    .to_owned();
                tracing::warn!(%reason, "live mirror: cannot read nodes");
                self.nodes_forbidden = Some(reason.clone());
                NodeGpu::Unreadable(reason)
            }
            Ok(None) => {
                let found = NodeGpu::Unreadable(format!("node {name} not found"));
                tracing::warn!(node = %name, "live mirror: node not found; its pods' GPU is --default-gpu or the pool's");
                self.nodes.insert(name.to_owned(), found.clone());
                found
            }
            Err(err) => {
                tracing::debug!(node = %name, %err, "live mirror: cannot read node; retried with the next change");
                NodeGpu::Unreadable(format!("node {name}: {err}"))
            }
        }
    }
}

/// The failure a bounded read ended with.
fn read_failure(err: &ReadError) -> Failure {
    let kind = match err {
        ReadError::LineTooLong(_) => "line_too_long",
        ReadError::BodyTooLarge(_) => "too_large",
        ReadError::Idle(_) | ReadError::Deadline => "idle",
        ReadError::Body(_) => "error",
    };
    Failure {
        kind,
        reason: format!("kubernetes API: {err}; relisting"),
    }
}
