"""The EPP's latency-predictor client (stand-in: epp_predictor_client.py, from llm-d-router's Go
source) driven against a real `ditto serve` in the pod layout llm-d's router chart renders for a
sidecar: the EPP and ditto in one pod, PREDICTION_SERVER_URL = TRAINING_SERVER_URL =
http://127.0.0.1:<ditto's API port>, the API on loopback and probes and metrics on their own
listener (--metrics-addr).

ditto mirrors a Qwen3-32B pool found through a stand-in Kubernetes API (fake_kube_api.py, an
InferencePool, its pods and their H100 node) with fake vLLM pods (fake_vllm.py), with no
cluster YAML: it infers what the pods serve from their `vllm serve` arguments (model, TP 2)
and their node's GPU label, and finds Qwen/Qwen3-32B's published config.json in --model-dir,
as the chart's sidecar would.

The client must get predictions through its coalescer (each caller its own answers, in order),
have its sampled training batches accepted (202), refresh status and model info every
interval, stay on the remote path (no tree download, no in-process Bayesian ridge) and log
nothing above debug.
"""

import json
import os
import threading
import time
import urllib.request

import pytest

from conftest import Server, free_port
from epp_predictor_client import EppPredictorClient, prediction_request, training_entry
from fake_kube_api import FakeKubeApi
from test_http_limits import bound_metrics_port
from test_live import Fake, eventually, gauges_are

BOUND_S = 30.0
LABELS = {"llm-d.ai/inferenceServing": "true", "llm-d.ai/model": "qwen3-32b"}

# Qwen/Qwen3-32B's config.json as published on the Hugging Face Hub.
QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 25600,
    "max_position_embeddings": 40960,
    "max_window_layers": 64,
    "model_type": "qwen3",
    "num_attention_heads": 64,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def bounded_until(check, what, bound=BOUND_S):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not {what} within {bound} s")


@pytest.fixture
def sidecar(tmp_path):
    """ditto as the chart's sidecar, mirroring a Qwen3-32B InferencePool of two pods."""
    api = FakeKubeApi()
    port = free_port()
    pods = [Fake("127.0.0.2", port), Fake("127.0.0.3", port)]
    server = None
    try:
        pods[0].control(gauges=dict(running=3, waiting=0, kv=0.25))
        pods[1].control(gauges=dict(running=1, waiting=2, kv=0.6))
        vllm = [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                 "command": ["vllm", "serve"],
                 "args": ["Qwen/Qwen3-32B", "--tensor-parallel-size", "2", "--port", "8200"],
                 "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
        api.node("h100-node-1", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
        api.pod("qwen3-32b-decode-0", pods[0].host, LABELS, containers=vllm, node="h100-node-1")
        api.pod("qwen3-32b-decode-1", pods[1].host, LABELS, containers=vllm, node="h100-node-1")
        api.pool("qwen3-32b", LABELS, port)
        (tmp_path / "models" / "qwen3-32b").mkdir(parents=True)
        (tmp_path / "models" / "qwen3-32b" / "config.json").write_text(json.dumps(QWEN3_32B))
        env = dict(os.environ)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env["KUBECONFIG"] = api.kubeconfig(str(tmp_path / "kubeconfig"))
        env["HF_HUB_CACHE"] = str(tmp_path / "empty-hf-cache")
        # The chart configures the predictor for the mean; ditto reads the same variable.
        env["LATENCY_OBJECTIVE_TYPE"] = "mean"
        server = Server([
            "--model-dir", str(tmp_path / "models"),
            "--inference-pool", "qwen3-32b", "--pods-namespace", "llm-d",
            "--scrape-interval-ms", "50",
            "--metrics-addr", "127.0.0.1:0",
        ], env=env)
        server.wait_serving()
        server.metrics_port = bound_metrics_port(server)
        found = eventually(
            server,
            lambda i: sorted(i) == ["llm-d/qwen3-32b-decode-0", "llm-d/qwen3-32b-decode-1"]
            and gauges_are(i["llm-d/qwen3-32b-decode-0"], 3, 0, 0.25)
            and all(x.HasField("inferred") and not x.stale_reason for x in i.values()) and i,
            "the pool mirrored and inferred")
        # What the pods run, from their arguments and their node, not the embedded default.
        for instance in found.values():
            inferred = instance.inferred
            assert (inferred.model, inferred.gpu, inferred.tp) == ("Qwen/Qwen3-32B", "H100", 2), inferred
        yield server
    finally:
        if server is not None:
            code = server.terminate()
            output = server.output()
            os.unlink(server.log.name)
            assert code == 0, f"ditto serve exited {code}:\n{output}"
        for pod in pods:
            pod.stop()
        api.close()


def epp_env(server, **extra):
    url = f"http://127.0.0.1:{server.http_port}"
    env = {"PREDICTION_SERVER_URL": url, "TRAINING_SERVER_URL": url,
           "LATENCY_METRICS_INTERVAL_SEC": "1", "LATENCY_FLUSH_INTERVAL_SEC": "1",
           "LATENCY_COALESCE_WINDOW_MS": "20", "LATENCY_HTTP_TIMEOUT_SEC": "20"}
    env.update(extra)
    return env


def candidates(caller):
    """Two candidate pods as one scheduling cycle asks for them; distinct per caller."""
    return [
        prediction_request(0.1, 200 + 64 * caller, 0, 1, 0, 0.0),
        prediction_request(0.5, 1000 + 32 * caller, 1, 2, 0, 0.5),
    ]


def test_the_epp_client_predicts_trains_and_refreshes_quietly(sidecar):
    client = EppPredictorClient(epp_env(sidecar, LATENCY_MAX_SAMPLE_SIZE="60"))
    try:
        client.start()
        assert client.is_ready(), (client.server_status, client.model_info)
        assert client.objective_type() == "mean"

        # What each caller should get: its own rows asked one call at a time (before any
        # training, so the calibration is the same for both ways of asking).
        callers = 12
        expected = []
        for caller in range(callers):
            body = json.dumps({"requests": candidates(caller)}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{sidecar.http_port}/predict/bulk/strict",
                                             data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=20) as reply:
                expected.append([p["ttft_ms"] for p in json.loads(reply.read())["predictions"]])

        # Concurrent scheduling cycles, coalesced by the client into fewer HTTP calls.
        calls_before = sum(1 for c in client.calls if c[1] == "/predict/bulk/strict")
        answers, errors = [None] * callers, []
        start = threading.Barrier(callers)

        def cycle(caller):
            try:
                start.wait(timeout=10)
                answers[caller] = client.predict_bulk_strict(candidates(caller))
            except Exception as err:  # noqa: BLE001 - reported below
                errors.append(repr(err))

        threads = [threading.Thread(target=cycle, args=(caller,)) for caller in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=BOUND_S)
        assert not errors, errors
        posts = [c for c in client.calls if c[1] == "/predict/bulk/strict"][calls_before:]
        assert all(status == 200 for _, _, status in posts), posts
        assert len(posts) < callers, f"{len(posts)} calls for {callers} callers: nothing coalesced"
        for caller, answer in enumerate(answers):
            assert len(answer["predictions"]) == 2
            got = [p["ttft_ms"] for p in answer["predictions"]]
            assert got == pytest.approx(expected[caller], rel=1e-9), (caller, got, expected[caller])
            for prediction in answer["predictions"]:
                assert prediction["ttft_ms"] > 0 and prediction["tpot_ms"] > 0
                assert prediction["objective_type"] == "mean"

        # The single-request path goes to ditto too (POST /predict), not in process.
        single = client.predict(candidates(0)[0])
        assert single["ttft_ms"] == pytest.approx(expected[0][0], rel=1e-9)

        # Training: 100 TTFT and 50 TPOT samples buffered, sampled down to 60 in proportion
        # (40 + 20) and posted in one call on the next flush.
        entries = [training_entry(0.2, 512, 0, 2, 0, 0.0, 180.0 + i, 0.0) for i in range(100)]
        entries += [training_entry(0.2, 512, 0, 2, 64, 0.0, 0.0, 30.0 + i / 10) for i in range(50)]
        client.add_training_data_bulk(entries)
        bounded_until(lambda: any(c[1] == "/add_training_data_bulk" for c in client.calls), "a flush")
        trainings = [c for c in client.calls if c[1] == "/add_training_data_bulk"]
        assert trainings == [("POST", "/add_training_data_bulk", 202)], trainings
        ((sent, _, reply),) = client.flushed
        assert sum(1 for e in sent if e["actual_ttft_ms"] > 0) == 40
        assert sum(1 for e in sent if e["actual_tpot_ms"] > 0) == 20
        assert json.loads(reply)["message"] == "Accepted 60 training samples."
        with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.http_port}/data/status", timeout=10) as reply:
            absorbed = json.loads(reply.read())["training_data"]
        assert absorbed["ttft_samples"] > 0 and absorbed["tpot_samples"] > 0, absorbed

        # Two periodic refreshes: model info then status each time, nothing else fetched.
        bounded_until(lambda: client.refreshes >= 2, "two refreshes")
        paths = {path for _, path, _ in client.calls}
        assert {"/model/download/info", "/status"} <= paths, paths
        assert not [p for p in paths if "/xgb/" in p or p == "/metrics"], paths
        assert all(status == 200 for method, path, status in client.calls
                   if path in ("/model/download/info", "/status")), client.calls
    finally:
        client.stop()
    assert client.unexpected() == [], client.unexpected()
    # The probes and Prometheus have their own listener; the API port keeps answering them too.
    with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    assert 'ditto_live_pods 2' in text


@pytest.mark.parametrize("native", ["true", "false"])
def test_the_refresh_neither_downloads_nor_warns_whatever_the_xgboost_setting(sidecar, native):
    client = EppPredictorClient(epp_env(sidecar, LATENCY_USE_NATIVE_XGBOOST=native))
    try:
        client.start()
        bounded_until(lambda: client.refreshes >= 1, "a refresh")
    finally:
        client.stop()
    assert client.downloads == [] and client.in_process == []
    assert client.unexpected() == [], client.unexpected()
    assert client.is_ready()
