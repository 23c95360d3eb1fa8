"""Coordinators partitioned by key.

In a cluster `__transaction_state` and `__consumer_offsets` have several partitions
each. A transactional id or group id belongs to partition
abs(String.hashCode(id)) % partitions, Kafka's formula, so Kafka's tooling computes the
same placement. Each partition is its own coordinator: one TransactionCoordinator or
GroupCoordinator per partition, seated on it (semel.cluster.coordinator_host), loaded
when this broker leads that partition and dropped when it stops leading it.

`TxnCoordinators` and `GroupCoordinators` stand where a single node has its one
coordinator (`broker.txns`, `broker.groups`): every request goes to the coordinator of
its id's partition, whose seat answers NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS
when this broker does not serve that partition; listings gather every partition.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from ..protocol.errors import KafkaError
from ..protocol.txn_hash import java_string_hash, partition_for  # noqa: F401 (re-exported)

log = logging.getLogger("semel.cluster.coordinator_partitions")

def topic_partition_count(view, topic: str) -> int | None:
    """The partition count of `topic` in a cluster view (None before it exists, or for a
    view without a topic catalogue)."""
    topics = getattr(view, "topics", None)
    info = topics().get(topic) if topics is not None else None
    return None if info is None else info.partitions


class PartitionedCoordinators:
    """One coordinator per internal partition, `parts[p]` seated on partition p.

    `topic_partitions()` is the internal topic's partition count in the cluster view
    (None before it exists). A broker configured with another count would place ids on
    other partitions than its peers, so two brokers could serve one id: it then
    coordinates nothing (COORDINATOR_NOT_AVAILABLE) and says why."""

    def __init__(self, parts: list, topic_partitions=lambda: None):
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

    def for_key(self, key: str | None):
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

    def for_partition(self, partition: int):
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


class _MergedTxns(Mapping):
    """Every partition's transactional ids as one read-only mapping (the admin APIs and
    the metrics read them; each id lives only in its own partition's coordinator)."""

    def __init__(self, owner: "TxnCoordinators"):
        self._owner = owner

    def __getitem__(self, txn_id):
        return self._owner.for_key(txn_id).txns[txn_id]

    def get(self, txn_id, default=None):
        return self._owner.for_key(txn_id).txns.get(txn_id, default)

    def __iter__(self):
        for c in self._owner.parts:
            yield from list(c.txns)

    def __len__(self):
        return sum(len(c.txns) for c in self._owner.parts)

    def values(self):
        return [m for c in self._owner.parts for m in c.txns.values()]


def _by_id(name: str):
    """A method sending the call to the coordinator of its first argument's partition
    (the transactional id or group id)."""
    def call(self, key, *args, **kw):
        return getattr(self.for_key(key), name)(key, *args, **kw)
    call.__name__ = name
    return call


class TxnCoordinators(PartitionedCoordinators):
    """The transaction coordinators of a cluster broker, one per __transaction_state partition."""

    @property
    def txns(self) -> Mapping:
        return _MergedTxns(self)

    init_producer_id = _by_id("init_producer_id")
    add_partitions = _by_id("add_partitions")
    add_offsets = _by_id("add_offsets")
    end_txn = _by_id("end_txn")
    verify_produce = _by_id("verify_produce")
    verify_offsets = _by_id("verify_offsets")

    async def write_partition_markers(self, *args) -> None:
        # Markers written here as the partition's leader: no coordinator state involved.
        await self.parts[0].write_partition_markers(*args)


class GroupCoordinators(PartitionedCoordinators):
    """The group coordinators of a cluster broker, one per __consumer_offsets partition."""

    @property
    def config(self):
        return self.parts[0].config

    join_group = _by_id("join_group")
    consumer_group_heartbeat = _by_id("consumer_group_heartbeat")
    group_type = _by_id("group_type")
    sync_group = _by_id("sync_group")
    heartbeat = _by_id("heartbeat")
    leave_group = _by_id("leave_group")
    commit_offsets = _by_id("commit_offsets")
    fetch_offsets = _by_id("fetch_offsets")
    delete_offsets = _by_id("delete_offsets")

    def txn_commit_offsets(self, producer_id, producer_epoch, group_id, *args, **kw):
        return self.for_key(group_id).txn_commit_offsets(producer_id, producer_epoch, group_id, *args, **kw)

    def describe_groups(self, group_ids) -> list:
        return [s for gid in group_ids for s in self.for_key(gid).describe_groups([gid])]

    def consumer_group_describe(self, group_ids) -> list:
        return [s for gid in group_ids for s in self.for_key(gid).consumer_group_describe([gid])]

    def list_groups(self, states=None) -> tuple[KafkaError, list]:
        """Kafka's ListGroups: the groups of every partition this broker coordinates;
        COORDINATOR_LOAD_IN_PROGRESS while one of them is still loading."""
        rows, error = [], KafkaError.NONE
        for c in self.parts:
            err, got = c.list_groups(states)
            rows += got
            if err and not error:
                error = err
        return error, rows

    def delete_groups(self, group_ids) -> "asyncio.Future":
        by_part: dict[int, list[str]] = {}
        for gid in group_ids:
            by_part.setdefault(self.partition_for(gid), []).append(gid)

        async def gather() -> dict:
            results: dict = {}
            for got in await asyncio.gather(*(self.parts[p].delete_groups(ids) for p, ids in by_part.items())):
                results.update(got)
            return results
        return asyncio.ensure_future(gather())

    def follow_deleted_topics(self, deleted) -> None:
        for c in self.parts:
            c.follow_deleted_topics(deleted)

    def drop_topic_offsets(self, topics) -> None:
        for c in self.parts:
            c.drop_topic_offsets(topics)

    async def idle(self) -> None:
        for c in self.parts:
            await c.idle()
