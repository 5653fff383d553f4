"""Bearer-token authentication of the real `ditto serve` binary, with an independent client
(grpcio, urllib).

With a token (from DITTO_AUTH_TOKEN_FILE or DITTO_AUTH_TOKEN), every write without it or with
a wrong one is UNAUTHENTICATED and changes nothing; the right token is accepted; reads need
it only with --auth-reads (then /metrics answers 401 without it); health and the HTTP probes
never need it. The token never shows in the process's command line or its log.
"""

import os
import secrets
import tempfile
import urllib.error
import urllib.request

import grpc
import pytest

from conftest import BINARY, Server
from ditto.v1 import twin_pb2 as pb

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
