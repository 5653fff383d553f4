"""ditto installed into llm-d's router chart the documented way, rendered with Helm's engine.

The chart is a stand-in (tests/python/llmd_router_standin, written from llm-d/llm-d-router's
config/charts at ebab687: the same values keys, container order, env and volume lists and
plugin ConfigMap), rendered with helm-python-sdk. The operator's own values (their
`modelServers.matchLabels`, an EPP env var, a volume and its mount) come first, then
deploy/llm-d-router/values-ditto.yaml, merged as Helm merges `-f` files; the output goes
through deploy/llm-d-router/post-renderer.sh as `helm --post-renderer` would pipe it, or
through the operator's own kustomization listing the components. Both for the chart's
Deployment and for the StatefulSet it renders with GKE's preferred backends.

What must hold (issue 34): the EPP loads a plugin config with `predicted-latency-producer` and
the latency scorer in a scheduling profile; no XGBoost container; PREDICTION_SERVER_URL and
TRAINING_SERVER_URL set once each, to ditto's API on the pod's loopback; ditto mirrors the
release's own InferencePool; the EPP is the first container; ditto has no readinessProbe and
its API is not bound beyond loopback; the operator's env var and volume are kept; ditto's
objective is the chart's; nothing of ditto's is shared between two releases of a namespace;
Prometheus finds ditto's metrics port; every object validates. Then ditto run with the
rendered flags and env against a stand-in Kubernetes API (fake_kube_api.py) serving the chart's
own InferencePool mirrors exactly that pool's pods, and the three install documents agree with
what renders.
"""

import os
import re
import subprocess
import urllib.error
import urllib.request

import helm_python as helm
import pytest
import yaml

from conftest import ROOT, Server, free_port
from fake_kube_api import FakeKubeApi
from k8s_manifests import check_sidecar_flags, kustomize, plugin_config_problems, resolved_env, validate
from test_live import Fake, eventually

STANDIN = os.path.join(ROOT, "tests", "python", "llmd_router_standin")
DEPLOY = os.path.join(ROOT, "deploy")
VALUES_DITTO = os.path.join(DEPLOY, "llm-d-router", "values-ditto.yaml")
POST_RENDERER = os.path.join(DEPLOY, "llm-d-router", "post-renderer.sh")
COMPONENTS = [os.path.join(DEPLOY, "components", c) for c in ("ditto-epp-sidecar", "ditto-podmonitor")]
RELEASE, NAMESPACE = "qwen-router", "inference-prod"
XGBOOST = re.compile(r"^(training-server|prediction-server-\d+)$")


def operator_values(statefulset):
    """An operator's own values: their pool's labels, an env var, a volume and its mount (and
    GKE's preferred backends, which make the EPP a StatefulSet)."""
    values = {
        "router": {
            "modelServers": {"matchLabels": {"llm-d.ai/inferenceServing": "true", "llm-d.ai/model": "qwen3-32b"}},
            "epp": {
                "env": [{"name": "HF_HOME", "value": "/model-cache"}],
                "volumes": [{"name": "model-cache-volume", "emptyDir": {"sizeLimit": "1Gi"}}],
                "volumeMounts": [{"name": "model-cache-volume", "mountPath": "/model-cache"}],
            },
        }
    }
    if statefulset:
        values["provider"] = {"name": "gke", "gke": {"preferredBackends": {"enabled": True}}}
    return values


def helm_merge(base, override):
    """`helm -f base -f override`: maps merged key by key, anything else (lists included)
    replaced by the later file (helm's pkg/cli/values mergeMaps)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = helm_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def helm_template(values, release=RELEASE):
    """The chart's manifests as `helm template` prints them (one stream; NOTES.txt and empty
    templates left out)."""
    rendered = helm.Chart.load(STANDIN).render(values, name=release, namespace=NAMESPACE, is_install=True)
    return "".join(
        f"---\n# Source: {path}\n{text}\n"
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt") and text.strip()
    )


def post_render(manifests, *args):
    """deploy/llm-d-router/post-renderer.sh as Helm runs it: manifests on stdin."""
    if kustomize_missing():
        pytest.skip("kubectl (kustomize v5) is not installed")
    result = subprocess.run([POST_RENDERER, *args], input=manifests, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def own_kustomization(manifests, tmp_path):
    """The kustomize route: the operator's kustomization over `helm template` output, listing
    both components."""
    work = tmp_path / "kustomize"
    work.mkdir()
    (work / "rendered.yaml").write_text(manifests)
    components = "".join(f"  - {os.path.relpath(c, work)}\n" for c in COMPONENTS)
    (work / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [rendered.yaml]\ncomponents:\n{components}"
    )
    return kustomize(str(work))


def kustomize_missing():
    try:
        subprocess.run(["kubectl", "version", "--client"], capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return True
    return False


def install(route, statefulset, tmp_path, release=RELEASE, operator=None, options=("podmonitor",)):
    """The documented install's objects: values-ditto.yaml over the operator's values, then the
    post-renderer (Helm's route, with `options`) or the operator's kustomization (kustomize's
    route, both components)."""
    operator = operator_values(statefulset) if operator is None else operator
    values = helm_merge(operator, yaml.safe_load(open(VALUES_DITTO, encoding="utf-8")))
    manifests = helm_template(values, release)
    output = post_render(manifests, *options) if route == "post-renderer" else own_kustomization(manifests, tmp_path)
    return [d for d in yaml.safe_load_all(output) if d]


def the_epp(objects):
    (epp,) = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet") and o["metadata"]["name"].endswith("-epp")]
    return epp


def containers(pod):
    """The pod's regular containers and its native sidecars (init containers that restart)."""
    sidecars = [c for c in pod.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    return pod["containers"] + sidecars


def named(pod, name):
    (found,) = [c for c in containers(pod) if c["name"] == name]
    return found


def flag(container, name):
    """The value of `--name=value` (or `--name value`) in a container's args, else None."""
    args = container.get("args", [])
    for i, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(args):
            return args[i + 1]
    return None


def ditto_env(epp):
    template = epp["spec"]["template"]
    return resolved_env(named(template["spec"], "ditto"), template["metadata"], epp["metadata"]["namespace"])


# --- the checks, each on the install's objects -------------------------------------------------


def check_plugin_config(objects):
    """The file the EPP loads (--config-file, from its plugins ConfigMap) has a scheduling
    profile with the predicted-latency-producer and the latency scorer, and loads."""
    epp = the_epp(objects)
    pod = epp["spec"]["template"]["spec"]
    path = flag(named(pod, "epp"), "config-file")
    mount = next(m for m in named(pod, "epp")["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    configmap = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"])
    config = yaml.safe_load(configmap["data"][path[len(mount["mountPath"].rstrip("/")) + 1:]])
    assert not plugin_config_problems(config), plugin_config_problems(config)
    types = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    profiles = [{types[r["pluginRef"]] for r in profile["plugins"]} for profile in config["schedulingProfiles"]]
    assert any({"predicted-latency-producer", "latency-scorer"} <= p for p in profiles), profiles
    assert "latency-slo-admitter" in types.values(), types


def check_no_xgboost(objects):
    pod = the_epp(objects)["spec"]["template"]["spec"]
    names = [c["name"] for c in containers(pod)]
    assert not [n for n in names if XGBOOST.match(n)], names
    assert not [c["image"] for c in containers(pod) if "latency-predictor" in c["image"]]


def check_predictor_urls(objects):
    """Each URL once, to ditto's API (--http-addr) on the pod's loopback."""
    pod = the_epp(objects)["spec"]["template"]["spec"]
    env = named(pod, "epp")["env"]
    port = flag(named(pod, "ditto"), "http-addr").rsplit(":", 1)[1]
    for name in ("PREDICTION_SERVER_URL", "TRAINING_SERVER_URL"):
        values = [e.get("value") for e in env if e["name"] == name]
        assert values == [f"http://127.0.0.1:{port}"], (name, values)


def check_release_pool(objects):
    """ditto mirrors the InferencePool of this release, in the release's namespace."""
    epp = the_epp(objects)
    (pool,) = [o for o in objects if o["kind"] == "InferencePool"]
    env = ditto_env(epp)
    ditto = named(epp["spec"]["template"]["spec"], "ditto")
    name = flag(ditto, "inference-pool") or env.get("DITTO_INFERENCE_POOL")
    assert name == pool["metadata"]["name"] == flag(named(epp["spec"]["template"]["spec"], "epp"), "pool-name"), name
    namespace = flag(ditto, "pods-namespace") or env.get("DITTO_PODS_NAMESPACE") or epp["metadata"]["namespace"]
    assert namespace == pool["metadata"]["namespace"] == epp["metadata"]["namespace"]


def check_epp_first(objects):
    pod = the_epp(objects)["spec"]["template"]["spec"]
    sidecar = [c for c in pod.get("initContainers", []) if c["name"] == "ditto" and c.get("restartPolicy") == "Always"]
    assert pod["containers"][0]["name"] == "epp" or sidecar, [c["name"] for c in pod["containers"]]


def check_probes(objects):
    """No readinessProbe on ditto; startup and liveness on /healthz of its metrics listener."""
    ditto = named(the_epp(objects)["spec"]["template"]["spec"], "ditto")
    assert "readinessProbe" not in ditto, ditto.get("readinessProbe")
    port = int(flag(ditto, "metrics-addr").rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in ditto["ports"]}
    for probe in ("startupProbe", "livenessProbe"):
        get = ditto[probe]["httpGet"]
        assert get["path"] == "/healthz" and ports.get(get["port"], get["port"]) == port, (probe, get)


def check_api_loopback(objects):
    """The predictor API and gRPC bound to loopback; the only port offered is the metrics one."""
    ditto = named(the_epp(objects)["spec"]["template"]["spec"], "ditto")
    for name in ("http-addr", "grpc-addr"):
        host = flag(ditto, name).rsplit(":", 1)[0]
        assert host in ("127.0.0.1", "[::1]"), (name, host)
    metrics = int(flag(ditto, "metrics-addr").rsplit(":", 1)[1])
    assert [p["containerPort"] for p in ditto["ports"]] == [metrics], ditto["ports"]


def check_operator_values_kept(objects):
    pod = the_epp(objects)["spec"]["template"]["spec"]
    epp = named(pod, "epp")
    assert {"name": "HF_HOME", "value": "/model-cache"} in epp["env"], epp["env"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes.get("model-cache-volume") == {"name": "model-cache-volume", "emptyDir": {"sizeLimit": "1Gi"}}
    assert {"name": "model-cache-volume", "mountPath": "/model-cache"} in epp["volumeMounts"]
    for c in containers(pod):
        for mount in c.get("volumeMounts", []):
            assert mount["name"] in volumes, (c["name"], mount)


def check_objective(objects):
    """ditto answers with the objective the chart configures its own predictor for."""
    chart = yaml.safe_load(open(os.path.join(STANDIN, "values.yaml"), encoding="utf-8"))["router"]["latencyPredictor"]
    expected = {chart["predictionServers"]["config"]["LATENCY_OBJECTIVE_TYPE"], chart["trainingServer"]["config"]["LATENCY_OBJECTIVE_TYPE"]}
    (expected,) = expected
    ditto = named(the_epp(objects)["spec"]["template"]["spec"], "ditto")
    assert (flag(ditto, "latency-objective-type") or ditto_env(the_epp(objects)).get("LATENCY_OBJECTIVE_TYPE")) == expected


def check_config_per_release(objects):
    """Every ConfigMap ditto mounts is in the output and named after the release."""
    epp = the_epp(objects)
    pod = epp["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    configmaps = {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    for mount in named(pod, "ditto").get("volumeMounts", []):
        source = volumes[mount["name"]].get("configMap")
        if source:
            assert source["name"] in configmaps and RELEASE in source["name"], source


def check_grace_period(objects):
    pod = the_epp(objects)["spec"]["template"]["spec"]
    assert int(flag(named(pod, "ditto"), "drain-ms")) < pod["terminationGracePeriodSeconds"] * 1000


def check_scraped(objects):
    """A PodMonitor of the release's namespace selects the EPP pod and scrapes ditto's metrics
    port; the EPP pod's own Service port stays the EPP's."""
    epp = the_epp(objects)
    labels = epp["spec"]["template"]["metadata"]["labels"]
    ditto = named(epp["spec"]["template"]["spec"], "ditto")
    ports = {p["name"] for p in ditto["ports"]}
    monitors = [o for o in objects if o["kind"] == "PodMonitor"]
    assert monitors, "no PodMonitor"
    (monitor,) = monitors
    assert monitor["metadata"]["namespace"] == epp["metadata"]["namespace"]
    assert RELEASE in monitor["metadata"]["name"], monitor["metadata"]["name"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == list(ports) and ports


def check_validates(objects):
    for obj in objects:
        validate(obj, f"{obj['kind']}/{obj['metadata']['name']}")


CHECKS = [check_plugin_config, check_no_xgboost, check_predictor_urls, check_release_pool, check_epp_first,
          check_probes, check_api_loopback, check_operator_values_kept, check_objective, check_config_per_release,
          check_grace_period, check_scraped, check_validates]


def failed_checks(objects):
    failures = {}
    for check in CHECKS:
        try:
            check(objects)
        except (AssertionError, KeyError, StopIteration, ValueError, TypeError, AttributeError) as err:
            failures[check.__name__] = f"{type(err).__name__}: {err}"[:400]
    return failures


@pytest.mark.parametrize("statefulset", [False, True], ids=["deployment", "gke-statefulset"])
@pytest.mark.parametrize("route", ["post-renderer", "own-kustomization"])
def test_the_documented_install_over_the_operators_values(route, statefulset, tmp_path):
    objects = install(route, statefulset, tmp_path)
    kinds = {o["kind"] for o in objects}
    assert ("StatefulSet" if statefulset else "Deployment") in kinds, kinds
    assert failed_checks(objects) == {}


def test_two_releases_of_one_namespace_share_nothing_of_dittos(tmp_path):
    first = install("post-renderer", False, tmp_path / "a", release="qwen-router")
    second = install("post-renderer", False, tmp_path / "b", release="llama-router")
    ids = lambda objects: {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects}
    assert not ids(first) & ids(second), ids(first) & ids(second)
    assert ditto_env(the_epp(first))["DITTO_INFERENCE_POOL"] == "qwen-router"
    assert ditto_env(the_epp(second))["DITTO_INFERENCE_POOL"] == "llama-router"


def test_without_the_values_file_the_chart_keeps_its_own_profile(tmp_path):
    """The post-renderer alone does not change what the EPP loads: values-ditto.yaml is the
    step that does (so the documented order is the one tested above)."""
    objects = [d for d in yaml.safe_load_all(post_render(helm_template(operator_values(False)))) if d]
    with pytest.raises(AssertionError):
        check_plugin_config(objects)
    check_predictor_urls(objects)


def test_the_post_renderer_refuses_an_unknown_argument():
    if kustomize_missing():
        pytest.skip("kubectl (kustomize v5) is not installed")
    result = subprocess.run([POST_RENDERER, "podmonitr"], input="", capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "podmonitr" in result.stderr, result


@pytest.mark.parametrize("statefulset", [False, True], ids=["deployment", "gke-statefulset"])
def test_the_rendered_sidecar_passes_check_config(statefulset, tmp_path, monkeypatch):
    """ditto's rendered flags and env (Downward API resolved) through the binary: they parse,
    and the live mirror is one Kubernetes pod source (the release's pool)."""
    epp = the_epp(install("post-renderer", statefulset, tmp_path))
    template = epp["spec"]["template"]
    code, stdout, stderr = check_sidecar_flags(named(template["spec"], "ditto"), template["metadata"], NAMESPACE, tmp_path, monkeypatch)
    assert code == 0, stderr
    assert "live mirror: 1 pod source" in stdout, stdout


# A cluster YAML of the operator's (docs/cluster.md), in the release's plugin ConfigMap.
CLUSTER_YAML = """pools:
  - name: decode
    replicas: 2
    model: llama-3.1-8b-instruct
    gpu: H100
    tp: 1
"""


def test_a_cluster_yaml_of_the_release_overrides_inference(tmp_path, monkeypatch):
    """With `cluster-config`, ditto reads `ditto-cluster.yaml` from the release's own plugin
    ConfigMap (the operator's pluginsCustomConfig key, kept beside values-ditto.yaml's), and the
    file the binary is given is that ConfigMap's key."""
    operator = operator_values(False)
    operator["router"]["epp"]["pluginsCustomConfig"] = {"ditto-cluster.yaml": CLUSTER_YAML}
    objects = install("post-renderer", False, tmp_path, operator=operator, options=("podmonitor", "cluster-config"))
    assert failed_checks(objects) == {}
    epp = the_epp(objects)
    template = epp["spec"]["template"]
    ditto = named(template["spec"], "ditto")
    path = ditto_env(epp)["DITTO_CONFIG"]
    (mount,) = [m for m in ditto["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"]]
    assert configmap["metadata"]["name"] == f"{RELEASE}-epp"
    cluster_yaml = configmap["data"][path[len(mount["mountPath"].rstrip("/")) + 1:]]
    assert cluster_yaml == CLUSTER_YAML
    code, stdout, stderr = check_sidecar_flags(ditto, template["metadata"], NAMESPACE, tmp_path, monkeypatch, cluster_yaml)
    assert code == 0, stderr
    assert "live mirror: 1 pod source" in stdout, stdout


def sidecar_process_args(ditto):
    """The rendered flags with the three listeners moved to free ports on the same hosts (the
    Server fixture sets --grpc-addr, --http-addr and --drain-ms itself)."""
    args, metrics_port = [], free_port()
    for arg in ditto["args"]:
        name = arg.split("=", 1)[0]
        if name in ("--grpc-addr", "--http-addr", "--drain-ms"):
            continue
        if name == "--metrics-addr":
            arg = f"--metrics-addr={arg.split('=', 1)[1].rsplit(':', 1)[0]}:{metrics_port}"
        args.append(arg)
    return args, metrics_port


def test_the_rendered_sidecar_mirrors_the_releases_pool_and_serves_probes_apart(tmp_path):
    """ditto run with the flags and env the install renders (Downward API resolved) against a
    stand-in Kubernetes API serving the chart's own InferencePool and a second release's pool:
    it mirrors exactly the Ready pods of its release's pool, in the release's namespace, and its
    metrics listener answers the probes and /metrics but not the predictor API."""
    objects = install("post-renderer", False, tmp_path)
    epp = the_epp(objects)
    template = epp["spec"]["template"]
    ditto = named(template["spec"], "ditto")
    (pool,) = [o for o in objects if o["kind"] == "InferencePool"]
    kube = FakeKubeApi()
    fakes, port = [], free_port()
    try:
        for index, (name, labels) in enumerate([
            ("qwen-0", pool["spec"]["selector"]["matchLabels"]),
            ("llama-0", {"llm-d.ai/inferenceServing": "true", "llm-d.ai/model": "llama"}),
        ]):
            fakes.append(Fake(f"127.0.0.{index + 2}", port))
            kube.pod(name, fakes[-1].host, labels, namespace=NAMESPACE)
        kube.pool(pool["metadata"]["name"], pool["spec"]["selector"]["matchLabels"], port, namespace=NAMESPACE)
        kube.pool("llama-router", {"llm-d.ai/model": "llama"}, port, namespace=NAMESPACE)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DITTO_") and k != "KUBERNETES_SERVICE_HOST"}
        env.update(resolved_env(ditto, template["metadata"], epp["metadata"]["namespace"]))
        # The kubeconfig's own namespace is not the release's: the pod's namespace must win.
        env["KUBECONFIG"] = kube.kubeconfig(str(tmp_path / "kubeconfig"), namespace="default")
        args, metrics_port = sidecar_process_args(ditto)
        server = Server([*args, "--scrape-interval-ms", "50"], env=env)
        try:
            server.wait_serving()
            eventually(server, lambda i: sorted(i) == [f"{NAMESPACE}/qwen-0"] and i[f"{NAMESPACE}/qwen-0"].HasField("gauges"),
                       "the release's pool mirrored")

            def get(path, method="GET"):
                request = urllib.request.Request(f"http://127.0.0.1:{metrics_port}{path}", method=method, data=b"{}" if method == "POST" else None)
                try:
                    with urllib.request.urlopen(request, timeout=10) as reply:
                        return reply.status, reply.read().decode()
                except urllib.error.HTTPError as err:
                    return err.code, err.read().decode()

            probe = named(template["spec"], "ditto")["livenessProbe"]["httpGet"]["path"]
            assert get(probe)[0] == 200
            status, body = get("/metrics")
            assert status == 200 and "ditto_" in body
            assert get("/add_training_data_bulk", "POST")[0] == 404
            assert get("/predict/bulk/strict", "POST")[0] == 404
        finally:
            code, output = server.terminate(), server.output()
            os.unlink(server.log.name)
            assert code == 0, output
    finally:
        for fake in fakes:
            fake.stop()
        kube.close()


DOCS = {name: os.path.join(ROOT, *name.split("/")) for name in ("docs/latency-predictor.md", "deploy/README.md", "docs/operations.md")}


def test_the_install_docs_agree_with_what_renders(tmp_path):
    """The three documents name files that exist, give the same command in the same order, and
    state the listeners, URLs and plugins the install renders."""
    texts = {name: open(path, encoding="utf-8").read() for name, path in DOCS.items()}
    for name, text in texts.items():
        for path in set(re.findall(r"deploy/[\w./-]*[\w/]", text)):
            assert os.path.exists(os.path.join(ROOT, path)), (name, path)
    command = re.compile(r"-f your-values\.yaml \\\s+-f deploy/llm-d-router/values-ditto\.yaml \\\s+--post-renderer deploy/llm-d-router/post-renderer\.sh")
    for name in ("docs/latency-predictor.md", "deploy/README.md"):
        assert command.search(texts[name]), name
    epp = the_epp(install("post-renderer", False, tmp_path))
    pod = epp["spec"]["template"]["spec"]
    ditto = named(pod, "ditto")
    for arg in re.findall(r"`(--(?:http|grpc|metrics)-addr=[^`]+)`", texts["docs/operations.md"]):
        assert arg in ditto["args"], arg
    url = next(e["value"] for e in named(pod, "epp")["env"] if e["name"] == "PREDICTION_SERVER_URL")
    assert f"`{url}`" in texts["docs/latency-predictor.md"] and f"`{url}`" in texts["deploy/README.md"]
    values = yaml.safe_load(open(VALUES_DITTO, encoding="utf-8"))["router"]["epp"]
    config = yaml.safe_load(values["pluginsCustomConfig"][values["pluginsConfigFile"]])
    section = texts["docs/latency-predictor.md"].split("## Point the router at ditto", 1)[1].split("\n## ", 1)[0]
    table = set(re.findall(r"^\| `([a-z][a-z-]+)`", section, re.MULTILINE))
    scheduling = {p["type"] for p in config["plugins"]} - {"metrics-data-source", "core-metrics-extractor"}
    assert table == scheduling, (table, scheduling)
