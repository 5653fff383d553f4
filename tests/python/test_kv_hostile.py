"""KV-event publishers that misbehave (issue 38 D10-D12), against fake vLLM pods speaking
vLLM's ZMQ wire (fake_vllm.py): a sequence number that jumps by 2^62, batches that arrive
late, and payloads too large to decode.

- D10: a jump of 2^62 was counted as 4.6e18 missed batches for ever, and repeated jumps
  overflowed the numbering until later batches were rejected. A jump past 16.7 M batches is
  now a new sequence: the pod's prefix state is rebuilt from it (stale meanwhile, with a
  reason), counted as `sequence_reset`, and every later batch is applied.
- D11: the KV-events age was measured from when ditto applied a batch, so a mirror 17 s
  behind read ~0.1 s. It is now measured from the batch's own emission time.
- D12: a payload over 16 MiB, or declaring more than 2^21 msgpack values, is refused before
  it is decoded (a 200 MB frame took RSS to 704 MB): the pod's KV stream is stale with the
  reason, the server's peak resident memory stays under 256 MB, and later batches apply.
"""

from test_live import by_id, eventually, metric, serve, snapshot  # noqa: F401 (serve: a fixture)
from test_live_wire import kv_args, pods, until_stored  # noqa: F401 (pods: a fixture)
from test_hostile_bodies import PEAK_BOUND_BYTES, peak_rss_bytes


def gaps(server, address):
    return metric(server, "ditto_live_kv_gaps_total", instance=address) or 0.0


def test_a_sequence_jump_of_2_62_is_a_new_sequence_not_a_gap(pods, serve):
    (a,), pub, rep = pods(1)
    server = serve("--pods", a.address, *kv_args(pub, rep))
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[1])]))
    # 2^62, then 2^61 more (the wire's sequence is a signed 64-bit integer).
    for round_, (hashes, jump) in enumerate((([2], 1 << 62), ([3], 1 << 61))):
        a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=hashes)], seq_jump=jump))
        inst = eventually(server, lambda i: hashes[0] in i[a.address].cached_block_hashes and i[a.address],
                          f"the batch after jump {round_ + 1}")
        assert "sequence jumped" in inst.stale_reason, inst.stale_reason
        # The old sequence's blocks went with it.
        assert 1 not in inst.cached_block_hashes
    # Every later batch applies; nothing counted 4.6e18 batches missed.
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[4])]))
    eventually(server, lambda i: 4 in i[a.address].cached_block_hashes, "a later batch")
    assert gaps(server, a.address) < 10
    assert metric(server, "ditto_live_kv_batches_total", instance=a.address, result="sequence_reset") == 2
    assert not metric(server, "ditto_live_kv_batches_total", instance=a.address, result="rejected")


def test_the_kv_age_is_measured_from_the_batch_s_own_time(pods, serve):
    (a,), pub, rep = pods(1)
    server = serve("--pods", a.address, *kv_args(pub, rep))
    # A publisher whose batches reach ditto late: emitted 30 s, then 17 s, before they arrive.
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[1])], ts_offset_s=-30.0))
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[2])], ts_offset_s=-17.0))
    inst = eventually(server, lambda i: 2 in i[a.address].cached_block_hashes and i[a.address], "the late batch")
    assert inst.kv_events_age.age_ms >= 16_000, inst.kv_events_age


def test_oversized_payloads_are_refused_before_they_are_decoded(pods, serve):
    (a,), pub, rep = pods(1)
    server = serve("--pods", a.address, *kv_args(pub, rep))
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[1])]))
    # 64 MB of zeros (each a msgpack value), then 3 M token ids in 3 MB: both refused.
    a.control(kv=dict(raw_zeros=64 * 1024 * 1024))
    inst = eventually(server, lambda i: "over the limit" in i[a.address].stale_reason and i[a.address],
                      "the big frame refused")
    assert "16777216" in inst.stale_reason, inst.stale_reason
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[5], token_ids=[1] * 3_000_000,
                                   block_size=16)]))
    eventually(server, lambda i: "msgpack values" in i[a.address].stale_reason, "the many-valued batch refused")
    peak = peak_rss_bytes(server.process.pid)
    assert peak < PEAK_BOUND_BYTES, f"peak RSS {peak / 2**20:.0f} MiB"
    # The stream goes on.
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[6])]))
    eventually(server, lambda i: 6 in i[a.address].cached_block_hashes, "a later batch")


def connections(server, address, result):
    return metric(server, "ditto_live_kv_connections_total", instance=address, result=result) or 0.0


def test_a_frame_just_under_128_mib_is_dropped_as_it_arrives(pods, serve):
    # Issue 38 D12: the relay cut frames only past 128 MiB, so the library held a frame up to
    # that whole before the 16 MiB payload check refused it. A message frame over 16 MiB is
    # now passed on empty, its body dropped as it arrives: the batch is refused naming the
    # limit, the stream stays connected, and peak memory stays far under the bound.
    (a,), pub, rep = pods(1)
    server = serve("--pods", a.address, *kv_args(pub, rep))
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[1])]))
    connected = connections(server, a.address, "connected")
    before = peak_rss_bytes(server.process.pid)
    a.control(kv=dict(raw_zeros=(128 << 20) - 1))
    inst = eventually(server, lambda i: "over the limit" in i[a.address].stale_reason and i[a.address],
                      "the big frame refused")
    assert f"batch of {(128 << 20) - 1} bytes" in inst.stale_reason, inst.stale_reason
    assert "16777216" in inst.stale_reason, inst.stale_reason
    peak = peak_rss_bytes(server.process.pid)
    print(f"peak RSS {before / 2**20:.0f} MiB before the frame, {peak / 2**20:.0f} MiB after")
    assert peak < PEAK_BOUND_BYTES, f"peak RSS {peak / 2**20:.0f} MiB"
    # Never held: held whole, the frame alone took the peak up by 128 MiB.
    assert peak < before + (32 << 20), f"peak RSS {before / 2**20:.0f} -> {peak / 2**20:.0f} MiB"
    # The stream stayed up: the next batch applies on the same connection.
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[6])]))
    inst = eventually(server, lambda i: 6 in i[a.address].cached_block_hashes and i[a.address], "a later batch")
    assert not inst.stale_reason, inst.stale_reason
    assert connections(server, a.address, "connected") == connected
    assert not connections(server, a.address, "disconnected")
    assert metric(server, "ditto_live_kv_batches_total", instance=a.address, result="malformed") == 1


def test_a_million_block_batch_stays_under_the_memory_bound(pods, serve):
    # Issue 38 D12: one BlockStored event of 1M blocks (vLLM's 64-bit int hashes, 9 MB of
    # msgpack: under the payload and value caps) peaked at 1.07 GB.
    (a,), pub, rep = pods(1)
    server = serve("--pods", a.address, *kv_args(pub, rep))
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[1])]))
    base = 1 << 63
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=list(range(base, base + 1_000_000)),
                                   token_ids=[], block_size=16)]))
    inst = eventually(server, lambda i: "blocks" in i[a.address].stale_reason and i[a.address],
                      "the million-block batch refused")
    assert "1000000 blocks in one batch, over the limit of 131072" in inst.stale_reason, inst.stale_reason
    peak = peak_rss_bytes(server.process.pid)
    print(f"peak RSS {peak / 2**20:.0f} MiB after the million-block batch")
    assert peak < PEAK_BOUND_BYTES, f"peak RSS {peak / 2**20:.0f} MiB"
    # The stream goes on, and a batch at the limit applies.
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[6])]))
    eventually(server, lambda i: 6 in i[a.address].cached_block_hashes, "a later batch")


def test_a_batch_over_the_event_limit_is_refused_with_a_reason(pods, serve):
    # Issue 38 D12: a batch of more events than --max-kv-events-per-batch was rejected by
    # the store with a log line only. The pod's KV stream now says why, and goes on.
    (a,), pub, rep = pods(1)
    server = serve("--pods", a.address, "--max-kv-events-per-batch", "1000", *kv_args(pub, rep))
    until_stored(a, server, dict(events=[dict(type="BlockStored", block_hashes=[1])]))
    a.control(kv=dict(events=[dict(type="AllBlocksCleared")] * 1001))
    inst = eventually(server, lambda i: "rejected" in i[a.address].stale_reason and i[a.address],
                      "the batch refused with a reason")
    assert "1001 events in one batch exceed the limit of 1000" in inst.stale_reason, inst.stale_reason
    assert 1 in inst.cached_block_hashes, "nothing of the refused batch applied"
    a.control(kv=dict(events=[dict(type="BlockStored", block_hashes=[6])]))
    inst = eventually(server, lambda i: 6 in i[a.address].cached_block_hashes and i[a.address], "a later batch")
    assert not inst.stale_reason, inst.stale_reason
