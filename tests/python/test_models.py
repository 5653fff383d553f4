"""Any model: a pool of a Qwen3-32B fine-tune (not embedded) on H200, from `--model-dir` (name
normalised, `acme/qwen3-32b-support` -> DIR/qwen3-32b-support/config.json), from a pool's `model_config: PATH`, and from
SyncClusterConfig's `model_config_json`, answers --check-config, PredictRouting,
ForecastCapacity and the predictor's /predict. A config that is not an HF config is refused
naming the field (exit 2 / INVALID_ARGUMENT). Clients: grpcio and requests.
"""

import json
import os
import subprocess

import grpc
import pytest
import requests

from conftest import BINARY, ROOT, Server
from ditto.v1 import twin_pb2 as pb

MODELS = os.path.join(ROOT, "tests", "data", "models")
QWEN = os.path.join(MODELS, "qwen3-32b", "config.json")
ENTRY = {
    "kv_cache_percentage": 0.3, "input_token_length": 800, "num_request_waiting": 2,
    "num_request_running": 10, "num_tokens_generated": 0, "prefix_cache_score": 0.5,
    "pod_type": "", "prefill_tokens_in_flight": 1600, "decode_tokens_in_flight": 4000,
}


def cluster(tmp_path, model_line):
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "pools:\n"
        f"  - {{name: qwen, replicas: 2, {model_line} gpu: H200, tp: 1,\n"
        "     engine: {max_num_seqs: 128, max_num_batched_tokens: 8192}}\n"
    )
    return str(path)


def check(*args):
    return subprocess.run([BINARY, "serve", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("how", ["model-dir", "model_config"])
def test_qwen3_32b_on_h200_answers_every_api(tmp_path, how):
    if how == "model-dir":
        # A fine-tune the catalog does not embed (it embeds Qwen3-32B, and looks there first),
        # with Qwen3-32B's config.json in the model directory under its normalised name.
        models = tmp_path / "models"
        (models / "qwen3-32b-support").mkdir(parents=True)
        with open(QWEN) as source:
            (models / "qwen3-32b-support" / "config.json").write_text(source.read())
        config = cluster(tmp_path, "model: acme/qwen3-32b-support,")
        extra = ["--model-dir", str(models)]
    else:
        config = cluster(tmp_path, f"model: qwen3-32b, model_config: {QWEN},")
        extra = []
    done = check("--check-config", config, *extra)
    assert done.returncode == 0 and "2 instances" in done.stdout, done.stderr
    server = Server(["--config", config, *extra])
    try:
        server.wait_serving()
        snap = server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10)
        assert [i.instance_id for i in snap.instances] == ["qwen-0", "qwen-1"]
        assert {i.model for i in snap.config.instances} == {"qwen3-32b" if how == "model_config" else "acme/qwen3-32b-support"}
        message = pb.PredictRoutingRequest(
            request=pb.CandidateRequest(prompt_tokens=2000, output_tokens=256), request_id="q")
        message.options.replications = 1
        answer = server.twin.PredictRouting(message, timeout=60)
        assert [c.instance_id for c in answer.candidates] == ["qwen-0", "qwen-1"]
        assert all(c.valid and c.ttft_ms.mean > 0 and c.e2e_ms.mean > c.ttft_ms.mean for c in answer.candidates)
        forecast = pb.ForecastCapacityRequest(
            stages=[pb.RateStage(rate_rps=2.0, duration_s=10.0)],
            input_tokens=pb.LengthDistribution(constant=1024),
            output_tokens=pb.LengthDistribution(constant=128),
            variants=[pb.VariantCandidates(template_instance_id="qwen-0", replica_counts=[1, 2])],
            replications=1, seed=3)
        forecast.slo.ttft_ms = 2000.0
        capacity = server.twin.ForecastCapacity(forecast, timeout=120)
        assert len(capacity.candidates) == 2
        reply = requests.post(f"http://127.0.0.1:{server.http_port}/predict", json=ENTRY, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["ttft_ms"] > 0 and reply.json()["tpot_ms"] > 0
    finally:
        code = server.terminate()
        output = server.output()
        os.unlink(server.log.name)
        assert code == 0, output


def test_a_config_that_is_not_hf_is_refused_naming_the_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "not a model", "layers": "many"}))
    done = check("--check-config", cluster(tmp_path, f"model: mine, model_config: {bad},"))
    assert done.returncode == 2 and "pools[0].model_config" in done.stderr, done.stderr
    done = check("--check-config", cluster(tmp_path, f"model: mine, model_config: {tmp_path / 'missing.json'},"))
    assert done.returncode == 2 and "pools[0].model_config" in done.stderr and "missing.json" in done.stderr, done.stderr
    # A name that is neither embedded nor in the model dir names `model`.
    done = check("--check-config", cluster(tmp_path, "model: Qwen/Qwen9-1T,"), "--model-dir", MODELS)
    assert done.returncode == 2 and "pools[0].model" in done.stderr, done.stderr


def test_sync_cluster_config_takes_model_config_json():
    server = Server([])
    try:
        server.wait_serving()
        text = open(QWEN).read()
        spec = pb.InstanceSpec(id="qwen-a", model="acme/qwen3-32b-support", gpu="H200",
                               model_config_json=text)
        ack = server.twin.SyncClusterConfig(pb.ClusterConfig(instances=[spec]), timeout=10)
        assert ack.changed
        message = pb.PredictRoutingRequest(
            request=pb.CandidateRequest(prompt_tokens=1000, output_tokens=64), request_id="q")
        message.options.replications = 1
        answer = server.twin.PredictRouting(message, timeout=60)
        assert [c.instance_id for c in answer.candidates] == ["qwen-a"] and answer.candidates[0].valid
        # GetSnapshot hands the config back with the model's config text, so it re-syncs as is
        # (without it, `acme/qwen3-32b-support` is not an embedded model and the sync is refused).
        echoed = server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10).config
        assert json.loads(echoed.instances[0].model_config_json) == json.loads(text)
        again = server.twin.SyncClusterConfig(echoed, timeout=10)
        assert not again.changed, "the echoed config differs from the one synced"
        bad = pb.InstanceSpec(id="qwen-b", model="mine", gpu="H200", model_config_json='{"hidden_size": "big"}')
        with pytest.raises(grpc.RpcError) as caught:
            server.twin.SyncClusterConfig(pb.ClusterConfig(instances=[bad]), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "instances[0].model_config_json" in caught.value.details(), caught.value.details()
    finally:
        code = server.terminate()
        os.unlink(server.log.name)
        assert code == 0
