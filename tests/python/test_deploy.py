"""The Helm chart (helm/ditto) and the kustomize manifests (deploy/) against Helm's own engine,
the Kubernetes API schemas and the real binary.

The chart is rendered with helm-python-sdk (Helm v4's Go engine in a shared library) with
default values and with every toggle on, and linted strictly. Every rendered object and
every manifest in deploy/ is validated with kubernetes-validate --strict against a pinned
Kubernetes version (Prometheus Operator objects, which it has no schema for, against the
subset of their CRD schema the chart uses). The container flags and the ConfigMap's
cluster.yaml that the chart and the manifests render go through the real binary's
`ditto serve --check-config`, so chart, manifests and binary cannot drift apart.
"""

import copy
import os
import re
import subprocess
import time
import urllib.request

import helm_python as helm
import jsonschema
import pytest
import yaml

from conftest import BINARY, ROOT, Server
from ditto.v1 import twin_pb2 as pb
from k8s_manifests import (
    KUBE_VERSION,
    check_config,
    check_sidecar_flags,
    dead_kubeconfig,
    kustomize,
    plugin_config_problems,
    resolved_env,
    validate,
)

CHART = os.path.join(ROOT, "helm", "ditto")
DEPLOY = os.path.join(ROOT, "deploy")
RELEASE, NAMESPACE = "ditto", "llm-d"


def all_toggles_on():
    return {
        "replicaCount": 2,
        "mirror": {"enabled": True, "podsDns": "vllm-headless.llm-d.svc.cluster.local", "kvReplayPort": 5560, "kvDpSize": 2},
        "monitoring": {
            "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
        },
        "tracing": {"enabled": True, "otlpEndpoint": "http://otel-collector.monitoring:4317", "samplingRatio": "0.25"},
        "tls": {"enabled": True, "secretName": "ditto-tls", "clientCaSecretName": "ditto-client-ca"},
        "auth": {"enabled": True, "secretName": "ditto-token", "secretKey": "token"},
        "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
        "forecast": {"enabled": True, "intervalSeconds": 15, "targetAttainment": 0.9},
        "serviceAccount": {"create": True, "annotations": {"example.com/role": "ditto"}},
        "extraArgs": ["--stream-in-flight=16"],
        "extraEnv": [{"name": "DITTO_SNAPSHOT_HISTORY", "value": "32"}],
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm-d", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "ditto"}},
                        },
                    }
                ]
            }
        },
        "podAnnotations": {"example.com/team": "inference"},
        "probes": {"grpc": True},
    }


def http_probes():
    return {"probes": {"grpc": False}}


SCENARIOS = {"defaults": dict, "all-toggles-on": all_toggles_on, "http-probes": http_probes}


def render(values):
    """{(kind, name): object} of the chart rendered with `values` (NOTES.txt left out)."""
    rendered = helm.Chart.load(CHART).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = {}
    for path, text in rendered.items():
        if path.endswith("NOTES.txt"):
            assert RELEASE in text
            continue
        for document in yaml.safe_load_all(text):
            if document:
                objects[(document["kind"], document["metadata"]["name"])] = document
    return objects


def deployment(objects):
    (found,) = [obj for (kind, _), obj in objects.items() if kind == "Deployment"]
    return found


def container(pod_spec, name="ditto"):
    (found,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return found


def test_helm_lint_strict_is_clean_with_defaults_and_every_toggle():
    for name, values in SCENARIOS.items():
        report = helm.lint(CHART, values(), strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not problems and not report["errors"], (name, report)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_rendered_object_validates(scenario):
    objects = render(SCENARIOS[scenario]())
    for obj in objects.values():
        validate(obj, f"chart ({scenario})")
    kinds = {kind for kind, _ in objects}
    assert {"ConfigMap", "Deployment", "Service", "ServiceAccount"} <= kinds, kinds
    toggled = {"ServiceMonitor", "PrometheusRule", "PodDisruptionBudget"}
    if scenario == "all-toggles-on":
        assert toggled <= kinds, kinds
    else:
        assert not toggled & kinds, kinds


def test_the_defaults_render_a_restricted_drain_aware_pod():
    objects = render({})
    pod = deployment(objects)["spec"]["template"]["spec"]
    ditto = container(pod)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    security = ditto["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert {p["name"]: p["containerPort"] for p in ditto["ports"]} == {"grpc": 9010, "http-metrics": 9011}
    service = objects[("Service", RELEASE)]
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"grpc": 9010, "http-metrics": 9011}
    assert ditto["readinessProbe"]["grpc"]["port"] == 9010
    assert ditto["startupProbe"]["grpc"]["port"] == 9010
    assert ditto["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # --config names the file the ConfigMap volume holds.
    assert "--config=/etc/ditto/cluster.yaml" in ditto["args"]
    (mount,) = [m for m in ditto["volumeMounts"] if m["name"] == "config"]
    assert mount["mountPath"] == "/etc/ditto"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    assert ("ConfigMap", volume["configMap"]["name"]) in objects
    assert "cluster.yaml" in objects[("ConfigMap", volume["configMap"]["name"])]["data"]
    drain_ms = int(next(a for a in ditto["args"] if a.startswith("--drain-ms=")).split("=")[1])
    max_call_ms = int(next(a for a in ditto["args"] if a.startswith("--max-call-ms=")).split("=")[1])
    assert max_call_ms < drain_ms < pod["terminationGracePeriodSeconds"] * 1000


def test_toggles_wire_what_they_name():
    objects = render(all_toggles_on())
    pod = deployment(objects)["spec"]["template"]["spec"]
    ditto = container(pod)
    env = {e["name"]: e.get("value") for e in ditto["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4317"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
    assert "k8s.pod.name=$(POD_NAME)" in env["OTEL_RESOURCE_ATTRIBUTES"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in ditto["volumeMounts"]}
    assert volumes["tls"]["secret"]["secretName"] == "ditto-tls"
    assert env["DITTO_TLS_CERT_FILE"].startswith(mounts["tls"] + "/")
    assert volumes["tls-client-ca"]["secret"]["secretName"] == "ditto-client-ca"
    assert volumes["auth"]["secret"]["secretName"] == "ditto-token"
    assert env["DITTO_AUTH_TOKEN_FILE"] == mounts["auth"] + "/token"
    assert not any("token" in arg for arg in ditto["args"]), "a token never shows in ps"
    # kubelet's gRPC probe cannot speak TLS: with TLS the probes are HTTPS.
    assert ditto["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert "--pods-dns=vllm-headless.llm-d.svc.cluster.local:8000" in ditto["args"]
    # llm-d's event port by default; the replay port and DP size as set.
    assert "--kv-events=tcp://{ip}:5556" in ditto["args"] and "--kv-replay=tcp://{ip}:5560" in ditto["args"]
    assert "--kv-dp-size=2" in ditto["args"] and not any(a.startswith("--kv-topic") for a in ditto["args"])
    assert "--stale-policy=treat-saturated" in ditto["args"]
    assert "--stream-in-flight=16" in ditto["args"]
    assert "--forecast-interval=15" in ditto["args"] and "--forecast-target-attainment=0.9" in ditto["args"]
    monitor = objects[("ServiceMonitor", RELEASE)]
    service_ports = {p["name"] for p in objects[("Service", RELEASE)]["spec"]["ports"]}
    assert monitor["spec"]["endpoints"][0]["port"] in service_ports
    assert monitor["metadata"]["labels"]["release"] == "prometheus"


def bad_values_error(values):
    with pytest.raises(helm.HelmError) as caught:
        render(values)
    return str(caught.value)


def test_bad_values_are_refused_naming_the_value():
    assert "pullPolicyy" in bad_values_error({"image": {"pullPolicyy": "Always"}})
    assert "replicaCount" in bad_values_error({"replicaCount": "one"})
    assert "tls.secretName" in bad_values_error({"tls": {"enabled": True}})
    assert "auth.secretName" in bad_values_error({"auth": {"enabled": True}})
    assert "mirror.podsDns" in bad_values_error({"mirror": {"enabled": True}})
    assert "lifecycle.drainMs" in bad_values_error({"limits": {"maxCallMs": 60000}})
    assert "terminationGracePeriodSeconds" in bad_values_error({"lifecycle": {"drainMs": 50000}})


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_flags_and_configmap_pass_check_config(scenario, tmp_path):
    values = SCENARIOS[scenario]()
    # TLS and token files exist only in a pod.
    values.pop("tls", None)
    values.pop("auth", None)
    objects = render(values)
    pod = deployment(objects)["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    cluster_yaml = objects[("ConfigMap", volume["configMap"]["name"])]["data"]["cluster.yaml"]
    code, stdout, stderr = check_config(container(pod), cluster_yaml, tmp_path)
    assert code == 0, stderr
    assert "ok (4 instances" in stdout
    # With the mirror on, its flags (DNS name, KV-event templates, policy) were checked too.
    mirrored = values.get("mirror", {}).get("enabled", False)
    assert ("live mirror: 1 pod source" in stdout) == mirrored, stdout


def test_a_bad_cluster_value_fails_check_config_naming_the_field(tmp_path):
    values = {"cluster": copy.deepcopy(yaml.safe_load(open(os.path.join(CHART, "values.yaml")))["cluster"])}
    values["cluster"]["pools"][0]["tp"] = 0
    objects = render(values)
    ditto = container(deployment(objects)["spec"]["template"]["spec"])
    code, _, stderr = check_config(ditto, objects[("ConfigMap", RELEASE)]["data"]["cluster.yaml"], tmp_path)
    assert code == 2, stderr
    assert "pools[0].tp" in stderr


def test_alerts_name_metrics_the_binary_exports():
    # The forecast loop on, as the alerts assume with every toggle on.
    server = Server(extra_args=["--forecast-interval", "0.2", "--forecast-horizon-s", "10"])
    try:
        server.wait_serving()
        server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10)
        deadline = time.monotonic() + 60
        exported = set()
        while "ditto_forecast_rounds_total" not in exported and time.monotonic() < deadline:
            time.sleep(0.05)
            with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10) as reply:
                exported = set(re.findall(r"^(ditto_[a-z_]+)", reply.read().decode(), re.MULTILINE))
    finally:
        code, output = server.terminate(), server.output()
        os.unlink(server.log.name)
        assert code == 0, output
    rule = render(all_toggles_on())[("PrometheusRule", RELEASE)]
    used = {name for group in rule["spec"]["groups"] for r in group["rules"] for name in re.findall(r"ditto_[a-z_]+", r["expr"])}
    assert "ditto_forecast_rounds_total" in used and "ditto_stale_instances" in used, used
    assert used <= exported, used - exported


def deploy_files():
    for directory, _, files in os.walk(DEPLOY):
        for name in sorted(files):
            if name.endswith((".yaml", ".yml")):
                yield os.path.join(directory, name)


def test_every_file_in_deploy_validates(tmp_path):
    seen = set()
    for path in deploy_files():
        where = os.path.relpath(path, ROOT)
        with open(path, encoding="utf-8") as handle:
            documents = [d for d in yaml.safe_load_all(handle) if d is not None]
        assert documents, where
        for document in documents:
            if isinstance(document, list):
                # A JSON 6902 patch: every value must be valid where it goes.
                for op in document:
                    assert op["op"] in ("add", "replace", "remove") and op["path"].startswith("/spec/template/spec/"), (where, op)
                    field = op["path"].split("/")[4]
                    if field == "containers":
                        pod = {"containers": [op["value"]]}
                    elif field == "volumes":
                        pod = {"containers": [{"name": "x", "image": "x"}], "volumes": [op["value"]]}
                    else:
                        pod = {"containers": [{"name": "x", "image": "x"}], field: op["value"]}
                    validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "patch"}, "spec": pod}, where)
                seen.add("patch")
            elif isinstance(document, dict) and path.endswith(".patch.yaml"):
                # A strategic merge patch: its containers, completed, must be valid.
                containers = document["spec"]["template"]["spec"]["containers"]
                pod = {"containers": [dict(c, image="x") for c in containers]}
                validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "patch"}, "spec": pod}, where)
                seen.add("patch")
            elif "router" in document:
                # Values for llm-d's router chart: the plugin config they add must load (every
                # pluginRef names a plugin) and be the one the EPP is told to read.
                epp = document["router"]["epp"]
                text = epp["pluginsCustomConfig"][epp["pluginsConfigFile"]]
                problems = plugin_config_problems(yaml.safe_load(text))
                assert not problems, (where, problems)
                assert document["router"]["latencyPredictor"]["enabled"] is False, where
                seen.add("router-values")
            elif "pools" in document:
                code, _, stderr = check_config({"args": []}, yaml.safe_dump(document), tmp_path)
                assert code == 0, f"{where}: {stderr}"
                seen.add("cluster")
            elif document.get("kind") in ("Kustomization", "Component"):
                base = os.path.dirname(path)
                listed = list(document.get("resources", [])) + list(document.get("components", []))
                listed += [p["path"] for p in document.get("patches", []) if "path" in p]
                listed += [f for g in document.get("configMapGenerator", []) for f in g.get("files", [])]
                for item in listed:
                    assert os.path.exists(os.path.join(base, item)), f"{where}: {item} is missing"
                seen.add("kustomization")
            else:
                validate(document, where)
                seen.add(document["kind"])
    assert {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler", "patch", "kustomization", "router-values", "PodMonitor", "InferencePool"} <= seen, seen


# The router chart's output (llm-d/llm-d-router config/charts, gateway mode) for release
# `prod-router` in namespace `inference-prod`, cut to the EPP Deployment and its InferencePool:
# neither the overlay's stand-in name nor its namespace.
ROUTER_EPP = """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: prod-router, namespace: inference-prod}
spec:
  targetPorts: [{number: 8000}]
  selector: {matchLabels: {app: vllm-qwen3-32b}}
  endpointPickerRef: {name: prod-router-epp, port: {number: 9002}, failureMode: FailOpen}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: prod-router-epp
  namespace: inference-prod
  labels: {app.kubernetes.io/name: prod-router-epp, llm-d.ai/igw-mode: llm-d-router-gateway}
spec:
  replicas: 1
  strategy: {type: Recreate}
  selector: {matchLabels: {llm-d-router-gateway: prod-router-epp}}
  template:
    metadata:
      labels: {llm-d-router-gateway: prod-router-epp, llm-d.ai/igw-mode: llm-d-router-gateway}
    spec:
      serviceAccountName: prod-router-epp
      terminationGracePeriodSeconds: 130
      containers:
        - name: epp
          image: ghcr.io/llm-d/llm-d-router:v0.8.0
          args: [--pool-name, prod-router, --pool-namespace, inference-prod, --config-file, /config/default-plugins.yaml]
          ports:
            - {name: grpc, containerPort: 9002}
            - {name: grpc-health, containerPort: 9003}
            - {name: metrics, containerPort: 9090}
          env:
            - name: NAMESPACE
              valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
          volumeMounts:
            - {name: plugins-config-volume, mountPath: /config}
      volumes:
        - name: plugins-config-volume
          configMap: {name: prod-router-epp}
"""


def test_the_epp_component_over_any_release_name_and_namespace(tmp_path, monkeypatch):
    work = tmp_path / "mine"
    work.mkdir()
    (work / "epp.yaml").write_text(ROUTER_EPP)
    component = os.path.relpath(os.path.join(DEPLOY, "components", "ditto-epp-sidecar"), work)
    (work / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [epp.yaml]\ncomponents: [{component}]\n"
    )
    objects = [d for d in yaml.safe_load_all(kustomize(str(work))) if d]
    for obj in objects:
        validate(obj, "kubectl kustomize (component over prod-router-epp)")
    (epp,) = [o for o in objects if o["kind"] == "Deployment"]
    assert epp["metadata"]["name"] == "prod-router-epp" and epp["metadata"]["namespace"] == "inference-prod"
    template = epp["spec"]["template"]
    pod = template["spec"]
    assert pod["terminationGracePeriodSeconds"] == 130, "the EPP's grace period is kept"
    assert epp["spec"]["strategy"] == {"type": "Recreate"}
    assert [c["name"] for c in pod["containers"]] == ["epp", "ditto"]
    ditto = container(pod)
    env = {e["name"]: e.get("value") for e in container(pod, "epp")["env"]}
    assert env["PREDICTION_SERVER_URL"] == "http://127.0.0.1:9011" and "NAMESPACE" in env
    # The release's pool, through the pod label the replacement set.
    ditto_env = resolved_env(ditto, template["metadata"], "inference-prod")
    assert ditto_env["DITTO_INFERENCE_POOL"] == "prod-router", ditto_env
    assert ditto_env["DITTO_PODS_NAMESPACE"] == "inference-prod", ditto_env
    # Every mount names a volume; ditto brings no ConfigMap of its own.
    volumes = {v["name"] for v in pod["volumes"]}
    for c in pod["containers"]:
        for mount in c.get("volumeMounts", []):
            assert mount["name"] in volumes, (c["name"], mount)
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"] == []
    drain_ms = int(next(a for a in ditto["args"] if a.startswith("--drain-ms=")).split("=")[1])
    assert drain_ms < pod["terminationGracePeriodSeconds"] * 1000
    code, stdout, stderr = check_sidecar_flags(ditto, template["metadata"], "inference-prod", tmp_path, monkeypatch)
    assert code == 0, stderr
    assert "live mirror: 1 pod source" in stdout, stdout


KUSTOMIZATIONS = ["base", "overlays/epp-sidecar", "examples/hpa"]


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_kustomize_output_validates_and_passes_check_config(directory, tmp_path, monkeypatch):
    rendered = kustomize(os.path.join(DEPLOY, directory))
    objects = [d for d in yaml.safe_load_all(rendered) if d]
    for obj in objects:
        validate(obj, f"kubectl kustomize deploy/{directory}")
    configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        pod = obj["spec"]["template"]["spec"]
        ditto = container(pod)
        mounts = [m for m in ditto.get("volumeMounts", []) if m["mountPath"] == "/etc/ditto"]
        if mounts:
            (volume,) = [v for v in pod["volumes"] if v["name"] == mounts[0]["name"]]
            cluster_yaml = configmaps[volume["configMap"]["name"]]["data"]["cluster.yaml"]
            code, _, stderr = check_config(ditto, cluster_yaml, tmp_path)
        else:
            # ditto in the EPP's pod: no cluster YAML, its pool from the Kubernetes API.
            metadata = obj["spec"]["template"]["metadata"]
            code, _, stderr = check_sidecar_flags(ditto, metadata, obj["metadata"]["namespace"], tmp_path, monkeypatch)
        assert code == 0, f"deploy/{directory}: {stderr}"
        drain_ms = int(next(a for a in ditto["args"] if a.startswith("--drain-ms=")).split("=")[1])
        assert drain_ms < pod["terminationGracePeriodSeconds"] * 1000


# --- Kubernetes discovery, models, volumes, PDB (issue 19) ------------------------------------

QWEN_CONFIG = os.path.join(ROOT, "tests", "data", "models", "qwen3-32b", "config.json")


def kube_discovery(**mirror):
    values = {
        "mirror": {"enabled": True, "metricsPort": 8200, **mirror},
        "models": {"qwen3-32b": open(QWEN_CONFIG).read()},
        "calibration": {"persistence": {"enabled": True, "existingClaim": "ditto-calibration"}},
        "extraVolumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "16Mi"}}],
        "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "podDisruptionBudget": {"enabled": True},
    }
    values["cluster"] = copy.deepcopy(yaml.safe_load(open(os.path.join(CHART, "values.yaml")))["cluster"])
    values["cluster"]["pools"][0].update({"model": "Qwen/Qwen3-32B", "gpu": "H200", "replicas": 1})
    return values


DISCOVERY = {
    "selector": lambda: kube_discovery(podsSelector="llm-d.ai/inferenceServing=true,llm-d.ai/role=decode", podsNamespace="llm-d"),
    "inference-pool": lambda: kube_discovery(inferencePool="qwen-pool"),
}


@pytest.mark.parametrize("mode", sorted(DISCOVERY))
def test_kubernetes_discovery_renders_rbac_lints_validates_and_passes_check_config(mode, tmp_path, monkeypatch):
    values = DISCOVERY[mode]()
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
    assert not [m for m in report["messages"] if m["severity"] >= 2] and not report["errors"], report
    objects = render(values)
    for obj in objects.values():
        validate(obj, f"chart (discovery {mode})")
    role = objects[("Role", f"{RELEASE}-discovery")]
    binding = objects[("RoleBinding", f"{RELEASE}-discovery")]
    assert role["metadata"]["namespace"] == "llm-d"
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules[(("",), ("pods",))] == {"get", "list", "watch"}
    pools = (("inference.networking.k8s.io", "inference.networking.x-k8s.io"), ("inferencepools",))
    assert (pools in rules) == (mode == "inference-pool"), rules
    account = objects[("ServiceAccount", RELEASE)]["metadata"]["name"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    pod = deployment(objects)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True, "discovery needs the service account token"
    ditto = container(pod)
    assert "--pods-port=8200" in ditto["args"]
    flag = "--pods-selector=llm-d.ai/inferenceServing=true,llm-d.ai/role=decode" if mode == "selector" else "--inference-pool=qwen-pool"
    assert flag in ditto["args"]
    # The models ConfigMap is mounted as --model-dir, one <name>/config.json per model.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in ditto["volumeMounts"]}
    assert f"--model-dir={mounts['models']}" in ditto["args"]
    models = objects[("ConfigMap", volumes["models"]["configMap"]["name"])]
    assert json_equal(models["data"]["qwen3-32b"], open(QWEN_CONFIG).read())
    assert volumes["models"]["configMap"]["items"] == [{"key": "qwen3-32b", "path": "qwen3-32b/config.json"}]
    assert volumes["calibration"]["persistentVolumeClaim"]["claimName"] == "ditto-calibration"
    assert f"--calibration-file={mounts['calibration']}/calibration.json" in ditto["args"]
    assert mounts["scratch"] == "/scratch" and "scratch" in volumes
    # The rendered flags and ConfigMap through the binary, the model dir materialised from the
    # ConfigMap as the kubelet would.
    model_dir = tmp_path / "models"
    for item in volumes["models"]["configMap"]["items"]:
        (model_dir / item["path"]).parent.mkdir(parents=True)
        (model_dir / item["path"]).write_text(models["data"][item["key"]])
    spec = dict(ditto)
    spec["args"] = [a if not a.startswith("--model-dir=") else f"--model-dir={model_dir}" for a in ditto["args"]]
    spec["args"] = [a for a in spec["args"] if not a.startswith("--calibration-file=")]
    monkeypatch.setenv("KUBECONFIG", dead_kubeconfig(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cluster_yaml = objects[("ConfigMap", RELEASE)]["data"]["cluster.yaml"]
    code, stdout, stderr = check_config(spec, cluster_yaml, tmp_path)
    assert code == 0, stderr
    assert "live mirror: 1 pod source" in stdout, stdout


def json_equal(a, b):
    import json

    return json.loads(a) == json.loads(b)


def test_no_rbac_without_kubernetes_discovery():
    for values in ({}, all_toggles_on()):
        kinds = {kind for kind, _ in render(values)}
        assert not {"Role", "RoleBinding"} & kinds, kinds
    assert "mirror.podsDns / mirror.podsSelector / mirror.inferencePool" in bad_values_error(
        {"mirror": {"enabled": True, "podsDns": "x", "podsSelector": "app=vllm"}})
    assert "calibration.persistence.existingClaim" in bad_values_error({"calibration": {"persistence": {"enabled": True}}})


def test_the_pdb_never_blocks_a_drain_at_one_replica():
    pdb = render({"podDisruptionBudget": {"enabled": True}})[("PodDisruptionBudget", RELEASE)]["spec"]
    assert pdb.get("maxUnavailable") == 1 and "minAvailable" not in pdb, pdb
    pdb = render({"replicaCount": 3, "podDisruptionBudget": {"enabled": True, "minAvailable": 2}})[("PodDisruptionBudget", RELEASE)]["spec"]
    assert pdb.get("minAvailable") == 2, pdb
    pdb = render({"replicaCount": 2, "podDisruptionBudget": {"enabled": True, "minAvailable": "50%"}})[("PodDisruptionBudget", RELEASE)]["spec"]
    assert pdb.get("minAvailable") == "50%", pdb


def help_flags(command):
    text = subprocess.run([BINARY, command, "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    return set(re.findall(r"--[a-z][a-z0-9-]*", text))


def test_every_flag_docs_operations_names_is_accepted_by_the_binary():
    """Each `--flag` in docs/operations.md must be a flag of `ditto serve` (or of the
    `ditto predict` / `ditto bench` its paragraph is about)."""
    helps = {command: help_flags(command) for command in ("serve", "predict", "bench")}
    text = open(os.path.join(ROOT, "docs", "operations.md"), encoding="utf-8").read()
    unknown = []
    for paragraph in re.split(r"\n\s*\n", text):
        about = [c for c in ("predict", "bench") if f"ditto {c}" in paragraph]
        accepted = set(helps["serve"]).union(*(helps[c] for c in about))
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", paragraph):
            if flag not in accepted:
                unknown.append(flag)
    assert not unknown, f"docs/operations.md names flags the binary rejects: {sorted(set(unknown))}"


# KEDA's ScaledObject (keda.sh/v1alpha1), the subset of its CRD schema the chart renders,
# written from KEDA's ScaledObject specification (keda.sh/docs, "ScaledObject
# specification") and its CRD: strict like kubernetes-validate --strict (an unknown or
# misspelt field fails); trigger metadata values are strings; the HPA behaviour is
# autoscaling/v2's HorizontalPodAutoscalerBehavior.
HPA_RULES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "value", "periodSeconds"],
                "additionalProperties": False,
                "properties": {
                    "type": {"enum": ["Pods", "Percent"]},
                    "value": {"type": "integer", "exclusiveMinimum": 0},
                    "periodSeconds": {"type": "integer", "exclusiveMinimum": 0, "maximum": 1800},
                },
            },
        },
    },
}
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "additionalProperties": False,
        },
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "pollingInterval": {"type": "integer", "format": "int32"},
                "cooldownPeriod": {"type": "integer", "format": "int32"},
                "initialCooldownPeriod": {"type": "integer", "format": "int32"},
                "idleReplicaCount": {"type": "integer", "format": "int32"},
                "minReplicaCount": {"type": "integer", "format": "int32"},
                "maxReplicaCount": {"type": "integer", "format": "int32"},
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "additionalProperties": False,
                    "properties": {
                        "failureThreshold": {"type": "integer", "format": "int32"},
                        "replicas": {"type": "integer", "format": "int32"},
                    },
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "behavior": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {"scaleUp": HPA_RULES, "scaleDown": HPA_RULES},
                                },
                            },
                        },
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "additionalProperties": False,
                                "properties": {
                                    "name": {"type": "string"},
                                    "kind": {"enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def keda_values(**keda):
    return {
        "keda": {
            "enabled": True,
            "scaleTargetRef": {"kind": "Deployment", "name": "vllm-decode"},
            "pool": "vllm",
            **keda,
        }
    }


def scaled_object(objects):
    (found,) = [obj for (kind, _), obj in objects.items() if kind == "ScaledObject"]
    return found


def test_no_scaled_object_unless_keda_is_enabled():
    for name, values in SCENARIOS.items():
        assert not [kind for kind, _ in render(values()) if kind == "ScaledObject"], name


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {
            "push": True,
            "authenticationRef": "ditto-ca",
            "fallback": {"failureThreshold": 3, "replicas": 4},
            "scaleTargetRef": {"kind": "StatefulSet", "name": "vllm-decode"},
            "extraTriggers": [
                {
                    "type": "prometheus",
                    "name": "queue",
                    "metadata": {
                        "serverAddress": "http://prometheus.monitoring:9090",
                        "query": "sum(inference_pool_average_queue_size)",
                        "threshold": "5",
                    },
                }
            ],
        },
    ],
    ids=["defaults", "push-fallback-and-another-trigger"],
)
def test_the_scaled_object_validates_against_keda_s_crd_and_lints(extra, tmp_path):
    values = keda_values(**extra)
    values["tls"] = {"enabled": extra != {}, "secretName": "ditto-tls"}
    objects = render(values)
    scaled = scaled_object(objects)
    jsonschema.validate(scaled, SCALED_OBJECT)
    for (kind, _), obj in objects.items():
        if kind != "ScaledObject":
            validate(obj, "chart (keda)")
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
    assert not [m for m in report["messages"] if m["severity"] >= 2] and not report["errors"], report
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": values["keda"]["scaleTargetRef"]["kind"], "name": "vllm-decode"}
    # llm-d's SLO-aware guide's HPA behaviour by default: fast up, one pod per 120 s down.
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 30
    assert {(p["type"], p["value"], p["periodSeconds"]) for p in behavior["scaleUp"]["policies"]} == {("Percent", 100, 60), ("Pods", 4, 60)}
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 180
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 120}]
    ditto = spec["triggers"][0]
    assert ditto["type"] == ("external-push" if extra.get("push") else "external")
    assert ditto["metricType"] == "AverageValue"
    # scalerAddress is this release's gRPC Service.
    service = objects[("Service", RELEASE)]
    (grpc_port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert ditto["metadata"]["scalerAddress"] == f"{RELEASE}.{NAMESPACE}.svc.cluster.local:{grpc_port}"
    assert len(spec["triggers"]) == 1 + len(extra.get("extraTriggers", []))
    # The pod samples the load at the chart's step, and its flags pass check-config.
    values.pop("tls")
    pod = deployment(render(values))["spec"]["template"]["spec"]
    assert "--load-forecast-step-s=10" in container(pod)["args"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    cluster_yaml = render(values)[("ConfigMap", volume["configMap"]["name"])]["data"]["cluster.yaml"]
    code, _, stderr = check_config(container(pod), cluster_yaml, tmp_path)
    assert code == 0, stderr


def test_the_rendered_trigger_metadata_is_what_ditto_accepts():
    """The chart's trigger metadata sent to a real ditto serve as KEDA sends it."""
    from externalscaler import externalscaler_pb2 as ks
    from externalscaler import externalscaler_pb2_grpc as ks_grpc

    metadata = scaled_object(render(keda_values(sloTtftMs=2000, horizonSeconds=180)))["spec"]["triggers"][0]["metadata"]
    server = Server()
    try:
        server.wait_serving()
        scaler = ks_grpc.ExternalScalerStub(server.channel)
        reference = ks.ScaledObjectRef(name="vllm-decode", namespace=NAMESPACE, scalerMetadata=metadata)
        spec = scaler.GetMetricSpec(reference, timeout=10)
        assert [(m.metricName, m.targetSizeFloat) for m in spec.metricSpecs] == [("ditto-desired-replicas-vllm", 1.0)]
    finally:
        code, output = server.terminate(), server.output()
        os.unlink(server.log.name)
        assert code == 0, output


def test_keda_without_a_target_or_pool_is_refused_naming_the_value():
    assert "keda.scaleTargetRef.name" in bad_values_error({"keda": {"enabled": True, "pool": "vllm"}})
    assert "keda.pool" in bad_values_error({"keda": {"enabled": True, "scaleTargetRef": {"name": "vllm"}}})
    assert "keda" in bad_values_error(keda_values(scaleTargetRef={"kind": "ReplicaSet", "name": "x"}))
