"""ClusterProducerIds (semel.cluster.producer_ids): the transaction coordinator's
synchronous next_id() over blocks fetched asynchronously from the cluster counter.
Seeded interleavings of several brokers' pools reserving and taking ids at once."""
from __future__ import annotations

import asyncio
import random

import pytest

from semel.cluster.producer_ids import ClusterProducerIds
from semel.cluster.state import MemoryClusterView
from semel.storage.errors import StorageError


class _Local:
    coordinator_epoch = 7


class _SlowView(MemoryClusterView):
    """Allocation is a round trip: other coroutines run while it is in flight."""

    def __init__(self, table, node_id, rng):
        super().__init__(table, node_id)
        self.rng = rng

    async def allocate_producer_ids(self, block_size: int) -> int:
        for _ in range(self.rng.randrange(3)):
            await asyncio.sleep(0)
        return await super().allocate_producer_ids(block_size)


def test_next_id_without_a_reserved_block_is_a_retriable_refusal():
    pool = ClusterProducerIds(_Local(), MemoryClusterView(MemoryClusterView.table(), 0), block_size=3)
    with pytest.raises(StorageError):
        pool.next_id()
    assert pool.coordinator_epoch == 7


@pytest.mark.parametrize("seed", range(50))
def test_ids_are_unique_across_pools_and_reserve_always_covers_the_next_take(seed):
    rng = random.Random(seed)
    table = MemoryClusterView.table()
    pools = [ClusterProducerIds(_Local(), _SlowView(table, n, rng), block_size=rng.choice([1, 2, 5]))
             for n in range(3)]
    taken: list[int] = []

    async def worker(pool):
        for _ in range(rng.randrange(1, 15)):
            await pool.reserve()
            taken.append(pool.next_id())     # no await between: the reserved ids are still there
            assert pool.available() >= 0
            for _ in range(rng.randrange(2)):
                await asyncio.sleep(0)

    async def main():
        await asyncio.gather(*(worker(pools[rng.randrange(3)]) for _ in range(6)))
    asyncio.run(main())
    assert len(taken) == len(set(taken))
    # Never an id the cluster counter has not handed out.
    assert max(taken) < table.next_pid
