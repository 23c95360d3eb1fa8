"""Committed offsets as a shard: every offsets decision as plain functions, no I/O.

Each function reads the groups in memory (group_replay.GroupStore) and a request and
returns an `OffsetOp`: the offset records to write (one batch, transactional when a
producer is named) and the answer to give once they are committed. `replay` puts an
op's records into the store at the log positions the append gave them, through the
same GroupStore functions the load's replay of a batch calls, so a live write and a
restart cannot diverge. The group coordinator's offsets part (group_offsets.OffsetManager)
checks members and generations, hands each op to the write path and answers.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..protocol.errors import KafkaError
from .group_replay import GroupStore
from .group_states import GroupState
from .offsets import CommittedOffset, TopicPartition, offset_key, offset_value

R = TypeVar("R")
# One offset record: group, partition, value (None: a tombstone).
OffsetRecord = tuple[str, TopicPartition, CommittedOffset | None]
# An offset to commit: a CommittedOffset, or (offset, leader epoch, metadata).
OffsetInput = CommittedOffset | tuple[int, int, str | None]
Results = dict[TopicPartition, KafkaError]


@dataclass(eq=False)
class OffsetOp(Generic[R]):
    """`records` to write as one batch (under `producer_id`/`producer_epoch` when
    transactional), then `response`. With no records the response is the answer at once."""
    response: R
    records: list[OffsetRecord] = field(default_factory=list)
    producer_id: int = -1
    producer_epoch: int = -1

    def pairs(self) -> list[tuple[bytes, bytes | None]]:
        return [(offset_key(g, t, p), None if v is None else offset_value(v)) for g, (t, p), v in self.records]


def replay(store: GroupStore, op: OffsetOp[Any], first_offset: int) -> None:
    """`op`'s records, appended from `first_offset` on, into memory: the one way an
    offsets write changes the store (a transactional value stays pending until its marker)."""
    for at, (group_id, tp, value) in enumerate(op.records, start=first_offset):
        if op.producer_id >= 0:
            if value is not None:
                store.apply_pending(op.producer_id, group_id, tp, value, at)
        else:
            store.apply_offset(group_id, tp, value, at)


def _as_committed(value: OffsetInput) -> CommittedOffset:
    if isinstance(value, CommittedOffset):
        return CommittedOffset(value.offset, value.leader_epoch, value.metadata)
    offset, epoch, metadata = value
    return CommittedOffset(int(offset), epoch, metadata)


def commit(group_id: str, offsets: Mapping[TopicPartition, OffsetInput], *, now: int, max_metadata_bytes: int,
           producer_id: int = -1, producer_epoch: int = -1) -> OffsetOp[Results]:
    """OffsetCommit (and TxnOffsetCommit with a producer) once member and generation
    passed: each offset stamped `now`; one whose metadata is too large is refused alone."""
    results: Results = {}
    records: list[OffsetRecord] = []
    for tp, raw in offsets.items():
        value = _as_committed(raw)
        if len((value.metadata or "").encode("utf-8")) > max_metadata_bytes:
            results[tp] = KafkaError.OFFSET_METADATA_TOO_LARGE
            continue
        records.append((group_id, (tp[0], int(tp[1])), value._replace(commit_ts=now)))
        results[tp] = KafkaError.NONE
    return OffsetOp(results, records, producer_id, producer_epoch)


def commit_failed(op: OffsetOp[Results], error: KafkaError) -> Results:
    """The answer when `op`'s records did not take effect: `error` for each of them."""
    return {**op.response, **{tp: error for _, tp, _ in op.records}}


def delete(store: GroupStore, group_id: str, partitions: list[TopicPartition],
           subscribed: Callable[[bytes], set[str]]) -> OffsetOp[tuple[KafkaError, Results]]:
    """OffsetDelete: tombstones for the committed offsets of `partitions`. As in Kafka, a
    consumer group keeps the offsets of topics its members subscribe to
    (GROUP_SUBSCRIBED_TO_TOPIC); `subscribed` reads the topics out of a member's
    protocol metadata."""
    group = store.groups.get(group_id) if group_id else None
    if not group_id:
        return OffsetOp((KafkaError.INVALID_GROUP_ID, {}))
    if group is None or group.state is GroupState.DEAD:
        return OffsetOp((KafkaError.GROUP_ID_NOT_FOUND, {}))
    if group.state is not GroupState.EMPTY and group.protocol_type != "consumer":
        return OffsetOp((KafkaError.NON_EMPTY_GROUP, {}))
    busy: set[str] = set()
    if group.state is not GroupState.EMPTY:
        for member in group.members.values():
            busy |= subscribed(member.metadata(group.protocol))
    results = {tp: KafkaError.GROUP_SUBSCRIBED_TO_TOPIC if tp[0] in busy else KafkaError.NONE
               for tp in partitions}
    doomed = [(group_id, tp, None) for tp, e in results.items() if not e and tp in group.offsets.committed]
    return OffsetOp((KafkaError.NONE, results), list(doomed))


def drop_topics(store: GroupStore, topics: Iterable[str], limit: int) -> list[OffsetOp[None]]:
    """Tombstones of every group's offsets (committed and pending) of deleted `topics`,
    in batches of at most `limit` records."""
    names = set(topics)
    doomed: list[OffsetRecord] = [(group.group_id, tp, None) for group in store.groups.values()
                                  for tp in sorted(group.offsets.partitions()) if tp[0] in names]
    return [OffsetOp(None, doomed[at:at + limit]) for at in range(0, len(doomed), limit)]
