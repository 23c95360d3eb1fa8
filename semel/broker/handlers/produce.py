"""Produce (0), RecordBatch v2 only (v3+).

Per partition: validate the payload (magic, CRC, sizes) and, for transactional
batches, that the partition was added to the producer's ongoing transaction
(KIP-890 part 1) — all before anything is appended. Producer id, epoch and
sequence checks happen in storage's producer state, also before the write.
acks=all: a large append is fsynced by the worker thread that writes it (write-
through), so its answer needs no further wait on one node; a small one waits for the
group-committed fsync without blocking the connection; in a cluster every acks=all
answer also waits for the high watermark to pass the batch (semel.cluster.replica_manager).
"""
from __future__ import annotations

import asyncio
import logging

from ...cluster.member import check_leader
from ...cluster.metadata import ClusterMetadata
from ...cluster.replica_manager import ReplicaManager
from ...protocol import records
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ...protocol.produce_response import ProduceAnswer, ProducePartitionAnswer, ProduceTopicAnswer, RecordError
from ...storage import compaction
from ...storage.errors import AppendError, StorageError
from ..connection import Deferred
from ..router import RequestContext, handler
from .common import auto_create_in_cluster, lookup, may_auto_create, unknown_topic
from ..config import BrokerConfig
from ..services import Services

log = logging.getLogger("semel.broker.produce")

class _PartitionResult:
    __slots__ = ("index", "error", "base_offset", "log", "upto", "message", "record_errors")

    def __init__(self, index, error=KafkaError.NONE, base_offset=-1, plog=None, upto=0, message=None,
                 record_errors=()):
        self.index, self.error, self.base_offset = index, error, base_offset
        self.log, self.upto, self.message = plog, upto, message
        self.record_errors = record_errors   # KIP-467: RecordErrors of the records that failed the batch


# How a Produce's appends reach the disk (measured on 2 cores with
# confluent-kafka, 1 KiB records, acks=all):
# - one partition: a large append is written and fsynced by one worker thread
#   (write-through), one hand-off per request: 1x1 broker CPU per GB 0.85x of
#   writing in a thread and then waiting for a flusher round;
# - several partitions: their appends are written on the event loop, up to this many
#   bytes per request, and their fsyncs run in group-commit rounds (one per log, in
#   parallel). A thread hand-off per partition for the write (and one for its fsync,
#   write-through) cost 4x8 about 1.5x the CPU per GB and 0.6x the throughput; one
#   shared round for all partitions of a request measured no better than parallel
#   rounds. Past the budget the appends go to worker threads again, so a request
#   naming many large partitions holds the loop for a few ms at most.
LOOP_WRITE_BUDGET_BYTES = 8 * 1024 * 1024


@handler(ApiKey.PRODUCE, 3, 9)
async def produce(ctx: RequestContext, req):
    acks = req.acks
    results: list[tuple[str, list[_PartitionResult]]] = []
    single = len(req.topic_data) == 1 and len(req.topic_data[0].partition_data) == 1
    budget = [0 if single else LOOP_WRITE_BUDGET_BYTES]
    for topic in req.topic_data:
        parts = []
        for pdata in topic.partition_data:
            if acks not in (0, 1, -1):
                parts.append(_PartitionResult(pdata.index, KafkaError.INVALID_REQUIRED_ACKS))
            else:
                parts.append(await _append_partition(ctx, req, topic.name, pdata, budget))
        results.append((topic.name, parts))
    if acks != -1 and ctx.services.replicas is None and ctx.services.config.log.flush_mode == "always":
        _flush_soon(ctx.services, results)
    if acks == 0:
        return None
    if acks == -1 and (ctx.services.replicas is not None or not _all_flushed(ctx, results)):
        return Deferred(_after_flush(ctx, req, results))
    return _response(ctx, results)


_FLUSHING: set = set()   # background flushes of acks=0/1 appends (a task needs a reference)


def _flush_soon(services: Services, results) -> None:
    """acks=0/1 on one node under flush_mode "always": nobody waits for the fsync, but
    readers see a record only once it is fsynced (PartitionLog.reads_wait_for_fsync),
    so it is fsynced now rather than whenever a later acks=all write comes."""
    named = [(name, part) for name, parts in results for part in parts if part.log is not None]
    if named:
        task = asyncio.get_running_loop().create_task(_durable_each(services, named))
        _FLUSHING.add(task)
        task.add_done_callback(_FLUSHING.discard)


def _all_flushed(ctx: RequestContext, results) -> bool:
    """acks=all on one node: is every appended batch on disk already? A large append
    is fsynced by its own write (write-through, PartitionLog.append_async), so most
    Produce requests are answered without a group-commit round; the rest wait for one."""
    if ctx.services.config.log.flush_mode != "always":
        return True
    return all(p.log is None or p.log.flushed_offset >= p.upto for _, parts in results for p in parts)


async def _append_partition(ctx: RequestContext, req, topic: str, pdata, budget: list[int]) -> _PartitionResult:
    services = ctx.services
    if topic.startswith("__"):
        return _PartitionResult(pdata.index, KafkaError.INVALID_TOPIC_EXCEPTION, message="internal topic")
    view = services.cluster
    if view is not None and topic not in view.topics():
        err = await _create_unknown(services.config, view, topic)
        if err:
            return _PartitionResult(pdata.index, err)
    err = check_leader(services.cluster, topic, pdata.index)   # NONE on a single node
    if err:
        return _PartitionResult(pdata.index, err)
    plog, err = lookup(ctx, topic, pdata.index)
    if err:
        return _PartitionResult(pdata.index, err)
    if services.replicas is not None:   # cluster: leading here, enough in-sync replicas for acks=all
        err = services.replicas.before_append(topic, pdata.index, req.acks)
        if err:
            return _PartitionResult(pdata.index, err)
    data = pdata.records
    if not data:
        return _PartitionResult(pdata.index, KafkaError.CORRUPT_MESSAGE, message="no records")
    if len(data) > services.config.max_message_bytes:
        return _PartitionResult(pdata.index, KafkaError.MESSAGE_TOO_LARGE)
    batches, err = records.split_batches(data)
    if err:
        return _PartitionResult(pdata.index, err, message=err.name)
    refused = _check_keys(ctx, topic, pdata.index, data, batches)
    if refused is not None:
        _debug_refusal(req, topic, pdata.index, batches, refused.error)
        return refused
    on_loop = len(data) <= budget[0]
    if on_loop:
        budget[0] -= len(data)
    try:
        # The transaction check runs inside the append, after any wait for the log:
        # a verdict taken before awaiting could be stale by the time of the write.
        info = await plog.append_async(data, batches,
                                       lambda: _check_transactional(ctx, req, topic, pdata.index, batches),
                                       sync=req.acks == -1 and services.config.log.flush_mode == "always",
                                       on_loop=on_loop)
    except AppendError as exc:  # producer-state refusals and disk failures; nothing was written
        if isinstance(exc, StorageError):
            log.error("append to %s-%d failed: %s", topic, pdata.index, exc)
        _debug_refusal(req, topic, pdata.index, batches, exc.error)
        return _PartitionResult(pdata.index, exc.error)
    if info.duplicate:
        services.metrics.duplicate_batches.inc()
        _debug_refusal(req, topic, pdata.index, batches, "duplicate", info.first_offset)
    else:
        services.metrics.produced_bytes.inc(len(data))
        services.notifier.notify(topic, pdata.index)
    return _PartitionResult(pdata.index, base_offset=info.first_offset, plog=plog, upto=info.last_offset + 1)


async def _create_unknown(config: BrokerConfig, view: ClusterMetadata, topic: str) -> KafkaError:
    """A topic this cluster broker does not know: created when auto-creation is on (the
    client then finds its leader, here or not), else the error for an unknown name."""
    if not may_auto_create(config, topic):
        return unknown_topic(topic)
    return await auto_create_in_cluster(config, view, topic)


def _debug_refusal(req, topic, partition, batches, what, offset=None) -> None:
    """One DEBUG line per refused or deduplicated batch: what chaos runs need to explain themselves."""
    if log.isEnabledFor(logging.DEBUG):
        h = batches[0][1]
        log.debug("produce %s-%d txn=%s pid=%d epoch=%d seq=%d..%d: %s%s", topic, partition, req.transactional_id,
                  h.producer_id, h.producer_epoch, h.base_sequence, batches[-1][1].last_sequence,
                  getattr(what, "name", what), "" if offset is None else f" (original offset {offset})")


def _check_keys(ctx: RequestContext, topic, partition, data, batches) -> _PartitionResult | None:
    """A compacted topic takes only keyed records (Kafka: INVALID_RECORD for the whole
    batch, naming each keyless record by its index, KIP-467, so a client can tell the
    bad records from the ones refused with them). None when the records may go in."""
    info = ctx.services.logs.topic(topic)
    if info is None or not compaction.is_compacted(info.cleanup_policy):
        return None
    err, keyless = compaction.check_keys(data, batches, ctx.services.config.max_decompressed_batch_bytes)
    if not err:
        return None
    if not keyless:
        return _PartitionResult(partition, err)
    why = f"topic {topic} is compacted (cleanup.policy=compact): every record needs a key"
    return _PartitionResult(
        partition, err, message=f"{len(keyless)} record(s) without a key in the batch to {topic}-{partition}; "
                                f"{why}; no record of the batch was written",
        record_errors=[RecordError(i, f"record {i} of the batch has no key; {why}") for i in keyless])


def _check_transactional(ctx: RequestContext, req, topic, partition, batches) -> KafkaError:
    """A transactional batch must come with the request's transactional id, and
    its partition must be part of that producer's ongoing transaction."""
    if any(h.is_control for _, h in batches):
        return KafkaError.INVALID_RECORD  # control batches are written by the coordinator only
    txn_batches = [h for _, h in batches if h.is_transactional]
    if not txn_batches:
        return KafkaError.NONE
    if req.transactional_id is None or len(txn_batches) != len(batches):
        return KafkaError.INVALID_REQUEST
    txns = ctx.services.txn_coordinator
    # Every batch, not only the first: an unverified producer's transactional batch
    # would open a transaction no coordinator knows, holding the LSO back for ever.
    for pid, epoch in dict.fromkeys((h.producer_id, h.producer_epoch) for h in txn_batches):
        err = txns.verify_produce(req.transactional_id, pid, epoch, topic, partition)
        if err:
            return err
    return KafkaError.NONE


async def _after_flush(ctx: RequestContext, req, results):
    if ctx.services.replicas is None:
        await _durable_each(ctx.services, [(name, part) for name, parts in results for part in parts
                                         if part.log is not None])
        return _response(ctx, results)
    waits = [_settle(ctx, req, name, part) for name, parts in results for part in parts if part.log is not None]
    await asyncio.gather(*waits)
    return _response(ctx, results)


async def _durable_each(services: Services, parts: list[tuple[str, _PartitionResult]]) -> None:
    """One node: every partition's batch on disk (flush policy), the fsyncs of all of
    them in flight together (GroupCommitFlusher.sync_each), without a task per partition.
    Readers waiting on a partition are woken again: its fsynced end, which they may
    read up to, just moved."""
    if services.config.log.flush_mode != "always":
        return
    failures = await services.flusher.sync_each([(p.log, p.upto) for _, p in parts])
    for (topic, part), exc in zip(parts, failures):
        if exc is not None:
            log.error("fsync failed: %s", exc)
            part.error = KafkaError.KAFKA_STORAGE_ERROR
        else:
            services.notifier.notify(topic, part.index)


async def _settle(ctx: RequestContext, req, topic: str, part: _PartitionResult) -> None:
    """acks=all: the batch is on disk here (flush policy) and, in a cluster, the high
    watermark has passed it (every ISR member holds it). The two waits run together:
    followers fetch from the page cache while the leader's fsync is under way."""
    services = ctx.services
    replicas = services.replicas
    if replicas is None:
        part.error = await _durable(services, part)
        return
    durable, replicated = await asyncio.gather(
        _durable_here(services, replicas, topic, part),
        replicas.wait_for_hw(topic, part.index, part.upto, max(req.timeout_ms, 0) / 1000))
    part.error = durable or replicated


async def _durable_here(services: Services, replicas: ReplicaManager, topic: str,
                        part: _PartitionResult) -> KafkaError:
    """_durable, then the high watermark looks again: under the durable policy it
    counts the leader's own fsynced end, which just moved."""
    err = await _durable(services, part)
    replicas.flushed(topic, part.index)
    return err


async def _durable(services: Services, part: _PartitionResult) -> KafkaError:
    try:
        await services.ensure_durable(part.log, part.upto)
    except StorageError as exc:
        log.error("fsync failed: %s", exc)
        return KafkaError.KAFKA_STORAGE_ERROR
    return KafkaError.NONE


def _response(ctx: RequestContext, results):
    """Plain answer objects (protocol.produce_response): kafka-python's cost tens of
    microseconds per partition to build and encode, paid by every Produce."""
    topics = []
    for name, parts in results:
        out = []
        for p in parts:
            ok = p.error == KafkaError.NONE
            answer = ProducePartitionAnswer(p.index, p.error, p.base_offset if ok else -1,
                                            p.log.log_start_offset if (ok and p.log) else -1,
                                            None if ok else p.message)
            if p.record_errors:
                answer.record_errors = p.record_errors
            out.append(answer)
            if not ok:
                ctx.services.metrics.request_errors.labels("produce", p.error.name).inc()
        topics.append(ProduceTopicAnswer(name, out))
    return ProduceAnswer(ctx.api_version, topics, throttle_time_ms=0)
