"""Fetch (1) and ListOffsets (2).

read_uncommitted reads up to the high watermark; read_committed up to the last
stable offset, with the aborted transactions that overlap the returned range so
the client can drop their batches. Fetch long-polls: it waits (without holding
anything) until min_bytes are available or max_wait_ms passes; min_bytes=0
is answered at once, as Kafka does. The high watermark is the replicated one (the
log end alone); a follower's fetch (replica_id >= 0) reads to the log end and tells
the leader where the follower's log ends (`Services.replicas`: a cluster member's
semel.cluster.replica_manager; a single node has no follower and refuses it).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ...storage.errors import CorruptLogError, OffsetOutOfRange, StorageError
from ...storage.log import PartitionLog
from ..router import RequestContext, handler
from ..local_replicas import LocalReplicas
from ..services import Services

log = logging.getLogger("semel.broker.fetch")

READ_COMMITTED = 1
LATEST = -1
EARLIEST = -2

# A follower's fetch refused for a partition: an error, or (epoch, end offset) where its
# log diverged (LocalReplicas.replica_fetch)
Refusal = KafkaError | tuple[int, int]


def upper_bound(plog: PartitionLog, isolation: int) -> int:
    return plog.last_stable_offset if isolation == READ_COMMITTED else plog.high_watermark


@handler(ApiKey.FETCH, 4, 12)
async def fetch(ctx: RequestContext, req: Any) -> Any:
    services = ctx.services
    deadline = time.monotonic() + max(req.max_wait_ms, 0) / 1000
    keys = list(dict.fromkeys((t.topic, p.partition) for t in req.topics for p in t.partitions))
    # A follower's fetch: its fetch offsets are its log ends, recorded once per request;
    # it reads up to the log end, not the high watermark.
    refused = _replica_progress(services.replicas, req) if req.replica_id >= 0 else {}
    while True:
        topics, total = _read_all(ctx, req, refused)
        remaining = deadline - time.monotonic()
        # Nothing to wait on (no partitions: Kafka answers at once) is an answer too;
        # waiting for an append that cannot come once spun the loop until the deadline.
        # min_bytes <= 0 is satisfied by an empty response: Kafka answers it at once.
        if not keys or total >= req.min_bytes or remaining <= 0 or _has_error(topics):
            return ctx.response(throttle_time_ms=0, error_code=0, session_id=0, responses=topics)
        await services.notifier.wait_any(keys, remaining)


def _has_error(topics: list[Any]) -> bool:
    """An error or a diverging epoch: answered at once, not after the long poll."""
    return any(p.error_code or p.diverging_epoch is not None for t in topics for p in t.partitions)


def _replica_progress(replicas: LocalReplicas, req: Any) -> dict[tuple[str, int], Refusal]:
    refused: dict[tuple[str, int], Refusal] = {}
    for t in req.topics:
        for p in t.partitions:
            err = replicas.replica_fetch(t.topic, p.partition, req.replica_id, p.fetch_offset,
                                         p.current_leader_epoch, p.last_fetched_epoch)
            if err:   # an error, or (epoch, end offset) where the follower's log diverged
                refused[(t.topic, p.partition)] = err
    return refused


def _read_all(ctx: RequestContext, req: Any, refused: dict[tuple[str, int], Refusal]) -> tuple[list[Any], int]:
    """`refused`: what _replica_progress refused of a follower's fetch, per partition."""
    replicas = ctx.services.replicas
    replica = req.replica_id >= 0
    cls = ctx.cls()
    T = cls.FetchableTopicResponse
    # The broker caps a response below what clients ask for (50 MiB by default):
    # a huge response is encoded in one go on the event loop, stalling every other
    # connection meanwhile, while a few MiB per round trip already saturates a client.
    # A follower's own replica_fetch_max_bytes bounds its fetches instead (Kafka's
    # replica.fetch.response.max.bytes is separate too): the response is framed around
    # the stored bytes without copying them (protocol.fetch_response), so a larger one
    # costs no encoding time, and fewer round trips per MB is what replication needs.
    cap = ctx.services.config.max_fetch_response_bytes
    if replica and req.max_bytes > 0:
        cap = max(cap, req.max_bytes)
    budget = min(req.max_bytes, cap) if req.max_bytes > 0 else cap
    total = 0
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            left, first = budget - total, total == 0
            allowed = replicas.throttle_allowance(t.topic, p.partition, req.replica_id) if replica else -1
            if allowed >= 0:   # a reassignment's new replica, throttled: no more than the budget
                left, first = min(left, allowed), False
            part, size = _read_partition(ctx, T.PartitionData, t.topic, p, req.isolation_level,
                                         left, first=first, replica=replica,
                                         refused=refused.get((t.topic, p.partition)))
            if allowed >= 0:
                replicas.spend(size)
            total += size
            parts.append(part)
        topics.append(T(topic=t.topic, partitions=parts))
    return topics, total


def _read_partition(ctx: RequestContext, P: Any, topic: str, p: Any, isolation: int, budget: int, first: bool,
                    replica: bool = False, refused: Refusal | None = None) -> tuple[Any, int]:
    if isinstance(refused, tuple):   # KIP-320/KIP-595: no records, where to truncate instead
        diverged = ctx.services.logs.get(topic, p.partition)
        if diverged is not None:
            epoch, end = refused
            return P(partition_index=p.partition, error_code=0, high_watermark=diverged.high_watermark,
                     last_stable_offset=diverged.last_stable_offset, log_start_offset=diverged.log_start_offset,
                     aborted_transactions=None, diverging_epoch=P.EpochEndOffset(epoch=epoch, end_offset=end),
                     records=b""), 0
    elif refused:
        return P(partition_index=p.partition, error_code=refused, high_watermark=-1, last_stable_offset=-1,
                 log_start_offset=-1, aborted_transactions=None, records=b""), 0
    # A follower's Fetch (replica_id >= 0) passes the same leadership and epoch check.
    err = ctx.services.replicas.leader_error(topic, p.partition, getattr(p, "current_leader_epoch", -1))
    if err:
        return _error_partition(P, p.partition, err), 0
    plog = ctx.services.logs.get(topic, p.partition)
    if plog is None:
        return P(partition_index=p.partition, error_code=KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                 high_watermark=-1, last_stable_offset=-1, log_start_offset=-1,
                 aborted_transactions=None, records=b""), 0
    hw = plog.high_watermark
    lso = plog.last_stable_offset
    bound = plog.log_end_offset if replica else lso if isolation == READ_COMMITTED else hw
    # read() returns at least one whole batch even past max_bytes, so the first
    # partition always makes progress (Kafka's rule for oversized batches).
    max_bytes = min(p.partition_max_bytes, budget)
    # A follower gets the batches with their structure and offsets checked but not their
    # CRC-32C: it checks every batch's CRC before it appends anything (split_batches in
    # storage.replica_writes) and refuses the whole answer otherwise, then fetches again,
    # so a damaged batch never reaches its log; a pass here over every byte served to each
    # follower would check the same bytes twice. Clients may not
    # check (librdkafka's check.crcs is off by default): their fetches keep it.
    try:
        data = (plog.read_checked(p.fetch_offset, max(max_bytes, 1), bound, crc=not replica)
                if max_bytes > 0 or first else b"")
    except OffsetOutOfRange:
        return P(partition_index=p.partition, error_code=KafkaError.OFFSET_OUT_OF_RANGE,
                 high_watermark=hw, last_stable_offset=lso, log_start_offset=plog.log_start_offset,
                 aborted_transactions=None, records=b""), 0
    except StorageError as exc:
        # Damaged on disk or unreadable: a retriable error, never bytes a client would misread.
        if not isinstance(exc, CorruptLogError) or exc.first_report:
            log.error("fetch %s-%d at %d: %s", topic, p.partition, p.fetch_offset, exc)
        return P(partition_index=p.partition, error_code=KafkaError.KAFKA_STORAGE_ERROR,
                 high_watermark=hw, last_stable_offset=lso, log_start_offset=plog.log_start_offset,
                 aborted_transactions=None, records=b""), 0
    aborted = None
    if isolation == READ_COMMITTED:
        aborted = [P.AbortedTransaction(producer_id=pid, first_offset=first_off)
                   for pid, first_off in plog.aborted_transactions(p.fetch_offset, bound)] if data else []
    return P(partition_index=p.partition, error_code=0, high_watermark=hw, last_stable_offset=lso,
             log_start_offset=plog.log_start_offset, aborted_transactions=aborted,
             preferred_read_replica=-1, records=data), len(data)


def _error_partition(P: Any, index: int, err: KafkaError) -> Any:
    return P(partition_index=index, error_code=err, high_watermark=-1, last_stable_offset=-1,
             log_start_offset=-1, aborted_transactions=None, records=b"")


@handler(ApiKey.LIST_OFFSETS, 1, 7)
async def list_offsets(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    T = cls.ListOffsetsTopicResponse
    P = T.ListOffsetsPartitionResponse
    isolation = req.isolation_level if ctx.api_version >= 2 else 0
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            code = ctx.services.replicas.leader_error(t.name, p.partition_index,
                                                      getattr(p, "current_leader_epoch", -1))
            code, ts, off = (code, -1, -1) if code else _offset_for(ctx, t.name, p.partition_index,
                                                                     p.timestamp, isolation)
            parts.append(P(partition_index=p.partition_index, error_code=code, timestamp=ts,
                           offset=off, leader_epoch=_leader_epoch(ctx.services, t.name, p.partition_index)
                           if code == 0 else -1))
        topics.append(T(name=t.name, partitions=parts))
    return ctx.response(throttle_time_ms=0, topics=topics)


def _leader_epoch(services: Services, topic: str, partition: int) -> int:
    """The epoch clients should validate offsets against: the partition's current leader
    epoch (this broker leads it; 0 on a single node, which never hands a partition over)."""
    st = services.metadata.partition(topic, partition)
    return st.leader_epoch if st is not None else 0


def _offset_for(ctx: RequestContext, topic: str, partition: int, timestamp: int,
                isolation: int) -> tuple[KafkaError, int, int]:
    plog = ctx.services.logs.get(topic, partition)
    if plog is None:
        return KafkaError.UNKNOWN_TOPIC_OR_PARTITION, -1, -1
    if timestamp == LATEST:
        return KafkaError.NONE, -1, upper_bound(plog, isolation)
    if timestamp == EARLIEST:
        return KafkaError.NONE, -1, plog.log_start_offset
    if timestamp < 0:  # -3 (max timestamp, KIP-734) is not offered: ListOffsets stops at v7
        return KafkaError.INVALID_REQUEST, -1, -1
    found = plog.offset_for_timestamp(timestamp)  # (timestamp, offset) of the first record at or after
    if found is None or found[1] >= upper_bound(plog, isolation):
        return KafkaError.NONE, -1, -1
    ts, off = found
    return KafkaError.NONE, ts, off
