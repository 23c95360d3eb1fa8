"""Disk failures injected through the file-system seam leave the log exactly as before."""
from __future__ import annotations

import errno
import os

import pytest
from storage_helpers import append, batch, dump, fill, segment_path

from semel.protocol.errors import KafkaError
from semel.storage import FaultyFileSystem, FileSystem, LogConfig, PartitionLog, StorageError, fs_from_env
from semel.storage.fs import parse_fault_spec

CFG = LogConfig(segment_bytes=4096, index_interval_bytes=200,
                checkpoint_interval_bytes=1 << 40, checkpoint_interval_ms=1 << 40)


def state(plog: PartitionLog):
    return (plog.log_start_offset, plog.log_end_offset, plog.size_bytes(), plog.segment_bases, dump(plog))


def assert_unchanged_after_reopen(plog: PartitionLog, fs: FaultyFileSystem, expected) -> None:
    fs.clear_faults()
    assert state(plog) == expected
    plog.close()
    again = PartitionLog.open(plog.directory, CFG, fs)
    assert state(again) == expected
    again.close()


@pytest.mark.parametrize("partial", [False, True])
def test_failed_write_changes_nothing(p, fs, partial):
    fill(p, 12)
    before = state(p)
    file_size = os.path.getsize(segment_path(p.directory, p.segment_bases[-1]))
    fs.fail_next_write(path_contains=".log", partial=partial)
    with pytest.raises(StorageError) as exc:
        append(p, batch([b"lost", b"too"]))
    assert exc.value.error == KafkaError.KAFKA_STORAGE_ERROR
    assert os.path.getsize(segment_path(p.directory, p.segment_bases[-1])) == file_size
    assert state(p) == before
    # the log keeps working: the next append gets the offsets the failed one would have had
    assert append(p, batch(b"ok")).first_offset == 12
    before = state(p)
    assert_unchanged_after_reopen(p, fs, before)


def test_full_disk_changes_nothing(p, fs):
    fill(p, 5)
    before = state(p)
    fs.enospc_after_bytes = 20      # the next data write hits a full disk halfway
    with pytest.raises(StorageError) as exc:
        append(p, batch(b"x" * 200))
    assert isinstance(exc.value.__cause__, OSError) and exc.value.__cause__.errno == errno.ENOSPC
    assert state(p) == before
    assert_unchanged_after_reopen(p, fs, before)


def test_failed_fsync_leaves_flushed_offset_and_cuts_the_tail_back_at_the_next_write(p, fs):
    """A failed fsync may have dropped the pages of everything past flushed_offset
    (storage/fsync_repair.py): no later fsync vouches for them, and the next write
    first cuts them back and writes after what is durable."""
    fill(p, 6)
    assert p.flush() == 6
    durable = state(p)
    fill(p, 4)
    before = state(p)
    fs.fail_next_fsync(path_contains=".log")
    with pytest.raises(StorageError):
        p.flush()
    assert p.flushed_offset == 6
    assert state(p) == before       # memory is cut back by the next write, not by the failure
    with pytest.raises(StorageError):
        p.flush()                   # a later fsync that works proves nothing about the tail
    assert p.flushed_offset == 6
    assert append(p, batch(b"again")).first_offset == 6
    assert state(p)[1:4] == (7, durable[2] + len(batch(b"again")), durable[3])
    assert p.flush() == 7
    assert_unchanged_after_reopen(p, fs, state(p))


def test_failed_fsync_at_roll_refuses_the_append(p, fs):
    fill(p, 3)
    while p.size_bytes() + 200 < CFG.segment_bytes:
        fill(p, 1)
    p.flush()      # durable: what the failed fsync leaves untrusted is only what follows
    before = state(p)
    fs.fail_next_fsync(path_contains=".log")
    with pytest.raises(StorageError):
        append(p, batch(b"r" * 150))     # needs a roll, whose fsync fails
    assert state(p) == before
    assert len(p.segment_bases) == 1
    assert append(p, batch(b"r" * 150)).first_offset == before[1]
    assert len(p.segment_bases) == 2
    assert_unchanged_after_reopen(p, fs, state(p))


def test_failed_index_write_at_roll_refuses_the_append(p, fs):
    while p.size_bytes() + 200 < CFG.segment_bytes:
        fill(p, 1)
    before = state(p)
    fs.fail_next_write(path_contains=".index")
    with pytest.raises(StorageError):
        append(p, batch(b"r" * 150))
    assert state(p) == before
    assert [n for n in os.listdir(p.directory) if n.endswith(".log")] == [segment_path(p.directory, 0).name]
    assert_unchanged_after_reopen(p, fs, before)


def test_failed_checkpoint_rename_does_not_fail_the_flush(p, fs):
    fill(p, 5)
    fs.fail_next_rename(path_contains="recovery.checkpoint")
    assert p.flush(checkpoint=True) == 5
    assert isinstance(p.checkpoints.last_error, OSError)
    assert not [n for n in os.listdir(p.directory) if n.endswith(".tmp")]
    assert p.flush(checkpoint=True) == 5
    assert p.checkpoints.last_error is None


def test_close_reports_a_failed_fsync(p, fs):
    fill(p, 5)
    fs.fail_next_fsync(path_contains=".log")
    with pytest.raises(StorageError):
        p.close()
    assert p.closed
    fs.clear_faults()
    q = PartitionLog.open(p.directory, CFG, fs)
    assert q.log_end_offset == 5     # data was written, only its fsync failed
    q.close()


class _NoTruncate(FaultyFileSystem):
    def truncate(self, f, size):
        if f.path.endswith(".log"):
            raise OSError(errno.EIO, "injected truncate failure", f.path)
        super().truncate(f, size)


def test_undo_failure_takes_the_log_offline_and_recovery_cleans_up(tmp_path):
    fs = _NoTruncate()
    p = PartitionLog.open(tmp_path / "t-0", CFG, fs)
    fill(p, 4)
    before = dump(p)
    fs.fail_next_write(path_contains=".log", partial=True)
    with pytest.raises(StorageError):
        append(p, batch(b"half" * 20))
    with pytest.raises(StorageError, match="offline"):
        append(p, batch(b"more"))
    assert dump(p) == before           # reads still work
    p.abandon()
    q = PartitionLog.open(tmp_path / "t-0", CFG, FileSystem())
    assert dump(q) == before           # the half-written batch was cut at recovery
    q.close()


def test_fs_from_env():
    assert type(fs_from_env({})) is FileSystem
    fs = fs_from_env({"SEMEL_FS_FAULTS": "fsync_delay_ms=50, enospc_after_bytes=1000000"})
    assert isinstance(fs, FaultyFileSystem)
    assert fs.fsync_delay_s == 0.05 and fs.enospc_after_bytes == 1_000_000
    fs = fs_from_env({"SEMEL_FS_FAULTS": "fail_next_fsync=2,path_contains=.log"})
    assert [(f.remaining, f.path_contains) for f in fs._faults["fsync"]] == [(2, ".log")]
    for bad in ("fsync_delay=5", "fsync_delay_ms", "fsync_delay_ms=abc", "enospc_after_bytes=-1"):
        with pytest.raises(ValueError, match="SEMEL_FS_FAULTS"):
            parse_fault_spec(bad)


def test_faults_aim_at_paths_and_count(tmp_path):
    fs = FaultyFileSystem()
    a, b = fs.open(tmp_path / "a.log"), fs.open(tmp_path / "b.index")
    fs.fail_next_write(2, path_contains=".index")
    fs.pwrite(a, b"fine", 0)
    for _ in range(2):
        with pytest.raises(OSError):
            fs.pwrite(b, b"no", 0)
    fs.pwrite(b, b"now", 0)
    fs.fsync(a)
    fs.fsync(b)
    assert fs.count("pwrite") == 4 and fs.count("pwrite", ".index") == 3
    assert fs.count("fsync", "a.log") == 1
    fs.close(a)
    fs.close(b)
    assert (tmp_path / "b.index").read_bytes() == b"now"


def test_write_atomic_keeps_the_old_content_when_rename_fails(tmp_path):
    fs = FaultyFileSystem()
    target = tmp_path / "cat"
    fs.write_atomic(target, b"old")
    fs.fail_next_rename()
    with pytest.raises(OSError):
        fs.write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["cat"]
    fs.fail_next_fsync()
    with pytest.raises(OSError):
        fs.write_atomic(target, b"new")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["cat"]
