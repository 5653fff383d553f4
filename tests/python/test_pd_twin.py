"""PredictRouting over a prefill/decode pool (docs/disaggregation.md, "The twin"), from an
independent client of the real `ditto serve`.

Two ways a P/D pool reaches the mirror: a pushed SyncClusterConfig with roles and a
`disaggregation` section, and Kubernetes discovery of pods labelled `llm-d.ai/role` (a
stand-in API server, fake_kube_api.py, and fake vLLM pods, fake_vllm.py) with the section in
`ditto serve --config`. Either way the snapshot shows the roles and the resolved section,
and PredictRouting answers each (prefill, decode) pair the decider asks for, names the best
pair, and keeps a short uncached prompt (or one cached on its decode pod) decode only.
"""

import os

import grpc
import pytest

from conftest import Server, free_port
from ditto.v1 import twin_pb2 as pb
from fake_kube_api import FakeKubeApi
from test_live import Fake, bounded_until

NOW_US = 2_000_000
P0, P1 = "ns/prefill-0:8000", "ns/prefill-1:8000"
D0, D1 = "ns/decode-0:8000", "ns/decode-1:8000"


def instance(instance_id, role):
    return pb.InstanceSpec(
        id=instance_id,
        address=f"{instance_id}-addr",
        role=role,
        engine=pb.EngineLimits(num_gpu_blocks=2048, max_num_seqs=16, max_model_len=8192),
    )


def pd_config(**section):
    return pb.ClusterConfig(
        instances=[instance(P0, "prefill"), instance(P1, "prefill"), instance(D0, "decode"), instance(D1, "decode")],
        disaggregation=pb.Disaggregation(**section),
    )


def request(request_id, prompt, computed=0, output=0):
    return pb.RequestState(
        request_id=request_id,
        arrival_us=900_000,
        prompt_tokens=prompt,
        computed_tokens=computed,
        output_tokens=output,
        max_tokens=200,
        known_output_tokens=200,
    )


def update(instance_id, waiting=(), running=()):
    return pb.InstanceStateUpdate(
        instance_id=instance_id,
        observed_at_us=1_000_000,
        requests=pb.RequestLists(waiting=list(waiting), running=list(running)),
    )


def ask(server, prompt, **fields):
    message = pb.PredictRoutingRequest(
        request=pb.CandidateRequest(prompt_tokens=prompt, output_tokens=64, **fields),
        request_id="pd",
        now_us=NOW_US,
    )
    message.options.replications = 1
    message.options.seed = 5
    return server.twin.PredictRouting(message, timeout=60)


def expect_invalid(call, field):
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert field in caught.value.details(), f"{caught.value.details()!r} does not name {field!r}"


def check_pairs(answer, prefills, decodes, pair_named=True):
    """Every pair answered, valid, its TTFT the prefill's plus the hand-over; the named pair
    (when a pair is named) is the best by the documented rule."""
    assert sorted((p.prefill_instance_id, p.decode_instance_id) for p in answer.pairs) == sorted(
        (p, d) for p in prefills for d in decodes
    )
    for pair in answer.pairs:
        prediction = pair.prediction
        assert prediction.valid, pair
        assert prediction.instance_id == pair.decode_instance_id
        assert pair.transfer_ms > 0 and pair.handover_ms >= pair.transfer_ms, pair
        assert abs(prediction.ttft_ms.mean - (pair.prefill_ttft_ms + pair.handover_ms)) < 1e-6, pair
        assert prediction.tpot_ms.mean > 0
    if not pair_named:
        return
    best = min(answer.pairs, key=lambda p: (-p.prediction.slo_probability, p.prediction.e2e_ms.mean))
    assert (answer.recommended_prefill_instance_id, answer.recommended_instance_id) == (
        best.prefill_instance_id,
        best.decode_instance_id,
    )


def test_a_pushed_pd_pool_answers_pairs_names_the_best_and_keeps_short_prompts_decode_only(server):
    ack = server.twin.SyncClusterConfig(pd_config(link="rdma-200g", non_cached_tokens=32), timeout=10)
    assert ack.changed
    snap = server.twin.GetSnapshot(pb.GetSnapshotRequest(now_us=NOW_US), timeout=10)
    assert {i.id: i.role for i in snap.config.instances} == {P0: "prefill", P1: "prefill", D0: "decode", D1: "decode"}
    section = snap.config.disaggregation
    assert (section.connector, section.link, section.non_cached_tokens) == ("nixl", "rdma-200g", 32)
    assert section.bandwidth_gb_s > 0 and section.descriptor_us > 0 and section.abort_request_timeout_s == 480
    # The echoed config re-syncs as the same config.
    assert not server.twin.SyncClusterConfig(snap.config, timeout=10).changed
    # P0 has a long prefill queue, D0 a full decode batch: the best pair avoids both.
    server.twin.PushInstanceState(
        iter(
            [
                update(P0, waiting=[request(f"p{i}", 4000) for i in range(6)]),
                update(P1),
                update(D0, running=[request(f"d{i}", 500, computed=520, output=21) for i in range(16)]),
                update(D1),
            ]
        ),
        timeout=10,
    )
    answer = ask(server, 3000)
    assert [(c.decode_instance_id, c.uncached_tokens, c.remote_prefill) for c in answer.decider] == [
        (D0, 3000, True),
        (D1, 3000, True),
    ]
    check_pairs(answer, [P0, P1], [D0, D1])
    pairs = {(p.prefill_instance_id, p.decode_instance_id): p for p in answer.pairs}
    assert pairs[(P0, D1)].prefill_ttft_ms > pairs[(P1, D1)].prefill_ttft_ms, "P0's queue delays its prefill"
    # D0's batch is full (max_num_seqs 16): the decode half waits there for a seat.
    assert pairs[(P1, D0)].handover_ms > pairs[(P1, D1)].handover_ms, "D0's full batch delays the hand-over"
    assert pairs[(P0, D1)].prefill_others_delta_e2e_ms >= 0
    assert (answer.recommended_prefill_instance_id, answer.recommended_instance_id) == (P1, D1)
    # Prefill pods take no whole request; decode pods answer decode only.
    assert {c.instance_id: c.valid for c in answer.candidates} == {P0: False, P1: False, D0: True, D1: True}
    assert "role prefill" in {c.instance_id: c for c in answer.candidates}[P0].invalid_reason
    # Identical questions, byte-identical answers.
    assert ask(server, 3000).SerializeToString() == answer.SerializeToString()
    # A prompt shorter than nonCachedTokens stays decode only: no pairs, a decode pod named.
    short = ask(server, 20)
    assert not short.pairs and short.recommended_prefill_instance_id == ""
    assert [c.remote_prefill for c in short.decider] == [False, False]
    assert short.recommended_instance_id == D1


def test_a_prompt_cached_on_a_decode_pod_stays_there_decode_only(server):
    server.twin.SyncClusterConfig(pd_config(), timeout=10)
    server.twin.PushInstanceState(iter([update(i) for i in (P0, P1, D0, D1)]), timeout=10)
    hashes = list(range(5000, 5000 + 125))  # 125 blocks of 16 = a 2,000-token prompt
    batch = pb.KvEventBatch(instance_id=D0, seq=1, ts_us=1_000_000, events=[pb.KvEvent(stored=pb.BlockStored(block_hashes=hashes))])
    server.twin.PushKvEvents(iter([batch]), timeout=10)
    answer = ask(server, 2000, block_hashes=hashes)
    choices = {c.decode_instance_id: (c.uncached_tokens, c.remote_prefill) for c in answer.decider}
    assert choices[D0][0] < 16 and not choices[D0][1], choices
    assert choices[D1] == (2000, True), choices
    # Pairs only for the decode pod the decider sends to a remote prefill; serving the cached
    # prompt where it is, without a prefill or a pull, is the best answer.
    check_pairs(answer, [P0, P1], [D1], pair_named=False)
    local = {c.instance_id: c for c in answer.candidates}[D0]
    assert local.prefix_hit_tokens > 1900
    assert all(local.e2e_ms.mean < p.prediction.e2e_ms.mean for p in answer.pairs)
    assert (answer.recommended_prefill_instance_id, answer.recommended_instance_id) == ("", D0)


def test_a_bad_disaggregation_section_is_refused_naming_the_field(server):
    before = server.twin.GetSnapshot(pb.GetSnapshotRequest(now_us=NOW_US), timeout=10)
    for section, field in [
        (dict(link="carrier-pigeon"), "disaggregation.link"),
        (dict(connector="telegraph"), "disaggregation.connector"),
        (dict(non_cached_tokens=-1), "disaggregation.non_cached_tokens"),
        (dict(stage_order="sideways-first"), "disaggregation.stage_order"),
        # llm-d refuses a prefill decider in the prefill-first order.
        (dict(stage_order="prefill-first", non_cached_tokens=16), "disaggregation.decider"),
        (dict(bandwidth_gb_s=0), "disaggregation.bandwidth_gb_s"),
    ]:
        expect_invalid(lambda: server.twin.SyncClusterConfig(pd_config(**section), timeout=10), field)
    assert server.twin.GetSnapshot(pb.GetSnapshotRequest(now_us=NOW_US), timeout=10) == before


def test_prefill_first_sends_even_a_short_prompt_to_a_prefill_pod(server):
    assert server.twin.SyncClusterConfig(pd_config(stage_order="prefill-first"), timeout=10).changed
    snap = server.twin.GetSnapshot(pb.GetSnapshotRequest(now_us=NOW_US), timeout=10)
    section = snap.config.disaggregation
    assert section.stage_order == "prefill-first"
    assert not section.HasField("non_cached_tokens"), "no decider in this order"
    assert not server.twin.SyncClusterConfig(snap.config, timeout=10).changed
    server.twin.PushInstanceState(iter([update(i) for i in (P0, P1, D0, D1)]), timeout=10)
    # 20 tokens: decode-first's decider keeps it decode only; prefill-first has no decider.
    short = ask(server, 20)
    assert [c.remote_prefill for c in short.decider] == [True, True]
    assert {(p.prefill_instance_id, p.decode_instance_id) for p in short.pairs} == {
        (p, d) for p in (P0, P1) for d in (D0, D1)
    }
    assert short.recommended_prefill_instance_id in (P0, P1)


@pytest.fixture
def kube(tmp_path):
    """A stand-in Kubernetes API, fake vLLM pods on 127.0.0.2.. sharing one port, and the
    `ditto serve` processes started against them."""
    made = {"apis": [], "pods": [], "servers": []}
    port = free_port()

    def api():
        server = FakeKubeApi()
        made["apis"].append(server)
        return server

    def pod(index):
        fake = Fake(f"127.0.0.{index + 2}", port)
        made["pods"].append(fake)
        return fake

    def serve(api, *args):
        env = dict(os.environ)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env["KUBECONFIG"] = api.kubeconfig(str(tmp_path / "kubeconfig"))
        server = Server(["--scrape-interval-ms", "50", *args], env=env)
        made["servers"].append(server)
        server.wait_serving()
        return server

    yield api, pod, serve, port
    for server in made["servers"]:
        code = server.terminate()
        output = server.output()
        os.unlink(server.log.name)
        assert code == 0, f"ditto serve exited {code}:\n{output}"
    for fake in made["pods"]:
        fake.stop()
    for server in made["apis"]:
        server.close()


def labelled_pool(kube, tmp_path, names, disaggregation):
    """Fake vLLM pods named `names` (their role the name's prefix, as `llm-d.ai/role`) under the
    stand-in Kubernetes API, and `ditto serve` discovering them with a one-pool YAML and the
    given `disaggregation:` section. Returns (the API, the pods, the server)."""
    api, pod, serve, port = kube
    k = api()
    fakes = [pod(i) for i in range(len(names))]
    for fake, name in zip(fakes, names):
        fake.control(gauges=dict(running=1, waiting=0, kv=0.01))
        k.pod(name, fake.host, {"app": "vllm", "llm-d.ai/role": name.split("-")[0]})
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "pools:\n"
        "  - {name: pd, replicas: 1, model: llama-3.1-8b-instruct, gpu: H100, tp: 1,\n"
        "     engine: {max_num_seqs: 16, max_num_batched_tokens: 4096, max_model_len: 8192}}\n"
        + disaggregation
    )
    server = serve(k, "--config", str(config), "--pods-selector", "app=vllm", "--pods-namespace", "llm-d", "--pods-port", str(port))
    return k, fakes, server


def test_pods_labelled_by_role_are_mirrored_with_the_yaml_section_and_answered_in_pairs(kube, tmp_path):
    k, fakes, server = labelled_pool(
        kube, tmp_path, ["prefill-a", "prefill-b", "decode-a"],
        "disaggregation:\n  connector: nixl\n  link: tcp-100g\n  decider: {non_cached_tokens: 64}\n",
    )
    roles = {}

    def mirrored():
        snap = server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10)
        roles.update({i.id: i.role for i in snap.config.instances})
        return (
            len(snap.instances) == 3
            and all(i.HasField("gauges") and not i.stale_reason for i in snap.instances)
            and snap.config.disaggregation.link == "tcp-100g"
            and snap.config.disaggregation.non_cached_tokens == 64
        )

    bounded_until(mirrored, "three pods mirrored with the YAML's section")
    assert roles == {"llm-d/prefill-a": "prefill", "llm-d/prefill-b": "prefill", "llm-d/decode-a": "decode"}
    message = pb.PredictRoutingRequest(request=pb.CandidateRequest(prompt_tokens=2000, output_tokens=32), request_id="k")
    message.options.replications = 1
    answer = server.twin.PredictRouting(message, timeout=60)
    check_pairs(answer, ["llm-d/prefill-a", "llm-d/prefill-b"], ["llm-d/decode-a"])
    assert answer.recommended_instance_id == "llm-d/decode-a"
    # A relabelled pod changes role in the mirror.
    k.pod("prefill-b", fakes[1].host, {"app": "vllm", "llm-d.ai/role": "decode"})

    def relabelled():
        snap = server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10)
        return {i.id: i.role for i in snap.config.instances}.get("llm-d/prefill-b") == "decode"

    bounded_until(relabelled, "the new role mirrored")
    # Below nonCachedTokens: decode only on both decode pods.
    message.request.prompt_tokens = 40
    short = server.twin.PredictRouting(message, timeout=60)
    assert not short.pairs and short.recommended_prefill_instance_id == ""
    assert sorted(c.decode_instance_id for c in short.decider) == ["llm-d/decode-a", "llm-d/prefill-b"]


# A 2,000-token pull of Llama-3.1-8B as vLLM moves it (bf16): 32 layers x 8 KV heads x 128
# dims x 2 (K and V) x 2 bytes a token, and one descriptor per 16-token block, layer and plane.
PULL_BYTES = 2000 * 32 * 8 * 128 * 2 * 2
PULL_DESCRIPTORS = 125 * 32 * 2
PULL_S = 0.4


def test_decode_pods_nixl_metrics_fit_the_transfer_model_of_their_pairs(kube, tmp_path):
    """A decode pod reporting slow pulls on vLLM's NIXL histograms has its pairs' transfers
    predicted at what it measured; the other decode pod keeps the catalog's link."""
    _, fakes, server = labelled_pool(
        kube, tmp_path, ["prefill-a", "decode-a", "decode-b"], "disaggregation: {connector: nixl, link: tcp-100g}\n"
    )

    def instance(snap, name):
        return next(i for i in snap.instances if i.instance_id == f"llm-d/{name}")

    def mirrored():
        snap = server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10)
        return len(snap.instances) == 3 and all(i.HasField("gauges") and not i.stale_reason for i in snap.instances)

    bounded_until(mirrored, "three pods mirrored")
    message = pb.PredictRoutingRequest(request=pb.CandidateRequest(prompt_tokens=2000, output_tokens=32), request_id="n")
    message.options.replications = 1

    def transfers(answer):
        return {p.decode_instance_id: p.transfer_ms for p in answer.pairs}

    before = transfers(server.twin.PredictRouting(message, timeout=60))
    assert set(before) == {"llm-d/decode-a", "llm-d/decode-b"}
    # The connector's series registered (no pull yet): the baseline the increments count from.
    for fake in fakes[1:]:
        fake.control(nixl=dict(count=0))

    def baselined():
        snap = server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10)
        return all(instance(snap, name).gauges.HasField("transfers") for name in ("decode-a", "decode-b"))

    bounded_until(baselined, "the NIXL counters scraped")
    fakes[1].control(nixl=dict(count=100, seconds=PULL_S, bytes=PULL_BYTES, descriptors=PULL_DESCRIPTORS, failed=25))

    def fitted():
        fit = instance(server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10), "decode-a").transfer_fit
        return fit.transfers == 100 and fit.HasField("scale")

    bounded_until(fitted, "decode-a's pulls fitted")
    snap = server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10)
    fit = instance(snap, "decode-a").transfer_fit
    assert abs(fit.failure_ratio - 25 / 125) < 1e-9
    assert fit.scale > 1, "0.4 s for 262 MB is slower than a 100 Gb/s link"
    assert not instance(snap, "decode-b").HasField("transfer_fit") or instance(snap, "decode-b").transfer_fit.transfers == 0
    after = transfers(server.twin.PredictRouting(message, timeout=60))
    assert abs(after["llm-d/decode-a"] - PULL_S * 1000) < 0.1 * PULL_S * 1000, (before, after)
    assert after["llm-d/decode-b"] == before["llm-d/decode-b"]
    assert before["llm-d/decode-a"] == before["llm-d/decode-b"] < after["llm-d/decode-a"] / 5
    exported = {}
    for line in server.http("/metrics")[1].splitlines():
        if line.startswith('ditto_kv_transfer_fit{instance="llm-d/decode-a"'):
            exported[line.split('quantity="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    assert exported.get("transfers") == 100 and abs(exported.get("failure_ratio", -1) - 0.2) < 1e-9, exported
    assert abs(exported.get("scale", -1) - fit.scale) < 1e-9 * fit.scale, exported
    # A restarted pod (its counters from zero again) is a new baseline, not a negative pull.
    fakes[1].kill()
    fakes[1].start()
    fakes[1].control(gauges=dict(running=1, waiting=0, kv=0.01), nixl=dict(count=3, seconds=PULL_S, bytes=PULL_BYTES, descriptors=PULL_DESCRIPTORS))

    def restarted():
        state = instance(server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10), "decode-a")
        return state.gauges.transfers.transfers == 3

    bounded_until(restarted, "the restarted pod's counters scraped")
    fakes[1].control(nixl=dict(count=10, seconds=PULL_S, bytes=PULL_BYTES, descriptors=PULL_DESCRIPTORS))
    bounded_until(
        lambda: instance(server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10), "decode-a").transfer_fit.transfers == 110,
        "the pulls after the restart counted from its new baseline",
    )
