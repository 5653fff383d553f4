"""ditto serve's HTTP side tried as a hostile client would (issue 22, section 2): slow
clients (headers or body trickled, connections hoarded), huge values echoed in errors,
absurd in-flight token counts, and calibration files with absurd values. Each limit is set
small by its flag so the test runs in seconds; docs/operations.md lists the defaults.
"""

import json
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.request

import grpc
import pytest
import requests

from conftest import BINARY, Server, free_port
from test_tls import pki  # noqa: F401 - the fixture

TIMEOUT = 30
HEADER_TIMEOUT_MS = 1000
BODY_TIMEOUT_MS = 1000
MAX_CONNECTIONS = 8
MAX_BODY = 1024 * 1024

ENTRY = {
    "kv_cache_percentage": 0.3,
    "input_token_length": 800,
    "num_request_waiting": 2,
    "num_request_running": 10,
    "num_tokens_generated": 0,
    "prefix_cache_score": 0.5,
}


def start(*args):
    server = Server(extra_args=args)
    server.wait_serving()
    server.url = f"http://127.0.0.1:{server.http_port}"
    return server


def stop(server):
    output = server.output()
    code = server.terminate()
    os.unlink(server.log.name)
    assert code == 0, f"ditto serve exited {code}:\n{output}"


@pytest.fixture
def limited():
    server = start(
        "--http-header-read-timeout-ms", str(HEADER_TIMEOUT_MS),
        "--http-body-read-timeout-ms", str(BODY_TIMEOUT_MS),
        "--http-max-connections", str(MAX_CONNECTIONS),
        "--http-max-body-bytes", str(MAX_BODY),
    )
    try:
        yield server
    finally:
        stop(server)


def connect(server):
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=TIMEOUT)
    return sock


def read_until_closed(sock, bound_s):
    """Everything the server sends until it closes the connection, or None if it is still
    open after bound_s."""
    sock.settimeout(bound_s)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except socket.timeout:
        return None
    except ConnectionResetError:
        return data


def test_a_client_that_never_finishes_its_headers_is_disconnected(limited):
    sock = connect(limited)
    sock.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    # Closed once the header timeout passes (the bound is generous: a loaded CI machine).
    assert read_until_closed(sock, 15) is not None, "still open long after the header read timeout"
    sock.close()
    assert requests.get(limited.url + "/healthz", timeout=TIMEOUT).status_code == 200


def test_a_body_announced_larger_than_the_limit_is_refused_at_once(limited):
    sock = connect(limited)
    sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 10000000000\r\n\r\n{")
    answer = read_until_closed(sock, 15)
    assert answer is not None and answer.startswith(b"HTTP/1.1 413"), answer
    assert b"detail" in answer
    sock.close()
    # A body over the limit without a Content-Length (chunked) is cut off too.
    def chunks():
        for _ in range(MAX_BODY // 65536 + 2):
            yield b" " * 65536
    response = requests.post(limited.url + "/predict", data=chunks(),
                             headers={"content-type": "application/json"}, timeout=TIMEOUT)
    assert response.status_code == 413, response.text


def test_a_body_that_stops_arriving_gets_408(limited):
    sock = connect(limited)
    sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{")
    answer = read_until_closed(sock, 15)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
    sock.close()


def test_connections_beyond_the_cap_are_refused_and_served_again_once_freed(limited):
    hoarded = []
    try:
        for _ in range(MAX_CONNECTIONS):
            sock = connect(limited)
            sock.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")
            hoarded.append(sock)
        time.sleep(0.3)
        refused = False
        for _ in range(20):
            try:
                response = requests.get(limited.url + "/healthz", timeout=5)
            except requests.ConnectionError:
                refused = True
                break
            time.sleep(0.05)
        assert refused, "a connection beyond --http-max-connections was served"
    finally:
        for sock in hoarded:
            sock.close()
    deadline = time.monotonic() + 15
    while True:
        try:
            if requests.get(limited.url + "/healthz", timeout=5).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, "the freed connections were not reused"
        time.sleep(0.1)
    text = requests.get(limited.url + "/metrics", timeout=TIMEOUT).text
    assert "ditto_http_connections_refused_total" in text


def test_a_huge_invalid_value_is_not_echoed_back(limited):
    huge = "x" * (MAX_BODY - 1000)
    response = requests.post(limited.url + "/predict", json=dict(ENTRY, kv_cache_percentage=huge), timeout=TIMEOUT)
    assert response.status_code == 422
    assert len(response.content) < 4096, len(response.content)
    detail = response.json()["detail"]
    assert detail[0]["loc"] == ["body", "kv_cache_percentage"] and detail[0]["type"] == "float_type"
    assert isinstance(detail[0]["input"], str) and len(detail[0]["input"]) < 512
    # A missing field echoes the whole object in FastAPI: bounded too.
    body = {k: v for k, v in ENTRY.items() if k != "prefix_cache_score"}
    body["padding"] = huge
    response = requests.post(limited.url + "/predict", json=body, timeout=TIMEOUT)
    assert response.status_code == 422
    assert len(response.content) < 4096, len(response.content)


@pytest.mark.parametrize("field, value", [
    ("prefill_tokens_in_flight", 10**18),
    ("decode_tokens_in_flight", 2**63),
    ("encoder_input_size", 2**40),
])
def test_in_flight_token_counts_are_bounded(limited, field, value):
    response = requests.post(limited.url + "/predict", json=dict(ENTRY, **{field: value}), timeout=TIMEOUT)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail[0]["loc"] == ["body", field] and detail[0]["type"] == "less_than_equal", detail
    assert detail[0]["ctx"]["le"] == 4294967295


def test_grpc_training_samples_bound_tokens_in_flight_too(limited):
    from ditto.v1 import twin_pb2 as pb

    sample = pb.TrainingSample(**ENTRY, prefill_tokens_in_flight=10**18, actual_ttft_ms=100.0, actual_tpot_ms=10.0)
    with pytest.raises(grpc.RpcError) as caught:
        limited.twin.AddTrainingSamples(pb.AddTrainingSamplesRequest(samples=[sample]), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("samples[0].prefill_tokens_in_flight"), caught.value.details()


def calibration_file(ttft=None, tpot=None):
    phase = {"overhead_ms": 0.0, "scale": 1.0, "samples": 10}
    content = {"version": 1, "ttft": dict(phase, **(ttft or {})), "tpot": dict(phase, **(tpot or {}))}
    handle = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    with handle:
        json.dump(content, handle)
    return handle.name


@pytest.mark.parametrize("ttft, tpot, field", [
    ({"scale": 1e308}, None, "ttft.scale"),
    ({"overhead_ms": -1e300}, None, "ttft.overhead_ms"),
    (None, {"scale": -5.0}, "tpot.scale"),
    (None, {"scale": 0.0}, "tpot.scale"),
])
def test_a_calibration_file_with_absurd_values_is_refused_naming_the_field(ttft, tpot, field):
    path = calibration_file(ttft, tpot)
    server = Server(extra_args=("--calibration-file", path))
    try:
        try:
            code = server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=30)
            raise AssertionError(f"ditto serve started on {field} out of range:\n{server.output()}")
        output = server.output()
        assert code == 2, (code, output)
        assert path in output and field in output, output
    finally:
        server.channel.close()
        os.unlink(server.log.name)
        os.unlink(path)


def test_a_calibration_file_in_range_loads():
    path = calibration_file({"scale": 1.3, "overhead_ms": 12.0}, {"scale": 0.9, "overhead_ms": -0.5})
    server = start("--calibration-file", path)
    try:
        calibration = requests.get(server.url + "/data/status", timeout=TIMEOUT).json()["calibration"]
        assert calibration["ttft"]["scale"] == 1.3 and calibration["tpot"]["overhead_ms"] == -0.5
    finally:
        stop(server)
        os.unlink(path)


# --- the metrics listener (--metrics-addr): probes and Prometheus apart from the API ---------

HELD = 1100
PROBE_BOUND_S = 0.1


def probe_ms(port, path="/healthz"):
    """Milliseconds for a new connection's GET `path` to be answered (status, ms)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = read_until_closed(sock, 5)
    elapsed = (time.monotonic() - started) * 1000
    status = int(data.split(b" ", 2)[1]) if data and data.startswith(b"HTTP/1.1 ") else None
    return status, elapsed


def wait_for_open_metrics_connections(server, count):
    """Until the API listener's /metrics says the metrics listener holds `count` connections."""
    deadline = time.monotonic() + TIMEOUT
    text = ""
    while time.monotonic() < deadline:
        text = requests.get(server.url + "/metrics", timeout=TIMEOUT).text
        if f"ditto_metrics_http_connections {count}" in text.splitlines():
            return
        time.sleep(0.02)
    raise AssertionError(f"the metrics listener never held {count} connections:\n{text}")


def bound_metrics_port(server):
    """The port ditto's --metrics-addr listener bound (asked for with port 0, so no other
    process can take it first), from its ready line."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        found = re.search(r"metrics on [0-9.]+:(\d+) \(ready\)", server.output())
        if found:
            return int(found.group(1))
        time.sleep(0.02)
    raise AssertionError(f"no metrics listener in the ready line:\n{server.output()}")


def test_probes_answer_on_the_metrics_listener_while_the_api_connection_cap_is_held():
    # Issue 38 D7: 1,100 connections held on the API port (cap 1024 by default) must not
    # starve /healthz, which the kubelet asks on the metrics listener.
    server = start("--metrics-addr", "127.0.0.1:0")
    metrics_port = bound_metrics_port(server)
    held = []
    try:
        for _ in range(HELD):
            sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=TIMEOUT)
            sock.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")
            held.append(sock)
        deadline = time.monotonic() + 10
        while True:
            text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
            if "ditto_http_connections 1024" in text:
                break
            assert time.monotonic() < deadline, "the API's connection cap was not reached"
            time.sleep(0.05)
        # The API port is full: a new connection there is closed unanswered.
        status, _ = probe_ms(server.http_port)
        assert status is None, "the API listener served a connection beyond its cap"
        timings = []
        for _ in range(5):
            status, elapsed = probe_ms(metrics_port)
            assert status == 200
            timings.append(elapsed)
        assert max(timings) < PROBE_BOUND_S * 1000, timings
        assert probe_ms(metrics_port, "/readyz")[0] == 200
    finally:
        for sock in held:
            sock.close()
        stop(server)


def test_the_metrics_listener_serves_only_probes_and_metrics_under_its_own_cap():
    server = start("--metrics-addr", "127.0.0.1:0", "--metrics-max-connections", "2")
    metrics_port = bound_metrics_port(server)
    base = f"http://127.0.0.1:{metrics_port}"
    try:
        # One request at a time, each waiting for the last to be counted closed (cap 2).
        assert requests.get(base + "/healthz", timeout=TIMEOUT).json()["status"] == "ok"
        wait_for_open_metrics_connections(server, 0)
        assert requests.get(base + "/readyz", timeout=TIMEOUT).status_code == 200
        wait_for_open_metrics_connections(server, 0)
        assert "ditto_metrics_http_connections" in requests.get(base + "/metrics", timeout=TIMEOUT).text
        # The predictor API is not on it.
        for method, path in (("GET", "/status"), ("POST", "/predict"), ("POST", "/flush")):
            wait_for_open_metrics_connections(server, 0)
            assert requests.request(method, base + path, json=ENTRY, timeout=TIMEOUT).status_code == 404
        # Its own cap: two held connections fill it, the API listener is unaffected. The
        # requests above have closed their connections, but the server counts a close when it
        # reads it: wait for its gauge to say 0, then 2, so no earlier connection is counted.
        wait_for_open_metrics_connections(server, 0)
        held = [socket.create_connection(("127.0.0.1", metrics_port), timeout=TIMEOUT) for _ in range(2)]
        try:
            wait_for_open_metrics_connections(server, 2)
            assert probe_ms(metrics_port)[0] is None
            assert requests.get(server.url + "/healthz", timeout=TIMEOUT).status_code == 200
        finally:
            for sock in held:
                sock.close()
        text = requests.get(server.url + "/metrics", timeout=TIMEOUT).text
        assert "ditto_metrics_http_connections_refused_total 1" in text, text
    finally:
        stop(server)


@pytest.mark.parametrize("flags,named", [
    (["--metrics-addr", "127.0.0.1:{http}"], "--metrics-addr"),
    (["--metrics-addr", "127.0.0.1:1", "--metrics-max-connections", "0"], "--metrics-max-connections"),
])
def test_bad_metrics_listener_flags_exit_2_naming_the_flag(flags, named):
    http = free_port()
    args = [a.format(http=http) for a in flags]
    result = subprocess.run([BINARY, "serve", "--http-addr", f"127.0.0.1:{http}", *args],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr, result.stderr
    # --check-config validates the same flags (the deploy manifests' contract).
    config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    config.write("pools:\n  - {name: vllm, replicas: 1}\n")
    config.close()
    try:
        good = subprocess.run([BINARY, "serve", "--check-config", config.name, "--metrics-addr=0.0.0.0:9012",
                               "--http-addr=127.0.0.1:9011"], capture_output=True, text=True, timeout=TIMEOUT)
        assert good.returncode == 0, good.stderr
    finally:
        os.unlink(config.name)


def test_the_metrics_listener_speaks_tls_when_the_server_does(pki):
    import ssl

    import grpc as grpc_module
    from test_tls import secure

    env = dict(os.environ, DITTO_TLS_CERT_FILE=pki["tls.crt"], DITTO_TLS_KEY_FILE=pki["tls.key"])
    server = Server(extra_args=["--metrics-addr", "127.0.0.1:0"], env=env)
    try:
        secure(server, grpc_module.ssl_channel_credentials(root_certificates=pki["ca_pem"]))
        server.wait_serving()
        metrics_port = bound_metrics_port(server)
        context = ssl.create_default_context(cafile=pki["ca.crt"])
        with urllib.request.urlopen(f"https://127.0.0.1:{metrics_port}/healthz", timeout=10, context=context) as reply:
            assert reply.status == 200 and json.loads(reply.read())["status"] == "ok"
        # Plain HTTP on it gets no HTTP answer.
        assert probe_ms(metrics_port)[0] is None
    finally:
        code = server.terminate()
        output = server.output()
        os.unlink(server.log.name)
        assert code == 0, output
