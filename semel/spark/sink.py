"""The exactly-once `format("semel")` sink, foreign-broker mode (b).

Standard Kafka APIs only, so it works against any Kafka-compatible broker or
cluster. Requests are routed as a Kafka producer routes them (semel.client.cluster.
ClusterRouter): transaction requests to the transactional id's coordinator (a parent and
its branches share it: their ids hash alike), TxnOffsetCommit and the decision read
to the group's coordinator, Produce to each partition's leader. Where they are one
broker (always on a single node) a step's requests still go in one write.

Identity. The query's consumer group G = options.query_group_id() (from
`kafka.group.id`, else the checkpoint location, which Spark hands the sink as
`checkpointLocation`), or `semel.query.id`. The parent transactional id is
P = "semel-spark-{G}".

The checkpoint is the driver's: only driver-side code reads it (semel.spark.
checkpoint, any file system Spark's checkpoint may be on). streamWriter(), which
Spark calls on the driver side for every micro-batch it plans, reads the query's id
and the batch's source end offsets (the newest entry of the offset log: Spark
writes it before planning the batch) and puts them on the writer, which Spark
pickles to the tasks; a task takes its batch id from its local properties and
refuses a writer planned for another batch. commit() reads the offsets again only
for a batch other than the one its writer was planned for.

write(), in every task attempt (also failed and speculative ones): checks the
batch is not decided yet (a replay after the decision writes nothing), opens
its own branch transaction B = "{P}.b{batch}.p{partition}.a{attempt}"
(InitProducerId fences an older writer of the same B), produces its rows
there, and returns (partition, attempt, pid, epoch, counts). Rows never travel
through the driver.

commit(messages, batch), in a fresh Python worker on the driver side:
1. reads G's committed offsets on the batch's decision partitions; metadata
   naming this batch means it is decided already (a commit() replayed after a
   crash): roll forward = EndTxn(commit) of the recorded branches again
   (idempotent), abort this replay's own branches, done;
2. otherwise InitProducerId(P) (fences a zombie run's parent), AddOffsetsToTxn
   + TxnOffsetCommit of the batch's source end offsets (Spark's offset log
   `<checkpoint>/offsets/<batch>`) with metadata naming the batch and its
   winning branches, EndTxn(commit) of P: this is the durable decision;
3. EndTxn(commit) of each winning branch with its (pid, epoch), then abort every
   branch of this batch or an earlier one still open (InitProducerId aborts what it
   left open), found with ListTransactions by id pattern where the broker has it,
   else guessed from the winners' attempt numbers.
A crash anywhere is resolved by the next commit() of the same batch (Spark
replays the batch after a restart from the checkpoint).

Visibility (mode b): branches commit one after another, so a read_committed
reader may see one task's output of a batch before another's. A branch left
open longer than its transaction timeout is aborted by the broker; the sink
therefore opens branches with `semel.restartWindowMs` as their timeout and
refuses to start when the broker will not grant it (INVALID_TRANSACTION_TIMEOUT).

The eos external sinks (PostgreSQL, filesystem, S3, ...) are not driven by this
writer; see docs/spark.md.
"""
from __future__ import annotations

import time
from dataclasses import replace

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter

from semel.backoff import Backoff
from semel.protocol.errors import KafkaError
from semel.client import txn as wire
from semel.client.cluster import ClusterRouter
from semel.spark import atomic
from semel.spark.advice import warn_many_tasks
from semel.spark import options as opt
from semel.spark.branch_writer import ArrowInput, Partitioner, write_branch
from semel.spark.decision import (BatchPlan, abort_batch, branch_id, commit_batch, decision_partitions, end_branch,
                                  fence_losers, join_branches, pick_winners, plan_batch, written_winners)
from semel.spark.routing import (BROKEN, connect, end_transaction, init_transaction, init_transaction_or_error,
                                 on_txn_coordinator, require_authorized, require_ok, reset_connections, retrying,
                                 txn_coordinator)
from semel.spark.sink_options import DEFAULT_RESTART_WINDOW_MS, SinkError, SinkOptions
# Option names (defined once, in semel/spark/options.py).
from semel.spark.options import ATOMIC, BATCH_ROWS, QUERY_ID, REQUEST_TIMEOUT, RESTART_WINDOW, TOPIC
from semel.spark.trace import Phases

_VALUE_TYPES = ("binary", "string")


def parse_options(options, fs_settings=None, each_batch: bool = False) -> SinkOptions:
    """`each_batch`: for write_each_batch, which alone takes the options choosing the tasks."""
    try:
        opts = opt.validate_sink(options)
        if not each_batch:
            opt.refuse_write_tasks(opts)
        security = opt.parse_security(opts)
        producer = opt.parse_producer(opts)
    except opt.OptionError as exc:
        raise SinkError(str(exc)) from None
    bootstrap = opts.get(opt.BOOTSTRAP, "").strip()
    if not bootstrap:
        raise SinkError(f"option '{opt.BOOTSTRAP}' is required")
    group = opts.get(QUERY_ID) or opt.query_group_id(opts)
    if not group:
        raise SinkError("the semel sink needs 'checkpointLocation', 'kafka.group.id' or 'semel.query.id' "
                        "to identify the query across restarts (a streaming write: .option('checkpointLocation', "
                        "...); the session-wide spark.sql.streaming.checkpointLocation does not reach a Python sink)")
    mode = opts.get(ATOMIC, "auto").strip().lower()
    if mode not in atomic.MODES:
        raise SinkError(f"option 'semel.atomicBatches' must be auto, true or false, got {opts[ATOMIC]!r}")
    return SinkOptions(bootstrap=bootstrap, group=group, parent=f"semel-spark-{group}",
                       topic=opts.get(TOPIC) or None, checkpoint=opts.get(opt.CHECKPOINT) or None,
                       restart_window_ms=_int(opts, RESTART_WINDOW, DEFAULT_RESTART_WINDOW_MS),
                       request_timeout_ms=_int(opts, REQUEST_TIMEOUT, 30_000),
                       batch_rows=_int(opts, BATCH_ROWS, 100_000), atomic_mode=mode,
                       fs=tuple(sorted((fs_settings or {}).items())), security=security, producer=producer)


def _int(opts: dict, name: str, default: int) -> int:
    text = opts.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise SinkError(f"option {name!r} must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise SinkError(f"option {name!r} must be a positive integer, got {text!r}")
    return value


# --- schema ---------------------------------------------------------------------------

def check_schema(schema, topic: str | None) -> dict[str, int]:
    """Column index by role; SinkError for what Spark's Kafka sink would also refuse."""
    names = {f.name.lower(): i for i, f in enumerate(schema.fields)}
    types = {f.name.lower(): f.dataType.typeName() for f in schema.fields}
    if "value" not in names:
        raise SinkError("the semel sink needs a 'value' column (binary or string)")
    for col in ("key", "value"):
        if col in types and types[col] not in _VALUE_TYPES:
            raise SinkError(f"column '{col}' must be binary or string, got {types[col]}")
    if "topic" in types and types["topic"] != "string":
        raise SinkError(f"column 'topic' must be string, got {types['topic']}")
    if "partition" in types and types["partition"] not in ("integer", "long", "short"):
        raise SinkError(f"column 'partition' must be an integer, got {types['partition']}")
    if topic is None and "topic" not in names:
        raise SinkError("no output topic: set option 'topic' or give a 'topic' column")
    return {k: names[k] for k in ("key", "value", "topic", "partition", "headers") if k in names}



def _probe_group(r: ClusterRouter, o: SinkOptions, st: wire.TxnState) -> None:
    """Every batch's transaction adds the query's group (AddOffsetsToTxn, then
    TxnOffsetCommit: Read on the group). Asked here, on the probe's own transaction
    (aborted at once), so a missing ACL fails the query at its start, not at the first
    batch's commit after its rows were written."""
    err = retrying(o, "AddOffsetsToTxn",
                   lambda: on_txn_coordinator(r, o, st.txn_id, lambda c: wire.add_offsets(c, st, o.group)))
    require_authorized(o, err, f"AddOffsetsToTxn of the group {o.group!r}")
    if err == KafkaError.NONE:
        retrying(o, "EndTxn", lambda: end_transaction(r, o, st.txn_id, st.pid, st.epoch, False))


def probe(o: SinkOptions) -> SinkOptions:
    """At query start: the broker is reachable, the topic exists, and it grants the
    restart window as a transaction timeout (else a branch could be aborted by the
    broker between a crash and the restart that commits it). Returns the options
    with mode (a) on where the broker supports it and semel.atomicBatches allows.
    A step whose connection broke mid-request is done again (each only fences and
    aborts the probe's own transactions, so doing one twice is harmless)."""
    probe_id = f"{o.parent}.probe"
    with connect(o) as r:
        if o.topic is not None:
            Partitioner(r, 0).count(o.topic)
        err, st = init_transaction_or_error(r, o, probe_id)
        if err == KafkaError.INVALID_TRANSACTION_TIMEOUT:
            raise SinkError(f"semel sink: the broker refuses a transaction timeout of {o.restart_window_ms} ms "
                            "(semel.restartWindowMs): raise its transaction.max.timeout.ms or lower the option")
        require_authorized(o, err, f"InitProducerId {probe_id!r}")
        require_ok(err, "InitProducerId probe")
        _probe_group(r, o, st)
        return replace(o, atomic=_resolve_mode(r, o, probe_id))


def _resolve_mode(r: ClusterRouter, o: SinkOptions, probe_id: str) -> bool:
    pace = Backoff(o.request_timeout_ms / 1000)
    while True:
        try:
            return atomic.resolve(o.atomic_mode, txn_coordinator(r, o, probe_id), probe_id, o.restart_window_ms)
        except atomic.AtomicError as exc:
            raise SinkError(f"semel sink: {exc}") from None
        except BROKEN as exc:
            reset_connections(r)
            if pace.expired():
                raise SinkError(f"semel sink: probing the broker: {exc}") from None
            pace.wait()


# Spark calls streamWriter() twice per micro-batch (planning, then again in the worker that
# runs commit()), and its Python workers are reused: probing once per worker and query is
# enough. A broker that changes meanwhile still refuses what it must (a transaction timeout
# it no longer grants fails the branch's InitProducerId), so nothing rests on a stale answer.
PROBE_TTL_S = 60.0
_probed: dict[tuple, tuple[float, bool]] = {}


def _probe_key(o: SinkOptions) -> tuple:
    return (o.bootstrap, o.parent, o.topic, o.restart_window_ms, o.atomic_mode, o.security)


def probe_cached(o: SinkOptions) -> SinkOptions:
    key = _probe_key(o)
    hit = _probed.get(key)
    if hit is not None and time.monotonic() - hit[0] < PROBE_TTL_S:
        return replace(o, atomic=hit[1])
    o = probe(o)  # a refusal raises and is not cached
    _probed[key] = (time.monotonic(), o.atomic)
    return o



def _task_identity() -> tuple[int | None, int, int]:
    from pyspark import TaskContext
    ctx = TaskContext.get()
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    return (int(batch) if batch is not None else None), ctx.partitionId(), ctx.attemptNumber()


# --- Spark writer classes --------------------------------------------------------------

class SemelStreamWriter(DataSourceStreamArrowWriter):
    """Tasks get Arrow record batches (no Row per record); see arrow_rows. Everything a
    task needs travels on this object (options, the query's id, the batch's plan): a
    task never reads the checkpoint."""

    def __init__(self, o: SinkOptions, cols: dict[str, int], plan: BatchPlan | None = None):
        self.o, self.cols, self.plan = o, cols, plan or BatchPlan()

    def __getstate__(self):
        # pickled for the tasks, which never open the checkpoint: its settings (S3 keys) stay behind
        return dict(self.__dict__, o=replace(self.o, fs=()))

    def write(self, iterator):
        batch, partition, attempt = _task_identity()
        if batch is None:
            raise SinkError("semel sink: the task has no streaming batch id (not a micro-batch query?)")
        if self.o.checkpoint is not None and self.plan.batch != batch:
            raise SinkError(f"semel sink: the task runs batch {batch}, but the newest batch the driver found in "
                            f"the offset log of {self.o.checkpoint} was {self.plan.batch}")
        return write_branch(self.o, self.cols, ArrowInput(iterator), batch, partition, attempt,
                            parts=decision_partitions(self.o, self.plan.offsets))

    def commit(self, messages, batchId: int) -> None:
        planned = self.plan.batch == batchId and self.o.checkpoint is not None
        commit_batch(self.o, messages, batchId, self.plan.offsets if planned else None)

    def abort(self, messages, batchId: int) -> None:
        abort_batch(self.o, messages, batchId)


class SemelBatchWriter(DataSourceArrowWriter):
    """df.write.format("semel"): one branch per task, committed together by the driver
    (no checkpoint, no replay: a failed job aborts its branches)."""

    def __init__(self, o: SinkOptions, cols: dict[str, int], job: int):
        self.o, self.cols, self.job = o, cols, job

    def write(self, iterator):
        _, partition, attempt = _task_identity()
        return write_branch(self.o, self.cols, ArrowInput(iterator), self.job, partition, attempt,
                            check=False)

    def commit(self, messages) -> None:
        with connect(self.o) as r:
            winners = pick_winners(messages)
            if self.o.atomic and written_winners(winners):  # one parent decides every task's branch at once
                st = init_transaction(r, self.o, self.o.parent)
                join_branches(r, self.o, st, [branch_id(self.o, self.job, m.partition, m.attempt)
                                              for m in written_winners(winners)])
                require_ok(retrying(self.o, "EndTxn",
                                    lambda: end_transaction(r, self.o, self.o.parent, st.pid, st.epoch, True)),
                           f"EndTxn {self.o.parent}")
            for m in written_winners(winners):
                end_branch(r, self.o, self.job, [m.partition, m.attempt, m.pid, m.epoch])
            fence_losers(r, self.o, self.job, winners, earlier=False)

    def abort(self, messages) -> None:
        abort_batch(self.o, messages, self.job)


def make_stream_writer(options, schema, overwrite: bool, fs_settings=None) -> SemelStreamWriter:
    """`fs_settings`: Hadoop `fs.*` settings to open the checkpoint with (S3A)."""
    o = parse_options(options, fs_settings)
    cols = check_schema(schema, o.topic)
    ph = Phases(o, "streamWriter", -1)
    hit = _probe_key(o) in _probed
    o = probe_cached(o)
    ph.mark("probe")
    o, plan = plan_batch(o)
    ph.mark("plan")
    warn_many_tasks(o.group, o.checkpoint, dict(o.fs), plan.batch, plan.shuffle_partitions, complete=overwrite)
    ph.done(cached=hit)
    return SemelStreamWriter(o, cols, plan)


def make_batch_writer(options, schema, overwrite: bool) -> SemelBatchWriter:
    if overwrite:
        # As Spark's Kafka sink: a topic is appended to, never replaced.
        raise SinkError("semel sink: save mode Overwrite is not allowed (records are appended to "
                        "topics, as with format('kafka')); use mode('append')")
    opts = dict(options)
    job = time.time_ns()
    opts.setdefault(QUERY_ID, f"batch-{job}")
    o = parse_options(opts)
    cols = check_schema(schema, o.topic)
    o = probe(o)
    return SemelBatchWriter(o, cols, job)
