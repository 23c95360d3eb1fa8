"""After a failed fsync the log's unflushed tail is untrusted and cut back before the
next write (storage/fsync_repair.py), with the file system dropping the failed
fsync's pages as Linux may ("fsyncgate": FaultyFileSystem's drop=True)."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from storage_helpers import append, batch, segment_path, values

from semel.protocol.records import CONTROL_COMMIT
from semel.storage import FaultyFileSystem, FileSystem, LogConfig, PartitionLog, StorageError, fs_from_env
from semel.storage.flusher import GroupCommitFlusher

CFG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=128,
                checkpoint_interval_bytes=1 << 40, checkpoint_interval_ms=1 << 40)
PID = 7


def produce(plog: PartitionLog, seq: int, value: bytes):
    return append(plog, batch(value, pid=PID, epoch=0, seq=seq))


def test_dropped_pages_are_cut_back_and_the_retry_is_stored_again_exactly_once(p, fs):
    produce(p, 0, b"v0")
    assert p.flush() == 1
    synced_size = p.size_bytes()
    first = produce(p, 1, b"v1")
    fs.fail_next_fsync(path_contains=".log", drop=True)
    with pytest.raises(StorageError):
        p.flush()
    on_disk = segment_path(p.directory, 0).read_bytes()
    assert on_disk[synced_size:] == bytes(len(on_disk) - synced_size)   # v1's pages are gone
    with pytest.raises(StorageError):
        p.flush()                   # the disk works again, but no fsync vouches for v1
    assert p.flushed_offset == 1 and p.log_end_offset == 2
    with pytest.raises(StorageError):
        asyncio.run(GroupCommitFlusher().sync(p, 2, stamp=first.fsync_stamp))
    retry = produce(p, 1, b"v1")    # the producer's retry: written again, not a duplicate
    assert not retry.duplicate and retry.first_offset == 1
    assert produce(p, 2, b"v2").first_offset == 2
    assert p.flush() == 3
    assert produce(p, 1, b"v1").duplicate    # producer state was rebuilt from the cut log
    p.abandon()                     # killed: only what is on disk counts
    again = PartitionLog.open(p.directory, CFG, FileSystem())
    try:
        assert values(again) == [(0, b"v0"), (1, b"v1"), (2, b"v2")]
    finally:
        again.close()


def test_a_waiter_for_a_cut_record_fails_though_its_offset_was_written_again(p, fs):
    """Offsets are reused after a cut-back: a late waiter for the cut record must not be
    told durable by the retry's fsync at the same offset (the stamp tells them apart)."""
    produce(p, 0, b"v0")
    p.flush()
    cut = produce(p, 1, b"v1")
    fs.fail_next_fsync(path_contains=".log", drop=True)
    with pytest.raises(StorageError):
        p.flush()
    retry = append(p, batch(b"other", pid=PID + 1, epoch=0, seq=0))
    assert retry.first_offset == cut.first_offset
    assert p.flush() == 2

    async def waits():
        flusher = GroupCommitFlusher()
        await flusher.sync(p, 2, stamp=retry.fsync_stamp)
        with pytest.raises(StorageError):
            await flusher.sync(p, 2, stamp=cut.fsync_stamp)
    asyncio.run(waits())


def test_the_cut_back_rebuilds_transactions_and_the_lso(p, fs):
    t = append(p, batch(b"t0", pid=9, epoch=0, seq=0, txn=True))
    p.flush()
    assert p.last_stable_offset == t.first_offset
    p.append_control(CONTROL_COMMIT, 9, 0, 0)
    assert p.last_stable_offset == p.log_end_offset == 2
    fs.fail_next_fsync(path_contains=".log", drop=True)
    with pytest.raises(StorageError):
        p.flush()
    p.check_writable()              # what every write does first: the marker is cut back
    assert p.log_end_offset == 1 and p.last_stable_offset == t.first_offset   # open again
    p.append_control(CONTROL_COMMIT, 9, 0, 0)
    assert p.log_end_offset == 2 and p.last_stable_offset == 2
    assert p.flush() == 2


def test_a_cut_back_that_fails_takes_the_log_offline(p, fs):
    produce(p, 0, b"v0")
    fs.fail_next_fsync(path_contains=".log")
    with pytest.raises(StorageError):
        p.flush()
    fs.fail_next_fsync(path_contains=".log")     # the truncation's own fsync
    with pytest.raises(StorageError):
        produce(p, 0, b"v0")
    assert p.failed_reason is not None
    with pytest.raises(StorageError):
        produce(p, 0, b"v0")


@pytest.mark.parametrize("role", ["cluster", "interval"])
def test_a_cluster_replica_or_an_interval_log_keeps_its_tail(tmp_path, role):
    """In a cluster the broker takes the partition offline instead (semel.cluster.offline);
    under flush_mode "interval" records were acknowledged and readable before their
    fsync, so nothing is cut and the next fsync is trusted as before."""
    fs = FaultyFileSystem()
    plog = PartitionLog.open(tmp_path / "l", replace(CFG, flush_mode="interval") if role == "interval" else CFG, fs)
    try:
        if role == "cluster":
            plog.set_high_watermark(0)
        produce(plog, 0, b"v0")
        fs.fail_next_fsync(path_contains=".log", drop=True)
        with pytest.raises(StorageError):
            plog.flush()
        assert plog.fsync_failures == 1 and plog.fsync_repair.trusted
        assert produce(plog, 1, b"v1").first_offset == 1
        assert plog.flush() == 2
    finally:
        plog.close()


def test_drop_is_a_fault_spec_key(tmp_path):
    fs = fs_from_env({"SEMEL_FS_FAULTS": "fail_next_fsync=1,drop=1,path_contains=.log"})
    plog = PartitionLog.open(tmp_path / "e", CFG, fs)
    try:
        produce(plog, 0, b"v0")
        with pytest.raises(StorageError):
            plog.flush()
        assert segment_path(plog.directory, 0).read_bytes().strip(b"\0") == b""
    finally:
        plog.close()
