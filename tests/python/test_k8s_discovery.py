"""Kubernetes discovery against a stand-in API server (fake_kube_api.py, written from the
API's documented wire format) reached through a kubeconfig at http://127.0.0.1:PORT, with fake
vLLM pods (fake_vllm.py) behind the pod IPs 127.0.0.x, all on one port as in a real pool.

`ditto serve --pods-selector ... --pods-namespace ... --pods-port ...` must mirror exactly the
Ready pods (ids `namespace/name`), follow adds, NotReady, deletes (stale at once, retired after
--retire-after-ms), a watch stream that ends, a 410 that forces a relist, 500 and 403 answers
(pods keep their last state, stale with a reason; one log line naming the permission), and an
InferencePool (v1, or v1alpha2 where only that is served) whose selector changes. Bad input
exits naming the flag. Waits are bounded polls.
"""

import os
import subprocess
import tempfile

import grpc
import pytest

from conftest import BINARY, free_port
from ditto.v1 import twin_pb2 as pb
from fake_kube_api import FakeKubeApi
from test_live import Fake, bounded_until, by_id, eventually, gauges_are, metric, snapshot  # noqa: F401

from conftest import Server

LABELS = {"app": "vllm", "llm-d.ai/role": "decode"}
SELECTOR = "app=vllm,llm-d.ai/role=decode"


@pytest.fixture
def api():
    made = []

    def make(**kwargs):
        server = FakeKubeApi(**kwargs)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


@pytest.fixture
def pods():
    """Fake vLLM pods on 127.0.0.2.. sharing one port (a pool's port)."""
    started = []
    port = free_port()

    def make(count):
        first = len(started)
        for index in range(first, first + count):
            started.append(Fake(f"127.0.0.{index + 2}", port))
        return started[first:]

    make.port = port
    yield make
    for fake in started:
        fake.stop()


@pytest.fixture
def kube_serve(tmp_path):
    servers = []

    def make(api, *args):
        env = dict(os.environ)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env["KUBECONFIG"] = api.kubeconfig(str(tmp_path / "kubeconfig"))
        server = Server(["--scrape-interval-ms", "50", "--retire-after-ms", "1500", *args], env=env)
        servers.append(server)
        server.wait_serving()
        return server

    yield make
    for server in servers:
        code = server.terminate()
        output = server.output()
        os.unlink(server.log.name)
        assert code == 0, f"ditto serve exited {code}:\n{output}"


def ids(instances):
    return sorted(instances)


def one_pod_mirrored(api, pods, kube_serve, running, kv):
    """One Ready pod `vllm-a` with these gauges, found by the selector and mirrored."""
    k = api()
    (a,) = pods(1)
    a.control(gauges=dict(running=running, waiting=0, kv=kv))
    k.pod("vllm-a", a.host, LABELS)
    server = kube_serve(k, "--pods-selector", SELECTOR, "--pods-namespace", "llm-d", "--pods-port", str(pods.port))
    eventually(server, lambda i: "llm-d/vllm-a" in i and gauges_are(i["llm-d/vllm-a"], running, 0, kv)
               and not i["llm-d/vllm-a"].stale_reason, "mirrored")
    return k, a, server


def test_selector_mirrors_ready_pods_and_follows_adds_not_ready_deletes_watch_end_and_410(api, pods, kube_serve):
    k = api()
    a, b, c, d = pods(4)
    a.control(gauges=dict(running=2, waiting=1, kv=0.2))
    k.pod("vllm-a", a.host, LABELS)
    k.pod("vllm-b", b.host, LABELS, ready=False)
    k.pod("vllm-c", None, LABELS, phase="Pending")
    k.pod("other", d.host, {"app": "vllm", "llm-d.ai/role": "prefill"})
    server = kube_serve(k, "--pods-selector", SELECTOR, "--pods-namespace", "llm-d", "--pods-port", str(pods.port))
    # Only the Ready pod with an IP, under its namespace/name, through the scrape path.
    eventually(server, lambda i: ids(i) == ["llm-d/vllm-a"] and gauges_are(i["llm-d/vllm-a"], 2, 1, 0.2), "mirroring vllm-a")
    # b turns Ready; c gets an IP and turns Ready: both appear.
    k.pod("vllm-b", b.host, LABELS)
    k.pod("vllm-c", c.host, LABELS)
    eventually(server, lambda i: ids(i) == ["llm-d/vllm-a", "llm-d/vllm-b", "llm-d/vllm-c"] and not any(x.stale_reason for x in i.values()), "three pods")
    # b turns NotReady: stale at once with the reason, then retired after the grace period.
    k.pod("vllm-b", b.host, LABELS, ready=False)
    reason = eventually(server, lambda i: "llm-d/vllm-b" in i and i["llm-d/vllm-b"].stale_reason, "b stale")
    assert "not Ready" in reason, reason
    eventually(server, lambda i: "llm-d/vllm-b" not in i, "b retired")
    # a is deleted: stale ("deleted") at once, then retired.
    k.delete_pod("vllm-a")
    reason = eventually(server, lambda i: "llm-d/vllm-a" in i and i["llm-d/vllm-a"].stale_reason, "a stale")
    assert "deleted" in reason, reason
    eventually(server, lambda i: ids(i) == ["llm-d/vllm-c"], "a retired")
    # The watch stream ends: ditto watches again from where it was (no relist needed).
    lists, watches = k.count("pods", False), k.count("pods", True)
    k.end_watches()
    bounded_until(lambda: k.count("pods", True) > watches, "a new watch")
    k.pod("vllm-b", b.host, LABELS)
    eventually(server, lambda i: ids(i) == ["llm-d/vllm-b", "llm-d/vllm-c"], "b back after the watch ended")
    assert k.count("pods", False) == lists, "a clean end of the watch must not relist"
    # 410 Gone: a change lost to compaction (d joins the pool silently) is found by the relist.
    k.expire(lambda: k.pods.put({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "vllm-d", "namespace": "llm-d", "labels": LABELS},
        "status": {"phase": "Running", "podIP": d.host, "conditions": [{"type": "Ready", "status": "True"}]},
    }, silent=True))
    eventually(server, lambda i: ids(i) == ["llm-d/vllm-b", "llm-d/vllm-c", "llm-d/vllm-d"], "d found by the relist")
    assert k.count("pods", False) > lists
    assert metric(server, "ditto_live_pods") == 3


def test_api_outage_and_forbidden_keep_pods_stale_with_a_reason_and_serving(api, pods, kube_serve):
    k, _, server = one_pod_mirrored(api, pods, kube_serve, 1, 0.1)
    # 500s: the watch ends and every list/watch fails; the pod keeps its state, stale.
    k.fail("pods", 500, 4)
    k.end_watches()
    reason = eventually(server, lambda i: i["llm-d/vllm-a"].stale_reason, "stale on 500")
    assert "500" in reason, reason
    inst = by_id(snapshot(server))["llm-d/vllm-a"]
    assert gauges_are(inst, 1, 0, 0.1), "the pod keeps its last state"
    assert metric(server, "ditto_live_stale", instance="llm-d/vllm-a", signal="discovery") == 1
    # Recovery: the next successful list clears it.
    eventually(server, lambda i: not i["llm-d/vllm-a"].stale_reason, "recovered after the 500s")
    # 403: the reason and one log line name the missing permission.
    k.fail("pods", 403, 6)
    k.end_watches()
    reason = eventually(server, lambda i: i["llm-d/vllm-a"].stale_reason, "stale on 403")
    assert "forbids list/watch on pods" in reason and "llm-d" in reason, reason
    bounded_until(lambda: k.faults["pods"][1] == 0, "all 403s answered")
    warnings = [line for line in server.output().splitlines()
                if "ditto::live::k8s" in line and "grant get, list and watch on pods" in line]
    assert len(warnings) == 1, server.output()
    eventually(server, lambda i: not i["llm-d/vllm-a"].stale_reason, "recovered after the 403s")
    server.wait_serving()


def test_when_the_last_pod_is_retired_the_mirror_is_empty_until_a_pod_appears(api, pods, kube_serve):
    k, a, server = one_pod_mirrored(api, pods, kube_serve, 3, 0.3)
    assert server.http("/readyz")[0] == 200
    k.delete_pod("vllm-a")

    def empty():
        try:
            snapshot(server)
            return False
        except grpc.RpcError as err:
            return err.code() == grpc.StatusCode.FAILED_PRECONDITION

    # After the grace period no answer is simulated on the pod that is gone.
    bounded_until(empty, "the mirror emptied after the last pod was retired")
    assert server.http("/readyz")[0] == 503
    question = pb.PredictRoutingRequest(request=pb.CandidateRequest(prompt_tokens=100, output_tokens=10), request_id="q")
    with pytest.raises(grpc.RpcError) as caught:
        server.twin.PredictRouting(question, timeout=10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, caught.value
    assert metric(server, "ditto_live_pods") == 0
    # A new pod fills it again.
    k.pod("vllm-b", a.host, LABELS)
    bounded_until(lambda: not empty(), "a config synced again")
    eventually(server, lambda i: ids(i) == ["llm-d/vllm-b"] and gauges_are(i["llm-d/vllm-b"], 3, 0, 0.3), "vllm-b mirrored")
    assert server.http("/readyz")[0] == 200


@pytest.mark.parametrize("versions", [("v1",), ("v1alpha2",)])
def test_inference_pool_selector_and_port_are_followed(api, pods, kube_serve, versions):
    k = api(pool_versions=versions)
    a, b = pods(2)
    k.pod("decode-0", a.host, {"app": "vllm", "llm-d.ai/role": "decode"})
    k.pod("prefill-0", b.host, {"app": "vllm", "llm-d.ai/role": "prefill"})
    k.pool("qwen-pool", {"app": "vllm", "llm-d.ai/role": "decode"}, pods.port)
    server = kube_serve(k, "--inference-pool", "qwen-pool", "--pods-namespace", "llm-d")
    eventually(server, lambda i: ids(i) == ["llm-d/decode-0"] and i["llm-d/decode-0"].HasField("gauges"), "the pool's pods")
    # The pool's selector changes: its new pods are mirrored, the old ones go.
    k.pool("qwen-pool", {"app": "vllm", "llm-d.ai/role": "prefill"}, pods.port)
    eventually(server, lambda i: ids(i) == ["llm-d/prefill-0"], "the new selector's pods")


def run(args, kubeconfig, timeout=60):
    env = dict(os.environ)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env["KUBECONFIG"] = kubeconfig
    return subprocess.run([BINARY, "serve", *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_bad_kubernetes_input_exits_naming_the_flag(api, tmp_path):
    k = api()
    good = k.kubeconfig(str(tmp_path / "kubeconfig"))
    missing = str(tmp_path / "nope")
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "pools:\n  - {name: vllm, replicas: 1, model: llama-3.1-8b-instruct, gpu: H100, tp: 1}\n"
        "sources:\n  - pool: vllm\n    kubernetes: {inference_pool: nowhere, namespace: llm-d}\n"
    )
    cases = [
        (["--pods-selector", "app in (vllm", "--pods-port", "8000"], good, "--pods-selector"),
        (["--pods-selector", "app=vllm"], good, "--pods-port"),
        (["--pods-selector", "app=vllm", "--pods-port", "8000"], missing, "--pods-selector"),
        (["--inference-pool", "nowhere", "--pods-namespace", "llm-d"], good, "--inference-pool"),
        (["--pods-selector", "app=vllm", "--inference-pool", "x", "--pods-port", "1"], good, "--inference-pool"),
    ]
    for args, kubeconfig, flag in cases:
        done = run(args + ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"], kubeconfig)
        assert done.returncode == 2 and flag in done.stderr, (args, done.returncode, done.stderr)
    # --check-config: exit 2 naming the field (a missing InferencePool in sources:, a kubeconfig
    # that cannot be read).
    checked = run(["--check-config", str(config)], good)
    assert checked.returncode == 2 and "sources[0].kubernetes" in checked.stderr and "nowhere" in checked.stderr, checked.stderr
    checked = run(["--check-config", str(config)], missing)
    assert checked.returncode == 2 and "sources[0].kubernetes" in checked.stderr and "kubeconfig" in checked.stderr, checked.stderr


def test_a_sources_entry_in_the_cluster_yaml_discovers_the_same_way(api, pods, kube_serve, tmp_path):
    k = api()
    (a,) = pods(1)
    a.control(gauges=dict(running=3, waiting=0, kv=0.25))
    k.pod("vllm-a", a.host, LABELS)
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "pools:\n  - {name: vllm, replicas: 1, model: llama-3.1-8b-instruct, gpu: H100, tp: 1}\n"
        "sources:\n  - pool: vllm\n"
        f"    kubernetes: {{selector: '{SELECTOR}', namespace: llm-d, port: {pods.port}}}\n"
    )
    server = kube_serve(k, "--config", str(config))
    eventually(server, lambda i: ids(i) == ["llm-d/vllm-a"] and gauges_are(i["llm-d/vllm-a"], 3, 0, 0.25), "mirrored from sources:")
