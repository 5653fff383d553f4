"""Graceful lifecycle of the real `ditto serve` binary under SIGTERM, with its default drain.

A push stream open at SIGTERM (the server has applied its first message, so it is in
flight) must be allowed to finish: meanwhile health reports NOT_SERVING over a fresh gRPC
connection, /readyz answers 503, a new Twin call is refused with UNAVAILABLE, the stream's
second message is still accepted and its ack arrives, and the process exits 0. A forecast
in flight at SIGTERM must get its answer, not UNAVAILABLE (the default drain covers the
default call deadline). No timing assertions: every wait is a bounded poll of an observable
state.
"""

import queue
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import BINARY, EXIT_BOUND_S, free_port
from ditto.v1 import twin_pb2 as pb
from ditto.v1 import twin_pb2_grpc

POLL_BOUND_S = 60.0
# The default drain is the default call deadline (30 s) plus 5 s; the process must be gone
# well within it once nothing is in flight.
DRAIN_EXIT_BOUND_S = 35.0 + EXIT_BOUND_S


class Process:
    """`ditto serve` with its default drain (no --drain-ms), on free local ports."""

    def __init__(self):
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="ditto-lifecycle-", suffix=".log")
        self.process = subprocess.Popen(
            [
                BINARY,
                "serve",
                "--grpc-addr",
                f"127.0.0.1:{self.grpc_port}",
                "--http-addr",
                f"127.0.0.1:{self.http_port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.channel = self.connect()
        self.twin = twin_pb2_grpc.TwinStub(self.channel)

    def connect(self):
        return grpc.insecure_channel(
            f"127.0.0.1:{self.grpc_port}",
            options=[
                ("grpc.initial_reconnect_backoff_ms", 50),
                ("grpc.min_reconnect_backoff_ms", 50),
                ("grpc.max_reconnect_backoff_ms", 200),
            ],
        )

    def health(self):
        """Overall health over a fresh connection, as a kubelet probe would ask."""
        channel = self.connect()
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5, wait_for_ready=True
            )
            return reply.status
        finally:
            channel.close()

    def http(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=10) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def in_flight(self):
        status, text = self.http("/metrics")
        assert status == 200, text
        match = re.search(r"^ditto_grpc_requests_in_flight (\S+)$", text, re.MULTILINE)
        assert match, "the in-flight gauge is exported"
        return float(match.group(1))

    def output(self):
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def wait_until(self, what, predicate):
        deadline = time.monotonic() + POLL_BOUND_S
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.02)
        raise AssertionError(f"{what} not within {POLL_BOUND_S} s:\n{self.output()}")

    def wait_exit(self, bound):
        try:
            return self.process.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=EXIT_BOUND_S)
            raise AssertionError(f"ditto serve did not exit within {bound} s:\n{self.output()}")

    def close(self):
        self.channel.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=EXIT_BOUND_S)
        self.log.close()


def serving(process):
    process.wait_until("SERVING", lambda: process.health() == health_pb2.HealthCheckResponse.SERVING)


def update(at_us, request_id):
    return pb.InstanceStateUpdate(
        instance_id="vllm-0",
        observed_at_us=at_us,
        requests=pb.RequestLists(
            waiting=[
                pb.RequestState(request_id=request_id, arrival_us=at_us - 1000, prompt_tokens=100, max_tokens=50)
            ]
        ),
    )


def test_sigterm_drains_an_open_push_stream_and_reports_not_serving_meanwhile():
    process = Process()
    try:
        serving(process)
        generation = process.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10).generation
        messages = queue.Queue()
        messages.put(update(1_000_000, "r1"))

        def stream():
            while True:
                message = messages.get()
                if message is None:
                    return
                yield message

        ack = process.twin.PushInstanceState.future(stream(), timeout=POLL_BOUND_S + DRAIN_EXIT_BOUND_S)
        # The first message is applied: the stream is in flight on the server.
        process.wait_until(
            "the first push applied",
            lambda: process.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10).generation > generation,
        )
        process.wait_until("only the push stream in flight", lambda: process.in_flight() == 1)

        process.process.send_signal(signal.SIGTERM)
        process.wait_until(
            "NOT_SERVING after SIGTERM",
            lambda: process.health() == health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        status, body = process.http("/readyz")
        assert status == 503, body
        try:
            process.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10)
            raise AssertionError("a new call during the drain must be refused")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err.details()
            assert "shutting down" in err.details()
        assert process.process.poll() is None, "the server waits for the open stream"
        process.wait_until("only the push stream in flight", lambda: process.in_flight() == 1)

        messages.put(update(1_100_000, "r2"))
        messages.put(None)
        reply = ack.result(timeout=POLL_BOUND_S)
        assert reply.accepted == 2
        assert process.wait_exit(DRAIN_EXIT_BOUND_S) == 0
        assert "drain time over" not in process.output()
    finally:
        process.close()


def test_a_forecast_in_flight_at_sigterm_gets_its_answer():
    process = Process()
    try:
        serving(process)
        message = pb.ForecastCapacityRequest(
            # A few seconds of simulation in a debug build: long enough to be caught in flight.
            stages=[pb.RateStage(rate_rps=60.0, duration_s=150.0)],
            input_tokens=pb.LengthDistribution(constant=1024),
            output_tokens=pb.LengthDistribution(constant=256),
            variants=[pb.VariantCandidates(template_instance_id="vllm-0", replica_counts=[1, 2, 4])],
            replications=2,
            seed=5,
        )
        message.slo.ttft_ms = 300.0
        answer = process.twin.ForecastCapacity.future(message, timeout=120)
        process.wait_until("the forecast in flight", lambda: process.in_flight() >= 1)
        process.process.send_signal(signal.SIGTERM)
        try:
            reply = answer.result(timeout=120)
            assert len(reply.candidates) == 3
        except grpc.RpcError as err:
            # Past the server's call deadline a forecast is DEADLINE_EXCEEDED; never cut.
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (err.code(), err.details())
        assert process.wait_exit(DRAIN_EXIT_BOUND_S) == 0
    finally:
        process.close()
