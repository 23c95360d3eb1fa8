"""The start offsets of a share group's share-partitions, as an administrator sees and
moves them (DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets).

A share group has no committed offset: its share-partition's start offset is where
delivery stands (every record before it is finished). Moving it or forgetting it is
refused while the group has members, as in Kafka, because a member may hold records
of the window being replaced. Each change is written through the share coordinator's
log before it is answered, like every other change of share-partition state.
"""
from __future__ import annotations

from .share_coordinator import ShareCoordinator
from .share_partition import SharePartition
from ..protocol.errors import KafkaError

TP = tuple[str, int]


def group_error(share: ShareCoordinator, group_id: str, *, must_exist: bool = True) -> KafkaError:
    """Why the group's offsets may not be read or changed now (NONE: they may)."""
    err = share.error()
    if err:
        return err
    if must_exist and not share.is_share_group(group_id):
        return KafkaError.GROUP_ID_NOT_FOUND
    return KafkaError.NONE


def has_members(share: ShareCoordinator, group_id: str) -> bool:
    group = share.state.groups.get(group_id)
    return group is not None and bool(group.members)


def start_offsets(share: ShareCoordinator, group_id: str) -> dict[TP, SharePartition]:
    """Every share-partition the group has state for."""
    return {(t, p): sp for t, p, sp in share.state.group_partitions(group_id)}


def lag(sp: SharePartition, high_watermark: int) -> int:
    """Records from the start offset to the high watermark not yet finished."""
    counts = sp.counts()
    finished = counts["acknowledged"] + counts["archived"]
    return max(0, high_watermark - sp.start - finished)


async def alter_start_offsets(share: ShareCoordinator, group_id: str, wanted: dict[TP, int]) -> KafkaError:
    """Each share-partition of `wanted` starts afresh at its offset (nothing in flight);
    NON_EMPTY_GROUP while the group has members. A group id nobody used yet becomes a
    share group with these start offsets, as in Kafka."""
    err = group_error(share, group_id, must_exist=False)
    if err:
        return err
    if has_members(share, group_id):
        return KafkaError.NON_EMPTY_GROUP
    for (topic, p), offset in wanted.items():
        share.state.init_partition(group_id, topic, p, offset)
    return await share.persist(share.partition_records(group_id, wanted))


async def delete_topics(share: ShareCoordinator, group_id: str, topics: list[str]) -> KafkaError:
    """Forget the group's share-partitions of `topics`; NON_EMPTY_GROUP while it has members."""
    err = group_error(share, group_id)
    if err:
        return err
    if has_members(share, group_id):
        return KafkaError.NON_EMPTY_GROUP
    pairs = [pair for topic in topics for pair in share.state.drop_topic(group_id, topic)]
    return await share.persist(pairs)
