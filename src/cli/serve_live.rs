//! The live-mirror flags of `ditto serve` (`--pods`, `--pods-dns`, `--kv-events`, ...) and
//! their resolution, with the cluster file's `sources:`, into a [`LiveConfig`]. Flags name
//! the first pool of the cluster file (or of the embedded default) for engine settings.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::cluster::config::ClusterConfig;
use crate::live::config::{
    check_endpoint, explicit_limits, parse_dns, parse_pods, pool_template, sources_from_yaml,
};
use crate::live::infer::{InferOptions, InferSpec, default_hf_cache, explicit_fields};
use crate::live::k8s::{KubeSource, LabelSelector};
use crate::live::vllm_defaults::apply_vllm_batch_defaults;
use crate::live::{Discovery, KvEndpoints, LiveConfig, LiveSource, MaxAges};
use crate::twin::question::StalePolicy;
use crate::twin::snapshot::TwinSettings;

/// How stale instances are treated in live mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StalePolicyArg {
    /// Fail closed, as the EPP's flow control: never recommended (the default).
    TreatSaturated,
    /// Left out of the candidates.
    Exclude,
    /// Rolled forward by their age inside the simulation.
    RollForward,
    /// Used as if current.
    UseLast,
}

/// When Kubernetes-discovered pods' setups are inferred (`--infer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InferMode {
    /// For --pods-selector / --inference-pool when no --config is given (the default).
    Auto,
    /// For every Kubernetes source, flags or `sources:`; the pool's explicit fields win.
    On,
    /// Never: pods run their source's pool as configured.
    Off,
}

/// Live-mirror flags.
#[derive(Clone, Debug, Args)]
pub struct LiveArgs {
    /// Pull from these pods (`host:port[,host:port...]`, their vLLM HTTP port): the mirror
    /// keeps itself current from their /metrics (and KV events with --kv-events).
    #[arg(long, env = "DITTO_PODS")]
    pub pods: Option<String>,
    /// Pull from every A record of a headless Service (`NAME:PORT`), re-resolved periodically.
    #[arg(long, env = "DITTO_PODS_DNS")]
    pub pods_dns: Option<String>,
    /// Pull from the pods of this label selector, listed and watched through the Kubernetes
    /// API (e.g. `llm-d.ai/inferenceServing=true,llm-d.ai/role=decode`); needs --pods-port.
    /// Client config: in-cluster service account, else KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "DITTO_PODS_SELECTOR")]
    pub pods_selector: Option<String>,
    /// Pull from the pods of this InferencePool (its selector and target port, followed as
    /// they change; `inference.networking.k8s.io/v1`, else `x-k8s.io/v1alpha2`).
    #[arg(long, env = "DITTO_INFERENCE_POOL")]
    pub inference_pool: Option<String>,
    /// Namespace for --pods-selector / --inference-pool (default: the kubeconfig context's,
    /// or the service account's).
    #[arg(long, env = "DITTO_PODS_NAMESPACE")]
    pub pods_namespace: Option<String>,
    /// The pods' vLLM metrics port for --pods-selector (8200 under llm-d's modelservice,
    /// 8000 for plain vLLM); with --inference-pool it overrides the pool's target port.
    #[arg(long, env = "DITTO_PODS_PORT")]
    pub pods_port: Option<u16>,
    /// KV-event PUB endpoint template for --pods/--pods-dns, e.g. `tcp://{ip}:5556` (llm-d's
    /// port); `{rank}` is a data-parallel rank (see --kv-dp-size).
    #[arg(long, env = "DITTO_KV_EVENTS")]
    pub kv_events: Option<String>,
    /// KV-event replay ROUTER endpoint template, e.g. `tcp://{ip}:5559` (llm-d's port).
    #[arg(long, env = "DITTO_KV_REPLAY")]
    pub kv_replay: Option<String>,
    /// KV-event topic prefix filter; empty (the default) accepts every topic (vLLM's default
    /// topic is empty; llm-d's pods publish `kv@<pod-ip>@<model>`).
    #[arg(long, env = "DITTO_KV_TOPIC", default_value = "")]
    pub kv_topic: String,
    /// Data-parallel ranks per pod: rank r's publisher is subscribed to at the template with
    /// `{rank}` = r, or, without `{rank}`, with its ports offset by r (as vLLM binds them).
    #[arg(long, env = "DITTO_KV_DP_SIZE", default_value_t = 1)]
    pub kv_dp_size: u32,
    /// Scrape period, ms (the EPP's base tick).
    #[arg(long, env = "DITTO_SCRAPE_INTERVAL_MS", default_value_t = 50)]
    pub scrape_interval_ms: u64,
    /// Longest one scrape may take, ms.
    #[arg(long, env = "DITTO_SCRAPE_TIMEOUT_MS", default_value_t = 1000)]
    pub scrape_timeout_ms: u64,
    /// How often the pods' scrapes and KV batches are published to questions as one new
    /// snapshot generation, ms (the most a write waits before questions see it).
    #[arg(long, env = "DITTO_PUBLISH_INTERVAL_MS", default_value_t = 10)]
    pub publish_interval_ms: u64,
    /// DNS re-resolution period for --pods-dns, ms.
    #[arg(long, env = "DITTO_DNS_INTERVAL_MS", default_value_t = 5000)]
    pub dns_interval_ms: u64,
    /// A vanished DNS address, or a pod Kubernetes reports deleted or NotReady (stale at
    /// once), is retired after this long, ms.
    #[arg(long, env = "DITTO_RETIRE_AFTER_MS", default_value_t = 30_000)]
    pub retire_after_ms: u64,
    /// Scraped state older than this marks an instance stale, ms.
    #[arg(long, env = "DITTO_MAX_METRICS_AGE_MS", default_value_t = 1000)]
    pub max_metrics_age_ms: u64,
    /// No KV-event batch for this long marks an instance stale, ms (0: no limit; an idle
    /// pod publishes none).
    #[arg(long, env = "DITTO_MAX_KV_AGE_MS", default_value_t = 0)]
    pub max_kv_age_ms: u64,
    /// Infer each Kubernetes-discovered pod's model (args, else /metrics `model_name`), TP
    /// (args, else its `nvidia.com/gpu`), GPU (its node's `nvidia.com/gpu.product`) and
    /// engine limits (args) instead of simulating the pool: `auto` does for --pods-selector /
    /// --inference-pool without --config, `on` for every Kubernetes source (the pool's
    /// explicitly set fields win), `off` never (docs/live.md, "Inferring the pool").
    #[arg(long, env = "DITTO_INFER", value_enum, default_value = "auto")]
    pub infer: InferMode,
    /// HuggingFace cache holding inferred models' config.json (`models--ORG--NAME/snapshots`;
    /// an HF_HOME with a `hub/` is accepted). Default: HF_HUB_CACHE, else $HF_HOME/hub, else
    /// ~/.cache/huggingface/hub.
    #[arg(long, env = "DITTO_HF_CACHE")]
    pub hf_cache: Option<PathBuf>,
    /// GPU of inferred pods whose node's `nvidia.com/gpu.product` cannot be read (no `get`
    /// on nodes, no label); default: the pool's (the embedded default's H100 without
    /// --config).
    #[arg(long, env = "DITTO_DEFAULT_GPU")]
    pub default_gpu: Option<String>,
    /// How stale instances are treated by predictions in live mode.
    #[arg(
        long,
        env = "DITTO_STALE_POLICY",
        value_enum,
        default_value = "treat-saturated"
    )]
    pub stale_policy: StalePolicyArg,
    /// The `timeoutSeconds` of each Kubernetes pod watch (1..=3600): the API server closes
    /// the watch then and ditto watches again; a watch silent (not even a bookmark) for 5 s
    /// longer is treated as dead and the source relisted, stale with a reason.
    #[arg(long, env = "DITTO_KUBE_WATCH_TIMEOUT_S", default_value_t = 290)]
    pub kube_watch_timeout_s: u64,
}

/// A bad live flag or `sources:` entry: (flag or field, reason).
pub type LiveArgError = (String, String);

fn positive(value: u64, flag: &str) -> Result<Duration, LiveArgError> {
    if value == 0 {
        return Err((flag.to_owned(), "must be at least 1".to_owned()));
    }
    Ok(Duration::from_millis(value))
}

/// The Kubernetes source of the flags, if any (checked: not both selector and pool, a
/// parsable selector, a port with a selector).
fn kube_source(args: &LiveArgs) -> Result<Option<KubeSource>, LiveArgError> {
    let flag = |name: &str, reason: &str| (name.to_owned(), reason.to_owned());
    match (&args.pods_selector, &args.inference_pool) {
        (None, None) => {
            if args.pods_namespace.is_some() {
                return Err(flag(
                    "pods-namespace",
                    "needs --pods-selector or --inference-pool",
                ));
            }
            if args.pods_port.is_some() {
                return Err(flag(
                    "pods-port",
                    "needs --pods-selector or --inference-pool",
                ));
            }
            Ok(None)
        }
        (Some(_), Some(_)) => Err(flag(
            "inference-pool",
            "give --pods-selector or --inference-pool, not both",
        )),
        (selector, pool) => {
            let selector = match selector {
                None => None,
                Some(text) => Some(
                    LabelSelector::parse(text)
                        .map_err(|reason| ("pods-selector".to_owned(), reason))?,
                ),
            };
            if args.pods_port == Some(0) {
                return Err(flag("pods-port", "must be in 1..=65535"));
            }
            if selector.is_some() && args.pods_port.is_none() {
                return Err(flag(
                    "pods-port",
                    "needed with --pods-selector (8200 under modelservice, 8000 for plain vLLM)",
                ));
            }
            if pool.as_ref().is_some_and(|pool| pool.trim().is_empty()) {
                return Err(flag("inference-pool", "empty name"));
            }
            Ok(Some(KubeSource {
                namespace: args.pods_namespace.clone(),
                selector,
                inference_pool: pool.clone(),
                port: args.pods_port,
                read_nodes: false,
            }))
        }
    }
}

/// The live config from the flags and the cluster file (`yaml`: its text, if one was
/// given); `None` when no source is configured. Inferred pods' config.json files are looked
/// up in `model_dir` (`--model-dir`) among other places.
pub fn live_config(
    args: &LiveArgs,
    cluster: &ClusterConfig,
    yaml: Option<&str>,
    model_dir: Option<&Path>,
) -> Result<Option<LiveConfig>, LiveArgError> {
    let mut sources = match yaml {
        Some(text) => sources_from_yaml(text, cluster).map_err(|err| (err.field, err.reason))?,
        None => Vec::new(),
    };
    let yaml_sources = sources.len();
    let kv = kv_endpoints(args)?;
    push_flag_sources(args, cluster, kv, &mut sources)?;
    if sources.is_empty() {
        return Ok(None);
    }
    let text = yaml.unwrap_or(crate::cluster::spec::DEFAULT_CLUSTER_YAML);
    for (index, source) in sources.iter_mut().enumerate() {
        let explicit = explicit_limits(text, &source.name);
        apply_vllm_batch_defaults(&mut source.template, explicit);
        let Discovery::Kubernetes(kube) = &mut source.discovery else {
            continue;
        };
        let infers = match args.infer {
            InferMode::Off => false,
            InferMode::On => true,
            InferMode::Auto => yaml.is_none() && index >= yaml_sources,
        };
        if infers {
            kube.read_nodes = true;
            source.infer = Some(InferSpec {
                explicit: yaml.map_or_else(Vec::new, |text| explicit_fields(text, &source.name)),
            });
        }
    }
    let default_gpu = match &args.default_gpu {
        None => None,
        Some(name) => Some(
            crate::catalog::gpu(name)
                .map_err(|err| ("default-gpu".to_owned(), err.to_string()))?
                .name,
        ),
    };
    let infer_options = InferOptions {
        model_dir: model_dir.map(Path::to_path_buf),
        hf_cache: args.hf_cache.clone().or_else(default_hf_cache),
        default_gpu,
    };
    preflight_kubernetes(&sources, yaml_sources)?;
    check_statics_listed_once(&sources)?;
    let max_metrics_age = positive(args.max_metrics_age_ms, "max-metrics-age-ms")?;
    let settings = TwinSettings {
        default_stale_policy: match args.stale_policy {
            StalePolicyArg::TreatSaturated => StalePolicy::TreatSaturated,
            StalePolicyArg::Exclude => StalePolicy::Exclude,
            StalePolicyArg::RollForward => StalePolicy::RollForward,
            StalePolicyArg::UseLast => StalePolicy::UseLast,
        },
        max_signal_age_us: u64::try_from(max_metrics_age.as_micros()).unwrap_or(u64::MAX),
        ..TwinSettings::defaults()
    };
    let mut config = LiveConfig::new(sources, cluster.clone(), settings);
    config.infer = infer_options;
    apply_timing_flags(args, max_metrics_age, &mut config)?;
    Ok(Some(config))
}

/// `--kv-events` / `--kv-replay` / `--kv-topic` / `--kv-dp-size`, checked.
fn kv_endpoints(args: &LiveArgs) -> Result<Option<KvEndpoints>, LiveArgError> {
    let Some(events) = &args.kv_events else {
        return Ok(None);
    };
    check_endpoint(events, "kv-events").map_err(|err| (err.field, err.reason))?;
    if let Some(replay) = &args.kv_replay {
        check_endpoint(replay, "kv-replay").map_err(|err| (err.field, err.reason))?;
    }
    if args.kv_dp_size == 0 {
        return Err(("kv-dp-size".to_owned(), "must be at least 1".to_owned()));
    }
    Ok(Some(KvEndpoints {
        events: events.clone(),
        replay: args.kv_replay.clone(),
        topic: args.kv_topic.clone(),
        dp_size: args.kv_dp_size,
    }))
}

/// The sources given by flags (`--pods`, `--pods-dns`, `--pods-selector`,
/// `--inference-pool`), appended to `sources` as the cluster file's first pool, whose engine
/// settings they take; `kv` is their KV-event endpoints (an error without a flag source).
fn push_flag_sources(
    args: &LiveArgs,
    cluster: &ClusterConfig,
    kv: Option<KvEndpoints>,
    sources: &mut Vec<LiveSource>,
) -> Result<(), LiveArgError> {
    let mut flag_sources = Vec::new();
    if let Some(pods) = &args.pods {
        flag_sources.push(Discovery::Static(
            parse_pods(pods, "pods").map_err(|err| (err.field, err.reason))?,
        ));
    }
    if let Some(dns) = &args.pods_dns {
        flag_sources.push(parse_dns(dns, "pods-dns").map_err(|err| (err.field, err.reason))?);
    }
    if let Some(kube) = kube_source(args)? {
        flag_sources.push(Discovery::Kubernetes(kube));
    }
    if flag_sources.is_empty() {
        if kv.is_some() {
            return Err((
                "kv-events".to_owned(),
                "needs --pods, --pods-dns, --pods-selector or --inference-pool".to_owned(),
            ));
        }
        return Ok(());
    }
    let first_pool = cluster
        .instances
        .first()
        .and_then(|instance| {
            instance
                .id
                .rsplit_once('-')
                .map(|(pool, _)| pool.to_owned())
        })
        .and_then(|pool| pool_template(cluster, &pool).map(|template| (pool, template)));
    let (pool, template) = first_pool.ok_or_else(|| {
        (
            "pods".to_owned(),
            "the cluster file has no pool to take engine settings from".to_owned(),
        )
    })?;
    for discovery in flag_sources {
        sources.push(LiveSource {
            name: pool.clone(),
            discovery,
            template: template.clone(),
            kv: kv.clone(),
            scrape_interval: None,
            infer: None,
        });
    }
    Ok(())
}

/// Kubernetes sources: the kubeconfig loads and a named InferencePool exists (errors name
/// the YAML source or the flag; the first `yaml_sources` came from the cluster file).
fn preflight_kubernetes(sources: &[LiveSource], yaml_sources: usize) -> Result<(), LiveArgError> {
    for (index, source) in sources.iter().enumerate() {
        if let Discovery::Kubernetes(kube) = &source.discovery {
            let field = if index < yaml_sources {
                format!("sources[{index}].kubernetes")
            } else if kube.inference_pool.is_some() {
                "inference-pool".to_owned()
            } else {
                "pods-selector".to_owned()
            };
            crate::live::k8s::preflight(kube, &field)?;
        }
    }
    Ok(())
}

/// No static pod is listed by two sources.
fn check_statics_listed_once(sources: &[LiveSource]) -> Result<(), LiveArgError> {
    let mut statics: Vec<&String> = sources
        .iter()
        .filter_map(|s| match &s.discovery {
            Discovery::Static(pods) => Some(pods),
            Discovery::Dns { .. } | Discovery::Kubernetes(_) => None,
        })
        .flatten()
        .collect();
    let count = statics.len();
    statics.sort();
    statics.dedup();
    if statics.len() != count {
        return Err((
            "pods".to_owned(),
            "a pod is listed by two sources".to_owned(),
        ));
    }
    Ok(())
}

/// The intervals, timeouts and ages the flags set (each positive, the watch timeout in
/// 1..=3600 s).
fn apply_timing_flags(
    args: &LiveArgs,
    max_metrics_age: Duration,
    config: &mut LiveConfig,
) -> Result<(), LiveArgError> {
    config.scrape_interval = positive(args.scrape_interval_ms, "scrape-interval-ms")?;
    config.scrape_timeout = positive(args.scrape_timeout_ms, "scrape-timeout-ms")?;
    config.dns_interval = positive(args.dns_interval_ms, "dns-interval-ms")?;
    config.publish_interval = positive(args.publish_interval_ms, "publish-interval-ms")?;
    config.retire_after = Duration::from_millis(args.retire_after_ms);
    if !(1..=3600).contains(&args.kube_watch_timeout_s) {
        return Err((
            "kube-watch-timeout-s".to_owned(),
            "must be in 1..=3600 seconds".to_owned(),
        ));
    }
    config.kube = crate::live::k8s::KubeLimits {
        watch_timeout: Duration::from_secs(args.kube_watch_timeout_s),
    };
    config.max_age = MaxAges {
        metrics: max_metrics_age,
        kv_events: (args.max_kv_age_ms > 0).then(|| Duration::from_millis(args.max_kv_age_ms)),
    };
    Ok(())
}
