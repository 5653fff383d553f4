//! The edge of Kubernetes discovery: a kube-rs client from the standard places, and one
//! task per source that lists and watches its pods (`follow`: bounded lines, pages and
//! silences, backoff) and sends the coordinator the full view of the source's pods after
//! every change, or an outage (the pods keep their last state, stale, and one warning per
//! kind of failure names what is missing). An InferencePool is followed by its own watch
//! (`pool_watch`: lines capped as the pods' are).

use std::time::Duration;

use kube::api::{ApiResource, GroupVersionKind};
use kube::{Client, Config};
use tokio::sync::mpsc;

use super::endpoint::{PoolTarget, PoolVersion, pool_target};
use super::follow::Follower;
use super::get::{self, GetError};
use super::lines::ReadError;
use super::pool_watch::{PoolEvent, PoolWatch};
use super::{KubeLimits, KubeNews, KubeSource};
use crate::telemetry::live::LiveMetrics;

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
/// Bounded as every read of the API server is (see [`get`]): an answer over
/// [`get::MAX_OBJECT_BYTES`] is dropped as it passes the cap, the exchange given up after
/// [`get::GET_TIMEOUT`]; the object must be JSON (it is read again by the pool's watch).
pub async fn find_pool(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<PoolVersion>, GetError> {
    for version in PoolVersion::ALL {
        let resource = pool_resource(version);
        let path = format!(
            "/apis/{}/namespaces/{namespace}/{}/{name}",
            resource.api_version, resource.plural
        );
        if let Some(body) = get::get_object(client, &path, get::GET_TIMEOUT).await? {
            serde_json::from_slice::<serde::de::IgnoredAny>(&body).map_err(|err| {
                GetError::Read(ReadError::Body(format!("undecodable InferencePool: {err}")))
            })?;
            return Ok(Some(version));
        }
    }
    Ok(None)
}

/// Follows one Kubernetes source forever, sending [`KubeNews`] for source index `source`.
pub async fn run(
    source: usize,
    spec: KubeSource,
    tx: mpsc::Sender<KubeNews>,
    limits: KubeLimits,
    metrics: LiveMetrics,
) {
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
    let mut follower = Follower::new(
        source,
        client.clone(),
        namespace,
        spec.selector.clone().unwrap_or_default(),
        spec.port.unwrap_or(8000),
        spec.read_nodes,
        tx.clone(),
        limits,
        metrics.clone(),
    );
    match (&spec.selector, &spec.inference_pool) {
        (Some(_), _) => loop {
            follower.step().await;
        },
        (None, Some(pool)) => {
            follow_pool(&client, pool, spec.port, follower, limits, metrics).await;
        }
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
    limits: KubeLimits,
    metrics: LiveMetrics,
) {
    let namespace = follower.namespace.clone();
    let mut delay = Duration::from_millis(500);
    let version = loop {
        match find_pool(client, &namespace, name).await {
            Ok(Some(version)) => break version,
            Ok(None) => {
                let reason = format!("no InferencePool {name:?} in namespace {namespace:?}");
                follower.outage(reason).await;
            }
            Err(err) => {
                metrics.kube_failures.with_label_values(&[err.kind()]).inc();
                let reason = match &err {
                    GetError::Status { code: 403, .. } => format!(
                        "kubernetes API forbids get on inferencepools in namespace {namespace:?}: \
                         grant get, list and watch on inferencepools to ditto's service account"
                    ),
                    err => format!("InferencePool {name:?}: {err}"),
                };
                tracing::warn!(%reason, "live mirror: cannot read the InferencePool");
                follower.outage(reason).await;
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    };
    tracing::info!(pool = %name, group = version.group(), version = version.version(), "live mirror: following the InferencePool");
    let mut pool_events = PoolWatch::new(
        client.clone(),
        namespace,
        name.to_owned(),
        pool_resource(version),
        limits,
        metrics,
    );
    let mut target: Option<PoolTarget> = None;
    loop {
        tokio::select! {
            event = pool_events.next() => {
                let json = match event {
                    PoolEvent::Applied(json) => json,
                    PoolEvent::Deleted => {
                        let reason = format!("InferencePool {name:?} deleted");
                        follower.outage(reason).await;
                        continue;
                    }
                    PoolEvent::Failed(reason) => {
                        tracing::warn!(pool = %name, %reason, "live mirror: InferencePool watch failing");
                        continue;
                    }
                };
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
