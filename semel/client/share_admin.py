"""A share group's start offsets (KIP-932) for the tools: DescribeShareGroupOffsets and
AlterShareGroupOffsets. A share group commits no offsets; its start offset per
share-partition is where delivery stands (every record before it is finished)."""
from __future__ import annotations

from dataclasses import dataclass

from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..protocol.messages import request_class
from .client import Client, ClientError


@dataclass(frozen=True)
class ShareOffset:
    """A share-partition as DescribeShareGroupOffsets tells it; -1: not told (the lag
    is v1's; the window's counts are semel's own tagged fields)."""
    start: int
    lag: int = -1
    in_flight: int = -1
    acquired: int = -1
    archived: int = -1


def share_start_offsets(c: Client, group_id: str) -> dict[tuple[str, int], ShareOffset]:
    """Every share-partition the group has state for."""
    G = request_class(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS).DescribeShareGroupOffsetsRequestGroup
    resp = c.request(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, groups=[G(group_id=group_id, topics=None)])
    g = resp.groups[0]
    if g.error_code:
        err = KafkaError(g.error_code)
        raise ClientError(f"DescribeShareGroupOffsets {group_id}: {g.error_message or err.name}", err)
    return {(t.topic_name, p.partition_index): ShareOffset(
        p.start_offset, getattr(p, "lag", -1), *(getattr(p, f, -1) for f in ("in_flight", "acquired", "archived")))
        for t in g.topics for p in t.partitions if not p.error_code}


def alter_share_start_offsets(c: Client, group_id: str, offsets: dict[tuple[str, int], int]
                              ) -> tuple[KafkaError, dict[tuple[str, int], KafkaError]]:
    """(the group's error, each share-partition's): accepted only while the group has
    no members, as Kafka requires."""
    T = request_class(ApiKey.ALTER_SHARE_GROUP_OFFSETS).AlterShareGroupOffsetsRequestTopic
    by_topic: dict[str, list] = {}
    for (topic, p), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append(T.AlterShareGroupOffsetsRequestPartition(partition_index=p,
                                                                                       start_offset=offset))
    resp = c.request(ApiKey.ALTER_SHARE_GROUP_OFFSETS, group_id=group_id,
                     topics=[T(topic_name=t, partitions=ps) for t, ps in by_topic.items()])
    return KafkaError(resp.error_code), {(t.topic_name, p.partition_index): KafkaError(p.error_code)
                                         for t in resp.responses for p in t.partitions}
