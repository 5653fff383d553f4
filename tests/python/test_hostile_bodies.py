"""Bodies under the byte cap that would cost gigabytes once parsed (issue 38 D2).

62 MB of `0,` is about 31 M JSON values: parsed whole into a tree (~32 bytes a value plus
the list's growth) it peaked at 1.7-2.2 GB before the entry-count check answered 413, over
the chart's 2 GiB memory limit, from one unauthenticated request. The parse now counts
values and stops at the body's budget (32 per entry the endpoint accepts), so each such
request is refused with 413 while the server's peak resident memory stays under 256 MB.
The peak is the kernel's own high-water mark (VmHWM in /proc/PID/status).
"""

import os

import pytest
import requests

from conftest import Server

TIMEOUT = 60
PEAK_BOUND_BYTES = 256 * 1024 * 1024
ZEROS = 31_000_000
BODY_CAP = 64 * 1024 * 1024


def peak_rss_bytes(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


def zeros_under(field):
    return b'{"' + field.encode() + b'": [' + b"0," * ZEROS + b"0]}"


@pytest.fixture(scope="module")
def server():
    server = Server(extra_args=("--http-max-body-bytes", str(BODY_CAP)))
    server.wait_serving()
    server.url = f"http://127.0.0.1:{server.http_port}"
    try:
        yield server
    finally:
        output = server.output()
        code = server.terminate()
        os.unlink(server.log.name)
        assert code == 0, f"ditto serve exited {code}:\n{output}"


@pytest.mark.parametrize(
    "path,field",
    [
        ("/predict/bulk", "requests"),
        ("/predict/bulk/strict", "requests"),
        ("/add_training_data_bulk", "entries"),
        # A field the endpoint does not know: it was parsed whole all the same.
        ("/predict", "unknown"),
    ],
)
def test_a_list_of_31m_values_is_refused_within_256_mb(server, path, field):
    body = zeros_under(field)
    assert len(body) < BODY_CAP
    reply = requests.post(
        server.url + path,
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=TIMEOUT,
    )
    assert reply.status_code == 413, reply.text[:500]
    assert "JSON values" in reply.json()["detail"], reply.text[:500]
    peak = peak_rss_bytes(server.process.pid)
    assert peak < PEAK_BOUND_BYTES, f"peak RSS {peak / 2**20:.0f} MiB after {path}"
    # Still serving, and a well-formed request is still answered.
    assert requests.get(server.url + "/healthz", timeout=TIMEOUT).status_code == 200
