"""PartitionLog.read against a reference that walks every batch.

The read path takes one pread from the sparse-index entry and answers with a view
of it, stepping over batch headers without building header objects. Whatever the
batch sizes, index interval, offset, max_bytes and upper bound, it must return
exactly what Kafka's rules give: whole batches starting at the one holding the
offset, at least one (even past max_bytes) unless it reaches the bound, then as
many more as fit in max_bytes whose last offset is below the bound.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semel.protocol.records import iter_batches
from semel.storage import FileSystem, LogConfig, PartitionLog

from storage_helpers import append, batch


def expected(batches: list[tuple[int, int, bytes]], offset: int, max_bytes: int, bound: int) -> bytes:
    """batches: (base offset, last offset, bytes) of the whole log, in order."""
    out, first = [], True
    for base, last, raw in batches:
        if last < offset:
            continue
        if last >= bound:
            break
        if not first and sum(map(len, out)) + len(raw) > max_bytes:
            break
        out.append(raw)
        first = False
    return b"".join(out)


def segment_of(segment_bases: list[int], offset: int) -> int:
    return max(b for b in segment_bases if b <= offset)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 900)), min_size=1, max_size=40),
    interval=st.sampled_from([0, 64, 300, 4096]),
    segment_bytes=st.sampled_from([1500, 6000, 1 << 20]),
    reads=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 8000), st.floats(0, 1)), min_size=1, max_size=15),
)
def test_read_matches_a_walk_over_every_batch(tmp_path_factory, sizes, interval, segment_bytes, reads):
    d = tmp_path_factory.mktemp("read")
    plog = PartitionLog.open(d / "t-0", LogConfig(segment_bytes=segment_bytes, index_interval_bytes=interval),
                             FileSystem())
    try:
        stored = []
        for i, (count, size) in enumerate(sizes):
            raw = batch([bytes([65 + i % 26]) * size] * count, ts=1000 + i)
            info = append(plog, raw)
            stored.append((info.first_offset, info.last_offset, raw))
        # What the log holds (one segment per read): the reference for the reads below.
        whole = []
        offset = 0
        while offset < plog.log_end_offset:
            chunk = plog.read(offset, 1 << 30)
            for pos, hdr in iter_batches(chunk):
                whole.append((hdr.base_offset, hdr.last_offset, bytes(chunk[pos:pos + hdr.size])))
                offset = hdr.last_offset + 1
        assert [(b, l_) for b, l_, _ in whole] == [(b, l_) for b, l_, _ in stored]
        leo = plog.log_end_offset
        for at, max_bytes, cut in reads:
            offset = min(int(at * leo), leo - 1)
            bound = offset + int(cut * (leo - offset)) + 1
            got = plog.read(offset, max_bytes, bound)
            # A read stops at the end of the segment holding the offset.
            seg = segment_of(plog.segment_bases, offset)
            same_segment = [w for w in whole if segment_of(plog.segment_bases, w[0]) == seg]
            assert bytes(got) == expected(same_segment, offset, max_bytes, bound), (offset, max_bytes, bound)
    finally:
        plog.close()


def test_a_view_outlives_a_truncation_of_the_file(tmp_path):
    """Fetch answers with a view of the bytes read; the file may be cut (replica
    truncation) before the response is written: the view still holds what was read."""
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig(index_interval_bytes=0), FileSystem())
    try:
        for i in range(4):
            append(plog, batch([b"v%d" % i * 100]))
        got = plog.read(1, 250)     # two batches of ~260 bytes: the second one does not fit
        assert isinstance(got, memoryview)
        before = bytes(got)
        plog.truncate_to(1)
        assert bytes(got) == before and [h.base_offset for _, h in iter_batches(got)] == [1]
    finally:
        plog.close()


def test_a_batch_far_from_its_index_entry_is_still_found(tmp_path):
    """One pread covers at most 64 KiB before the wanted batch; index entries written
    under a larger interval leave it further away, and the read walks headers to it."""
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig(index_interval_bytes=1 << 20), FileSystem())
    try:
        for i in range(200):
            append(plog, batch([b"%04d" % i + b"y" * 1000]))
        for offset, max_bytes in [(150, 0), (199, 1), (120, 3000)]:
            got = plog.read(offset, max_bytes)
            bases = [h.base_offset for _, h in iter_batches(got)]
            assert bases == list(range(offset, offset + max(1, max_bytes // 1073))), (offset, bases)
    finally:
        plog.close()
