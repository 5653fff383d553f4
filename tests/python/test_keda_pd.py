"""KEDA's external scaler per role of a prefill/decode pool (docs/autoscaling.md, "Per role"),
served by a real `ditto serve` and driven by stubs generated from
proto/externalscaler/externalscaler.proto (KEDA's wire format), and the chart's ScaledObject
per role.

The pool is llm-d's P/D deployment as the mirror sees it: one pool, `vllm`, of two prefill
pods and one decode pod (llm-d runs them as two Deployments, one InferencePool, the pods told
apart by `llm-d.ai/role`), synced through SyncClusterConfig with each pod's role. Load is
pushed as the pods would report it (requests routed then finished, through
PushInstanceState): about 40 requests per second, and the finished requests' lengths are the
mix the forecast samples. A step costs 5 ms + 20 us a prefill token + 100 us a decode token
(blackbox), so long outputs need more decode pods, and long prompts more prefill pods.
"""

import concurrent.futures
import os
import re
import threading
import time

import grpc
import jsonschema
import pytest

from conftest import Server, poll_grpc_until
from ditto.v1 import twin_pb2 as pb
from externalscaler import externalscaler_pb2 as ks
from externalscaler import externalscaler_pb2_grpc as ks_grpc
from test_deploy import CHART, NAMESPACE, RELEASE, SCALED_OBJECT, bad_values_error, keda_values, render

POLL_BOUND_S = 180.0
STEP_ARGS = ["--load-forecast-step-s", "0.25"]
COEFFICIENTS = pb.BlackboxCoefficients(alpha=[0, 0, 0], beta=[5000, 20, 100])
PREFILL = ["llm-d/vllm-0:8000", "llm-d/vllm-1:8000"]
DECODE = ["llm-d/vllm-2:8000"]
METADATA = {
    "scalerAddress": "ditto.llm-d.svc:9010",
    "pool": "vllm",
    "ttftMs": "250",
    "tpotMs": "15",
    "horizonSeconds": "10",
    "warmUpSeconds": "5",
    "targetAttainment": "0.9",
    "replications": "1",
}
# Requests per phase (more than the 1,024 finished lengths the mirror keeps, so each phase's
# mix replaces the last) over PHASE_S seconds of client time: 40 requests per second.
PHASE_REQUESTS = 1100
PHASE_S = 27.5


def pod(pod_id, role):
    return pb.InstanceSpec(
        id=pod_id,
        address=f"{pod_id}-addr",
        role=role,
        latency_model="blackbox",
        coefficients=COEFFICIENTS,
        engine=pb.EngineLimits(num_gpu_blocks=20000, max_num_seqs=256),
        cost_per_hour=1.0,
    )


def sync(server, prefill=PREFILL, decode=DECODE):
    pods = [pod(i, "prefill") for i in prefill] + [pod(i, "decode") for i in decode]
    server.twin.SyncClusterConfig(pb.ClusterConfig(instances=pods), timeout=10)


def ref(**overrides):
    metadata = dict(METADATA)
    for key, value in overrides.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    return ks.ScaledObjectRef(name="vllm-d", namespace="llm-d", scalerMetadata=metadata)


def until(what, call, predicate, bound=POLL_BOUND_S):
    """Polls `call` (retrying UNAVAILABLE before the first load sample) until `predicate`."""
    return poll_grpc_until(what, call, predicate, bound, 0.2)


def sampled(what, call):
    """Polls `call` until the load sampler has sampled the pool as synced (before: UNAVAILABLE,
    or the previous config's pools, which may not have it or fit its role), returning its
    answer."""
    deadline = time.monotonic() + POLL_BOUND_S
    last = None
    while time.monotonic() < deadline:
        try:
            return call()
        except grpc.RpcError as err:
            if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
                raise
            last = err
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {POLL_BOUND_S} s (last: {last})")


def push_phase(server, phase, prompt, output, instance=DECODE[0]):
    """Phase `phase` (0, 1, ...): PHASE_REQUESTS + phase requests routed over the phase's
    PHASE_S seconds of client time, then finished with `output` tokens each."""
    count = PHASE_REQUESTS + phase  # a slightly different rate each phase
    start_us = 1_000_000 + int(phase * PHASE_S * 1e6)
    gap_us = int(PHASE_S * 1e6) // count
    events = []
    for n in range(count):
        at = start_us + n * gap_us
        request = pb.RequestState(
            request_id=f"p{phase}-{n}", arrival_us=at, prompt_tokens=prompt, max_tokens=output
        )
        events.append(pb.RequestEvent(at_us=at, routed=pb.RequestRouted(request=request)))
    end_us = start_us + count * gap_us
    for n in range(count):
        finished = pb.RequestFinished(request_id=f"p{phase}-{n}", output_tokens=output)
        events.append(pb.RequestEvent(at_us=end_us, finished=finished))
    update = pb.InstanceStateUpdate(instance_id=instance, observed_at_us=end_us, events=events)
    ack = server.twin.PushInstanceState(iter([update]), timeout=60)
    assert ack.accepted == 1


def replicas(scaler, role):
    reference = ref(role=role)
    name = f"ditto-desired-replicas-vllm-{role}"
    values = scaler.GetMetrics(ks.GetMetricsRequest(scaledObjectRef=reference, metricName=name), timeout=120)
    (value,) = values.metricValues
    assert value.metricName == name and value.metricValue == int(value.metricValueFloat)
    return int(value.metricValueFloat)


def split(scaler):
    return replicas(scaler, "prefill"), replicas(scaler, "decode")


def forecasts(server, outcome):
    text = server.http("/metrics")[1]
    match = re.search(rf'^ditto_keda_forecasts_total\{{outcome="{outcome}"\}} (\S+)$', text, re.MULTILINE)
    return 0.0 if match is None else float(match.group(1))


def stop(server):
    code = server.terminate()
    output = server.output()
    os.unlink(server.log.name)
    assert code == 0, output


def expect_invalid_role(call):
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert caught.value.details().startswith("scalerMetadata.role"), caught.value.details()
    return caught.value.details()


def four_calls(scaler, reference):
    return [
        lambda: scaler.GetMetricSpec(reference, timeout=10),
        lambda: scaler.IsActive(reference, timeout=10),
        lambda: scaler.GetMetrics(ks.GetMetricsRequest(scaledObjectRef=reference), timeout=10),
        lambda: next(iter(scaler.StreamIsActive(reference, timeout=10))),
    ]


def test_each_role_follows_the_load_only_it_needs():
    server = Server(extra_args=STEP_ARGS)
    try:
        server.wait_serving()
        sync(server)
        scaler = ks_grpc.ExternalScalerStub(server.channel)
        # No load yet: both roles inactive and asking for nothing; the stream says so.
        assert sampled("the P/D pool", lambda: scaler.IsActive(ref(role="decode"), timeout=10)).result is False
        for role in ("prefill", "decode"):
            (spec,) = scaler.GetMetricSpec(ref(role=role), timeout=10).metricSpecs
            assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == (f"ditto-desired-replicas-vllm-{role}", 1, 1.0)
        assert scaler.IsActive(ref(role="prefill"), timeout=10).result is False
        assert split(scaler) == (0, 0)
        stream = scaler.StreamIsActive(ref(role="decode"), timeout=POLL_BOUND_S)
        assert next(stream).result is False

        # Short prompts, short outputs: one pod of each role serves 40 requests per second.
        push_phase(server, 0, prompt=100, output=20)
        assert next(stream).result is True, "the decode role's stream did not deliver the load"
        stream.cancel()
        assert scaler.IsActive(ref(role="prefill"), timeout=10).result is True
        base = until("both roles asked for", lambda: split(scaler), lambda s: min(s) >= 1)
        assert base == (1, 1), base

        # Both roles read one split forecast: asked together, at most one computation.
        computed = forecasts(server, "computed")
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda role: replicas(scaler, role), ["prefill", "decode"]))
        assert both == list(base)
        assert forecasts(server, "computed") - computed <= 1

        # Longer outputs: only decode needs more pods.
        push_phase(server, 1, prompt=100, output=400)
        long_outputs = until("the decode count up", lambda: split(scaler), lambda s: s[1] > base[1])
        assert long_outputs[0] == base[0], long_outputs

        # Longer prompts (short outputs again): prefill needs more pods, decode fewer.
        push_phase(server, 2, prompt=2000, output=20)
        long_prompts = until("the prefill count up", lambda: split(scaler), lambda s: s[0] > base[0])
        assert long_prompts[1] < long_outputs[1], (long_outputs, long_prompts)
        assert forecasts(server, "error") == 0
    finally:
        stop(server)


def test_roles_named_as_two_pools_share_one_split():
    """Prefill and decode pods named apart (`prefill-*`, `decode-*`: two pools by name) pair
    by model and namespace; each role's trigger names its own pool and reads the same split."""
    server = Server(extra_args=STEP_ARGS)
    try:
        server.wait_serving()
        sync(server, prefill=["llm-d/prefill-0:8000"], decode=["llm-d/decode-0:8000"])
        scaler = ks_grpc.ExternalScalerStub(server.channel)
        prefill = ref(pool="prefill", role="prefill")
        decode = ref(pool="decode", role="decode")
        sampled("the pools", lambda: scaler.IsActive(prefill, timeout=10))
        # A role the named pool has no pods of, and no role on a P/D pool, are refused.
        assert "no decode pods" in expect_invalid_role(lambda: scaler.IsActive(ref(pool="prefill", role="decode"), timeout=10))
        assert "required" in expect_invalid_role(lambda: scaler.IsActive(ref(pool="decode"), timeout=10))

        push_phase(server, 0, prompt=2000, output=20, instance="llm-d/decode-0:8000")

        def both():
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                futures = [
                    pool.submit(scaler.GetMetrics, ks.GetMetricsRequest(scaledObjectRef=r), timeout=120)
                    for r in (prefill, decode)
                ]
                return [f.result().metricValues[0].metricValueFloat for f in futures]

        computed, cached = forecasts(server, "computed"), forecasts(server, "cached")
        counts = until("both roles asked for", both, lambda s: min(s) >= 1)
        # Each role of the pair saw the pair's whole arrival rate: prompt-heavy, more prefill.
        assert counts[0] > counts[1] == 1, counts
        # Asked together, the two roles ran at most one forecast per refresh between them.
        new_computed = forecasts(server, "computed") - computed
        new_cached = forecasts(server, "cached") - cached
        assert new_computed <= new_cached + 1, (new_computed, new_cached)
    finally:
        stop(server)


def test_a_role_on_a_pool_that_is_not_disaggregated_or_an_unknown_role_is_refused(server):
    # The default cluster's pool `vllm` serves both roles on every pod.
    scaler = ks_grpc.ExternalScalerStub(server.channel)
    until("the pool sampled", lambda: scaler.IsActive(ref(ttftMs="1000", tpotMs="100"), timeout=10), lambda r: True)
    for call in four_calls(scaler, ref(role="decode")):
        assert "not disaggregated" in expect_invalid_role(call)
    for call in four_calls(scaler, ref(role="both")):
        expect_invalid_role(call)
    # Without a role, the whole pool as before.
    (spec,) = scaler.GetMetricSpec(ref(), timeout=10).metricSpecs
    assert spec.metricName == "ditto-desired-replicas-vllm"


def roles_values(**extra):
    values = keda_values(
        roles=[
            {"role": "prefill", "scaleTargetRef": {"name": "vllm-p"}, "maxReplicaCount": 6},
            {
                "role": "decode",
                "scaleTargetRef": {"kind": "StatefulSet", "name": "vllm-d"},
                "minReplicaCount": 2,
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 180}]}},
                "extraTriggers": [{"type": "prometheus", "metadata": {"serverAddress": "http://prometheus:9090", "query": "sum(x)", "threshold": "5"}}],
            },
        ],
        **extra,
    )
    values["keda"].pop("scaleTargetRef")
    return values


def test_the_chart_renders_one_scaled_object_per_role_valid_against_keda_s_crd():
    import helm_python as helm

    from k8s_manifests import KUBE_VERSION

    values = roles_values()
    objects = render(values)
    scaled = {name: obj for (kind, name), obj in objects.items() if kind == "ScaledObject"}
    assert set(scaled) == {"vllm-p", "vllm-d"}
    for obj in scaled.values():
        jsonschema.validate(obj, SCALED_OBJECT)
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
    assert not [m for m in report["messages"] if m["severity"] >= 2] and not report["errors"], report
    prefill, decode = scaled["vllm-p"]["spec"], scaled["vllm-d"]["spec"]
    assert prefill["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-p"}
    assert decode["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "vllm-d"}
    # Bounds per role, the rest from keda's defaults.
    assert (prefill["minReplicaCount"], prefill["maxReplicaCount"]) == (1, 6)
    assert (decode["minReplicaCount"], decode["maxReplicaCount"]) == (2, 8)
    # The behaviour override is merged over the guide's defaults (scale-up kept).
    up, down = (decode["advanced"]["horizontalPodAutoscalerConfig"]["behavior"][k] for k in ("scaleUp", "scaleDown"))
    assert up == prefill["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]
    assert down == {"stabilizationWindowSeconds": 300, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 180}]}
    assert prefill["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 180
    # One trigger to ditto each, with its role; the decode one with its extra trigger.
    for spec, role in ((prefill, "prefill"), (decode, "decode")):
        ditto = spec["triggers"][0]
        assert ditto["metadata"]["role"] == role and ditto["metadata"]["pool"] == "vllm"
        assert ditto["metadata"]["scalerAddress"].startswith(f"{RELEASE}.{NAMESPACE}.svc.cluster.local:")
    assert len(prefill["triggers"]) == 1 and [t["type"] for t in decode["triggers"]] == ["external", "prometheus"]


def test_the_rendered_role_metadata_is_what_ditto_accepts():
    """Each role's trigger metadata as KEDA sends it, to a real ditto serve mirroring a P/D pool."""
    objects = render(roles_values())
    server = Server(extra_args=STEP_ARGS)
    try:
        server.wait_serving()
        sync(server)
        scaler = ks_grpc.ExternalScalerStub(server.channel)
        for name, role in (("vllm-p", "prefill"), ("vllm-d", "decode")):
            metadata = objects[("ScaledObject", name)]["spec"]["triggers"][0]["metadata"]
            reference = ks.ScaledObjectRef(name=name, namespace=NAMESPACE, scalerMetadata=metadata)
            assert sampled("the P/D pool", lambda: scaler.IsActive(reference, timeout=10)).result is False
            (spec,) = scaler.GetMetricSpec(reference, timeout=10).metricSpecs
            assert spec.metricName == f"ditto-desired-replicas-vllm-{role}"
    finally:
        stop(server)


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda v: v["keda"]["roles"].append(dict(v["keda"]["roles"][0])), "keda"),
        (lambda v: v["keda"]["roles"][1].update(role="prefill"), "keda.roles[1].role"),
        (lambda v: v["keda"]["roles"][1]["scaleTargetRef"].update(name="vllm-p"), "keda.roles[1].scaleTargetRef.name"),
        (lambda v: v["keda"]["roles"][0].update(role="both"), "keda"),
        (lambda v: v["keda"]["roles"][0].pop("scaleTargetRef"), "keda"),
    ],
    ids=["three-roles", "a-role-twice", "a-target-twice", "unknown-role", "no-target"],
)
def test_bad_roles_are_refused_naming_the_value(change, named):
    values = roles_values()
    change(values)
    assert named in bad_values_error(values)


class SteadyLoad:
    """Pushes `rate` requests per second to `instance` in client time that follows the wall
    clock (a batch every 0.25 s, routed and finished with `output` tokens), so the observed
    rate holds at `rate` instead of decaying after one burst."""

    def __init__(self, server, rate, prompt, output, instance=DECODE[0]):
        self.server, self.rate, self.prompt, self.output, self.instance = server, rate, prompt, output, instance
        self.stopped = threading.Event()
        self.errors = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        start = time.monotonic()
        sent = 0
        while not self.stopped.wait(0.25):
            now_us = 1_000_000 + int((time.monotonic() - start) * 1e6)
            due = int((now_us - 1_000_000) / 1e6 * self.rate)
            events = []
            for n in range(sent, due):
                at = 1_000_000 + int(n / self.rate * 1e6)
                request = pb.RequestState(request_id=f"s{n}", arrival_us=at, prompt_tokens=self.prompt, max_tokens=self.output)
                events.append(pb.RequestEvent(at_us=at, routed=pb.RequestRouted(request=request)))
            for n in range(sent, due):
                finished = pb.RequestFinished(request_id=f"s{n}", output_tokens=self.output)
                events.append(pb.RequestEvent(at_us=now_us, finished=finished))
            sent = due
            update = pb.InstanceStateUpdate(instance_id=self.instance, observed_at_us=now_us, events=events)
            try:
                self.server.twin.PushInstanceState(iter([update]), timeout=30)
            except grpc.RpcError as err:
                self.errors.append(err)
                return

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=30)
        assert not self.errors, self.errors


def forecast_split(server, rate, prompt, output):
    """ForecastCapacity's P/D answer for the pool's pair as the scaler asks it: idle pods, the
    horizon in four stages at `rate`, the observed lengths, the trigger's objectives."""
    question = pb.ForecastCapacityRequest(
        start=pb.FORECAST_START_EMPTY,
        stages=[pb.RateStage(rate_rps=rate, duration_s=2.5)] * 4,
        input_tokens=pb.LengthDistribution(empirical=pb.EmpiricalLength(values=[prompt], weights=[1.0])),
        output_tokens=pb.LengthDistribution(empirical=pb.EmpiricalLength(values=[output], weights=[1.0])),
        variants=[pb.VariantCandidates(template_instance_id=PREFILL[0]), pb.VariantCandidates(template_instance_id=DECODE[0])],
        slo=pb.SloTargets(ttft_ms=250.0, tpot_ms=15.0),
        target_attainment=0.9,
        replications=1,
        seed=0,
    )
    answer = server.twin.ForecastCapacity(question, timeout=120)
    desired = {v.template_instance_id: v.replicas for v in answer.desired_replicas}
    candidates = [
        ({v.template_instance_id: v.replicas for v in c.replicas}, c.slo_attainment) for c in answer.candidates
    ]
    return (desired[PREFILL[0]], desired[DECODE[0]]), candidates


def test_forecast_capacity_s_split_is_the_scaler_s_on_the_same_load():
    """One trimmed split for both callers: at 44 req/s of 100-token prompts and 400-token
    outputs the search stops with a prefill pod more than the split needs (docs/autoscaling.md,
    "Per role"); ForecastCapacity's P/D answer and the scaler's per-role counts are both the
    trimmed split."""
    server = Server(extra_args=STEP_ARGS)
    load = None
    try:
        server.wait_serving()
        sync(server)
        scaler = ks_grpc.ExternalScalerStub(server.channel)
        sampled("the P/D pool", lambda: scaler.IsActive(ref(role="decode"), timeout=10))
        load = SteadyLoad(server, 44.0, prompt=100, output=400)
        rate_name = "ditto-arrival-rate-vllm-decode"

        def rate():
            reference = ref(role="decode", metric="arrivalRate", arrivalRatePerReplica="10")
            values = scaler.GetMetrics(ks.GetMetricsRequest(scaledObjectRef=reference, metricName=rate_name), timeout=30)
            return values.metricValues[0].metricValueFloat

        # The forecast settles on the steady rate (its trend from the step up worn off).
        until("the forecast at the steady rate", rate, lambda r: 40.0 <= r <= 48.0)
        scaled = until("a settled split", lambda: (split(scaler), split(scaler)), lambda s: s[0] == s[1] and min(s[0]) >= 1)[0]

        answered, candidates = forecast_split(server, 44.0, 100, 400)
        # Not a borderline load: the same split 9 % either side.
        assert forecast_split(server, 40.0, 100, 400)[0] == answered == forecast_split(server, 48.0, 100, 400)[0]
        assert scaled == answered, (scaled, answered)
        # The search's first met split carried more prefill pods than the answer: the trim ran.
        first_met = next(counts for counts, attainment in candidates if attainment >= 0.9)
        assert first_met[PREFILL[0]] > answered[0] and first_met[DECODE[0]] >= answered[1], (first_met, answered)
    finally:
        if load is not None:
            load.stop()
        stop(server)
