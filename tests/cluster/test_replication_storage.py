"""Storage for replication: the leader-epoch cache, appends of a leader's batches as
given (PartitionLog.append_replicated) and truncation of a replica (truncate_to),
each with producer state, the aborted-transaction index and crash safety."""
from __future__ import annotations

import pytest

from semel.protocol.errors import KafkaError
from semel.protocol.records import CONTROL_ABORT, CONTROL_COMMIT, build_batch, iter_batches, split_batches
from semel.storage import FaultyFileSystem, LogConfig, PartitionLog
from semel.storage.errors import AppendError
from semel.storage.leader_epoch import FILE_NAME, LeaderEpochCache, decode, encode
from tests.support.memcluster import all_bytes

CFG = LogConfig(segment_bytes=1024, index_interval_bytes=64)


@pytest.fixture
def fs():
    return FaultyFileSystem()


@pytest.fixture
def open_log(tmp_path, fs):
    opened = []

    def make(name: str) -> PartitionLog:
        plog = PartitionLog.open(tmp_path / name, CFG, fs)
        opened.append(plog)
        return plog
    yield make
    for plog in opened:
        if not plog.closed:
            plog.close()


def put(plog: PartitionLog, value: bytes, **kw) -> int:
    data = build_batch([(None, value)], timestamp_ms=kw.pop("ts", 1000), **kw)
    return plog.append(data, split_batches(data)[0]).first_offset


def replicate(src: PartitionLog, dst: PartitionLog) -> None:
    while dst.log_end_offset < src.log_end_offset:
        dst.append_replicated(src.read(dst.log_end_offset, 300))


# ---------------------------------------------------------------- the epoch cache
def test_end_offset_for_follows_kip_279(tmp_path, fs):
    cache = LeaderEpochCache(fs, tmp_path, [(1, 0), (3, 10), (4, 25)])
    assert cache.end_offset_for(4, 40) == (4, 40)        # latest epoch: the log end
    assert cache.end_offset_for(3, 40) == (3, 25)        # ends where the next epoch starts
    assert cache.end_offset_for(2, 40) == (1, 10)        # unknown here: the largest epoch below it
    assert cache.end_offset_for(0, 40) == (0, 0)         # before the first epoch: its start
    assert cache.end_offset_for(5, 40) == (-1, -1)       # above every epoch: undefined
    assert LeaderEpochCache(fs, tmp_path).end_offset_for(0, 40) == (-1, -1)


def test_assign_and_truncate_persist_atomically(tmp_path, fs):
    cache = LeaderEpochCache(fs, tmp_path)
    assert cache.assign(2, 0) and cache.assign(5, 7)
    assert not cache.assign(5, 9) and not cache.assign(3, 9)  # older or same epoch: already started
    assert LeaderEpochCache.load(fs, tmp_path).entries == [(2, 0), (5, 7)]
    cache.truncate_from_end(7)
    assert LeaderEpochCache.load(fs, tmp_path).entries == [(2, 0)]
    fs.fail_next_rename(1, FILE_NAME)
    with pytest.raises(OSError):
        cache.assign(9, 3)
    assert LeaderEpochCache.load(fs, tmp_path).entries == [(2, 0)]   # the old file stands


def test_damaged_cache_reads_as_empty(tmp_path, fs):
    data = bytearray(encode([(1, 0), (2, 5)]))
    assert decode(bytes(data)) == [(1, 0), (2, 5)]
    data[-2] ^= 1
    (tmp_path / FILE_NAME).write_bytes(bytes(data))
    assert LeaderEpochCache.load(fs, tmp_path).entries == []
    assert decode(encode([(2, 0), (1, 5)])) is None      # epochs must grow


# ---------------------------------------------------------------- leader and follower logs
def test_leader_stamps_its_epoch_and_follower_keeps_bytes_and_producer_state(open_log):
    leader, follower = open_log("leader"), open_log("follower")
    put(leader, b"before")                           # single-node style: no stamping
    leader.set_leader_epoch(4)
    for seq in range(30):
        put(leader, b"v%d" % seq, producer_id=7, producer_epoch=0, base_sequence=seq)
    assert leader.epochs.entries == [(4, 1)]
    replicate(leader, follower)
    assert all_bytes(follower) == all_bytes(leader)
    assert len(follower.segment_bases) > 1                        # rolled like the leader
    assert [h.leader_epoch for _, h in iter_batches(all_bytes(follower))][1:] == [4] * 30
    assert follower.epochs.entries == [(4, 1)]
    # The follower recognises a retry as the leader would (it may lead next).
    retry = build_batch([(None, b"v29")], timestamp_ms=1000, producer_id=7, producer_epoch=0, base_sequence=29)
    info = follower.append(retry, split_batches(retry)[0])
    assert info.duplicate and info.first_offset == 30


def test_follower_builds_aborted_index_and_lso(open_log):
    leader, follower = open_log("leader"), open_log("follower")
    leader.set_leader_epoch(0)
    put(leader, b"a", producer_id=1, producer_epoch=0, base_sequence=0, transactional=True)
    put(leader, b"b", producer_id=2, producer_epoch=0, base_sequence=0, transactional=True)
    leader.append_control(CONTROL_ABORT, 1, 0, 0)
    put(leader, b"c", producer_id=3, producer_epoch=0, base_sequence=0, transactional=True)
    leader.append_control(CONTROL_COMMIT, 2, 0, 0)
    replicate(leader, follower)
    follower.set_high_watermark(follower.log_end_offset)
    assert follower.aborted_transactions(0, follower.log_end_offset) == [(1, 0)]
    assert follower.last_stable_offset == 3           # producer 3's transaction is still open
    assert follower.producers.ongoing_first_offsets() == {3: 3}


def test_replicated_append_must_continue_the_log(open_log):
    leader, follower = open_log("leader"), open_log("follower")
    for i in range(3):
        put(leader, b"x%d" % i)
    with pytest.raises(AppendError) as exc:
        follower.append_replicated(leader.read(1, 1 << 20))
    assert exc.value.error == KafkaError.OFFSET_OUT_OF_RANGE
    assert follower.log_end_offset == 0


def test_replicated_batch_with_a_wrong_crc_is_refused_whole(open_log):
    """The follower checks every fetched batch's CRC-32C before it writes: one damaged
    batch refuses the whole fetch, and nothing of it reaches the log or its state."""
    leader, follower = open_log("leader"), open_log("follower")
    leader.set_leader_epoch(2)
    for seq in range(3):
        put(leader, b"v%d" % seq, producer_id=5, producer_epoch=0, base_sequence=seq)
    fetched = bytearray(leader.read(0, 1 << 20))
    fetched[-1] ^= 0x01                              # one bit in the last batch's last record
    with pytest.raises(AppendError) as exc:
        follower.append_replicated(memoryview(fetched))
    assert exc.value.error == KafkaError.CORRUPT_MESSAGE
    assert (follower.log_end_offset, follower.size_bytes(), follower.producers.entry(5)) == (0, 0, None)
    follower.append_replicated(memoryview(bytearray(leader.read(0, 1 << 20))))   # the intact bytes: taken as given
    assert all_bytes(follower) == all_bytes(leader)


def test_truncate_cuts_segments_state_and_epochs_and_survives_reopen(open_log, tmp_path, fs):
    log = open_log("replica")
    log.set_leader_epoch(1)
    for seq in range(20):
        put(log, b"e1-%d" % seq, producer_id=9, producer_epoch=0, base_sequence=seq)
    put(log, b"t", producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    log.append_control(CONTROL_ABORT, 5, 0, 0)
    log.set_leader_epoch(2)
    for seq in range(20, 30):
        put(log, b"e2-%d" % seq, producer_id=9, producer_epoch=0, base_sequence=seq)
    log.flush(checkpoint=True)
    assert log.epochs.entries == [(1, 0), (2, 22)]
    kept = all_bytes(log)
    assert log.truncate_to(12) == 12
    assert all_bytes(log) == kept[:len(all_bytes(log))]
    assert log.epochs.entries == [(1, 0)]
    assert log.producers.entry(9).batches[-1][1] == 11        # sequence state back at offset 11
    assert log.aborted_transactions(0, 100) == []
    assert log.producers.entry(5) is None
    log.set_leader_epoch(None)
    again = build_batch([(None, b"e1-12")], timestamp_ms=1000, producer_id=9, producer_epoch=0, base_sequence=12)
    assert log.append(again, split_batches(again)[0]).first_offset == 12   # no longer a duplicate
    log.epochs.assign(7, 13)                 # led epoch 7 and wrote nothing in it
    assert log.truncate_to(13) == 13 and log.epochs.entries == [(1, 0)]
    log.close()
    reopened = open_log("replica")
    assert reopened.log_end_offset == 13
    assert reopened.epochs.entries == [(1, 0)]
    assert reopened.producers.entry(9).batches[-1][1] == 12


def test_follower_log_refuses_local_writes(open_log):
    log = open_log("replica")
    log.set_follower(True)
    data = build_batch([(None, b"x")], timestamp_ms=1)
    for write in (lambda: log.append(data, split_batches(data)[0]),
                  lambda: log.append_control(CONTROL_COMMIT, 1, 0, 0)):
        with pytest.raises(AppendError) as exc:
            write()
        assert exc.value.error == KafkaError.NOT_LEADER_OR_FOLLOWER
    assert log.log_end_offset == 0
    log.append_replicated(data)                     # what the leader sends still goes in
    assert log.log_end_offset == 1


def test_high_watermark_is_the_replicated_one_in_a_cluster(open_log):
    log = open_log("replica")
    for i in range(5):
        put(log, b"x%d" % i)
    assert log.high_watermark == 5                   # single node: the log end
    log.set_high_watermark(3)
    assert log.high_watermark == 3 and log.last_stable_offset == 3
    assert len(list(iter_batches(log.read(0, 1 << 20, log.high_watermark)))) == 3


def test_reset_starts_over_at_the_leaders_log_start_and_survives_reopen(open_log):
    leader, follower = open_log("leader"), open_log("follower")
    put(follower, b"old", producer_id=3, producer_epoch=0, base_sequence=0)
    follower.epochs.assign(0, 0)
    leader.set_leader_epoch(1)
    data = build_batch([(None, b"a"), (None, b"b"), (None, b"c")], timestamp_ms=1)
    leader.append(data, split_batches(data)[0])              # offsets 0..2 in one batch
    put(leader, b"d")
    leader.set_high_watermark(leader.log_end_offset)
    assert leader.delete_records_before(2) == 2
    follower.reset_to(2)
    assert (follower.log_start_offset, follower.log_end_offset) == (2, 2)
    assert follower.producers.entry(3) is None and follower.epochs.entries == []
    replicate(leader, follower)                              # the batch at 0..2 straddles the start: kept whole
    assert follower.read(2, 1 << 20) == leader.read(2, 1 << 20)
    follower.close()
    again = open_log("follower")
    assert (again.log_start_offset, again.log_end_offset) == (2, 4)
    assert again.epochs.entries == [(1, 0)]
    with pytest.raises(ValueError):
        again.reset_to(3)                                     # never backwards over records it holds

