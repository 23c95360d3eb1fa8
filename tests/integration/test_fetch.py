"""Fetch semantics on a real broker: response size cap, whole batches, long poll."""
from __future__ import annotations

import threading

from semel.client import Client
from semel.protocol import records
from semel.protocol.errors import KafkaError
from tests.support.brokers import module_broker_fixture

# One broker for the module (each test has its own topic), overriding the per-test one.
broker = module_broker_fixture("fetch")

BATCH = records.build_batch([(None, b"v" * 1024)] * 64)   # ~66 KiB


def test_responses_are_capped_and_whole_batches_cover_everything(broker):
    with Client(broker.bootstrap) as c:
        c.create_topic("big", 1)
        for _ in range(150):                                  # ~10 MiB
            assert c.produce("big", 0, BATCH)[0] == KafkaError.NONE
        offset, seen, sizes = 0, 0, []
        while offset < 150 * 64:
            f = c.fetch("big", 0, offset, max_bytes=50 * 1024 * 1024)
            assert f.error == KafkaError.NONE and f.records
            sizes.append(len(f.records))
            for _, hdr in records.iter_batches(f.records):
                assert hdr.base_offset == offset              # contiguous, whole batches only
                offset = hdr.next_offset
                seen += hdr.record_count
        assert seen == 150 * 64
        assert max(sizes) <= 4 * 1024 * 1024 + len(BATCH)     # broker cap: 4 MiB (+ one batch)
        assert len(sizes) >= 3


def test_long_poll_wakes_on_append(broker):
    with Client(broker.bootstrap) as c:
        c.create_topic("poll", 1)
    result = {}

    def waiter():
        with Client(broker.bootstrap) as c:
            result["f"] = c.fetch("poll", 0, 0, max_wait_ms=20_000, min_bytes=1)

    t = threading.Thread(target=waiter)
    t.start()
    with Client(broker.bootstrap) as c:
        assert c.produce("poll", 0, records.build_batch([(None, b"wake")]))[0] == KafkaError.NONE
    t.join(15)
    assert not t.is_alive(), "the waiting fetch was not woken by the append"
    assert [r.value for r in records.iter_records(result["f"].records)] == [b"wake"]


def test_min_bytes_zero_is_answered_at_once(broker):
    """Kafka answers a Fetch with min_bytes=0 at once even when nothing is there; treating
    0 like 1 would hold it for max_wait_ms (here ~24 days)."""
    with Client(broker.bootstrap) as c:
        c.create_topic("zero-wait", 1)
    result = {}

    def fetcher():
        with Client(broker.bootstrap) as c:
            result["f"] = c.fetch("zero-wait", 0, 0, max_wait_ms=2**31 - 1, min_bytes=0)

    t = threading.Thread(target=fetcher, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "an empty Fetch with min_bytes=0 waited for max_wait_ms"
    assert result["f"].error == KafkaError.NONE and result["f"].records == b""
