"""PartitionLog: append/read round trips, rolls, indexes, upper bounds, timestamps, retention."""
from __future__ import annotations

import os

import pytest
from storage_helpers import SMALL, append, batch, dump, fill, segment_path, values

from semel.protocol.errors import KafkaError
from semel.protocol.records import build_control_batch, iter_batches, split_batches
from semel.storage import AppendError, FaultyFileSystem, LogConfig, OffsetOutOfRange, PartitionLog, StorageError
from semel.storage.segment import INDEX_SUFFIX, segment_name


@pytest.fixture
def plog(tmp_path):
    p = PartitionLog.open(tmp_path / "t-0", SMALL)
    yield p
    p.close()


def test_new_log_is_empty(plog):
    assert (plog.log_start_offset, plog.log_end_offset, plog.high_watermark, plog.flushed_offset) == (0, 0, 0, 0)
    assert plog.read(0, 1000) == b""
    assert plog.size_bytes() == 0


def test_offsets_are_assigned_and_batches_stored_as_sent(plog):
    three = batch([b"a", b"b", b"c"])
    info = append(plog, three)
    assert (info.first_offset, info.last_offset, info.duplicate) == (0, 2, False)
    info = append(plog, batch(b"d"), batch([b"e", b"f"]))
    assert (info.first_offset, info.last_offset) == (3, 5)
    assert plog.log_end_offset == 6
    raw = dump(plog)
    assert [o for o, _ in raw] == [0, 3, 4]
    # Only the base offset (bytes 0..8) differs from what the client sent; the CRC still holds.
    assert raw[0][1] == three
    assert split_batches(b"".join(r for _, r in raw))[1] == KafkaError.NONE
    assert values(plog) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e"), (5, b"f")]


def test_round_trip_across_segment_rolls(plog):
    sent = fill(plog, 300)
    assert len(plog.segment_bases) > 5
    assert all(os.path.getsize(segment_path(plog.directory, b)) <= SMALL.segment_bytes
               for b in plog.segment_bases)
    assert [v for _, v in values(plog)] == sent
    # Rolled segments were fsynced at roll, so everything before the active one is durable.
    assert plog.flushed_offset >= plog.segment_bases[-1]


def test_read_starts_at_the_batch_holding_the_offset(plog):
    append(plog, batch([b"0", b"1", b"2"]), batch([b"3", b"4"]))
    first = next(iter_batches(plog.read(4, 10_000)))[1]
    assert (first.base_offset, first.last_offset) == (3, 4)
    first = next(iter_batches(plog.read(1, 10_000)))[1]
    assert first.base_offset == 0


def test_read_returns_one_batch_even_when_bigger_than_max_bytes(plog):
    append(plog, batch(b"x" * 500), batch(b"y"))
    data = plog.read(0, 10)
    assert [h.base_offset for _, h in iter_batches(data)] == [0]
    assert len(data) > 10


def test_read_stops_at_max_bytes_on_batch_boundaries(plog):
    fill(plog, 20, size=20)
    one = len(plog.read(0, 1))
    data = plog.read(0, one * 3 + one // 2)
    assert len(data) == one * 3
    assert len(list(iter_batches(data))) == 3


def test_upper_bound_excludes_batches_reaching_it(plog):
    append(plog, batch([b"0", b"1"]), batch([b"2", b"3"]), batch(b"4"))
    assert [h.base_offset for _, h in iter_batches(plog.read(0, 10_000, upper_bound=4))] == [0, 2]
    # the batch holding offset 3 ends at 3 >= bound 3: nothing may be returned
    assert [h.base_offset for _, h in iter_batches(plog.read(0, 10_000, upper_bound=3))] == [0]
    assert plog.read(2, 10_000, upper_bound=3) == b""
    assert plog.read(0, 10_000, upper_bound=0) == b""
    assert plog.read(0, 10_000, upper_bound=99) == plog.read(0, 10_000)


def test_out_of_range_and_end_of_log(plog):
    fill(plog, 3)
    assert plog.read(3, 1000) == b""
    with pytest.raises(OffsetOutOfRange) as exc:
        plog.read(4, 1000)
    assert exc.value.error == KafkaError.OFFSET_OUT_OF_RANGE
    with pytest.raises(OffsetOutOfRange):
        plog.read(-1, 1000)


def test_every_offset_is_readable_through_the_index(tmp_path):
    fs = FaultyFileSystem()
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=64 * 1024, index_interval_bytes=512), fs)
    fill(plog, 1000, size=30)
    for offset in range(0, 1000, 37):
        before = fs.count("pread")
        data = plog.read(offset, 1)
        hdr = next(iter_batches(data))[1]
        assert hdr.base_offset == offset
        # index lookup, then a few header reads: never a walk from the segment start
        assert fs.count("pread") - before <= 3
    plog.close()


def test_index_file_is_sparse(tmp_path):
    cfg = LogConfig(segment_bytes=1 << 20, index_interval_bytes=1000)
    plog = PartitionLog.open(tmp_path / "t-0", cfg)
    fill(plog, 200, size=100)
    size = plog.size_bytes()
    plog.close()
    entries = os.path.getsize(tmp_path / "t-0" / (segment_name(0) + INDEX_SUFFIX)) // 8
    assert size // 1000 - 2 <= entries <= size // 1000 + 1


def test_offset_for_timestamp(plog):
    fill(plog, 100, ts0=10_000)          # offset i has timestamp 10_000 + i
    assert plog.offset_for_timestamp(10_042) == (10_042, 42)
    assert plog.offset_for_timestamp(0) == (10_000, 0)
    assert plog.offset_for_timestamp(10_099) == (10_099, 99)
    assert plog.offset_for_timestamp(10_100) is None
    # inside a multi-record batch the record, not the batch, is found
    append(plog, batch([b"a", b"b"], ts=20_000))
    assert plog.offset_for_timestamp(19_000) == (20_000, 100)


def test_offset_for_timestamp_survives_reopen(tmp_path):
    p = PartitionLog.open(tmp_path / "t-0", SMALL)
    fill(p, 150, ts0=50_000)
    p.close()
    p = PartitionLog.open(tmp_path / "t-0", SMALL)
    assert [p.offset_for_timestamp(50_000 + i) for i in (0, 77, 149)] == [(50_000, 0), (50_077, 77), (50_149, 149)]
    p.close()


def test_reopen_after_clean_close_checks_nothing(tmp_path):
    p = PartitionLog.open(tmp_path / "t-0", SMALL)
    fill(p, 250)
    before = dump(p)
    p.close()
    p = PartitionLog.open(tmp_path / "t-0", SMALL)
    assert p.recovery.clean and p.recovery.used_checkpoint
    assert p.recovery.crc_checked_bytes == 0 and p.recovery.truncated_bytes == 0
    assert p.recovery.scanned_bytes < p.size_bytes() / 4   # only from last index entries
    assert dump(p) == before
    assert p.flushed_offset == p.log_end_offset == 250
    fill(p, 5)  # and appends continue where it stopped
    assert p.log_end_offset == 255
    p.close()


def test_retention_by_bytes_moves_log_start(plog):
    fill(plog, 300)
    plog.config = plog.config.with_overrides(retention_bytes=5000)
    bases = plog.segment_bases
    deleted = plog.enforce_retention(now_ms=0)
    assert deleted > 0
    assert plog.segment_bases == bases[deleted:]
    assert plog.log_start_offset == bases[deleted]
    assert plog.size_bytes() >= 5000
    assert plog.size_bytes() - os.path.getsize(segment_path(plog.directory, plog.segment_bases[0])) < 5000
    assert not segment_path(plog.directory, bases[0]).exists()
    with pytest.raises(OffsetOutOfRange):
        plog.read(bases[0], 100)
    assert values(plog)[0][0] == plog.log_start_offset


def test_retention_by_time_uses_segment_max_timestamp(plog):
    fill(plog, 300, ts0=1_000_000)
    plog.config = plog.config.with_overrides(retention_ms=1000)
    bases = plog.segment_bases
    # at now = 1_000_000 + 1000 + 60: segments whose newest record is older than 1000 ms go
    deleted = plog.enforce_retention(now_ms=1_001_060)
    assert 0 < deleted < len(bases)
    assert plog.log_start_offset == plog.segment_bases[0]
    assert plog.log_start_offset <= 60 < plog.segment_bases[1]
    # the active segment is never deleted, however old
    remaining = len(plog.segment_bases)
    assert plog.enforce_retention(now_ms=10**12) == remaining - 1
    assert plog.segment_bases == [bases[-1]]


def test_retention_survives_reopen(tmp_path):
    p = PartitionLog.open(tmp_path / "t-0", SMALL)
    fill(p, 300)
    p.config = p.config.with_overrides(retention_bytes=3000)
    p.enforce_retention(now_ms=0)
    start, rest = p.log_start_offset, dump(p)
    p.close()
    p = PartitionLog.open(tmp_path / "t-0", SMALL)
    assert p.log_start_offset == start and dump(p) == rest
    p.close()


def test_append_rejects_bad_layouts(plog):
    good = batch(b"a")
    batches, _ = split_batches(good)
    with pytest.raises(AppendError) as exc:
        plog.append(good + b"zz", batches)
    assert exc.value.error == KafkaError.CORRUPT_MESSAGE
    with pytest.raises(AppendError):
        plog.append(good, [])
    ctrl = build_control_batch(1, producer_id=5, producer_epoch=0)
    with pytest.raises(AppendError) as exc:
        plog.append(ctrl, split_batches(ctrl)[0])
    assert exc.value.error == KafkaError.INVALID_RECORD
    assert plog.log_end_offset == 0 and plog.size_bytes() == 0


def test_closed_log_refuses_calls(tmp_path):
    p = PartitionLog.open(tmp_path / "t-0", SMALL)
    p.close()
    p.close()  # idempotent
    with pytest.raises(StorageError):
        append(p, batch(b"a"))
    with pytest.raises(StorageError):
        p.read(0, 10)


def test_delete_removes_directory(tmp_path):
    p = PartitionLog.open(tmp_path / "t-0", SMALL)
    fill(p, 10)
    p.delete()
    assert not (tmp_path / "t-0").exists()


def test_bad_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="flush_mode"):
        PartitionLog.open(tmp_path / "x", LogConfig(flush_mode="sometimes"))
    with pytest.raises(ValueError, match="segment_bytes"):
        LogConfig(segment_bytes=10).validate()
    with pytest.raises(ValueError, match="retention_ms"):
        LogConfig().with_overrides(retention_ms=-5)
    assert not (tmp_path / "x").exists()


def test_delete_segments_before_drops_only_whole_segments_below(tmp_path):

    p = PartitionLog.open(tmp_path / "c-0", SMALL)
    fill(p, 400)
    bases = list(p.segment_bases)
    assert len(bases) > 3
    cut = bases[2] + 1                       # inside the third segment
    assert p.delete_segments_before(cut) == 2
    assert p.log_start_offset == bases[2] and p.segment_bases[0] == bases[2]
    end = p.log_end_offset
    p.close()
    again = PartitionLog.open(tmp_path / "c-0", SMALL)
    assert (again.log_start_offset, again.log_end_offset) == (bases[2], end)
    assert again.delete_segments_before(0) == 0
    again.close()
