"""Every state change of a transactional id starts in one function,
TxnShard.begin, which consults the VALID_PREVIOUS table."""
from __future__ import annotations

import ast
import asyncio
import inspect
import itertools
import logging
import math

import pytest

import semel.coordinator.txn as txn_module
import semel.coordinator.txn_branches as branches_module
import semel.coordinator.txn_completion as completion_module
import semel.coordinator.txn_housekeeping as housekeeping_module
import semel.coordinator.txn_shard as shard_module
from tests.support.coordinators import group_coordinator, txn_coordinator
from semel.broker.config import BrokerConfig
from semel.coordinator.group import GroupConfig
from semel.coordinator.producer_ids import ProducerIdManager
from semel.coordinator.txn_shard import TxnOp
from semel.coordinator.txn_states import VALID_PREVIOUS, TxnMeta, TxnState
from semel.protocol.errors import KafkaError
from semel.storage.flusher import GroupCommitFlusher
from semel.storage.manager import LogManager

E = KafkaError


@pytest.fixture
def coord(tmp_path):
    logs = LogManager(tmp_path / "data")
    flusher = GroupCommitFlusher()
    groups = group_coordinator(logs, flusher, GroupConfig(), run_timers=False)
    return txn_coordinator(logs, flusher, groups, BrokerConfig(data_dir=tmp_path / "data"),
                           ProducerIdManager(tmp_path / "data" / "producer_ids"))


def _held(coord, txn_id: str, state: TxnState) -> TxnMeta:
    meta = TxnMeta(txn_id, 7, 1, -1, -1, 60_000, state, None, -1, 0)
    coord.txns[txn_id] = meta
    return meta


@pytest.mark.parametrize("src,dst", list(itertools.product(TxnState, TxnState)),
                         ids=lambda s: s.name)
def test_begin_follows_the_table(coord, src, dst):
    meta = _held(coord, "t", src)
    err = coord.begin(meta, dst)
    if src in VALID_PREVIOUS[dst]:
        assert err == E.NONE and meta.pending == dst
    else:
        assert err == E.INVALID_TXN_STATE and meta.pending is None


def test_begin_refuses_a_second_change_and_a_stale_look(coord):
    meta = _held(coord, "t", TxnState.ONGOING)
    assert coord.begin(meta, TxnState.PREPARE_COMMIT) == E.NONE
    assert coord.begin(meta, TxnState.PREPARE_ABORT) == E.CONCURRENT_TRANSACTIONS
    assert meta.pending == TxnState.PREPARE_COMMIT
    stale = meta
    _held(coord, "t", TxnState.COMPLETE_COMMIT)
    stale.pending = None
    assert coord.begin(stale, TxnState.ONGOING) == E.CONCURRENT_TRANSACTIONS


def test_an_unknown_id_may_only_start_empty(coord):
    assert coord.begin(None, TxnState.EMPTY) == E.NONE
    for state in set(TxnState) - {TxnState.EMPTY}:
        assert coord.begin(None, state) == E.INVALID_TXN_STATE


def test_an_invalid_transition_is_refused_without_touching_the_log(coord):
    meta = _held(coord, "t", TxnState.COMPLETE_ABORT)
    before = coord._clog.records_since_compaction
    op = TxnOp(E.NONE, [("t", meta.copy(state=TxnState.PREPARE_COMMIT))], [("t", meta, TxnState.PREPARE_COMMIT)])
    err, replayed = asyncio.run(coord.commit(op))
    assert not replayed
    assert err == E.INVALID_TXN_STATE
    assert coord.txns["t"] is meta and meta.pending is None
    assert coord._clog.records_since_compaction == before


def test_completing_a_transaction_already_being_completed_does_nothing(coord):
    meta = _held(coord, "t", TxnState.PREPARE_COMMIT)
    meta.pending = TxnState.COMPLETE_COMMIT          # a completion in flight
    asyncio.run(coord._completion.complete(meta))
    assert coord.txns["t"] is meta and meta.state == TxnState.PREPARE_COMMIT


def test_no_other_code_sets_a_pending_state():
    """`pending` is set to a state only inside begin; elsewhere it is only cleared."""
    trees = [ast.parse(inspect.getsource(m)) for m in (txn_module, branches_module, completion_module,
                                                        housekeeping_module, shard_module)]
    setters = []
    for fn in (n for tree in trees for n in ast.walk(tree)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                cleared = isinstance(node.value, ast.Constant) and node.value.value is None
                if not cleared and any(isinstance(t, ast.Attribute) and t.attr == "pending" for t in targets):
                    setters.append(fn.name)
    assert setters == ["begin"]


def test_markers_refused_for_a_while_are_logged_once_then_with_their_count(coord, monkeypatch, caplog):
    """A partition's leader refusing a decision's markers (NOT_ENOUGH_REPLICAS while its ISR
    is below min.insync.replicas) for 5 tries, then taking them: one WARNING at the first
    refusal and one line with the count once written, not a line per retry."""
    from semel.backoff import Backoff
    from tests.support.coordinators import start

    class RefusingLeader:   # the MarkerWriter of a partition led by another broker
        tries = 0

        def leads_here(self, tp):
            return False

        async def write(self, tp, commit, producers, coordinator_epoch):
            self.tries += 1
            return KafkaError.NOT_ENOUGH_REPLICAS if self.tries <= 5 else KafkaError.NONE

    leader = RefusingLeader()
    monkeypatch.setattr(coord._completion, "_markers", leader)
    monkeypatch.setattr(completion_module, "Backoff", lambda *a, **kw: Backoff(math.inf, first_s=0.001, max_s=0.001))

    async def run():
        await start(coord)
        meta = TxnMeta("stuck", 7, 1, -1, -1, 60_000, TxnState.PREPARE_ABORT, frozenset({("far", 0)}), 0, 0)
        coord.txns["stuck"] = meta
        await coord._completion.complete(meta)
        for _ in range(500):
            if coord.txns["stuck"].state == TxnState.COMPLETE_ABORT:
                return
            await asyncio.sleep(0.01)

    with caplog.at_level(logging.INFO, logger="semel.txn"):
        asyncio.run(run())
    assert coord.txns["stuck"].state == TxnState.COMPLETE_ABORT and leader.tries == 6
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "far-0" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0][0] == "WARNING" and "marker write to far-0 for stuck failed" in lines[0][1]
    assert "NOT_ENOUGH_REPLICAS" in lines[0][1]
    assert lines[1][0] == "INFO" and "marker write to far-0 for stuck done after 5 failure(s)" in lines[1][1]
