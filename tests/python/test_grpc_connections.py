"""The plaintext gRPC listener bounded like the others (issue 38 D6): 4,200 idle plaintext
connections used to stay open for ever (~30 KB each) until the process ran out of file
descriptors and new clients and /healthz timed out. Now a connection that sends nothing
within --grpc-first-byte-timeout-ms is closed, and beyond --grpc-max-connections one is
closed on arrival; real clients are served throughout.
"""

import os
import socket
import time

from grpc_health.v1 import health_pb2

from conftest import Server

TIMEOUT = 10


def closed_within(sock, bound_s):
    """True if the server closes `sock` within `bound_s` (EOF or reset)."""
    sock.settimeout(bound_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def metric(server, name):
    _, text = server.http("/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_silent_and_surplus_plaintext_connections_are_closed():
    server = Server(extra_args=("--grpc-max-connections", "40", "--grpc-first-byte-timeout-ms", "1000"))
    server.wait_serving()
    idle = []
    try:
        idle = [socket.create_connection(("127.0.0.1", server.grpc_port), timeout=TIMEOUT) for _ in range(60)]
        time.sleep(0.3)
        # The last 20 found every slot taken (the health check's channel may hold one more).
        refused = sum(closed_within(sock, 0.2) for sock in idle[40:])
        assert refused >= 19, refused
        assert metric(server, "ditto_grpc_connections_refused_total") >= 19
        # The silent 40 are closed once their second passes.
        assert all(closed_within(sock, 5) for sock in idle[:40])
        assert metric(server, "ditto_grpc_connections_silent_total") >= 39
        # A real client is served afterwards, and its connection is counted open.
        reply = server.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert metric(server, "ditto_grpc_connections") >= 1
        status, _ = server.http("/healthz")
        assert status == 200
    finally:
        for sock in idle:
            sock.close()
        output = server.output()
        code = server.terminate()
        os.unlink(server.log.name)
        assert code == 0, f"ditto serve exited {code}:\n{output}"
