"""The transaction shard driven directly, with no event loop: Hypothesis picks the
requests (InitProducerId, AddPartitionsToTxn with real partitions and branches, EndTxn,
timeouts, expiry, marker completion), when each write reaches its commit point, which
appends fail, and when the coordinator restarts. The harness plays the runtime's part by hand: lock, append,
replay in log order, unlock.

After every step: replaying the records the shard emitted into a fresh shard gives the
same state (so a restart and a live write cannot diverge), the branch index is what the
parents' states say, every record is a transition the table allows, and no producer
instance fenced by a newer one is let into a transaction."""
from __future__ import annotations

import math
from collections import deque

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from semel.coordinator.txn_branches import BRANCH_PREFIX
from semel.coordinator.txn_shard import TxnOp, TxnShard
from semel.coordinator.txn_states import (
    COMPLETE_OF, PREPARED, TxnState, can_transition, decode_value, encode_value,
)
from semel.protocol.api_keys import ApiKey
from semel.protocol.errors import KafkaError

E = KafkaError
IDS = ["a", "b", "c", "d"]
TOPICS = [("t", 0), ("t", 1), ("u", 0)]
MAX_TIMEOUT_MS = 60_000


def _encoded(shard: TxnShard) -> dict[str, bytes]:
    return {t: encode_value(m) for t, m in shard.txns.items()}


def _index(shard: TxnShard) -> dict[str, str]:
    """The branch index the parents' states imply."""
    out = {}
    for m in shard.txns.values():
        if m.state in PREPARED or m.state == TxnState.ONGOING:
            for topic, partition in m.parts():
                if topic.startswith(BRANCH_PREFIX):
                    out[topic[len(BRANCH_PREFIX):]] = m.txn_id
    return out


class TxnShardModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.shard = TxnShard()
        self.log: list[tuple[str, bytes | None]] = []     # what reached the log, encoded
        self.queue: deque[TxnOp] = deque()                 # appended, waiting for the commit point
        self.next_pid = 1000
        self.grants: dict[str, list[tuple[int, int]]] = {t: [] for t in IDS}
        self.violations: list[str] = []

    # --- the runtime's part, by hand -------------------------------------------------------

    def _next_id(self) -> int:
        self.next_pid += 1
        return self.next_pid

    def submit(self, op: TxnOp, now: bool = True, fails: bool = False) -> KafkaError:
        """Lock and append `op`; with `now` its commit point is reached at once. An append
        that `fails` never reaches the log: the op's locks are released, nothing replayed."""
        if not op.records:
            return E.NONE
        err = self.shard.lock(op)
        if err:
            return err
        if fails:
            self.shard.unlock(op)
            return E.KAFKA_STORAGE_ERROR
        self.queue.append(op)
        for txn_id, meta in op.records:
            self.log.append((txn_id, None if meta is None else encode_value(meta)))
        if now:
            self.settle_all()
        return E.NONE

    def _settle_one(self) -> None:
        op = self.queue.popleft()
        for txn_id, meta in op.records:
            previous = self.shard.txns.get(txn_id)
            if meta is not None and not can_transition(None if previous is None else previous.state, meta.state):
                self.violations.append(f"{txn_id}: {previous and previous.state.name} -> {meta.state.name}")
            if meta is None and (previous is None or previous.state not in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT,
                                                                           TxnState.COMPLETE_ABORT)):
                self.violations.append(f"{txn_id}: tombstone of {previous and previous.state.name}")
            self.shard.replay((txn_id, meta))
        self.shard.unlock(op)

    def settle_all(self) -> None:
        while self.queue:
            self._settle_one()

    def carry_out(self, txn_id: str) -> None:
        """Marker completion of a prepared id (markers always succeed here): branches
        prepared, then the branches' and the parent's Complete records."""
        meta = self.shard.txns.get(txn_id)
        if meta is None or meta.state not in PREPARED or meta.pending is not None or txn_id in self.shard.joined:
            return
        if self.shard.begin(meta, COMPLETE_OF[meta.state]):
            return
        commit = meta.state == TxnState.PREPARE_COMMIT
        op, live = self.shard.prepare_branches(meta, commit)
        if op.response or self.submit(op):
            meta.pending = None
            return
        branches = self.shard.prepared(live, TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT)
        assert branches is not None, "branches prepared in one settled op"
        if branches:
            assert self.submit(self.shard.complete_branches(branches)) == E.NONE
        assert self.submit(self.shard.complete(meta)) == E.NONE
        meta.pending = None
        assert self.shard.state_of(txn_id) == COMPLETE_OF[meta.state]

    def handle(self, txn_id: str) -> tuple[int, int]:
        return self.grants[txn_id][-1] if self.grants[txn_id] else (-1, -1)

    # --- requests -------------------------------------------------------------------------

    @rule(txn_id=st.sampled_from(IDS), known=st.booleans(), now=st.booleans(), fails=st.booleans())
    def init(self, txn_id: str, known: bool, now: bool, fails: bool) -> None:
        pid, epoch = self.handle(txn_id) if known else (-1, -1)
        for _ in range(3):
            op = self.shard.init_producer_id(txn_id, 30_000, pid, epoch, 4, self._next_id)
            if op.fence is None:
                break
            self.settle_all()   # the real fence awaits its write and its markers
            fenced = op.fence.txn_id
            if self.submit(self.shard.fence(op.fence)):
                return
            self.carry_out(fenced)
        else:
            return
        err, new_pid, new_epoch = op.response
        if err or self.submit(op, now, fails):
            return
        if (new_pid, new_epoch) in self.grants[txn_id]:
            self.violations.append(f"{txn_id}: ({new_pid}, {new_epoch}) handed out twice")
        self.grants[txn_id].append((new_pid, new_epoch))

    @rule(txn_id=st.sampled_from(IDS), parts=st.lists(st.sampled_from(TOPICS), min_size=1, max_size=2),
          branch=st.sampled_from([None, *IDS]), stale=st.booleans(), now=st.booleans(), fails=st.booleans())
    def add(self, txn_id: str, parts: list, branch: str | None, stale: bool, now: bool, fails: bool) -> None:
        pid, epoch = self.grants[txn_id][0] if stale and self.grants[txn_id] else self.handle(txn_id)
        if branch is not None:
            parts = [*parts, (BRANCH_PREFIX + branch, 0)]
        op = self.shard.add_partitions(txn_id, pid, epoch, parts, 3, ApiKey.ADD_PARTITIONS_TO_TXN,
                                       lambda tp: E.NONE)
        if op.records and (pid, epoch) != self.handle(txn_id):
            self.violations.append(f"fenced {txn_id} ({pid}, {epoch}) joined partitions")
        self.submit(op, now, fails)

    @rule(txn_id=st.sampled_from(IDS), commit=st.booleans(), stale=st.booleans(), fails=st.booleans())
    def end(self, txn_id: str, commit: bool, stale: bool, fails: bool) -> None:
        pid, epoch = self.grants[txn_id][0] if stale and self.grants[txn_id] else self.handle(txn_id)
        op = self.shard.end_txn(txn_id, pid, epoch, commit, 3)
        if op.records and (pid, epoch) != self.handle(txn_id):
            self.violations.append(f"fenced {txn_id} ({pid}, {epoch}) ended a transaction")
        if not self.submit(op, fails=fails):
            self.carry_out(txn_id)

    @rule(txn_id=st.sampled_from(IDS), tp=st.sampled_from(TOPICS), stale=st.booleans())
    def produce(self, txn_id: str, tp: tuple[str, int], stale: bool) -> None:
        if not self.grants[txn_id]:
            return
        pid, epoch = self.grants[txn_id][0] if stale else self.handle(txn_id)
        ok = self.shard.verify(txn_id, pid, epoch, tp) == E.NONE
        meta = self.shard.txns.get(txn_id)
        if ok and ((pid, epoch) != (meta.producer_id, meta.epoch) or tp not in meta.parts()
                   or meta.state != TxnState.ONGOING):
            self.violations.append(f"{txn_id} ({pid}, {epoch}) may write {tp} in {meta.state.name}")

    @rule()
    def time_out_all(self) -> None:
        for meta in self.shard.timed_out(math.inf):
            if self.shard.still_timed_out(meta) and not self.submit(self.shard.fence(meta)):
                self.carry_out(meta.txn_id)

    @rule(txn_id=st.sampled_from(IDS))
    def expire(self, txn_id: str) -> None:
        meta = self.shard.txns.get(txn_id)
        if meta is not None and meta in self.shard.idle(2 ** 62):
            self.submit(self.shard.expire(meta))

    @precondition(lambda self: bool(self.queue))
    @rule()
    def commit_point(self) -> None:
        self._settle_one()

    @rule()
    def roll_forward(self) -> None:
        for txn_id in list(self.shard.txns):
            self.carry_out(txn_id)

    @rule()
    def restart(self) -> None:
        """A crash: what reached the log is all a new coordinator has (the appends still
        waiting are in the log, so they count too)."""
        fresh = TxnShard()
        for txn_id, raw in self.log:
            fresh.replay((txn_id, None if raw is None else decode_value(txn_id, raw)))
        self.shard, self.queue = fresh, deque()

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def replay_gives_the_same_state(self) -> None:
        fresh = TxnShard()
        settled = len(self.log) - sum(len(op.records) for op in self.queue)
        for txn_id, raw in self.log[:settled]:
            fresh.replay((txn_id, None if raw is None else decode_value(txn_id, raw)))
        assert _encoded(fresh) == _encoded(self.shard)
        assert fresh.joined == _index(fresh)
        if not self.queue:
            assert fresh.joined == self.shard.joined
            assert not self.shard.initializing
            assert all(m.pending is None for m in self.shard.txns.values())

    @invariant()
    def no_violations(self) -> None:
        assert not self.violations, self.violations

    @invariant()
    def epochs_move_forward(self) -> None:
        for txn_id, grants in self.grants.items():
            for (p0, e0), (p1, e1) in zip(grants, grants[1:]):
                assert p1 != p0 or e1 > e0, (txn_id, grants)


TxnShardModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_txn_shard_model = TxnShardModel.TestCase
