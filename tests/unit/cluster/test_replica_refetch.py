"""A follower's refetch of a partition whose answers keep failing: a leader (a fake
connection: the fetcher's peer interface) serves a batch whose CRC fails, a few times,
then good bytes; the follower's log is a real one. The partition is refetched after
delays that grow by the shared Backoff, the good batch is appended, and the next
failure starts from the first delay again. The warning rule on a fake clock."""
from __future__ import annotations

import asyncio
import logging
import math
from types import SimpleNamespace as NS

from semel.backoff import Backoff
from semel.cluster.replica_fetcher import FetchSettings, LeaderFetcher, RefusedPartition
from semel.cluster.state import BrokerInfo
from semel.protocol.api_keys import ApiKey
from semel.protocol.records import build_batch
from semel.storage import LogManager
from tests.support.memcluster import all_bytes

FIRST_S, MAX_S = 0.02, 0.16


def damaged(batch: bytes) -> bytes:
    return batch[:-1] + bytes([batch[-1] ^ 0xFF])      # a record's last byte: only the CRC tells


class Leader:
    """Answers the follower's Fetch at each offset from a script of batches (damaged
    ones first), then with nothing after a short long-poll; records when each came."""

    def __init__(self, script: dict[int, list[bytes]]):
        self.script = script
        self.fetched: list[tuple[int, float]] = []      # (fetch offset, loop time)

    async def connect(self, info, client_id):
        return self

    def close(self):
        pass

    async def call(self, api, version, timeout, **kw):
        p = kw["topics"][0].partitions[0]
        if api == ApiKey.OFFSET_FOR_LEADER_EPOCH:    # no epoch in common: the follower keeps what is committed
            return NS(topics=[NS(topic="t", partitions=[NS(partition=0, error_code=0, leader_epoch=-1,
                                                           end_offset=-1)])])
        self.fetched.append((p.fetch_offset, asyncio.get_running_loop().time()))
        answers = self.script.get(p.fetch_offset)
        records = answers.pop(0) if answers else b""
        if not records:
            await asyncio.sleep(0.01)
        part = NS(partition_index=0, error_code=0, log_start_offset=0, high_watermark=2, diverging_epoch=None,
                  records=records)
        return NS(error_code=0, responses=[NS(topic="t", partitions=[part])])


def test_refetch_delays_grow_then_restart_after_a_good_answer(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="semel.cluster.replica_fetcher")
    first, second = build_batch([(None, b"first")], base_offset=0), build_batch([(None, b"second")], base_offset=1)
    leader = Leader({0: [damaged(first)] * 5 + [first], 1: [damaged(second)] * 2 + [second]})
    delays: list[float] = []

    class Paced(Backoff):
        def step(self) -> float:
            delays.append(super().step())
            return delays[-1]

    logs = LogManager(tmp_path)
    logs.create_topic("t", 1)
    view = NS(node_id=1, brokers=lambda: {0: BrokerInfo(0, "127.0.0.1", 1)})

    async def follow():
        fetcher = LeaderFetcher(0, view, logs, leader, FetchSettings(10, 1 << 20, 1 << 20, 5.0), lambda: False,
                                pace=lambda: Paced(math.inf, first_s=FIRST_S, max_s=MAX_S, rand=lambda: 0.5))
        fetcher.add(("t", 0), 0)
        try:
            while logs.get("t", 0).log_end_offset < 2:
                await asyncio.sleep(0.01)
            return fetcher.parts[("t", 0)].refused
        finally:
            await fetcher.close()
    assert asyncio.run(follow()) is None                 # the good answer ended the refetch pacing
    # Five failures at offset 0 double the delay up to the cap; the good batch resets it,
    # so the two failures at offset 1 start from the first delay again.
    assert delays == [0.02, 0.04, 0.08, 0.16, 0.16, 0.02, 0.04]
    at0 = [t for off, t in leader.fetched if off == 0]
    at1 = [t for off, t in leader.fetched if off == 1]
    assert len(at0) == 6 and len(at1) == 3
    gaps = [b - a for a, b in zip(at0, at0[1:])] + [b - a for a, b in zip(at1, at1[1:])]
    assert all(gap >= d - 0.001 for gap, d in zip(gaps, delays)), (gaps, delays)
    assert all_bytes(logs.get("t", 0)) == first + second
    messages = [r.getMessage() for r in caplog.records]
    assert messages and all("CORRUPT_MESSAGE" in m for m in messages)
    logs.close()


class Clock:
    def __init__(self):
        self.now = 64.0

    def __call__(self) -> float:
        return self.now


def test_a_lasting_failure_is_reported_when_it_starts_then_once_per_cap_with_a_count():
    clock = Clock()
    refused = RefusedPartition(Backoff(math.inf, first_s=0.25, max_s=2.0, clock=clock, rand=lambda: 0.5), clock)
    assert refused.ready()
    reports = []
    for _ in range(8):
        reports.append(refused.failed())
        assert not refused.ready()
        clock.now = refused.retry_at
        assert refused.ready()
    # Failures at 0, .25, .75, 1.75, 3.75, 5.75...: reported at once, then the first
    # failure at least 2 s (the cap) after the last report, with the count since.
    assert reports == [1, 0, 0, 0, 4, 1, 1, 1]
