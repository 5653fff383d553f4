"""ditto as llm-d's latency predictor, driven over HTTP with an ordinary client (requests),
with the request shapes the router's latencypredictorclient sends.

Covers every endpoint of the prediction and training servers' API, the response schema
field by field, FastAPI-style validation errors for bad input (the server keeps serving),
413 over the bulk entry limit, and the online calibration: actuals produced by a ditto
configured 1.3x slower bring the prediction error under 5 %, while bad samples are rejected
and counted, never absorbed, and the calibration survives a restart through its file.
"""

import datetime
import json
import os
import random
import re
import tempfile

import pytest
import requests

from conftest import Server

MAX_BULK = 50
TIMEOUT = 30

ENTRY = {
    "kv_cache_percentage": 0.3,
    "input_token_length": 800,
    "num_request_waiting": 2,
    "num_request_running": 10,
    "num_tokens_generated": 0,
    "prefix_cache_score": 0.5,
    "pod_type": "",
    "prefill_tokens_in_flight": 1600,
    "decode_tokens_in_flight": 4000,
}

PREDICTION_FIELDS = {
    "ttft_ms": float,
    "tpot_ms": float,
    "ttft_uncertainty": float,
    "tpot_uncertainty": float,
    "ttft_prediction_bounds": list,
    "tpot_prediction_bounds": list,
    "predicted_at": str,
    "model_type": str,
    "objective_type": str,
    "quantile": float,
    "last_model_load": str,
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
def predictor():
    server = start("--predictor-max-bulk", str(MAX_BULK), "--latency-objective-type", "mean")
    try:
        yield server
    finally:
        stop(server)


def post(server, path, body=None, raw=None):
    if raw is not None:
        return requests.post(server.url + path, data=raw, headers={"content-type": "application/json"}, timeout=TIMEOUT)
    return requests.post(server.url + path, json=body, timeout=TIMEOUT)


def get(server, path):
    return requests.get(server.url + path, timeout=TIMEOUT)


def check_prediction(prediction, objective="mean"):
    for field, kind in PREDICTION_FIELDS.items():
        assert field in prediction, f"missing {field} in {prediction}"
        value = prediction[field]
        if kind is float:
            assert isinstance(value, (int, float)) and not isinstance(value, bool), (field, value)
        else:
            assert isinstance(value, kind), (field, value)
    assert prediction["ttft_ms"] > 0 and prediction["tpot_ms"] > 0
    assert prediction["ttft_uncertainty"] >= 0 and prediction["tpot_uncertainty"] >= 0
    for phase in ("ttft", "tpot"):
        low, high = prediction[f"{phase}_prediction_bounds"]
        value = prediction[f"{phase}_ms"]
        assert low <= high
        assert low - 1e-6 <= value <= high + 1e-6 or objective == "mean", (phase, prediction)
    assert prediction["model_type"] == "ditto-simulation"
    assert prediction["objective_type"] == objective
    assert 0 < prediction["quantile"] < 1
    for stamp in ("predicted_at", "last_model_load"):
        parsed = datetime.datetime.fromisoformat(prediction[stamp])
        assert parsed.tzinfo is not None


def check_detail(response, status):
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert "detail" in body, body
    return body["detail"]


def test_predict_answers_the_peer_schema(predictor):
    response = post(predictor, "/predict", ENTRY)
    assert response.status_code == 200, response.text
    check_prediction(response.json())
    # Only the required fields: the optional ones take the peer's defaults.
    required = {k: ENTRY[k] for k in list(ENTRY)[:6]}
    response = post(predictor, "/predict", required)
    assert response.status_code == 200, response.text
    check_prediction(response.json())


def test_predictions_follow_the_load(predictor):
    """Not a lookup table: more queued work means a later first token, a cached prefix an
    earlier one, a fuller batch a slower decode."""

    def ttft_tpot(**changes):
        response = post(predictor, "/predict", {**ENTRY, **changes})
        assert response.status_code == 200, response.text
        body = response.json()
        return body["ttft_ms"], body["tpot_ms"]

    idle_ttft, idle_tpot = ttft_tpot(num_request_waiting=0, num_request_running=0, kv_cache_percentage=0.0)
    queued_ttft, _ = ttft_tpot(num_request_waiting=20, prefill_tokens_in_flight=40000)
    cold_ttft, _ = ttft_tpot(prefix_cache_score=0.0, input_token_length=4000)
    warm_ttft, _ = ttft_tpot(prefix_cache_score=0.9, input_token_length=4000)
    _, busy_tpot = ttft_tpot(num_request_running=120, kv_cache_percentage=0.8, num_request_waiting=0)
    assert queued_ttft > idle_ttft
    assert warm_ttft < cold_ttft
    assert busy_tpot > idle_tpot


def test_bulk_strict_and_lenient(predictor):
    entries = [dict(ENTRY, num_request_waiting=w, prefill_tokens_in_flight=800 * w) for w in range(4)]
    response = post(predictor, "/predict/bulk/strict", {"requests": entries})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total_requests"] == 4
    assert body["successful_predictions"] == 4
    assert body["failed_predictions"] == 0
    assert body["processing_time_ms"] >= 0
    assert len(body["predictions"]) == 4
    for prediction in body["predictions"]:
        check_prediction(prediction)
    ttfts = [p["ttft_ms"] for p in body["predictions"]]
    assert ttfts == sorted(ttfts) and ttfts[0] < ttfts[-1], ttfts

    response = post(predictor, "/predict/bulk", {"requests": entries})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["errors"] == [] and body["failed_predictions"] == 0
    assert [p["ttft_ms"] for p in body["predictions"]] == ttfts

    # An entry that fails request validation fails both endpoints whole, as FastAPI
    # validates the body before the handler runs (the peer's client expects 422 on
    # /predict/bulk for a missing field); only errors met while predicting are per entry.
    bad = dict(ENTRY, kv_cache_percentage=1.5)
    missing = {k: v for k, v in ENTRY.items() if k != "prefix_cache_score"}
    for path in ("/predict/bulk", "/predict/bulk/strict"):
        detail = check_detail(post(predictor, path, {"requests": [entries[0], bad, entries[1]]}), 422)
        assert [e["loc"] for e in detail] == [["body", "requests", 1, "kv_cache_percentage"]]
        assert detail[0]["type"] == "less_than_equal"
        detail = check_detail(post(predictor, path, {"requests": [entries[0], missing]}), 422)
        assert [(e["type"], e["loc"]) for e in detail] == [("missing", ["body", "requests", 1, "prefix_cache_score"])]


@pytest.mark.parametrize(
    "path, body, raw, loc, kind",
    [
        ("/predict", {k: v for k, v in ENTRY.items() if k != "input_token_length"}, None,
         ["body", "input_token_length"], "missing"),
        ("/predict", dict(ENTRY, num_request_running="ten"), None, ["body", "num_request_running"], "int_type"),
        ("/predict", dict(ENTRY, kv_cache_percentage="high"), None, ["body", "kv_cache_percentage"], "float_type"),
        ("/predict", dict(ENTRY, input_token_length=-5), None, ["body", "input_token_length"], "greater_than_equal"),
        ("/predict", dict(ENTRY, kv_cache_percentage=1.5), None, ["body", "kv_cache_percentage"], "less_than_equal"),
        ("/predict", dict(ENTRY, input_token_length=10.5), None, ["body", "input_token_length"], "int_from_float"),
        ("/predict", dict(ENTRY, pod_type="gpu"), None, ["body", "pod_type"], "literal_error"),
        ("/predict", None, b"{not json", None, "json_invalid"),
        ("/predict", [ENTRY], None, ["body"], "model_attributes_type"),
        ("/predict/bulk/strict", {"requests": []}, None, ["body", "requests"], "too_short"),
        ("/predict/bulk", {"requests": []}, None, ["body", "requests"], "too_short"),
        ("/predict/bulk/strict", {"entries": [ENTRY]}, None, ["body", "requests"], "missing"),
        ("/predict/bulk/strict", {"requests": ENTRY}, None, ["body", "requests"], "list_type"),
        ("/add_training_data_bulk", {"entries": [ENTRY]}, None, ["body", "entries", 0, "actual_ttft_ms"], "missing"),
        ("/add_training_data_bulk", {"entries": []}, None, ["body", "entries"], "too_short"),
    ],
)
def test_bad_input_gets_a_fastapi_422_and_the_server_keeps_serving(predictor, path, body, raw, loc, kind):
    detail = check_detail(post(predictor, path, body, raw), 422)
    assert isinstance(detail, list) and detail, detail
    assert detail[0]["type"] == kind, detail
    assert isinstance(detail[0]["msg"], str) and detail[0]["msg"]
    if loc is not None:
        assert detail[0]["loc"] == loc, detail
    else:
        assert detail[0]["loc"][0] == "body"
    response = post(predictor, "/predict", ENTRY)
    assert response.status_code == 200, response.text


def test_a_prompt_the_pod_cannot_hold_is_a_422_not_a_crash(predictor):
    for path, body in (("/predict", dict(ENTRY, input_token_length=4_000_000_000)),
                       ("/predict/bulk/strict", {"requests": [ENTRY, dict(ENTRY, num_tokens_generated=4_000_000_000)]})):
        detail = check_detail(post(predictor, path, body), 422)
        assert detail[0]["type"] == "value_error" and detail[0]["loc"][-1] == "input_token_length", detail
    lenient = post(predictor, "/predict/bulk", {"requests": [ENTRY, dict(ENTRY, input_token_length=4_000_000_000)]})
    assert lenient.status_code == 200
    assert lenient.json()["failed_predictions"] == 1 and lenient.json()["errors"][0]["index"] == 1
    assert post(predictor, "/predict", ENTRY).status_code == 200


def test_bulk_over_the_entry_limit_is_413(predictor):
    for path, field in (("/predict/bulk/strict", "requests"), ("/predict/bulk", "requests"),
                        ("/add_training_data_bulk", "entries")):
        detail = check_detail(post(predictor, path, {field: [ENTRY] * (MAX_BULK + 1)}), 413)
        assert str(MAX_BULK) in detail
    response = post(predictor, "/predict/bulk/strict", {"requests": [ENTRY] * MAX_BULK})
    assert response.status_code == 200, response.text
    assert response.json()["total_requests"] == MAX_BULK
    # Identical entries get identical answers (simulated once).
    assert len({(p["ttft_ms"], p["tpot_ms"]) for p in response.json()["predictions"]}) == 1


def test_service_endpoints(predictor):
    status = get(predictor, "/status")
    assert status.status_code == 200
    body = status.json()
    assert body["is_ready"] is True
    assert body["model_type"] == "lightgbm" and body["engine"] == "ditto-simulation"
    assert body["objective_type"] == "mean"
    assert body["quantile"] == 0.9
    datetime.datetime.fromisoformat(body["last_model_load"])
    assert get(predictor, "/healthz").status_code == 200
    assert get(predictor, "/readyz").status_code == 200
    reload = post(predictor, "/reload")
    assert reload.status_code == 200 and reload.json()["is_ready"] is True
    info = get(predictor, "/model/download/info")
    assert info.status_code == 200
    assert info.json()["downloadable"] is False
    check_detail(get(predictor, "/model/ttft/xgb/json"), 404)
    data = get(predictor, "/data/status")
    assert data.status_code == 200
    assert data.json()["calibration"]["ttft"]["samples"] == 0
    flush = post(predictor, "/flush")
    assert flush.status_code == 200 and flush.json()["success"] is True


def test_quantile_objective_answers_the_configured_quantile():
    server = start("--latency-objective-type", "quantile", "--latency-quantile-alpha", "0.95")
    try:
        response = post(server, "/predict", dict(ENTRY, num_request_running=40, kv_cache_percentage=0.6))
        assert response.status_code == 200, response.text
        body = response.json()
        check_prediction(body, objective="quantile")
        assert body["quantile"] == 0.95
        # The 95th percentile is the upper bound itself.
        assert abs(body["tpot_ms"] - body["tpot_prediction_bounds"][1]) < 1e-9
    finally:
        stop(server)


# --- online calibration -------------------------------------------------------------------

BASE_ALPHA = [4000.0, 1.5, 150.0]
BASE_BETA = [7000.0, 0.06, 25.0]
SAMPLES = 120


def cluster_yaml(scale):
    alpha = ", ".join(str(a * scale) for a in BASE_ALPHA)
    beta = ", ".join(str(b * scale) for b in BASE_BETA)
    return f"""pools:
  - name: vllm
    replicas: 2
    model: llama-3.1-8b-instruct
    gpu: H100
    latency_model: blackbox
    coefficients: {{alpha: [{alpha}], beta: [{beta}]}}
"""


def entries(rng, count):
    out = []
    for _ in range(count):
        waiting = rng.choice([0, 0, 1, 2, 4, 8])
        running = rng.randint(0, 60)
        out.append({
            "kv_cache_percentage": round(rng.uniform(0.0, 0.7) if running else 0.0, 3),
            "input_token_length": rng.randint(50, 4000),
            "num_request_waiting": waiting,
            "num_request_running": running,
            "num_tokens_generated": 0,
            "prefix_cache_score": round(rng.uniform(0, 1), 2),
            "pod_type": "",
            "prefill_tokens_in_flight": waiting * rng.randint(100, 2000),
            "decode_tokens_in_flight": 0,
        })
    return out


def predict_all(server, batch):
    response = post(server, "/predict/bulk/strict", {"requests": batch})
    assert response.status_code == 200, response.text
    return response.json()["predictions"]


def mape(predicted, actual, field):
    errors = [abs(p[field] - a[field]) / a[field] for p, a in zip(predicted, actual)]
    return sum(errors) / len(errors)


def metric(server, name, labels):
    text = get(server, "/metrics").text
    pattern = re.escape(name) + r"\{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + r"\} (\S+)"
    match = re.search(pattern, text)
    assert match, f"{name}{labels} not on /metrics"
    return float(match.group(1))


def test_calibration_learns_a_slower_pool_rejects_bad_samples_and_persists():
    workdir = tempfile.mkdtemp(prefix="ditto-calibration-")
    paths = {}
    for name, scale in (("twin", 1.0), ("slow", 1.3)):
        paths[name] = os.path.join(workdir, f"{name}.yaml")
        with open(paths[name], "w", encoding="utf-8") as handle:
            handle.write(cluster_yaml(scale))
    state = os.path.join(workdir, "calibration.json")
    common = ("--latency-objective-type", "mean", "--predictor-replications", "4")
    slow = start("--config", paths["slow"], *common)
    twin = start("--config", paths["twin"], "--calibration-file", state, *common)
    rng = random.Random(13)
    train, held_out = entries(rng, SAMPLES), entries(rng, 40)
    try:
        truth = predict_all(slow, held_out)
        before = predict_all(twin, held_out)
        assert mape(before, truth, "ttft_ms") > 0.15, "the uncalibrated twin should be off by ~30 %"
        assert mape(before, truth, "tpot_ms") > 0.15

        # Bad samples first: rejected, counted, never absorbed.
        good_actual = predict_all(slow, train[:1])[0]
        bad_samples = [
            dict(train[0], actual_ttft_ms=-5.0, actual_tpot_ms=-1.0),
            dict(train[0], actual_ttft_ms=1e12, actual_tpot_ms=1e12),
        ]
        response = post(twin, "/add_training_data_bulk", {"entries": bad_samples})
        assert response.status_code == 202, response.text
        assert response.json()["samples_absorbed"] == 0
        assert response.json()["samples_rejected"] == 4
        nan_body = json.dumps({"entries": [dict(train[0], actual_ttft_ms=float("nan"),
                                                actual_tpot_ms=good_actual["tpot_ms"])]})
        check_detail(post(twin, "/add_training_data_bulk", raw=nan_body.encode()), 422)
        status = get(twin, "/data/status").json()["calibration"]
        assert status["ttft"]["samples"] == 0 and status["ttft"]["scale"] == 1.0
        assert metric(twin, "ditto_calibration_rejected_samples_total", {"phase": "ttft", "reason": "negative"}) == 1
        assert metric(twin, "ditto_calibration_rejected_samples_total", {"phase": "ttft", "reason": "absurd"}) == 1
        assert metric(twin, "ditto_calibration_rejected_samples_total", {"phase": "entry", "reason": "invalid"}) >= 1
        unchanged = predict_all(twin, held_out)
        assert [p["ttft_ms"] for p in unchanged] == [p["ttft_ms"] for p in before]
        assert [p["tpot_ms"] for p in unchanged] == [p["tpot_ms"] for p in before]

        # Then the actuals, in small batches as the router posts them.
        actual = predict_all(slow, train)
        for start_index in range(0, SAMPLES, 10):
            batch = [
                dict(entry, actual_ttft_ms=a["ttft_ms"], actual_tpot_ms=a["tpot_ms"])
                for entry, a in zip(train[start_index:start_index + 10], actual[start_index:start_index + 10])
            ]
            response = post(twin, "/add_training_data_bulk", {"entries": batch})
            assert response.status_code == 202, response.text
        after = predict_all(twin, held_out)
        ttft_error, tpot_error = mape(after, truth, "ttft_ms"), mape(after, truth, "tpot_ms")
        assert ttft_error < 0.05, f"TTFT error {ttft_error:.3f} after {SAMPLES} samples"
        assert tpot_error < 0.05, f"TPOT error {tpot_error:.3f} after {SAMPLES} samples"
        assert metric(twin, "ditto_calibration_samples", {"phase": "ttft"}) == SAMPLES
        scale = metric(twin, "ditto_calibration_coefficient", {"phase": "ttft", "term": "scale"})
        assert 1.1 < scale < 1.5, scale
        assert metric(twin, "ditto_calibration_rolling_ape", {"phase": "tpot"}) >= 0
    finally:
        stop(twin)

    # Restarted on the same file, the twin answers as calibrated.
    restarted = start("--config", paths["twin"], "--calibration-file", state, *common)
    try:
        again = predict_all(restarted, held_out)
        for a, b in zip(after, again):
            assert abs(a["ttft_ms"] - b["ttft_ms"]) < 1e-6 * a["ttft_ms"] + 1e-9
            assert abs(a["tpot_ms"] - b["tpot_ms"]) < 1e-6 * a["tpot_ms"] + 1e-9
        assert get(restarted, "/data/status").json()["calibration"]["ttft"]["samples"] == SAMPLES
        flushed = post(restarted, "/flush").json()
        assert flushed["ttft_training_samples_flushed"] == SAMPLES
        assert flushed["tpot_training_samples_flushed"] == SAMPLES
        assert mape(predict_all(restarted, held_out), truth, "ttft_ms") > 0.15
    finally:
        stop(restarted)
        stop(slow)


def test_a_router_that_does_not_stream_gets_calibrated_e2e_as_ttft():
    # llm-d's router with streamingMode: false records end-to-end latency as TTFT and trains
    # no TPOT (0). Method: actuals from a 1.3x slower ditto, "TTFT" = its TTFT + 255 x TPOT
    # (a 256-token answer, the predictor's assumed output length); the calibrated twin's
    # ttft_ms must track that E2E within 5 %, and say it switched.
    workdir = tempfile.mkdtemp(prefix="ditto-e2e-calibration-")
    paths = {}
    for name, scale in (("twin", 1.0), ("slow", 1.3)):
        paths[name] = os.path.join(workdir, f"{name}.yaml")
        with open(paths[name], "w", encoding="utf-8") as handle:
            handle.write(cluster_yaml(scale))
    common = ("--latency-objective-type", "mean", "--predictor-replications", "4")
    slow = start("--config", paths["slow"], *common)
    twin = start("--config", paths["twin"], *common)
    rng = random.Random(29)
    train, held_out = entries(rng, SAMPLES), entries(rng, 40)

    def e2e(predictions):
        return [{"ttft_ms": p["ttft_ms"] + 255 * p["tpot_ms"]} for p in predictions]

    try:
        truth = e2e(predict_all(slow, held_out))
        before = predict_all(twin, held_out)
        assert mape(before, truth, "ttft_ms") > 0.5, "uncalibrated TTFT is far from E2E"
        actual = e2e(predict_all(slow, train))
        for start_index in range(0, SAMPLES, 10):
            batch = [
                dict(entry, actual_ttft_ms=a["ttft_ms"], actual_tpot_ms=0.0)
                for entry, a in zip(train[start_index:start_index + 10], actual[start_index:start_index + 10])
            ]
            response = post(twin, "/add_training_data_bulk", {"entries": batch})
            assert response.status_code == 202, response.text
        status = get(twin, "/data/status").json()["calibration"]
        assert status["ttft_is_e2e"] is True
        assert status["ttft"]["samples"] == SAMPLES and status["tpot"]["samples"] == 0
        assert re.search(r"^ditto_calibration_ttft_is_e2e 1$", get(twin, "/metrics").text, re.M)
        after = predict_all(twin, held_out)
        error = mape(after, truth, "ttft_ms")
        assert error < 0.05, f"E2E-as-TTFT error {error:.3f} after {SAMPLES} samples"
        # A streaming router's samples switch it back (and the TTFT fit starts over).
        streamed = predict_all(slow, train[:10])
        batch = [dict(entry, actual_ttft_ms=a["ttft_ms"], actual_tpot_ms=a["tpot_ms"])
                 for entry, a in zip(train[:10], streamed)]
        assert post(twin, "/add_training_data_bulk", {"entries": batch}).status_code == 202
        status = get(twin, "/data/status").json()["calibration"]
        assert status["ttft_is_e2e"] is False and status["ttft"]["samples"] == 10
    finally:
        stop(twin)
        stop(slow)


def test_a_corrupt_calibration_file_is_refused_at_start():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        handle.write("{not a calibration")
    server = Server(extra_args=("--calibration-file", handle.name))
    try:
        code = server.process.wait(timeout=30)
        assert code == 2, code
        assert "--calibration-file" in server.output()
    finally:
        server.channel.close()
        os.unlink(server.log.name)
        os.unlink(handle.name)


def test_grpc_training_samples_calibrate_grpc_answers_too():
    """AddTrainingSamples is the gRPC twin of /add_training_data_bulk, and PredictRouting's
    TTFT/TPOT pass through the same calibration."""
    import grpc
    from ditto.v1 import twin_pb2 as pb

    server = start("--latency-objective-type", "mean", "--predictor-replications", "4")
    try:
        question = pb.PredictRoutingRequest(
            request=pb.CandidateRequest(prompt_tokens=2000, output_tokens=128), request_id="q")
        question.options.replications = 1
        before = server.twin.PredictRouting(question, timeout=60).candidates[0]

        batch = entries(random.Random(5), 40)
        simulated = predict_all(server, batch)
        samples = [
            pb.TrainingSample(**entry, actual_ttft_ms=300.0 + 1.2 * s["ttft_ms"], actual_tpot_ms=1.2 * s["tpot_ms"])
            for entry, s in zip(batch, simulated)
        ]
        reply = server.twin.AddTrainingSamples(pb.AddTrainingSamplesRequest(samples=samples), timeout=60)
        assert reply.samples_absorbed == 80 and reply.samples_rejected == 0

        bad = pb.TrainingSample(**batch[0], actual_ttft_ms=float("nan"), actual_tpot_ms=-2.0)
        reply = server.twin.AddTrainingSamples(pb.AddTrainingSamplesRequest(samples=[bad]), timeout=60)
        assert reply.samples_absorbed == 0 and reply.samples_rejected == 2
        assert metric(server, "ditto_calibration_rejected_samples_total", {"phase": "ttft", "reason": "not_finite"}) == 1

        for message, field in (
            (pb.AddTrainingSamplesRequest(), "samples"),
            (pb.AddTrainingSamplesRequest(samples=[pb.TrainingSample(**dict(batch[0], kv_cache_percentage=1.5))]),
             "samples[0].kv_cache_percentage"),
            (pb.AddTrainingSamplesRequest(samples=[pb.TrainingSample(**dict(batch[0], pod_type="gpu"))]),
             "samples[0].pod_type"),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                server.twin.AddTrainingSamples(message, timeout=30)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details().startswith(field), caught.value.details()

        after = server.twin.PredictRouting(question, timeout=60).candidates[0]
        expected_ttft = 300.0 + 1.2 * before.ttft_ms.mean
        assert abs(after.ttft_ms.mean - expected_ttft) < 0.05 * expected_ttft, (before.ttft_ms.mean, after.ttft_ms.mean)
        assert abs(after.tpot_ms.mean - 1.2 * before.tpot_ms.mean) < 0.05 * 1.2 * before.tpot_ms.mean
    finally:
        stop(server)


def test_an_entry_matching_one_mirrored_pod_is_simulated_on_its_mirrored_state(predictor):
    """The documented matching: exactly one fresh mirrored instance with the entry's waiting
    and running counts and KV usage (within 0.02) -> its mirrored state is simulated."""
    import time

    from ditto.v1 import twin_pb2 as pb

    # A long signal age limit, so freshness does not depend on how fast this test runs.
    config = predictor.twin.GetSnapshot(pb.GetSnapshotRequest(), timeout=10).config
    config.twin.max_signal_age_ms = 3_600_000
    predictor.twin.SyncClusterConfig(config, timeout=10)
    now_us = int(time.time() * 1e6)
    running = [
        pb.RequestState(request_id=f"r{i}", arrival_us=now_us - 5_000_000, prompt_tokens=3000,
                        computed_tokens=3000, output_tokens=10, max_tokens=2000, known_output_tokens=1500)
        for i in range(6)
    ]
    waiting = [pb.RequestState(request_id=f"w{i}", arrival_us=now_us - 1_000, prompt_tokens=6000, max_tokens=500)
               for i in range(3)]
    update = pb.InstanceStateUpdate(
        instance_id="vllm-2", observed_at_us=now_us,
        requests=pb.RequestLists(waiting=waiting, running=running),
        gauges=pb.Gauges(running=6, waiting=3, kv_usage=0.05),
    )
    assert predictor.twin.PushInstanceState(iter([update]), timeout=10).accepted == 1

    entry = dict(ENTRY, num_request_waiting=3, num_request_running=6, kv_cache_percentage=0.06,
                 prefill_tokens_in_flight=0)
    mirrored = post(predictor, "/predict", entry).json()
    assert mirrored["source"] == "mirrored:vllm-2", mirrored
    # The mirrored queue holds 18,000 prompt tokens; the aggregates alone would assume three
    # prompts as long as the new one (800): the mirrored answer waits longer.
    unmatched = post(predictor, "/predict", dict(entry, kv_cache_percentage=0.3)).json()
    assert unmatched["source"] == "aggregates"
    assert mirrored["ttft_ms"] > unmatched["ttft_ms"]


# --- the peer's client conventions (llm-d's prediction_server.py and training_server.py) ----


def test_probes_and_root_answer_json_as_the_peer(predictor):
    healthz = get(predictor, "/healthz")
    assert healthz.status_code == 200
    assert healthz.headers["content-type"].startswith("application/json")
    assert healthz.json()["status"] == "ok"
    readyz = get(predictor, "/readyz")
    assert readyz.status_code == 200
    body = readyz.json()
    assert body["status"] == "ready"
    assert body["model_type"] == "lightgbm" and body["engine"] == "ditto-simulation"
    assert body["objective_type"] == "mean" and body["quantile"] == 0.9
    root = get(predictor, "/")
    assert root.status_code == 200, root.text
    body = root.json()
    assert isinstance(body["message"], str) and body["message"]
    assert body["model_type"] == "lightgbm" and body["engine"] == "ditto-simulation"
    assert body["objective_type"] == "mean"
    assert body["quantile"] == 0.9
    assert body["is_ready"] is True
    # Training samples apply at once: nothing to sync. ditto is its own training server.
    assert body["sync_interval"] == 0
    assert body["training_server"] == predictor.url
    assert get(predictor, "/status").json()["training_server_url"] == predictor.url


def training_entries(server, count, seed=3):
    """Entries whose measured latencies are the twin's own (mean) answers, 1.2x slower."""
    batch = entries(random.Random(seed), count)
    simulated = predict_all(server, batch)
    return [dict(entry, actual_ttft_ms=5.0 + 1.2 * s["ttft_ms"], actual_tpot_ms=1.2 * s["tpot_ms"])
            for entry, s in zip(batch, simulated)]


def test_data_status_and_flush_speak_the_peer_shapes(predictor):
    def data_status():
        response = get(predictor, "/data/status")
        assert response.status_code == 200, response.text
        return response.json()

    status = data_status()
    assert status["training_data"] == {"ttft_samples": 0, "tpot_samples": 0, "total_samples": 0}
    assert status["test_data"] == {"ttft_samples": 0, "tpot_samples": 0, "total_samples": 0}
    assert status["ensemble"]["ensemble_mode"] is False
    assert status["ensemble"]["ensemble_active"] is False
    assert status["model_type"] == "lightgbm" and status["engine"] == "ditto-simulation"

    batch = training_entries(predictor, 30)
    response = post(predictor, "/add_training_data_bulk", {"entries": batch})
    assert response.status_code == 202, response.text
    assert response.json()["message"] == "Accepted 30 training samples."
    status = data_status()
    # Training data: the samples the calibration absorbed. Test data: the samples each
    # calibrated prediction was scored on before it absorbed them (the rolling error window).
    assert status["training_data"] == {"ttft_samples": 30, "tpot_samples": 30, "total_samples": 60}
    assert status["test_data"] == {"ttft_samples": 30, "tpot_samples": 30, "total_samples": 60}
    assert status["calibration"]["ttft"]["samples"] == 30
    assert status["model_ready"] is True
    datetime.datetime.fromisoformat(status["last_retrain"])

    # Flush only the training data, with the peer's body: the fit is forgotten, the error
    # window kept.
    flushed = post(predictor, "/flush", {"flush_training_data": True, "flush_test_data": False,
                                         "flush_metrics": False, "reason": "new deployment"})
    assert flushed.status_code == 200, flushed.text
    body = flushed.json()
    assert body["success"] is True
    assert body["reason"] == "new deployment"
    assert body["ttft_training_samples_flushed"] == 30 and body["tpot_training_samples_flushed"] == 30
    assert body["ttft_test_samples_flushed"] == 0 and body["tpot_test_samples_flushed"] == 0
    assert body["metrics_cleared"] is False
    assert isinstance(body["message"], str) and body["message"]
    datetime.datetime.fromisoformat(body["flushed_at"])
    status = data_status()
    assert status["training_data"]["total_samples"] == 0
    assert status["test_data"]["total_samples"] == 60
    assert status["calibration"]["ttft"]["scale"] == 1.0 and status["calibration"]["ttft"]["overhead_ms"] == 0.0

    # An empty body flushes everything (the peer's defaults are all true).
    assert post(predictor, "/add_training_data_bulk", {"entries": batch[:10]}).status_code == 202
    body = requests.post(predictor.url + "/flush", timeout=TIMEOUT).json()
    assert body["ttft_training_samples_flushed"] == 10 and body["tpot_training_samples_flushed"] == 10
    assert body["ttft_test_samples_flushed"] == 40 and body["tpot_test_samples_flushed"] == 40
    assert body["metrics_cleared"] is True and body["reason"] is None
    status = data_status()
    assert status["training_data"]["total_samples"] == 0 and status["test_data"]["total_samples"] == 0
    assert status["calibration"]["ttft"]["rolling_ape"] is None

    # A body that is not the peer's FlushRequest is a FastAPI 422 naming the field.
    detail = check_detail(post(predictor, "/flush", {"flush_metrics": "maybe"}), 422)
    assert detail[0]["loc"] == ["body", "flush_metrics"] and detail[0]["type"] == "bool_parsing"
    detail = check_detail(post(predictor, "/flush", {"reason": 5}), 422)
    assert detail[0]["loc"] == ["body", "reason"] and detail[0]["type"] == "string_type"


def test_models_list_and_model_info_describe_the_calibration(predictor):
    response = get(predictor, "/models/list")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model_type"] == "lightgbm" and body["engine"] == "ditto-simulation"
    datetime.datetime.fromisoformat(body["server_time"])
    models = body["models"]
    # The calibration of each phase is the model; the peer's scalers and gated ensembles
    # are listed (its client expects them) and do not exist.
    for name in ("ttft", "tpot"):
        assert models[name]["exists"] is True and models[name]["size_bytes"] > 0, models
        datetime.datetime.fromisoformat(models[name]["last_modified"])
    for name in ("ttft_scaler", "tpot_scaler", "ttft_gated", "tpot_gated"):
        assert models[name] == {"exists": False, "size_bytes": 0, "last_modified": None}, models

    info = get(predictor, "/model/ttft/info")
    assert info.status_code == 200, info.text
    before = info.json()
    assert before["model_name"] == "ttft" and before["exists"] is True
    assert before["size_bytes"] > 0 and before["model_type"] == "lightgbm"
    assert before["quantile"] == 0.9 and before["downloadable"] is False
    assert post(predictor, "/add_training_data_bulk", {"entries": training_entries(predictor, 5)}).status_code == 202
    after = get(predictor, "/model/ttft/info").json()
    assert after["last_modified"] > before["last_modified"]

    assert check_detail(get(predictor, "/model/nope/info"), 404) == "Unknown model: nope"
    assert check_detail(get(predictor, "/model/ttft_gated/info"), 404) == "Model ttft_gated not found"
    check_detail(get(predictor, "/model/ttft/download"), 404)


def test_metrics_carry_the_peer_series(predictor):
    assert post(predictor, "/add_training_data_bulk", {"entries": training_entries(predictor, 7)}).status_code == 202
    text = get(predictor, "/metrics").text
    for line in ('model_type{type="lightgbm"} 1', 'objective_type{type="mean"} 1', "model_quantile 0.9",
                 "ensemble_active 0", "ensemble_mode 0", 'training_samples_count{model="ttft"} 7',
                 'training_samples_count{model="tpot"} 7'):
        assert re.search("^" + re.escape(line) + "$", text, re.M), line
    # ditto's own series stay beside them.
    assert 'ditto_calibration_samples{phase="ttft"} 7' in text


@pytest.mark.parametrize("objective", ["mean", "quantile"])
def test_after_training_predictions_rise_strictly_with_tokens_in_flight(objective):
    """The peer's check: training latencies linear in prefill_tokens_in_flight (TTFT) and
    decode_tokens_in_flight (TPOT), then predictions at three in-flight levels, all else
    fixed, must rise strictly."""
    server = start("--latency-objective-type", objective, "--predictor-replications", "4")
    rng = random.Random(7)
    kv, itl, nrw, nrr, ntg, pcs = 0.5, 200, 3, 1, 5, 0.5
    base = {"kv_cache_percentage": kv, "input_token_length": itl, "num_request_waiting": nrw,
            "num_request_running": nrr, "num_tokens_generated": ntg, "prefix_cache_score": pcs}
    batch = []
    for _ in range(300):
        prefill, decode = rng.randint(0, 10_000), rng.randint(0, 3_000)
        batch.append(dict(
            base, prefill_tokens_in_flight=prefill, decode_tokens_in_flight=decode,
            actual_ttft_ms=max(1.0, 100.0 + itl * 2.0 + nrw * 3.0 + nrr * 4.0 + kv * 50.0 + pcs * 30.0
                               + prefill * 0.05 + rng.gauss(0, 5)),
            actual_tpot_ms=max(1.0, 10.0 + kv * 100.0 + itl * 0.5 + ntg + nrr * 5.0 + decode * 0.02
                               + rng.gauss(0, 5)),
        ))
    try:
        for start_index in range(0, len(batch), 50):
            response = post(server, "/add_training_data_bulk", {"entries": batch[start_index:start_index + 50]})
            assert response.status_code == 202, response.text
        status = get(server, "/data/status").json()
        assert status["training_data"]["ttft_samples"] > 250, status
        cases = [dict(base, prefill_tokens_in_flight=tif, decode_tokens_in_flight=tif // 3)
                 for tif in (0, 5_000, 10_000)]
        response = post(server, "/predict/bulk/strict", {"requests": cases})
        assert response.status_code == 200, response.text
        predictions = response.json()["predictions"]
        ttft = [p["ttft_ms"] for p in predictions]
        tpot = [p["tpot_ms"] for p in predictions]
        assert ttft[0] < ttft[1] < ttft[2], ttft
        assert tpot[0] < tpot[1] < tpot[2], tpot
        assert all(p["objective_type"] == objective for p in predictions)
        # Calibrated: the TTFT answers moved to the trained scale (hundreds of ms).
        assert ttft[0] > 300, ttft
    finally:
        stop(server)
