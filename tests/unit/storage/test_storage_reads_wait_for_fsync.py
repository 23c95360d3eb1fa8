"""A single broker under flush_mode "always" shows readers only what is fsynced: a
record read before its fsync could be gone after a power cut, with the reader's
committed offset past the log end."""
from __future__ import annotations

from semel.storage import FileSystem, LogConfig, LogManager, PartitionLog

from storage_helpers import append, batch


def test_high_watermark_is_the_fsynced_end_when_reads_wait(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig(), FileSystem())
    plog.reads_wait_for_fsync = True
    append(plog, batch(b"a"))
    plog.flush()
    append(plog, batch(b"b"), batch(b"c"))
    assert plog.log_end_offset == 3
    assert plog.high_watermark == 1 and plog.last_stable_offset == 1
    plog.flush()
    assert plog.high_watermark == 3
    plog.reads_wait_for_fsync = False
    append(plog, batch(b"d"))
    assert plog.high_watermark == 4       # otherwise the log end, as before
    plog.close()


def test_log_manager_applies_it_to_open_and_new_logs(tmp_path):
    logs = LogManager(tmp_path / "data", LogConfig(), FileSystem())
    logs.create_topic("before", 2)
    logs.set_reads_wait_for_fsync(True)
    logs.create_topic("after", 1)
    assert all(plog.reads_wait_for_fsync for _, plog in logs.all_logs())
    logs.close()
