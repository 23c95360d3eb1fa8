"""The topic catalogue's writes to etcd: create, delete and grow a topic.

Each is one transaction compared on the version of topics/<name> (a deletion marker's
too), so of two admins racing on one name exactly one wins; the loser reads the topic
again and decides anew. A topic and its partitions are written together, so no broker
ever sees a topic without its partitions or partitions of a topic that is gone.
"""
from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Awaitable, Callable

from ..protocol.errors import KafkaError
from .etcd import Etcd, Json, delete_prefix_op, mod_equals, put_op
from .share_store import forget_topic_ops
from .keys import RETIRED_IDS_KEPT, Keys, TopicInfo, decode_topic, encode_partition, encode_topic
from .state import PartitionState

# What a topic's growth writes, decided from the topic as etcd holds it: (error, message,
# the replica lists of the new partitions).
GrowthDecision = Callable[[TopicInfo], tuple[KafkaError, str, list[tuple[int, ...]]]]


class TopicCatalogue:
    """Writes topics for one cluster id. `written(name)` runs after each winning write and
    before its answer: the broker's view takes the change in at once, whatever the
    watch's pace, so the admin's answer never runs ahead of what this broker shows."""

    def __init__(self, etcd: Etcd, keys: Keys, written: Callable[[str], Awaitable[None]]):
        self.etcd = etcd
        self.keys = keys
        self.written = written

    async def read(self, name: str) -> TopicInfo | None:
        """The topic as etcd holds it now (live or a deletion marker), None if never created."""
        kv = await self.etcd.get(self.keys.topic(name))
        return decode_topic(name, kv) if kv is not None else None

    async def create(self, name: str, assignment: list[tuple[int, ...]], configs: dict[str, str]) -> KafkaError:
        """Topic and all its partitions in one transaction, only if the name is free (never
        used, or deleted: compared on the marker's version, so of two creators one wins).
        A new topic id; each partition starts led by its first replica, epoch 0, ISR =
        replicas, whatever an earlier topic of that name had reached."""
        while True:
            old = await self.read(name)
            if old is not None and not old.deleted:
                return KafkaError.TOPIC_ALREADY_EXISTS
            retired = (old.retired_ids + (old.topic_id,))[-RETIRED_IDS_KEPT:] if old is not None else ()
            info = TopicInfo(name, len(assignment), len(assignment[0]), configs, str(uuid.uuid4()),
                             retired_ids=retired)
            ok, _ = await self.etcd.txn([mod_equals(self.keys.topic(name), old.version if old else 0)],
                                        [put_op(self.keys.topic(name), encode_topic(info)),
                                         *self._partition_puts(name, 0, assignment)])
            if ok:
                await self.written(name)
                return KafkaError.NONE

    def _partition_puts(self, name: str, first: int, assignment: list[tuple[int, ...]]) -> list[Json]:
        """New partitions first, first+1, ...: led by their first replica, epoch 0, ISR = replicas."""
        return [put_op(self.keys.partition(name, first + i),
                       encode_partition(PartitionState(name, first + i, tuple(r), r[0], 0, tuple(r))))
                for i, r in enumerate(assignment)]

    async def delete(self, name: str, topic_id: str | None = None) -> KafkaError:
        """Mark the topic deleted and remove its partitions in one transaction compared on
        the topic's version: of two deleters one wins (the other finds no topic), and a
        controller's or leader's CAS on a partition fails from then on (its key is gone).
        UNKNOWN_TOPIC_OR_PARTITION without a live topic of that name (UNKNOWN_TOPIC_ID
        when `topic_id` is given and the name now has another)."""
        while True:
            info = await self.read(name)
            if info is None or info.deleted:
                return KafkaError.UNKNOWN_TOPIC_ID if topic_id else KafkaError.UNKNOWN_TOPIC_OR_PARTITION
            if topic_id and info.topic_id != topic_id:
                return KafkaError.UNKNOWN_TOPIC_ID
            ok, _ = await self.etcd.txn([mod_equals(self.keys.topic(name), info.version)],
                                        [put_op(self.keys.topic(name), encode_topic(replace(info, deleted=True))),
                                         delete_prefix_op(self.keys.partitions + name + "/"),
                                         *forget_topic_ops(self.keys.share, name)])
            if ok:
                await self.written(name)   # local logs go before the answer (ClusterMember)
                return KafkaError.NONE
            # Lost: the topic changed (grown, deleted, created again): read it and decide again.

    async def grow(self, name: str, decide: GrowthDecision) -> tuple[KafkaError, str]:
        """`decide(info)` gives (error, message, replica lists of the new partitions) from
        the topic as etcd holds it; the new count and partitions are written in one
        transaction compared on the topic's version, and decided again if it lost."""
        while True:
            info = await self.read(name)
            if info is None or info.deleted:
                return KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
            err, msg, assignment = decide(info)
            if err:
                return err, msg
            grown = replace(info, partitions=info.partitions + len(assignment))
            ok, _ = await self.etcd.txn([mod_equals(self.keys.topic(name), info.version)],
                                        [put_op(self.keys.topic(name), encode_topic(grown)),
                                         *self._partition_puts(name, info.partitions, assignment)])
            if ok:
                await self.written(name)
                return KafkaError.NONE, ""
