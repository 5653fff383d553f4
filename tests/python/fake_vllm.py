"""A fake vLLM pod for the live-mirror tests, speaking the real wire formats on loopback.

- HTTP `GET /metrics`: a prometheus-client registry with vLLM v1's metric names and label
  sets (`model_name`, `engine`): the scheduler gauges, `vllm:cache_config_info`, the
  prefix-cache counters (`_total` on the wire), the token-count and latency histograms.
  With `deprecated` set it exports the pre-0.9.2/0.11 names instead
  (`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_*`, `vllm:time_per_output_token_seconds`).
- ZMQ KV events as vLLM's ZmqEventPublisher sends them: a PUB socket, 3 frames per message
  (topic, 8-byte big-endian sequence, msgpack `EventBatch[ts, events, data_parallel_rank]`),
  events as tagged msgspec structs in the positional (array) or map encoding, and a ROUTER
  replay socket that answers a start sequence with every buffered batch from it, then
  sequence -1 with an empty payload.
- `POST /control` (JSON) drives it: set gauges, publish KV events (optionally held back from
  the PUB socket to make a gap), send malformed msgpack, switch faults on the /metrics path
  (`timeout`, `500`, `garbage`, `binary`, `truncated`). `hold_after: N` with `gauges` makes the
  request that follows the N-th page with the new gauges wait until `release` (so a test can
  look at the mirror knowing how many such pages its scraper has had); `status` reports it.
- Finished requests as vLLM's PrometheusStatLogger records each one (vllm/v1/metrics/loggers.py,
  `record`: for every finished request, `vllm:request_success{finished_reason}` +1 and one
  observation in each per-request histogram, here the prompt and generation lengths):
  `finish: {count, reason, prompt, output}` finishes `count` at once; `steady: {rate, ...}`
  finishes them at `rate` per second from a background thread (`rate` 0 stops it), with the
  running and waiting gauges left as set (steady load: as many arrive as finish);
  `counter_jump: N` adds N to the counter alone (a misbehaving pod, for bounds).

Written from vLLM's source (vllm/distributed/kv_events.py, vllm/v1/core/kv_cache_utils.py,
vllm/v1/metrics/loggers.py), not from ditto's decoder:

- Wire eras (`encoding` of a `kv` command): `legacy` (the 5-field array_like BlockStored
  `[tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id]`), `array` (the
  default: with `medium`, `lora_name`, `extra_keys`, `group_idx`; trailing `None`s omitted as
  msgspec's `omit_defaults` does), `map` (events as tagged maps, `{"type": ...}`) and
  `map-batch` (the batch itself a map `{ts, events, data_parallel_rank}`). Any other event
  `type` is sent as given (vLLM adds event types: a subscriber must skip them).
- Block hashes as vLLM computes them (`prompt` command): `hash_block_tokens` chains
  `sha256(pickle((parent, tuple(tokens), extra_keys)))` (or, with `algo: sha256_cbor`,
  sha256 of the canonical CBOR encoding) from `NONE_HASH`, a per-process random
  32 bytes (vLLM's default without PYTHONHASHSEED), so nobody outside can compute them; sent
  as ints (`maybe_convert_block_hash`: the low 64 bits, big-endian) or as the 32 bytes
  (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`).
- Data parallelism (`--dp-size N`): every series has one `engine` label value per rank, and
  rank r publishes on `--pub-port + r` / `--replay-port + r`, as vLLM's
  `ZmqEventPublisher.offset_endpoint_port` binds them; `kv`/`prompt` take a `rank`.
- Restarts: kill and start the process again: its publisher numbers from 0 with an empty
  replay buffer, and `--startup-kv FILE` publishes batches (a JSON list of `kv` commands) as
  the process starts, before any subscriber can have joined: only the replay buffer has them.
- `--topic` sets the topic (default llm-d's `kv@<host>@<model>`; vLLM's own default is "").
- `--served-model-name NAME` sets the `model_name` label of every series (vLLM labels its
  series with `--served-model-name`'s first name, else the model path it loaded; default
  `meta-llama/Llama-3.1-8B-Instruct`).

- Ports: `--http-port 0` and `--pub-port -1` / `--replay-port -1` bind ports the kernel
  picks; `--ports-file FILE` then reports the ports bound (JSON `http`, `pub`, `replay`),
  written once every socket is bound, so a test never hands out a port it only found free.

Run: python fake_vllm.py --host 127.0.0.2 --http-port P --pub-port Q [--replay-port R]
"""

import argparse
import hashlib
import json
import os
import pickle
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cbor2
import msgpack
import zmq
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# vLLM's FinishReason values as the counter labels them (vllm/v1/engine/__init__.py,
# FINISH_REASON_STRINGS; older versions have the first three).
FINISH_REASONS = ["stop", "length", "abort", "error", "repetition"]
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0]


class Metrics:
    """vLLM v1's exported series (vllm/v1/metrics/loggers.py), in a private registry."""

    def __init__(self, deprecated, block_size, num_gpu_blocks, dp_size=1, model=MODEL):
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.values = [model, "0"]
        self.engines = [[model, str(rank)] for rank in range(dp_size)]
        kv_name = "vllm:gpu_cache_usage_perc" if deprecated else "vllm:kv_cache_usage_perc"
        prefix = "vllm:gpu_prefix_cache" if deprecated else "vllm:prefix_cache"
        itl = "vllm:time_per_output_token_seconds" if deprecated else "vllm:inter_token_latency_seconds"
        r = self.registry
        # vLLM's API server serves prometheus-client's default registry, which holds the
        # process collector (process_start_time_seconds, ...).
        ProcessCollector(registry=r)
        self.running = Gauge("vllm:num_requests_running", "Requests in execution batches.", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting.", labels, registry=r)
        self.kv = Gauge(kv_name, "KV-cache usage. 1 means 100 percent usage.", labels, registry=r)
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "num_gpu_blocks", "cache_dtype", "enable_prefix_caching", "engine"],
            registry=r,
        )
        for rank in range(dp_size):
            info.labels(str(block_size), str(num_gpu_blocks), "auto", "True", str(rank)).set(1)
        self.queries = Counter(f"{prefix}_queries", "Prefix-cache queries, tokens.", labels, registry=r)
        self.hits = Counter(f"{prefix}_hits", "Prefix-cache hits, tokens.", labels, registry=r)
        self.prompt = Histogram(
            "vllm:request_prompt_tokens", "Prompt tokens.", labels, buckets=TOKEN_BUCKETS, registry=r
        )
        self.generation = Histogram(
            "vllm:request_generation_tokens", "Generation tokens.", labels, buckets=TOKEN_BUCKETS, registry=r
        )
        self.itl = Histogram(itl, "Inter-token latency.", labels, buckets=LATENCY_BUCKETS, registry=r)
        Counter("vllm:num_preemptions", "Preemptions.", labels, registry=r).labels(*self.values)
        # One series per engine and FinishReason (vllm/v1/engine/__init__.py: str(reason)),
        # all created at start as vLLM does.
        self.success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            labels + ["finished_reason"], registry=r,
        )
        for values in self.engines:
            for reason in FINISH_REASONS:
                self.success.labels(*values, reason)
        for prompt, output in [(800, 150), (1200, 300), (400, 90), (2000, 500)]:
            self.prompt.labels(*self.values).observe(prompt)
            self.generation.labels(*self.values).observe(output)
            self.itl.labels(*self.values).observe(0.02)
        self.queries.labels(*self.values).inc(4400)
        self.hits.labels(*self.values).inc(1100)

    def nixl(self, count=0, seconds=0.0, bytes=0.0, descriptors=0.0, failed=0, engine=0):
        """`count` finished pulls of `seconds`, `bytes` and `descriptors` each, and `failed`
        failed transfers, as vLLM's NixlConnector reports them on a decode pod
        (kv_connector/v1/nixl_connector.py, NixlPromMetrics: the same names, buckets and
        per-engine labels). Registered on first use, as a pod started with a KV connector."""
        if not hasattr(self, "xfer"):
            labels, r = ["model_name", "engine"], self.registry
            seconds_buckets = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
            self.xfer = Histogram("vllm:nixl_xfer_time_seconds", "Transfer duration.", labels,
                                  buckets=seconds_buckets, registry=r)
            self.post = Histogram("vllm:nixl_post_time_seconds", "Transfer post time.", labels,
                                  buckets=[0.001] + seconds_buckets, registry=r)
            self.moved = Histogram("vllm:nixl_bytes_transferred", "Bytes per transfer.", labels,
                                   buckets=[2 ** (10 + i) for i in range(1, 25, 2)], registry=r)
            self.descriptors = Histogram(
                "vllm:nixl_num_descriptors", "Descriptors per transfer.", labels,
                buckets=[10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000], registry=r)
            self.failed = Counter("vllm:nixl_num_failed_transfers", "Failed transfers.", labels, registry=r)
            self.failed_notifications = Counter(
                "vllm:nixl_num_failed_notifications", "Failed notifications.", labels, registry=r)
        values = self.engines[engine] if engine < len(self.engines) else self.values
        for family in (self.xfer, self.post, self.moved, self.descriptors, self.failed, self.failed_notifications):
            family.labels(*values)
        for _ in range(count):
            self.xfer.labels(*values).observe(seconds)
            self.post.labels(*values).observe(seconds / 100)
            self.moved.labels(*values).observe(bytes)
            self.descriptors.labels(*values).observe(descriptors)
        self.failed.labels(*values).inc(failed)

    def finish(self, count=1, reason="stop", prompt=800, output=150, engine=0):
        """`count` requests finished with `reason`, as vLLM records each finished request."""
        values = self.engines[engine] if engine < len(self.engines) else self.values
        for _ in range(count):
            self.success.labels(*values, reason).inc()
            self.prompt.labels(*values).observe(prompt)
            self.generation.labels(*values).observe(output)

    def set(self, running=None, waiting=None, kv=None, engine=0):
        values = self.engines[engine] if engine < len(self.engines) else self.values
        if running is not None:
            self.running.labels(*values).set(running)
        if waiting is not None:
            self.waiting.labels(*values).set(waiting)
        if kv is not None:
            self.kv.labels(*values).set(kv)


def encode_event(event, encoding):
    """One event as msgspec encodes vLLM's tagged structs (`KVCacheEvent`, `tag=True`):
    `array_like` (positional, tag first) or as a map with a `type` key."""
    kind = event["type"]
    if kind == "BlockStored":
        fields = [
            ("block_hashes", event["block_hashes"]),
            ("parent_block_hash", event.get("parent_block_hash")),
            ("token_ids", event.get("token_ids", [])),
            ("block_size", event.get("block_size", 16)),
            ("lora_id", event.get("lora_id")),
            ("medium", event.get("medium", "GPU")),
            ("lora_name", event.get("lora_name")),
            ("extra_keys", event.get("extra_keys")),
            ("group_idx", event.get("group_idx")),
        ]
        legacy = 5
    elif kind == "BlockRemoved":
        fields = [
            ("block_hashes", event["block_hashes"]),
            ("medium", event.get("medium", "GPU")),
            ("group_idx", event.get("group_idx")),
        ]
        legacy = 1
    elif kind == "AllBlocksCleared":
        fields = []
        legacy = 0
    else:
        # A type this fixture does not know either: sent as given (vLLM adds types).
        fields = list(event.get("fields", {}).items())
        legacy = len(fields)
    if encoding in ("map", "map-batch"):
        return {"type": kind, **{k: v for k, v in fields if v is not None or k != "group_idx"}}
    if encoding == "legacy":
        fields = fields[:legacy]
    else:
        # omit_defaults on an array_like struct drops trailing default (None) fields.
        while len(fields) > legacy and fields[-1][1] is None:
            fields.pop()
    return [kind, *[value for _, value in fields]]


# vLLM's NONE_HASH without PYTHONHASHSEED: random per process (kv_cache_utils.init_none_hash).
NONE_HASH = os.urandom(32)


def vllm_sha256(value):
    """vLLM's `sha256` prefix-caching hash (vllm/utils/hashing.py): sha256 of the pickled value."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def vllm_sha256_cbor(value):
    """vLLM's `sha256_cbor` (`--prefix-caching-hash-algo sha256_cbor`, the language-neutral
    one): sha256 of the canonical CBOR encoding."""
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


HASH_FUNCTIONS = {"sha256": vllm_sha256, "sha256_cbor": vllm_sha256_cbor}


def hash_block_tokens(parent, tokens, extra_keys=None, algo="sha256"):
    """vLLM's `hash_block_tokens`: chained from NONE_HASH."""
    return HASH_FUNCTIONS[algo]((parent or NONE_HASH, tuple(tokens), extra_keys))


def maybe_convert_block_hash(digest, as_int):
    """vLLM's `maybe_convert_block_hash`: the low 64 bits, big-endian (or the bytes)."""
    return int.from_bytes(digest, byteorder="big") & ((1 << 64) - 1) if as_int else digest


def prompt_events(token_ids, block_size, as_int, first_block=0, algo="sha256"):
    """The BlockStored event vLLM publishes when a prompt's full blocks are cached, from
    block `first_block` on (its parent: the block before, already cached), hashed with
    vLLM's prefix-caching hash `algo`."""
    digests, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], algo=algo)
        digests.append(parent)
    stored = digests[first_block:]
    event = dict(
        type="BlockStored",
        block_hashes=[maybe_convert_block_hash(d, as_int) for d in stored],
        parent_block_hash=maybe_convert_block_hash(digests[first_block - 1], as_int) if first_block else None,
        token_ids=token_ids[first_block * block_size : len(digests) * block_size],
        block_size=block_size,
    )
    return event, [maybe_convert_block_hash(d, True) for d in digests]


def bind(socket, host, port):
    """Binds `socket` on `host`:`port`, or on a port the kernel picks when `port` is -1 (read
    back from the socket, so no other process can take it in between); returns the port."""
    if port == -1:
        socket.bind(f"tcp://{host}:*")
        return int(socket.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])
    socket.bind(f"tcp://{host}:{port}")
    return port


class Publisher:
    """vLLM's ZmqEventPublisher: PUB + replay ROUTER + a buffer of (seq, payload)."""

    END_SEQ = (-1).to_bytes(8, "big", signed=True)

    def __init__(self, host, pub_port, replay_port, topic=None, rank=0, model=MODEL):
        self.rank = rank
        self.context = zmq.Context()
        self.pub = self.context.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub_port = bind(self.pub, host, pub_port)
        self.topic = (f"kv@{host}@{model}" if topic is None else topic).encode()
        self.seq = 0
        self.buffer = []
        self.lock = threading.Lock()
        self.replay = None
        self.replay_port = 0
        if replay_port:
            self.replay = self.context.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay_port = bind(self.replay, host, replay_port)
            threading.Thread(target=self.serve_replay, daemon=True).start()

    def serve_replay(self):
        while True:
            try:
                frames = self.replay.recv_multipart()
            except zmq.ZMQError:
                return
            if len(frames) != 3:
                continue
            client, _, start = frames
            start = int.from_bytes(start, "big")
            with self.lock:
                batches = [(seq, payload) for seq, payload in self.buffer if seq >= start]
            for seq, payload in batches:
                self.replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            self.replay.send_multipart((client, b"", self.END_SEQ, b""))

    def publish(self, events, encoding="array", hold=False, raw=None, seq_jump=0, ts_offset_s=0.0):
        """Publishes one batch (or `raw` payload bytes); `hold` buffers it without sending;
        `seq_jump` skips that many sequence numbers first (a misbehaving publisher);
        `ts_offset_s` shifts the batch's emission time (a batch sent late)."""
        encoded = [encode_event(e, encoding) for e in events]
        ts = time.time() + ts_offset_s
        if encoding == "map-batch":
            batch = {"ts": ts, "events": encoded, "data_parallel_rank": self.rank}
        else:
            batch = [ts, encoded, self.rank]
        payload = raw if raw is not None else msgpack.packb(batch, use_bin_type=True)
        with self.lock:
            self.seq += seq_jump
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
        if not hold:
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        return seq


class State:
    def __init__(self, args):
        self.metrics = Metrics(args.deprecated, args.block_size, args.num_gpu_blocks, args.dp_size,
                               args.served_model_name)
        for engine in range(args.dp_size):
            self.metrics.set(0, 0, 0.0, engine)
        self.block_size = args.block_size
        self.fault = None
        # Pages served since the last gauge change, and the scrape hold (see the docstring).
        self.lock = threading.Lock()
        self.served_since_change = 0
        self.hold_after = None
        self.holding = False
        self.release = threading.Event()
        # Rank r on the base ports + r; with -1, rank 0 takes what the kernel picks and the
        # others follow it.
        self.publishers = []
        pub, replay = args.pub_port, args.replay_port
        for rank in range(args.dp_size if pub else 0):
            offset = lambda port: port + rank if port > 0 else port  # noqa: E731
            publisher = Publisher(
                args.host, offset(pub), offset(replay), args.topic, rank, args.served_model_name
            )
            if rank == 0:
                pub, replay = publisher.pub_port, publisher.replay_port
            self.publishers.append(publisher)
        self.publisher = self.publishers[0] if self.publishers else None
        self.steady = None
        if args.startup_kv:
            with open(args.startup_kv) as file:
                for kv in json.load(file):
                    self.publish_kv(kv)

    def run_steady(self, rate, reason="stop", prompt=800, output=150, engine=0):
        """Finishes requests at `rate` per second until replaced (a new `steady` command),
        on an absolute schedule so the rate does not drift."""
        stop = threading.Event()
        if self.steady is not None:
            self.steady.set()
        self.steady = stop
        if rate <= 0:
            return

        def loop():
            start, done = time.monotonic(), 0
            while not stop.is_set():
                due = int((time.monotonic() - start) * rate) - done
                if due > 0:
                    with self.lock:
                        self.metrics.finish(due, reason, prompt, output, engine)
                    done += due
                stop.wait(min(0.02, 1.0 / rate))

        threading.Thread(target=loop, daemon=True).start()

    def publish_kv(self, kv):
        publisher = self.publishers[kv.get("rank", 0)]
        raw = kv.get("raw_zeros")
        return publisher.publish(
            kv.get("events", []), kv.get("encoding", "array"), kv.get("hold", False),
            raw=b"\x00" * raw if raw else None,
            seq_jump=kv.get("seq_jump", 0), ts_offset_s=kv.get("ts_offset_s", 0.0),
        )


def handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, code, body, content_type="text/plain; version=0.0.4; charset=utf-8"):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path != "/metrics":
                return self.reply(404, b"not found\n")
            fault = state.fault
            if fault == "timeout":
                time.sleep(5)
            if fault == "500":
                return self.reply(500, b"internal error\n")
            if fault == "garbage":
                return self.reply(200, b"<html><body>502 Bad Gateway</body></html>\n{{{ not: prometheus\n")
            if fault == "binary":
                return self.reply(200, b"\x00\xff\xfe\x80binary")
            with state.lock:
                hold = state.hold_after is not None and state.served_since_change >= state.hold_after
                if hold:
                    state.holding = True
            if hold:
                state.release.wait(30)
            with state.lock:
                page = generate_latest(state.metrics.registry)
                state.served_since_change += 1
            if fault == "truncated":
                # Cut mid-line inside the KV-usage family: the gauges before it survive.
                cut = page.index(b"# HELP vllm:kv_cache_usage_perc") + 12
                page = page[:cut]
            self.reply(200, page)

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            command = json.loads(self.rfile.read(length) or b"{}")
            result = {}
            if "gauges" in command or "engines" in command:
                with state.lock:
                    if "gauges" in command:
                        state.metrics.set(**command["gauges"])
                    for engine, gauges in enumerate(command.get("engines", [])):
                        state.metrics.set(**gauges, engine=engine)
                    state.served_since_change = 0
                    state.hold_after = command.get("hold_after")
                    state.holding = False
                    state.release.clear()
            if "finish" in command:
                with state.lock:
                    state.metrics.finish(**command["finish"])
            if "steady" in command:
                state.run_steady(**(command["steady"] or {"rate": 0}))
            if "counter_jump" in command:
                with state.lock:
                    state.metrics.success.labels(*state.metrics.values, "stop").inc(command["counter_jump"])
            if "nixl" in command:
                with state.lock:
                    state.metrics.nixl(**command["nixl"])
            if command.get("release"):
                with state.lock:
                    state.hold_after = None
                    state.holding = False
                state.release.set()
            if command.get("status"):
                with state.lock:
                    result.update(holding=state.holding, served_since_change=state.served_since_change)
            if "fault" in command:
                state.fault = command["fault"]
            if "kv" in command:
                result["seq"] = state.publish_kv(command["kv"])
            if "prompt" in command:
                prompt = command["prompt"]
                event, hashes = prompt_events(
                    prompt["token_ids"],
                    state.block_size,
                    prompt.get("hash", "int") == "int",
                    prompt.get("first_block", 0),
                    prompt.get("algo", "sha256"),
                )
                kv = dict(prompt, events=[event])
                result["seq"] = state.publish_kv(kv)
                result["hashes"] = hashes
            if command.get("malformed_kv"):
                result["seq"] = state.publisher.publish([], raw=b"\xc1\x93not msgpack")
            self.reply(200, json.dumps(result).encode(), "application/json")

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--pub-port", type=int, default=0)
    parser.add_argument("--replay-port", type=int, default=0)
    parser.add_argument("--deprecated", action="store_true")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-gpu-blocks", type=int, default=4096)
    parser.add_argument("--dp-size", type=int, default=1)
    parser.add_argument("--topic", default=None)
    parser.add_argument("--startup-kv", default=None)
    parser.add_argument("--served-model-name", default=MODEL)
    parser.add_argument("--ports-file", default=None)
    args = parser.parse_args()
    state = State(args)
    server = ThreadingHTTPServer((args.host, args.http_port), handler(state))
    server.daemon_threads = True
    if args.ports_file:
        ports = dict(
            http=server.server_address[1],
            pub=state.publisher.pub_port if state.publisher else 0,
            replay=state.publisher.replay_port if state.publisher else 0,
        )
        with open(args.ports_file + ".tmp", "w") as file:
            json.dump(ports, file)
        os.replace(args.ports_file + ".tmp", args.ports_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
