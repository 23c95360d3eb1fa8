"""The transaction coordinator's shard: its state and every decision on it, with no I/O.

The state of one __transaction_state partition is `txns` (the last record of every
transactional id) and the branch index `joined` derived from it. `replay(record)` is the
one way that state changes, for a record just committed (txn.TransactionCoordinator's
write path) and for a record read back at load alike, so a restart and a live write
cannot diverge.

Each operation is a plain function of the state and a request that returns a `TxnOp`:
the records to write and the answer to give once they are committed (or the answer
alone, a refusal). Nothing here appends, waits or sends; the coordinator hands an op to
its runtime: take its locks, append, wait for the commit point, `replay`, answer.

A lock is what keeps two operations on one id from being decided on the same state
while the first one's records wait for their commit point: `pending` on the id's state
(Kafka's prepareTransitionTo), `initializing` for an id with no record yet, and branch
reservations in `joined` for the branches a join is adding. Locks are never logged and
never replayed: they live as long as one write.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..protocol import records
from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..protocol.txn_hash import partition_for
from .txn_branches import BRANCH_PREFIX, branch_of
from .txn_states import (
    COMPLETE_OF, COMPLETED, PREPARED, TxnMeta, TxnState, can_transition, decode_value, end_txn_outcome, now_ms,
)

log = logging.getLogger("semel.txn")

R = TypeVar("R")
TopicPartition = tuple[str, int]
# One record of the log: a transactional id and its new state (None: a tombstone, the id expired).
TxnRecord = tuple[str, TxnMeta | None]
# (transactional id, its state when decided (None: no record yet), the state it moves to)
Lock = tuple[str, TxnMeta | None, TxnState]
InitAnswer = tuple[KafkaError, int, int]

MAX_EPOCH = 32767
# From these request versions on, a fenced producer is told PRODUCER_FENCED;
# older clients only know INVALID_PRODUCER_EPOCH (KIP-588).
_FENCED_SINCE: dict[int, int] = {ApiKey.INIT_PRODUCER_ID: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 2,
                                 ApiKey.ADD_OFFSETS_TO_TXN: 2, ApiKey.END_TXN: 2, ApiKey.TXN_OFFSET_COMMIT: 3}


def fenced_error(api_key: int, version: int) -> KafkaError:
    if version >= _FENCED_SINCE.get(api_key, 99):
        return KafkaError.PRODUCER_FENCED
    return KafkaError.INVALID_PRODUCER_EPOCH


def may_bump(meta: TxnMeta, producer_id: int, epoch: int) -> bool:
    """KIP-360: a producer passing its id/epoch may bump if it is the current
    instance, or the one whose transaction the coordinator just aborted."""
    if producer_id == meta.producer_id and epoch in (meta.epoch, meta.last_epoch):
        return True
    return producer_id == meta.last_producer_id and epoch == meta.last_epoch


@dataclass(eq=False)
class TxnOp(Generic[R]):
    """What an operation decided: `records` to commit, then `response`. With no records
    the response is the answer at once. `locks` are taken before the append and released
    once the records are replayed (or failed); `joins` are the branches `parent` reserves
    meanwhile. `durable=False`: the records count once appended (a Complete record: its
    markers are durable already, and a lost one is rolled forward again)."""
    response: R
    records: list[TxnRecord] = field(default_factory=list)
    locks: list[Lock] = field(default_factory=list)
    joins: list[str] = field(default_factory=list)
    durable: bool = True
    # InitProducerId only: abort this transaction first (the id's own, or the parent of a
    # joined branch), then decide again on what that left.
    fence: TxnMeta | None = None
    _initializing: set[str] | None = None


def answer(response: R) -> TxnOp[R]:
    """An operation that writes nothing."""
    return TxnOp(response)


def timeout_deadline(prev: TxnMeta | None, meta: TxnMeta) -> float:
    """When (time.monotonic()) the ONGOING transaction `meta` times out. The same
    transaction growing by a partition keeps its deadline; a new one gets its whole
    timeout. One replayed from the log (a restart, a failover) gets what its wall-clock
    start leaves, between nothing and the whole timeout, so a clock stepped meanwhile
    can neither end it early by more than that nor keep it open for longer."""
    if (prev is not None and prev.state == TxnState.ONGOING and prev.start_ms == meta.start_ms
            and (prev.producer_id, prev.epoch) == (meta.producer_id, meta.epoch)):
        return prev.deadline
    left_ms = min(max(meta.start_ms + meta.timeout_ms - now_ms(), 0), meta.timeout_ms)
    return time.monotonic() + left_ms / 1000


class TxnShard:
    """The state of one transaction coordinator partition. `txn_partitions`: the partition
    count of __transaction_state (a branch must map to its parent's partition)."""

    def __init__(self, txn_partitions: int = 1) -> None:
        self.txn_partitions = txn_partitions
        self.txns: dict[str, TxnMeta] = {}
        # branch transactional id -> the parent it is joined to (ongoing or prepared parents)
        self.joined: dict[str, str] = {}
        # Transactional ids whose first record is being written (their lock).
        self.initializing: set[str] = set()

    # --- replay: the one way state changes ---------------------------------------------

    def clear(self) -> None:
        self.txns.clear()
        self.joined.clear()
        # Writes still in flight release only the set they locked in.
        self.initializing = set()

    def replay_batch(self, buf: bytes | memoryview, pos: int, hdr: records.BatchHeader) -> None:
        """One batch of the log, as the runtime's load reads it."""
        if hdr.is_control:   # never written here since AddPartitionsToTxn refuses internal topics
            log.warning("ignoring a control batch at offset %d of __transaction_state", hdr.base_offset)
            return
        for rec in records.iter_records(buf, pos):
            if rec.key is not None:
                txn_id = rec.key.decode()
                self.replay((txn_id, None if rec.value is None else decode_value(txn_id, rec.value)))

    def replay(self, record: TxnRecord) -> None:
        txn_id, meta = record
        previous = self.txns.get(txn_id)
        if meta is None:
            self.txns.pop(txn_id, None)
            return
        if meta.state == TxnState.ONGOING:
            meta.deadline = timeout_deadline(previous, meta)
        self._index(previous, meta)
        if meta.state == TxnState.DEAD:
            self.txns.pop(txn_id, None)
        else:
            self.txns[txn_id] = meta

    def _index(self, old: TxnMeta | None, new: TxnMeta) -> None:
        """Keep `joined` equal to what the parents' states say."""
        for tp in old.parts() if old is not None else ():
            b = branch_of(tp)
            if b is not None and self.joined.get(b) == new.txn_id:
                del self.joined[b]
        if new.state in PREPARED or new.state == TxnState.ONGOING:
            for tp in new.parts():
                b = branch_of(tp)
                if b is not None:
                    self.joined[b] = new.txn_id

    def state_of(self, txn_id: str) -> TxnState | None:
        meta = self.txns.get(txn_id)
        return None if meta is None else meta.state

    def snapshot(self) -> list[TxnMeta]:
        """Every live id as it stands (compaction rewrites the log with these)."""
        return list(self.txns.values())

    # --- locks ---------------------------------------------------------------------------

    def begin(self, current: TxnMeta | None, target: TxnState) -> KafkaError:
        """The one place a transactional id's state change starts (Kafka's
        prepareTransitionTo): refused when the table forbids it or another change of
        that id is in flight; otherwise `pending` holds the target until the record is
        replayed (the write path clears it). None: an id with no record yet, whose lock
        is `initializing`."""
        if current is not None and (self.txns.get(current.txn_id) is not current or current.pending is not None):
            # The caller looked before an await and the state moved on since.
            return KafkaError.CONCURRENT_TRANSACTIONS
        if not can_transition(None if current is None else current.state, target):
            return KafkaError.INVALID_TXN_STATE
        if current is not None:
            current.pending = target
        return KafkaError.NONE

    def lock(self, op: TxnOp[R]) -> KafkaError:
        """Take `op`'s locks, all or none."""
        taken: list[TxnMeta] = []
        for txn_id, current, target in op.locks:
            err = (KafkaError.CONCURRENT_TRANSACTIONS if current is None and txn_id in self.initializing
                   else self.begin(current, target))
            if err:
                for meta in taken:
                    meta.pending = None
                return err
            if current is None:
                op._initializing = self.initializing
                self.initializing.add(txn_id)
            else:
                taken.append(current)
        # Reserved before the append, so no timeout, EndTxn or fence can end a branch while
        # its join is being written; released in unlock if the join never took effect.
        for b in op.joins:
            self.joined.setdefault(b, op.records[0][0])
        return KafkaError.NONE

    def unlock(self, op: TxnOp[R]) -> None:
        for txn_id, current, _ in op.locks:
            if current is not None:
                current.pending = None
            elif op._initializing is not None:
                op._initializing.discard(txn_id)
        if op.joins:
            parent = op.records[0][0]
            mine = self.txns.get(parent)
            for b in op.joins:
                if self.joined.get(b) == parent and (mine is None or (BRANCH_PREFIX + b, 0) not in mine.parts()):
                    del self.joined[b]

    # --- InitProducerId ----------------------------------------------------------------

    def init_producer_id(self, txn_id: str, timeout_ms: int, producer_id: int, producer_epoch: int,
                         version: int, next_id: Callable[[], int]) -> TxnOp[InitAnswer]:
        """A new producer id for an id seen first, the next epoch of a known one; an open
        transaction of an older instance is fenced first (`fence`). `next_id` hands out
        producer ids and is called only when one is used."""
        meta = self.txns.get(txn_id)
        if meta is None:
            if txn_id in self.initializing:
                return answer((KafkaError.CONCURRENT_TRANSACTIONS, -1, -1))
            pid = next_id()
            new = TxnMeta(txn_id, pid, 0, -1, -1, timeout_ms, TxnState.EMPTY, None, -1, now_ms())
            return TxnOp((KafkaError.NONE, pid, 0), [(txn_id, new)], [(txn_id, None, TxnState.EMPTY)])
        if meta.pending is not None or txn_id in self.initializing or meta.state in PREPARED:
            return answer((KafkaError.CONCURRENT_TRANSACTIONS, -1, -1))
        if producer_id != -1 and not may_bump(meta, producer_id, producer_epoch):
            return answer((fenced_error(ApiKey.INIT_PRODUCER_ID, version), -1, -1))
        if txn_id in self.joined:
            # A new instance of a joined branch (a task re-run after a crash): the batch it
            # belonged to was not decided, so the parent is aborted with all its branches.
            parent = self.txns.get(self.joined[txn_id])
            if parent is None or parent.pending is not None or parent.state != TxnState.ONGOING:
                return answer((KafkaError.CONCURRENT_TRANSACTIONS, -1, -1))   # being decided
            log.info("aborting %s: its branch %s is initialised again", parent.txn_id, txn_id)
            return TxnOp((KafkaError.NONE, -1, -1), fence=parent)
        if meta.state == TxnState.ONGOING:
            # A new instance fences the old one: its transaction is aborted under a bumped
            # epoch (so its in-flight writes are rejected), then the epoch is bumped again.
            return TxnOp((KafkaError.NONE, -1, -1), fence=meta)
        pid, epoch = (next_id(), 0) if meta.epoch + 1 >= MAX_EPOCH else (meta.producer_id, meta.epoch + 1)
        new = meta.copy(producer_id=pid, epoch=epoch, last_producer_id=meta.producer_id, last_epoch=meta.epoch,
                        timeout_ms=timeout_ms, state=TxnState.EMPTY, partitions=None, start_ms=-1,
                        update_ms=now_ms())
        return TxnOp((KafkaError.NONE, pid, epoch), [(txn_id, new)], [(txn_id, meta, TxnState.EMPTY)])

    def fence(self, meta: TxnMeta) -> TxnOp[KafkaError]:
        """Abort `meta`'s transaction under the next epoch. Never a new producer id here: the
        markers must carry the id the transaction's data was written with. Epochs handed
        to clients stop below MAX_EPOCH, which is kept for this fence; the next
        InitProducerId then moves on to a new producer id."""
        prepared = meta.copy(state=TxnState.PREPARE_ABORT, epoch=min(meta.epoch + 1, MAX_EPOCH),
                             last_producer_id=meta.producer_id, last_epoch=meta.epoch, update_ms=now_ms())
        return self._step(meta, prepared, KafkaError.NONE)

    def _step(self, meta: TxnMeta, new: TxnMeta, response: R) -> TxnOp[R]:
        return TxnOp(response, [(meta.txn_id, new)], [(meta.txn_id, meta, new.state)])

    # --- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------

    def _current(self, txn_id: str, producer_id: int, epoch: int, api_key: int,
                 version: int) -> tuple[TxnMeta | None, KafkaError]:
        """The state a request of this producer instance acts on, or why none."""
        if not txn_id:
            return None, KafkaError.INVALID_REQUEST
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != producer_id:
            return None, KafkaError.INVALID_PRODUCER_ID_MAPPING
        if epoch != meta.epoch:
            return None, fenced_error(api_key, version)
        return meta, KafkaError.NONE

    def add_partitions(self, txn_id: str, producer_id: int, epoch: int, partitions: list[TopicPartition],
                       version: int, api_key: int, partition_error: Callable[[TopicPartition], KafkaError]
                       ) -> TxnOp[dict[TopicPartition, KafkaError]]:
        """Partitions join the ongoing transaction (one starts if none is), all or none.
        `partition_error` says why a real partition cannot join (NONE if it can)."""
        meta, err = self._current(txn_id, producer_id, epoch, api_key, version)
        if meta is not None and (meta.pending is not None or meta.state in PREPARED or txn_id in self.joined):
            meta, err = None, KafkaError.CONCURRENT_TRANSACTIONS
        if meta is None:
            return answer({tp: err for tp in partitions})

        def refusal(tp: TopicPartition) -> KafkaError:
            branch = branch_of(tp)
            if branch is None:
                return partition_error(tp)
            if not self.coordinated_here(txn_id, branch):
                return KafkaError.INVALID_TOPIC_EXCEPTION
            return self.join_error(meta, branch)
        refused = {tp: refusal(tp) for tp in partitions}
        if any(refused.values()):  # all or nothing
            return answer({tp: err or KafkaError.OPERATION_NOT_ATTEMPTED for tp, err in refused.items()})
        joined = {tp: KafkaError.NONE for tp in partitions}
        wanted = meta.parts() | frozenset(partitions)
        if meta.state == TxnState.ONGOING and wanted == meta.parts():
            return answer(joined)
        now = now_ms()
        start = meta.start_ms if meta.state == TxnState.ONGOING else now
        op = self._step(meta, meta.copy(state=TxnState.ONGOING, partitions=wanted, start_ms=start, update_ms=now),
                        joined)
        op.joins = [b for b in map(branch_of, partitions) if b is not None and b not in self.joined]
        return op

    def coordinated_here(self, parent: str, branch: str) -> bool:
        """Whether `branch` belongs to the same __transaction_state partition as `parent`."""
        n = self.txn_partitions
        return n == 1 or partition_for(branch, n) == partition_for(parent, n)

    def join_error(self, parent: TxnMeta, b: str) -> KafkaError:
        """Why `parent` cannot join the branch `b` (NONE if it can). One level only: a
        branch has no branches and is no parent's parent."""
        if self.joined.get(b) == parent.txn_id:
            return KafkaError.NONE                       # a retried join
        branch = self.txns.get(b)
        if (b == parent.txn_id or parent.txn_id in self.joined or b in self.joined or branch is None
                or any(branch_of(x) is not None for x in branch.parts())):
            return KafkaError.INVALID_TXN_STATE
        if branch.pending is not None:
            return KafkaError.CONCURRENT_TRANSACTIONS
        # Only an ongoing branch holds data to decide; an aborted one (timeout) must
        # fail the join, never be committed as if it were whole.
        return KafkaError.NONE if branch.state == TxnState.ONGOING else KafkaError.INVALID_TXN_STATE

    # --- Produce and TxnOffsetCommit (KIP-890 part 1) -----------------------------------

    def verify(self, txn_id: str, producer_id: int, epoch: int, tp: TopicPartition) -> KafkaError:
        """May this producer instance write to tp inside its transaction?"""
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != producer_id:
            return KafkaError.INVALID_PRODUCER_ID_MAPPING
        if epoch != meta.epoch:
            return KafkaError.INVALID_PRODUCER_EPOCH
        if (meta.state != TxnState.ONGOING or meta.pending in PREPARED or tp not in meta.parts()
                or txn_id in self.joined):
            return KafkaError.INVALID_TXN_STATE
        return KafkaError.NONE

    # --- EndTxn -----------------------------------------------------------------------------

    def end_txn(self, txn_id: str, producer_id: int, epoch: int, commit: bool, version: int) -> TxnOp[KafkaError]:
        """The decision: a Prepare record (the markers follow once it is durable)."""
        meta, err = self._current(txn_id, producer_id, epoch, ApiKey.END_TXN, version)
        if meta is None:
            return answer(err)
        if meta.pending is not None or txn_id in self.joined:
            return answer(KafkaError.CONCURRENT_TRANSACTIONS)   # a joined branch ends with its parent
        target = end_txn_outcome(meta.state, commit)
        if isinstance(target, KafkaError):
            return answer(target)
        return self._step(meta, meta.copy(state=target, update_ms=now_ms()), KafkaError.NONE)

    # --- carrying out a decision ------------------------------------------------------------

    def prepare_branches(self, parent: TxnMeta, commit: bool) -> tuple[TxnOp[KafkaError], list[TxnMeta]]:
        """The parent's decision carried to its branches not completed yet: the op prepares
        the ongoing ones the parent's way in one record batch; the list is every branch
        the decision's markers are for (look them up again once the op is replayed).
        CONCURRENT_TRANSACTIONS when a branch is busy (the completion retries)."""
        target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        live: list[TxnMeta] = []
        for tp in sorted(parent.parts()):
            branch = branch_of(tp)
            meta = self.txns.get(branch) if branch is not None else None
            if meta is None or meta.state in COMPLETED:
                if commit and meta is not None and meta.state == TxnState.COMPLETE_ABORT:
                    log.error("branch %s of committed %s was aborted: the batch is incomplete", branch, parent.txn_id)
                continue
            if meta.pending is not None:
                return answer(KafkaError.CONCURRENT_TRANSACTIONS), []
            if meta.state in PREPARED and meta.state != target:
                # Never expected (a joined branch cannot end on its own): it keeps its own
                # decision, carried out when the coordinator next starts.
                log.error("branch %s of %s is prepared the other way (%s)", branch, parent.txn_id, meta.state.name)
                continue
            live.append(meta)
        ongoing = [m for m in live if m.state == TxnState.ONGOING]
        return self._steps(ongoing, [m.copy(state=target, update_ms=now_ms()) for m in ongoing]), live

    def prepared(self, live: list[TxnMeta], target: TxnState) -> list[TxnMeta] | None:
        """The branches of `live` as prepared by `prepare_branches`' op; None if one is not."""
        found = [p for m in live if (p := self.txns.get(m.txn_id)) is not None and p.pending is None
                 and p.state == target]
        return found if len(found) == len(live) else None

    def complete_branches(self, branches: list[TxnMeta]) -> TxnOp[KafkaError]:
        """The Complete records of prepared branches whose markers are all written."""
        return self._steps(branches, [m.copy(state=COMPLETE_OF[m.state], partitions=None, update_ms=now_ms())
                                      for m in branches], durable=False)

    def complete(self, meta: TxnMeta) -> TxnOp[KafkaError]:
        """The Complete record of a decision whose markers are all written. Unlocked: the
        completion holds `meta`'s lock from its start (begin(meta, COMPLETE_...))."""
        final = meta.copy(state=COMPLETE_OF[meta.state], partitions=None, update_ms=now_ms())
        return TxnOp(KafkaError.NONE, [(meta.txn_id, final)], durable=False)

    def _steps(self, currents: list[TxnMeta], news: list[TxnMeta], *, durable: bool = True) -> TxnOp[KafkaError]:
        return TxnOp(KafkaError.NONE, [(n.txn_id, n) for n in news],
                     [(c.txn_id, c, n.state) for c, n in zip(currents, news)], durable=durable)

    # --- timeouts and expiry -----------------------------------------------------------

    def timed_out(self, now: float) -> list[TxnMeta]:
        """The ongoing transactions past their deadline (time.monotonic()). A joined branch
        is timed by its parent (the parent's abort ends it too)."""
        return [m for m in self.txns.values() if m.state == TxnState.ONGOING and m.pending is None
                and m.deadline < now and m.txn_id not in self.joined]

    def still_timed_out(self, meta: TxnMeta) -> bool:
        """Whether `meta` is still to be aborted (the client may have ended it, or a parent
        joined it, while an earlier abort was written)."""
        return self.txns.get(meta.txn_id) is meta and meta.pending is None and meta.txn_id not in self.joined

    def idle(self, cutoff_ms: int) -> list[TxnMeta]:
        """Ids with no transaction, unchanged since before `cutoff_ms` (wall clock)."""
        return [m for m in self.txns.values() if m.state in COMPLETED and m.pending is None and m.update_ms < cutoff_ms]

    def expire(self, meta: TxnMeta) -> TxnOp[KafkaError]:
        """The tombstone of an idle id."""
        return TxnOp(KafkaError.NONE, [(meta.txn_id, None)], [(meta.txn_id, meta, TxnState.DEAD)])
