"""Bearer-token authentication of the real `ditto serve` binary, with an independent client
(grpcio, urllib).

With a token (from DITTO_AUTH_TOKEN_FILE or DITTO_AUTH_TOKEN), every write without it or with
a wrong one is UNAUTHENTICATED and changes nothing; the right token is accepted; reads need
it only with --auth-reads (then /metrics answers 401 without it); health and the HTTP probes
never need it. The token never shows in the process's command line or its log.

Without a token, writes (gRPC and the predictor API's) are accepted only from loopback peers:
from another host they get PERMISSION_DENIED / 403 naming the ways out, unless
--allow-remote-writes (DITTO_ALLOW_REMOTE_WRITES) opts in.
"""

import json
import os
import secrets
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request

import grpc
import pytest

from conftest import BINARY, Server, free_port
from ditto.v1 import twin_pb2 as pb
from ditto.v1 import twin_pb2_grpc
from grpc_health.v1 import health_pb2_grpc

A = "ns/vllm-0:8000"


def config(n_blocks):
    return pb.ClusterConfig(
        instances=[
            pb.InstanceSpec(
                id=A,
                address="10.0.0.1:8000",
                engine=pb.EngineLimits(num_gpu_blocks=n_blocks, max_num_seqs=4, max_model_len=4096),
            )
        ]
    )


def state_update():
    return pb.InstanceStateUpdate(
        instance_id="default/vllm-0:8000",
        observed_at_us=1_000_000,
        requests=pb.RequestLists(
            waiting=[pb.RequestState(request_id="r", arrival_us=900_000, prompt_tokens=10, max_tokens=10)]
        ),
    )


def snapshot_request():
    return pb.GetSnapshotRequest(now_us=2_000_000)


def http_get(server, path, token=None):
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def start(env_extra, extra_args=()):
    env = dict(os.environ)
    env.pop("DITTO_AUTH_TOKEN", None)
    env.pop("DITTO_AUTH_TOKEN_FILE", None)
    env.update(env_extra)
    server = Server(extra_args=extra_args, env=env)
    server.wait_serving()
    return server


def stop(server):
    code = server.terminate()
    output = server.output()
    os.unlink(server.log.name)
    assert code == 0, output
    return output


def expect_unauthenticated(call):
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, caught.value.details()


@pytest.fixture
def token_file():
    token = secrets.token_urlsafe(32)
    with tempfile.NamedTemporaryFile("w", suffix=".token", delete=False) as handle:
        handle.write(token + "\n")
    yield token, handle.name
    os.unlink(handle.name)


def test_writes_need_the_token_reads_do_not(token_file):
    token, path = token_file
    server = start({"DITTO_AUTH_TOKEN_FILE": path})
    try:
        before = server.twin.GetSnapshot(snapshot_request(), timeout=10)
        good = [("authorization", f"Bearer {token}")]
        bad = [("authorization", f"Bearer {token[:-1]}x")]
        for metadata in (None, bad, [("authorization", token)]):
            expect_unauthenticated(lambda: server.twin.SyncClusterConfig(config(64), metadata=metadata, timeout=10))
            expect_unauthenticated(
                lambda: server.twin.PushInstanceState(iter([state_update()]), metadata=metadata, timeout=10)
            )
            expect_unauthenticated(lambda: server.twin.PushKvEvents(iter([]), metadata=metadata, timeout=10))
        after = server.twin.GetSnapshot(snapshot_request(), timeout=10)
        assert after == before, "a refused write changed the mirror"
        # Reads are open by default.
        status, text = http_get(server, "/metrics")
        assert status == 200
        assert 'ditto_auth_rejections_total{method="SyncClusterConfig"} 3' in text, text
        assert 'ditto_auth_rejections_total{method="PushInstanceState"} 3' in text
        # The right token writes.
        ack = server.twin.SyncClusterConfig(config(64), metadata=good, timeout=10)
        assert ack.changed
        ack = server.twin.PushInstanceState(iter([]), metadata=good, timeout=10)
        assert ack.accepted == 0
        with open(f"/proc/{server.process.pid}/cmdline", "rb") as handle:
            assert token.encode() not in handle.read()
    finally:
        output = stop(server)
    assert token not in output, "the token was logged"


def test_reads_need_the_token_when_asked(token_file):
    token, _ = token_file
    server = start({"DITTO_AUTH_TOKEN": token}, extra_args=["--auth-reads"])
    try:
        good = [("authorization", f"Bearer {token}")]
        expect_unauthenticated(lambda: server.twin.GetSnapshot(snapshot_request(), timeout=10))
        expect_unauthenticated(
            lambda: server.twin.PredictRouting(
                pb.PredictRoutingRequest(request=pb.CandidateRequest(prompt_tokens=100, output_tokens=10)),
                timeout=10,
            )
        )
        assert server.twin.GetSnapshot(snapshot_request(), metadata=good, timeout=10).generation >= 1
        status, _ = http_get(server, "/metrics")
        assert status == 401
        status, _ = http_get(server, "/metrics", token="wrong-wrong-wrong-wrong")
        assert status == 401
        status, text = http_get(server, "/metrics", token=token)
        assert status == 200 and "ditto_auth_rejections_total" in text
        assert http_get(server, "/healthz")[0] == 200
        assert http_get(server, "/readyz")[0] == 200
    finally:
        output = stop(server)
    assert token not in output


def test_the_predict_command_sends_the_token_from_a_file_or_the_environment(token_file):
    import subprocess

    token, path = token_file
    server = start({"DITTO_AUTH_TOKEN": token}, extra_args=["--auth-reads"])
    try:
        base = [BINARY, "predict", "--addr", f"127.0.0.1:{server.grpc_port}", "--timeout-ms", "60000",
                "--output-tokens", "16", "--replications", "1"]
        env = dict(os.environ)
        env.pop("DITTO_AUTH_TOKEN", None)
        env.pop("DITTO_AUTH_TOKEN_FILE", None)

        def predict(extra_env):
            run_env = dict(env)
            run_env.update(extra_env)
            return subprocess.run(base, env=run_env, capture_output=True, text=True, timeout=120)

        without = predict({})
        assert without.returncode == 1 and "Unauthenticated" in without.stderr, without.stderr
        from_file = predict({"DITTO_AUTH_TOKEN_FILE": path})
        assert from_file.returncode == 0, from_file.stderr
        assert "recommended:" in from_file.stdout
        from_env = predict({"DITTO_AUTH_TOKEN": token})
        assert from_env.returncode == 0, from_env.stderr
        wrong = predict({"DITTO_AUTH_TOKEN": "wrong-wrong-wrong-wrong"})
        assert wrong.returncode == 1 and "Unauthenticated" in wrong.stderr, wrong.stderr
        both = predict({"DITTO_AUTH_TOKEN": token, "DITTO_AUTH_TOKEN_FILE": path})
        assert both.returncode == 2, both.stderr
    finally:
        output = stop(server)
    assert token not in output


def test_a_bad_token_source_is_refused_before_binding(token_file):
    token, path = token_file
    import subprocess

    env = dict(os.environ)
    env.update({"DITTO_AUTH_TOKEN_FILE": path, "DITTO_AUTH_TOKEN": token})
    result = subprocess.run(
        [BINARY, "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "not both" in result.stderr
    assert token not in result.stderr
    env = dict(os.environ)
    env.pop("DITTO_AUTH_TOKEN_FILE", None)
    env["DITTO_AUTH_TOKEN"] = "short"
    result = subprocess.run(
        [BINARY, "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "DITTO_AUTH_TOKEN" in result.stderr


def http_post(server, path, body, token=None):
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}{path}",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_the_latency_predictor_api_writes_need_the_token(token_file):
    # The predictor API's training side changes the calibration: a write like a push.
    token, path = token_file
    server = start({"DITTO_AUTH_TOKEN_FILE": path})
    try:
        calibration_before = http_get(server, "/data/status")[1]
        sample = (
            '{"entries": [{"kv_cache_percentage": 0.1, "input_token_length": 200,'
            ' "num_request_waiting": 0, "num_request_running": 1, "num_tokens_generated": 0,'
            ' "prefix_cache_score": 0.0, "actual_ttft_ms": 50.0, "actual_tpot_ms": 0.0}]}'
        )
        for write, body in (("/add_training_data_bulk", sample), ("/flush", "{}"), ("/reload", "{}")):
            status, _ = http_post(server, write, body)
            assert status == 401, write
            status, _ = http_post(server, write, body, token="wrong-wrong-wrong-wrong")
            assert status == 401, write
        assert http_get(server, "/data/status")[1] == calibration_before, "a refused write changed it"
        assert http_post(server, "/add_training_data_bulk", sample, token=token)[0] == 202
        assert http_get(server, "/data/status")[1] != calibration_before
        # Predictions are reads: open by default.
        entry = (
            '{"kv_cache_percentage": 0.1, "input_token_length": 200, "num_request_waiting": 0,'
            ' "num_request_running": 1, "num_tokens_generated": 0, "prefix_cache_score": 0.0}'
        )
        assert http_post(server, "/predict", entry)[0] == 200
        _, metrics = http_get(server, "/metrics")
        assert 'ditto_auth_rejections_total{method="/flush"} 2' in metrics, metrics
    finally:
        stop(server)


# --- writes without a token: loopback only, unless --allow-remote-writes ---------------------

SAMPLE = (
    '{"entries": [{"kv_cache_percentage": 0.1, "input_token_length": 200,'
    ' "num_request_waiting": 0, "num_request_running": 1, "num_tokens_generated": 0,'
    ' "prefix_cache_score": 0.0, "actual_ttft_ms": 50.0, "actual_tpot_ms": 0.0}]}'
)
ENTRY = (
    '{"kv_cache_percentage": 0.1, "input_token_length": 200, "num_request_waiting": 0,'
    ' "num_request_running": 1, "num_tokens_generated": 0, "prefix_cache_score": 0.0}'
)


def own_address():
    """This host's address on its first non-loopback interface (connecting to it from here
    makes the server see a peer that is not loopback), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


class OpenServer(Server):
    """`ditto serve` listening on every interface, as in a pod (the fixture's binds loopback)."""

    def __init__(self, extra_args=(), env=None):
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="ditto-serve-", suffix=".log", delete=False)
        args = [BINARY, "serve", "--grpc-addr", f"0.0.0.0:{self.grpc_port}",
                "--http-addr", f"0.0.0.0:{self.http_port}", "--drain-ms", "2000", *extra_args]
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.twin = twin_pb2_grpc.TwinStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)


def start_open(env_extra=None, extra_args=()):
    env = dict(os.environ)
    env.pop("DITTO_AUTH_TOKEN", None)
    env.pop("DITTO_AUTH_TOKEN_FILE", None)
    env.pop("DITTO_ALLOW_REMOTE_WRITES", None)
    env.update(env_extra or {})
    server = OpenServer(extra_args=extra_args, env=env)
    server.wait_serving()
    return server


def post_from(host, server, path, body, token=None):
    request = urllib.request.Request(f"http://{host}:{server.http_port}{path}", data=body.encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def remote():
    address = own_address()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address to connect from")
    return address


def test_without_a_token_writes_from_other_hosts_are_refused_and_loopback_ones_accepted(remote):
    server = start_open()
    try:
        before = http_get(server, "/data/status")[1]
        for path, body in (("/add_training_data_bulk", SAMPLE), ("/flush", "{}"), ("/reload", "{}")):
            status, text = post_from(remote, server, path, body)
            assert status == 403, (path, status, text)
            assert "--allow-remote-writes" in json.loads(text)["detail"] and "DITTO_AUTH_TOKEN" in text
        assert http_get(server, "/data/status")[1] == before, "a refused write changed the calibration"
        # Reads stay open from anywhere; writes from loopback go through.
        assert post_from(remote, server, "/predict", ENTRY)[0] == 200
        assert post_from("127.0.0.1", server, "/add_training_data_bulk", SAMPLE)[0] == 202
        # gRPC writes likewise: PERMISSION_DENIED from another host, accepted from loopback.
        with grpc.insecure_channel(f"{remote}:{server.grpc_port}") as channel:
            twin = twin_pb2_grpc.TwinStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                twin.SyncClusterConfig(config(64), timeout=10)
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "--allow-remote-writes" in caught.value.details()
            twin.GetSnapshot(snapshot_request(), timeout=10)
        server.twin.SyncClusterConfig(config(64), timeout=10)
        _, metrics = http_get(server, "/metrics")
        assert 'ditto_auth_rejections_total{method="/flush"} 1' in metrics
        assert 'ditto_auth_rejections_total{method="SyncClusterConfig"} 1' in metrics
    finally:
        stop(server)


def test_remote_writes_are_an_explicit_opt_in(remote):
    server = start_open({"DITTO_ALLOW_REMOTE_WRITES": "true"})
    try:
        assert post_from(remote, server, "/add_training_data_bulk", SAMPLE)[0] == 202
        with grpc.insecure_channel(f"{remote}:{server.grpc_port}") as channel:
            twin_pb2_grpc.TwinStub(channel).SyncClusterConfig(config(64), timeout=10)
    finally:
        stop(server)


def test_with_a_token_the_token_decides_from_any_host(remote, token_file):
    token, path = token_file
    server = start_open({"DITTO_AUTH_TOKEN_FILE": path})
    try:
        assert post_from(remote, server, "/add_training_data_bulk", SAMPLE)[0] == 401
        assert post_from("127.0.0.1", server, "/add_training_data_bulk", SAMPLE)[0] == 401
        assert post_from(remote, server, "/add_training_data_bulk", SAMPLE, token=token)[0] == 202
    finally:
        stop(server)
