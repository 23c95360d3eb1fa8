"""Share groups in a cluster: each share-partition lives at its partition's leader.

librdkafka sends ShareFetch and ShareAcknowledge to each partition's leader and
ShareGroupHeartbeat to the group's coordinator, so a broker keeps, in one `ShareState`:
the members of the share groups it coordinates (soft state, as on a single node), the
share sessions opened with it, and the share-partitions of the partitions it leads.

What must survive a broker (acknowledgements, archiving, where a share-partition
starts, group configs) goes to a `ShareStore` (etcd in a cluster) before the answer.
Acquisitions are not written: their locks die with the leader, and the new leader
delivers those records again. A leader `claim`s a partition's share state at its
leader epoch before it reads it, and every write is fenced by that epoch: a deposed
leader that still answers cannot write over what its successor has read.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Callable

from ..protocol.errors import KafkaError
from ..storage.log import PartitionLog
from .ports import CoordinatorSeat, ShareStore
from .share_coordinator import ShareCoordinator
from .share_locks import LockTimers
from .share_state import Pair, config_key, partition_key

log = logging.getLogger("semel.coordinator.share")


class _NoSeat:
    """A cluster's share coordinator is no seated coordinator: it serves at once, on no
    internal partition."""

    topic = ""
    partition = 0

    def start(self, coordinator: object) -> None:
        pass

    async def stop(self) -> None:
        pass

    def error(self) -> KafkaError:
        return KafkaError.NONE

    def serving(self) -> bool:
        return True


class LeaderShareCoordinator(ShareCoordinator):
    """The share groups of one cluster member (see the module docstring)."""

    members_here = False   # members are at the group coordinator, maybe another broker

    def __init__(self, store: ShareStore, clock: Callable[[], int] | None = None) -> None:
        seat: CoordinatorSeat = _NoSeat()
        super().__init__(None, seat=seat, clock=clock)
        self.store = store
        # Lock timers fire here for the partitions led here (a write for one no longer
        # led is fenced off by the store).
        self.locks = LockTimers(self.runtime.timers, self.state, lambda: True, self._locks_expired)
        # (group, topic, partition) -> leader epoch its share-partition was read at
        self.loaded: dict[tuple[str, str, int], int] = {}
        self.claimed: dict[tuple[str, int], int] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}

    async def start(self) -> None:
        self.runtime.start(run_timers=True)   # the lock timers; no log to load or compact

    def start_seat(self) -> None:
        pass

    def load(self, plog: PartitionLog, epoch: int | None) -> None:
        pass

    async def stop(self) -> None:
        self.locks.cancel_all()
        await self.runtime.stop(cancel_tasks=False)
        self.state.clear()

    def error(self) -> KafkaError:
        return KafkaError.NONE

    async def compact(self) -> bool:
        return False   # the store keeps one value per key

    def persist(self, pairs: list[Pair]) -> "asyncio.Future[KafkaError]":
        fences = {}
        for key, _ in pairs:
            k = json.loads(key)
            if k.get("k") == "partition":
                tp = (k["t"], int(k["p"]))
                fences[tp] = self.claimed.get(tp, -1)
        return asyncio.ensure_future(self.store.write(pairs, fences))

    def forget_topics(self, names: set[str]) -> None:
        super().forget_topics(names)
        self.loaded = {k: e for k, e in self.loaded.items() if k[1] not in names}
        self.claimed = {tp: e for tp, e in self.claimed.items() if tp[0] not in names}

    async def refresh_configs(self, group_id: str) -> None:
        """The group's configs as the store has them (another broker may have set them)."""
        try:
            raw = await self.store.read(config_key(group_id))
        except ConnectionError as exc:   # the ones known here stand until the next try
            log.warning("share group %s: configs not read: %s", group_id, exc)
            return
        self.state.apply(config_key(group_id), raw)

    async def prepare(self, group_id: str, led: dict[tuple[str, int], int]) -> dict[tuple[str, int], KafkaError]:
        """Read the share-partitions of `group_id` on partitions led here ((topic,
        partition) -> leader epoch) that were not read at that epoch; the ones that
        could not be read, with why."""
        out: dict[tuple[str, int], KafkaError] = {}
        for tp, epoch in sorted(led.items()):
            spk = (group_id, *tp)
            if self.loaded.get(spk) == epoch:
                continue
            async with self._locks.setdefault(tp, asyncio.Lock()):
                if self.loaded.get(spk) == epoch:
                    continue
                try:
                    err = await self._load(group_id, tp, epoch)
                except ConnectionError as exc:
                    log.warning("share-partition %s %s-%d not read: %s", group_id, *tp, exc)
                    err = KafkaError.REQUEST_TIMED_OUT
            if err:
                out[tp] = err
        return out

    async def _load(self, group_id: str, tp: tuple[str, int], epoch: int) -> KafkaError:
        topic, p = tp
        if self.claimed.get(tp) != epoch:
            err = await self.store.claim(topic, p, epoch)
            if err:
                return err
            self.claimed[tp] = epoch
            # whatever this broker held of the partition before is stale now
            self.loaded = {k: e for k, e in self.loaded.items() if k[1:] != tp}
            for spk in [k for k in self.state.partitions if k[1:] == tp]:
                del self.state.partitions[spk]
        key = partition_key(group_id, topic, p)
        self.state.partitions.pop((group_id, topic, p), None)
        self.state.apply(key, await self.store.read(key))
        self.loaded[(group_id, topic, p)] = epoch
        log.info("share-partition %s %s-%d read at leader epoch %d", group_id, topic, p, epoch)
        return KafkaError.NONE
