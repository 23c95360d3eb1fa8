"""Committed offsets of the group coordinator: OffsetCommit/OffsetFetch,
transactional offsets (KIP-447 fencing, markers), OffsetDelete, retention of
offsets of empty groups, and compaction of __consumer_offsets by rewrite."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable, Iterator, Mapping, TypeVar

from ..protocol import records as rb
from ..protocol.errors import KafkaError
from .consumer_group import ConsumerGroups
from .classic_ops import snapshot
from .group_membership import GroupMembership
from .group_context import GroupContext
from .group_model import MAX_RECORDS_PER_BATCH, FetchedOffset, Group
from .group_states import COMMIT_RESULT, GroupState
from .coordinator_log import done_future
from .offsets import CommittedOffset, TopicPartition, group_key, group_value, offset_key, offset_value
from . import offsets_shard as shard
from .offsets_shard import OffsetInput, OffsetOp
from ..storage.types import AppendInfo

log = logging.getLogger("semel.coordinator.group")

S = GroupState


# A rewritten record: its group (None for a consumer group's), partition and value.
_Rewritten = tuple[Group | None, TopicPartition | None, CommittedOffset | None]
T = TypeVar("T")


class OffsetManager:
    """GroupCoordinator's committed offsets, their expiry, and compaction of its log.

    Made with the coordinator's GroupContext and the two parts whose state a commit also
    checks or a compaction also rewrites (`membership`, `consumers`). Owns
    `topics_dropped`: the deleted topics whose offsets it dropped since the load."""

    def __init__(self, ctx: GroupContext, membership: GroupMembership, consumers: ConsumerGroups) -> None:
        self._store, self._log, self._ready = ctx.store, ctx.log, ctx.ready
        self.timers, self.config, self.clock = ctx.timers, ctx.config, ctx.clock
        self._membership = membership
        self._consumers = consumers
        self.topics_dropped: set[str] = set()

    def commit_offsets(self, group_id: str, generation: int, member_id: str,
                       offsets: Mapping[TopicPartition, OffsetInput], *,
                       group_instance_id: str | None = None, api_version: int | None = None
                       ) -> "asyncio.Future[dict[TopicPartition, KafkaError]]":
        """Commit `{(topic, partition): CommittedOffset(offset, leader_epoch, metadata)}`
        (plain (offset, leader_epoch, metadata) tuples work too). Generation -1 with
        an empty member id commits for a group without members (manual assignment)."""
        err = self._ready()
        group = self._store.groups.get(group_id) if not err else None
        consumer = None if err else self._consumers.check_consumer_commit(
            group_id, generation, member_id, transactional=False, api_version=api_version)
        if consumer is not None:
            err = consumer
        elif not err:
            err = self._check_commit(group, generation, member_id, group_instance_id)
        if err:
            return done_future({tp: err for tp in offsets})
        self._membership.touch(group_id, member_id)   # a commit is a sign of life
        return self._write_offsets(group_id, offsets, producer_id=-1, producer_epoch=-1)

    def _check_commit(self, group: Group | None, generation: int, member_id: str,
                      group_instance_id: str | None) -> KafkaError:
        if group is None:
            # No such group: only a commit outside group management is meaningful.
            return KafkaError.NONE if generation < 0 else KafkaError.ILLEGAL_GENERATION
        err = group.member_error(generation, member_id, group_instance_id)
        if err in (KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.FENCED_INSTANCE_ID):
            return err
        # Outside group management (no generation) while the group has no members; and
        # no commit while the new generation's assignment is being decided.
        if generation < 0 and group.state is S.EMPTY:
            return KafkaError.NONE
        if group.state is S.COMPLETING_REBALANCE:
            return KafkaError.REBALANCE_IN_PROGRESS
        return err or COMMIT_RESULT[group.state]

    def _write_offsets(self, group_id: str, offsets: Mapping[TopicPartition, OffsetInput], *,
                       producer_id: int, producer_epoch: int) -> "asyncio.Future[dict[TopicPartition, KafkaError]]":
        op = shard.commit(group_id, offsets, now=self.clock(), max_metadata_bytes=self.config.max_metadata_bytes,
                          producer_id=producer_id, producer_epoch=producer_epoch)
        return self._write(op, lambda error: shard.commit_failed(op, error))

    def _write(self, op: OffsetOp[T], fail: Callable[[KafkaError], T]) -> "asyncio.Future[T]":
        """The write path of an offsets op: append its batch now; once committed, replay
        it into the store at the positions the append gave it, and answer."""
        if not op.records:
            return done_future(op.response)

        def committed(info: AppendInfo) -> T:
            shard.replay(self._store, op, info.first_offset)
            return op.response

        return self._log.write(
            lambda: self._log.append_records(op.pairs(), producer_id=op.producer_id, producer_epoch=op.producer_epoch),
            committed, fail)

    def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None,
                      require_stable: bool = False, *, member_id: str | None = None,
                      member_epoch: int = -1) -> tuple[KafkaError, list[FetchedOffset]]:
        """Committed offsets of `partitions` (all committed ones when None). With
        `require_stable`, a partition with a transactional offset still pending
        answers UNSTABLE_OFFSET_COMMIT instead of a possibly stale value. A member
        of a consumer-protocol group (OffsetFetch v9) is checked against its epoch."""
        err = self._ready() or self._consumers.check_consumer_fetch(group_id, member_id, member_epoch)
        if err:
            return err, []
        group = self._store.groups.get(group_id)
        if partitions is None:
            if group is None:
                return KafkaError.NONE, []
            partitions = list(group.offsets.committed)
        out: list[FetchedOffset] = []
        for topic, part in partitions:
            tp = (topic, part)
            if group is not None and require_stable and group.offsets.has_pending(tp):
                out.append(FetchedOffset(topic, part, -1, -1, "", KafkaError.UNSTABLE_OFFSET_COMMIT))
                continue
            value = group.offsets.committed.get(tp) if group is not None else None
            if value is None:
                out.append(FetchedOffset(topic, part, -1, -1, "", KafkaError.NONE))
            else:
                out.append(FetchedOffset(topic, part, value.offset, value.leader_epoch,
                                         value.metadata, KafkaError.NONE))
        return KafkaError.NONE, out

    # --- transactional offsets (called by the transaction side) --------------------------------

    def txn_commit_offsets(self, producer_id: int, producer_epoch: int, group_id: str,
                           generation: int, member_id: str, group_instance_id: str | None,
                           offsets: Mapping[TopicPartition, OffsetInput]
                           ) -> "asyncio.Future[dict[TopicPartition, KafkaError]]":
        """TxnOffsetCommit: append a transactional batch of offsets under the
        producer's id/epoch; they stay pending (invisible to OffsetFetch) until
        `complete_txn`. KIP-447: member and generation are checked when given."""
        err = self._ready()
        consumer = None if err else self._consumers.check_consumer_commit(
            group_id, generation, member_id, transactional=True, api_version=None)
        if consumer is not None:
            err = consumer
        elif not err:
            err = self._check_txn_commit(self._store.groups.get(group_id), generation, member_id,
                                         group_instance_id)
        if err:
            return done_future({tp: err for tp in offsets})
        return self._write_offsets(group_id, offsets, producer_id=producer_id,
                                   producer_epoch=producer_epoch)

    def _check_txn_commit(self, group: Group | None, generation: int, member_id: str,
                          group_instance_id: str | None) -> KafkaError:
        if group is None:
            # Treated as a new empty group (generation 0, no members).
            if member_id:
                return KafkaError.UNKNOWN_MEMBER_ID
            return KafkaError.ILLEGAL_GENERATION if generation > 0 else KafkaError.NONE
        return group.member_error(generation, member_id, group_instance_id, named_only=True)

    def complete_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                     commit: bool) -> "asyncio.Future[KafkaError]":
        """Write the producer's COMMIT/ABORT marker to __consumer_offsets, then make
        its pending offsets committed (or drop them). Storage errors come back as
        KAFKA_STORAGE_ERROR, fencing by storage as its error (INVALID_PRODUCER_EPOCH)."""
        err = self._ready()
        if err:
            return done_future(err)
        kind = rb.CONTROL_COMMIT if commit else rb.CONTROL_ABORT

        def apply(info: AppendInfo) -> KafkaError:
            self._store.apply_marker(producer_id, commit)
            return KafkaError.NONE

        return self._log.write(
            lambda: self._log.append_control(kind, producer_id, producer_epoch, coordinator_epoch),
            apply, lambda error: error, storage_error=KafkaError.KAFKA_STORAGE_ERROR)

    def has_pending_offsets(self, producer_id: int) -> bool:
        return bool(self._store.producer_groups.get(producer_id))

    def delete_offsets(self, group_id: str, partitions: list[TopicPartition],
                       subscribed: Callable[[bytes], set[str]]
                       ) -> "asyncio.Future[tuple[KafkaError, dict[TopicPartition, KafkaError]]]":
        """OffsetDelete: tombstones for the committed offsets of `partitions`. As in
        Kafka, a consumer group keeps the offsets of topics its members subscribe to
        (GROUP_SUBSCRIBED_TO_TOPIC); `subscribed` reads the topics out of a member's
        protocol metadata. Decided and appended without an await in between."""
        err = self._ready()
        if err:
            return done_future((err, {}))
        op = shard.delete(self._store, group_id, partitions, subscribed)
        return self._write(op, lambda error: (error, {}))

    # --- offsets of deleted topics ----------------------------------------------------------------

    def drop_topic_offsets(self, topics: Iterable[str]) -> None:
        """Kafka forgets every group's offsets of a deleted topic (committed and pending
        transactional ones): tombstones in __consumer_offsets, so the deletion survives a
        restart or a move of the coordinator, and OffsetFetch answers -1 afterwards. A
        group that consumed the old topic then starts a topic created again under the
        same name from its reset policy, not from the old incarnation's positions."""
        names = set(topics)
        if self._ready() or not names:
            return
        for op in shard.drop_topics(self._store, names, MAX_RECORDS_PER_BATCH):
            self._write(op, self._tombstones_failed)

    def _tombstones_failed(self, error: KafkaError) -> None:
        # Not written (the seat moved, storage failed): the next coordinator drops
        # them when it loads (follow_deleted_topics), as this one would have.
        log.warning("offsets of deleted topics not dropped: %s", KafkaError(error).name)
        self.topics_dropped.clear()

    def follow_deleted_topics(self, deleted: Iterable[str]) -> None:
        """Cluster: `deleted` names every topic the cluster view holds deleted (a marker,
        not created again). Called on every view change and when this coordinator starts
        serving; only names not yet handled since the load cost a pass over the groups."""
        if self._ready():
            return
        names = set(deleted)
        fresh = names - self.topics_dropped
        self.topics_dropped = names   # a name created again leaves, so a later deletion counts
        if fresh:
            self.drop_topic_offsets(fresh)

    # --- retention of offsets of empty groups ----------------------------------------------------

    def expire_offsets(self) -> None:
        """Tombstone offsets of empty groups older than the retention, and forget
        groups left with nothing, so memory stays bounded."""
        self.timers.set("expire-offsets", self.config.offsets_retention_check_interval_ms,
                        self.expire_offsets)
        if self._ready():
            return
        now = self.clock()
        plan: list[tuple[Group, list[TopicPartition], bool]] = []
        for group in list(self._store.groups.values()):
            if group.state is not S.EMPTY or not group.is_empty() or group.offsets.pending:
                continue
            consumer = self._store.consumer_groups.get(group.group_id)
            if consumer is not None and consumer.members:
                continue
            since = group.state_ts if group.protocol_type else None
            expired = group.offsets.expired(now, self.config.offsets_retention_ms, since)
            drop = len(expired) == len(group.offsets.committed)
            if drop and not group.persisted and not expired:
                self._store.maybe_forget(group)   # nothing in the log to tombstone
                continue
            if expired or drop:
                plan.append((group, expired, drop))
        for chunk in _chunks(plan, MAX_RECORDS_PER_BATCH):
            self._write_expiry(chunk)

    def maybe_compact(self) -> None:
        """Compaction by rewrite, so start-up replay follows the live state, not the
        history: append every group record and committed offset as they stand, and
        once that is durable (applied in log order, like any write) drop the
        segments entirely before it.

        Only at a quiet moment: no write in flight (memory is then exactly what the
        log says), and no pending transactional offsets — their values win over a
        committed one by log position, so they must never sit behind a rewrite."""
        self.timers.set("compact", self.config.compact_check_interval_ms, self.maybe_compact)
        live = sum(len(g.offsets.committed) + 1 for g in self._store.groups.values())
        if self._ready() or self._log.records_since_compaction < max(self.config.compact_records, 4 * live):
            return
        if self._log.inflight or self._consumers.pending or self._store.producer_groups or any(g.offsets.pending for g in self._store.groups.values()):
            return
        pairs: list[tuple[bytes, bytes | None]] = []
        rewritten: list[_Rewritten] = []   # in record order
        for group in self._store.groups.values():
            if group.persisted:
                pairs.append((group_key(group.group_id), group_value(snapshot(group, self.clock()))))
                rewritten.append((group, None, None))
            for (t, p), v in group.offsets.committed.items():
                pairs.append((offset_key(group.group_id, t, p), offset_value(v)))
                rewritten.append((group, (t, p), v))
        for pair in self._consumers.snapshot_records():
            pairs.append(pair)
            rewritten.append((None, None, None))
        if not pairs:
            return

        def apply(info: AppendInfo) -> None:
            # The rewritten values now sit at new log positions, as a replay will see them.
            for at, (group, tp, value) in enumerate(rewritten, start=info.first_offset):
                if group is not None and tp is not None and value is not None and group.offsets.committed.get(tp) is value:
                    group.offsets.committed[tp] = value._replace(log_offset=at)

        self._log.rewrite(self._log.batch(pairs), len(pairs), apply)

    def _write_expiry(self, plan: list[tuple[Group, list[TopicPartition], bool]]) -> None:
        pairs: list[tuple[bytes, bytes | None]] = []
        for group, tps, drop in plan:
            pairs += [(offset_key(group.group_id, t, p), None) for t, p in tps]
            if drop:
                pairs.append((group_key(group.group_id), None))

        def apply(info: AppendInfo) -> None:
            at = info.first_offset
            for group, tps, drop in plan:
                for tp in tps:
                    self._store.apply_offset(group.group_id, tp, None, at)
                    at += 1
                if drop:
                    if group.state is S.EMPTY and group.is_empty():
                        self._store.apply_group_record(group.group_id, None)
                    at += 1

        self._log.write(lambda: self._log.append_records(pairs), apply, lambda error: None)


def _chunks(plan: list[tuple[Group, list[TopicPartition], bool]], limit: int
            ) -> Iterator[list[tuple[Group, list[TopicPartition], bool]]]:
    chunk: list[tuple[Group, list[TopicPartition], bool]] = []
    size = 0
    for item in plan:
        n = len(item[1]) + 1
        if chunk and size + n > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += n
    if chunk:
        yield chunk
