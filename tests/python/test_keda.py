"""KEDA's external scaler protocol served by a real `ditto serve`, driven by stubs generated
from proto/externalscaler/externalscaler.proto (KEDA's wire format): the metric spec, metric
values that follow a load change, IsActive false at zero load and true under load, the
StreamIsActive stream delivering the change, bad scaler metadata refused with
INVALID_ARGUMENT naming the key, a stream ending when its client goes, and the reads
following --auth-reads.

Load is pushed as KEDA would never see it directly: arrivals on the mirrored pods through the
Twin API's PushInstanceState (200 requests over 2 s of client time, 100 requests per second,
more than one llama-3.1-8b replica serves within a 1 s TTFT).
"""

import os
import queue
import re
import secrets
import threading
import time

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from conftest import Server, poll_grpc_until
from ditto.v1 import twin_pb2 as pb
from externalscaler import externalscaler_pb2 as ks
from externalscaler import externalscaler_pb2_grpc as ks_grpc

POLL_BOUND_S = 120.0
STEP_ARGS = ["--load-forecast-step-s", "0.25"]
METADATA = {
    "scalerAddress": "ditto.llm-d.svc:9010",
    "pool": "vllm",
    "ttftMs": "1000",
    "tpotMs": "100",
    "horizonSeconds": "20",
    "warmUpSeconds": "10",
    "replications": "1",
}


def ref(**overrides):
    metadata = dict(METADATA)
    for key, value in overrides.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    return ks.ScaledObjectRef(name="vllm-decode", namespace="llm-d", scalerMetadata=metadata)


def until(what, call, predicate):
    """Polls `call` (retrying UNAVAILABLE before the first load sample) until `predicate`."""
    return poll_grpc_until(what, call, predicate, POLL_BOUND_S, 0.1)


def push_load(server):
    updates = []
    for index in range(4):
        waiting = [
            pb.RequestState(
                request_id=f"r{index}-{n}",
                arrival_us=1_000_000 + (n * 4 + index) * 10_000,
                prompt_tokens=512,
                max_tokens=256,
            )
            for n in range(50)
        ]
        updates.append(
            pb.InstanceStateUpdate(
                instance_id=f"vllm-{index}",
                observed_at_us=3_000_000,
                requests=pb.RequestLists(waiting=waiting),
            )
        )
    ack = server.twin.PushInstanceState(iter(updates), timeout=30)
    assert ack.accepted == 4


def gauge(text, name, labels):
    match = re.search(rf"^{name}\{{{re.escape(labels)}\}} (\S+)$", text, re.MULTILINE)
    return None if match is None else float(match.group(1))


def stop(server):
    code = server.terminate()
    output = server.output()
    os.unlink(server.log.name)
    assert code == 0, output
    return output


def test_metrics_and_activity_follow_the_load_and_the_stream_delivers_the_change():
    server = Server(extra_args=STEP_ARGS)
    try:
        server.wait_serving()
        scaler = ks_grpc.ExternalScalerStub(server.channel)

        spec = scaler.GetMetricSpec(ref(), timeout=10)
        assert len(spec.metricSpecs) == 1
        name = spec.metricSpecs[0].metricName
        assert name == "ditto-desired-replicas-vllm"
        assert spec.metricSpecs[0].targetSizeFloat == 1.0
        assert spec.metricSpecs[0].targetSize == 1

        # Zero load and nothing forecast: inactive, and the metric asks for nothing.
        active = until("a first load sample", lambda: scaler.IsActive(ref(), timeout=10), lambda r: True)
        assert active.result is False
        values = scaler.GetMetrics(ks.GetMetricsRequest(scaledObjectRef=ref(), metricName=name), timeout=30)
        assert [(v.metricName, v.metricValueFloat) for v in values.metricValues] == [(name, 0.0)]

        # A stream opened at zero load says false at once, then true when the load comes.
        stream = scaler.StreamIsActive(ref(), timeout=POLL_BOUND_S)
        received = queue.Queue()

        def read():
            try:
                for message in stream:
                    received.put(message.result)
            except grpc.RpcError as err:
                received.put(err)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert received.get(timeout=30) is False

        push_load(server)
        assert received.get(timeout=POLL_BOUND_S) is True, "the stream did not deliver the change"
        assert scaler.IsActive(ref(), timeout=10).result is True

        # GetMetrics follows: more than one replica for 100 requests per second.
        values = until(
            "GetMetrics above one replica",
            lambda: scaler.GetMetrics(ks.GetMetricsRequest(scaledObjectRef=ref(), metricName=name), timeout=60),
            lambda r: r.metricValues[0].metricValueFloat > 1,
        )
        value = values.metricValues[0]
        assert value.metricName == name
        assert value.metricValue == int(value.metricValueFloat)
        # Once the load holds still (within 5 %), polls are answered from the cached forecast.
        def cached():
            again = scaler.GetMetrics(ks.GetMetricsRequest(scaledObjectRef=ref(), metricName=name), timeout=60)
            assert again.metricValues[0].metricValueFloat >= 1
            return server.http("/metrics")[1]

        until(
            "a cached answer",
            cached,
            lambda text: re.search(r'^ditto_keda_forecasts_total\{outcome="cached"\} [1-9]', text, re.MULTILINE),
        )

        # The arrival-rate metric: the rate observed (and forecast), with the per-replica target.
        rate_ref = ref(metric="arrivalRate", arrivalRatePerReplica="25")
        rate_spec = scaler.GetMetricSpec(rate_ref, timeout=10).metricSpecs[0]
        assert (rate_spec.metricName, rate_spec.targetSizeFloat) == ("ditto-arrival-rate-vllm", 25.0)
        rate = scaler.GetMetrics(ks.GetMetricsRequest(scaledObjectRef=rate_ref), timeout=30)
        # Under load (it is 0 at zero load); the burst's rate decays as the window slides past
        # it, so how far depends on the test's own pace.
        assert rate.metricValues[0].metricValueFloat > 1.0

        status, text = server.http("/metrics")
        assert status == 200
        labels = 'namespace="",pool="vllm"'
        assert 0.0 < gauge(text, "ditto_load_observed_arrivals_per_second", labels) <= 101.0
        # One burst and nothing after: the observed rate decays as the window slides past it,
        # so the forecast 120 s ahead may already be 0, never below.
        assert gauge(text, "ditto_load_forecast_arrivals_per_second", labels) >= 0.0
        assert gauge(text, "ditto_load_forecast_error_ratio", labels) is not None
        # Errors are counted once the forecasts made 120 s before come due (unit-tested in
        # twin::load_forecast); here the series must be exported.
        assert gauge(text, "ditto_load_forecast_error_samples", labels) is not None
        assert gauge(text, "ditto_load_forecast_seasonal", labels) == 0
        assert re.search(r'^ditto_keda_forecasts_total\{outcome="computed"\} [1-9]', text, re.MULTILINE)
        # The stream stays open; the drain must end it (exit 0 below, within the bound).
        assert reader.is_alive()
    finally:
        output = stop(server)
    assert "load sampler stopped" in output


def test_routing_questions_count_as_load():
    """Beside the EPP, ditto is asked one routing question per request it places: with no
    arrivals pushed, the questions alone make the pool active and its observed rate nonzero."""
    server = Server(extra_args=STEP_ARGS)
    try:
        server.wait_serving()
        scaler = ks_grpc.ExternalScalerStub(server.channel)
        assert until("a first load sample", lambda: scaler.IsActive(ref(), timeout=10), lambda r: True).result is False
        question = pb.PredictRoutingRequest(
            request=pb.CandidateRequest(prompt_tokens=256, output_tokens=32), request_id="q"
        )
        labels = 'namespace="",pool="vllm"'
        deadline = time.monotonic() + POLL_BOUND_S
        observed = 0.0
        while time.monotonic() < deadline and not observed:
            for _ in range(10):
                server.twin.PredictRouting(question, timeout=30)
            observed = gauge(server.http("/metrics")[1], "ditto_load_observed_arrivals_per_second", labels) or 0.0
        assert observed > 0.0, server.output()
        # Nothing pushed: the mirror itself saw no arrivals.
        assert server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10).traffic.arrivals_per_s == 0.0
        assert until("active", lambda: scaler.IsActive(ref(), timeout=10), lambda r: r.result).result
    finally:
        stop(server)


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"pool": None}, "scalerMetadata.pool"),
        ({"ttftMs": None, "tpotMs": None}, "scalerMetadata.ttftMs"),
        ({"ttftMs": "soon"}, "scalerMetadata.ttftMs"),
        ({"horizonSeconds": "5"}, "scalerMetadata.horizonSeconds"),
        ({"targetAttainment": "1.5"}, "scalerMetadata.targetAttainment"),
        ({"replications": "100000"}, "scalerMetadata.replications"),
        ({"metric": "queueDepth"}, "scalerMetadata.metric"),
        ({"metric": "arrivalRate"}, "scalerMetadata.arrivalRatePerReplica"),
        ({"ttft": "100"}, "scalerMetadata.ttft"),
    ],
)
def test_bad_metadata_is_invalid_argument_naming_the_key(server, overrides, key):
    scaler = ks_grpc.ExternalScalerStub(server.channel)
    calls = [
        lambda: scaler.GetMetricSpec(ref(**overrides), timeout=10),
        lambda: scaler.IsActive(ref(**overrides), timeout=10),
        lambda: scaler.GetMetrics(ks.GetMetricsRequest(scaledObjectRef=ref(**overrides)), timeout=10),
        lambda: next(iter(scaler.StreamIsActive(ref(**overrides), timeout=10))),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        assert caught.value.details().startswith(key), caught.value.details()


def test_an_unknown_pool_is_not_found_naming_the_pools(server):
    scaler = ks_grpc.ExternalScalerStub(server.channel)

    def ask():
        try:
            return scaler.IsActive(ref(pool="prefill"), timeout=10)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                raise
            return err

    err = until("an answer after the first sample", ask, lambda r: isinstance(r, grpc.RpcError))
    assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
    assert "scalerMetadata.pool" in err.details() and "vllm" in err.details()


def test_a_stream_ends_when_its_client_goes_and_reflection_lists_the_scaler(server):
    scaler = ks_grpc.ExternalScalerStub(server.channel)
    until("a first load sample", lambda: scaler.IsActive(ref(), timeout=10), lambda r: True)

    def open_streams():
        text = server.http("/metrics")[1]
        match = re.search(r"^ditto_keda_streams_open (\S+)$", text, re.MULTILINE)
        return None if match is None else float(match.group(1))

    stream = scaler.StreamIsActive(ref(), timeout=POLL_BOUND_S)
    assert next(stream).result is False
    until("the stream counted", open_streams, lambda n: n == 1)
    stream.cancel()
    until("the stream's end seen by the server", open_streams, lambda n: n == 0)

    database = ProtoReflectionDescriptorDatabase(server.channel)
    assert "externalscaler.ExternalScaler" in database.get_services()


def test_reads_follow_auth_reads():
    token = secrets.token_urlsafe(32)
    env = dict(os.environ)
    env.pop("DITTO_AUTH_TOKEN_FILE", None)
    env["DITTO_AUTH_TOKEN"] = token
    server = Server(extra_args=[*STEP_ARGS, "--auth-reads"], env=env)
    try:
        server.wait_serving()
        scaler = ks_grpc.ExternalScalerStub(server.channel)
        with pytest.raises(grpc.RpcError) as caught:
            scaler.GetMetricSpec(ref(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        spec = scaler.GetMetricSpec(ref(), timeout=10, metadata=[("authorization", f"Bearer {token}")])
        assert spec.metricSpecs[0].metricName == "ditto-desired-replicas-vllm"
    finally:
        stop(server)
    # Without --auth-reads the same call needs no token.
    server = Server(extra_args=STEP_ARGS, env=env)
    try:
        server.wait_serving()
        scaler = ks_grpc.ExternalScalerStub(server.channel)
        assert scaler.GetMetricSpec(ref(), timeout=10).metricSpecs[0].targetSizeFloat == 1.0
    finally:
        stop(server)


# Two pools of the same model: requests pushed to one are that pool's load only.
BLACKBOX = pb.BlackboxCoefficients(alpha=[0, 0, 0], beta=[5000, 20, 100])
POOLS = {"blue": ["blue-0", "blue-1"], "green": ["green-0", "green-1"]}


def sync_two_pools(server):
    pods = [
        pb.InstanceSpec(
            id=pod_id,
            address=f"{pod_id}-addr",
            latency_model="blackbox",
            coefficients=BLACKBOX,
            engine=pb.EngineLimits(num_gpu_blocks=20000, max_num_seqs=256),
            cost_per_hour=1.0,
        )
        for pods in POOLS.values()
        for pod_id in pods
    ]
    server.twin.SyncClusterConfig(pb.ClusterConfig(instances=pods), timeout=10)


def push_served(server, instance, count, start_us, span_us, output):
    """`count` requests routed to `instance` over `span_us` of client time from `start_us`,
    each finished with `output` tokens at the end."""
    events = []
    gap = span_us // count
    for n in range(count):
        at = start_us + n * gap
        request = pb.RequestState(request_id=f"{instance}-{start_us}-{n}", arrival_us=at, prompt_tokens=100, max_tokens=output)
        events.append(pb.RequestEvent(at_us=at, routed=pb.RequestRouted(request=request)))
    end = start_us + span_us
    for n in range(count):
        finished = pb.RequestFinished(request_id=f"{instance}-{start_us}-{n}", output_tokens=output)
        events.append(pb.RequestEvent(at_us=end, finished=finished))
    update = pb.InstanceStateUpdate(instance_id=instance, observed_at_us=end, events=events)
    assert server.twin.PushInstanceState(iter([update]), timeout=30).accepted == 1


def test_each_pool_s_forecast_follows_only_its_own_load():
    """The observed arrival rate and length mix are kept per pool: with load pushed to
    `blue` only, `green` observes nothing, stays inactive and asks for no replica (KEDA) and
    one (the forecast loop); then green's own load moves green and not blue."""
    server = Server(
        extra_args=STEP_ARGS
        + ["--forecast-interval", "0.2", "--forecast-horizon-s", "10", "--forecast-replications", "1",
           "--forecast-slo-ttft-ms", "250", "--forecast-slo-tpot-ms", "15", "--forecast-target-attainment", "0.9"]
    )
    try:
        server.wait_serving()
        sync_two_pools(server)
        scaler = ks_grpc.ExternalScalerStub(server.channel)

        def of(pool, **overrides):
            return ref(pool=pool, ttftMs="250", tpotMs="15", horizonSeconds="10", warmUpSeconds="5", targetAttainment="0.9", **overrides)

        def desired(pool):
            name = f"ditto-desired-replicas-{pool}"
            values = scaler.GetMetrics(ks.GetMetricsRequest(scaledObjectRef=of(pool), metricName=name), timeout=60)
            return values.metricValues[0].metricValueFloat

        def observed(pool):
            text = server.http("/metrics")[1]
            return gauge(text, "ditto_load_observed_arrivals_per_second", f'namespace="",pool="{pool}"')

        def loop_desired(pool):
            text = server.http("/metrics")[1]
            match = re.search(rf'^ditto_desired_replicas\{{[^}}]*variant_name="{pool}"[^}}]*\}} (\S+)$', text, re.MULTILINE)
            return None if match is None else float(match.group(1))

        until("both pools sampled", lambda: (observed("blue"), observed("green")), lambda o: None not in o)
        # 40 req/s of 400-token outputs on blue's first pod over 10 s of client time: at
        # 15 ms a token (5 ms + 0.1 ms a sequence per step) that needs three pods or more.
        push_served(server, "blue-0", 400, 1_000_000, 10_000_000, 400)
        until("blue observed", lambda: observed("blue"), lambda r: r > 30.0)
        assert observed("green") == 0.0
        blue = until("blue's replicas", lambda: desired("blue"), lambda d: d >= 3)
        assert scaler.IsActive(of("green"), timeout=10).result is False
        assert desired("green") == 0.0
        loop = until("the loop's rounds", lambda: (loop_desired("blue"), loop_desired("green")), lambda d: (d[0] or 0) >= 3)
        assert loop[1] == 1.0, loop
        snapshot = server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10)
        assert snapshot.traffic.arrivals_per_s > 30.0, "the mirror's own rate is the sum"

        # Green's own load, 10 req/s of short outputs: green follows it, blue's rate does not
        # grow with it.
        blue_rate = observed("blue")
        push_served(server, "green-1", 100, 11_000_000, 10_000_000, 20)
        until("green observed", lambda: observed("green"), lambda r: r > 3.0)
        assert observed("blue") <= blue_rate
        assert until("green active", lambda: scaler.IsActive(of("green"), timeout=10), lambda r: r.result).result
        assert 1.0 <= desired("green") < blue
    finally:
        stop(server)
