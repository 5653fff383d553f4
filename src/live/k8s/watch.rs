//! The edge of Kubernetes discovery: a kube-rs client from the standard places, and one
//! task per source that lists and watches (kube-runtime's watcher: `resourceVersion`,
//! bookmarks, relist on 410 Gone, backoff on errors) and sends the coordinator the full
//! view of the source's pods after every change, or an outage (the pods keep their last
//! state, stale, and one warning per kind of failure names what is missing).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config};
use tokio::sync::mpsc;

use super::endpoint::{PodView, PoolTarget, PoolVersion, pool_target, view};
use crate::live::infer::NodeGpu;

/// The node label NVIDIA's GPU feature discovery sets to the GPU's product name.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
use super::selector::LabelSelector;
use super::{KubeNews, KubeSource};

/// The client config: in-cluster (service account) when running in a pod, else
/// `KUBECONFIG` / `~/.kube/config`. The error says which file failed.
pub async fn client() -> Result<Client, String> {
    let config = if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        Config::incluster().map_err(|err| format!("in-cluster config: {err}"))?
    } else {
        let path = std::env::var("KUBECONFIG").unwrap_or_else(|_| "~/.kube/config".to_owned());
        Config::from_kubeconfig(&kube::config::KubeConfigOptions::default())
            .await
            .map_err(|err| format!("kubeconfig {path}: {err}"))?
    };
    Client::try_from(config).map_err(|err| format!("kubernetes client: {err}"))
}

fn pool_resource(version: PoolVersion) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        version.group(),
        version.version(),
        "InferencePool",
    ))
}

/// Reads InferencePool `name`, trying v1 then v1alpha2: `Ok(None)` when neither serves it.
pub async fn find_pool(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<(PoolVersion, DynamicObject)>, kube::Error> {
    for version in PoolVersion::ALL {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &pool_resource(version));
        match api.get(name).await {
            Ok(object) => return Ok(Some((version, object))),
            Err(kube::Error::Api(status)) if status.code == 404 => continue,
            Err(err) => return Err(err),
        }
    }
    Ok(None)
}

type PodStream = Pin<Box<dyn Stream<Item = Result<Event<Pod>, watcher::Error>> + Send>>;

/// First delay before re-listing after a failure; doubled per failure up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest delay between attempts while the API server fails.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The pods of one source, as last listed and watched.
struct Follower {
    source: usize,
    client: Client,
    namespace: String,
    selector: LabelSelector,
    port: u16,
    pods: BTreeMap<String, Pod>,
    /// The pods of a list in progress.
    listing: Option<BTreeMap<String, Pod>>,
    /// The list+watch in progress (`None`: start one, after `retry_at`).
    stream: Option<PodStream>,
    retry_at: Option<tokio::time::Instant>,
    backoff: Duration,
    /// Failure kinds already logged (one warning each until the source recovers).
    warned: Vec<String>,
    tx: mpsc::Sender<KubeNews>,
    /// Read pods' nodes for their GPU label (the source infers its pool).
    read_nodes: bool,
    /// What each node read said (a node's GPU does not change while it exists).
    nodes: BTreeMap<String, NodeGpu>,
    /// Why nodes cannot be read at all (403: no `get` on `nodes`), once known: said once,
    /// not asked again.
    nodes_forbidden: Option<String>,
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

impl Follower {
    /// Tells the coordinator this source is failing (its pods turn stale with `reason`).
    async fn outage(&mut self, reason: String) {
        let _ = self
            .tx
            .send(KubeNews::Outage {
                source: self.source,
                reason,
            })
            .await;
    }

    /// Follows `selector` from now on (a fresh list).
    fn retarget(&mut self, selector: LabelSelector, port: u16) {
        self.selector = selector;
        self.port = port;
        self.pods.clear();
        self.listing = None;
        self.stream = None;
        self.retry_at = None;
    }

    /// One step: waits for and applies the next watcher item. A failure other than 410
    /// (which the watcher answers by relisting) is reported, and the list+watch restarts
    /// after a backoff, so the first successful list clears the outage.
    async fn step(&mut self) {
        if self.stream.is_none() {
            if let Some(at) = self.retry_at {
                tokio::time::sleep_until(at).await;
            }
            self.retry_at = None;
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
            let config = watcher::Config::default().labels(&self.selector.to_string());
            self.stream = Some(watcher::watcher(api, config).boxed());
        }
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        match stream.next().await {
            None => self.stream = None,
            Some(Err(err)) => {
                if self.on_error(&err).await {
                    self.stream = None;
                    self.retry_at = Some(tokio::time::Instant::now() + self.backoff);
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
            }
            Some(Ok(event)) => self.on_event(event).await,
        }
    }

    /// Applies one watcher event; sends the new view when it changed the pod set.
    async fn on_event(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                return;
            }
            Event::InitApply(pod) => {
                self.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key(&pod), pod);
                return;
            }
            Event::InitDone => {
                self.pods = self.listing.take().unwrap_or_default();
                self.backoff = FIRST_BACKOFF;
            }
            Event::Apply(pod) => {
                self.pods.insert(key(&pod), pod);
            }
            Event::Delete(pod) => {
                self.pods.remove(&key(&pod));
            }
        }
        if !self.warned.is_empty() {
            tracing::info!(namespace = %self.namespace, "live mirror: Kubernetes discovery recovered");
            self.warned.clear();
        }
        let mut pods: Vec<PodView> = self
            .pods
            .values()
            .filter_map(|pod| view(pod, &self.namespace, &self.selector, self.port))
            .collect();
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
        let api: Api<Node> = Api::all(self.client.clone());
        match api.get(name).await {
            Ok(node) => {
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
            Err(kube::Error::Api(status)) if status.code == 403 => {
                let reason = "kubernetes API forbids get on nodes: GPU from --default-gpu or \
                              the pool (grant get on nodes, a ClusterRole, to read \
                              nvidia.com/gpu.product)"
                    .to_owned();
                tracing::warn!(%reason, "live mirror: cannot read nodes");
                self.nodes_forbidden = Some(reason.clone());
                NodeGpu::Unreadable(reason)
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
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

    /// Reports a failure (true) or lets the watcher relist on 410 Gone (false).
    async fn on_error(&mut self, err: &watcher::Error) -> bool {
        let status = match err {
            watcher::Error::InitialListFailed(kube::Error::Api(status))
            | watcher::Error::WatchStartFailed(kube::Error::Api(status))
            | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status.as_ref()),
            watcher::Error::WatchError(status) => Some(status.as_ref()),
            _ => None,
        };
        let code = status.map_or(0, |status| status.code);
        if code == 410 {
            tracing::debug!(namespace = %self.namespace, "live mirror: watch expired (410 Gone), relisting");
            return false;
        }
        let (kind, reason) = match code {
            403 => (
                "forbidden".to_owned(),
                format!(
                    "kubernetes API forbids list/watch on pods in namespace {:?}: grant \
                     get, list and watch on pods to ditto's service account",
                    self.namespace
                ),
            ),
            0 => ("error".to_owned(), format!("kubernetes API: {err}")),
            code => (
                format!("status {code}"),
                format!(
                    "kubernetes API answered {code}: {}",
                    status.map_or(String::new(), |status| status.message.clone())
                ),
            ),
        };
        if !self.warned.contains(&kind) {
            tracing::warn!(namespace = %self.namespace, %reason, "live mirror: Kubernetes discovery failing; pods keep their last state, stale");
            self.warned.push(kind);
        }
        self.outage(reason).await;
        true
    }
}

/// Follows one Kubernetes source forever, sending [`KubeNews`] for source index `source`.
pub async fn run(source: usize, spec: KubeSource, tx: mpsc::Sender<KubeNews>) {
    let outage = |reason: String| KubeNews::Outage { source, reason };
    let client = loop {
        match client().await {
            Ok(client) => break client,
            Err(reason) => {
                tracing::warn!(%reason, "live mirror: no Kubernetes client; retrying");
                let _ = tx.send(outage(reason)).await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    let namespace = spec
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let mut follower = Follower {
        source,
        client: client.clone(),
        namespace,
        selector: spec.selector.clone().unwrap_or_default(),
        port: spec.port.unwrap_or(8000),
        pods: BTreeMap::new(),
        listing: None,
        stream: None,
        retry_at: None,
        backoff: FIRST_BACKOFF,
        warned: Vec::new(),
        tx: tx.clone(),
        read_nodes: spec.read_nodes,
        nodes: BTreeMap::new(),
        nodes_forbidden: None,
    };
    match (&spec.selector, &spec.inference_pool) {
        (Some(_), _) => loop {
            follower.step().await;
        },
        (None, Some(pool)) => follow_pool(&client, pool, spec.port, follower).await,
        (None, None) => {}
    }
}

/// Waits for InferencePool `name` (v1, else v1alpha2), then follows its selector and target
/// port as they change, restarting the pod watch on every change.
async fn follow_pool(
    client: &Client,
    name: &str,
    port_override: Option<u16>,
    mut follower: Follower,
) {
    let namespace = follower.namespace.clone();
    let mut delay = Duration::from_millis(500);
    let version = loop {
        match find_pool(client, &namespace, name).await {
            Ok(Some((version, _))) => break version,
            Ok(None) => {
                let reason = format!("no InferencePool {name:?} in namespace {namespace:?}");
                follower.outage(reason).await;
            }
            Err(err) => {
                let reason = match &err {
                    kube::Error::Api(status) if status.code == 403 => format!(
                        "kubernetes API forbids get on inferencepools in namespace {namespace:?}: \
                         grant get, list and watch on inferencepools to ditto's service account"
                    ),
                    err => format!("kubernetes API: {err}"),
                };
                tracing::warn!(%reason, "live mirror: cannot read the InferencePool");
                follower.outage(reason).await;
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    };
    tracing::info!(pool = %name, group = version.group(), version = version.version(), "live mirror: following the InferencePool");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &pool_resource(version));
    let mut pool_events = watcher::watcher(
        api,
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .default_backoff()
    .boxed();
    let mut target: Option<PoolTarget> = None;
    loop {
        tokio::select! {
            item = pool_events.next() => {
                let Some(item) = item else { return };
                let object = match item {
                    Ok(Event::Apply(object) | Event::InitApply(object)) => object,
                    Ok(Event::Delete(_)) => {
                        let reason = format!("InferencePool {name:?} deleted");
                        follower.outage(reason).await;
                        continue;
                    }
                    Ok(Event::Init | Event::InitDone) => continue,
                    Err(err) => {
                        tracing::warn!(pool = %name, %err, "live mirror: InferencePool watch failing");
                        continue;
                    }
                };
                let json = serde_json::json!({"spec": object.data.get("spec").cloned().unwrap_or_default()});
                match pool_target(&json, version) {
                    Ok(mut new) => {
                        if let Some(port) = port_override {
                            new.port = port;
                        }
                        if target.as_ref() != Some(&new) {
                            tracing::info!(pool = %name, selector = %new.selector, port = new.port, "live mirror: InferencePool target");
                            follower.retarget(new.selector.clone(), new.port);
                            target = Some(new);
                        }
                    }
                    Err(reason) => {
                        let reason = format!("InferencePool {name:?}: {reason}");
                        tracing::warn!(%reason, "live mirror: unusable InferencePool");
                        follower.outage(reason).await;
                    }
                }
            }
            () = follower.step(), if target.is_some() => {}
        }
    }
}
