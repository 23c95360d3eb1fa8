"""The coordinator on the real storage layer: offsets flushed before the answer,
kept across a clean restart and a crash (files abandoned without close), and disk
faults that leave both the log and memory unchanged."""

import pytest
from test_group_coordinator import stable_group
from test_group_support import FakeClock, async_test, config

from tests.support.coordinators import group_coordinator, start
from semel.coordinator.group import OFFSETS_TOPIC
from semel.protocol.errors import KafkaError
from semel.storage.flusher import GroupCommitFlusher
from semel.storage.fs import FaultyFileSystem
from semel.storage.log_config import LogConfig
from semel.storage.manager import LogManager

PID = 77


class Node:
    """One broker's worth of storage + coordinator on a data directory."""

    def __init__(self, data_dir, clock=None):
        self.fs = FaultyFileSystem()
        self.logs = LogManager(data_dir, LogConfig(segment_bytes=4096), self.fs)
        self.flusher = GroupCommitFlusher()
        self.clock = clock or FakeClock()
        self.coord = group_coordinator(self.logs, self.flusher, config(), self.clock, run_timers=False)

    async def start(self):
        await start(self.coord)
        self.log = self.logs.get(OFFSETS_TOPIC, 0)
        return self

    async def close(self):
        await self.coord.stop()
        self.logs.close()

    async def crash(self):
        """Stop without flushing or checkpointing anything."""
        await self.coord.stop()
        for _, plog in self.logs.all_logs():
            plog.abandon()

    def fetch(self, group, tps=None, stable=False):
        err, rows = self.coord.fetch_offsets(group, tps, stable)
        assert err == KafkaError.NONE
        return {(r.topic, r.partition): (r.offset, r.metadata, r.error) for r in rows}


async def commit_many(node, n, group="g"):
    futs = [node.coord.commit_offsets(group, -1, "", {("t", i % 3): (i, -1, f"m{i}")}) for i in range(n)]
    for f in futs:
        assert set((await f).values()) == {KafkaError.NONE}


@async_test
async def test_offsets_topic_is_internal_and_never_deleted_by_retention(tmp_path):
    node = await Node(tmp_path).start()
    info = node.logs.topics()[OFFSETS_TOPIC]
    assert info.internal and info.partitions == 1
    assert info.config["retention.ms"] == "-1" and info.config["cleanup.policy"] == "compact"
    await node.close()


@async_test
async def test_commit_is_fsynced_before_the_answer(tmp_path):
    node = await Node(tmp_path).start()
    fsyncs = node.fs.count("fsync", OFFSETS_TOPIC)
    res = await node.coord.commit_offsets("g", -1, "", {("t", 0): (5, -1, "")})
    assert res[("t", 0)] == KafkaError.NONE
    assert node.log.flushed_offset >= node.log.log_end_offset
    assert node.fs.count("fsync", OFFSETS_TOPIC) > fsyncs
    await node.close()


@async_test
async def test_concurrent_commits_share_fsyncs(tmp_path):
    node = await Node(tmp_path).start()
    before = node.flusher.rounds
    await commit_many(node, 50)
    assert node.flusher.rounds - before < 50
    await node.close()


@pytest.mark.parametrize("ending", ["close", "crash"])
@async_test
async def test_offsets_survive_restart(tmp_path, ending):
    node = await Node(tmp_path).start()
    await commit_many(node, 40)       # several segments of 4 KiB
    a, b = await stable_group(node, group="g2")
    await node.coord.commit_offsets("g2", 1, a.member_id, {("u", 1): (7, -1, "x")})
    expected = {g: node.fetch(g) for g in ("g", "g2")}
    await (node.close() if ending == "close" else node.crash())
    again = await Node(tmp_path, node.clock).start()
    assert {g: again.fetch(g) for g in ("g", "g2")} == expected
    assert again.fetch("g")[("t", 0)][0] == 39
    # the group snapshot came back too: members can keep committing
    res = await again.coord.commit_offsets("g2", 1, b.member_id, {("u", 1): (8, -1, "")})
    assert res[("u", 1)] == KafkaError.NONE
    await again.close()


@async_test
async def test_write_failure_leaves_log_and_memory_unchanged(tmp_path):
    node = await Node(tmp_path).start()
    await node.coord.commit_offsets("g", -1, "", {("t", 0): (5, -1, "")})
    leo = node.log.log_end_offset
    node.fs.fail_next_write(1, OFFSETS_TOPIC)
    res = await node.coord.commit_offsets("g", -1, "", {("t", 0): (6, -1, "")})
    assert res[("t", 0)] == KafkaError.COORDINATOR_NOT_AVAILABLE
    assert node.log.log_end_offset == leo
    assert node.fetch("g")[("t", 0)][0] == 5
    await node.close()
    again = await Node(tmp_path).start()
    assert again.fetch("g")[("t", 0)][0] == 5
    await again.close()


@async_test
async def test_fsync_failure_answers_error_and_memory_is_unchanged(tmp_path):
    node = await Node(tmp_path).start()
    await node.coord.commit_offsets("g", -1, "", {("t", 0): (5, -1, "")})
    node.fs.fail_next_fsync(1, OFFSETS_TOPIC)
    res = await node.coord.commit_offsets("g", -1, "", {("t", 0): (6, -1, "")})
    assert res[("t", 0)] == KafkaError.COORDINATOR_NOT_AVAILABLE
    assert node.fetch("g")[("t", 0)][0] == 5
    await node.crash()


@async_test
async def test_transactional_offsets_with_real_markers_across_restart(tmp_path):
    node = await Node(tmp_path).start()
    await node.coord.commit_offsets("g", -1, "", {("t", 0): (1, -1, "")})
    res = await node.coord.txn_commit_offsets(PID, 0, "g", -1, "", None, {("t", 0): (10, -1, "")})
    assert res[("t", 0)] == KafkaError.NONE
    assert node.log.last_stable_offset < node.log.log_end_offset      # storage sees the open txn
    await node.crash()
    node = await Node(tmp_path).start()
    assert node.fetch("g", [("t", 0)], stable=True)[("t", 0)][2] == KafkaError.UNSTABLE_OFFSET_COMMIT
    # a newer epoch fences the old producer's marker (storage's producer state)
    res = await node.coord.txn_commit_offsets(PID, 1, "g", -1, "", None, {("t", 1): (3, -1, "")})
    assert res[("t", 1)] == KafkaError.NONE
    assert await node.coord.complete_txn(PID, 0, 0, True) == KafkaError.INVALID_PRODUCER_EPOCH
    assert await node.coord.complete_txn(PID, 1, 0, True) == KafkaError.NONE
    assert node.log.last_stable_offset == node.log.log_end_offset
    got = node.fetch("g", [("t", 0), ("t", 1)], stable=True)
    assert (got[("t", 0)][0], got[("t", 1)][0]) == (10, 3)
    await node.close()
    node = await Node(tmp_path).start()
    assert node.fetch("g", [("t", 0), ("t", 1)], stable=True) == got
    await node.close()


@async_test
async def test_garbage_in_the_offsets_log_refuses_to_start(tmp_path):
    from semel.protocol import records as rb
    node = await Node(tmp_path).start()
    data = rb.build_batch([(b"\x00\x63junk", b"value")])
    node.log.append(data, [(0, rb.parse_header(data))])
    await node.close()
    from semel.coordinator.offsets import OffsetsLogError
    again = Node(tmp_path)
    with pytest.raises(OffsetsLogError):
        await again.start()
    again.logs.close()
