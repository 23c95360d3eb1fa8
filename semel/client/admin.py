"""Admin calls for operators (the `semel txn` and `semel group` commands), over the wire.

Plain functions on a connected `Client`; each returns small dataclasses and
Kafka errors as values, never raw response objects. They use only standard
Kafka APIs (KIP-664 for transactions), so they work against any broker that
serves them.
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Any

from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..protocol.messages import request_class
from .client import Client, ClientError

TOPIC_RESOURCE = 2   # Kafka's ConfigResource type of a topic


@dataclass(frozen=True)
class TxnListing:
    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True)
class TxnDescription:
    transactional_id: str
    error: KafkaError
    state: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    timeout_ms: int = 0
    start_time_ms: int = -1
    partitions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class ProducerInfo:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    txn_start_offset: int      # -1: no open transaction in this partition


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    # Consumer protocol (KIP-848) only: the member's epoch and partitions, held and target.
    member_epoch: int | None = None
    assigned: tuple[tuple[str, int], ...] = ()
    target: tuple[tuple[str, int], ...] = ()
    # A classic member of a consumer group (online migration: ConsumerGroupDescribe v1 type 0).
    classic: bool = False


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    error: KafkaError
    state: str
    protocol_type: str
    protocol: str
    members: tuple[GroupMember, ...] = field(default=())
    # "classic", "consumer" (KIP-848) or "share" (KIP-932); the epochs are the
    # consumer protocol's and the share group's.
    group_type: str = "classic"
    group_epoch: int | None = None
    assignment_epoch: int | None = None


# --- transactions --------------------------------------------------------------------------

def list_transactions(c: Client, states: list[str] | None = None, producer_ids: list[int] | None = None,
                      min_duration_ms: int = -1) -> list[TxnListing]:
    fields: dict[str, Any] = dict(state_filters=list(states or []), producer_id_filters=list(producer_ids or []))
    if c.version(ApiKey.LIST_TRANSACTIONS) >= 1:
        fields["duration_filter"] = min_duration_ms
    resp = c.request(ApiKey.LIST_TRANSACTIONS, **fields)
    _raise(resp.error_code, "ListTransactions")
    return [TxnListing(t.transactional_id, t.producer_id, t.transaction_state) for t in resp.transaction_states]


def describe_transactions(c: Client, txn_ids: list[str]) -> list[TxnDescription]:
    if not txn_ids:
        return []
    resp = c.request(ApiKey.DESCRIBE_TRANSACTIONS, transactional_ids=list(txn_ids))
    out = []
    for t in resp.transaction_states:
        parts = tuple(sorted((tp.topic, p) for tp in t.topics or () for p in tp.partitions))
        out.append(TxnDescription(t.transactional_id, KafkaError(t.error_code), t.transaction_state,
                                  t.producer_id, t.producer_epoch, t.transaction_timeout_ms,
                                  t.transaction_start_time_ms, parts))
    return out


def describe_producers(c: Client, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], list[ProducerInfo]]:
    """{(topic, partition): producers}; a partition the broker refused raises ClientError."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    T = request_class(ApiKey.DESCRIBE_PRODUCERS).TopicRequest
    resp = c.request(ApiKey.DESCRIBE_PRODUCERS, topics=[T(name=t, partition_indexes=ps) for t, ps in by_topic.items()])
    out: dict[tuple[str, int], list[ProducerInfo]] = {}
    for t in resp.topics:
        for p in t.partitions:
            _raise(p.error_code, f"DescribeProducers {t.name}-{p.partition_index}")
            out[(t.name, p.partition_index)] = [
                ProducerInfo(t.name, p.partition_index, s.producer_id, s.producer_epoch, s.last_sequence,
                             s.last_timestamp, s.coordinator_epoch, s.current_txn_start_offset)
                for s in p.active_producers]
    return out


def abort_partition(c: Client, topic: str, partition: int, producer_id: int, producer_epoch: int,
                    coordinator_epoch: int) -> KafkaError:
    """An ABORT marker for producer_id's open transaction in one partition (what
    Kafka's admin abort sends: WriteTxnMarkers with transaction_result false)."""
    M = request_class(ApiKey.WRITE_TXN_MARKERS).WritableTxnMarker
    marker = M(producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=False,
               topics=[M.WritableTxnMarkerTopic(name=topic, partition_indexes=[partition])],
               coordinator_epoch=coordinator_epoch)
    resp = c.request(ApiKey.WRITE_TXN_MARKERS, markers=[marker])
    return KafkaError(resp.markers[0].topics[0].partitions[0].error_code)


def fence_transactional_id(c: Client, txn_id: str, timeout_ms: int = 60_000) -> tuple[KafkaError, int, int]:
    """InitProducerId for txn_id: the coordinator aborts its open transaction and bumps
    the epoch, so the producer that held it is fenced. (error, producer id, epoch)."""
    resp = c.request(ApiKey.INIT_PRODUCER_ID, transactional_id=txn_id, transaction_timeout_ms=timeout_ms,
                     producer_id=-1, producer_epoch=-1)
    return KafkaError(resp.error_code), resp.producer_id, resp.producer_epoch


def fence_until_settled(c: Client, txn_id: str, timeout_ms: int = 60_000,
                        tries: int = 50) -> tuple[KafkaError, int, int]:
    """fence_transactional_id, asked again while the coordinator answers
    CONCURRENT_TRANSACTIONS (it is still writing an earlier transition's markers);
    after `tries` that error is returned for the caller to explain."""
    for _ in range(tries):
        err, pid, epoch = fence_transactional_id(c, txn_id, timeout_ms)
        if err != KafkaError.CONCURRENT_TRANSACTIONS:
            break
        time.sleep(0.1)
    return err, pid, epoch


# --- records -------------------------------------------------------------------------------

def delete_records(c: Client, topic: str, before: dict[int, int]) -> dict[int, tuple[KafkaError, int]]:
    """DeleteRecords: each partition's records before its offset; {partition: (error, new log start)}."""
    T = request_class(ApiKey.DELETE_RECORDS).DeleteRecordsTopic
    resp = c.request(ApiKey.DELETE_RECORDS, timeout_ms=30000, topics=[T(name=topic, partitions=[
        T.DeleteRecordsPartition(partition_index=p, offset=o) for p, o in sorted(before.items())])])
    return {r.partition_index: (KafkaError(r.error_code), r.low_watermark) for r in resp.topics[0].partitions}


def topic_configs(c: Client, topics: list[str], keys: list[str] | None = None) -> dict[str, dict[str, str]]:
    """DescribeConfigs of topics: {topic: {name: value}} with the defaults in force (only
    `keys` when given); a topic the broker refuses to describe is left out."""
    if not topics:
        return {}
    R = request_class(ApiKey.DESCRIBE_CONFIGS).DescribeConfigsResource
    resp = c.request(ApiKey.DESCRIBE_CONFIGS, include_synonyms=False, include_documentation=False, resources=[
        R(resource_type=TOPIC_RESOURCE, resource_name=t, configuration_keys=keys) for t in topics])
    return {r.resource_name: {e.name: e.value for e in r.configs} for r in resp.results if not r.error_code}


# --- groups --------------------------------------------------------------------------------

def list_groups(c: Client, states: list[str] | None = None) -> list[tuple[str, str, str, str]]:
    """[(group id, protocol type, state, group type)]; the group type is "classic" from a
    broker without ListGroups v5."""
    version = c.version(ApiKey.LIST_GROUPS)
    fields: dict[str, Any] = {"states_filter": list(states or [])} if version >= 4 else {}
    if version >= 5:
        fields["types_filter"] = []
    resp = c.request(ApiKey.LIST_GROUPS, **fields)
    _raise(resp.error_code, "ListGroups")
    return sorted((g.group_id, g.protocol_type, getattr(g, "group_state", "") or "",
                   getattr(g, "group_type", "") or "classic") for g in resp.groups)


def describe_groups(c: Client, group_ids: list[str]) -> list[GroupDescription]:
    """Classic groups by DescribeGroups; a group it does not find is asked for again by
    ConsumerGroupDescribe (KIP-848) where the broker serves it, as Kafka's tools do."""
    resp = c.request(ApiKey.DESCRIBE_GROUPS, groups=list(group_ids), include_authorized_operations=False)
    out = [GroupDescription(g.group_id, KafkaError(g.error_code), g.group_state, g.protocol_type,
                            g.protocol_data,
                            tuple(GroupMember(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                              assigned=consumer_assignment(m.member_assignment)
                                              if g.protocol_type == "consumer" else ())
                                  for m in g.members))
           for g in resp.groups]
    for api, describe in ((ApiKey.CONSUMER_GROUP_DESCRIBE, describe_consumer_groups),
                          (ApiKey.SHARE_GROUP_DESCRIBE, describe_share_groups)):
        # DescribeGroups answers Dead for a group it does not know: a share group, maybe
        again = [d.group_id for d in out if d.error == KafkaError.GROUP_ID_NOT_FOUND
                 or (api == ApiKey.SHARE_GROUP_DESCRIBE and d.state == "Dead" and not d.error)]
        if again and api in c.versions:
            found = {d.group_id: d for d in describe(c, again) if not d.error}
            out = [found.get(d.group_id, d) for d in out]
    return out


def consumer_assignment(data: bytes | None) -> tuple[tuple[str, int], ...]:
    """The partitions in a classic consumer group member's assignment (Kafka's
    ConsumerProtocolAssignment: version, then topics with their partitions; the user
    data after them is not read). Bytes it cannot read give no partitions."""
    if not data:
        return ()
    try:
        pos = 2   # int16 version
        (topics,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out = []
        for _ in range(max(0, topics)):
            (n,) = struct.unpack_from(">h", data, pos)
            topic = data[pos + 2:pos + 2 + n].decode()
            pos += 2 + n
            (count,) = struct.unpack_from(">i", data, pos)
            pos += 4
            out += [(topic, p) for p in struct.unpack_from(f">{max(0, count)}i", data, pos)]
            pos += 4 * max(0, count)
        return tuple(sorted(out))
    except (struct.error, UnicodeDecodeError):
        return ()


def _partitions(assignment) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((t.topic_name, p) for t in assignment.topic_partitions for p in t.partitions))


def describe_consumer_groups(c: Client, group_ids: list[str]) -> list[GroupDescription]:
    resp = c.request(ApiKey.CONSUMER_GROUP_DESCRIBE, group_ids=list(group_ids),
                     include_authorized_operations=False)
    return [GroupDescription(
        g.group_id, KafkaError(g.error_code), g.group_state, "consumer", g.assignor_name,
        tuple(GroupMember(m.member_id, m.instance_id, m.client_id, m.client_host, m.member_epoch,
                          _partitions(m.assignment), _partitions(m.target_assignment),
                          getattr(m, "member_type", 1) == 0)
              for m in g.members),
        "consumer", g.group_epoch, g.assignment_epoch) for g in resp.groups]


def describe_share_groups(c: Client, group_ids: list[str]) -> list[GroupDescription]:
    """Share groups (KIP-932) by ShareGroupDescribe: members, their epochs and assignment."""
    resp = c.request(ApiKey.SHARE_GROUP_DESCRIBE, group_ids=list(group_ids), include_authorized_operations=False)
    return [GroupDescription(
        g.group_id, KafkaError(g.error_code), g.group_state, "share", g.assignor_name,
        tuple(GroupMember(m.member_id, None, m.client_id, m.client_host, m.member_epoch,
                          _partitions(m.assignment), _partitions(m.assignment))
              for m in g.members),
        "share", g.group_epoch, g.assignment_epoch) for g in resp.groups]


def delete_groups(c: Client, group_ids: list[str]) -> dict[str, KafkaError]:
    resp = c.request(ApiKey.DELETE_GROUPS, groups_names=list(group_ids))
    return {r.group_id: KafkaError(r.error_code) for r in resp.results}


def fetch_offsets(c: Client, group_id: str) -> dict[tuple[str, int], int]:
    """Every committed offset of a group (OffsetFetch with all partitions)."""
    resp = c.request(ApiKey.OFFSET_FETCH, group_id=group_id, topics=None, require_stable=False)
    _raise(resp.error_code, f"OffsetFetch {group_id}")
    out = {}
    for t in resp.topics:
        for p in t.partitions:
            _raise(p.error_code, f"OffsetFetch {group_id} {t.name}-{p.partition_index}")
            if p.committed_offset >= 0:
                out[(t.name, p.partition_index)] = p.committed_offset
    return out


def commit_offsets(c: Client, group_id: str, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], KafkaError]:
    """Commit outside group management (generation -1, no member): accepted only
    while the group has no members, as Kafka's offset reset tool requires."""
    T = request_class(ApiKey.OFFSET_COMMIT).OffsetCommitRequestTopic
    by_topic: dict[str, list] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append(T.OffsetCommitRequestPartition(
            partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
            committed_metadata=""))
    resp = c.request(ApiKey.OFFSET_COMMIT, group_id=group_id, generation_id_or_member_epoch=-1, member_id="",
                     group_instance_id=None, retention_time_ms=-1,
                     topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()])
    return {(t.name, p.partition_index): KafkaError(p.error_code) for t in resp.topics for p in t.partitions}


def _raise(code: int, what: str) -> None:
    if code:
        raise ClientError(f"{what}: {KafkaError(code).name}", KafkaError(code))


__all__ = ["TxnListing", "TxnDescription", "ProducerInfo", "GroupMember", "GroupDescription",
           "describe_consumer_groups", "consumer_assignment",
           "list_transactions", "describe_transactions", "describe_producers", "abort_partition",
           "fence_transactional_id", "fence_until_settled", "delete_records", "list_groups", "describe_groups", "delete_groups",
           "fetch_offsets", "commit_offsets"]
