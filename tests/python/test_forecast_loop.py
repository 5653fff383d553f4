"""The forecast loop of the real `ditto serve` (`--forecast-interval`): it exports
ditto_desired_replicas, ditto_current_replicas and ditto_forecast_slo_attainment_ratio per
variant on /metrics; with no observed traffic one replica is desired, and once the mirror has
seen 100 requests per second arrive (more than one llama-3.1-8b replica serves within a 1 s
TTFT), more than one. The loop stops with the drain: exit 0 after SIGTERM.
"""

import os
import re
import time

from conftest import Server
from ditto.v1 import twin_pb2 as pb

POLL_BOUND_S = 180.0
LABELS = 'model_name="llama-3.1-8b-instruct",namespace="llm-d",role="both",variant_name="vllm"'


def gauge(text, name):
    match = re.search(rf"^{name}\{{{re.escape(LABELS)}\}} (\S+)$", text, re.MULTILINE)
    return None if match is None else float(match.group(1))


def wait_for(server, what, predicate):
    deadline = time.monotonic() + POLL_BOUND_S
    while time.monotonic() < deadline:
        status, text = server.http("/metrics")
        assert status == 200, text
        if predicate(text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {POLL_BOUND_S} s:\n{server.output()}")


def test_the_forecast_loop_exports_desired_replicas_that_follow_traffic():
    server = Server(
        extra_args=[
            "--forecast-interval", "0.2",
            "--forecast-horizon-s", "20",
            "--forecast-replications", "1",
            "--forecast-namespace", "llm-d",
        ]
    )
    try:
        server.wait_serving()
        text = wait_for(server, "a first round", lambda t: gauge(t, "ditto_desired_replicas") is not None)
        assert gauge(text, "ditto_current_replicas") == 4
        assert gauge(text, "ditto_desired_replicas") == 1, "no traffic observed yet"
        assert gauge(text, "ditto_forecast_slo_attainment_ratio") == 1.0

        # 200 arrivals over 2 s of client time: 100 requests per second.
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
        text = wait_for(server, "more than one desired replica", lambda t: (gauge(t, "ditto_desired_replicas") or 0) > 1)
        attainment = gauge(text, "ditto_forecast_slo_attainment_ratio")
        assert 0.0 <= attainment <= 1.0
        assert gauge(text, "ditto_current_replicas") == 4
        assert re.search(r'^ditto_forecast_rounds_total\{outcome="ok"\} [1-9]', text, re.MULTILINE)
    finally:
        code = server.terminate()
        output = server.output()
        os.unlink(server.log.name)
    assert code == 0, output
    assert "forecast loop stopped" in output
