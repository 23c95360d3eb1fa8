"""InitProducerId: a producer's id and epoch, and the fencing of its older instances.

A ProducerIdInit belongs to one TransactionCoordinator (semel.coordinator.txn): it hands
out a new producer id to a transactional id seen for the first time and bumps the epoch
of a known one, aborting (under a bumped epoch) the transaction an older instance left
open so that instance's writes are refused (KIP-360, KIP-588). It owns the set of ids
whose first record is being written and reaches its coordinator only through
InitCoordinator.
"""
from __future__ import annotations

import logging
from typing import Protocol

from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..storage.errors import StorageError
from .ports import ProducerIdSource
from .txn_branches import TxnBranches
from .txn_states import PREPARED, TxnMeta, TxnState, now_ms

log = logging.getLogger("semel.txn")

MAX_EPOCH = 32767
# From these request versions on, a fenced producer is told PRODUCER_FENCED;
# older clients only know INVALID_PRODUCER_EPOCH (KIP-588).
_FENCED_SINCE: dict[int, int] = {ApiKey.INIT_PRODUCER_ID: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 2, ApiKey.ADD_OFFSETS_TO_TXN: 2,
                 ApiKey.END_TXN: 2, ApiKey.TXN_OFFSET_COMMIT: 3}


def fenced_error(api_key: int, version: int) -> KafkaError:
    if version >= _FENCED_SINCE.get(api_key, 99):
        return KafkaError.PRODUCER_FENCED
    return KafkaError.INVALID_PRODUCER_EPOCH


class InitCoordinator(Protocol):
    """What InitProducerId needs of its transaction coordinator."""
    txns: dict[str, TxnMeta]

    async def transition(self, current: TxnMeta | None, new: TxnMeta) -> KafkaError: ...

    async def abort_with_bump(self, meta: TxnMeta) -> KafkaError: ...


class InitConfig(Protocol):
    transaction_max_timeout_ms: int


class ProducerIdInit:
    """`coordinator` the host, `branches` its joined branches (a new instance of a joined
    branch aborts the parent's batch), `pids` where new producer ids come from."""

    def __init__(self, coordinator: InitCoordinator, branches: TxnBranches, pids: ProducerIdSource,
                 config: InitConfig) -> None:
        self.coordinator = coordinator
        self.branches = branches
        self.pids = pids
        self.config = config
        # Transactional ids whose first record is being written: the in-flight guard of
        # an id with no state yet.
        self.initializing: set[str] = set()

    def reset(self) -> None:
        """The coordinator unloaded: writes in flight clean only the set they began in."""
        self.initializing = set()

    async def init_producer_id(self, txn_id: str | None, timeout_ms: int, producer_id: int,
                               producer_epoch: int, version: int) -> tuple[KafkaError, int, int]:
        try:
            await self.pids.reserve()   # cluster ids: fetched before deciding
            return await self._init_producer_id(txn_id, timeout_ms, producer_id, producer_epoch, version)
        except (StorageError, ConnectionError) as exc:   # the producer-id block could not be reserved on disk
            log.error("InitProducerId for %r failed: %s", txn_id, exc)
            return KafkaError.COORDINATOR_NOT_AVAILABLE, -1, -1

    async def _init_producer_id(self, txn_id: str | None, timeout_ms: int, producer_id: int,
                                producer_epoch: int, version: int) -> tuple[KafkaError, int, int]:
        if txn_id is None:
            return KafkaError.NONE, self.pids.next_id(), 0
        if not txn_id:   # Kafka: an empty transactional id is a bad request, not "none"
            return KafkaError.INVALID_REQUEST, -1, -1
        if not 0 < timeout_ms <= self.config.transaction_max_timeout_ms:
            return KafkaError.INVALID_TRANSACTION_TIMEOUT, -1, -1
        # Every decision is taken on the state as it is now: when the fence first has
        # to abort something (an await), the whole check runs again on what that left.
        for _ in range(3):
            meta = self.coordinator.txns.get(txn_id)
            if meta is None:
                return await self._init_new(txn_id, timeout_ms)
            err = self._refusal(meta, producer_id, producer_epoch, version)
            if err:
                return err, -1, -1
            if txn_id in self.branches.joined:
                # A new instance of a joined branch (a task re-run after a crash): the
                # batch it belonged to was not decided, so abort the parent with all its
                # branches, then fence as usual.
                if await self.branches.abort_parent_of(txn_id):
                    return KafkaError.CONCURRENT_TRANSACTIONS, -1, -1
                continue
            if meta.state == TxnState.ONGOING:
                # A new instance fences the old one: abort its transaction under a
                # bumped epoch (so its in-flight writes are rejected), then bump again.
                if await self.coordinator.abort_with_bump(meta):
                    return KafkaError.CONCURRENT_TRANSACTIONS, -1, -1
                continue
            return await self._bump(meta, timeout_ms)
        return KafkaError.CONCURRENT_TRANSACTIONS, -1, -1

    def _refusal(self, meta: TxnMeta, producer_id: int, producer_epoch: int, version: int) -> KafkaError:
        """Why InitProducerId cannot go on from `meta` now (NONE if it can)."""
        if meta.pending is not None or meta.txn_id in self.initializing or meta.state in PREPARED:
            return KafkaError.CONCURRENT_TRANSACTIONS
        if producer_id != -1 and not may_bump(meta, producer_id, producer_epoch):
            return fenced_error(ApiKey.INIT_PRODUCER_ID, version)
        return KafkaError.NONE

    async def _init_new(self, txn_id: str, timeout_ms: int) -> tuple[KafkaError, int, int]:
        initializing = self.initializing   # reset replaces the set: only ours is cleaned
        if txn_id in initializing:
            return KafkaError.CONCURRENT_TRANSACTIONS, -1, -1
        initializing.add(txn_id)
        try:
            pid = self.pids.next_id()
            new = TxnMeta(txn_id, pid, 0, -1, -1, timeout_ms, TxnState.EMPTY, None, -1, now_ms())
            err = await self.coordinator.transition(None, new)
        finally:
            initializing.discard(txn_id)
        return (err, -1, -1) if err else (KafkaError.NONE, pid, 0)

    async def _bump(self, meta: TxnMeta, timeout_ms: int) -> tuple[KafkaError, int, int]:
        """The next epoch of `meta`'s producer; a new producer id once the epochs run out."""
        pid, epoch = (self.pids.next_id(), 0) if meta.epoch + 1 >= MAX_EPOCH else (meta.producer_id, meta.epoch + 1)
        new = meta.copy(producer_id=pid, epoch=epoch, last_producer_id=meta.producer_id,
                        last_epoch=meta.epoch, timeout_ms=timeout_ms, state=TxnState.EMPTY,
                        partitions=None, start_ms=-1, update_ms=now_ms())
        err = await self.coordinator.transition(meta, new)
        return (err, -1, -1) if err else (KafkaError.NONE, pid, epoch)


def may_bump(meta: TxnMeta, producer_id: int, epoch: int) -> bool:
    """KIP-360: a producer passing its id/epoch may bump if it is the current
    instance, or the one whose transaction the coordinator just aborted."""
    if producer_id == meta.producer_id and epoch in (meta.epoch, meta.last_epoch):
        return True
    return producer_id == meta.last_producer_id and epoch == meta.last_epoch
