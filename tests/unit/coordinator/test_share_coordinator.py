"""The share coordinator on the real storage layer: share-partition state written
through the runtime's log comes back by replay after a crash (files abandoned without
close), acquired records come back available, and a compaction rewrite keeps exactly
the live state while dropping the history before it."""
from __future__ import annotations

from test_group_support import FakeClock, async_test

from semel.coordinator.ports import LocalSeat
from semel.coordinator.share_coordinator import SHARE_TOPIC, ShareCoordinator
from semel.coordinator.share_partition import ACK_ACCEPT, ACK_REJECT, ACKNOWLEDGED, ARCHIVED, AVAILABLE
from semel.protocol.errors import KafkaError
from semel.storage.flusher import GroupCommitFlusher
from semel.storage.fs import FaultyFileSystem
from semel.storage.log_config import LogConfig
from semel.storage.manager import LogManager


class Node:
    def __init__(self, data_dir, clock=None):
        self.fs = FaultyFileSystem()
        self.logs = LogManager(data_dir, LogConfig(segment_bytes=4096), self.fs)
        self.clock = clock or FakeClock()
        seat = LocalSeat(self.logs, SHARE_TOPIC, ShareCoordinator.log_configs(4096))
        self.share = ShareCoordinator(GroupCommitFlusher(), seat=seat, clock=self.clock, compact_records=20,
                                      compact_interval_s=3600)

    async def start(self):
        await self.share.start()
        self.share.start_seat()
        return self

    async def crash(self):
        await self.share.stop()
        for _, plog in self.logs.all_logs():
            plog.abandon()


def _states(share, group="g", topic="t", p=0):
    sp = share.state.partition(group, topic, p)
    return sp.start, sp.end, {off: (r.state, r.count) for off, r in sp.records.items()}


async def _acquire_and_ack(share, n_rounds, group="g"):
    limits = share.state.limits(group)
    sp = share.share_partition(group, "t", 0, lambda reset: 0)
    for i in range(n_rounds):
        got = sp.acquire("m", 4 * (i + 1), 4, share.clock(), limits)
        first, last = got[0][0], got[-1][1]
        kind = ACK_REJECT if i % 3 == 0 else ACK_ACCEPT
        # the last round stays acquired: its records must come back available
        if i < n_rounds - 1:
            assert sp.acknowledge("m", first, last, [kind], limits) == KafkaError.NONE
        assert await share.persist(share.partition_records(group, [("t", 0)])) == KafkaError.NONE


@async_test
async def test_state_survives_a_crash_and_acquired_records_come_back(tmp_path):
    node = await Node(tmp_path).start()
    set_err, _ = await node.share.alter_configs("g", {"share.delivery.count.limit": "3"}, False)
    assert set_err == KafkaError.NONE
    await _acquire_and_ack(node.share, 5)
    await node.crash()
    again = await Node(tmp_path).start()
    start, end, records = _states(again.share)
    assert (start, end) == (16, 20)
    assert records == {off: (AVAILABLE, 1) for off in range(16, 20)}   # held at the crash
    assert again.share.state.config("g", "share.delivery.count.limit") == "3"


@async_test
async def test_compaction_keeps_the_live_state_and_drops_the_history(tmp_path):
    node = await Node(tmp_path).start()
    await _acquire_and_ack(node.share, 40)
    sp = node.share.state.partition("g", "t", 0)
    limits = node.share.state.limits("g")
    # leave a finished record behind an unfinished one, so the window holds both kinds
    got = sp.acquire("m", 200, 2, node.clock(), limits)
    second = got[0][0] + 1
    assert sp.acknowledge("m", second, second, [ACK_ACCEPT], limits) == KafkaError.NONE
    await node.share.persist(node.share.partition_records("g", [("t", 0)]))
    before = _states(node.share)
    plog = node.logs.get(SHARE_TOPIC, 0)
    segments = len(plog.segment_bases)
    assert await node.share.compact()
    assert len(plog.segment_bases) < segments
    assert node.share.runtime.log.records_since_compaction == 1
    await node.crash()
    again = await Node(tmp_path).start()
    after = _states(again.share)
    assert after[:2] == before[:2]
    assert {o: s for o, (s, _) in after[2].items()} == {
        o: (AVAILABLE if s not in (ACKNOWLEDGED, ARCHIVED) else s) for o, (s, _) in before[2].items()}
