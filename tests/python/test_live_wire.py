"""The live mirror against fake vLLM pods speaking vLLM's real wire in its harder cases
(fake_vllm.py, written from vLLM's source): busy pods beyond the pool's limits are capped,
never frozen; data-parallel pods are one instance with their engines' limits; every wire era,
int and byte hashes, unknown event types and `group_idx`; the empty default topic; KV
streams that survive restarts (blocks stored while ditto was not listening are replayed);
and prefixes matched by token ids on a pod whose vLLM hashes from a random seed.
"""

import json
import random
import time

import pytest

from test_live import (
    BOUND_S,
    Fake,
    by_id,
    eventually,
    free_port,
    free_port_on,
    metric,
    serve,  # noqa: F401 (a fixture)
    snapshot,
)
from ditto.v1 import twin_pb2 as pb


class WireFake(Fake):
    """A fake pod with fake_vllm's newer switches (DP engines, topic, startup batches)."""

    def __init__(self, host, http_port, pub_port=0, replay_port=0, extra=()):
        self.extra = list(extra)
        super().__init__(host, http_port, pub_port, replay_port)

    def start(self):
        if self.extra:
            self.args += self.extra
            self.extra = []
        super().start()


@pytest.fixture
def pods(request):
    started = []

    def make(count, kv=True, extra=()):
        pub = free_port() if kv else 0
        rep = free_port() if kv else 0
        if kv and any(arg == "--dp-size" for arg in extra):
            # Ranks bind pub + r and rep + r: keep the ranges apart.
            rep = pub + 10
        # The ZMQ ports every rank binds on the pod's address (pub + r, rep + r): the HTTP
        # port must be none of them.
        zmq_ports = {port + rank for port in (pub, rep) if port for rank in range(16)}
        made = []
        for index in range(count):
            host = f"127.0.0.{index + 20}"
            made.append(WireFake(host, free_port_on(host, avoid=zmq_ports), pub, rep, extra))
        started.extend(made)
        return made, pub, rep

    yield make
    for fake in started:
        fake.stop()


@pytest.fixture
def serve_wire(serve):
    return serve


def cluster_yaml(tmp_path, engine=""):
    path = tmp_path / "cluster.yaml"
    engine_line = f"\n    engine: {{{engine}}}" if engine else ""
    path.write_text(
        "pools:\n  - name: vllm\n    replicas: 1\n    model: llama-3.1-8b-instruct\n    gpu: H100\n"
        f"    tp: 1{engine_line}\n"
    )
    return str(path)


def kv_args(pub, rep):
    return ["--kv-events", f"tcp://{{ip}}:{pub}", "--kv-replay", f"tcp://{{ip}}:{rep}"]


def ask(server, prompt_tokens, token_ids=(), block_hashes=()):
    question = pb.PredictRoutingRequest(
        request=pb.CandidateRequest(
            prompt_tokens=prompt_tokens,
            output_tokens=8,
            token_ids=list(token_ids),
            block_hashes=list(block_hashes),
        ),
        request_id="wire",
    )
    question.options.replications = 1
    question.options.seed = 3
    answer = server.twin.PredictRouting(question, timeout=60)
    return {c.instance_id: c for c in answer.candidates}, answer


def until_stored(fake, server, kv):
    """Publishes `kv` until the stream is live (ZMQ's slow joiner), then returns."""
    before = by_id(snapshot(server))[fake.address].cached_blocks
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        reply = fake.control(kv=kv) if "events" in kv else fake.control(prompt=kv)
        time.sleep(0.15)
        if by_id(snapshot(server))[fake.address].cached_blocks > before:
            return reply
    raise AssertionError(f"no KV event reached the mirror\n{server.output()}")


# 1. Busy pods are capped, not frozen; vLLM's defaults by GPU; data-parallel pods.


def test_a_pod_busier_than_its_pool_is_capped_and_still_recommended(pods, serve_wire, tmp_path):
    (a, b), _, _ = pods(2, kv=False)
    config = cluster_yaml(tmp_path, "max_num_seqs: 256")
    server = serve_wire("--config", config, "--pods", f"{a.address},{b.address}")
    a.control(gauges=dict(running=300, waiting=5, kv=0.5))
    b.control(gauges=dict(running=2, waiting=0, kv=0.1))
    inst = eventually(server, lambda i: i[a.address].capped and i[a.address], "capped")
    assert inst.gauges.running == 256 and inst.gauges.waiting == 5
    assert "gauges.running 300 capped to max_num_seqs 256" in inst.capped
    assert not inst.stale_reason, inst.stale_reason
    assert metric(server, "ditto_live_state_capped_total", instance=a.address, field="gauges.running") >= 1
    # The gauges keep following the pod (they did freeze before).
    a.control(gauges=dict(running=280, waiting=9, kv=0.6))
    eventually(server, lambda i: i[a.address].gauges.waiting == 9, "still updating")
    cands, _ = ask(server, 200)
    assert cands[a.address].valid and cands[b.address].valid
    # Back under the limit: the note goes away.
    a.control(gauges=dict(running=10, waiting=0, kv=0.1))
    eventually(server, lambda i: not i[a.address].capped and i[a.address].gauges.running == 10, "uncapped")


def test_default_limits_follow_vllm_s_defaults_for_the_gpu(pods, serve_wire, tmp_path):
    (a,), _, _ = pods(1, kv=False)
    # No max_num_seqs in the pool: vLLM's default on an H100 is 1024, not 256.
    server = serve_wire("--config", cluster_yaml(tmp_path), "--pods", a.address)
    a.control(gauges=dict(running=700, waiting=0, kv=0.9))
    inst = eventually(server, lambda i: i[a.address].gauges.running == 700 and i[a.address], "700 running")
    assert not inst.capped and not inst.stale_reason


def test_a_data_parallel_pod_is_one_instance_with_its_engines_limits(pods, serve_wire, tmp_path):
    (a,), pub, rep = pods(1, extra=["--dp-size", "2"])
    config = cluster_yaml(tmp_path, "max_num_seqs: 256")
    server = serve_wire("--config", config, "--pods", a.address, *kv_args(pub, rep), "--kv-dp-size", "2")
    a.control(engines=[dict(running=150, waiting=1, kv=0.3), dict(running=150, waiting=2, kv=0.5)])
    inst = eventually(server, lambda i: i[a.address].gauges.running == 300 and i[a.address], "2 x 150")
    assert inst.gauges.waiting == 3 and not inst.capped and not inst.stale_reason
    # Each rank's publisher (port + rank) feeds the one instance.
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[11])], rank=0))
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[12])], rank=1))
    assert {11, 12} <= set(by_id(snapshot(server))[a.address].cached_block_hashes)


# 2./3. Wire details: eras, byte hashes, unknown types, group_idx, topics.


@pytest.mark.parametrize("encoding", ["legacy", "array", "map", "map-batch"])
def test_every_wire_era_is_decoded(pods, serve_wire, encoding):
    (a,), pub, rep = pods(1)
    server = serve_wire("--pods", a.address, *kv_args(pub, rep))
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[5, 6])], encoding=encoding))
    a.control(kv=dict(events=[dict(type="BlockRemoved", block_hashes=[5])], encoding=encoding))
    eventually(server, lambda i: list(i[a.address].cached_block_hashes) == [6], f"{encoding} removal")


def test_unknown_event_types_are_skipped_one_by_one_and_counted(pods, serve_wire):
    (a,), pub, rep = pods(1)
    server = serve_wire("--pods", a.address, *kv_args(pub, rep))
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[1])]))
    a.control(kv=dict(events=[
        dict(type="BlockTransferred", fields=dict(block_hashes=[9], medium="CPU")),
        dict(type="BlockStored", block_hashes=[2]),
    ]))
    inst = eventually(server, lambda i: 2 in i[a.address].cached_block_hashes and i[a.address], "stored")
    assert not inst.stale_reason
    assert metric(server, "ditto_live_kv_unknown_events_total", instance=a.address, type="BlockTransferred") == 1
    assert metric(server, "ditto_live_kv_batches_total", instance=a.address, result="malformed") in (None, 0)


def test_a_removal_of_another_kv_cache_group_leaves_the_full_attention_blocks(pods, serve_wire):
    (a,), pub, rep = pods(1)
    server = serve_wire("--pods", a.address, *kv_args(pub, rep))
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[3, 4], group_idx=0)]))
    # The sliding-window group's blocks come and go under the same hashes.
    a.control(kv=dict(events=[
        dict(type="BlockStored", block_hashes=[7], group_idx=1),
        dict(type="BlockRemoved", block_hashes=[3, 4], group_idx=1),
    ]))
    seq = a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[8])]))["seq"]
    inst = eventually(server, lambda i: 8 in i[a.address].cached_block_hashes and i[a.address], "later batch")
    assert {3, 4, 8} == set(inst.cached_block_hashes), "group 1 neither stored nor removed group 0's blocks"
    assert seq >= 1
    a.control(kv=dict(events=[dict(type="BlockRemoved", block_hashes=[3], group_idx=0)]))
    eventually(server, lambda i: 3 not in i[a.address].cached_block_hashes, "group 0 removal")


@pytest.mark.parametrize("topic", ["", "kv@127.0.0.20@meta-llama/Llama-3.1-8B-Instruct"])
def test_the_default_topic_filter_accepts_vllm_s_and_llm_d_s_topics(pods, serve_wire, topic):
    (a,), pub, rep = pods(1, extra=["--topic", topic])
    server = serve_wire("--pods", a.address, *kv_args(pub, rep))
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[42])]))


# 4. Prefixes keyed by tokens (vLLM hashes from a random seed nobody else knows).


@pytest.mark.parametrize("hash_kind,algo", [("int", "sha256"), ("bytes", "sha256"), ("int", "sha256_cbor"), ("bytes", "sha256_cbor")])
def test_a_prompt_s_tokens_find_the_pod_holding_its_prefix(pods, serve_wire, hash_kind, algo):
    (a, b), pub, rep = pods(2)
    server = serve_wire("--pods", f"{a.address},{b.address}", *kv_args(pub, rep))
    rng = random.Random(7)
    prompt = [rng.randrange(1, 128_000) for _ in range(1024)]  # 64 blocks of 16
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[1])]))
    # b caches the prompt's prefix in two events chained by vLLM's (seeded) hashes.
    first = until_stored(b, server, dict(token_ids=prompt[:512], hash=hash_kind, algo=algo))
    b.control(prompt=dict(token_ids=prompt, hash=hash_kind, first_block=32, algo=algo))
    eventually(server, lambda i: i[b.address].cached_blocks >= 64, "the whole prefix on b")
    question_tokens = prompt + [5] * 100
    cands, answer = ask(server, len(question_tokens), token_ids=question_tokens)
    assert cands[b.address].prefix_hit_tokens >= 1008, cands[b.address]
    assert cands[a.address].prefix_hit_tokens == 0
    assert answer.recommended_instance_id == b.address
    # GetSnapshot names the blocks by the pod's own hashes (low 64 bits for byte hashes).
    assert set(first["hashes"]) <= set(by_id(snapshot(server))[b.address].cached_block_hashes)
    # A caller that has vLLM's own hashes (the low 64 bits, as llm-d folds byte hashes)
    # still hits.
    hashes = first["hashes"]
    cands, _ = ask(server, 512 + 16, block_hashes=hashes)
    assert cands[b.address].prefix_hit_tokens >= 496, cands[b.address]


# 2. KV streams survive restarts.


def test_blocks_stored_before_ditto_connected_are_replayed(pods, serve_wire):
    (a,), pub, rep = pods(1)
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[21, 22])]))
    a.control(kv=dict(events=[dict(type="BlockRemoved", block_hashes=[21])]))
    server = serve_wire("--pods", a.address, *kv_args(pub, rep))
    inst = eventually(server, lambda i: 22 in i[a.address].cached_block_hashes and i[a.address], "replayed")
    assert 21 not in inst.cached_block_hashes and inst.kv_event_gaps == 0


def test_blocks_stored_right_after_a_restart_are_mirrored(pods, serve_wire, tmp_path):
    startup = tmp_path / "startup.json"
    startup.write_text(json.dumps([dict(events=[dict(type="BlockStored", block_hashes=[31, 32])])]))
    (a,), pub, rep = pods(1)
    server = serve_wire("--pods", a.address, *kv_args(pub, rep), "--scrape-timeout-ms", "300")
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[30])]))
    a.kill()
    reason = eventually(server, lambda i: "kv_events" in i[a.address].stale_reason and i[a.address].stale_reason,
                        "the stream's loss reported")
    assert "reconnecting" in reason or "connect" in reason, reason
    # The pod comes back and stores blocks before anyone can have subscribed: only its
    # replay buffer has them.
    a.args += ["--startup-kv", str(startup)]
    a.start()
    inst = eventually(
        server,
        lambda i: {31, 32} <= set(i[a.address].cached_block_hashes) and not i[a.address].stale_reason and i[a.address],
        "the new process's blocks",
    )
    assert 30 not in inst.cached_block_hashes, "the dead process's blocks are gone"
    assert metric(server, "ditto_live_kv_connections_total", instance=a.address, result="connected") >= 2
