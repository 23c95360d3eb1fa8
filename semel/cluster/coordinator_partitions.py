"""Coordinators partitioned by key: the one shape of the coordinators, on a single node
(one partition) as in a cluster.

In a cluster `__transaction_state` and `__consumer_offsets` have several partitions
each; on a single node one. A transactional id or group id belongs to partition
abs(String.hashCode(id)) % partitions, Kafka's formula, so Kafka's tooling computes the
same placement. Each partition is its own coordinator: one TransactionCoordinator or
GroupCoordinator per partition, seated on it (semel.cluster.coordinator_host), loaded
when this broker leads that partition and dropped when it stops leading it; a single
node's one coordinator sits on a seat that always serves (semel.coordinator.ports.LocalSeat).

`TxnCoordinators` and `GroupCoordinators` are the broker's `txn_coordinator` and `group_coordinator`: every
request goes to the coordinator of its id's partition, whose seat answers NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS
when this broker does not serve that partition; listings gather every partition.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from ..protocol.errors import KafkaError
from ..protocol.txn_hash import java_string_hash, partition_for  # noqa: F401 (re-exported)

log = logging.getLogger("semel.cluster.coordinator_partitions")

def topic_partition_count(view: Any, topic: str) -> int | None:
    """The partition count of `topic` in a cluster view (None before it exists, or for a
    view without a topic catalogue)."""
    topics = getattr(view, "topics", None)
    info = topics().get(topic) if topics is not None else None
    return None if info is None else int(info.partitions)


class PartitionedCoordinators:
    """One coordinator per internal partition, `parts[p]` seated on partition p.

    `topic_partitions()` is the internal topic's partition count in the cluster view
    (None before it exists). A broker configured with another count would place ids on
    other partitions than its peers, so two brokers could serve one id: it then
    coordinates nothing (COORDINATOR_NOT_AVAILABLE) and says why."""

    def __init__(self, parts: list[Any], topic_partitions: Callable[[], int | None] = lambda: None):
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

    def for_key(self, key: str | None) -> Any:
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
        err: KafkaError = self.for_key(key).seat.error()
        return err

    def for_partition(self, partition: int) -> Any:
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


class TxnCoordinators(PartitionedCoordinators):
    """The transaction coordinators of a broker, one per __transaction_state partition
    (one on a single node). Each call goes to the coordinator of its transactional id."""

    def transactions(self) -> list[Any]:
        """Every partition's transactions (TxnMeta; the admin APIs and the metrics read them;
        each id lives only in its own partition's coordinator)."""
        return [m for c in self.parts for m in list(c.txns.values())]

    def transaction(self, txn_id: str) -> Any:
        return self.for_key(txn_id).txns.get(txn_id)

    def init_producer_id(self, txn_id: str | None, *args: Any, **kw: Any) -> Any:
        return self.for_key(txn_id).init_producer_id(txn_id, *args, **kw)

    def add_partitions(self, txn_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(txn_id).add_partitions(txn_id, *args, **kw)

    def add_offsets(self, txn_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(txn_id).add_offsets(txn_id, *args, **kw)

    def end_txn(self, txn_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(txn_id).end_txn(txn_id, *args, **kw)

    def verify_produce(self, txn_id: str | None, *args: Any, **kw: Any) -> KafkaError:
        err: KafkaError = self.for_key(txn_id).verify_produce(txn_id, *args, **kw)
        return err

    def verify_offsets(self, txn_id: str, *args: Any, **kw: Any) -> KafkaError:
        err: KafkaError = self.for_key(txn_id).verify_offsets(txn_id, *args, **kw)
        return err

    async def write_partition_markers(self, *args: Any) -> None:
        # Markers written here as the partition's leader: no coordinator state involved.
        await self.parts[0].write_partition_markers(*args)


class GroupCoordinators(PartitionedCoordinators):
    """The group coordinators of a broker, one per __consumer_offsets partition (one on a
    single node)."""

    @property
    def config(self) -> Any:
        return self.parts[0].config

    def join_group(self, group_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(group_id).join_group(group_id, *args, **kw)

    def consumer_group_heartbeat(self, group_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(group_id).consumer_group_heartbeat(group_id, *args, **kw)

    def group_type(self, group_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(group_id).group_type(group_id, *args, **kw)

    def sync_group(self, group_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(group_id).sync_group(group_id, *args, **kw)

    def heartbeat(self, group_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(group_id).heartbeat(group_id, *args, **kw)

    def leave_group(self, group_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(group_id).leave_group(group_id, *args, **kw)

    def commit_offsets(self, group_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(group_id).commit_offsets(group_id, *args, **kw)

    def fetch_offsets(self, group_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(group_id).fetch_offsets(group_id, *args, **kw)

    def delete_offsets(self, group_id: str, *args: Any, **kw: Any) -> Any:
        return self.for_key(group_id).delete_offsets(group_id, *args, **kw)

    def txn_commit_offsets(self, producer_id: int, producer_epoch: int, group_id: str, *args: Any,
                           **kw: Any) -> Any:
        return self.for_key(group_id).txn_commit_offsets(producer_id, producer_epoch, group_id, *args, **kw)

    def describe_groups(self, group_ids: Iterable[str]) -> list[Any]:
        return [s for gid in group_ids for s in self.for_key(gid).describe_groups([gid])]

    def consumer_group_describe(self, group_ids: Iterable[str]) -> list[Any]:
        return [s for gid in group_ids for s in self.for_key(gid).consumer_group_describe([gid])]

    def list_groups(self, states: Iterable[str] | None = None) -> tuple[KafkaError, list[Any]]:
        """Kafka's ListGroups: the groups of every partition this broker coordinates;
        COORDINATOR_LOAD_IN_PROGRESS while one of them is still loading."""
        rows: list[Any] = []
        error = KafkaError.NONE
        for c in self.parts:
            err, got = c.list_groups(states)
            rows += got
            if err and not error:
                error = err
        return error, rows

    def delete_groups(self, group_ids: Iterable[str]) -> "asyncio.Future[dict[str, Any]]":
        by_part: dict[int, list[str]] = {}
        for gid in group_ids:
            by_part.setdefault(self.partition_for(gid), []).append(gid)

        async def gather() -> dict[str, Any]:
            results: dict[str, Any] = {}
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
