//! What the live mirror attaches to: pod sources (static lists, DNS names), the engine
//! settings of each source's pool (vLLM does not publish its scheduler limits), KV-event
//! endpoints, scrape intervals and the per-signal age limits. Built from `ditto serve` flags
//! or from the `sources:` section of the cluster YAML (field-path errors).

use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::cluster::config::{ClusterConfig, InstanceConfig};
use crate::twin::snapshot::TwinSettings;

/// A bad live-mirror setting.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{field}: {reason}")]
pub struct LiveConfigError {
    /// The field or flag.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> LiveConfigError {
    LiveConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// How a source finds its pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// A fixed list of `host:port`.
    Static(Vec<String>),
    /// A headless Service: every A record of `name`, on `port`, re-resolved periodically.
    Dns {
        /// The DNS name.
        name: String,
        /// The metrics port.
        port: u16,
    },
    /// Pods listed and watched through the Kubernetes API (a label selector or an
    /// InferencePool); instance ids are `namespace/name`.
    Kubernetes(super::k8s::KubeSource),
}

/// Where a pod's KV events come from; `{ip}`/`{host}` in the templates is the pod's host,
/// `{rank}` its data-parallel rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEndpoints {
    /// The PUB endpoint template, e.g. `tcp://{ip}:5556` (llm-d's port).
    pub events: String,
    /// The replay ROUTER endpoint template, if the publisher has one (llm-d: port 5559).
    pub replay: Option<String>,
    /// The subscription topic prefix: empty (the default) accepts every topic, as vLLM's
    /// default topic is empty; llm-d's pods publish `kv@<pod-ip>@<model>`.
    pub topic: String,
    /// Data-parallel ranks per pod, each with its own publisher (vLLM offsets the ports of
    /// rank `r` by `r`); 1 without data parallelism.
    pub dp_size: u32,
}

impl KvEndpoints {
    /// The endpoint for a pod on `host`.
    pub fn resolve(template: &str, host: &str) -> String {
        template.replace("{ip}", host).replace("{host}", host)
    }

    /// `template` for rank `rank` of a pod on `host`: `{rank}` replaced by the rank; a
    /// template without `{rank}` has its port offset by the rank, as vLLM's
    /// `ZmqEventPublisher.offset_endpoint_port` binds rank `r`'s sockets.
    pub fn resolve_rank(template: &str, host: &str, rank: u32) -> String {
        let endpoint = Self::resolve(template, host);
        if template.contains("{rank}") {
            return endpoint.replace("{rank}", &rank.to_string());
        }
        if rank == 0 {
            return endpoint;
        }
        match endpoint.rsplit_once(':') {
            Some((head, port)) => match port.parse::<u32>() {
                Ok(port) => format!("{head}:{}", port + rank),
                Err(_) => endpoint,
            },
            None => endpoint,
        }
    }

    /// The PUB endpoint of rank `rank` of a pod on `host`.
    pub fn resolve_events(&self, host: &str, rank: u32) -> String {
        Self::resolve_rank(&self.events, host, rank)
    }

    /// The replay endpoint of rank `rank` of a pod on `host`, if any.
    pub fn resolve_replay(&self, host: &str, rank: u32) -> Option<String> {
        self.replay
            .as_deref()
            .map(|template| Self::resolve_rank(template, host, rank))
    }
}

/// One source of pods and the engine settings its pods run with.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveSource {
    /// Source (pool) name, for reporting.
    pub name: String,
    /// How pods are found.
    pub discovery: Discovery,
    /// The instance config every pod of the source starts from (id replaced by the pod's
    /// `host:port`; `block_size`/`num_gpu_blocks` replaced by what the pod publishes).
    pub template: InstanceConfig,
    /// KV events, if subscribed.
    pub kv: Option<KvEndpoints>,
    /// This source's own `/metrics` period (`None`: the base tick, `--scrape-interval-ms`);
    /// rounded up to a whole number of base ticks, as the EPP does with a per-source interval.
    pub scrape_interval: Option<Duration>,
    /// Whether (and with which pool fields winning) each pod's model, GPU, TP and engine
    /// limits are inferred from what it exposes (`None`: the pool's, as configured).
    pub infer: Option<super::infer::InferSpec>,
}

impl LiveSource {
    /// The period this source's pods are scraped at, given the base tick: its own interval
    /// rounded up to a multiple of the tick (at least one tick), or the tick.
    pub fn scrape_period(&self, tick: Duration) -> Duration {
        match self.scrape_interval {
            None => tick,
            Some(own) if tick.is_zero() => own,
            Some(own) => {
                let ticks = own.as_nanos().div_ceil(tick.as_nanos()).max(1);
                tick.saturating_mul(u32::try_from(ticks).unwrap_or(u32::MAX))
            }
        }
    }
}

/// Age limits per signal: older marks the instance stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxAges {
    /// Scraped gauges (and the state rebuilt from them).
    pub metrics: Duration,
    /// KV events (`None`: no limit, an idle pod publishes none).
    pub kv_events: Option<Duration>,
}

/// Everything the live mirror needs.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveConfig {
    /// The sources.
    pub sources: Vec<LiveSource>,
    /// Router, admission and staleness settings of the mirrored cluster (its instances are
    /// ignored: they come from the sources).
    pub cluster: ClusterConfig,
    /// Twin settings synced with every discovered instance set.
    pub settings: TwinSettings,
    /// Scrape period (the EPP's base tick: 50 ms).
    pub scrape_interval: Duration,
    /// Longest one scrape may take.
    pub scrape_timeout: Duration,
    /// The metrics path.
    pub metrics_path: String,
    /// DNS re-resolution period.
    pub dns_interval: Duration,
    /// How long a vanished address is kept before its instance is retired.
    pub retire_after: Duration,
    /// Per-signal age limits.
    pub max_age: MaxAges,
    /// Longest a KV replay may take.
    pub replay_timeout: Duration,
    /// How often the pods' staged writes (scrapes, KV batches) are published as one new
    /// generation (see `twin::store::Publish`): the most a write waits before questions see
    /// it.
    pub publish_interval: Duration,
    /// Where inferred pods' model configs (and a GPU fallback) come from.
    pub infer: super::infer::InferOptions,
    /// The bounds of Kubernetes discovery (the watch timeout).
    pub kube: super::k8s::KubeLimits,
}

impl LiveConfig {
    /// Defaults around `sources` and `cluster`: 50 ms scrapes with a 1 s timeout, DNS every
    /// 5 s, retire after 30 s, metrics stale after 1 s, no KV age limit, 2 s replays, writes
    /// published every 10 ms.
    pub fn new(sources: Vec<LiveSource>, cluster: ClusterConfig, settings: TwinSettings) -> Self {
        Self {
            sources,
            cluster,
            settings,
            scrape_interval: Duration::from_millis(50),
            scrape_timeout: Duration::from_millis(1000),
            metrics_path: "/metrics".to_owned(),
            dns_interval: Duration::from_secs(5),
            retire_after: Duration::from_secs(30),
            max_age: MaxAges {
                metrics: Duration::from_millis(1000),
                kv_events: None,
            },
            replay_timeout: Duration::from_secs(2),
            publish_interval: Duration::from_millis(10),
            infer: super::infer::InferOptions::default(),
            kube: super::k8s::KubeLimits::DEFAULT,
        }
    }
}

/// Parses `--pods a:1,b:2` (or a YAML list entry) into addresses.
pub fn parse_pods(list: &str, field: &str) -> Result<Vec<String>, LiveConfigError> {
    let pods: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|pod| !pod.is_empty())
        .map(str::to_owned)
        .collect();
    if pods.is_empty() {
        return Err(invalid(field, "needs at least one host:port"));
    }
    for (index, pod) in pods.iter().enumerate() {
        check_host_port(pod, &format!("{field}[{index}]"))?;
    }
    let mut sorted = pods.clone();
    sorted.sort();
    sorted.dedup();
    if sorted.len() != pods.len() {
        return Err(invalid(field, "lists a pod twice"));
    }
    Ok(pods)
}

fn check_host_port(value: &str, field: &str) -> Result<(String, u16), LiveConfigError> {
    let (host, port) = value
        .rsplit_once(':')
        .ok_or_else(|| invalid(field, format!("{value:?} is not host:port")))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|port| *port > 0)
        .ok_or_else(|| invalid(field, format!("{value:?}: port must be in 1..=65535")))?;
    if host.is_empty() {
        return Err(invalid(field, format!("{value:?}: empty host")));
    }
    Ok((host.to_owned(), port))
}

/// Parses `--pods-dns NAME:PORT`.
pub fn parse_dns(value: &str, field: &str) -> Result<Discovery, LiveConfigError> {
    let (name, port) = check_host_port(value.trim(), field)?;
    Ok(Discovery::Dns { name, port })
}

/// Checks a KV endpoint template.
pub fn check_endpoint(template: &str, field: &str) -> Result<(), LiveConfigError> {
    if !template.starts_with("tcp://") {
        return Err(invalid(
            field,
            format!("{template:?}: only tcp:// endpoints are supported"),
        ));
    }
    Ok(())
}

/// One entry of the cluster YAML's `sources:` list.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    /// The pool (in `pools:`) whose model, GPU, TP and engine settings the pods run with.
    pub pool: String,
    /// Static `host:port` list.
    #[serde(default)]
    pub pods: Vec<String>,
    /// Headless Service `NAME:PORT`.
    #[serde(default)]
    pub dns: Option<String>,
    /// Pods found through the Kubernetes API.
    #[serde(default)]
    pub kubernetes: Option<KubeSpec>,
    /// KV-event PUB endpoint template (llm-d: `tcp://{ip}:5556`; `{rank}`: a DP rank).
    #[serde(default)]
    pub kv_events: Option<String>,
    /// KV-event replay ROUTER endpoint template.
    #[serde(default)]
    pub kv_replay: Option<String>,
    /// Subscription topic prefix (default empty: every topic).
    #[serde(default)]
    pub kv_topic: Option<String>,
    /// This source's `/metrics` period, ms (default: `--scrape-interval-ms`), rounded up to a
    /// multiple of that base tick.
    #[serde(default)]
    pub scrape_interval_ms: Option<u64>,
    /// Data-parallel ranks per pod (each with its own KV-event publisher).
    #[serde(default)]
    pub kv_dp_size: Option<u32>,
}

/// A `sources[].kubernetes` entry: exactly one of `selector` and `inference_pool`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeSpec {
    /// A label selector (`app=vllm,llm-d.ai/role=decode`).
    #[serde(default)]
    pub selector: Option<String>,
    /// An InferencePool name.
    #[serde(default)]
    pub inference_pool: Option<String>,
    /// The namespace (default: the client's).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The metrics port (required with `selector`; overrides the pool's target port).
    #[serde(default)]
    pub port: Option<u16>,
}

impl KubeSpec {
    /// Checks the entry at `path` into a [`super::k8s::KubeSource`].
    pub fn resolve(&self, path: &str) -> Result<super::k8s::KubeSource, LiveConfigError> {
        let selector = match (&self.selector, &self.inference_pool) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(invalid(
                    path,
                    "needs exactly one of selector and inference_pool",
                ));
            }
            (Some(text), None) => Some(
                super::k8s::LabelSelector::parse(text)
                    .map_err(|reason| invalid(format!("{path}.selector"), reason))?,
            ),
            (None, Some(_)) => None,
        };
        if self.port == Some(0) {
            return Err(invalid(format!("{path}.port"), "must be in 1..=65535"));
        }
        if selector.is_some() && self.port.is_none() {
            return Err(invalid(
                format!("{path}.port"),
                "needed with selector (8200 under modelservice, 8000 for plain vLLM)",
            ));
        }
        Ok(super::k8s::KubeSource {
            namespace: self.namespace.clone(),
            selector,
            inference_pool: self.inference_pool.clone(),
            port: self.port,
            read_nodes: false,
        })
    }
}

#[derive(Debug, Deserialize)]
struct SourcesFile {
    #[serde(default)]
    sources: Vec<SourceSpec>,
}

/// The `sources:` of a cluster YAML resolved against its pools (`cluster` is the same file
/// already parsed by `cluster::spec`); empty when the file has none.
pub fn sources_from_yaml(
    text: &str,
    cluster: &ClusterConfig,
) -> Result<Vec<LiveSource>, LiveConfigError> {
    let file: SourcesFile =
        serde_saphyr::from_str(text).map_err(|err| invalid("sources", err.to_string()))?;
    file.sources
        .iter()
        .enumerate()
        .map(|(index, spec)| {
            let path = format!("sources[{index}]");
            let template = pool_template(cluster, &spec.pool).ok_or_else(|| {
                invalid(format!("{path}.pool"), format!("no pool {:?}", spec.pool))
            })?;
            let discovery = match (&spec.dns, spec.pods.is_empty(), &spec.kubernetes) {
                (Some(dns), true, None) => parse_dns(dns, &format!("{path}.dns"))?,
                (None, false, None) => {
                    Discovery::Static(parse_pods(&spec.pods.join(","), &format!("{path}.pods"))?)
                }
                (None, true, Some(kube)) => {
                    Discovery::Kubernetes(kube.resolve(&format!("{path}.kubernetes"))?)
                }
                _ => {
                    return Err(invalid(
                        path,
                        "needs exactly one of pods, dns and kubernetes",
                    ));
                }
            };
            let kv = match &spec.kv_events {
                None => None,
                Some(events) => {
                    check_endpoint(events, &format!("{path}.kv_events"))?;
                    if let Some(replay) = &spec.kv_replay {
                        check_endpoint(replay, &format!("{path}.kv_replay"))?;
                    }
                    Some(KvEndpoints {
                        events: events.clone(),
                        replay: spec.kv_replay.clone(),
                        topic: spec.kv_topic.clone().unwrap_or_default(),
                        dp_size: spec.kv_dp_size.unwrap_or(1).max(1),
                    })
                }
            };
            let scrape_interval = match spec.scrape_interval_ms {
                None => None,
                Some(0) => {
                    return Err(invalid(
                        format!("{path}.scrape_interval_ms"),
                        "must be at least 1",
                    ));
                }
                Some(ms) => Some(Duration::from_millis(ms)),
            };
            Ok(LiveSource {
                name: spec.pool.clone(),
                discovery,
                template,
                kv,
                scrape_interval,
                infer: None,
            })
        })
        .collect()
}

/// The instance config of pool `name` (its first replica), if the cluster has that pool.
pub fn pool_template(cluster: &ClusterConfig, name: &str) -> Option<InstanceConfig> {
    cluster
        .instances
        .iter()
        .find(|instance| instance.id == format!("{name}-0"))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(own: Option<u64>) -> LiveSource {
        LiveSource {
            name: "vllm".to_owned(),
            discovery: Discovery::Static(vec!["10.0.0.1:8000".to_owned()]),
            template: crate::cluster::spec::default_cluster().instances[0].clone(),
            kv: None,
            scrape_interval: own.map(Duration::from_millis),
            infer: None,
        }
    }

    #[test]
    fn a_source_interval_is_a_whole_number_of_base_ticks() {
        let tick = Duration::from_millis(50);
        assert_eq!(source(None).scrape_period(tick), tick);
        assert_eq!(source(Some(10)).scrape_period(tick), tick);
        assert_eq!(source(Some(50)).scrape_period(tick), tick);
        assert_eq!(
            source(Some(120)).scrape_period(tick),
            Duration::from_millis(150)
        );
        assert_eq!(
            source(Some(1000)).scrape_period(tick),
            Duration::from_secs(1)
        );
    }
}

/// Which of `max_num_seqs` / `max_num_batched_tokens` pool `pool` of the cluster YAML `text`
/// sets itself (the others default to vLLM's, see
/// [`super::vllm_defaults::apply_vllm_batch_defaults`]).
pub fn explicit_limits(text: &str, pool: &str) -> (bool, bool) {
    #[derive(Deserialize)]
    struct Engine {
        max_num_seqs: Option<serde::de::IgnoredAny>,
        max_num_batched_tokens: Option<serde::de::IgnoredAny>,
    }
    #[derive(Deserialize)]
    struct Pool {
        name: String,
        engine: Option<Engine>,
    }
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        pools: Vec<Pool>,
    }
    let Ok(file) = serde_saphyr::from_str::<File>(text) else {
        return (true, true);
    };
    file.pools
        .iter()
        .find(|candidate| candidate.name == pool)
        .and_then(|pool| pool.engine.as_ref())
        .map_or((false, false), |engine| {
            (
                engine.max_num_seqs.is_some(),
                engine.max_num_batched_tokens.is_some(),
            )
        })
}

#[cfg(test)]
mod batch_default_tests {
    use super::*;

    #[test]
    fn explicit_pool_limits_are_found() {
        let yaml = "pools:\n  - {name: a, engine: {max_num_seqs: 64}}\n  - {name: b}\n";
        assert_eq!(explicit_limits(yaml, "a"), (true, false));
        assert_eq!(explicit_limits(yaml, "b"), (false, false));
    }

    #[test]
    fn rank_endpoints_offset_the_port_or_fill_the_placeholder() {
        assert_eq!(
            KvEndpoints::resolve_rank("tcp://{ip}:5556", "10.0.0.1", 2),
            "tcp://10.0.0.1:5558"
        );
        assert_eq!(
            KvEndpoints::resolve_rank("tcp://vllm-{rank}.{host}:5556", "pod", 1),
            "tcp://vllm-1.pod:5556"
        );
    }
}
