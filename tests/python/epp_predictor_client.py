"""A stand-in for llm-d's EPP latency-predictor client, written in Python from the Go source of
llm-d-router (commit ebab687, `pkg/epp/framework/plugins/requestcontrol/dataproducer/
predictedlatency/latencypredictorclient`: types.go, coalescer.go, latencypredictor_async.go,
prediction.go, training.go, metrics.go) and the plugin's `startPredictor` (plugin.go).

What it reproduces, as the EPP does it:

- Configuration from the same environment variables and defaults (`ConfigFromEnv`):
  TRAINING_SERVER_URL (http://localhost:8000), PREDICTION_SERVER_URL (comma-separated,
  http://localhost:8001), LATENCY_MAX_SAMPLE_SIZE (1000), LATENCY_FLUSH_INTERVAL_SEC (1),
  LATENCY_USE_NATIVE_XGBOOST (true), LATENCY_HTTP_TIMEOUT_SEC (10),
  LATENCY_METRICS_INTERVAL_SEC (60), LATENCY_MAX_BULK_SIZE (100, at most 100),
  LATENCY_COALESCE_WINDOW_MS (1), LATENCY_MAX_COALESCED_ROWS (0: no cap),
  LATENCY_MAX_CONCURRENT_DISPATCHES (36).
- `start()`: GET /status from a prediction URL, then GET /model/download/info from the
  training URL (failures logged, not fatal).
- `predict_bulk_strict()`: validates each row as the Go client does, then hands the rows to
  the coalescer, which merges concurrent callers into one POST /predict/bulk/strict (once the
  window after the first submission ends, or at the row cap), at most N dispatches in flight,
  and slices each caller's predictions back out of the merged answer. Non-200 or an
  undecodable body is an error for every caller of that batch.
- `add_training_data_bulk()`: buffers; every flush interval the buffer is stratified-sampled
  down to the max sample size (TTFT rows, TPOT rows, others in proportion) and POSTed to
  /add_training_data_bulk. Anything but 202 is logged as an error.
- The refresh every metrics interval: GET /model/download/info, then by `model_type`:
  `bayesian_ridge` GETs the training server's /metrics and caches coefficients (single
  predictions then run in process); `xgboost` with native XGBoost on downloads
  /model/ttft/xgb/json and /model/tpot/xgb/json; `xgboost` without it and `lightgbm` only
  note the type (remote predictions); any other type is logged "Unknown model type, cannot
  refresh metrics". Then GET /status.
- `predict()` (the single-request path): by the status's model type, in process for
  `bayesian_ridge`, POST /predict for `xgboost`/`lightgbm`, an error otherwise.

Responses are decoded as Go's encoding/json decodes them into the client's structs: unknown
fields ignored, a known field of the wrong JSON type (a string for a float64, 3.0 for an int,
a time that is not RFC 3339) is an error.

Everything the client would log goes to `self.log` as (level, message, details); every HTTP call
it makes goes to `self.calls` as (method, path, status or None), each training POST to
`self.flushed` as (entries sent, status, reply body). `self.downloads` and
`self.in_process` record the tree downloads and in-process predictions the EPP would make.
"""

import json
import os
import queue
import random
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

GBM = "lightgbm"
BAYESIAN_RIDGE = "bayesian_ridge"
XGBOOST = "xgboost"

RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")


class DecodeError(Exception):
    """A response Go's json decoder would refuse."""


class ClientError(Exception):
    """An error the Go client returns to its caller."""


def _env_int(env, name, default, ok):
    text = env.get(name, "")
    if text:
        try:
            value = int(text)
        except ValueError:
            return default
        if ok(value):
            return value
    return default


class Config:
    """`ConfigFromEnv`: the EPP's environment variables with the Go defaults."""

    def __init__(self, env=None):
        env = os.environ if env is None else env
        self.training_url = env.get("TRAINING_SERVER_URL") or "http://localhost:8000"
        urls = env.get("PREDICTION_SERVER_URL")
        self.prediction_urls = [u.strip() for u in urls.split(",")] if urls else ["http://localhost:8001"]
        self.max_sample_size = _env_int(env, "LATENCY_MAX_SAMPLE_SIZE", 1000, lambda v: v > 0)
        self.flush_interval_s = _env_int(env, "LATENCY_FLUSH_INTERVAL_SEC", 1, lambda v: v > 0)
        native = env.get("LATENCY_USE_NATIVE_XGBOOST", "")
        self.use_native_xgboost = native.lower() == "true" if native else True
        self.http_timeout_s = _env_int(env, "LATENCY_HTTP_TIMEOUT_SEC", 10, lambda v: v > 0)
        self.metrics_interval_s = _env_int(env, "LATENCY_METRICS_INTERVAL_SEC", 60, lambda v: v > 0)
        self.max_bulk_size = _env_int(env, "LATENCY_MAX_BULK_SIZE", 100, lambda v: 0 < v <= 100)
        self.coalesce_window_s = _env_int(env, "LATENCY_COALESCE_WINDOW_MS", 1, lambda v: v >= 0) / 1000.0
        self.max_coalesced_rows = _env_int(env, "LATENCY_MAX_COALESCED_ROWS", 0, lambda v: v >= 0)
        self.max_concurrent_dispatches = _env_int(env, "LATENCY_MAX_CONCURRENT_DISPATCHES", 36, lambda v: v > 0)


# --- Go decoding of the client's structs -------------------------------------------------

def _float(value, field):
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DecodeError(f"json: cannot unmarshal {type(value).__name__} into Go field {field} of type float64")
    return float(value)


def _int(value, field):
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError(f"json: cannot unmarshal {value!r} into Go field {field} of type int")
    return value


def _string(value, field):
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DecodeError(f"json: cannot unmarshal {type(value).__name__} into Go field {field} of type string")
    return value


def _bool(value, field):
    if value is None:
        return False
    if not isinstance(value, bool):
        raise DecodeError(f"json: cannot unmarshal {type(value).__name__} into Go field {field} of type bool")
    return value


def _time(value, field, nullable):
    if value is None:
        if nullable:
            return None
        return "0001-01-01T00:00:00Z"
    if not isinstance(value, str) or not RFC3339.match(value):
        raise DecodeError(f"parsing time {value!r} as RFC 3339 for Go field {field}")
    return value


def _pair(value, field):
    if value is None:
        return [0.0, 0.0]
    if not isinstance(value, list):
        raise DecodeError(f"json: cannot unmarshal {type(value).__name__} into Go field {field} of type [2]float64")
    # Go fills a [2]float64 from the first two elements, zero for missing ones.
    items = [_float(v, field) for v in value]
    return (items + [0.0, 0.0])[:2]


def _bool_map(value, field):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DecodeError(f"json: cannot unmarshal {type(value).__name__} into Go field {field} of type map[string]bool")
    return {k: _bool(v, field) for k, v in value.items()}


def _object(value, what):
    if not isinstance(value, dict):
        raise DecodeError(f"json: cannot unmarshal {type(value).__name__} into Go value of type {what}")
    return value


def decode_prediction(value):
    """A `PredictionResponse`."""
    v = _object(value, "PredictionResponse")
    return {
        "ttft_ms": _float(v.get("ttft_ms"), "ttft_ms"),
        "tpot_ms": _float(v.get("tpot_ms"), "tpot_ms"),
        "ttft_uncertainty": _float(v.get("ttft_uncertainty"), "ttft_uncertainty"),
        "tpot_uncertainty": _float(v.get("tpot_uncertainty"), "tpot_uncertainty"),
        "ttft_prediction_bounds": _pair(v.get("ttft_prediction_bounds"), "ttft_prediction_bounds"),
        "tpot_prediction_bounds": _pair(v.get("tpot_prediction_bounds"), "tpot_prediction_bounds"),
        "predicted_at": _time(v.get("predicted_at"), "predicted_at", nullable=False),
        "model_type": _string(v.get("model_type"), "model_type"),
        "objective_type": _string(v.get("objective_type"), "objective_type"),
        "quantile": _float(v.get("quantile"), "quantile"),
        "last_model_load": _time(v.get("last_model_load"), "last_model_load", nullable=True),
    }


def decode_bulk(value):
    """A `BulkPredictionResponse`."""
    v = _object(value, "BulkPredictionResponse")
    predictions = v.get("predictions")
    if predictions is not None and not isinstance(predictions, list):
        raise DecodeError("json: cannot unmarshal predictions into []PredictionResponse")
    return {
        # A null element decodes to a zero PredictionResponse in Go.
        "predictions": [decode_prediction(p) if p is not None else decode_prediction({}) for p in predictions or []],
        "total_requests": _int(v.get("total_requests"), "total_requests"),
        "successful_predictions": _int(v.get("successful_predictions"), "successful_predictions"),
        "failed_predictions": _int(v.get("failed_predictions"), "failed_predictions"),
        "processing_time_ms": _float(v.get("processing_time_ms"), "processing_time_ms"),
    }


def decode_status(value):
    """A `ServerStatusResponse`."""
    v = _object(value, "ServerStatusResponse")
    return {
        "is_ready": _bool(v.get("is_ready"), "is_ready"),
        "model_type": _string(v.get("model_type"), "model_type"),
        "objective_type": _string(v.get("objective_type"), "objective_type"),
        "quantile": _float(v.get("quantile"), "quantile"),
        "last_model_load": _time(v.get("last_model_load"), "last_model_load", nullable=True),
        "training_server_url": _string(v.get("training_server_url"), "training_server_url"),
        "models_exist": _bool_map(v.get("models_exist"), "models_exist"),
    }


def decode_model_info(value):
    """A `ModelInfo`."""
    v = _object(value, "ModelInfo")
    return {
        "model_type": _string(v.get("model_type"), "model_type"),
        "objective_type": _string(v.get("objective_type"), "objective_type"),
        "model_status": _bool_map(v.get("model_status"), "model_status"),
        "quantile": _float(v.get("quantile"), "quantile"),
    }


# --- validation as the Go client does it --------------------------------------------------

def validate_prediction_request(req):
    """`ValidatePredictionRequest`: the error the client returns, or None."""
    if not 0.0 <= req.get("kv_cache_percentage", 0.0) <= 1.0:
        return "kv_cache_percentage must be between 0.0 and 1.0"
    for name in ("input_token_length", "num_request_waiting", "num_request_running", "num_tokens_generated",
                 "encoder_input_size"):
        if req.get(name, 0) < 0:
            return f"{name} must be non-negative"
    if not 0.0 <= req.get("prefix_cache_score", 0.0) <= 1.0:
        return "prefix_cache_score must be between 0.0 and 1.0"
    if not 0 <= req.get("encoder_matched_size", 0) <= req.get("encoder_input_size", 0):
        return "encoder_matched_size must be between 0 and encoder_input_size"
    return None


def prediction_request(kv, input_tokens, waiting, running, generated, prefix, pod_type=""):
    """A `PredictionRequest` as Go marshals it (every field; `pod_type` omitted when empty)."""
    req = {
        "kv_cache_percentage": kv,
        "input_token_length": input_tokens,
        "num_request_waiting": waiting,
        "num_request_running": running,
        "num_tokens_generated": generated,
        "prefix_cache_score": prefix,
        "encoder_input_size": 0,
        "encoder_matched_size": 0,
        "prefill_tokens_in_flight": 0,
        "decode_tokens_in_flight": 0,
    }
    if pod_type:
        req["pod_type"] = pod_type
    return req


def go_time_now():
    """`time.Now()` as Go marshals it: RFC 3339 with nanoseconds, UTC here."""
    ns = time.time_ns()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 1_000_000_000)) + f".{ns % 1_000_000_000:09d}Z"


def training_entry(kv, input_tokens, waiting, running, generated, prefix, ttft_ms, tpot_ms, pod_type=""):
    """A `TrainingEntry` as Go marshals it (a TTFT sample has tpot 0 and the other way round)."""
    entry = prediction_request(kv, input_tokens, waiting, running, generated, prefix, pod_type)
    entry.update(actual_ttft_ms=ttft_ms, actual_tpot_ms=tpot_ms, timestamp=go_time_now())
    return entry


# --- the client ----------------------------------------------------------------------------

class _Submission:
    def __init__(self, requests):
        self.requests = requests
        self.done = threading.Event()
        self.response = None
        self.error = None


class EppPredictorClient:
    """The EPP's `latencypredictorclient.Predictor`, started as `startPredictor` starts it."""

    def __init__(self, env=None, seed=1):
        self.config = Config(env)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.log = []
        self.calls = []
        self.downloads = []
        self.in_process = []
        self.refreshes = 0
        self.flushed = []
        self.server_status = None
        self.model_info = None
        self.cached_metrics = None
        self.pending = []
        self.coalesce = queue.Queue(maxsize=1024)
        self.dispatch_slots = threading.Semaphore(self.config.max_concurrent_dispatches)
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._background, daemon=True),
                        threading.Thread(target=self._coalescer, daemon=True)]
        for thread in self.threads:
            thread.start()

    # logging and HTTP

    def _log(self, level, message, **details):
        with self.lock:
            self.log.append((level, message, details))

    def _http(self, method, url, body=None):
        """(status, bytes); raises OSError when the server cannot be reached."""
        path = urllib.parse.urlsplit(url).path
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        status = None
        try:
            with urllib.request.urlopen(request, timeout=self.config.http_timeout_s) as reply:
                status, payload = reply.status, reply.read()
        except urllib.error.HTTPError as err:
            status, payload = err.code, err.read()
        finally:
            with self.lock:
                self.calls.append((method, path, status))
        return status, payload

    def _prediction_url(self):
        urls = self.config.prediction_urls
        if not urls:
            return self.config.training_url
        return urls[0] if len(urls) == 1 else self.rng.choice(urls)

    # lifecycle

    def start(self):
        """`Start`: initial status and model info; failures are logged, not returned."""
        try:
            self.refresh_server_status()
        except (ClientError, DecodeError, OSError) as err:
            self._log("error", "failed to get initial server status (will retry in background)", error=str(err))
        try:
            self.refresh_model_info()
        except (ClientError, DecodeError, OSError) as err:
            self._log("error", "failed to get initial model info (will retry in background)", error=str(err))
        self._log("info", "Latency predictor async client started.")

    def stop(self):
        """`Stop`: ends the loops, then a last flush and refresh."""
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=self.config.http_timeout_s + 5)
        self.flush_training()
        self.refresh_metrics()

    def _background(self):
        next_flush = time.monotonic() + self.config.flush_interval_s
        next_refresh = time.monotonic() + self.config.metrics_interval_s
        while not self.stopping.is_set():
            now = time.monotonic()
            if now >= next_flush:
                next_flush = now + self.config.flush_interval_s
                self.flush_training()
            if now >= next_refresh:
                next_refresh = now + self.config.metrics_interval_s
                self.refresh_metrics()
                try:
                    self.refresh_server_status()
                except (ClientError, DecodeError, OSError) as err:
                    self._log("error", "failed to refresh server status during background refresh", error=str(err))
                with self.lock:
                    self.refreshes += 1
            self.stopping.wait(min(next_flush, next_refresh) - time.monotonic() if not self.stopping.is_set() else 0)

    # predictions

    def predict_bulk_strict(self, requests):
        """`PredictBulkStrict`: validated, then coalesced with concurrent callers (or direct)."""
        if not requests:
            raise ClientError("no prediction requests provided")
        if len(requests) > self.config.max_bulk_size:
            raise ClientError(f"too many requests: {len(requests)} (max: {self.config.max_bulk_size})")
        for index, req in enumerate(requests):
            problem = validate_prediction_request(req)
            if problem:
                raise ClientError(f"validation failed for request {index}: {problem}")
        if self.config.coalesce_window_s <= 0:
            return self._post_bulk_strict(requests)
        submission = _Submission(list(requests))
        self.coalesce.put(submission, timeout=self.config.http_timeout_s)
        if not submission.done.wait(self.config.http_timeout_s + 5):
            raise ClientError("context deadline exceeded")
        if submission.error is not None:
            raise submission.error
        return submission.response

    def _post_bulk_strict(self, requests):
        url = self._prediction_url() + "/predict/bulk/strict"
        try:
            status, payload = self._http("POST", url, {"requests": requests})
        except OSError as err:
            raise ClientError(f"failed to call bulk prediction endpoint {url}: {err}") from err
        if status != 200:
            raise ClientError(f"bulk prediction server returned non-200 status: {status}, body: {payload[:200]!r}")
        try:
            return decode_bulk(json.loads(payload))
        except (ValueError, DecodeError) as err:
            raise ClientError(f"failed to decode bulk prediction response: {err}") from err

    def _coalescer(self):
        pending, rows, deadline = [], 0, None
        while True:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                submission = self.coalesce.get(timeout=0.05 if timeout is None else min(timeout, 0.05))
            except queue.Empty:
                submission = None
            if self.stopping.is_set():
                for sub in pending:
                    sub.error = ClientError("predictor shutting down")
                    sub.done.set()
                return
            if submission is not None:
                pending.append(submission)
                rows += len(submission.requests)
                if deadline is None:
                    deadline = time.monotonic() + self.config.coalesce_window_s
                if self.config.max_coalesced_rows > 0 and rows >= self.config.max_coalesced_rows:
                    deadline = time.monotonic()
            if deadline is not None and time.monotonic() >= deadline:
                batch, pending, rows, deadline = pending, [], 0, None
                threading.Thread(target=self._dispatch, args=(batch,), daemon=True).start()

    def _dispatch(self, batch):
        with self.dispatch_slots:
            merged = [req for sub in batch for req in sub.requests]
            self._log("debug", "Dispatching coalesced batch", callers=len(batch), total_items=len(merged))
            try:
                response, error = self._post_bulk_strict(merged), None
            except ClientError as err:
                response, error = None, err
            offset = 0
            for sub in batch:
                count = len(sub.requests)
                if error is not None:
                    sub.error = error
                elif offset + count > len(response["predictions"]):
                    sub.error = ClientError(
                        f"coalesced response too short: expected items [{offset}:{offset + count}] "
                        f"but got {len(response['predictions'])} predictions")
                else:
                    sub.response = {
                        "predictions": response["predictions"][offset:offset + count],
                        "total_requests": count,
                        "successful_predictions": count,
                        "failed_predictions": 0,
                        "processing_time_ms": response["processing_time_ms"],
                    }
                offset += count
                sub.done.set()

    def predict(self, req):
        """`Predict`: the single-request path, chosen by the model type from /status."""
        with self.lock:
            source = self.server_status or self.model_info
            model_type = source["model_type"] if source else ""
            metrics = self.cached_metrics
        if not model_type:
            raise ClientError("model type not yet available from server")
        if model_type == BAYESIAN_RIDGE:
            if not metrics or not metrics.get("coefficients"):
                raise ClientError("no cached Bayesian Ridge coefficients available for prediction")
            with self.lock:
                self.in_process.append(req)
            return {"model_type": BAYESIAN_RIDGE}
        if model_type in (XGBOOST, GBM):
            url = self._prediction_url() + "/predict"
            status, payload = self._http("POST", url, req)
            if status != 200:
                raise ClientError(f"prediction server returned non-200 status: {status}")
            return decode_prediction(json.loads(payload))
        raise ClientError(f"unsupported or unknown model type: {model_type}")

    def is_ready(self):
        """`IsReady`."""
        with self.lock:
            source = self.server_status or self.model_info
            model_type = source["model_type"] if source else ""
            info_type = self.model_info["model_type"] if self.model_info else ""
            metrics = self.cached_metrics
        if model_type == BAYESIAN_RIDGE:
            return bool(metrics and metrics.get("coefficients"))
        if model_type == XGBOOST:
            return len(self.config.prediction_urls) > 0
        if model_type == GBM:
            return info_type == GBM and len(self.config.prediction_urls) > 0
        return False

    def objective_type(self):
        """`GetCurrentObjectiveType`: the status's, else the model info's, else quantile."""
        with self.lock:
            for source in (self.server_status, self.model_info):
                if source and source["objective_type"]:
                    return source["objective_type"]
        return "quantile"

    # training

    def add_training_data_bulk(self, entries):
        """`AddTrainingDataBulk`: buffered until the next flush."""
        with self.lock:
            self.pending.extend(entries)

    def _sample(self, entries, size):
        ttft = [e for e in entries if e["actual_ttft_ms"] > 0]
        tpot = [e for e in entries if not e["actual_ttft_ms"] > 0 and e["actual_tpot_ms"] > 0]
        other = [e for e in entries if not e["actual_ttft_ms"] > 0 and not e["actual_tpot_ms"] > 0]
        total = len(entries)
        sizes = [int(len(group) / total * size) for group in (ttft, tpot, other)]
        missing = size - sum(sizes)
        if missing > 0:
            lengths = [len(ttft), len(tpot), len(other)]
            if lengths[0] >= lengths[1] and lengths[0] >= lengths[2]:
                sizes[0] += missing
            elif lengths[1] >= lengths[2]:
                sizes[1] += missing
            else:
                sizes[2] += missing
        result = []
        for group, want in zip((ttft, tpot, other), sizes):
            want = min(want, len(group))
            if want > 0:
                shuffled = list(group)
                self.rng.shuffle(shuffled)
                result.extend(shuffled[:want])
        return result

    def flush_training(self):
        """`flushTraining`: one POST of the (sampled) buffer; anything but 202 is an error."""
        with self.lock:
            batch, self.pending = self.pending, []
        if not batch:
            return
        if len(batch) > self.config.max_sample_size:
            batch = self._sample(batch, self.config.max_sample_size)
        url = self.config.training_url + "/add_training_data_bulk"
        try:
            status, reply = self._http("POST", url, {"entries": batch})
        except OSError as err:
            self._log("error", "Bulk POST failed", url=url, error=str(err))
            return
        with self.lock:
            self.flushed.append((batch, status, reply))
        if status != 202:
            self._log("error", "Bulk POST returned non-202 status", url=url, status=status)
        else:
            self._log("debug", "Flushed training batch", sent_count=len(batch))

    # refresh

    def refresh_server_status(self):
        url = self._prediction_url() + "/status"
        status, payload = self._http("GET", url)
        if status != 200:
            raise ClientError(f"server {url} returned non-200 status: {status}")
        try:
            decoded = decode_status(json.loads(payload))
        except ValueError as err:
            raise DecodeError(f"failed to decode server status response: {err}") from err
        with self.lock:
            self.server_status = decoded

    def refresh_model_info(self):
        url = self.config.training_url + "/model/download/info"
        status, payload = self._http("GET", url)
        if status != 200:
            raise ClientError(f"server {url} returned non-200 status: {status}")
        try:
            decoded = decode_model_info(json.loads(payload))
        except ValueError as err:
            raise DecodeError(f"failed to decode model info response: {err}") from err
        with self.lock:
            self.model_info = decoded

    def refresh_metrics(self):
        """`refreshMetrics`: model info, then what its `model_type` calls for."""
        try:
            self.refresh_model_info()
        except (ClientError, DecodeError, OSError) as err:
            self._log("error", "Failed to refresh model info during periodic refresh", error=str(err))
            return
        with self.lock:
            model_type = self.model_info["model_type"]
        if not model_type:
            self._log("debug", "Cannot refresh metrics: model type is unknown")
        elif model_type == BAYESIAN_RIDGE:
            self._fetch_coefficients()
        elif model_type == XGBOOST and self.config.use_native_xgboost:
            self._download_trees()
        elif model_type in (XGBOOST, GBM):
            with self.lock:
                self.cached_metrics = dict(self.cached_metrics or {}, model_type=model_type)
            self._log("debug", "Updated model type for HTTP-based predictions", model_type=model_type)
        else:
            self._log("info", "Unknown model type, cannot refresh metrics", model_type=model_type)

    def _fetch_coefficients(self):
        url = self.config.training_url + "/metrics"
        try:
            status, payload = self._http("GET", url)
        except OSError as err:
            self._log("error", "Failed to refresh Bayesian Ridge metrics", error=str(err))
            return
        if status != 200:
            self._log("error", "Failed to refresh Bayesian Ridge metrics", status=status)
            return
        coefficients = {}
        for line in payload.decode(errors="replace").splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in ("ttft_intercept", "tpot_intercept", "ttft_coef", "tpot_coef"):
                coefficients[line.rsplit(" ", 1)[0]] = line.rsplit(" ", 1)[-1]
        with self.lock:
            self.cached_metrics = {"model_type": BAYESIAN_RIDGE, "coefficients": coefficients}

    def _download_trees(self):
        for model in ("ttft", "tpot"):
            url = f"{self.config.training_url}/model/{model}/xgb/json"
            with self.lock:
                self.downloads.append(url)
            try:
                status, payload = self._http("GET", url)
            except OSError as err:
                self._log("error", "Failed to fetch XGBoost trees", error=str(err))
                return
            if status != 200:
                self._log("error", "Failed to fetch XGBoost trees", status=status, body=payload[:200])
                return

    def unexpected(self):
        """What the EPP would log above debug, other than its start line, and what it would do
        that a remote-only predictor must not cause: tree downloads, in-process predictions."""
        with self.lock:
            logged = [entry for entry in self.log
                      if entry[0] != "debug" and entry[1] != "Latency predictor async client started."]
            return logged + [("download", url, {}) for url in self.downloads] + \
                [("in-process", "Bayesian ridge prediction", {}) for _ in self.in_process]
