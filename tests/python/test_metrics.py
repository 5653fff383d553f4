"""The operator metrics of the real `ditto serve` binary, read with an independent parser
(Python prometheus-client's text parser) after real traffic, and checked against the
Prometheus naming conventions: snake_case, a `ditto_` or `process_` prefix, base units in
the name (`_seconds`, `_bytes`, never ms/us/kb), `_total` on every counter and on nothing
else, help text on every family, bounded label sets.
"""

import json
import os
import re
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, Server
from ditto.v1 import twin_pb2 as pb

NOW_US = 2_000_000
NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
# Non-base units that must not appear as a name part.
BAD_UNITS = {"ms", "millis", "milliseconds", "us", "micros", "microseconds", "ns", "minutes", "hours",
             "kb", "mb", "gb", "kib", "mib", "gib", "percent"}

# Every family the dashboard, the alerts and docs/operations.md rely on (labelled families
# with no sample yet, such as ditto_auth_rejections_total or ditto_kv_events_total, are
# absent until their first event).
REQUIRED = {
    "ditto_rpc_requests": "counter",
    "ditto_rpc_errors": "counter",
    "ditto_rpc_duration_seconds": "histogram",
    "ditto_http_requests": "counter",
    "ditto_http_request_duration_seconds": "histogram",
    "ditto_predictions": "counter",
    "ditto_forecasts": "counter",
    "ditto_forks": "counter",
    "ditto_simulation_events": "counter",
    "ditto_event_budget_exhaustions": "counter",
    "ditto_snapshot_generation": "gauge",
    "ditto_config_generation": "gauge",
    "ditto_instances": "gauge",
    "ditto_instances_by_freshness": "gauge",
    "ditto_stale_instances": "gauge",
    "ditto_pushed_messages": "counter",
    "ditto_write_rejections": "counter",
    "ditto_kv_event_seq_gaps": "counter",
    "ditto_simulations_running": "gauge",
    "ditto_simulations_waiting": "gauge",
    "ditto_grpc_requests_in_flight": "gauge",
    "ditto_build_info": "gauge",
    "process_cpu_seconds": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_open_fds": "gauge",
}


def scrape(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families, name, sample_name=None, **labels):
    """The value of the one sample of `name` with these labels (sum over other labels)."""
    family = families[name]
    sample_name = sample_name or (name + "_total" if family.type == "counter" else name)
    matching = [
        s.value for s in family.samples
        if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert matching, f"no {sample_name}{labels} in {family.samples}"
    return sum(matching)


def traffic(server):
    """One of everything: a prediction, a forecast, a good and a refused push, a refused
    config, reads, HTTP probes and an unknown path."""
    message = pb.PredictRoutingRequest(
        request=pb.CandidateRequest(prompt_tokens=500, output_tokens=16),
        request_id="q",
        now_us=NOW_US,
    )
    message.options.replications = 2
    answer = server.twin.PredictRouting(message, timeout=60)
    forecast = pb.ForecastCapacityRequest(
        stages=[pb.RateStage(rate_rps=5.0, duration_s=5.0)],
        input_tokens=pb.LengthDistribution(constant=256),
        output_tokens=pb.LengthDistribution(constant=32),
        variants=[pb.VariantCandidates(template_instance_id="vllm-0", replica_counts=[1, 2])],
        replications=1,
        now_us=NOW_US,
    )
    server.twin.ForecastCapacity(forecast, timeout=120)
    good = pb.InstanceStateUpdate(
        instance_id="vllm-0",
        observed_at_us=NOW_US,
        requests=pb.RequestLists(
            waiting=[pb.RequestState(request_id="r", arrival_us=NOW_US - 1000, prompt_tokens=10, max_tokens=10)]
        ),
    )
    server.twin.PushInstanceState(iter([good]), timeout=10)
    with pytest.raises(grpc.RpcError) as refused:
        server.twin.PushInstanceState(iter([pb.InstanceStateUpdate(instance_id="ghost")]), timeout=10)
    with pytest.raises(grpc.RpcError):
        server.twin.SyncClusterConfig(pb.ClusterConfig(), timeout=10)
    server.twin.GetSnapshot(pb.GetSnapshotRequest(now_us=NOW_US), timeout=10)
    assert server.http("/healthz")[0] == 200
    assert server.http("/readyz")[0] == 200
    assert server.http("/no/such/path")[0] == 404
    return len(answer.candidates), refused.value.code()


# llm-d's latency predictor series, exported under the peer's own names for its clients
# (docs/latency-predictor.md): the only families without ditto's prefix.
PEER_SERIES = {"model_type", "objective_type", "model_quantile", "ensemble_active", "ensemble_mode",
               "training_samples_count"}


def test_metrics_follow_the_naming_rules_and_count_the_traffic(server):
    candidates, refusal = traffic(server)
    families = scrape(server)

    for name, kind in REQUIRED.items():
        assert name in families, f"{name} missing; have {sorted(families)}"
        assert families[name].type == kind, (name, families[name].type)

    for name, family in families.items():
        assert NAME.match(name), name
        assert name.startswith(("ditto_", "process_")) or name in PEER_SERIES, name
        assert family.documentation.strip(), f"{name} has no help text"
        parts = set(name.split("_"))
        assert not parts & BAD_UNITS, f"{name}: use base units (seconds, bytes)"
        if family.type == "counter":
            for sample in family.samples:
                assert sample.name.endswith(("_total", "_created")), sample.name
        else:
            assert not name.endswith("_total"), f"{name} is a {family.type} named like a counter"
        if family.type == "histogram":
            assert name.endswith(("_seconds", "_bytes")), f"histogram {name} has no unit"
        for sample in family.samples:
            for label in sample.labels:
                assert NAME.match(label) and not label.startswith("__"), (name, label)

    # Build info: one sample, value 1, version and git sha.
    [info] = families["ditto_build_info"].samples
    assert info.value == 1
    assert re.match(r"^\d+\.\d+\.\d+", info.labels["version"]), info.labels
    assert re.match(r"^[0-9a-z]+$", info.labels["git_sha"]), info.labels

    # The traffic is counted.
    assert value(families, "ditto_predictions") == 1
    assert value(families, "ditto_forecasts") == 1
    assert value(families, "ditto_forks", rpc="PredictRouting") == candidates * 2
    assert value(families, "ditto_forks", rpc="ForecastCapacity") == 2
    assert value(families, "ditto_simulation_events") > 0
    assert value(families, "ditto_pushed_messages", rpc="PushInstanceState") == 1
    code = refusal.name.title().replace("_", "")
    assert value(families, "ditto_write_rejections", rpc="PushInstanceState", reason=code) == 1
    assert value(families, "ditto_write_rejections", rpc="SyncClusterConfig") == 1
    assert value(families, "ditto_rpc_errors", rpc="PushInstanceState", code=code) == 1
    assert not [s for s in families["ditto_rpc_errors"].samples if s.labels.get("rpc") == "PredictRouting"]
    assert value(
        families, "ditto_rpc_duration_seconds", "ditto_rpc_duration_seconds_count", rpc="PredictRouting", code="Ok"
    ) == 1
    assert value(families, "ditto_http_requests", route="/healthz", code="200") == 1
    assert value(families, "ditto_http_requests", route="other", code="404") == 1
    assert value(
        families, "ditto_http_request_duration_seconds", "ditto_http_request_duration_seconds_count", route="/readyz"
    ) == 1
    # The default cluster's four instances, one of them pushed: fresh vs never observed.
    assert value(families, "ditto_instances_by_freshness", freshness="never_observed") == 3
    assert value(families, "ditto_instances_by_freshness") == value(families, "ditto_instances")
    # The process collector.
    assert value(families, "process_resident_memory_bytes") > 1_000_000
    assert value(families, "process_open_fds") > 3


def test_a_call_whose_event_budget_runs_out_is_counted():
    server = Server(extra_args=["--max-events-per-call", "5"])
    try:
        server.wait_serving()
        message = pb.PredictRoutingRequest(
            request=pb.CandidateRequest(prompt_tokens=500, output_tokens=200), request_id="q", now_us=NOW_US
        )
        with pytest.raises(grpc.RpcError) as caught:
            server.twin.PredictRouting(message, timeout=60)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
        families = scrape(server)
        assert value(families, "ditto_event_budget_exhaustions") == 1
        assert value(families, "ditto_rpc_errors", rpc="PredictRouting", code="ResourceExhausted") == 1
    finally:
        assert server.terminate() == 0, server.output()


def test_the_grafana_dashboard_uses_only_exported_metrics(server):
    """Every series the dashboard in deploy/grafana queries is one the server exports (or a
    labelled family that appears on its first event)."""
    traffic(server)
    families = scrape(server)
    samples = {sample.name for family in families.values() for sample in family.samples}
    first_event_only = {"ditto_auth_rejections_total", "ditto_kv_events_total"}
    with open(os.path.join(ROOT, "deploy", "grafana", "ditto-dashboard.json"), encoding="utf-8") as handle:
        dashboard = json.load(handle)
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\b((?:ditto|process)_[a-z0-9_]+)", expr)}
    assert len(used) >= 20, used
    missing = sorted(used - samples - first_event_only)
    assert not missing, f"the dashboard queries series /metrics does not have: {missing}"
    # Panel ids are unique and every panel has a query.
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(panel["targets"] for panel in dashboard["panels"])
