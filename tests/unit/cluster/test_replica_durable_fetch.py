"""A follower under the durable flush policy reports as its fetch offset (its position
for the leader's high watermark) only what it has fsynced: a fake leader records, at
each Fetch, the offset asked for and the follower log's flushed offset at that moment.
Without the policy the follower reports what it wrote, fsynced or not (the control
that shows the check can fail); a failed fsync keeps the partition out of the fetch."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace as NS

from semel.cluster.replica_fetcher import FetchSettings, LeaderFetcher
from semel.cluster.state import BrokerInfo
from semel.protocol.records import build_batch
from semel.storage import LogManager
from semel.storage.errors import StorageError
from semel.storage.flusher import GroupCommitFlusher

BATCHES = 5


class Leader:
    """Serves one batch per fetch offset; records (fetch offset, follower's flushed offset)."""

    def __init__(self, logs: LogManager):
        self.logs = logs
        self.seen: list[tuple[int, int]] = []

    async def connect(self, info, client_id):
        return self

    def close(self):
        pass

    async def call(self, api, version, timeout, **kw):
        p = kw["topics"][0].partitions[0]
        self.seen.append((p.fetch_offset, self.logs.get("t", 0).flushed_offset))
        records = build_batch([(None, b"v%d" % p.fetch_offset)], base_offset=p.fetch_offset) \
            if p.fetch_offset < BATCHES else b""
        if not records:
            await asyncio.sleep(0.01)
        part = NS(partition_index=0, error_code=0, log_start_offset=0, high_watermark=p.fetch_offset,
                  diverging_epoch=None, records=records)
        return NS(error_code=0, responses=[NS(topic="t", partitions=[part])])


def follow(tmp_path, durable) -> Leader:
    logs = LogManager(tmp_path)
    logs.create_topic("t", 1)
    logs.get("t", 0).epochs.assign(0, 0)      # a log with an epoch: no OffsetForLeaderEpoch round first
    leader = Leader(logs)
    view = NS(node_id=1, brokers=lambda: {0: BrokerInfo(0, "127.0.0.1", 1)})

    async def run():
        fetcher = LeaderFetcher(0, view, logs, leader, FetchSettings(10, 1 << 20, 1 << 20, 5.0), lambda: False,
                                durable=durable() if durable else None)
        fetcher.add(("t", 0), 0)
        try:
            while not any(off >= BATCHES for off, _ in leader.seen):
                await asyncio.sleep(0.005)
        finally:
            await fetcher.close()

    asyncio.run(asyncio.wait_for(run(), 20))
    return leader


def test_a_durable_follower_reports_only_what_it_fsynced(tmp_path):
    leader = follow(tmp_path, lambda: GroupCommitFlusher().sync_each)
    assert [off for off, _ in leader.seen][-1] == BATCHES
    assert all(off <= flushed for off, flushed in leader.seen), leader.seen


def test_without_the_policy_a_follower_reports_unsynced_writes(tmp_path):
    leader = follow(tmp_path, None)
    assert any(off > flushed for off, flushed in leader.seen), leader.seen


def test_a_failed_fsync_keeps_the_partition_out_until_one_succeeds(tmp_path):
    calls = []

    def failing_first():
        flusher = GroupCommitFlusher()

        async def durable(targets):
            calls.append([upto for _, upto in targets])
            if len(calls) <= 2:
                return [StorageError("disk said no") for _ in targets]
            return await flusher.sync_each(targets)
        return durable

    leader = follow(tmp_path, failing_first)
    assert len(calls) > 2
    assert all(off <= flushed for off, flushed in leader.seen), leader.seen
