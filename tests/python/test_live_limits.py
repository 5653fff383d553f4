"""`--max-instances` over static and DNS sources (issue 38, the gaps D4 left): a `--pods` list
longer than the limit is mirrored up to it, the first by id (`host:port`), and each pod left
out is marked stale on /metrics (`ditto_live_stale{signal="over_limit"}`), never scraped; a
DNS source past the limit is cut the same way. Waits are bounded polls.
"""

import re

from conftest import free_port
from test_live import Fake, bounded_until, by_id, eventually, free_port_on, metric, serve, snapshot  # noqa: F401


def over_limit_marks(server):
    """The ids marked left out over --max-instances on /metrics."""
    _, text = server.http("/metrics")
    marks = []
    for line in text.splitlines():
        if line.startswith("ditto_live_stale{") and 'signal="over_limit"' in line and line.endswith(" 1"):
            marks.append(re.search(r'instance="([^"]*)"', line).group(1))
    return sorted(marks)


def test_a_static_list_over_max_instances_mirrors_the_first_by_id_and_marks_the_rest(serve):
    # Addresses nobody listens on: mirrored pods are stale (connection refused), which is
    # not what is checked; which ones are mirrored, and which are marked, is.
    port = free_port()
    pods = [f"127.0.0.{i}:{port}" for i in (9, 3, 7, 5, 4)]
    server = serve("--pods", ",".join(pods), "--max-instances", "3")
    first = sorted(pods)[:3]
    eventually(server, lambda i: sorted(i) == first, "the first 3 by id mirrored")
    assert over_limit_marks(server) == sorted(pods)[3:]
    assert metric(server, "ditto_live_pods_over_limit") == 2
    assert metric(server, "ditto_live_pods") == 3
    output = server.output()
    assert "more served pods than --max-instances" in output
    assert "config sync rejected" not in output
    # Never scraped: no scrape series for a left-out pod.
    for pod in sorted(pods)[3:]:
        assert metric(server, "ditto_live_scrapes_total", instance=pod) is None, pod


def test_a_dns_source_past_max_instances_is_left_out_and_marked():
    # The static pod takes the only room; the DNS source's address ("localhost") is left out.
    fake = Fake("127.0.0.1", free_port_on("127.0.0.1"))
    port = free_port()
    from conftest import Server

    server = Server(["--scrape-interval-ms", "50", "--pods", f"127.0.0.2:{port}",
                     "--pods-dns", f"localhost:{fake.http_port}", "--dns-interval-ms", "100",
                     "--max-instances", "1"])
    try:
        server.wait_serving()
        bounded_until(lambda: over_limit_marks(server) == [fake.address], "the DNS address marked")
        assert sorted(by_id(snapshot(server))) == [f"127.0.0.2:{port}"]
        assert metric(server, "ditto_live_pods_over_limit") == 1
        assert "config sync rejected" not in server.output()
        assert metric(server, "ditto_live_scrapes_total", instance=fake.address) is None
    finally:
        code = server.terminate()
        fake.stop()
        assert code == 0


def test_a_zmq_frame_claiming_more_than_the_frame_limit_is_dropped_not_held(serve):
    """A KV publisher whose frame header claims 2^50 bytes (9 bytes on the wire): the ZMQ
    library would reserve that much before the body (the reservation failed and aborted the
    process); the relay passes the frame on empty from its header and drops its body as it
    comes, the pod's KV stream is stale with the reason, and the server keeps serving."""
    import socket
    import struct
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.5)
    pub_port = listener.getsockname()[1]
    done = threading.Event()
    held = []

    def publish():
        # Every connection: the greeting, READY as a PUB, then one frame header claiming 2^50.
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)
            try:
                conn.settimeout(5)
                conn.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL" + b"\0" * 16 + b"\x00" + b"\0" * 31)
                got = b""
                while len(got) < 64:
                    part = conn.recv(64 - len(got))
                    if not part:
                        break
                    got += part
                name, key, value = b"READY", b"Socket-Type", b"PUB"
                body = bytes([len(name)]) + name + bytes([len(key)]) + key + struct.pack(">I", len(value)) + value
                conn.sendall(bytes([0x04, len(body)]) + body)
                conn.sendall(bytes([0x02]) + struct.pack(">Q", 1 << 50) + b"x" * 4096)
            except OSError:
                pass

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        server = serve("--pods", f"127.0.0.1:{free_port()}", "--kv-events", f"tcp://{{ip}}:{pub_port}")
        reason = eventually(server, lambda i: "over the limit of 16777216" in i[next(iter(i))].stale_reason
                            and i[next(iter(i))].stale_reason, "the frame cut")
        assert "batch of 1125899906842624 bytes" in reason, reason
        assert server.process.poll() is None, "ditto exited"
        assert server.http("/healthz")[0] == 200
    finally:
        done.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        listener.close()
