"""Fixtures for the independent Python client of ditto's Twin API.

A test gets a real `ditto serve` process (the binary built by `cargo test`, path in
DITTO_BIN) on free local ports, with the embedded default cluster synced at startup. Stubs
are generated from proto/ by .ci/run into DITTO_STUBS. Readiness is polled with a bounded
loop; at teardown the server gets SIGTERM and must exit 0 within a bound.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import grpc
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUBS = os.environ.get("DITTO_STUBS", os.path.join(ROOT, "target", "python-stubs"))
sys.path.insert(0, STUBS)

from ditto.v1 import twin_pb2, twin_pb2_grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

BINARY = os.environ.get("DITTO_BIN", os.path.join(ROOT, "target", "debug", "ditto"))
STARTUP_BOUND_S = 60.0
EXIT_BOUND_S = 30.0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A running `ditto serve` and channels to it."""

    def __init__(self, extra_args=(), env=None):
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="ditto-serve-", suffix=".log", delete=False)
        args = [
            BINARY,
            "serve",
            "--grpc-addr",
            f"127.0.0.1:{self.grpc_port}",
            "--http-addr",
            f"127.0.0.1:{self.http_port}",
            "--drain-ms",
            "2000",
            *extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        # Short reconnect backoff: the first attempts may come before the server listens.
        options = [
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 200),
        ]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}", options=options)
        self.twin = twin_pb2_grpc.TwinStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def wait_serving(self):
        deadline = time.monotonic() + STARTUP_BOUND_S
        last = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"ditto serve exited early ({self.process.returncode}):\n{self.output()}")
            try:
                reply = self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = reply.status
            except grpc.RpcError as err:
                last = err.code()
                # Not listening yet: block until the channel connects or a short bound passes.
                try:
                    grpc.channel_ready_future(self.channel).result(timeout=1.0)
                except grpc.FutureTimeoutError:
                    pass
        raise AssertionError(f"not SERVING within {STARTUP_BOUND_S} s (last: {last}):\n{self.output()}")

    def http(self, path):
        url = f"http://127.0.0.1:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def output(self):
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def terminate(self):
        """SIGTERM, then the process must exit 0 within the bound."""
        self.channel.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=EXIT_BOUND_S)
            raise AssertionError(f"ditto serve did not exit within {EXIT_BOUND_S} s of SIGTERM")
        return code


@pytest.fixture
def server():
    if not os.path.exists(BINARY):
        raise AssertionError(f"{BINARY} is missing: run `cargo test` (or `cargo build`) first")
    instance = Server()
    try:
        instance.wait_serving()
        yield instance
    finally:
        code = instance.terminate()
        output = instance.output()
        os.unlink(instance.log.name)
        assert code == 0, f"ditto serve exited {code} after SIGTERM:\n{output}"


@pytest.fixture
def pb():
    return twin_pb2


def poll_grpc_until(what, call, predicate, bound, interval):
    """Polls `call` every `interval` s until `predicate` holds of its answer, retrying
    UNAVAILABLE (a scaler before its first load sample); fails after `bound` s naming `what`
    and the last answer or error."""
    deadline = time.monotonic() + bound
    last = None
    while time.monotonic() < deadline:
        try:
            last = call()
            if predicate(last):
                return last
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            last = err
        time.sleep(interval)
    raise AssertionError(f"{what} not within {bound} s (last: {last})")

