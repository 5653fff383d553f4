"""vLLM's native KV-offload connector (OffloadingConnector's `cpu_bytes_to_use`) through the
Twin API's `EngineLimits.kv_offload_cpu_bytes`.

An independently written client: it syncs a Llama-3.1-8B instance on H100 with a CPU tier of
100 GiB and 1000 bytes and checks that the config is taken (a change from the same instance
without it), that GetSnapshot echoes the tier as vLLM sizes it (whole blocks: one 16-token
block of Llama-3.1-8B is 2 MiB of K and V in bf16 over 32 layers of 8 KV heads of 128, worked
out here from its config.json), that the echo re-syncs as a no-op, and that bad values are
refused with INVALID_ARGUMENT naming the field.
"""

import json
import os

import grpc
import pytest

from ditto.v1 import twin_pb2 as pb

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
NOW_US = 2_000_000
TIER_BYTES = 100 * 2**30 + 1000


def llama_8b_block_bytes():
    path = os.path.join(ROOT, "data/model_configs/llama-3.1-8b-instruct/config.json")
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * 2 * 16


def instance(cpu_bytes=None):
    engine = pb.EngineLimits(max_num_seqs=8, max_model_len=8192)
    if cpu_bytes is not None:
        engine.kv_offload_cpu_bytes = cpu_bytes
    return pb.InstanceSpec(
        id="a", address="a-addr", model="llama-3.1-8b-instruct", gpu="H100", engine=engine
    )


def snapshot(server):
    return server.twin.GetSnapshot(pb.GetSnapshotRequest(now_us=NOW_US), timeout=10)


def sync(server, spec):
    return server.twin.SyncClusterConfig(pb.ClusterConfig(instances=[spec]), timeout=10).changed


def test_a_pushed_connector_is_taken_and_echoed_in_whole_blocks(server):
    assert sync(server, instance())
    assert not snapshot(server).config.instances[0].engine.HasField("kv_offload_cpu_bytes")
    assert sync(server, instance(TIER_BYTES)), "the connector changes the instance"
    snap = snapshot(server)
    block = llama_8b_block_bytes()
    echoed = snap.config.instances[0].engine.kv_offload_cpu_bytes
    assert echoed == TIER_BYTES // block * block, (echoed, block)
    assert not server.twin.SyncClusterConfig(snap.config, timeout=10).changed
    assert sync(server, instance()), "dropping the connector changes the instance again"


@pytest.mark.parametrize("cpu_bytes", [0, -1, -(2**40)], ids=["zero", "minus-one", "negative"])
def test_bad_tiers_are_refused_naming_the_field(server, cpu_bytes):
    before = snapshot(server)
    with pytest.raises(grpc.RpcError) as caught:
        sync(server, instance(cpu_bytes))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    details = caught.value.details()
    assert "instances[0].engine.kv_offload_cpu_bytes" in details, details
    assert snapshot(server) == before
