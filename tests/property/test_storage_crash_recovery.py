"""Property: whatever the appends and wherever a crash cuts the files, the recovered log
is a prefix of what was appended, and it holds everything that was flushed."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semel.protocol.records import build_batch, iter_batches, iter_records, split_batches
from semel.storage import LogConfig, PartitionLog
from semel.storage.checkpoint import FILE_NAME as CHECKPOINT

appends = st.tuples(st.just("append"), st.integers(1, 3),            # batches in the request
                    st.integers(1, 4), st.integers(0, 120))            # records per batch, value size
ops = st.lists(st.one_of(appends, st.just(("flush",)), st.just(("checkpoint",))), min_size=1, max_size=40)
configs = st.builds(
    lambda seg, interval, cp_bytes: LogConfig(segment_bytes=seg, index_interval_bytes=interval,
                                              checkpoint_interval_bytes=cp_bytes, checkpoint_interval_ms=1 << 40),
    st.integers(300, 3000), st.integers(0, 600), st.sampled_from([0, 500, 1 << 40]))


def run_ops(plog: PartitionLog, ops_list) -> list[tuple[int, bytes]]:
    sent: list[tuple[int, bytes]] = []
    n = 0
    for op in ops_list:
        if op[0] == "append":
            _, nb, nr, size = op
            payload = b""
            for _ in range(nb):
                recs = []
                for _ in range(nr):
                    recs.append((None, b"%d:" % n + b"v" * size))
                    n += 1
                payload += build_batch(recs, timestamp_ms=1_000 + n)
            info = plog.append(payload, split_batches(payload)[0])
            vals = [v for _, v in iter_records_of(payload)]
            sent.extend(zip(range(info.first_offset, info.last_offset + 1), vals))
        elif op[0] == "flush":
            plog.flush()
        else:
            plog.flush(checkpoint=True)
    return sent


def iter_records_of(payload: bytes):
    for pos, _ in iter_batches(payload):
        for r in iter_records(payload, pos):
            yield r.offset, r.value


def recovered(plog: PartitionLog) -> list[tuple[int, bytes]]:
    out, offset = [], plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 16)
        assert data
        for pos, hdr in iter_batches(data):
            out.extend((r.offset, r.value) for r in iter_records(data, pos))
            offset = hdr.next_offset
    return out


def segment_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.suffix == ".log")


def byte_of_offset(files: list[Path], offset: int) -> int:
    """Position of offset in the concatenation of all segment files (or the total size)."""
    total = 0
    for f in files:
        data = f.read_bytes()
        for pos, hdr in iter_batches(data):
            if hdr.last_offset >= offset:
                return total + pos
        total += len(data)
    return total


def cut(files: list[Path], at: int) -> None:
    """Crash: the byte stream ends at `at`; later segment files are lost entirely."""
    for f in files:
        size = f.stat().st_size
        if at >= size:
            at -= size
            continue
        with open(f, "r+b") as fh:
            fh.truncate(at)
        at = 0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, ops_list=ops, where=st.floats(0, 1), flip=st.booleans(), lose_checkpoint=st.booleans(),
       flip_at=st.floats(0, 1))
def test_crash_recovery_keeps_a_prefix_with_everything_flushed(cfg, ops_list, where, flip, lose_checkpoint, flip_at):
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "t-0"
        plog = PartitionLog.open(d, cfg)
        sent = run_ops(plog, ops_list)
        flushed = plog.flushed_offset
        plog.abandon()

        files = segment_files(d)
        total = sum(f.stat().st_size for f in files)
        protected = byte_of_offset(files, flushed)          # bytes below this were fsynced
        at = protected + int((total - protected) * where)
        cut(files, at)
        if flip and at > protected:
            # a garbled byte in the unflushed region, as a torn sector would leave
            victim = protected + int((at - protected - 1) * flip_at)
            for f in segment_files(d):
                size = f.stat().st_size
                if victim < size:
                    raw = bytearray(f.read_bytes())
                    raw[victim] ^= 0x5A
                    f.write_bytes(raw)
                    break
                victim -= size
        if lose_checkpoint and (d / CHECKPOINT).exists():
            os.unlink(d / CHECKPOINT)

        got_log = PartitionLog.open(d, cfg)
        got = recovered(got_log)
        assert got == sent[:len(got)], "recovered log is not a prefix of what was appended"
        assert len(got) >= flushed, "flushed records were lost"
        assert got_log.log_end_offset == len(got)
        # and it keeps working: appends continue right after the recovered end
        payload = build_batch([(None, b"after")])
        assert got_log.append(payload, split_batches(payload)[0]).first_offset == len(got)
        got_log.close()
        again = PartitionLog.open(d, cfg)
        assert again.recovery.clean
        assert recovered(again) == got + [(len(got), b"after")]
        again.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, ops_list=ops, where=st.floats(0, 1))
def test_any_cut_still_recovers_a_clean_prefix(cfg, ops_list, where):
    """Even losing fsynced bytes (outside the model) must not yield garbage or a crash."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "t-0"
        plog = PartitionLog.open(d, cfg)
        sent = run_ops(plog, ops_list)
        plog.abandon()
        files = segment_files(d)
        cut(files, int(sum(f.stat().st_size for f in files) * where))
        got_log = PartitionLog.open(d, cfg)
        got = recovered(got_log)
        assert got == sent[got_log.log_start_offset:got_log.log_start_offset + len(got)]
        got_log.close()
