//! Kubernetes discovery: the pods of a label selector, or of an InferencePool, listed and
//! watched through the API server the way llm-d's EPP finds them (modelservice creates no
//! Service for its vLLM pods, so DNS cannot).
//!
//! - `selector`: parsing and matching label selectors (pure).
//! - `endpoint`: pod object -> mirrored or not, and where its metrics are; InferencePool
//!   object -> selector and target port (pure).
//! - `watch`: the edge: the client, the InferencePool, one task per source feeding
//!   [`KubeNews`] to the live coordinator.
//! - `follow`: one source's pods: a paginated LIST, a WATCH from its `resourceVersion`
//!   (bookmarks, relist on 410 Gone, backoff on errors not reset by a LIST alone).
//! - `pool_watch`: the InferencePool's watch, its lines bounded as the pods' are.
//! - `lines`: bounded reading of the API server's answers (line and page caps, idle time).
//! - `get`: one object read through the same bounds (the InferencePool looked up, a node).
//!
//! Instance ids are `namespace/name`: stable for a pod that keeps its name (a StatefulSet
//! pod rescheduled with a new IP keeps its id), unlike `ip:port`.

pub mod endpoint;
mod follow;
pub mod get;
pub mod lines;
mod pool_watch;
pub mod selector;
pub mod watch;

use std::time::Duration;

pub use endpoint::{PodView, PoolTarget, PoolVersion};
pub use selector::LabelSelector;

/// A Kubernetes pod source: exactly one of `selector` and `inference_pool`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeSource {
    /// The namespace (`None`: the client's: the kubeconfig context's, or the service
    /// account's in a pod).
    pub namespace: Option<String>,
    /// A label selector (`--pods-selector`).
    pub selector: Option<LabelSelector>,
    /// An InferencePool to follow (`--inference-pool`): its selector and target port.
    pub inference_pool: Option<String>,
    /// The pods' metrics port (required with a selector; with an InferencePool it overrides
    /// the pool's target port, e.g. 8200 under modelservice whose proxy holds 8000).
    pub port: Option<u16>,
    /// Read each pod's node (`get` on `nodes`, cluster-scoped) for its
    /// `nvidia.com/gpu.product` label: on when the source infers its pool.
    pub read_nodes: bool,
}

/// What Kubernetes discovery tells the live coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeNews {
    /// The complete current view of a source's pods (after a list or any watch event).
    Pods {
        /// Index of the source.
        source: usize,
        /// Every pod the source selects, served or not.
        pods: Vec<PodView>,
        /// Why the source is still not followed reliably although it listed (its watch
        /// keeps failing): its pods stay stale with this reason until a watch lives.
        degraded: Option<String>,
    },
    /// The source cannot be followed right now: its pods keep their last state, stale.
    Outage {
        /// Index of the source.
        source: usize,
        /// Why (names the missing permission on a 403).
        reason: String,
    },
}

/// The longest watch line (one event) held: past it the stream is dropped and the source
/// relisted, stale with a reason.
pub const MAX_WATCH_LINE_BYTES: usize = 16 << 20;
/// The longest list page held (pages of [`LIST_PAGE_LIMIT`] pods).
pub const MAX_LIST_PAGE_BYTES: usize = 64 << 20;
/// Pods asked for per list page (`limit`, then `continue`).
pub const LIST_PAGE_LIMIT: u32 = 500;
/// How long past its `timeoutSeconds` a watch may stay silent (not even a bookmark) before
/// it is treated as dead.
pub const WATCH_MARGIN: Duration = Duration::from_secs(5);
/// How long a watch must live before the source counts as healthy again (its backoff reset,
/// its stale reason cleared); at most half the watch timeout.
pub const HEALTHY_WATCH: Duration = Duration::from_secs(2);

/// The bounds of Kubernetes discovery that come from flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubeLimits {
    /// The watch's `timeoutSeconds` (`--kube-watch-timeout-s`): the server closes it then.
    pub watch_timeout: Duration,
}

impl KubeLimits {
    /// Kubernetes clients' usual 290 s watches.
    pub const DEFAULT: KubeLimits = KubeLimits {
        watch_timeout: Duration::from_secs(290),
    };

    /// The longest silence (and the longest answer) before a watch or a list is given up.
    pub fn idle(&self) -> Duration {
        self.watch_timeout + WATCH_MARGIN
    }

    /// How long a watch must live before the source counts as healthy.
    pub fn healthy_after(&self) -> Duration {
        HEALTHY_WATCH.min(self.watch_timeout / 2)
    }
}

/// How long a start-up check may wait for the API server.
pub const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks a Kubernetes source before serving: the client config loads (in-cluster, else
/// `KUBECONFIG` / `~/.kube/config`) and a named InferencePool exists. An unreachable or
/// failing API server is not fatal (discovery retries at run time); a missing kubeconfig or
/// InferencePool is. Errors are (flag or field, reason). Runs on its own thread and runtime,
/// so it can be called from anywhere.
pub fn preflight(source: &KubeSource, field: &str) -> Result<(), (String, String)> {
    let source = source.clone();
    let field = field.to_owned();
    let pool_field = field.clone();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| (field.clone(), format!("cannot start a runtime: {err}")))?;
        runtime.block_on(async {
            let client = watch::client()
                .await
                .map_err(|reason| (field.clone(), reason))?;
            let Some(pool) = &source.inference_pool else {
                return Ok(());
            };
            let namespace = source
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_owned());
            match tokio::time::timeout(
                PREFLIGHT_TIMEOUT,
                watch::find_pool(&client, &namespace, pool),
            )
            .await
            {
                Ok(Ok(Some(_))) => Ok(()),
                Ok(Ok(None)) => Err((
                    pool_field,
                    format!(
                        "no InferencePool {pool:?} in namespace {namespace:?} (tried {})",
                        PoolVersion::ALL
                            .map(|v| format!("{}/{}", v.group(), v.version()))
                            .join(" and ")
                    ),
                )),
                Ok(Err(err)) => {
                    tracing::warn!(%pool, %err, "live mirror: cannot check the InferencePool at start; discovery retries");
                    Ok(())
                }
                Err(_) => {
                    tracing::warn!(%pool, "live mirror: the API server did not answer at start; discovery retries");
                    Ok(())
                }
            }
        })
    });
    thread
        .join()
        .unwrap_or_else(|_| Err((String::new(), "start-up check panicked".to_owned())))
}
