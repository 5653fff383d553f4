"""Checks of Kubernetes manifests shared by tests/python/test_deploy.py and
test_llmd_router.py: validation (kubernetes-validate --strict at a pinned version; the
Prometheus Operator's and the Inference Extension's objects against the subset of their CRD
schema used here), `ditto serve --check-config` on a rendered container, the Downward API as
the kubelet resolves it, an EndpointPickerConfig's references, and `kubectl kustomize`.
"""

import os
import re
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest

from conftest import BINARY, ROOT

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion >=1.27; native gRPC
# probes are GA since 1.27); pinned so a schema update cannot change the verdict silently.
KUBE_VERSION = "1.30.0"


# The fields of the Prometheus Operator's CRDs (monitoring.coreos.com/v1) the chart uses,
# strict like kubernetes-validate --strict: an unknown or misspelt field fails.
METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}
SELECTOR = {
    "type": "object",
    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
    "additionalProperties": False,
}
DURATION = {"type": "string", "pattern": "^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$"}
CRD_SCHEMAS = {
    "ServiceMonitor": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "ServiceMonitor"},
            "metadata": METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "additionalProperties": False,
                "properties": {
                    "selector": SELECTOR,
                    "namespaceSelector": {
                        "type": "object",
                        "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                        "additionalProperties": False,
                    },
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string"},
                                "interval": DURATION,
                                "scrapeTimeout": DURATION,
                                "scheme": {"enum": ["http", "https"]},
                                "tlsConfig": {
                                    "type": "object",
                                    "properties": {"insecureSkipVerify": {"type": "boolean"}},
                                    "additionalProperties": False,
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "PodMonitor": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PodMonitor"},
            "metadata": METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", "podMetricsEndpoints"],
                "additionalProperties": False,
                "properties": {
                    "selector": SELECTOR,
                    "podMetricsEndpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["port"],
                            "additionalProperties": False,
                            "properties": {"port": {"type": "string"}, "path": {"type": "string"}, "interval": DURATION},
                        },
                    },
                },
            },
        },
    },
    # Gateway API Inference Extension's InferencePool (inference.networking.k8s.io/v1), the
    # fields the router chart renders.
    "InferencePool": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "inference.networking.k8s.io/v1"},
            "kind": {"const": "InferencePool"},
            "metadata": METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", "targetPorts", "endpointPickerRef"],
                "additionalProperties": False,
                "properties": {
                    "selector": SELECTOR,
                    "targetPorts": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["number"],
                            "additionalProperties": False,
                            "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}},
                        },
                    },
                    "appProtocol": {"type": "string"},
                    "endpointPickerRef": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "port": {
                                "type": "object",
                                "required": ["number"],
                                "additionalProperties": False,
                                "properties": {"number": {"type": "integer"}},
                            },
                            "failureMode": {"enum": ["FailOpen", "FailClose"]},
                        },
                    },
                },
            },
        },
    },
    "PrometheusRule": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PrometheusRule"},
            "metadata": METADATA,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "groups": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name", "rules"],
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "rules": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["alert", "expr"],
                                        "additionalProperties": False,
                                        "properties": {
                                            "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                                            "expr": {"type": "string", "minLength": 1},
                                            "for": DURATION,
                                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                                        },
                                    },
                                },
                            },
                        },
                    }
                },
            },
        },
    },
}


def validate(obj, where):
    """kubernetes-validate --strict at the pinned version, or the CRD subset schema."""
    try:
        if obj["apiVersion"].startswith(("monitoring.coreos.com/", "inference.networking.k8s.io/")):
            jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as err:
        raise AssertionError(f"{where}: {obj['kind']}/{obj['metadata'].get('name')}: {err}") from err


def check_config(spec, cluster_yaml, tmp_path):
    """Runs a rendered container's flags and plain env with `cluster_yaml` through the binary."""
    file = tmp_path / "cluster.yaml"
    file.write_text(cluster_yaml)
    env = {key: value for key, value in os.environ.items() if not key.startswith("DITTO_")}
    env.update({e["name"]: e["value"] for e in spec.get("env", []) if "value" in e})
    result = subprocess.run(
        [BINARY, "serve", *spec["args"], "--check-config", str(file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, result.stdout, result.stderr


def plugin_config_problems(config):
    """What keeps an EndpointPickerConfig from loading: a pluginRef naming no plugin, a plugin
    without a type, two plugins of one name (a plugin's name is its `name`, else its `type`)."""
    problems = []
    if config.get("kind") != "EndpointPickerConfig":
        problems.append(f"kind {config.get('kind')!r}")
    names = []
    for plugin in config.get("plugins", []):
        if "type" not in plugin:
            problems.append(f"plugin without a type: {plugin}")
        names.append(plugin.get("name", plugin.get("type")))
    problems += [f"plugin {n!r} defined twice" for n in set(names) if names.count(n) > 1]
    for profile in config.get("schedulingProfiles", []):
        for ref in profile.get("plugins", []):
            if ref["pluginRef"] not in names:
                problems.append(f"profile {profile['name']!r}: pluginRef {ref['pluginRef']!r} names no plugin")
    return problems


def resolved_env(container, pod_metadata, namespace):
    """A container's env as the kubelet sets it: plain values, and the Downward API's
    `metadata.namespace`, `metadata.name` and `metadata.labels['KEY']` resolved."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        path = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path or "")
        if path == "metadata.namespace":
            env[item["name"]] = namespace
        elif path == "metadata.name":
            env[item["name"]] = pod_metadata.get("name", "pod-0")
        elif label:
            # A label the pod does not have resolves to the empty string.
            env[item["name"]] = pod_metadata.get("labels", {}).get(label.group(1), "")
    return env


def check_sidecar_flags(ditto, pod_metadata, namespace, tmp_path, monkeypatch, cluster_yaml=None):
    """ditto's flags and env in the EPP pod (Downward API resolved) through `ditto serve
    --check-config` with `cluster_yaml` (the file DITTO_CONFIG names in the pod; without one,
    the embedded default cluster's file) and a kubeconfig no API server answers:
    (exit code, stdout, stderr)."""
    env = resolved_env(ditto, pod_metadata, namespace)
    env.pop("DITTO_CONFIG", None)
    spec = {"args": ditto["args"], "env": [{"name": k, "value": v} for k, v in env.items()]}
    monkeypatch.setenv("KUBECONFIG", dead_kubeconfig(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    if cluster_yaml is None:
        cluster_yaml = open(os.path.join(ROOT, "data", "clusters", "default.yaml"), encoding="utf-8").read()
    return check_config(spec, cluster_yaml, tmp_path)


def kustomize(directory):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (for `kubectl kustomize`) is not installed; the files were validated one by one")
    version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"Kustomize Version: v(\d+)", version)
    if found is None or int(found.group(1)) < 5:
        pytest.skip(f"kubectl's kustomize is older than v5 (components, regex targets): {version!r}")
    return subprocess.run(
        [kubectl, "kustomize", directory], capture_output=True, text=True, timeout=60, check=True
    ).stdout


def dead_kubeconfig(tmp_path):
    """A kubeconfig naming a closed loopback port: loads, but no API server answers."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:9\n"
        "users:\n- name: u\n  user: {}\ncontexts:\n- name: c\n  context: {cluster: c, user: u, namespace: llm-d}\n"
        "current-context: c\n"
    )
    return str(path)
