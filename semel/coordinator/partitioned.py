"""Coordinators partitioned by key: the one shape of the coordinators, on a single node
(one partition) as in a cluster.

In a cluster `__transaction_state` and `__consumer_offsets` have several partitions
each; on a single node one. A transactional id or group id belongs to partition
abs(String.hashCode(id)) % partitions, Kafka's formula (semel.protocol.txn_hash), so
Kafka's tooling computes the same placement. Each partition is its own coordinator: one
TransactionCoordinator or GroupCoordinator per partition, seated on it (its
CoordinatorSeat: semel.cluster.coordinator_host in a cluster), loaded when this broker
leads that partition and dropped when it stops leading it; a single node's one
coordinator sits on a seat that always serves (semel.coordinator.ports.LocalSeat).

`TxnCoordinators` and `GroupCoordinators` are the broker's `txn_coordinator` and
`group_coordinator`: every request goes to the coordinator of its id's partition, whose
seat answers NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS when this broker does not
serve that partition; listings gather every partition. A routed method has the
signature of the coordinator's own method of that name (`_routed`), or of the method
of the coordinator's part that serves it (`_routed_to`: ConsumerGroupHeartbeat goes
straight to the consumer groups, so its path is handler -> here -> consumer_group ->
rules -> records -> log).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Concatenate, Generic, ParamSpec, Protocol, TypeVar

from ..protocol.errors import KafkaError
from ..protocol.txn_hash import partition_for
from .consumer_group import ConsumerGroups, ConsumerGroupView
from .group import GroupCoordinator
from .group_model import GroupConfig, GroupSummary
from .offsets_shard import OffsetInput
from .ports import CoordinatorSeat, Loadable
from .txn import TransactionCoordinator
from .offsets import TopicPartition
from .txn_states import TxnMeta

log = logging.getLogger("semel.coordinator.partitioned")


class Seated(Loadable, Protocol):
    """A coordinator of one internal partition, as its partitioned whole drives it."""
    seat: CoordinatorSeat

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


C = TypeVar("C", bound=Seated)
K = TypeVar("K", bound="str | None")
P = ParamSpec("P")
R = TypeVar("R")
X = TypeVar("X")


class PartitionedCoordinators(Generic[C]):
    """One coordinator per internal partition, `parts[p]` seated on partition p.

    `topic_partitions()` is the internal topic's partition count in the cluster view
    (None before it exists). A broker configured with another count would place ids on
    other partitions than its peers, so two brokers could serve one id: it then
    coordinates nothing (COORDINATOR_NOT_AVAILABLE) and says why."""

    def __init__(self, parts: list[C], topic_partitions: Callable[[], int | None] = lambda: None):
        if not parts:
            raise ValueError("at least one coordinator partition")
        self.parts = parts
        self.topic_partitions = topic_partitions
        self._warned = False

    @property
    def partitions(self) -> int:
        return len(self.parts)

    def partition_for(self, key: str | None) -> int:
        return partition_for(key, len(self.parts))

    def for_key(self, key: str | None) -> C:
        return self.parts[self.partition_for(key)]

    def misplaced(self) -> bool:
        """Does the cluster's topic have another partition count than this broker's?"""
        count = self.topic_partitions()
        if count is None or count == len(self.parts):
            return False
        if not self._warned:
            self._warned = True
            log.error("%s has %d partitions in the cluster but this broker is configured with %d: it "
                      "coordinates nothing until started with the same count", self.parts[0].seat.topic,
                      count, len(self.parts))
        return True

    def error_for(self, key: str | None) -> KafkaError:
        """What a request for `key` gets here now (NONE: its coordinator serves it)."""
        if self.misplaced():
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        return self.for_key(key).seat.error()

    def for_partition(self, partition: int) -> C | None:
        """The coordinator of `partition`, None for one this topic does not have."""
        return self.parts[partition] if 0 <= partition < len(self.parts) else None

    def start_seats(self) -> None:
        for c in self.parts:
            c.seat.start(c)

    async def start(self) -> None:
        for c in self.parts:
            await c.start()

    async def stop(self) -> None:
        for c in self.parts:
            await c.stop()


def _routed_to(part: Callable[[C], X], method: Callable[Concatenate[X, K, P], R]
               ) -> Callable[Concatenate[PartitionedCoordinators[C], K, P], R]:
    """`method` of the `part` of the coordinator that owns the key its first argument names."""
    def route(self: PartitionedCoordinators[C], key: K, /, *args: P.args, **kw: P.kwargs) -> R:
        return method(part(self.for_key(key)), key, *args, **kw)
    route.__name__ = route.__qualname__ = method.__name__
    route.__doc__ = method.__doc__
    return route


def _routed(method: Callable[Concatenate[C, K, P], R]) -> Callable[Concatenate[PartitionedCoordinators[C], K, P], R]:
    """`method` of the coordinator that owns the key its first argument names: the
    partitioned method keeps the coordinator method's signature."""
    return _routed_to(_itself, method)


def _itself(coordinator: C) -> C:
    return coordinator


def _consumers(coordinator: GroupCoordinator) -> ConsumerGroups:
    return coordinator.consumers


class TxnCoordinators(PartitionedCoordinators[TransactionCoordinator]):
    """The transaction coordinators of a broker, one per __transaction_state partition
    (one on a single node). Each call goes to the coordinator of its transactional id."""

    def transactions(self) -> list[TxnMeta]:
        """Every partition's transactions (the admin APIs and the metrics read them;
        each id lives only in its own partition's coordinator)."""
        return [m for c in self.parts for m in list(c.txns.values())]

    def transaction(self, txn_id: str) -> TxnMeta | None:
        return self.for_key(txn_id).txns.get(txn_id)

    init_producer_id = _routed(TransactionCoordinator.init_producer_id)
    add_partitions = _routed(TransactionCoordinator.add_partitions)
    add_offsets = _routed(TransactionCoordinator.add_offsets)
    end_txn = _routed(TransactionCoordinator.end_txn)
    verify_produce = _routed(TransactionCoordinator.verify_produce)
    verify_offsets = _routed(TransactionCoordinator.verify_offsets)


class GroupCoordinators(PartitionedCoordinators[GroupCoordinator]):
    """The group coordinators of a broker, one per __consumer_offsets partition (one on a
    single node). Each call goes to the coordinator of its group id."""

    @property
    def config(self) -> GroupConfig:
        return self.parts[0].config

    join_group = _routed(GroupCoordinator.join_group)
    consumer_group_heartbeat = _routed_to(_consumers, ConsumerGroups.consumer_group_heartbeat)
    group_type = _routed(GroupCoordinator.group_type)
    sync_group = _routed(GroupCoordinator.sync_group)
    heartbeat = _routed(GroupCoordinator.heartbeat)
    leave_group = _routed(GroupCoordinator.leave_group)
    commit_offsets = _routed(GroupCoordinator.commit_offsets)
    fetch_offsets = _routed(GroupCoordinator.fetch_offsets)
    delete_offsets = _routed(GroupCoordinator.delete_offsets)

    def txn_commit_offsets(self, producer_id: int, producer_epoch: int, group_id: str, generation: int,
                           member_id: str, group_instance_id: str | None,
                           offsets: Mapping[TopicPartition, OffsetInput]
                           ) -> asyncio.Future[dict[TopicPartition, KafkaError]]:
        # Routed by its third argument, the group id.
        return self.for_key(group_id).txn_commit_offsets(producer_id, producer_epoch, group_id, generation,
                                                         member_id, group_instance_id, offsets)

    def describe_groups(self, group_ids: Iterable[str]) -> list[GroupSummary]:
        return [s for gid in group_ids for s in self.for_key(gid).describe_groups([gid])]

    def consumer_group_describe(self, group_ids: Iterable[str]) -> list[ConsumerGroupView]:
        return [s for gid in group_ids for s in self.for_key(gid).consumer_group_describe([gid])]

    def list_groups(self, states: Iterable[str] | None = None) -> tuple[KafkaError, list[tuple[str, str, str]]]:
        """Kafka's ListGroups: the groups of every partition this broker coordinates;
        COORDINATOR_LOAD_IN_PROGRESS while one of them is still loading."""
        rows: list[tuple[str, str, str]] = []
        error = KafkaError.NONE
        for c in self.parts:
            err, got = c.list_groups(states)
            rows += got
            if err and not error:
                error = err
        return error, rows

    def delete_groups(self, group_ids: Iterable[str]) -> asyncio.Future[dict[str, KafkaError]]:
        by_part: dict[int, list[str]] = {}
        for gid in group_ids:
            by_part.setdefault(self.partition_for(gid), []).append(gid)

        async def gather() -> dict[str, KafkaError]:
            results: dict[str, KafkaError] = {}
            for got in await asyncio.gather(*(self.parts[p].delete_groups(ids) for p, ids in by_part.items())):
                results.update(got)
            return results
        return asyncio.ensure_future(gather())

    def follow_deleted_topics(self, deleted: set[str]) -> None:
        for c in self.parts:
            c.follow_deleted_topics(deleted)

    def drop_topic_offsets(self, topics: Iterable[str]) -> None:
        for c in self.parts:
            c.drop_topic_offsets(topics)

    async def idle(self) -> None:
        for c in self.parts:
            await c.idle()
