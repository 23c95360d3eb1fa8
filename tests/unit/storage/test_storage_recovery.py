"""Recovery at open: torn and corrupt tails are cut, everything before them survives,
and only the data after the recovery checkpoint is checked."""
from __future__ import annotations

import os
import struct

import pytest
from storage_helpers import append, batch, dump, fill, segment_path, values

from semel.protocol.records import iter_batches
from semel.storage import LogConfig, PartitionLog
from semel.storage.checkpoint import FILE_NAME as CHECKPOINT
from semel.storage.segment import INDEX_SUFFIX, TIMEINDEX_SUFFIX, segment_name

# Checkpoints only when asked (flush(checkpoint=True)), at rolls and at close.
CFG = LogConfig(segment_bytes=4096, index_interval_bytes=200,
                checkpoint_interval_bytes=1 << 40, checkpoint_interval_ms=1 << 40)


def crash(p: PartitionLog) -> None:
    """The process dies: nothing more is written."""
    p.abandon()


def reopen(p: PartitionLog, cfg: LogConfig = CFG) -> PartitionLog:
    return PartitionLog.open(p.directory, cfg)


def assert_reopens_with_every_offset_readable(p: PartitionLog, before) -> None:
    """Reopened, the log holds what it held, and a read of each offset starts at its batch
    (a damaged index that was trusted would start one elsewhere)."""
    q = reopen(p)
    assert dump(q) == before
    for offset in range(q.log_start_offset, q.log_end_offset):
        assert next(iter_batches(q.read(offset, 1)))[1].base_offset == offset
    q.close()


def last_batch_pos(p: PartitionLog) -> tuple[int, int]:
    """(position, size) of the last batch in the active segment."""
    base = p.segment_bases[-1]
    data = segment_path(p.directory, base).read_bytes()
    pos, hdr = list(iter_batches(data))[-1]
    return pos, hdr.size


@pytest.fixture
def p(tmp_path):
    plog = PartitionLog.open(tmp_path / "t-0", CFG)
    yield plog
    if not plog.closed:
        plog.close()


def test_torn_last_batch_is_cut_and_earlier_batches_survive(p):
    fill(p, 10)
    p.flush(checkpoint=True)
    fill(p, 5)
    before = dump(p)
    pos, size = last_batch_pos(p)
    crash(p)
    with open(segment_path(p.directory, p.segment_bases[-1]), "r+b") as f:
        f.truncate(pos + size // 2)
    q = reopen(p)
    assert q.log_end_offset == 14
    assert dump(q) == before[:-1]
    assert q.recovery.truncated_bytes == size // 2
    assert os.path.getsize(segment_path(q.directory, q.segment_bases[-1])) == pos
    assert append(q, batch(b"next")).first_offset == 14
    assert values(q)[-1] == (14, b"next")
    q.close()


def test_flipped_byte_in_last_batch_is_cut(p):
    fill(p, 8)
    p.flush(checkpoint=True)
    fill(p, 3)
    before = dump(p)
    pos, size = last_batch_pos(p)
    crash(p)
    path = segment_path(p.directory, p.segment_bases[-1])
    raw = bytearray(path.read_bytes())
    raw[pos + size - 3] ^= 0x40          # inside the CRC-covered records
    path.write_bytes(raw)
    q = reopen(p)
    assert dump(q) == before[:-1]
    assert q.recovery.truncated_bytes == size
    q.close()


def test_corrupt_batch_in_the_middle_of_the_tail_drops_it_and_all_after(p):
    fill(p, 4)
    p.flush(checkpoint=True)
    fill(p, 6)
    before = dump(p)
    crash(p)
    path = segment_path(p.directory, p.segment_bases[-1])
    raw = bytearray(path.read_bytes())
    positions = [pos for pos, _ in iter_batches(bytes(raw))]
    raw[positions[6] + 30] ^= 0xFF        # batch with offset 6 (attributes/timestamps area)
    path.write_bytes(raw)
    q = reopen(p)
    assert dump(q) == before[:6]
    q.close()


def test_recovery_checks_only_after_the_checkpoint(p):
    fill(p, 20)
    p.flush(checkpoint=True)
    flushed_size = p.size_bytes()
    fill(p, 7)
    tail = p.size_bytes() - flushed_size
    crash(p)
    q = reopen(p)
    assert q.recovery.used_checkpoint and not q.recovery.clean
    assert q.recovery.crc_checked_bytes == tail
    assert q.log_end_offset == 27 and q.flushed_offset == 27
    q.close()
    # the recovered tail was made durable and checkpointed: the next open is clean
    r = reopen(q)
    assert r.recovery.crc_checked_bytes == 0
    r.close()


def test_segments_rolled_after_the_checkpoint_are_checked_and_kept(p):
    fill(p, 30)
    p.flush(checkpoint=True)
    first_segments = len(p.segment_bases)
    fill(p, 200)                     # several rolls after the last explicit checkpoint
    assert len(p.segment_bases) > first_segments + 2
    before = dump(p)
    crash(p)
    q = reopen(p)
    assert dump(q) == before
    q.close()


def test_torn_tail_in_a_later_segment(p):
    fill(p, 200)
    before = dump(p)
    pos, size = last_batch_pos(p)
    crash(p)
    with open(segment_path(p.directory, p.segment_bases[-1]), "r+b") as f:
        f.truncate(pos + 5)
    q = reopen(p)
    assert dump(q) == before[:-1]
    q.close()


def test_missing_checkpoint_means_a_full_check(p):
    fill(p, 120)
    before = dump(p)
    p.close()
    os.unlink(p.directory / CHECKPOINT)
    q = reopen(p)
    assert not q.recovery.used_checkpoint
    assert q.recovery.crc_checked_bytes == q.size_bytes()
    assert dump(q) == before
    q.close()


def test_damaged_checkpoint_is_ignored(p):
    fill(p, 50)
    before = dump(p)
    p.close()
    raw = bytearray((p.directory / CHECKPOINT).read_bytes())
    raw[10] ^= 1
    (p.directory / CHECKPOINT).write_bytes(raw)
    q = reopen(p)
    assert not q.recovery.used_checkpoint
    assert dump(q) == before
    q.close()


def test_checkpoint_pointing_past_the_data_falls_back_to_a_full_check(p):
    fill(p, 10)
    p.close()
    path = segment_path(p.directory, p.segment_bases[-1])
    pos, _ = list(iter_batches(path.read_bytes()))[-1]
    with open(path, "r+b") as f:
        f.truncate(pos)   # data the checkpoint vouched for is gone (e.g. disk trouble)
    q = reopen(p)
    assert not q.recovery.used_checkpoint
    assert q.log_end_offset == 9
    q.close()


def test_debris_is_removed(p):
    fill(p, 10)
    p.close()
    d = p.directory
    (d / (CHECKPOINT + ".tmp")).write_bytes(b"half")
    (d / (segment_name(999_999) + INDEX_SUFFIX)).write_bytes(b"\0" * 16)       # no .log: orphan
    (d / (segment_name(999_999) + TIMEINDEX_SUFFIX)).write_bytes(b"\0" * 16)
    q = reopen(p)
    names = os.listdir(d)
    assert not [n for n in names if n.endswith(".tmp") or n.startswith(segment_name(999_999))]
    assert q.log_end_offset == 10
    q.close()


def test_garbage_at_the_end_of_an_index_is_dropped(p):
    fill(p, 60)
    p.flush(checkpoint=True)
    fill(p, 3)
    before = dump(p)
    crash(p)
    active = p.segment_bases[-1]
    index = p.directory / (segment_name(active) + INDEX_SUFFIX)
    with open(index, "ab") as f:
        f.write(b"\0" * 24 + b"\x00\x00\x00\x05\x00\x00\x00\x07" + b"\xff" * 5)   # power-loss junk
    with open(p.directory / (segment_name(active) + TIMEINDEX_SUFFIX), "ab") as f:
        f.write(b"\0" * 40)
    assert_reopens_with_every_offset_readable(p, before)


def test_stale_index_entry_pointing_at_the_wrong_batch_is_dropped(p):
    fill(p, 80)
    before = dump(p)
    p.close()
    first = p.segment_bases[0]
    index = p.directory / (segment_name(first) + INDEX_SUFFIX)
    raw = bytearray(index.read_bytes())
    assert len(raw) >= 16
    rel, pos = struct.unpack_from(">II", raw, len(raw) - 8)
    # the last entry now claims an earlier offset for its position: trusting it would
    # make a read of that offset start one batch too late
    struct.pack_into(">II", raw, len(raw) - 8, rel - 1, pos)
    index.write_bytes(raw)
    assert_reopens_with_every_offset_readable(p, before)


def test_missing_index_of_an_old_segment_is_rebuilt(p):
    fill(p, 150)
    before = dump(p)
    p.close()
    first = p.segment_bases[0]
    os.unlink(p.directory / (segment_name(first) + INDEX_SUFFIX))
    q = reopen(p)
    assert dump(q) == before
    assert (p.directory / (segment_name(first) + INDEX_SUFFIX)).exists()
    q.close()


def test_a_segment_that_breaks_offset_continuity_is_dropped(p):
    fill(p, 100)
    before = dump(p)
    p.close()
    bogus = segment_path(p.directory, p.log_end_offset + 50)
    bogus.write_bytes(batch(b"stray"))
    q = reopen(p)
    assert dump(q) == before
    assert not bogus.exists()
    assert q.recovery.segments_removed == [100 + 50]
    q.close()


def test_empty_active_segment_after_a_roll_crash(p):
    fill(p, 60)
    before = dump(p)
    crash(p)
    # a roll that died right after creating the new, empty segment
    segment_path(p.directory, p.log_end_offset).write_bytes(b"")
    q = reopen(p)
    assert dump(q) == before
    assert append(q, batch(b"z")).first_offset == 60
    q.close()
