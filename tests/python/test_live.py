"""The live mirror against fake vLLM pods (fake_vllm.py) on loopback: `ditto serve --pods`
converges to the pods' gauges with no push, rebuilds their state, takes cache settings from
`vllm:cache_config_info`, follows their ZMQ KV events (both msgpack encodings, gaps replayed
through the ROUTER socket), survives malformed metric text and msgpack, marks a killed pod
stale with a reason and recovers when it comes back, and reads deprecated metric names.

Each fake binds its own loopback address (127.0.0.x), so one endpoint template with a fixed
port (`tcp://{ip}:PORT`) serves every pod, as in a Kubernetes pool. Waits are bounded polls.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc
import pytest

from conftest import BINARY, Server, free_port
from ditto.v1 import twin_pb2 as pb

HERE = os.path.dirname(os.path.abspath(__file__))
BOUND_S = 20.0


class FakeExited(AssertionError):
    """A fake vLLM process exited while starting (e.g. a port it was told to bind is taken)."""


class Fake:
    """A fake vLLM pod process on `host`. An HTTP port of 0 and KV ports of -1 are picked by
    the process as it binds them and read back (`--ports-file`); a restart binds the same."""

    def __init__(self, host, http_port, pub_port=0, replay_port=0, deprecated=False, model=None):
        self.host, self.http_port = host, http_port
        self.pub_port, self.replay_port = pub_port, replay_port
        self.ports_file = None
        self.args = [
            sys.executable,
            os.path.join(HERE, "fake_vllm.py"),
            "--host", host,
            "--http-port", str(http_port),
            "--pub-port", str(pub_port),
            "--replay-port", str(replay_port),
        ] + (["--deprecated"] if deprecated else []) + (["--served-model-name", model] if model else [])
        if http_port == 0 or -1 in (pub_port, replay_port):
            handle, self.ports_file = tempfile.mkstemp(prefix="fake-vllm-ports-")
            os.close(handle)
            os.unlink(self.ports_file)
            self.args += ["--ports-file", self.ports_file]
        self.start()

    @property
    def address(self):
        return f"{self.host}:{self.http_port}"

    def read_ports(self, deadline):
        """Waits for the process's bound ports; from then on its arguments name them."""
        while not os.path.exists(self.ports_file):
            if self.process.poll() is not None:
                raise FakeExited(f"fake vLLM exited: {self.process.stderr.read().decode()}")
            if time.monotonic() > deadline:
                raise AssertionError("fake vLLM did not report its ports")
            time.sleep(0.02)
        with open(self.ports_file) as file:
            ports = json.load(file)
        os.unlink(self.ports_file)
        self.ports_file = None
        self.http_port, self.pub_port, self.replay_port = ports["http"], ports["pub"], ports["replay"]
        for flag, value in (("--http-port", self.http_port), ("--pub-port", self.pub_port), ("--replay-port", self.replay_port)):
            self.args[self.args.index(flag) + 1] = str(value)
        at = self.args.index("--ports-file")
        del self.args[at : at + 2]

    def start(self):
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + BOUND_S
        if self.ports_file:
            self.read_ports(deadline)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise FakeExited(f"fake vLLM exited: {self.process.stderr.read().decode()}")
            try:
                with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=1) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("fake vLLM did not answer /metrics")

    def control(self, **command):
        request = urllib.request.Request(
            f"http://{self.address}/control", data=json.dumps(command).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.loads(reply.read())

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self):
        if self.process.poll() is None:
            self.kill()


def free_port_on(host, avoid=()):
    """A port free on `host` that is none of `avoid`: the fake binds its ZMQ ports on the same
    address, and a port free on another address (where `free_port` found them) can be the one
    the kernel offers here too."""
    import socket

    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in avoid:
            return port


# Attempts at starting a group of fakes sharing KV ports (see `fakes`).
BIND_ATTEMPTS = 5


@pytest.fixture
def fakes(request):
    """`make(count, kv, replay, deprecated)` starts `count` fakes on 127.0.0.2, .3, ... sharing
    one PUB and one replay port number (one endpoint template for the pool). The first fake
    binds ports the kernel picks and reports them; the others bind the same numbers on their
    own address, and if one of those is taken there the whole group starts again."""
    started = []

    def make(count, kv=False, replay=True, deprecated=False):
        for attempt in range(BIND_ATTEMPTS):
            group = []
            pub, rep = (-1 if kv else 0), (-1 if kv and replay else 0)
            try:
                for index in range(count):
                    fake = Fake(f"127.0.0.{index + 2}", 0, pub, rep, deprecated)
                    group.append(fake)
                    pub, rep = fake.pub_port, fake.replay_port
            except FakeExited:
                for fake in group:
                    fake.stop()
                if attempt == BIND_ATTEMPTS - 1:
                    raise
                continue
            started.extend(group)
            return group, pub, rep
        raise AssertionError("unreachable")

    yield make
    for fake in started:
        fake.stop()


@pytest.fixture
def serve():
    servers = []

    def make(*args):
        server = Server(["--scrape-interval-ms", "50", *args])
        servers.append(server)
        server.wait_serving()
        return server

    yield make
    for server in servers:
        code = server.terminate()
        output = server.output()
        os.unlink(server.log.name)
        assert code == 0, f"ditto serve exited {code}:\n{output}"


def snapshot(server):
    return server.twin.GetSnapshot(pb.GetSnapshotRequest(include_block_hashes=True), timeout=10)


def by_id(snap):
    return {instance.instance_id: instance for instance in snap.instances}


def eventually(server, check, what):
    """Polls the snapshot until `check(instances by id)` is truthy; returns its value."""
    deadline = time.monotonic() + BOUND_S
    last = None
    while time.monotonic() < deadline:
        last = by_id(snapshot(server))
        value = check(last)
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not {what} within {BOUND_S} s; last snapshot: {last}\n{server.output()}")


def bounded_until(check, what):
    """Polls `check()` until truthy, for at most BOUND_S."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"not {what} within {BOUND_S} s")


def metric(server, family, **labels):
    """Value of one series on ditto's /metrics (None if absent)."""
    _, text = server.http("/metrics")
    for line in text.splitlines():
        if not line.startswith(family + "{") and not line.startswith(family + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def gauges_are(instance, running, waiting, kv):
    g = instance.gauges
    return (
        instance.HasField("gauges")
        and (g.running, g.waiting) == (running, waiting)
        and abs(g.kv_usage - kv) < 1e-9
    )


def test_pods_converge_to_their_gauges_without_push(fakes, serve):
    (a, b), _, _ = fakes(2)
    a.control(gauges=dict(running=3, waiting=2, kv=0.3))
    b.control(gauges=dict(running=1, waiting=0, kv=0.05))
    # A long scrape timeout: a held scrape (below) must not count as a fault.
    server = serve("--pods", f"{a.address},{b.address}", "--scrape-timeout-ms", "30000")
    eventually(
        server,
        lambda i: gauges_are(i[a.address], 3, 2, 0.3) and gauges_are(i[b.address], 1, 0, 0.05),
        "at the pods' gauges",
    )
    # The state is rebuilt from the gauges: as many requests, ids stable, no push needed.
    inst = by_id(snapshot(server))[a.address]
    assert [r.request_id for r in inst.requests.running] == ["live-r0", "live-r1", "live-r2"]
    assert len(inst.requests.waiting) == 2
    assert all(r.computed_tokens > 0 for r in inst.requests.running)
    assert inst.requests_age.observed and not inst.stale_reason
    # A change on the pods shows up without any RPC, by the first scrape after it: each fake
    # holds the scrape that follows its first page with the new gauges (ditto has one scrape in
    # flight per pod, and applies a page before it asks again), so while both are held the
    # mirror must already show both changes: within two scrape intervals of the change.
    a.control(gauges=dict(running=0, waiting=5, kv=0.0), hold_after=1)
    b.control(gauges=dict(running=2, waiting=1, kv=0.1), hold_after=1)
    for fake in (a, b):
        bounded_until(lambda: fake.control(status=True)["holding"], "the fake holds ditto's next scrape")
    held = by_id(snapshot(server))
    a.control(release=True)
    b.control(release=True)
    assert gauges_are(held[a.address], 0, 5, 0.0) and gauges_are(held[b.address], 2, 1, 0.1), held
    assert len(held[a.address].requests.waiting) == 5 and not held[a.address].requests.running
    # Cache settings come from vllm:cache_config_info (4096 blocks), and the mismatch with the
    # pool's derived num_gpu_blocks is reported.
    config = {c.id: c for c in snapshot(server).config.instances}
    assert config[a.address].engine.num_gpu_blocks == 4096
    assert metric(server, "ditto_live_config_mismatch", instance=a.address, field="num_gpu_blocks") == 1
    assert metric(server, "ditto_live_scrapes_total", instance=b.address, result="ok") > 0
    assert metric(server, "ditto_signal_age_seconds", instance=b.address, signal="gauges") >= 0


def warm_up(fake, server, hashes):
    """Publishes until the subscription is live (ZMQ's slow joiner): batches before it are lost."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        fake.control(kv=dict(events=[dict(type="BlockStored", block_hashes=hashes)]))
        time.sleep(0.1)
        if by_id(snapshot(server))[fake.address].cached_blocks > 0:
            return
    raise AssertionError(f"no KV event reached the mirror\n{server.output()}")


def test_kv_event_prefix_makes_predictions_prefer_the_pod_holding_it(fakes, serve):
    (a, b), pub, rep = fakes(2, kv=True)
    server = serve(
        "--pods", f"{a.address},{b.address}",
        "--kv-events", f"tcp://{{ip}}:{pub}",
        "--kv-replay", f"tcp://{{ip}}:{rep}",
    )
    prefix = list(range(1000, 1064))  # 64 blocks = 1024 tokens of shared prefix
    warm_up(a, server, [7])
    warm_up(b, server, [8])
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[9])], encoding="array"))
    b.control(kv=dict(events=[dict(type="BlockStored", block_hashes=prefix)], encoding="map"))
    eventually(server, lambda i: set(prefix) <= set(i[b.address].cached_block_hashes), "prefix on b")
    question = pb.PredictRoutingRequest(
        request=pb.CandidateRequest(prompt_tokens=1100, output_tokens=16, block_hashes=prefix),
        request_id="prefix",
    )
    question.options.replications = 1
    question.options.seed = 1
    answer = server.twin.PredictRouting(question, timeout=60)
    cands = {c.instance_id: c for c in answer.candidates}
    assert cands[b.address].prefix_hit_tokens > 0 and cands[a.address].prefix_hit_tokens == 0
    assert cands[b.address].ttft_ms.mean < cands[a.address].ttft_ms.mean
    assert answer.recommended_instance_id == b.address
    assert answer.state_age_ms >= 0 and answer.state_age_ms == max(c.input_age_ms for c in answer.candidates)
    # A removal and a clear, in both encodings, are applied too.
    b.control(kv=dict(events=[dict(type="BlockRemoved", block_hashes=prefix[:4])], encoding="map"))
    eventually(server, lambda i: prefix[0] not in i[b.address].cached_block_hashes, "removal applied")
    a.control(kv=dict(events=[dict(type="AllBlocksCleared")]))
    eventually(server, lambda i: i[a.address].cached_blocks == 0, "clear applied")


def test_a_sequence_gap_is_replayed(fakes, serve):
    (a,), pub, rep = fakes(1, kv=True)
    server = serve("--pods", a.address, "--kv-events", f"tcp://{{ip}}:{pub}", "--kv-replay", f"tcp://{{ip}}:{rep}")
    warm_up(a, server, [1])
    # Two batches held back from the PUB socket (buffered for replay), then one sent: a gap.
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[2])], hold=True))
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[3])], hold=True, encoding="map"))
    last = a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[4])]))["seq"]
    inst = eventually(server, lambda i: i[a.address].kv_event_seq == last and i[a.address], "past the gap")
    assert {2, 3, 4} <= set(inst.cached_block_hashes), "the held batches came back by replay"
    assert inst.kv_event_gaps == 0 and not inst.stale_reason
    assert metric(server, "ditto_live_kv_replays_total", instance=a.address, result="ok") >= 1


def test_a_gap_without_replay_marks_the_prefix_state_stale(fakes, serve):
    (a,), pub, _ = fakes(1, kv=True, replay=False)
    dead = free_port()
    server = serve("--pods", a.address, "--kv-events", f"tcp://{{ip}}:{pub}", "--kv-replay", f"tcp://{{ip}}:{dead}")
    warm_up(a, server, [1])
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[2])], hold=True))
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[3])]))
    reason = eventually(server, lambda i: i[a.address].stale_reason, "stale")
    assert "replay unavailable" in reason and "prefix state stale" in reason
    assert by_id(snapshot(server))[a.address].kv_event_gaps == 1
    assert metric(server, "ditto_live_kv_replays_total", instance=a.address, result="unavailable") >= 1
    assert metric(server, "ditto_live_stale", instance=a.address, signal="kv_events") == 1


def test_a_killed_pod_goes_stale_and_recovers(fakes, serve):
    (a, b), _, _ = fakes(2)
    server = serve("--pods", f"{a.address},{b.address}", "--scrape-timeout-ms", "300")
    eventually(server, lambda i: i[a.address].HasField("gauges") and i[b.address].HasField("gauges"), "scraped")
    a.kill()
    reason = eventually(server, lambda i: i[a.address].stale_reason, "stale")
    assert reason.startswith("metrics: ")
    # Fail closed: the stale pod is never recommended; the other keeps updating.
    question = pb.PredictRoutingRequest(request=pb.CandidateRequest(prompt_tokens=100, output_tokens=8), request_id="k")
    question.options.replications = 1
    answer = server.twin.PredictRouting(question, timeout=60)
    cands = {c.instance_id: c for c in answer.candidates}
    assert not cands[a.address].valid and cands[b.address].valid
    assert answer.recommended_instance_id == b.address
    b.control(gauges=dict(running=2, waiting=1, kv=0.2))
    eventually(server, lambda i: gauges_are(i[b.address], 2, 1, 0.2), "b still updating")
    assert metric(server, "ditto_live_stale", instance=a.address, signal="metrics") == 1
    a.start()
    eventually(server, lambda i: not i[a.address].stale_reason, "recovered")
    answer = server.twin.PredictRouting(question, timeout=60)
    assert all(c.valid for c in answer.candidates)


@pytest.mark.parametrize(
    "fault,reason",
    [
        ("garbage", "no vllm:num_requests_waiting"),
        ("binary", "invalid utf-8"),
        ("truncated", "no vllm:kv_cache_usage_perc"),
        ("500", "HTTP 500"),
        ("timeout", "timed out"),
    ],
)
def test_bad_metrics_are_survived_and_reported(fakes, serve, fault, reason):
    (a, b), _, _ = fakes(2)
    server = serve("--pods", f"{a.address},{b.address}", "--scrape-timeout-ms", "300")
    eventually(server, lambda i: i[a.address].HasField("gauges"), "scraped")
    a.control(fault=fault)
    got = eventually(server, lambda i: i[a.address].stale_reason, "stale")
    assert reason in got, got
    b.control(gauges=dict(running=1, waiting=3, kv=0.1))
    eventually(server, lambda i: gauges_are(i[b.address], 1, 3, 0.1), "the other pod still updating")
    a.control(fault=None)
    a.control(gauges=dict(running=4, waiting=0, kv=0.4))
    eventually(server, lambda i: not i[a.address].stale_reason and gauges_are(i[a.address], 4, 0, 0.4), "recovered")


def test_malformed_msgpack_is_survived_and_reported(fakes, serve):
    (a,), pub, rep = fakes(1, kv=True)
    server = serve("--pods", a.address, "--kv-events", f"tcp://{{ip}}:{pub}", "--kv-replay", f"tcp://{{ip}}:{rep}")
    warm_up(a, server, [1])
    a.control(malformed_kv=True)
    reason = eventually(server, lambda i: i[a.address].stale_reason, "reported")
    assert "msgpack" in reason
    assert metric(server, "ditto_live_kv_batches_total", instance=a.address, result="malformed") == 1
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[5])]))
    eventually(server, lambda i: 5 in i[a.address].cached_block_hashes and not i[a.address].stale_reason, "recovered")


def test_deprecated_metric_names_work(fakes, serve):
    (a,), _, _ = fakes(1, deprecated=True)
    a.control(gauges=dict(running=2, waiting=1, kv=0.42))
    server = serve("--pods", a.address)
    eventually(server, lambda i: gauges_are(i[a.address], 2, 1, 0.42), "at the gauges")
    for name in ["vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries", "vllm:time_per_output_token_seconds"]:
        assert metric(server, "ditto_live_deprecated_metric_names", instance=a.address, name=name) == 1, name


def test_pushed_state_is_preferred_over_the_rebuild(fakes, serve):
    (a,), _, _ = fakes(1)
    a.control(gauges=dict(running=2, waiting=0, kv=0.1))
    server = serve("--pods", a.address, "--max-metrics-age-ms", "60000")
    eventually(server, lambda i: len(i[a.address].requests.running) == 2, "rebuilt")
    # The newest observation wins: a scrape that lands between reading the clock and the push
    # makes the push older, and it is refused (documented); a gateway then pushes again.
    for _ in range(20):
        now = int(time.time() * 1e6)
        update = pb.InstanceStateUpdate(
            instance_id=a.address,
            observed_at_us=now,
            requests=pb.RequestLists(
                running=[pb.RequestState(request_id="pushed-1", arrival_us=now - 1000, prompt_tokens=100,
                                         computed_tokens=100, output_tokens=1, max_tokens=50)]
            ),
        )
        try:
            server.twin.PushInstanceState(iter([update]), timeout=10)
            break
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.INVALID_ARGUMENT or "older than" not in err.details():
                raise
    else:
        raise AssertionError("every push lost the race against a scrape")
    a.control(gauges=dict(running=3, waiting=1, kv=0.2))
    inst = eventually(server, lambda i: gauges_are(i[a.address], 3, 1, 0.2) and i[a.address], "gauges pulled")
    assert [r.request_id for r in inst.requests.running] == ["pushed-1"], "the push wins while fresh"


def test_bad_live_flags_exit_2_naming_the_flag():
    for args, flag in [
        (["--pods", "nohost"], "--pods"),
        (["--pods", "a:1", "--kv-events", "ipc://x"], "--kv-events"),
        (["--kv-events", "tcp://{ip}:1"], "--kv-events"),
        (["--pods", "a:1", "--scrape-interval-ms", "0"], "--scrape-interval-ms"),
        (["--pods", "a:1", "--publish-interval-ms", "0"], "--publish-interval-ms"),
    ]:
        done = subprocess.run([BINARY, "serve", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        assert flag in done.stderr, (args, done.stderr)


def test_sources_in_the_cluster_yaml_and_dns_discovery(fakes, serve, tmp_path):
    (a, b), _, _ = fakes(2)
    # Pool settings the pods run with (vLLM does not publish its scheduler limits); the
    # pods publish block_size 16 and 4096 blocks, which replace the configured 1000.
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "pools:\n"
        "  - {name: small, replicas: 1, model: llama-3.1-8b-instruct, gpu: H100, tp: 1,\n"
        "     engine: {max_num_seqs: 8, max_num_batched_tokens: 4096, num_gpu_blocks: 1000,\n"
        "              max_model_len: 8192, enable_chunked_prefill: true}}\n"
        "sources:\n"
        f"  - {{pool: small, pods: ['{a.address}'], scrape_interval_ms: 120}}\n"
    )
    server = serve("--config", str(config))
    eventually(server, lambda i: a.address in i and i[a.address].HasField("gauges"), "pod from sources:")
    engine = {c.id: c for c in snapshot(server).config.instances}[a.address].engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens, engine.max_model_len) == (8, 4096, 8192)
    eventually(
        server,
        lambda i: {c.id: c for c in snapshot(server).config.instances}[a.address].engine.num_gpu_blocks == 4096,
        "cache info adopted",
    )
    assert metric(server, "ditto_live_config_mismatch", instance=a.address, field="num_gpu_blocks") == 1
    # A DNS source: "localhost" resolves to the loopback address b's fake listens on.
    dns_fake = Fake("127.0.0.1", free_port_on("127.0.0.1"))
    try:
        dns_fake.control(gauges=dict(running=1, waiting=1, kv=0.01))
        other = serve("--pods-dns", f"localhost:{dns_fake.http_port}", "--dns-interval-ms", "100")
        eventually(other, lambda i: gauges_are(i.get(dns_fake.address, pb.InstanceSnapshot()), 1, 1, 0.01), "found by DNS")
        # Forecasts say how old the state they forked from is.
        message = pb.ForecastCapacityRequest(
            stages=[pb.RateStage(rate_rps=2.0, duration_s=2.0)],
            input_tokens=pb.LengthDistribution(constant=128),
            output_tokens=pb.LengthDistribution(constant=16),
            variants=[pb.VariantCandidates(template_instance_id=dns_fake.address, replica_counts=[1])],
            replications=1,
            seed=3,
        )
        answer = other.twin.ForecastCapacity(message, timeout=120)
        assert answer.state_age_ms > 0
    finally:
        dns_fake.stop()
    assert b.address not in by_id(snapshot(server))


def test_bad_sources_name_the_field(tmp_path):
    config = tmp_path / "cluster.yaml"
    config.write_text("pools:\n  - {name: p, replicas: 1}\nsources:\n  - {pool: nope, pods: ['a:1']}\n")
    done = subprocess.run([BINARY, "serve", "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "sources[0].pool" in done.stderr, done.stderr
    config.write_text("pools:\n  - {name: p, replicas: 1}\nsources:\n  - {pool: p, pods: ['a:1'], scrape_interval_ms: 0}\n")
    done = subprocess.run([BINARY, "serve", "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "sources[0].scrape_interval_ms" in done.stderr, done.stderr


@pytest.mark.parametrize("max_kv_age", [None, "500"])
def test_a_killed_pod_s_kv_stream_recovers_after_restart(fakes, serve, max_kv_age):
    (a,), pub, rep = fakes(1, kv=True)
    args = ["--pods", a.address, "--kv-events", f"tcp://{{ip}}:{pub}", "--kv-replay", f"tcp://{{ip}}:{rep}"]
    if max_kv_age:
        args += ["--max-kv-age-ms", max_kv_age]
    server = serve(*args, "--scrape-timeout-ms", "300")
    warm_up(a, server, [1])
    a.kill()
    # Both signals report the dead pod (the KV stream's disconnect is often seen first).
    eventually(server, lambda i: "metrics: " in i[a.address].stale_reason, "stale")
    if max_kv_age:
        eventually(server, lambda i: "kv_events: " in i[a.address].stale_reason, "the stopped stream reported")
    # The pod comes back (its publisher restarts at sequence 0): its /metrics shows a new
    # process, so the blocks it held are dropped at once, before it publishes anything.
    a.start()
    eventually(server, lambda i: not i[a.address].cached_block_hashes, "the dead process's blocks dropped")
    assert metric(server, "ditto_live_pod_restarts_total", instance=a.address) == 1
    # The subscription follows the new publisher.
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[7])]))
        time.sleep(0.1)
        inst = by_id(snapshot(server))[a.address]
        if 7 in inst.cached_block_hashes and not inst.stale_reason:
            break
    else:
        raise AssertionError(f"the KV stream did not recover: {by_id(snapshot(server))[a.address]}\n{server.output()}")
    assert metric(server, "ditto_live_stale", instance=a.address, signal="kv_events") in (None, 0)
    assert 1 not in by_id(snapshot(server))[a.address].cached_block_hashes
    assert by_id(snapshot(server))[a.address].kv_event_gaps == 0


def test_the_forecast_loop_counts_a_pool_s_pods_as_one_variant(fakes, serve):
    (a, b), _, _ = fakes(2)
    server = serve(
        "--pods", f"{a.address},{b.address}",
        "--forecast-interval", "0.2",
        "--forecast-horizon-s", "20",
        "--forecast-replications", "1",
        "--forecast-namespace", "llm-d",
    )
    eventually(server, lambda i: a.address in i and b.address in i, "both pods mirrored")
    # The pods are named host:port; their variant is their source's pool (the first pool of
    # the embedded cluster, "vllm"), not one variant per address.
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        current = metric(server, "ditto_current_replicas", variant_name="vllm", namespace="llm-d")
        if current is not None:
            break
        time.sleep(0.1)
    assert current == 2, server.output()
    _, text = server.http("/metrics")
    assert "127.0.0." not in "".join(line for line in text.splitlines() if line.startswith("ditto_current_replicas")), text
