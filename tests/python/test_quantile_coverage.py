"""Predicted quantiles that cover (issue 36, item 4), tried the way the latency predictor's
own client suite tries its quantile model (its `test_tif_features_quantile_learns_distribution`:
train on a known conditional distribution, then check each TIF bucket's coverage).

Training data: TTFT = base + 0.05 ms per prefill token in flight + N(0, 30 ms), TPOT = base +
0.02 ms per decode token in flight + N(0, 10 ms), with the other features fixed. After one bulk
training call and a reload, the predicted p90 of 300 fresh cases in a low-TIF and a high-TIF
bucket must cover 90% +- 8% of draws from the same distribution, and grow with TIF. Before the
conformal layer, the replications' p90 covered 58% of TTFTs in the low bucket (the simulation's
spread knows nothing of the 30 ms noise). The server's own coverage gauge must say the same.
"""

import os
import random
import tempfile

import pytest
import requests

from conftest import Server

TIMEOUT = 300
TRAIN_N = 3_000
TEST_N = 300
TARGET = 0.9
TOLERANCE = 0.08
TTFT_SD, TPOT_SD = 30.0, 10.0
KV, ITL, WAITING, RUNNING, GENERATED, PREFIX = 0.5, 200, 3, 1, 5, 0.5


def ttft_mean(prefill_tif):
    return 100.0 + ITL * 2.0 + WAITING * 3.0 + RUNNING * 4.0 + KV * 50.0 + PREFIX * 30.0 + 0.05 * prefill_tif


def tpot_mean(decode_tif):
    return 10.0 + KV * 100.0 + ITL * 0.5 + GENERATED * 1.0 + RUNNING * 5.0 + 0.02 * decode_tif


def features(prefill_tif, decode_tif):
    return {
        "kv_cache_percentage": KV,
        "input_token_length": ITL,
        "num_request_waiting": WAITING,
        "num_request_running": RUNNING,
        "num_tokens_generated": GENERATED,
        "prefix_cache_score": PREFIX,
        "prefill_tokens_in_flight": prefill_tif,
        "decode_tokens_in_flight": decode_tif,
    }


@pytest.fixture
def server():
    directory = tempfile.mkdtemp(prefix="ditto-quantile-")
    env = dict(os.environ, LATENCY_OBJECTIVE_TYPE="quantile", LATENCY_QUANTILE_ALPHA=str(TARGET))
    server = Server(
        extra_args=("--calibration-file", os.path.join(directory, "calibration.json")), env=env
    )
    server.wait_serving()
    server.url = f"http://127.0.0.1:{server.http_port}"
    try:
        yield server
    finally:
        output = server.output()
        code = server.terminate()
        os.unlink(server.log.name)
        assert code == 0, f"ditto serve exited {code}:\n{output}"


def predict(server, cases):
    reply = requests.post(server.url + "/predict/bulk/strict", json={"requests": cases}, timeout=TIMEOUT)
    assert reply.status_code == 200, reply.text[:500]
    return reply.json()["predictions"]


def test_predicted_p90_covers_each_tif_bucket(server):
    rng = random.Random(13)
    status = requests.get(server.url + "/status", timeout=TIMEOUT).json()
    assert status["objective_type"] == "quantile" and status["quantile"] == TARGET, status

    entries = []
    for _ in range(TRAIN_N):
        prefill_tif, decode_tif = rng.randint(0, 10_000), rng.randint(0, 3_000)
        entry = features(prefill_tif, decode_tif)
        entry["actual_ttft_ms"] = max(1.0, ttft_mean(prefill_tif) + rng.gauss(0.0, TTFT_SD))
        entry["actual_tpot_ms"] = max(1.0, tpot_mean(decode_tif) + rng.gauss(0.0, TPOT_SD))
        entries.append(entry)
    reply = requests.post(server.url + "/add_training_data_bulk", json={"entries": entries}, timeout=TIMEOUT)
    assert reply.status_code == 202, reply.text[:500]
    assert requests.post(server.url + "/reload", timeout=TIMEOUT).status_code == 200

    monotone = predict(server, [features(tif, tif // 3) for tif in (0, 5_000, 10_000)])
    assert monotone[2]["ttft_ms"] > monotone[0]["ttft_ms"], monotone
    assert monotone[2]["tpot_ms"] > monotone[0]["tpot_ms"], monotone

    for label, low, high in (("low-TIF", 0, 2_000), ("high-TIF", 8_000, 10_000)):
        prefill = [rng.randint(low, high) for _ in range(TEST_N)]
        predictions = predict(server, [features(p, p // 3) for p in prefill])
        ttft_hits = tpot_hits = 0
        for p, prediction in zip(prefill, predictions):
            ttft_actual = max(1.0, ttft_mean(p) + rng.gauss(0.0, TTFT_SD))
            tpot_actual = max(1.0, tpot_mean(p // 3) + rng.gauss(0.0, TPOT_SD))
            ttft_hits += ttft_actual <= prediction["ttft_ms"]
            tpot_hits += tpot_actual <= prediction["tpot_ms"]
        ttft_coverage, tpot_coverage = ttft_hits / TEST_N, tpot_hits / TEST_N
        assert abs(ttft_coverage - TARGET) <= TOLERANCE, f"{label}: TTFT coverage {ttft_coverage:.3f}"
        assert abs(tpot_coverage - TARGET) <= TOLERANCE, f"{label}: TPOT coverage {tpot_coverage:.3f}"

    metrics = requests.get(server.url + "/metrics", timeout=TIMEOUT).text
    for phase in ("ttft", "tpot"):
        line = next(l for l in metrics.splitlines() if l.startswith(f'ditto_calibration_quantile_coverage{{phase="{phase}"}}'))
        coverage = float(line.split()[-1])
        assert abs(coverage - TARGET) <= TOLERANCE, line
