"""`ditto calibrate` and `ditto validate` on a run known only from vLLM's own /metrics.

The stand-in for a vLLM server is a simulated run whose true step time is 1.3x slower than
ditto's shipped model, with a 25 ms longer front end (the "server"). Its requests are
observed into prometheus_client histograms with vLLM v1's names, labels and buckets (the
library vLLM itself uses, so the scrape text is the real exposition format), scraped once
after a warm-up and once at the end. Then: the shipped model's error on that scrape pair is
large; `ditto calibrate` on the two scrapes learns it back; the fitted coefficients predict
the scrapes within a few percent. Bad scrape input exits 2 naming the file.
"""

import json
import os
import subprocess

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from conftest import BINARY, ROOT

MODEL = "llama-3.1-8b-instruct"
# vLLM v1 buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
WARMUP = 100
RUN_TIMEOUT_S = 300


def ditto(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)


def shipped_coefficients():
    path = os.path.join(ROOT, "data", "coefficients", "ditto-calibrated.yaml")
    values = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if ":" in line and not line.startswith(("#", "version", "provenance", "coefficients")):
                key, value = line.split(":", 1)
                values[key.strip()] = float(value)
    return values


def write_coefficients(path, values):
    with open(path, "w") as f:
        f.write("version: 1\nprovenance: \"test: the stand-in server's true model\"\ncoefficients:\n")
        for key, value in values.items():
            f.write(f"  {key}: {value}\n")


class VllmMetrics:
    """The /metrics of one vLLM v1 engine: the series `ditto calibrate` reads."""

    def __init__(self, num_gpu_blocks):
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]

        def histogram(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", E2E_BUCKETS)
        self.prompt = histogram("vllm:request_prompt_tokens",
                                "Number of prefill tokens processed.", TOKEN_BUCKETS)
        self.generation = histogram("vllm:request_generation_tokens",
                                    "Number of generation tokens processed.", TOKEN_BUCKETS)
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     ["block_size", "num_gpu_blocks", "enable_prefix_caching"],
                     registry=self.registry)
        info.labels("16", str(num_gpu_blocks), "True").set(1)
        self.labels = (MODEL, "0")

    def observe(self, record):
        self.ttft.labels(*self.labels).observe(record["ttft_ms"] / 1e3)
        self.e2e.labels(*self.labels).observe(record["e2e_ms"] / 1e3)
        for gap in record["itl_us"]:
            self.itl.labels(*self.labels).observe(gap / 1e6)
        self.prompt.labels(*self.labels).observe(record["input_tokens"])
        self.generation.labels(*self.labels).observe(record["output_tokens"])

    def text(self):
        return generate_latest(self.registry).decode()


@pytest.fixture(scope="module")
def scraped_run(tmp_path_factory):
    """A run directory holding two scrapes of the stand-in server."""
    work = tmp_path_factory.mktemp("scraped")
    truth = shipped_coefficients()
    truth["weights"] *= 1.3
    truth["step_us"] *= 1.3
    truth["queue_us"] += 25_000.0
    truth_file = work / "truth.yaml"
    write_coefficients(truth_file, truth)
    per_request = work / "requests.jsonl"
    out = ditto("run", "--model", MODEL, "--gpu", "H100", "--latency-model", str(truth_file),
                "--num-requests", "700", "--rate", "6", "--input-tokens", "600,200,50,2000",
                "--output-tokens", "200,60,20,400", "--seed", "7",
                "--per-request", str(per_request))
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    records = [json.loads(line) for line in per_request.read_text().splitlines()]
    records.sort(key=lambda r: r["end_us"])
    assert len(records) == 700
    metrics = VllmMetrics(summary["run"]["num_gpu_blocks"])
    for record in records[:WARMUP]:
        metrics.observe(record)
    run = work / "run"
    run.mkdir()
    (run / "metrics_before.txt").write_text(metrics.text())
    for record in records[WARMUP:]:
        metrics.observe(record)
    (run / "metrics_after.txt").write_text(metrics.text())
    interval_s = (records[-1]["end_us"] - records[WARMUP - 1]["end_us"]) / 1e6
    (run / "scrape.yaml").write_text(f"duration_s: {interval_s}\ngpu: H100\n")
    config = os.path.join(ROOT, "data", "model_configs", MODEL, "config.json")
    with open(config) as f:
        (run / "model_config.json").write_text(f.read())
    (run / "exp-config.yaml").write_text(
        "tensor_parallelism: 1\nmax_num_seqs: 256\nmax_num_batched_tokens: 8192\n")
    return work, run


def whole_run_errors(report):
    [run] = report["runs"]
    [whole] = [s for s in run["stages"] if s["stage"] == -1]
    return whole["ape_percent"]


def validate(run, model):
    out = ditto("validate", "--json", "--latency-model", model, str(run))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_calibrate_learns_a_slower_server_from_its_metrics(scraped_run):
    work, run = scraped_run
    report = validate(run, "calibrated")
    [entry] = report["runs"]
    # The scrapes' cache-config info set the KV blocks, and lengths come from histograms.
    assert entry["num_gpu_blocks"] > 0 and entry["output_len_simulated"] is None
    before = whole_run_errors(report)
    assert before["e2e_mean"] > 15.0 and before["ttft_mean"] > 15.0, before

    fitted = work / "fitted.yaml"
    # 160 evaluations: since the first token reaches the client one decode step late
    # (`first_token_steps`), TTFT couples the front end with the step cost, and 80 stopped at
    # a TTFT error of 5.6%.
    out = ditto("calibrate", str(run), "--free", "weights,step_us,queue_us",
                "--evaluations", "160", "--out", str(fitted))
    assert out.returncode == 0, out.stderr
    after = whole_run_errors(validate(run, str(fitted)))
    for metric in ("e2e_mean", "ttft_mean", "tpot_mean"):
        assert after[metric] < 5.0, (metric, after)
        assert after[metric] < before[metric] / 3, (metric, before, after)


def test_bad_scrapes_exit_2_naming_the_file(scraped_run):
    work, run = scraped_run
    broken = work / "broken"
    broken.mkdir(exist_ok=True)
    for name in ("model_config.json", "exp-config.yaml", "scrape.yaml", "metrics_before.txt"):
        (broken / name).write_text((run / name).read_text())
    # The after scrape is truncated before any latency histogram.
    (broken / "metrics_after.txt").write_text((run / "metrics_after.txt").read_text()[:200])
    out = ditto("validate", str(broken))
    assert out.returncode == 2
    assert "metrics_after.txt" in out.stderr

    # A missing interval names scrape.yaml.
    (broken / "metrics_after.txt").write_text((run / "metrics_after.txt").read_text())
    (broken / "scrape.yaml").unlink()
    out = ditto("validate", str(broken))
    assert out.returncode == 2
    assert "scrape.yaml" in out.stderr and "duration_s" in out.stderr
