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
import time
from typing import Any, Sequence

from ...cluster.replica_rules import not_enough_replicas_message
from ...protocol import records
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ...protocol.produce_response import ProduceAnswer, ProducePartitionAnswer, ProduceTopicAnswer, RecordError
from ...storage import compaction
from ...storage.committed import Target
from ...storage.errors import AppendError, StorageError
from ...storage.flusher import Begun
from ...storage.log import Batches, PartitionLog
from ..connection import Deferred
from ..router import RequestContext, handler
from .common import auto_create_topic, lookup, may_auto_create, unknown_topic
from ..config import BrokerConfig
from ..node_view import MetadataView
from ..services import Services

log = logging.getLogger("semel.broker.produce")

class _PartitionResult:
    __slots__ = ("index", "error", "base_offset", "log", "upto", "stamp", "message", "record_errors")

    def __init__(self, index: int, error: KafkaError = KafkaError.NONE, base_offset: int = -1,
                 plog: PartitionLog | None = None, upto: int = 0, message: str | None = None,
                 record_errors: Sequence[RecordError] = (), stamp: int | None = None):
        self.index, self.error, self.base_offset = index, error, base_offset
        self.log, self.upto, self.message = plog, upto, message
        self.stamp = stamp   # AppendInfo.fsync_stamp: the fsync wait asks the log with it
        self.record_errors = record_errors   # KIP-467: RecordErrors of the records that failed the batch


# Each topic's name and its partitions' outcomes, in the request's order
Results = list[tuple[str, list[_PartitionResult]]]


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
# How often a retry of stored batches held for the ISR looks again (_stored_retry_waits).
STORED_RETRY_POLL_S = 0.05


@handler(ApiKey.PRODUCE, 3, 9)
async def produce(ctx: RequestContext, req: Any) -> ProduceAnswer | Deferred | None:
    acks = req.acks
    results: Results = []
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
    if acks != -1 and ctx.services.config.log.flush_mode == "always":
        _flush_soon(ctx.services, results)
    if acks == 0:
        return None
    if acks == -1:
        committed, targets = ctx.services.committed, _targets(results)
        if not committed.already(targets):
            # The fsyncs start now; the answer waits for them in its turn (connection order).
            return Deferred(_after_flush(ctx, req, results, targets, committed.begin(targets)))
    return _response(ctx, results)


_FLUSHING: set[asyncio.Task[list[KafkaError]]] = set()   # background flushes of acks=0/1 appends (a task needs a reference)


def _flush_soon(services: Services, results: Results) -> None:
    """acks=0/1 under flush_mode "always": nobody waits for the fsync, but the high
    watermark counts a record only once fsynced here (PartitionLog.durable_end), so it is
    fsynced now rather than whenever a later acks=all write comes (the high watermark is
    not waited for: no timeout given)."""
    named = _targets(results)
    if named:
        task = asyncio.get_running_loop().create_task(services.committed.wait_each(named, 0))
        _FLUSHING.add(task)
        task.add_done_callback(_FLUSHING.discard)


def _targets(results: Results) -> list[Target]:
    """What a commit waits for: every partition that took a batch."""
    return [(name, part.index, part.log, part.upto, part.stamp) for name, parts in results for part in parts
            if part.log is not None]


async def _append_partition(ctx: RequestContext, req: Any, topic: str, pdata: Any,
                            budget: list[int]) -> _PartitionResult:
    services = ctx.services
    if topic.startswith("__"):
        return _PartitionResult(pdata.index, KafkaError.INVALID_TOPIC_EXCEPTION, message="internal topic")
    view = services.metadata
    # A known partition is the cheap answer (topics() copies the catalogue).
    if view.partition(topic, pdata.index) is None and topic not in view.topics():
        err = await _create_unknown(services.config, view, topic)
        if err:
            return _PartitionResult(pdata.index, err)
    err = services.replicas.leader_error(topic, pdata.index)
    if err:
        return _PartitionResult(pdata.index, err)
    plog, err = lookup(ctx, topic, pdata.index)
    if err or plog is None:   # lookup gives a log exactly when it gives no error
        return _PartitionResult(pdata.index, err)
    # Leading here, and for acks=all enough in-sync replicas.
    refusal = services.replicas.before_append(topic, pdata.index, req.acks)
    if refusal and refusal != KafkaError.NOT_ENOUGH_REPLICAS:
        return _PartitionResult(pdata.index, refusal)
    data = pdata.records
    if not data:
        return _PartitionResult(pdata.index, KafkaError.CORRUPT_MESSAGE, message="no records")
    if len(data) > services.config.max_message_bytes:
        return _PartitionResult(pdata.index, KafkaError.MESSAGE_TOO_LARGE)
    batches, err = records.split_batches(data)
    if err:
        return _PartitionResult(pdata.index, err, message=err.name)
    if refusal:
        refusal = await _stored_retry_waits(services, plog, topic, pdata.index, req, batches)
        if refusal:
            return _refused_append(services, topic, pdata.index, refusal)
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
    return _PartitionResult(pdata.index, base_offset=info.first_offset, plog=plog, upto=info.last_offset + 1,
                            stamp=info.fsync_stamp)


async def _stored_retry_waits(services: Services, plog: PartitionLog, topic: str, partition: int, req: Any,
                              batches: Batches) -> KafkaError:
    """An acks=all write while the ISR is below min.insync.replicas. NOT_ENOUGH_REPLICAS
    tells the producer nothing was written, and librdkafka's idempotent producer may
    then renumber the records under a new epoch (when a later request of its pipeline
    meets the gap) and write them twice. So a retry of batches this log already holds is
    not refused: it waits, up to the request's timeout, for the ISR to be large enough
    again (the append then answers it with the original offsets); then it gets
    NOT_ENOUGH_REPLICAS_AFTER_APPEND, "possibly written", and the client retries with
    the same sequence numbers. The connection's later requests wait behind it, as its
    order requires. A new batch is refused as before."""
    err, stored = plog.producers.check_batches([h for _, h in batches])
    if err or stored is None:
        return KafkaError.NOT_ENOUGH_REPLICAS
    deadline = time.monotonic() + max(0, req.timeout_ms) / 1000
    while time.monotonic() < deadline:
        await asyncio.sleep(STORED_RETRY_POLL_S)
        err = services.replicas.before_append(topic, partition, req.acks)
        if err != KafkaError.NOT_ENOUGH_REPLICAS:
            return err      # NONE: the append finds the stored batches; or e.g. NOT_LEADER_OR_FOLLOWER
    return KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND


def _refused_append(services: Services, topic: str, partition: int, err: KafkaError) -> _PartitionResult:
    """NOT_ENOUGH_REPLICAS is retriable, so a client retries it silently until its delivery
    timeout: the answer names the topic's replication factor and min.insync.replicas, and
    each refusal is counted per topic (semel_not_enough_replicas_total)."""
    if err != KafkaError.NOT_ENOUGH_REPLICAS:
        return _PartitionResult(partition, err)
    services.metrics.not_enough_replicas.labels(topic).inc()
    st = services.metadata.partition(topic, partition)
    replicas, isr = (len(st.replicas), len(st.isr)) if st is not None else (1, 1)
    message = not_enough_replicas_message(topic, replicas, isr, services.replicas.min_insync(topic))
    return _PartitionResult(partition, err, message=message)


async def _create_unknown(config: BrokerConfig, view: MetadataView, topic: str) -> KafkaError:
    """A topic this broker does not know: created when auto-creation is on (the client
    then finds its leader, here or not), else the error for an unknown name."""
    if not may_auto_create(config, topic):
        return unknown_topic(topic)
    return await auto_create_topic(config, view, topic)


def _debug_refusal(req: Any, topic: str, partition: int, batches: Batches, what: KafkaError | str,
                   offset: int | None = None) -> None:
    """One DEBUG line per refused or deduplicated batch: what chaos runs need to explain themselves."""
    if log.isEnabledFor(logging.DEBUG):
        h = batches[0][1]
        log.debug("produce %s-%d txn=%s pid=%d epoch=%d seq=%d..%d: %s%s", topic, partition, req.transactional_id,
                  h.producer_id, h.producer_epoch, h.base_sequence, batches[-1][1].last_sequence,
                  getattr(what, "name", what), "" if offset is None else f" (original offset {offset})")


def _check_keys(ctx: RequestContext, topic: str, partition: int, data: records.Buffer,
                batches: Batches) -> _PartitionResult | None:
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


def _check_transactional(ctx: RequestContext, req: Any, topic: str, partition: int, batches: Batches) -> KafkaError:
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


async def _after_flush(ctx: RequestContext, req: Any, results: Results, targets: list[Target],
                       begun: Begun | None) -> ProduceAnswer:
    """acks=all: every batch committed (semel.storage.committed): on disk here as the
    flush policy asks, the fsyncs of all partitions (`begun` when the request was
    handled) in flight together, then past the high watermark (every ISR member holds
    it; at once on a single node)."""
    taken = [part for _, parts in results for part in parts if part.log is not None]
    errors = await ctx.services.committed.wait_each(targets, max(req.timeout_ms, 0) / 1000, begun)
    for part, err in zip(taken, errors):
        part.error = err
    return _response(ctx, results)


def _response(ctx: RequestContext, results: Results) -> ProduceAnswer:
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
                answer.record_errors = list(p.record_errors)
            out.append(answer)
            if not ok:
                ctx.services.metrics.request_errors.labels("produce", p.error.name).inc()
        topics.append(ProduceTopicAnswer(name, out))
    return ProduceAnswer(ctx.api_version, topics, throttle_time_ms=0)
