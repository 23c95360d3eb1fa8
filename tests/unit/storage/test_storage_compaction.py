"""The log cleaner against a model, seeded random histories: keyed writes,
transactions that commit, abort or stay open, cleaning passes at random points,
tombstones (null values) on a fake clock, and a reopen at the end. After every pass:
the newest committed record of every key is still there at its offset, unless it is
a tombstone in a cleaned segment older than delete.retention.ms (then it is gone), no record of an aborted transaction is left
below the cleanable end, records of open transactions and everything at or above
the cleanable end are untouched, offsets stay continuous, and nothing new appears."""
from __future__ import annotations

import random

import pytest

from semel.protocol.records import CONTROL_ABORT, CONTROL_COMMIT, build_batch, iter_batches, split_batches
from semel.storage import LogConfig, PartitionLog
from semel.storage import compaction

from storage_helpers import dump

CFG = LogConfig(segment_bytes=600, index_interval_bytes=64)
KEYS = [b"a", b"b", b"c", b"d", b"e"]
RETENTION_MS = 20_000      # delete.retention.ms on the fake clock (one step = 1 s)


class Model:
    def __init__(self):
        self.records: dict[int, tuple[bytes, bytes, str]] = {}   # offset -> (key, value, status)
        self.txn: dict[int, list[int]] = {}                         # pid -> offsets of the open txn
        self.seq: dict[int, int] = {}
        self.clock = 1_000_000                                      # ms; one step = 1 s
        self.stamp: dict[int, int] = {}                             # offset -> batch timestamp

    def latest_committed(self) -> dict[bytes, int]:
        out = {}
        for off in sorted(self.records):
            key, _, status = self.records[off]
            if status == "committed":
                out[key] = off
        return out


def _append(plog, data):
    batches, err = split_batches(data)
    assert err == 0
    return plog.append(data, batches)


def _step(rng, plog, m: Model):
    r = rng.random()
    pid = rng.choice([7, 8])
    m.clock += 1000
    if r < 0.5:
        recs = [(rng.choice(KEYS), None if rng.random() < 0.2 else b"v%d" % rng.randrange(10**6))
                for _ in range(rng.randint(1, 3))]
        info = _append(plog, build_batch(recs, timestamp_ms=m.clock))
        for i, (k, v) in enumerate(recs):
            m.records[info.first_offset + i] = (k, v, "committed")
            m.stamp[info.first_offset + i] = m.clock
    elif r < 0.8:
        recs = [(rng.choice(KEYS), b"t%d" % rng.randrange(10**6)) for _ in range(rng.randint(1, 3))]
        seq = m.seq.get(pid, 0)
        info = _append(plog, build_batch(recs, producer_id=pid, producer_epoch=0, base_sequence=seq,
                                         transactional=True))
        m.seq[pid] = seq + len(recs)
        for i, (k, v) in enumerate(recs):
            m.records[info.first_offset + i] = (k, v, "open")
            m.txn.setdefault(pid, []).append(info.first_offset + i)
    elif m.txn.get(pid):
        commit = rng.random() < 0.5
        plog.append_control(CONTROL_COMMIT if commit else CONTROL_ABORT, pid, 0, 0)
        for off in m.txn.pop(pid):
            k, v, _ = m.records[off]
            m.records[off] = (k, v, "committed" if commit else "aborted")


def _log_records(plog) -> dict[int, tuple[bytes, bytes]]:
    from aiokafka.record.default_records import DefaultRecordBatch
    out = {}
    expected = plog.log_start_offset
    for base, raw in dump(plog):
        assert base == expected, "offsets stay continuous"
        for pos, hdr in iter_batches(raw):
            expected = hdr.next_offset
            if hdr.is_control:
                continue
            for rec in DefaultRecordBatch(raw):
                out[rec.offset] = (bytes(rec.key), None if rec.value is None else bytes(rec.value))
    assert expected == plog.log_end_offset
    return out


def _cleaned_upto(plog, end: int) -> int:
    """The cleaner rewrites whole closed segments ending at or below the cleanable end."""
    bases = plog.segment_bases
    cleaned = plog.rewrites.closed_segments_below(end)
    return bases[bases.index(cleaned[-1]) + 1] if cleaned else plog.log_start_offset


def _expired_tombstone(m: Model, off: int, cleaned_upto: int) -> bool:
    return (m.records[off][1] is None and off < cleaned_upto
            and m.stamp[off] < m.clock - RETENTION_MS)


def _clean(plog, m: Model):
    compaction.clean(plog, m.clock, RETENTION_MS)


def _check(plog, m: Model, end: int):
    cleaned_upto = _cleaned_upto(plog, end)
    got = _log_records(plog)
    for off, kv in got.items():
        assert kv == m.records[off][:2], "nothing new or changed appears"
    for key, off in m.latest_committed().items():
        if _expired_tombstone(m, off, cleaned_upto):
            assert off not in got, f"tombstone of {key!r} at {off} past delete.retention.ms removed"
        else:
            assert got.get(off) == m.records[off][:2], f"newest committed {key!r} at {off} kept"
    for off, (k, v, status) in m.records.items():
        if off >= end or status == "open":
            assert got.get(off) == (k, v), f"record {off} above the cleanable end or open kept"
        elif status == "aborted" and off < cleaned_upto:
            assert off not in got, f"aborted record {off} in a cleaned segment removed"


def _expire_a_tombstone(plog, m: Model) -> int:
    """End every open transaction, delete key a, roll segments past it with other keys
    and let the clock pass delete.retention.ms: the next pass removes a's tombstone (and
    with it every trace of a), while a fresh tombstone of b stays. Returns the end."""
    for pid in list(m.txn):
        plog.append_control(CONTROL_ABORT, pid, 0, 0)
        for off in m.txn.pop(pid):
            k, v, _ = m.records[off]
            m.records[off] = (k, v, "aborted")
    a = _append(plog, build_batch([(b"a", None)], timestamp_ms=m.clock)).first_offset
    m.records[a], m.stamp[a] = (b"a", None, "committed"), m.clock
    m.clock += 2 * RETENTION_MS
    b = _append(plog, build_batch([(b"b", None)], timestamp_ms=m.clock)).first_offset
    m.records[b], m.stamp[b] = (b"b", None, "committed"), m.clock
    for i in range(40):
        info = _append(plog, build_batch([(b"z", b"%d" % i)], timestamp_ms=m.clock))
        m.records[info.first_offset], m.stamp[info.first_offset] = (b"z", b"%d" % i, "committed"), m.clock
    _clean(plog, m)
    end = plog.rewrites.cleanable_end()
    assert b < _cleaned_upto(plog, end), "the filler closed the segments holding both tombstones"
    _check(plog, m, end)
    got = _log_records(plog)
    assert a not in got and all(k != b"a" for k, _ in got.values()), "a is gone for good"
    assert got[b] == (b"b", None), "a tombstone younger than delete.retention.ms stays"
    return end


@pytest.mark.parametrize("seed", range(8))
def test_cleaner_against_model(tmp_path, seed):
    rng = random.Random(seed)
    plog = PartitionLog.open(tmp_path / "c-0", CFG)
    m = Model()
    try:
        for i in range(160):
            _step(rng, plog, m)
            if rng.random() < 0.1:
                _clean(plog, m)
                _check(plog, m, plog.rewrites.cleanable_end())
        _clean(plog, m)
        _check(plog, m, plog.rewrites.cleanable_end())
        end = _expire_a_tombstone(plog, m)
        assert len(_log_records(plog)) < len(m.records)  # the pass did remove something
        before = dump(plog)
    finally:
        plog.close()
    reopened = PartitionLog.open(tmp_path / "c-0", CFG)
    try:
        assert dump(reopened) == before
        _check(reopened, m, end)
    finally:
        reopened.close()
