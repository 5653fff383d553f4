"""An independently written client of ditto's Twin API (grpcio, stubs from proto/).

Drives the real `ditto serve` binary: health, reflection (v1 and v1alpha), config sync,
state and KV-event pushes (with a sequence gap), snapshots, /metrics over HTTP, and bad
inputs for every RPC, which must fail with the documented code, name the field, and leave
the mirror unchanged. Predictions and forecasts are checked on mirrored state (answers,
recommendation, impact on others, byte-identical repeats, the stream) and for validation
failures.
"""

import subprocess
import threading

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from conftest import BINARY, free_port
from ditto.v1 import twin_pb2 as pb

A = "ns/vllm-0:8000"
B = "ns/vllm-1:8000"
NOW_US = 2_000_000


def instance(instance_id):
    return pb.InstanceSpec(
        id=instance_id,
        address=f"{instance_id}-addr",
        engine=pb.EngineLimits(num_gpu_blocks=64, max_num_seqs=4, max_model_len=4096),
    )


def two_instances():
    return pb.ClusterConfig(instances=[instance(A), instance(B)])


def request(request_id, prompt, computed=0, output=0, max_tokens=100):
    return pb.RequestState(
        request_id=request_id,
        arrival_us=900_000,
        prompt_tokens=prompt,
        computed_tokens=computed,
        output_tokens=output,
        max_tokens=max_tokens,
    )


def full_update(instance_id, at, waiting=(), running=()):
    return pb.InstanceStateUpdate(
        instance_id=instance_id,
        observed_at_us=at,
        requests=pb.RequestLists(waiting=list(waiting), running=list(running)),
    )


def kv_batch(seq, ts, events, instance_id=A):
    return pb.KvEventBatch(instance_id=instance_id, seq=seq, ts_us=ts, events=events)


def stored(hashes):
    return pb.KvEvent(stored=pb.BlockStored(block_hashes=hashes))


def snapshot(server, generation=0):
    return server.twin.GetSnapshot(
        pb.GetSnapshotRequest(generation=generation, now_us=NOW_US, include_block_hashes=True),
        timeout=10,
    )


def expect_error(call, code, field):
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == code, caught.value.details()
    assert field in caught.value.details(), f"{caught.value.details()!r} does not name {field!r}"


def synced(server):
    ack = server.twin.SyncClusterConfig(two_instances(), timeout=10)
    assert ack.changed
    return ack


def question(**request_fields):
    fields = dict(prompt_tokens=2000, output_tokens=256)
    fields.update(request_fields)
    return pb.PredictRoutingRequest(request=pb.CandidateRequest(**fields), request_id="q")


def test_health_is_serving_at_startup(server):
    for service in ("", "ditto.v1.Twin"):
        reply = server.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_the_default_cluster_is_mirrored_at_startup(server):
    snap = snapshot(server)
    assert snap.generation == 1
    assert len(snap.instances) == 4
    assert [i.model for i in snap.config.instances] == ["llama-3.1-8b-instruct"] * 4
    assert [i.gpu for i in snap.config.instances] == ["H100"] * 4


def list_services(channel, method):
    call = channel.stream_stream(
        method,
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    responses = call(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
    first = next(responses)
    return {service.name for service in first.list_services_response.service}


def test_reflection_v1_and_v1alpha_list_the_twin(server):
    # v1 and v1alpha share the message layout; only the service name differs.
    for method in (
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ):
        names = list_services(server.channel, method)
        assert "ditto.v1.Twin" in names, (method, names)
        assert "grpc.health.v1.Health" in names, (method, names)
    # grpcio-reflection's own client resolves the service and its methods.
    database = ProtoReflectionDescriptorDatabase(server.channel)
    assert "ditto.v1.Twin" in database.get_services()
    proto = database.FindFileContainingSymbol("ditto.v1.Twin")
    assert isinstance(proto, descriptor_pb2.FileDescriptorProto)
    service = next(s for s in proto.service if s.name == "Twin")
    assert {m.name for m in service.method} >= {
        "SyncClusterConfig",
        "PushInstanceState",
        "PushKvEvents",
        "GetSnapshot",
        "PredictRouting",
        "PredictRoutingStream",
        "ForecastCapacity",
    }
    assert reflection_pb2_grpc.ServerReflectionStub(server.channel) is not None


def test_sync_is_versioned_and_idempotent(server):
    first = synced(server)
    assert (first.generation, first.config_generation) == (2, 2)
    again = server.twin.SyncClusterConfig(two_instances(), timeout=10)
    assert (again.generation, again.changed) == (2, False)
    snap = snapshot(server)
    assert [i.address for i in snap.config.instances] == [f"{A}-addr", f"{B}-addr"]
    echoed = server.twin.SyncClusterConfig(snap.config, timeout=10)
    assert not echoed.changed


def test_pushed_state_events_and_kv_events_are_mirrored(server):
    synced(server)
    routed = pb.RequestEvent(
        at_us=1_050_000,
        routed=pb.RequestRouted(
            request=pb.RequestState(request_id="r3", arrival_us=1_050_000, prompt_tokens=50)
        ),
    )
    first_token = pb.RequestEvent(at_us=1_060_000, first_token=pb.RequestFirstToken(request_id="r1"))
    finished = pb.RequestEvent(
        at_us=1_090_000, finished=pb.RequestFinished(request_id="r2", output_tokens=40)
    )
    updates = [
        full_update(A, 1_000_000, waiting=[request("r1", 100)], running=[request("r2", 200, 204, 5)]),
        pb.InstanceStateUpdate(
            instance_id=A, observed_at_us=1_100_000, events=[routed, first_token, finished]
        ),
        pb.InstanceStateUpdate(
            instance_id=B,
            observed_at_us=1_900_000,
            gauges=pb.Gauges(running=0, waiting=0, kv_usage=0.25),
        ),
    ]
    ack = server.twin.PushInstanceState(iter(updates), timeout=10)
    assert (ack.accepted, ack.generation) == (3, 5)

    batches = [
        kv_batch(1, 1_000_000, [stored([1, 2, 3])]),
        kv_batch(2, 1_000_100, [pb.KvEvent(removed=pb.BlockRemoved(block_hashes=[2]))]),
        kv_batch(4, 1_000_200, [stored([7])]),
    ]
    ack = server.twin.PushKvEvents(iter(batches), timeout=10)
    assert ack.accepted == 3
    assert [(g.instance_id, g.expected_seq, g.received_seq) for g in ack.gaps] == [(A, 3, 4)]

    snap = snapshot(server)
    a, b = snap.instances
    assert [r.request_id for r in a.requests.waiting] == ["r3"]
    assert [r.request_id for r in a.requests.running] == ["r1"]
    assert a.requests_age.observed and a.requests_age.age_ms == 900.0 and a.requests_age.stale
    assert list(a.cached_block_hashes) == [1, 3, 7]
    assert (a.kv_event_seq, a.kv_event_gaps) == (4, 1)
    assert not b.requests_age.observed
    assert b.gauges_age.age_ms == 100.0 and not b.gauges_age.stale
    assert b.gauges.kv_usage == 0.25
    assert snap.traffic.recent_finished == 1
    older = snapshot(server, generation=3)
    assert [r.request_id for r in older.instances[0].requests.running] == ["r2"]


def test_bad_state_updates_are_rejected_and_change_nothing(server):
    synced(server)
    server.twin.PushInstanceState(iter([full_update(A, 1_000_000, waiting=[request("w", 10)])]), timeout=10)
    before = snapshot(server)
    cases = [
        (full_update("ghost", 1_100_000), "instance_id"),
        (full_update(A, 1_100_000, running=[request("x", 100, 500)]), "requests.running[0].computed_tokens"),
        (full_update(A, 1_100_000, waiting=[request("x", -5)]), "requests.waiting[0].prompt_tokens"),
        (full_update(A, 1_100_000, running=[request(f"r{i}", 10, 10, 1) for i in range(5)]), "requests.running"),
        (full_update(A, 0), "observed_at_us"),
        (
            pb.InstanceStateUpdate(instance_id=A, observed_at_us=1_100_000, gauges=pb.Gauges(kv_usage=1.5)),
            "gauges.kv_usage",
        ),
    ]
    for update, field in cases:
        expect_error(
            lambda: server.twin.PushInstanceState(iter([update]), timeout=10),
            grpc.StatusCode.INVALID_ARGUMENT,
            field,
        )
        assert snapshot(server) == before, field


def test_bad_kv_events_are_rejected_and_change_nothing(server):
    synced(server)
    server.twin.PushKvEvents(iter([kv_batch(1, 1_000_000, [stored([1])])]), timeout=10)
    before = snapshot(server)
    cases = [
        (kv_batch(1, 1_000_100, [stored([2])]), "seq"),
        (kv_batch(2, 1_000_100, [stored(list(range(100, 200)))]), "num_gpu_blocks"),
        (kv_batch(2, 1_000_100, [stored([2])], instance_id="ghost"), "instance_id"),
        (kv_batch(2, 1_000_100, [pb.KvEvent()]), "events[0].event"),
        (kv_batch(2, 10, [stored([2])]), "ts_us"),
    ]
    for batch, field in cases:
        expect_error(
            lambda: server.twin.PushKvEvents(iter([batch]), timeout=10),
            grpc.StatusCode.INVALID_ARGUMENT,
            field,
        )
        assert snapshot(server) == before, field


def test_bad_configs_and_snapshot_requests(server):
    before = snapshot(server)
    negative_tp = two_instances()
    negative_tp.instances[0].tp = -1
    duplicate = two_instances()
    duplicate.instances[1].id = A
    unknown_gpu = two_instances()
    unknown_gpu.instances[0].gpu = "abacus"
    for config, field in [
        (pb.ClusterConfig(), "instances"),
        (negative_tp, "instances[0].tp"),
        (duplicate, "instances[1].id"),
        (unknown_gpu, "instances[0].gpu"),
    ]:
        expect_error(
            lambda: server.twin.SyncClusterConfig(config, timeout=10),
            grpc.StatusCode.INVALID_ARGUMENT,
            field,
        )
        assert snapshot(server) == before, field
    expect_error(
        lambda: server.twin.GetSnapshot(pb.GetSnapshotRequest(generation=999), timeout=10),
        grpc.StatusCode.NOT_FOUND,
        "generation",
    )
    expect_error(
        lambda: server.twin.GetSnapshot(pb.GetSnapshotRequest(now_us=-1), timeout=10),
        grpc.StatusCode.INVALID_ARGUMENT,
        "now_us",
    )


def test_routing_questions_are_validated(server):
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    no_request = pb.PredictRoutingRequest(request_id="q")
    unknown = question()
    unknown.candidate_instance_ids.append("ghost")
    too_many_replications = question()
    too_many_replications.options.replications = 1_000_000
    too_many_candidates = question()
    too_many_candidates.candidate_instance_ids.extend(f"c{i}" for i in range(10_000))
    bad_quantile = question()
    bad_quantile.options.quantiles.append(1.5)
    cases = [
        (no_request, invalid, "request"),
        (question(prompt_tokens=-5), invalid, "request.prompt_tokens"),
        (question(slo_class="vip"), invalid, "request.slo_class"),
        (unknown, invalid, "candidate_instance_ids[0]"),
        (bad_quantile, invalid, "options.quantiles[0]"),
        (too_many_replications, exhausted, "options.replications"),
        (too_many_candidates, exhausted, "candidate_instance_ids"),
    ]
    for message, code, field in cases:
        expect_error(lambda: server.twin.PredictRouting(message, timeout=30), code, field)
    # The stream answers each question, in order, without ending on a bad one.
    answers = list(server.twin.PredictRoutingStream(iter([cases[1][0], cases[3][0]]), timeout=30))
    assert len(answers) == 2
    for answer, (_, code, field) in zip(answers, [cases[1], cases[3]]):
        assert answer.WhichOneof("result") == "error"
        assert answer.error.code == code.value[0]
        assert answer.error.message.startswith(field)


def test_capacity_questions_are_validated(server):
    def forecast(**overrides):
        fields = dict(
            stages=[pb.RateStage(rate_rps=5.0, duration_s=60.0)],
            input_tokens=pb.LengthDistribution(constant=512),
            output_tokens=pb.LengthDistribution(constant=128),
            variants=[pb.VariantCandidates(template_instance_id="vllm-0", replica_counts=[1, 2])],
        )
        fields.update(overrides)
        return pb.ForecastCapacityRequest(**fields)

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    cases = [
        (forecast(stages=[]), invalid, "stages"),
        (forecast(input_tokens=None), invalid, "input_tokens"),
        (forecast(variants=[pb.VariantCandidates(template_instance_id="ghost")]), invalid, "variants[0].template_instance_id"),
        (forecast(replications=1_000_000), exhausted, "replications"),
        (forecast(stages=[pb.RateStage(rate_rps=1.0, duration_s=1e9)]), exhausted, "stages"),
    ]
    for message, code, field in cases:
        expect_error(lambda: server.twin.ForecastCapacity(message, timeout=30), code, field)


def test_metrics_health_and_readiness_over_http(server):
    synced(server)
    server.twin.PushKvEvents(
        iter([kv_batch(1, 1_000_000, [stored([1])]), kv_batch(3, 1_000_001, [stored([2])])]),
        timeout=10,
    )
    assert server.http("/healthz")[0] == 200
    assert server.http("/readyz")[0] == 200
    status, text = server.http("/metrics")
    assert status == 200
    for needle in (
        'ditto_rpc_requests_total{code="Ok",rpc="SyncClusterConfig"} 1',
        "ditto_kv_event_seq_gaps_total 1",
        "ditto_instances 2",
        "ditto_snapshot_generation 4",
    ):
        assert needle in text, needle


def test_a_push_stream_is_bounded_by_its_deadline(server):
    synced(server)
    done = threading.Event()

    def updates():
        yield full_update(A, 1_000_000)
        # Keep the stream open without sending more: the call must end at its deadline.
        done.wait(timeout=60)

    try:
        expect_error(
            lambda: server.twin.PushInstanceState(updates(), timeout=0.5),
            grpc.StatusCode.DEADLINE_EXCEEDED,
            "",
        )
    finally:
        done.set()


def test_the_predict_command_never_hangs(server):
    run = subprocess.run(
        [BINARY, "predict", "--addr", f"127.0.0.1:{server.grpc_port}", "--timeout-ms", "60000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if run.returncode == 0:
        for instance_id in ("vllm-0", "vllm-1", "vllm-2", "vllm-3"):
            assert instance_id in run.stdout, run.stdout
        assert "recommended:" in run.stdout
    else:
        assert run.returncode == 1 and "error:" in run.stderr, run.stderr
    closed = free_port()
    run = subprocess.run(
        [BINARY, "predict", "--addr", f"127.0.0.1:{closed}", "--timeout-ms", "2000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1 and "cannot connect" in run.stderr, run.stderr
    run = subprocess.run([BINARY, "predict", "--slo-class", "vip"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr


def busy_update(instance_id, at):
    """An instance with 8 decoding requests and 4 waiting (lengths known)."""
    running = [
        pb.RequestState(
            request_id=f"r{i}", arrival_us=at - 1_000, prompt_tokens=1000, computed_tokens=1000 + i,
            output_tokens=1 + i, max_tokens=2000, known_output_tokens=600,
        )
        for i in range(8)
    ]
    waiting = [
        pb.RequestState(request_id=f"w{i}", arrival_us=at - 500, prompt_tokens=3000, max_tokens=2000,
                        known_output_tokens=500)
        for i in range(4)
    ]
    return full_update(instance_id, at, waiting=waiting, running=running)


def test_predictions_answer_on_the_mirrored_state(server):
    # The default cluster is mirrored at startup: load one instance, then ask.
    ack = server.twin.PushInstanceState(iter([busy_update("vllm-0", NOW_US)]), timeout=10)
    assert ack.accepted == 1
    message = question(max_tokens=256)
    message.now_us = NOW_US
    message.options.replications = 1
    message.options.seed = 9
    message.request.slo.ttft_ms = 200.0
    answer = server.twin.PredictRouting(message, timeout=60)
    assert [c.instance_id for c in answer.candidates] == ["vllm-0", "vllm-1", "vllm-2", "vllm-3"]
    assert answer.seed == 9 and answer.snapshot_generation == ack.generation
    assert answer.recommended_instance_id != "vllm-0"
    busy, idle = answer.candidates[0], answer.candidates[1]
    assert busy.valid and idle.valid
    assert busy.ttft_ms.mean > idle.ttft_ms.mean > 0
    assert busy.e2e_ms.mean > busy.ttft_ms.mean
    assert busy.others_delta_e2e_ms > 0 and idle.others_delta_e2e_ms == 0
    assert [q.quantile for q in busy.e2e_ms.quantiles] == [0.5, 0.9, 0.99]
    # Identical question, identical bytes.
    again = server.twin.PredictRouting(message, timeout=60)
    assert again.SerializeToString() == answer.SerializeToString()
    # The stream gives the same answer.
    streamed = list(server.twin.PredictRoutingStream(iter([message]), timeout=60))
    assert streamed[0].answer.SerializeToString() == answer.SerializeToString()


def test_forecasts_recommend_a_replica_count(server):
    message = pb.ForecastCapacityRequest(
        stages=[pb.RateStage(rate_rps=30.0, duration_s=20.0)],
        input_tokens=pb.LengthDistribution(constant=1024),
        output_tokens=pb.LengthDistribution(constant=256),
        variants=[pb.VariantCandidates(template_instance_id="vllm-0", replica_counts=[1, 4])],
        replications=2,
        seed=3,
        now_us=NOW_US,
    )
    message.slo.ttft_ms = 300.0
    answer = server.twin.ForecastCapacity(message, timeout=120)
    assert answer.seed == 3
    assert len(answer.candidates) == 2
    one, four = answer.candidates
    assert four.slo_attainment >= one.slo_attainment
    assert four.cost_per_hour == 4 * one.cost_per_hour
    assert len(answer.desired_replicas) <= 1
