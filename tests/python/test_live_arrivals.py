"""The live mirror counts every arrival a pod saw: under steady load (running and waiting
flat, requests finishing as fast as they come) the arrival rate ditto reports follows the
pod's finished-request counter (`vllm:request_success_total`), not the growth of its gauges.
A restart (counters back to 0) is a new baseline, never a negative count; a hostile counter
jump is capped per scrape. A fake vLLM pod (fake_vllm.py) against a real `ditto serve
--pods`; the rate is read from GetSnapshot's traffic. Waits are bounded polls.
"""

import os
import time

from conftest import Server
from ditto.v1 import twin_pb2 as pb
from test_live import Fake, free_port_on, metric

RATE = 5.0
BOUND_S = 20.0
# Long enough that the requests that enter the pod when the load starts (3, counted once,
# as they appear) weigh little against the finished ones: 3 against 50 over 10 s.
OBSERVE_S = 10.0


def start_pod(host):
    """An idle pod with history: the first page's counter is a baseline, not arrivals."""
    fake = Fake(host, free_port_on(host))
    fake.control(finish=dict(count=200))
    return fake


def load(fake):
    """Steady load: 3 requests in the pod from now on, and RATE finishing per second."""
    fake.control(gauges=dict(running=2, waiting=1, kv=0.1))
    fake.control(steady=dict(rate=RATE))


def serve(fake):
    server = Server(["--scrape-interval-ms", "100", "--pods", fake.address])
    server.wait_serving()
    return server


def stop(server, fake):
    fake.stop()
    code = server.terminate()
    output = server.output()
    os.unlink(server.log.name)
    assert code == 0, f"ditto serve exited {code}:\n{output}"


def rate(server):
    return server.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10).traffic.arrivals_per_s


def wait_for_baseline(server, fake):
    """Polls until the scrape loop has a counter baseline (its arrivals series exists, at 0:
    the pod is idle), then starts the load."""
    deadline = time.monotonic() + BOUND_S
    while metric(server, "ditto_live_arrivals_total", instance=fake.address) is None:
        assert time.monotonic() < deadline, f"no baseline within {BOUND_S} s:\n{server.output()}"
        time.sleep(0.05)
    assert metric(server, "ditto_live_arrivals_total", instance=fake.address) == 0
    assert rate(server) == 0.0, "an idle pod: no arrivals"
    load(fake)


def assert_near_rate(server, what):
    observed = rate(server)
    assert abs(observed - RATE) <= 0.1 * RATE, f"{what}: observed {observed} req/s, want {RATE}"


def test_steady_load_is_counted_from_the_finished_counter():
    fake = start_pod("127.0.0.2")
    server = serve(fake)
    try:
        wait_for_baseline(server, fake)
        counted_before = metric(server, "ditto_live_arrivals_total", instance=fake.address)
        started = time.monotonic()
        time.sleep(OBSERVE_S)
        counted = metric(server, "ditto_live_arrivals_total", instance=fake.address) - counted_before
        elapsed = time.monotonic() - started
        # The gauges never moved: every arrival came from the counter.
        assert abs(counted / elapsed - RATE) <= 0.1 * RATE, (counted, elapsed)
        assert_near_rate(server, "steady load")
    finally:
        stop(server, fake)


def test_a_restart_is_a_new_baseline_never_negative():
    fake = start_pod("127.0.0.3")
    server = serve(fake)
    try:
        wait_for_baseline(server, fake)
        time.sleep(OBSERVE_S / 2)
        restarts = metric(server, "ditto_live_pod_restarts_total", instance=fake.address) or 0
        # The process restarts: its counter starts again from 0, well below 200 + what it
        # finished so far, under the same load.
        fake.kill()
        fake.start()
        load(fake)
        deadline = time.monotonic() + BOUND_S
        while (metric(server, "ditto_live_pod_restarts_total", instance=fake.address) or 0) <= restarts:
            assert time.monotonic() < deadline, f"restart not seen:\n{server.output()}"
            time.sleep(0.05)
        counted = metric(server, "ditto_live_arrivals_total", instance=fake.address)
        started = time.monotonic()
        time.sleep(OBSERVE_S / 2)
        after = metric(server, "ditto_live_arrivals_total", instance=fake.address) - counted
        expected = RATE * (time.monotonic() - started)
        # Counted from the new run's baseline: as many as it finished (plus, at most, the 3
        # requests that came back into the pod). A counter read as going back by hundreds
        # would be a burst; the old value kept as the baseline would miss the new run's.
        assert 0.9 * expected <= after <= 1.1 * expected + 3, (after, expected)
        # No burst in the reported rate either (the pod was down a moment: it may be lower).
        assert 0 < rate(server) <= 1.1 * RATE, rate(server)
    finally:
        stop(server, fake)


def test_a_counter_jump_is_capped_per_scrape():
    fake = start_pod("127.0.0.4")
    server = serve(fake)
    try:
        wait_for_baseline(server, fake)
        fake.control(counter_jump=10**12)
        deadline = time.monotonic() + BOUND_S
        while (metric(server, "ditto_live_state_capped_total", instance=fake.address, field="arrivals") or 0) < 1:
            assert time.monotonic() < deadline, f"no cap counted:\n{server.output()}"
            time.sleep(0.05)
        # Recorded only up to the store's arrivals_max (100000) in that scrape.
        total = metric(server, "ditto_live_arrivals_total", instance=fake.address)
        assert 100_000 <= total <= 100_000 + 2 * RATE * BOUND_S, total
        # Published with the scrape's staged write, at the next tick.
        observed = 0.0
        while observed == 0.0:
            assert time.monotonic() < deadline, f"no rate published:\n{server.output()}"
            observed = rate(server)
            time.sleep(0.05)
        assert observed <= 100_000 + 2 * RATE * OBSERVE_S, observed
        # The jumped value is the new baseline: the load is counted as before after it.
        counted = metric(server, "ditto_live_arrivals_total", instance=fake.address)
        time.sleep(2.0)
        after = metric(server, "ditto_live_arrivals_total", instance=fake.address) - counted
        assert 0.5 * 2 * RATE <= after <= 2 * 2 * RATE, after
        assert metric(server, "ditto_live_state_capped_total", instance=fake.address, field="arrivals") == 1
    finally:
        stop(server, fake)
