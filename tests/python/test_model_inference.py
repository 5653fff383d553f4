"""What each pod runs, inferred from what ditto can read, with no hand-written pool.

A stand-in Kubernetes API (fake_kube_api.py: pods with their container args, GPU resources and
`spec.nodeName`, nodes with GPU feature discovery's `nvidia.com/gpu.product` label, 403 for a
service account without a ClusterRole on nodes) and fake vLLM pods (fake_vllm.py, serving the
model name they are given as `model_name`). `ditto serve --inference-pool NAME` with no
`--config` must simulate the pods as they are (model from the args or `model_name`, its
config.json from the catalog, the model directory or an HF cache, TP from the args or the GPU
request, GPU from the node), show it with each value's source on GetSnapshot and
`ditto_live_inferred`, hold a pod whose model has no config stale with a reason naming it, fall
back to `--default-gpu` (else the pool's) when nodes cannot be read, and let a cluster YAML's
explicit pool fields win. Waits are bounded polls.

The model directory is given with `--model-dir` (once as its variable `DITTO_MODEL_DIR`).
"""

import json
import os
import subprocess

import pytest

from conftest import BINARY, Server, free_port
from ditto.v1 import twin_pb2 as pb
from fake_kube_api import FakeKubeApi
from test_live import Fake, eventually, metric, snapshot

LABELS = {"app": "vllm", "llm-d.ai/inferenceServing": "true"}

# The pods serve a fine-tune of Qwen3-32B that the catalog does not embed (Qwen3-32B itself
# is embedded since stop 35, and the catalog is looked in first), with Qwen3-32B's config.json,
# so its config comes from --model-dir or the HF cache.
MODEL = "acme/qwen3-32b-support"

# Qwen/Qwen3-32B's published config.json (huggingface.co/Qwen/Qwen3-32B/blob/main/config.json).
QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120,
    "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 25600, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000, "torch_dtype": "bfloat16",
    "attention_bias": False, "hidden_act": "silu", "tie_word_embeddings": False,
}


def vllm_container(args, gpus=None, shell=False):
    """A vLLM container as llm-d's modelservice renders one (`vllm serve MODEL ...`)."""
    container = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                 "ports": [{"containerPort": 8200, "protocol": "TCP"}]}
    if shell:
        container["command"] = ["/bin/sh", "-c"]
        container["args"] = ["exec vllm serve " + " ".join(args)]
    else:
        container["command"] = ["vllm", "serve"]
        container["args"] = list(args)
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)},
                                  "requests": {"nvidia.com/gpu": str(gpus)}}
    return [{"name": "routing-proxy", "image": "llm-d-routing-sidecar", "args": ["--port=8000"]}, container]


@pytest.fixture
def cluster(tmp_path):
    """A stand-in API server with an InferencePool `qwen-pool`, fake pods on one port, and
    `serve(*args, env=...)` starting ditto against it."""
    api = FakeKubeApi()
    port = free_port()
    fakes, servers = [], []

    def pod(name, model, containers, node=None):
        fake = Fake(f"127.0.0.{len(fakes) + 2}", port, model=model)
        fakes.append(fake)
        api.pod(name, fake.host, LABELS, containers=containers, node=node)
        return fake

    def serve(*args, env=None):
        full = dict(os.environ)
        full.pop("KUBERNETES_SERVICE_HOST", None)
        full["KUBECONFIG"] = api.kubeconfig(str(tmp_path / "kubeconfig"))
        full["HF_HUB_CACHE"] = str(tmp_path / "empty-hf-cache")
        full.update(env or {})
        server = Server(["--scrape-interval-ms", "50", "--inference-pool", "qwen-pool",
                         "--pods-namespace", "llm-d", *args], env=full)
        servers.append(server)
        server.wait_serving()
        return server

    api.pool("qwen-pool", LABELS, port)
    api.node("h100-node-1", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    api.node("a100-node-1", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    api.node("cpu-node-1", {})
    model_dir = tmp_path / "models"
    (model_dir / "qwen3-32b-support").mkdir(parents=True)
    (model_dir / "qwen3-32b-support" / "config.json").write_text(json.dumps(QWEN3_32B))
    yield api, pod, serve, model_dir
    for server in servers:
        code = server.terminate()
        output = server.output()
        os.unlink(server.log.name)
        assert code == 0, f"ditto serve exited {code}:\n{output}"
    for fake in fakes:
        fake.stop()
    api.close()


def config_of(server, instance_id):
    (spec,) = [i for i in snapshot(server).config.instances if i.id == instance_id]
    return spec


def sources(setup):
    return (setup.model_source, setup.config_source, setup.gpu_source, setup.tp_source)


def test_a_qwen3_32b_pool_is_found_and_simulated_as_it_runs(cluster):
    api, pod, serve, model_dir = cluster
    pod("qwen-0", MODEL,
        vllm_container([MODEL, "--port", "8200", "--tensor-parallel-size", "2",
                        "--max-num-seqs", "128"], gpus=2), node="h100-node-1")
    # TP from the GPU request (4 / data-parallel 2 = 2), a shell script, another GPU: another pool.
    pod("qwen-1", MODEL,
        vllm_container([MODEL, "--port", "8200", "--data-parallel-size", "2"], gpus=4,
                       shell=True), node="a100-node-1")
    server = serve("--model-dir", str(model_dir))
    found = eventually(server, lambda i: sorted(i) == ["llm-d/qwen-0", "llm-d/qwen-1"]
                       and all(x.HasField("inferred") and x.HasField("gauges") and not x.stale_reason
                               for x in i.values()) and i, "both pods inferred")
    a, b = found["llm-d/qwen-0"].inferred, found["llm-d/qwen-1"].inferred
    assert (a.model, a.gpu, a.tp) == (MODEL, "H100", 2), a
    assert sources(a) == ("pod-args", "model-dir", "node-label", "pod-args"), a
    assert (b.model, b.gpu, b.tp) == (MODEL, "A100-80", 2), b
    assert sources(b) == ("pod-args", "model-dir", "node-label", "gpu-request"), b
    assert a.pool != b.pool and a.pool.startswith("qwen3-32b-support-h100-tp2"), (a.pool, b.pool)
    # The simulated instances are what the pods run (not the embedded llama on H100).
    spec_a, spec_b = config_of(server, "llm-d/qwen-0"), config_of(server, "llm-d/qwen-1")
    assert (spec_a.model, spec_a.gpu, spec_a.tp) == (MODEL, "H100", 2), spec_a
    assert spec_a.engine.max_num_seqs == 128 and spec_a.engine.max_model_len == 40960, spec_a.engine
    assert json.loads(spec_a.model_config_json)["num_hidden_layers"] == 64
    assert (spec_b.gpu, spec_b.tp) == ("A100-80", 2), spec_b
    assert metric(server, "ditto_live_inferred", instance="llm-d/qwen-0", model=MODEL, gpu="H100",
                  tp="2", model_source="pod-args", gpu_source="node-label", tp_source="pod-args") == 1
    question = pb.PredictRoutingRequest(
        request=pb.CandidateRequest(prompt_tokens=1000, output_tokens=100), request_id="q")
    reply = server.twin.PredictRouting(question, timeout=30)
    assert {c.instance_id for c in reply.candidates} == {"llm-d/qwen-0", "llm-d/qwen-1"}, reply
    assert reply.recommended_instance_id in ("llm-d/qwen-0", "llm-d/qwen-1"), reply
    assert all(c.valid and c.ttft_ms.mean > 0 for c in reply.candidates), reply


def test_the_model_name_comes_from_metrics_when_the_args_have_none(cluster):
    api, pod, serve, _ = cluster
    # A container whose command line does not name the model (an image's own entrypoint):
    # the served `model_name` on /metrics names it, the catalog has it.
    pod("qwen14-0", "Qwen/Qwen3-14B", [{"name": "vllm", "image": "custom/vllm-entrypoint",
                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        node="h100-node-1")
    server = serve()
    found = eventually(server, lambda i: "llm-d/qwen14-0" in i and i["llm-d/qwen14-0"].inferred.model
                       and not i["llm-d/qwen14-0"].stale_reason and i["llm-d/qwen14-0"].inferred, "inferred")
    assert (found.model, found.gpu, found.tp) == ("Qwen/Qwen3-14B", "H100", 1), found
    assert sources(found) == ("metrics", "catalog", "node-label", "gpu-request"), found


def test_a_model_without_a_config_is_stale_naming_it(cluster):
    api, pod, serve, model_dir = cluster
    pod("qwen-0", MODEL, vllm_container([MODEL, "-tp", "2"], gpus=2), node="h100-node-1")
    pod("mystery-0", "acme/mystery-70b", vllm_container(["acme/mystery-70b", "-tp", "4"], gpus=4),
        node="h100-node-1")
    server = serve(env={"DITTO_MODEL_DIR": str(model_dir)})
    reason = eventually(server, lambda i: "llm-d/mystery-0" in i and i["llm-d/mystery-0"].stale_reason,
                        "the unknown model stale")
    assert ("inference: model acme/mystery-70b: no config.json in the catalog, --model-dir or the HF cache"
            in reason), reason
    assert str(model_dir / "mystery-70b" / "config.json") in reason, reason
    mystery = snapshot(server)
    (inst,) = [i for i in mystery.instances if i.instance_id == "llm-d/mystery-0"]
    assert (inst.inferred.model, inst.inferred.model_source, inst.inferred.config_source) == \
        ("acme/mystery-70b", "pod-args", ""), inst.inferred
    assert metric(server, "ditto_live_stale", instance="llm-d/mystery-0", signal="inference") == 1
    assert metric(server, "ditto_live_inferred", instance="llm-d/mystery-0", model="acme/mystery-70b") == 0
    lines = [line for line in server.output().splitlines() if "cannot infer what the pod runs" in line]
    assert len(lines) == 1 and "acme/mystery-70b" in lines[0], server.output()
    # The pod that can be inferred is served; the stale one is never recommended
    # (treat-saturated, the live default).
    eventually(server, lambda i: not i["llm-d/qwen-0"].stale_reason and i["llm-d/qwen-0"].HasField("gauges"),
               "qwen-0 fresh")
    question = pb.PredictRoutingRequest(
        request=pb.CandidateRequest(prompt_tokens=500, output_tokens=50), request_id="q")
    reply = server.twin.PredictRouting(question, timeout=30)
    assert reply.recommended_instance_id == "llm-d/qwen-0", reply


def test_forbidden_nodes_fall_back_to_the_default_gpu_and_say_so_once(cluster):
    api, pod, serve, model_dir = cluster
    api.forbid_nodes()
    pod("qwen-0", MODEL, vllm_container([MODEL, "-tp", "2"], gpus=2), node="h100-node-1")
    pod("qwen-1", MODEL, vllm_container([MODEL, "-tp", "2"], gpus=2), node="a100-node-1")
    server = serve("--default-gpu", "L40S", "--model-dir", str(model_dir))
    found = eventually(server, lambda i: len(i) == 2 and all(x.inferred.gpu for x in i.values()) and i,
                       "both inferred")
    for inst in found.values():
        assert (inst.inferred.gpu, inst.inferred.gpu_source) == ("L40S", "default-gpu"), inst.inferred
        assert not inst.stale_reason, inst.stale_reason
    warnings = [line for line in server.output().splitlines() if "forbids get on nodes" in line]
    assert len(warnings) == 1, server.output()
    assert sum(1 for kind, _ in api.requests if kind == "nodes") == 1, "a 403 on nodes is not asked again"


def test_without_a_default_gpu_the_pools_gpu_is_used_and_a_node_without_the_label_too(cluster):
    api, pod, serve, model_dir = cluster
    pod("qwen-0", MODEL, vllm_container([MODEL, "-tp", "2"], gpus=2), node="cpu-node-1")
    server = serve(env={"DITTO_MODEL_DIR": str(model_dir)})
    inst = eventually(server, lambda i: "llm-d/qwen-0" in i and i["llm-d/qwen-0"].inferred.gpu
                      and i["llm-d/qwen-0"].inferred, "inferred")
    # The embedded default cluster's pool runs on H100.
    assert (inst.gpu, inst.gpu_source) == ("H100", "pool"), inst


def test_a_yaml_pool_overrides_what_is_inferred(cluster, tmp_path):
    api, pod, serve, model_dir = cluster
    pod("qwen-0", MODEL,
        vllm_container([MODEL, "-tp", "2", "--max-num-seqs", "512"], gpus=2), node="a100-node-1")
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "pools:\n  - {name: vllm, model: qwen3-14b, tp: 1, engine: {max_num_seqs: 64}}\n")
    # --infer on: the pool's explicit fields (model, tp, max_num_seqs) win; the GPU, which it
    # does not set, is the node's.
    server = serve("--config", str(config), "--infer", "on", "--model-dir", str(model_dir))
    inst = eventually(server, lambda i: "llm-d/qwen-0" in i and i["llm-d/qwen-0"].HasField("inferred")
                      and i["llm-d/qwen-0"], "inferred")
    setup = inst.inferred
    assert (setup.model, setup.model_source, setup.tp, setup.tp_source) == ("qwen3-14b", "pool", 1, "pool"), setup
    assert (setup.gpu, setup.gpu_source) == ("A100-80", "node-label"), setup
    spec = config_of(server, "llm-d/qwen-0")
    assert (spec.model, spec.gpu, spec.tp, spec.engine.max_num_seqs) == ("qwen3-14b", "A100-80", 1, 64), spec
    # With a cluster file and the default --infer auto, the pool is simulated as configured.
    plain = serve("--config", str(config), env={"DITTO_MODEL_DIR": str(model_dir)})
    inst = eventually(plain, lambda i: "llm-d/qwen-0" in i and i["llm-d/qwen-0"], "mirrored")
    assert not inst.HasField("inferred"), inst.inferred
    spec = config_of(plain, "llm-d/qwen-0")
    assert (spec.model, spec.gpu, spec.tp) == ("qwen3-14b", "H100", 1), spec


def test_a_bad_default_gpu_exits_naming_the_flag(cluster, tmp_path):
    api, _, _, _ = cluster
    env = dict(os.environ)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env["KUBECONFIG"] = api.kubeconfig(str(tmp_path / "kubeconfig"))
    done = subprocess.run(
        [BINARY, "serve", "--inference-pool", "qwen-pool", "--pods-namespace", "llm-d", "--default-gpu", "Z80",
         "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
        env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--default-gpu" in done.stderr and "Z80" in done.stderr, done.stderr
