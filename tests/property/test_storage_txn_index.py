"""Property: for any interleaving of transactions, the log's LSO and its answer to
"which aborted transactions overlap [start, end)" equal a brute-force computation,
live, after a crash and after a clean reopen."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semel.protocol.records import CONTROL_ABORT, CONTROL_COMMIT, build_batch, split_batches
from semel.storage import LogConfig, PartitionLog
from semel.storage.checkpoint import FILE_NAME as CHECKPOINT

PIDS = (11, 12, 13)
steps = st.lists(st.one_of(
    st.tuples(st.just("data"), st.sampled_from(PIDS), st.integers(1, 3)),
    st.tuples(st.just("plain"), st.just(-1), st.integers(1, 2)),
    st.tuples(st.just("end"), st.sampled_from(PIDS), st.sampled_from([CONTROL_ABORT, CONTROL_COMMIT])),
    st.tuples(st.just("checkpoint"), st.just(-1), st.just(0)),
), min_size=1, max_size=60)


class Model:
    def __init__(self):
        self.open: dict[int, int] = {}             # pid -> first offset
        self.aborted: list[tuple[int, int, int]] = []   # (pid, first, marker)
        self.seq = {p: 0 for p in PIDS}

    def lso(self, hw: int) -> int:
        return min(self.open.values(), default=hw)

    def overlapping(self, start: int, end: int) -> list[tuple[int, int]]:
        return [(p, f) for p, f, m in self.aborted if f < end and m >= start]


def play(plog: PartitionLog, history, model: Model) -> None:
    for kind, pid, arg in history:
        if kind == "data":
            data = build_batch([(None, b"x" * 40)] * arg, producer_id=pid, producer_epoch=0,
                               base_sequence=model.seq[pid], transactional=True)
            info = plog.append(data, split_batches(data)[0])
            model.seq[pid] += arg
            model.open.setdefault(pid, info.first_offset)
        elif kind == "plain":
            data = build_batch([(None, b"y" * 40)] * arg)
            plog.append(data, split_batches(data)[0])
        elif kind == "end":
            info = plog.append_control(arg, pid, 0, 0)
            first = model.open.pop(pid, None)
            if arg == CONTROL_ABORT and first is not None:
                model.aborted.append((pid, first, info.first_offset))
        else:
            plog.flush(checkpoint=True)


def check(plog: PartitionLog, model: Model, ranges) -> None:
    end = plog.log_end_offset
    assert plog.last_stable_offset == model.lso(end)
    assert plog.producers.ongoing_first_offsets() == model.open
    for a, b in ranges:
        s, e = sorted((int(a * end), int(b * end)))
        assert plog.aborted_transactions(s, e + 1) == model.overlapping(s, e + 1), (s, e + 1)
    assert plog.aborted_transactions(0, end) == model.overlapping(0, end)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=steps, seg=st.integers(400, 2500), ranges=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)),
                                                                   max_size=8),
       lose_checkpoint=st.booleans())
def test_lso_and_aborted_ranges_match_brute_force(history, seg, ranges, lose_checkpoint):
    cfg = LogConfig(segment_bytes=seg, index_interval_bytes=100,
                    checkpoint_interval_bytes=1 << 40, checkpoint_interval_ms=1 << 40)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "t-0"
        plog = PartitionLog.open(d, cfg)
        model = Model()
        play(plog, history, model)
        check(plog, model, ranges)
        plog.abandon()                                   # crash
        if lose_checkpoint and (d / CHECKPOINT).exists():
            os.unlink(d / CHECKPOINT)
        plog = PartitionLog.open(d, cfg)
        check(plog, model, ranges)
        plog.close()
        plog = PartitionLog.open(d, cfg)                 # clean reopen
        assert plog.recovery.clean
        check(plog, model, ranges)
        plog.close()
