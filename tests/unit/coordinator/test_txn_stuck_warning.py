"""The coordinator's "has been completing <STATE> for N s" warning counts from when the
pending transition began, not from the id's last completed change (which, for an id a
coordinator just took over, can be long before)."""
from __future__ import annotations

import logging
import time

from semel.coordinator.txn_housekeeping import warn_stuck
from semel.coordinator.txn_states import TxnMeta, TxnState, now_ms

WARN_AFTER_MS = 30_000


def _meta(txn_id: str, last_change_s_ago: float) -> TxnMeta:
    t = now_ms() - int(last_change_s_ago * 1000)
    return TxnMeta(txn_id, 7, 0, -1, -1, 60_000, TxnState.COMPLETE_COMMIT, None, t, t)


def _warnings(caplog, *metas) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="semel.txn"):
        warn_stuck({m.txn_id: m for m in metas}, WARN_AFTER_MS)
    return [r.getMessage() for r in caplog.records]


def test_a_transition_just_begun_on_an_id_idle_for_long_is_not_stuck(caplog):
    meta = _meta("idle-for-ten-minutes", 600)
    meta.pending = TxnState.EMPTY            # e.g. InitProducerId's bump right after a failover
    assert _warnings(caplog, meta) == []


def test_the_warning_counts_from_when_the_transition_began(caplog):
    meta = _meta("stuck", 600)
    meta.pending = TxnState.COMPLETE_ABORT
    meta.pending_since = time.monotonic() - 45   # began 45 s ago (markers not written since)
    (line,) = _warnings(caplog, meta)
    assert line == "stuck has been completing COMPLETE_ABORT for 45 s"


def test_a_new_transition_restarts_the_count_and_the_same_one_keeps_it(caplog):
    meta = _meta("busy", 600)
    meta.pending = TxnState.PREPARE_COMMIT
    meta.pending_since -= 45
    meta.pending = TxnState.PREPARE_COMMIT     # the same transition, set again: still 45 s old
    assert len(_warnings(caplog, meta)) == 1
    meta.pending = None
    meta.pending = TxnState.COMPLETE_COMMIT    # the next one begins now
    assert _warnings(caplog, meta) == []
    assert meta.copy().pending is None         # a copy is a new state, no transition under way
