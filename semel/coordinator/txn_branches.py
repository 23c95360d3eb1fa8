"""Branches of a transaction (semel extension for the Spark sink's atomic micro-batches).

A parent transaction may join another ongoing transaction, its branch, by adding the
pseudo-partition (`__semel_branch:<branch transactional id>`, 0) with a standard
AddPartitionsToTxn. The pseudo-partition is then one of the parent's partitions, so it
is in the parent's log records and its Prepare record decides the branch too;
completing the parent "writes the marker" of a branch by preparing and completing the
branch under the branch's own producer id/epoch. All branches of one decision are
prepared in one coordinator record batch, and each data partition gets the markers
of every branch in one append (semel.coordinator.txn_completion), so a
read_committed reader sees a decided batch in a partition whole or not at all. While joined, a branch is the
parent's: its own timeout, EndTxn and produce are refused, and an InitProducerId of
the branch (a restarted task) aborts the undecided parent first, taking every branch
with it. A Kafka broker refuses the pseudo-topic (invalid name), which is how the sink
detects the extension. In a cluster a branch must map to its parent's
__transaction_state partition (same coordinator); one that does not is refused the
same way.

A TxnBranches belongs to one TransactionCoordinator (semel.coordinator.txn): it owns
the branch index `joined` and decides joins, and reaches the coordinator only through
BranchedCoordinator (its states, and the transitions that log them).
"""
from __future__ import annotations

import logging
from typing import Protocol

from ..protocol.errors import KafkaError
from ..protocol.txn_hash import partition_for
from ..storage.errors import AppendError
from .txn_states import COMPLETE_OF, COMPLETED, PREPARED, TxnMeta, TxnState, now_ms

log = logging.getLogger("semel.txn")

BRANCH_PREFIX = "__semel_branch:"


def branch_of(tp: tuple[str, int]) -> str | None:
    """The branch transactional id a pseudo-partition names, or None for a real partition."""
    topic, partition = tp
    if topic.startswith(BRANCH_PREFIX) and partition == 0 and len(topic) > len(BRANCH_PREFIX):
        return topic[len(BRANCH_PREFIX):]
    return None


class BranchedCoordinator(Protocol):
    """What TxnBranches needs of its transaction coordinator."""
    txns: dict[str, TxnMeta]

    async def transition_all(self, currents: list[TxnMeta], news: list[TxnMeta],
                             durable: bool = True) -> KafkaError: ...

    async def abort_with_bump(self, meta: TxnMeta) -> KafkaError: ...


class TxnBranches:
    """Branch joins and their completion; `joined` maps a branch transactional id to
    the parent it is joined to (ongoing or prepared parents only). `txn_partitions`:
    the partition count of __transaction_state."""

    def __init__(self, coordinator: BranchedCoordinator, txn_partitions: int) -> None:
        self._coordinator = coordinator
        self.txn_partitions = txn_partitions
        self.joined: dict[str, str] = {}

    def index(self, old: TxnMeta | None, new: TxnMeta) -> None:
        """Keep `joined` equal to what the parents' states say (live and replay alike)."""
        for tp in old.parts() if old is not None else ():
            b = branch_of(tp)
            if b is not None and self.joined.get(b) == new.txn_id:
                del self.joined[b]
        if new.state in PREPARED or new.state == TxnState.ONGOING:
            for tp in new.parts():
                b = branch_of(tp)
                if b is not None:
                    self.joined[b] = new.txn_id

    async def abort_parent_of(self, branch: str) -> KafkaError:
        parent = self._coordinator.txns.get(self.joined[branch])
        if parent is None or parent.pending is not None or parent.state != TxnState.ONGOING:
            return KafkaError.CONCURRENT_TRANSACTIONS   # being decided: the caller retries
        log.info("aborting %s: its branch %s is initialised again", parent.txn_id, branch)
        return await self._coordinator.abort_with_bump(parent)

    def coordinated_here(self, parent: str, branch: str) -> bool:
        """Whether `branch` belongs to the same __transaction_state partition as `parent`."""
        n = self.txn_partitions
        return n == 1 or partition_for(branch, n) == partition_for(parent, n)

    def join_error(self, parent: TxnMeta, b: str) -> KafkaError:
        """Why `parent` cannot join the branch `b` (NONE if it can). One level only: a
        branch has no branches and is no parent's parent."""
        if self.joined.get(b) == parent.txn_id:
            return KafkaError.NONE                       # a retried join
        branch = self._coordinator.txns.get(b)
        if (b == parent.txn_id or parent.txn_id in self.joined or b in self.joined or branch is None
                or any(branch_of(x) is not None for x in branch.parts())):
            return KafkaError.INVALID_TXN_STATE
        if branch.pending is not None:
            return KafkaError.CONCURRENT_TRANSACTIONS
        # Only an ongoing branch holds data to decide; an aborted one (timeout) must
        # fail the join, never be committed as if it were whole.
        return KafkaError.NONE if branch.state == TxnState.ONGOING else KafkaError.INVALID_TXN_STATE

    async def prepare(self, parent: TxnMeta, commit: bool) -> list[TxnMeta]:
        """The parent's decision carried to its branches not completed yet: the ongoing
        ones are prepared the parent's way in one record batch (one append, one fsync).
        Returns them, prepared, for their markers. Idempotent (a roll-forward after a
        crash finds them ongoing, prepared or complete); AppendError makes the parent retry."""
        target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        live: list[TxnMeta] = []
        for tp in sorted(parent.parts()):
            branch = branch_of(tp)
            meta = self._coordinator.txns.get(branch) if branch is not None else None
            if meta is None or meta.state in COMPLETED:
                if commit and meta is not None and meta.state == TxnState.COMPLETE_ABORT:
                    log.error("branch %s of committed %s was aborted: the batch is incomplete", branch, parent.txn_id)
                continue
            if meta.pending is not None:
                raise AppendError(KafkaError.CONCURRENT_TRANSACTIONS, f"branch {branch} is busy")
            if meta.state in PREPARED and meta.state != target:
                # Never expected (a joined branch cannot end on its own): it keeps its own
                # decision, carried out when the coordinator next starts.
                log.error("branch %s of %s is prepared the other way (%s)", branch, parent.txn_id, meta.state.name)
                continue
            live.append(meta)
        ongoing = [m for m in live if m.state == TxnState.ONGOING]
        if ongoing:
            err = await self._coordinator.transition_all(ongoing, [m.copy(state=target, update_ms=now_ms())
                                                                   for m in ongoing])
            if err:
                raise AppendError(err, f"{len(ongoing)} branch(es) of {parent.txn_id} not prepared: {err.name}")
        txns = self._coordinator.txns
        prepared = [p for m in live if (p := txns.get(m.txn_id)) is not None and p.pending is None and p.state == target]
        if len(prepared) < len(live):
            raise AppendError(KafkaError.COORDINATOR_NOT_AVAILABLE, f"branches of {parent.txn_id} not prepared")
        return prepared

    async def complete(self, branches: list[TxnMeta]) -> None:
        """The Complete records of prepared branches whose markers are all written, in one
        record batch. Like the parent's, it need not wait for its fsync: if lost, the
        parent's Prepare is replayed and its branches are rolled forward again."""
        if not branches:
            return
        err = await self._coordinator.transition_all(branches, [m.copy(state=COMPLETE_OF[m.state], partitions=None,
                                                           update_ms=now_ms()) for m in branches], durable=False)
        if err:
            raise AppendError(err, f"{len(branches)} branch(es) not completed: {err.name}")
