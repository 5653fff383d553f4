//! Pure decisions on Kubernetes objects: whether a pod is mirrored (and where its metrics
//! are), and what an InferencePool selects. No I/O: the watch task feeds objects in.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use super::selector::LabelSelector;
use crate::cluster::config::InstanceRole;

/// What the live mirror makes of one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// Instance id: `namespace/name` (stable while the pod keeps its name, whatever its IP).
    pub id: String,
    /// `ip:port` of its metrics (`[ip]:port` for IPv6), once it has an IP.
    pub address: Option<String>,
    /// Why it is not served (`None`: Ready, Running, not terminating, with an IP).
    pub problem: Option<String>,
    /// What its spec says about its vLLM (model, TP, GPUs, engine args, node).
    pub facts: crate::live::infer::PodFacts,
    /// What its node's GPU label says (read only when the source infers its pool).
    pub node_gpu: Option<crate::live::infer::NodeGpu>,
    /// Its `llm-d.ai/role` label (`prefill`, `decode`, `both`); `None` when absent or not one
    /// of those (the instance keeps its pool's role).
    pub role: Option<InstanceRole>,
}

/// llm-d's pod role label (llm-d-router's `decode-filter` / `prefill-filter` read it).
pub const ROLE_LABEL: &str = "llm-d.ai/role";

/// The role a pod's labels give it (see [`PodView::role`]).
pub fn pod_role(labels: &BTreeMap<String, String>) -> Option<InstanceRole> {
    match labels
        .get(ROLE_LABEL)
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        Some("prefill") => Some(InstanceRole::Prefill),
        Some("decode") => Some(InstanceRole::Decode),
        Some("both") | Some("prefill-decode") => Some(InstanceRole::Both),
        _ => None,
    }
}

/// The instance id of a pod: `namespace/name`.
pub fn pod_id(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The longest pod IP taken (an IPv6 literal with an embedded IPv4 is 45 characters).
pub const MAX_IP_LEN: usize = 45;

/// A pod's `status.podIP` as an IP address: an IPv4 or IPv6 literal and nothing else (no
/// host name, no spaces, at most [`MAX_IP_LEN`] characters), so a pod never sends ditto to
/// DNS. The error is the stale reason, with the value shown (cut to 64 characters).
pub fn pod_ip(raw: &str) -> Result<std::net::IpAddr, String> {
    let parsed = (raw.len() <= MAX_IP_LEN)
        .then(|| raw.parse::<std::net::IpAddr>().ok())
        .flatten();
    parsed.ok_or_else(|| {
        let shown: String = raw.chars().take(64).collect();
        format!("pod IP {shown:?} is not an IP address")
    })
}

/// Decides about one pod as the EPP does: mirrored when it matches `selector`, is Running
/// and Ready (condition `Ready=True`), has a pod IP and is not being deleted. `None` for an
/// object without a name.
pub fn view(
    pod: &Pod,
    default_namespace: &str,
    selector: &LabelSelector,
    port: u16,
) -> Option<PodView> {
    let name = pod.metadata.name.as_deref()?;
    let namespace = pod
        .metadata
        .namespace
        .as_deref()
        .unwrap_or(default_namespace);
    let status = pod.status.as_ref();
    let ip = status
        .and_then(|s| s.pod_ip.as_deref())
        .filter(|ip| !ip.is_empty());
    let parsed = ip.map(pod_ip);
    let address = match &parsed {
        Some(Ok(ip)) => Some(std::net::SocketAddr::new(*ip, port).to_string()),
        _ => None,
    };
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Unknown");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let problem = if !selector.matches(labels) {
        Some("pod no longer matches the selector".to_owned())
    } else if pod.metadata.deletion_timestamp.is_some() {
        Some("pod terminating".to_owned())
    } else if phase != "Running" {
        Some(format!("pod phase {phase}"))
    } else if !ready {
        Some("pod not Ready".to_owned())
    } else if let Some(Err(reason)) = parsed {
        Some(reason)
    } else if address.is_none() {
        Some("pod has no IP".to_owned())
    } else {
        None
    };
    Some(PodView {
        id: pod_id(namespace, name),
        address,
        problem,
        facts: crate::live::infer::pod_facts(pod),
        node_gpu: None,
        role: pod_role(labels),
    })
}

/// Which API version an InferencePool is read with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolVersion {
    /// `inference.networking.k8s.io/v1`: `spec.selector.matchLabels`, `spec.targetPorts[].number`.
    V1,
    /// `inference.networking.x-k8s.io/v1alpha2`: `spec.selector` (a map), `spec.targetPortNumber`.
    V1Alpha2,
}

impl PoolVersion {
    /// (group, version), in the order they are tried.
    pub const ALL: [PoolVersion; 2] = [PoolVersion::V1, PoolVersion::V1Alpha2];

    /// API group.
    pub fn group(self) -> &'static str {
        match self {
            PoolVersion::V1 => "inference.networking.k8s.io",
            PoolVersion::V1Alpha2 => "inference.networking.x-k8s.io",
        }
    }

    /// API version.
    pub fn version(self) -> &'static str {
        match self {
            PoolVersion::V1 => "v1",
            PoolVersion::V1Alpha2 => "v1alpha2",
        }
    }
}

/// What an InferencePool selects: its pods' labels and their target port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolTarget {
    /// The pods' labels (`matchLabels`).
    pub selector: LabelSelector,
    /// The first target port.
    pub port: u16,
}

/// Reads an InferencePool object's spec (`object` is its JSON).
pub fn pool_target(object: &Value, version: PoolVersion) -> Result<PoolTarget, String> {
    let spec = object.get("spec").ok_or("no spec")?;
    let (labels, port) = match version {
        PoolVersion::V1 => (
            spec.pointer("/selector/matchLabels"),
            spec.pointer("/targetPorts/0/number"),
        ),
        PoolVersion::V1Alpha2 => (spec.get("selector"), spec.get("targetPortNumber")),
    };
    let labels: BTreeMap<String, String> = match labels {
        Some(value) => {
            serde_json::from_value(value.clone()).map_err(|err| format!("spec selector: {err}"))?
        }
        None => return Err("spec has no selector labels".to_owned()),
    };
    if labels.is_empty() {
        return Err("spec selector is empty".to_owned());
    }
    let selector = LabelSelector::parse(&LabelSelector::from_labels(&labels).to_string())
        .map_err(|err| format!("spec selector: {err}"))?;
    let port = port
        .and_then(Value::as_u64)
        .and_then(|port| u16::try_from(port).ok())
        .filter(|port| *port > 0)
        .ok_or("spec has no target port")?;
    Ok(PoolTarget { selector, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn ready_pod(name: &str, ip: &str) -> Value {
        serde_json::json!({
            "metadata": {"name": name, "namespace": "llm-d", "labels": {"app": "vllm"}},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True"}]}
        })
    }

    #[test]
    fn a_ready_running_pod_with_an_ip_is_mirrored_under_its_name() {
        let selector = LabelSelector::parse("app=vllm").unwrap();
        let view = view(&pod(ready_pod("vllm-0", "10.1.2.3")), "x", &selector, 8200).unwrap();
        assert_eq!(view.id, "llm-d/vllm-0");
        assert_eq!(view.address.as_deref(), Some("10.1.2.3:8200"));
        assert_eq!(view.problem, None);
        let v6 = super::view(&pod(ready_pod("vllm-1", "fd00::5")), "x", &selector, 8000).unwrap();
        assert_eq!(v6.address.as_deref(), Some("[fd00::5]:8000"));
    }

    #[test]
    fn the_llm_d_role_label_gives_the_role() {
        let selector = LabelSelector::parse("app=vllm").unwrap();
        for (label, role) in [
            (Some("prefill"), Some(InstanceRole::Prefill)),
            (Some("Decode"), Some(InstanceRole::Decode)),
            (Some("both"), Some(InstanceRole::Both)),
            (Some("encode"), None),
            (None, None),
        ] {
            let mut json = ready_pod("vllm-0", "10.1.2.3");
            if let Some(label) = label {
                json["metadata"]["labels"][ROLE_LABEL] = label.into();
            }
            let view = view(&pod(json), "x", &selector, 8000).unwrap();
            assert_eq!(view.role, role, "{label:?}");
        }
    }

    #[test]
    fn pending_not_ready_terminating_unmatched_and_ip_less_pods_are_not_served() {
        let selector = LabelSelector::parse("app=vllm").unwrap();
        let cases: Vec<(Value, &str)> = vec![
            (
                {
                    let mut p = ready_pod("a", "10.0.0.1");
                    p["status"]["conditions"][0]["status"] = "False".into();
                    p
                },
                "pod not Ready",
            ),
            (
                {
                    let mut p = ready_pod("a", "10.0.0.1");
                    p["status"]["phase"] = "Pending".into();
                    p
                },
                "pod phase Pending",
            ),
            (
                {
                    let mut p = ready_pod("a", "10.0.0.1");
                    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
                    p
                },
                "pod terminating",
            ),
            (
                {
                    let mut p = ready_pod("a", "10.0.0.1");
                    p["metadata"]["labels"]["app"] = "other".into();
                    p
                },
                "pod no longer matches the selector",
            ),
            (
                {
                    let mut p = ready_pod("a", "");
                    p["status"]["podIP"] = Value::Null;
                    p
                },
                "pod has no IP",
            ),
        ];
        for (object, expected) in cases {
            let view = view(&pod(object), "x", &selector, 8000).unwrap();
            assert_eq!(view.problem.as_deref(), Some(expected));
        }
        let nameless = pod(serde_json::json!({"metadata": {}}));
        assert_eq!(view(&nameless, "x", &selector, 8000), None);
    }

    #[test]
    fn a_pod_ip_must_be_an_ip_literal() {
        let selector = LabelSelector::parse("app=vllm").unwrap();
        for bad in [
            "not-an-ip",
            "999.1.1.1",
            "localhost",
            "127.0.0.1 evil",
            " 10.0.0.1",
            "fe80::1%eth0",
            &"1".repeat(10_000),
        ] {
            let view = view(&pod(ready_pod("a", bad)), "x", &selector, 8000).unwrap();
            assert_eq!(view.address, None, "{bad:?}");
            let problem = view.problem.unwrap();
            assert!(problem.contains("is not an IP address"), "{problem}");
            assert!(problem.len() < 120, "{problem}");
        }
        assert!(pod_ip("10.1.2.3").is_ok() && pod_ip("fd00::5").is_ok());
    }

    #[test]
    fn reads_both_inference_pool_versions() {
        let v1 = serde_json::json!({"spec": {
            "selector": {"matchLabels": {"app": "vllm", "llm-d.ai/role": "decode"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}});
        let target = pool_target(&v1, PoolVersion::V1).unwrap();
        assert_eq!(target.port, 8000);
        assert_eq!(target.selector.to_string(), "app=vllm,llm-d.ai/role=decode");
        let alpha = serde_json::json!({"spec": {
            "selector": {"app": "vllm"}, "targetPortNumber": 8200,
            "extensionRef": {"name": "epp"}}});
        let target = pool_target(&alpha, PoolVersion::V1Alpha2).unwrap();
        assert_eq!(
            (target.port, target.selector.to_string()),
            (8200, "app=vllm".to_owned())
        );
        assert!(pool_target(&alpha, PoolVersion::V1).is_err());
        assert!(pool_target(&serde_json::json!({}), PoolVersion::V1).is_err());
    }
}
