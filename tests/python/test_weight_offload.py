"""Weights offloaded to host memory (vLLM's --cpu-offload-gb) through the Twin API.

An independently written client: it syncs two otherwise identical Llama-3.1-8B instances on
H100, one with `engine.cpu_offload_gb` set, and checks that the offloading one has more KV
blocks (its offloaded bytes, in 2 MiB blocks) and a slower decode step (the bytes over the
H100's host link from data/gpu_host_link.json), that the echoed config re-syncs as a no-op,
and that bad values are refused with INVALID_ARGUMENT naming the field. The offloaded bytes
are worked out here from the model's config.json the way vLLM's offloader walks the decoder
layers (whole parameters, in order, checked before each), not read from ditto.
"""

import json
import math
import os

import grpc
import pytest

from ditto.v1 import twin_pb2 as pb

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
NOW_US = 2_000_000


def repo_json(relative):
    with open(os.path.join(ROOT, relative), encoding="utf-8") as handle:
        return json.load(handle)


def llama_8b_offloaded_bytes(gib):
    config = repo_json("data/model_configs/llama-3.1-8b-instruct/config.json")
    d = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    d_ff = config["intermediate_size"]
    head_dim = d // heads
    # bf16; qkv_proj, o_proj, gate_up_proj, down_proj, input and post-attention norms.
    layer = [
        d * (heads + 2 * kv_heads) * head_dim * 2,
        heads * head_dim * d * 2,
        2 * d_ff * d * 2,
        d_ff * d * 2,
        d * 2,
        d * 2,
    ]
    budget = int(gib * 2**30)
    moved = 0
    for _ in range(config["num_hidden_layers"]):
        for size in layer:
            if moved >= budget:
                return moved
            moved += size
    return moved


def instance(instance_id, offload=None, latency_model=""):
    engine = pb.EngineLimits(max_num_seqs=8, max_model_len=8192)
    if offload is not None:
        engine.cpu_offload_gb = offload
    return pb.InstanceSpec(
        id=instance_id,
        address=f"{instance_id}-addr",
        model="llama-3.1-8b-instruct",
        gpu="H100",
        latency_model=latency_model,
        engine=engine,
    )


def snapshot(server):
    return server.twin.GetSnapshot(pb.GetSnapshotRequest(now_us=NOW_US), timeout=10)


def test_an_offloading_instance_has_more_blocks_and_slower_steps(server):
    config = pb.ClusterConfig(instances=[instance("plain"), instance("offload", 2.0)])
    assert server.twin.SyncClusterConfig(config, timeout=10).changed
    snap = snapshot(server)
    plain, offload = snap.config.instances
    assert offload.engine.cpu_offload_gb == 2.0
    assert not plain.engine.HasField("cpu_offload_gb")
    offloaded = llama_8b_offloaded_bytes(2.0)
    block_bytes = 32 * 2 * 8 * 128 * 2 * 16  # layers, K and V, KV heads, head dim, bf16, tokens
    grown = offload.engine.num_gpu_blocks - plain.engine.num_gpu_blocks
    assert abs(grown - offloaded // block_bytes) <= 1, grown
    # The echoed config is the same config.
    assert not server.twin.SyncClusterConfig(snap.config, timeout=10).changed

    message = pb.PredictRoutingRequest(
        request=pb.CandidateRequest(prompt_tokens=500, output_tokens=64, max_tokens=64),
        request_id="q",
        now_us=NOW_US,
    )
    message.options.replications = 1
    message.options.seed = 5
    answer = server.twin.PredictRouting(message, timeout=60)
    by_id = {c.instance_id: c for c in answer.candidates}
    assert by_id["plain"].valid and by_id["offload"].valid
    link_gbs = repo_json("data/gpu_host_link.json")["H100"]["HostLinkGBs"]
    step_ms = offloaded / (link_gbs * 1e9) * 1e3
    added = by_id["offload"].tpot_ms.mean - by_id["plain"].tpot_ms.mean
    assert math.isclose(added, step_ms, rel_tol=0.01), (added, step_ms)
    assert answer.recommended_instance_id == "plain"


@pytest.mark.parametrize(
    "spec",
    [
        instance("a", -1.0),
        instance("a", float("nan")),
        instance("a", float("inf")),
        instance("a", 40.0),  # Llama-3.1-8B has 13 GiB of decoder layers at TP 1
        instance("a", 1.0, latency_model="blackbox"),
    ],
    ids=["negative", "nan", "inf", "more-than-the-weights", "blackbox"],
)
def test_bad_offloads_are_refused_naming_the_field(server, spec):
    before = snapshot(server)
    with pytest.raises(grpc.RpcError) as caught:
        server.twin.SyncClusterConfig(pb.ClusterConfig(instances=[spec]), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert "instances[0].engine.cpu_offload_gb" in caught.value.details(), caught.value.details()
    assert snapshot(server) == before
