"""Producer ids from the cluster's counter instead of the local file.

The transaction coordinator takes ids synchronously (`next_id()`), so this keeps a
local pool and refills it from `ClusterView.allocate_producer_ids` ahead of need:
`reserve()` (awaited by InitProducerId before it decides) fetches a block when the
pool runs low. Blocks come from a counter advanced by CAS in etcd, so ids are
unique across brokers and restarts; ids left in a pool when a broker stops are
simply never used. The coordinator epoch stays the local file's (bumped per start).
"""
from __future__ import annotations

import asyncio

from typing import TYPE_CHECKING, Protocol

from ..storage.errors import StorageError

if TYPE_CHECKING:
    from .state import ClusterView

BLOCK_SIZE = 1000


class EpochSource(Protocol):
    """What this reads of the broker's own producer-id source."""

    @property
    def coordinator_epoch(self) -> int: ...


class ClusterProducerIds:
    """A ProducerIdSource (semel.coordinator.ports). `local` is the broker's own source,
    read only for its coordinator epoch; `cluster` the ClusterView."""

    def __init__(self, local: EpochSource, cluster: ClusterView, block_size: int = BLOCK_SIZE):
        self._local = local
        self._cluster = cluster
        self.block_size = block_size
        self._blocks: list[tuple[int, int]] = []   # [next, end) ranges, in order
        self._lock = asyncio.Lock()

    @property
    def coordinator_epoch(self) -> int:
        return self._local.coordinator_epoch

    def available(self) -> int:
        return sum(end - nxt for nxt, end in self._blocks)

    async def reserve(self, want: int = 2) -> None:
        """Have at least `want` ids in the pool (EtcdError when etcd is unreachable)."""
        async with self._lock:
            while self.available() < want:
                first = await self._cluster.allocate_producer_ids(self.block_size)
                self._blocks.append((first, first + self.block_size))

    def next_id(self) -> int:
        if not self._blocks:   # reserve() was not awaited or etcd failed: a retriable refusal
            raise StorageError("no producer ids reserved from the cluster")
        nxt, end = self._blocks[0]
        if nxt + 1 >= end:
            self._blocks.pop(0)
        else:
            self._blocks[0] = (nxt + 1, end)
        return nxt
