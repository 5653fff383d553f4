"""Kubernetes discovery against a hostile or broken API server (issue 38 D4, D5, D8, D9, D14):
the stand-in API server (fake_kube_api.py) sends what a real one could within its wire format,
and ditto must keep serving what fits and say why, with every input bounded before it is held.

- D4: a pod list over --max-instances (5,000 pods, limit 4,096) mirrors the first 4,096 by
  namespace/name, leaves the rest out (counted, one warning per change, each marked
  `ditto_live_stale{signal="over_limit"}`), keeps SERVING and answering; pods that join while
  it is full take their place in that order, and the marks follow.
- D5: a watch line with no newline is cut at the line cap: the stream is dropped, the pods are
  stale with the reason, the source is relisted, and ditto's peak memory stays bounded; an
  InferencePool's watch is capped the same way.
- D8: a watch that fails right after every good LIST backs off (LISTs at a bounded rate, one
  warning, the pods stale without flapping) and recovers when watches work again.
- D9: a watch that hangs mid-line (no byte, not even a bookmark) is dead after its
  timeoutSeconds plus a margin: stale reason, relist, the pods it missed are found.
- D14: pod IPs that are not IP literals and pods from another namespace are never mirrored,
  and are counted.

All waits are bounded polls.
"""

import os
import time

import subprocess

import pytest

from conftest import BINARY, Server, free_port
from ditto.v1 import twin_pb2 as pb
from fake_kube_api import FakeKubeApi
from test_live import BOUND_S, Fake, bounded_until, by_id, eventually, metric, snapshot
from test_live_limits import over_limit_marks
from test_hostile_bodies import PEAK_BOUND_BYTES

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
def serve(tmp_path):
    """`ditto serve` on a kubeconfig for `api`, with extra flags and environment."""
    servers = []

    def make(api, *args, scrape_ms=50, env_extra=None, wait=True):
        env = dict(os.environ)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env["KUBECONFIG"] = api.kubeconfig(str(tmp_path / "kubeconfig"))
        env.update(env_extra or {})
        server = Server(["--scrape-interval-ms", str(scrape_ms), "--retire-after-ms", "1500",
                         "--pods-selector", SELECTOR, "--pods-namespace", "llm-d", *args], env=env)
        servers.append(server)
        if wait:
            server.wait_serving()
        return server

    yield make
    for server in servers:
        code = server.terminate()
        os.unlink(server.log.name)
        assert code == 0, f"ditto serve exited {code}"


@pytest.fixture
def vllm():
    started = []

    def make(host="127.0.0.2"):
        fake = Fake(host, free_port())
        started.append(fake)
        return fake

    yield make
    for fake in started:
        fake.stop()


def status_kb(server, field):
    """VmRSS / VmHWM (kB) of the ditto process."""
    with open(f"/proc/{server.process.pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


def warnings_with(server, text):
    return [line for line in server.output().splitlines() if "WARN" in line and text in line]


def one_pod(api, serve, vllm, **kwargs):
    k = api()
    a = vllm()
    k.pod("vllm-a", a.host, LABELS)
    server = serve(k, "--pods-port", str(a.http_port), **kwargs)
    eventually(server, lambda i: "llm-d/vllm-a" in i and not i["llm-d/vllm-a"].stale_reason, "vllm-a mirrored")
    return k, a, server


def test_d4_a_pod_list_over_max_instances_mirrors_the_first_4096_and_leaves_out_the_rest(api, serve):
    k = api()
    # 5,000 Ready pods on distinct loopback addresses whose port nobody listens on (each
    # mirrored pod's scrape is refused at once; scrapes every 5 s keep the load small).
    port = free_port()
    names = [f"vllm-{i:04d}" for i in range(5000)]
    k.bulk_pods([(name, f"127.{1 + i // 250}.{i % 250}.{1 + i % 200}") for i, name in enumerate(names)], LABELS)
    server = serve(k, "--pods-port", str(port), scrape_ms=5000)
    bounded_until(lambda: metric(server, "ditto_live_pods") == 4096, "4,096 pods mirrored")
    assert metric(server, "ditto_live_pods_over_limit") == 904
    ids = sorted(by_id(snapshot(server)))
    assert ids == [f"llm-d/{name}" for name in names[:4096]], "the first 4,096 by namespace/name"
    # Each pod left out is marked stale on /metrics, one by one (never scraped).
    bounded_until(lambda: over_limit_marks(server) == [f"llm-d/{name}" for name in names[4096:]],
                  "the 904 left out marked")
    assert metric(server, "ditto_live_scrapes_total", instance="llm-d/vllm-4096") is None
    # Questions answer; health SERVING.
    server.wait_serving()
    question = pb.PredictRoutingRequest(request=pb.CandidateRequest(prompt_tokens=100, output_tokens=10), request_id="q",
                                        candidate_instance_ids=["llm-d/vllm-0000", "llm-d/vllm-4095"])
    reply = server.twin.PredictRouting(question, timeout=30)
    assert len(reply.candidates) > 0
    # Pods that sort first join while running: they take the place of the last ones.
    k.bulk_pods([(f"aaa-{i}", f"127.99.0.{i + 1}") for i in range(3)], LABELS)
    bounded_until(lambda: metric(server, "ditto_live_pods_over_limit") == 907, "907 left out")
    ids = sorted(by_id(snapshot(server)))
    assert len(ids) == 4096 and ids[:3] == ["llm-d/aaa-0", "llm-d/aaa-1", "llm-d/aaa-2"], ids[:4]
    assert ids[-1] == "llm-d/vllm-4092", ids[-1]
    # The three swapped out are marked now, and the marks follow the same order.
    bounded_until(lambda: over_limit_marks(server) == [f"llm-d/{name}" for name in names[4093:]],
                  "the 907 left out marked")
    server.wait_serving()
    output = server.output()
    assert "config sync rejected" not in output, "the pod set was refused whole"
    over = warnings_with(server, "more served pods than --max-instances")
    assert 1 <= len(over) <= 4, over


def test_d5_a_watch_line_without_a_newline_is_cut_and_the_source_relisted(api, serve, vllm):
    k, a, server = one_pod(api, serve, vllm)
    lists = k.count("pods", False)
    before = status_kb(server, "VmRSS")
    # 200 MiB of one event with no newline.
    k.hostile_watch("long_line", size=200 << 20)
    k.end_watches()
    reason = eventually(server, lambda i: i["llm-d/vllm-a"].stale_reason, "stale on the long line")
    assert "watch line passed 16777216 bytes" in reason, reason
    bounded_until(lambda: k.count("pods", False) > lists, "a relist")
    assert metric(server, "ditto_live_kube_failures_total", kind="line_too_long") >= 1
    peak = status_kb(server, "VmHWM")
    assert peak < before + 96 * 1024, f"peak RSS {peak} kB (was {before} kB before the line)"
    # Watches work again: the pod turns fresh, a new one (on the pool's port) is found.
    b = Fake("127.0.0.3", a.http_port)
    try:
        k.pod("vllm-b", b.host, LABELS)
        eventually(server, lambda i: sorted(i) == ["llm-d/vllm-a", "llm-d/vllm-b"]
                   and not any(x.stale_reason for x in i.values()), "recovered")
        assert status_kb(server, "VmRSS") < before + 48 * 1024, "the line's memory was returned"
    finally:
        b.stop()


def test_d5_an_inference_pool_watch_line_without_a_newline_is_cut_too(api, vllm, tmp_path):
    k = api()
    a = vllm()
    b = Fake("127.0.0.3", a.http_port)
    try:
        k.pod("decode-0", a.host, {"app": "vllm", "llm-d.ai/role": "decode"})
        k.pod("prefill-0", b.host, {"app": "vllm", "llm-d.ai/role": "prefill"})
        k.pool("qwen-pool", {"app": "vllm", "llm-d.ai/role": "decode"}, a.http_port)
        env = dict(os.environ)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env["KUBECONFIG"] = k.kubeconfig(str(tmp_path / "kubeconfig"))
        server = Server(["--scrape-interval-ms", "50", "--retire-after-ms", "1500", "--inference-pool", "qwen-pool",
                         "--pods-namespace", "llm-d"], env=env)
        try:
            server.wait_serving()
            eventually(server, lambda i: sorted(i) == ["llm-d/decode-0"], "the pool's pod")
            before = status_kb(server, "VmRSS")
            # 200 MiB of one InferencePool event with no newline.
            k.hostile_pool_watch("long_line", size=200 << 20)
            k.end_watches()
            bounded_until(lambda: (metric(server, "ditto_live_kube_failures_total", kind="line_too_long") or 0) >= 1,
                          "the pool's long line cut")
            peak = status_kb(server, "VmHWM")
            assert peak < before + 96 * 1024, f"peak RSS {peak} kB (was {before} kB before the line)"
            # The pool is followed again: its selector changes, its new pods are mirrored.
            k.pool("qwen-pool", {"app": "vllm", "llm-d.ai/role": "prefill"}, a.http_port)
            eventually(server, lambda i: sorted(i) == ["llm-d/prefill-0"], "the new selector's pods")
        finally:
            code = server.terminate()
            assert code == 0, server.output()
    finally:
        b.stop()


def test_an_oversized_inference_pool_object_is_dropped_at_the_object_cap(api, vllm, tmp_path):
    # Issue 38 D12/D13's residue: the InferencePool's one GET (at start, and before its watch
    # opens) went through kube-rs uncapped, which reads an answer whole, however large. It is
    # now read as every answer is: at most 2 MiB (etcd keeps no object over 1.5 MiB), dropped
    # as it passes the cap, counted, logged, and retried.
    k = api()
    a = vllm()
    k.pod("decode-0", a.host, LABELS)
    k.pool("qwen-pool", LABELS, a.http_port)
    # The start-up check's GET and discovery's first one answer a 200 MiB object.
    k.hostile_pool_get(200 << 20, times=2)
    env = dict(os.environ)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env["KUBECONFIG"] = k.kubeconfig(str(tmp_path / "kubeconfig"))
    server = Server(["--scrape-interval-ms", "50", "--inference-pool", "qwen-pool", "--pods-namespace", "llm-d"],
                    env=env)
    try:
        server.wait_serving()
        bounded_until(lambda: (metric(server, "ditto_live_kube_failures_total", kind="too_large") or 0) >= 1,
                      "the oversized object dropped")
        # Retried: the pool is followed and its pod mirrored.
        eventually(server, lambda i: sorted(i) == ["llm-d/decode-0"] and not i["llm-d/decode-0"].stale_reason,
                   "the pool's pod")
        assert not k.hostile_pool_gets, "both oversized answers were asked for"
        dropped = warnings_with(server, "passed 2097152 bytes")
        assert any("qwen-pool" in line for line in dropped), server.output()
        peak = status_kb(server, "VmHWM") * 1024
        print(f"peak RSS {peak / 2**20:.0f} MiB after two 200 MiB InferencePool answers")
        assert peak < PEAK_BOUND_BYTES, f"peak RSS {peak / 2**20:.0f} MiB"
    finally:
        code = server.terminate()
        assert code == 0, server.output()


def test_d8_a_watch_failing_after_every_good_list_backs_off(api, serve, vllm):
    k, a, server = one_pod(api, serve, vllm)
    lists = k.count("pods", False)
    k.fail("pods:watch", 500, 10**6)
    k.end_watches()
    reason = eventually(server, lambda i: i["llm-d/vllm-a"].stale_reason, "stale on the failing watch")
    assert "500" in reason, reason
    # For 12 s: the pod stays stale (no flapping) and LISTs come at a bounded rate.
    end = time.monotonic() + 12
    while time.monotonic() < end:
        inst = by_id(snapshot(server))["llm-d/vllm-a"]
        assert inst.stale_reason, "the pod turned fresh while every watch fails"
        time.sleep(0.1)
    relists = k.count("pods", False) - lists
    assert 1 <= relists <= 7, f"{relists} LISTs in 12 s"
    failing = warnings_with(server, "Kubernetes discovery failing")
    assert len(failing) == 1, failing
    assert "recovered" not in server.output()
    # Watches work again: recovered within the longest backoff.
    k.fail("pods:watch", 500, 0)
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        if not by_id(snapshot(server))["llm-d/vllm-a"].stale_reason:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("not recovered after the watch fault ended")


def test_d9_a_watch_silent_past_its_timeout_is_dead(api, serve, vllm):
    # The watch timeout (timeoutSeconds) is 2 s: a watch silent for 2 s + the margin is dead.
    k, a, server = one_pod(api, serve, vllm, env_extra={"DITTO_KUBE_WATCH_TIMEOUT_S": "2"})
    lists = k.count("pods", False)
    k.hostile_watch("hang")
    k.end_watches()
    # A pod joins while the watch hangs: only a relist can find it.
    b = Fake("127.0.0.3", a.http_port)
    try:
        k.pod("vllm-b", b.host, LABELS)
        reason = eventually(server, lambda i: i["llm-d/vllm-a"].stale_reason, "stale on the silent watch")
        assert "no byte from the API server" in reason or "outlived its deadline" in reason, reason
        eventually(server, lambda i: sorted(i) == ["llm-d/vllm-a", "llm-d/vllm-b"]
                   and not any(x.stale_reason for x in i.values()), "vllm-b found by the relist")
        assert k.count("pods", False) > lists
        assert metric(server, "ditto_live_kube_failures_total", kind="idle") >= 1
    finally:
        b.stop()


def test_d14_pod_ips_must_be_ip_literals_and_other_namespaces_are_ignored(api, serve, vllm):
    k = api()
    a = vllm()
    k.pod("vllm-a", a.host, LABELS)
    bad = ["not-an-ip", "999.1.1.1", "localhost", "127.0.0.1 evil", "1" * 10_000]
    for index, ip in enumerate(bad):
        k.pod(f"bad-{index}", ip, LABELS)
    k.pod("intruder", a.host, LABELS, namespace="other")
    k.leak_namespaces = True
    server = serve(k, "--pods-port", str(a.http_port))
    eventually(server, lambda i: sorted(i) == ["llm-d/vllm-a"] and not i["llm-d/vllm-a"].stale_reason, "only vllm-a")
    assert metric(server, "ditto_live_kube_pods_skipped_total", reason="invalid_ip") >= len(bad)
    assert metric(server, "ditto_live_kube_pods_skipped_total", reason="other_namespace") >= 1
    # The same through the watch: an intruder from another namespace, a pod with a host name.
    k.pod("intruder-2", a.host, LABELS, namespace="kube-system")
    k.pod("bad-late", "metadata.google.internal", LABELS)
    bounded_until(lambda: metric(server, "ditto_live_kube_pods_skipped_total", reason="other_namespace") >= 2,
                  "the watched intruder counted")
    bounded_until(lambda: metric(server, "ditto_live_kube_pods_skipped_total", reason="invalid_ip") >= len(bad) + 1,
                  "the watched bad IP counted")
    assert sorted(by_id(snapshot(server))) == ["llm-d/vllm-a"]
    assert metric(server, "ditto_live_pods") == 1


def test_bad_kube_watch_timeout_exits_naming_the_flag(api, tmp_path):
    k = api()
    env = dict(os.environ)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env["KUBECONFIG"] = k.kubeconfig(str(tmp_path / "kubeconfig"))
    done = subprocess.run([BINARY, "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
                           "--pods-selector", SELECTOR, "--pods-port", "8000", "--kube-watch-timeout-s", "0"],
                          env=env, capture_output=True, text=True, timeout=BOUND_S)
    assert done.returncode == 2 and "--kube-watch-timeout-s" in done.stderr, done.stderr

