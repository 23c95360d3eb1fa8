"""The exactly-once `format("semel")` sink (issue 10), foreign-broker mode (b).

Standard Kafka APIs only, so it works against any Kafka-compatible broker or
cluster. Requests are routed as a Kafka producer routes them (semel.client.reader.
Cluster): transaction requests to the transactional id's coordinator (a parent and
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
3. EndTxn(commit) of each winning branch with its (pid, epoch), then fence the
   losing attempts' ids (InitProducerId aborts what they left open).
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

import json
import os
import signal
import time
from dataclasses import dataclass, field, replace
from typing import Iterator

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from semel.client.client import Client, ClientError
from semel.client import txn as wire
from semel.client.reader import COORDINATOR_MOVED, GROUP, TRANSACTION, Cluster
from semel.protocol.errors import KafkaError
from semel.protocol.txn_hash import java_string_hash
from semel.spark import atomic, batches, pool
from semel.spark import options as opt
from semel.spark.checkpoint import Checkpoint, CheckpointError
from semel.spark.security import PLAINTEXT, Security

TP = tuple[str, int]

QUERY_ID = "semel.query.id"
RESTART_WINDOW = "semel.restartwindowms"
ATOMIC = "semel.atomicbatches"
REQUEST_TIMEOUT = "kafka.request.timeout.ms"
BATCH_ROWS = "semel.batch.rows"
TOPIC = "topic"

# Kafka's offset.metadata.max.bytes default (semel's too): the decision must fit.
MAX_DECISION_BYTES = 4096
# Bytes of records per produce request: under Kafka's default message.max.bytes (1 MiB + 12).
MAX_REQUEST_BYTES = 1000 * 1000
DEFAULT_RESTART_WINDOW_MS = 15 * 60 * 1000  # Kafka's default transaction.max.timeout.ms
# Test-only crash injection: "<step>@<batch>" kills process group KILL_PGID_ENV
# (the driver and its JVM) and the calling worker at that step of that batch.
KILL_ENV = "SEMEL_SPARK_SINK_KILL_AT"
KILL_PGID_ENV = "SEMEL_SPARK_SINK_KILL_PGID"
# Test-only: a task's first attempt raises after producing all its rows (a loser
# with data in its branch, which Spark retries).
FAIL_FIRST_ATTEMPT_ENV = "SEMEL_SPARK_SINK_FAIL_FIRST_ATTEMPT"
STEPS = ("write:produced", "commit:parent-offsets", "commit:decided", "commit:branch")
# Diagnostics (the benchmark's per-batch breakdown): a file that gets one JSON line of
# phase timings per write() and per commit(). Unset: nothing is timed or written.
TRACE_ENV = "SEMEL_SPARK_SINK_TRACE"

_VALUE_TYPES = ("binary", "string")


class SinkError(Exception):
    """A sink failure with one readable line (bad option, bad schema, broker refusal)."""


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    group: str
    parent: str
    topic: str | None
    checkpoint: str | None
    restart_window_ms: int
    request_timeout_ms: int
    batch_rows: int
    atomic_mode: str = "auto"
    atomic: bool = False  # mode (a), resolved against the broker at query start (probe)
    # Spark's query id (`<checkpoint>/metadata`), read on the driver side: the lineage the
    # batch numbers of a decision belong to (see _decision_in)
    query: str | None = None
    # Hadoop `fs.*` settings to open the checkpoint with (driver side; never sent to tasks)
    fs: tuple[tuple[str, str], ...] = ()
    security: Security = PLAINTEXT  # TLS and SASL of every connection (semel/spark/security.py)


def parse_options(options, fs_settings=None) -> SinkOptions:
    try:
        opts = opt.validate_sink(options)
        security = opt.parse_security(opts)
    except opt.OptionError as exc:
        raise SinkError(str(exc)) from None
    bootstrap = opts.get(opt.BOOTSTRAP, "").strip()
    if not bootstrap:
        raise SinkError(f"option '{opt.BOOTSTRAP}' is required")
    group = opts.get(QUERY_ID) or opt.query_group_id(opts)
    if not group:
        raise SinkError("the semel sink needs 'checkpointLocation', 'kafka.group.id' or 'semel.query.id' "
                        "to identify the query across restarts")
    mode = opts.get(ATOMIC, "auto").strip().lower()
    if mode not in atomic.MODES:
        raise SinkError(f"option 'semel.atomicBatches' must be auto, true or false, got {opts[ATOMIC]!r}")
    return SinkOptions(bootstrap=bootstrap, group=group, parent=f"semel-spark-{group}",
                       topic=opts.get(TOPIC) or None, checkpoint=opts.get(opt.CHECKPOINT) or None,
                       restart_window_ms=_int(opts, RESTART_WINDOW, DEFAULT_RESTART_WINDOW_MS),
                       request_timeout_ms=_int(opts, REQUEST_TIMEOUT, 30_000),
                       batch_rows=_int(opts, BATCH_ROWS, 100_000), atomic_mode=mode,
                       fs=tuple(sorted((fs_settings or {}).items())), security=security)


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


def _bytes(v) -> bytes | None:
    if v is None:
        return None
    return v.encode() if isinstance(v, str) else bytes(v)


def _header(h) -> tuple:
    # a Row (key, value) from the row path, a {"key", "value"} dict from Arrow's to_pylist
    k, v = (h["key"], h["value"]) if isinstance(h, dict) else (h[0], h[1])
    return k, _bytes(v)


# --- broker helpers -----------------------------------------------------------------

def _open(o: SinkOptions) -> Cluster:
    try:
        return Cluster(o.bootstrap, timeout_s=o.request_timeout_ms / 1000, client_id="semel-spark-sink",
                       topics=[o.topic] if o.topic else [], fail_fast=True, security=o.security)
    except ClientError as exc:
        raise SinkError(f"semel sink: {exc}") from None


def _usable(r: Cluster) -> bool:
    r.drop_closed()  # connections a broker closed meanwhile are reopened when next needed
    return True


def _connect(o: SinkOptions):
    """The connections to the cluster's brokers for one write() or commit(), kept by the
    worker for the next one (semel.spark.pool)."""
    return pool.borrow(("sink", o.bootstrap, o.request_timeout_ms, o.security), lambda: _open(o), _usable,
                       Cluster.close)


def _routed(get, o: SinkOptions | None = None):
    try:
        return get()
    except ClientError as exc:
        needed = _needed(o, exc.error) if o is not None else None
        raise SinkError(f"semel sink: {exc}" + (f"; the user needs {needed}" if needed else "")) from None


def _route_key(o: SinkOptions, txn_id: str) -> str:
    """The id whose coordinator serves txn_id. In mode (a) a branch's is its parent's:
    semel coordinates ids that hash alike on one partition and the sink's branch ids hash
    like the parent (atomic.branch_name), so no FindCoordinator per branch. In mode (b)
    each id is asked for on its own (a foreign broker may place ids another way)."""
    if o.atomic and txn_id != o.parent and java_string_hash(txn_id) == java_string_hash(o.parent):
        return o.parent
    return txn_id


def _txn(r: Cluster, o: SinkOptions, txn_id: str) -> Client:
    """The connection to txn_id's transaction coordinator."""
    key = _route_key(o, txn_id)
    return _routed(lambda: r.coordinator(key, TRANSACTION), o)


def _group(r: Cluster, o: SinkOptions) -> Client:
    """The connection to the query's group coordinator (offsets and the decision)."""
    return _routed(lambda: r.coordinator(o.group, GROUP), o)


def _leader(r: Cluster, tp: TP) -> Client:
    return _routed(lambda: r.leader(tp))


def _retry_rounds(o: SinkOptions, step) -> KafkaError:
    """step() -> (error, progressed), again until it returns NONE or an error that is not
    retriable, or the request timeout has passed since the last step that made progress
    (a long flush that keeps moving is not cut off by a deadline from its start)."""
    deadline = time.monotonic() + o.request_timeout_ms / 1000
    delay = 0.05
    while True:
        err, progressed = step()
        if err == KafkaError.NONE or not err.retriable:
            return err
        if progressed:
            deadline = time.monotonic() + o.request_timeout_ms / 1000
            delay = 0.05
        elif time.monotonic() > deadline:
            return err
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def _retrying(o: SinkOptions, what: str, call) -> KafkaError:
    """Run call() -> KafkaError until it is not retriable or the request timeout has passed."""
    return _retry_rounds(o, lambda: (call(), False))


def _on_txn(r: Cluster, o: SinkOptions, txn_id: str, call) -> KafkaError:
    """call(connection) -> KafkaError on txn_id's coordinator; an answer saying it moved
    drops the cached one (the retry asks again)."""
    return r.seen(call(_txn(r, o, txn_id)), coordinator=(_route_key(o, txn_id), TRANSACTION))


def _end(r: Cluster, o: SinkOptions, txn_id: str, pid: int, epoch: int, commit: bool) -> KafkaError:
    return _on_txn(r, o, txn_id, lambda c: wire.end_txn(c, txn_id, pid, epoch, commit))


def _ok(err: KafkaError, what: str) -> None:
    if err != KafkaError.NONE:
        raise SinkError(f"semel sink: {what}: {err.name}")


def _needed(o: SinkOptions, err: KafkaError | None) -> str | None:
    """The ACL an authorization error of the sink's calls says is missing (the list in
    docs/spark.md, Security)."""
    if err == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return f"Write on the transactional ids with prefix {o.parent!r}"
    if err == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return f"Read on the group {o.group!r}"
    if err == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return f"Write on the topic {o.topic!r}" if o.topic else "Write on the output topics"
    return None


def _authorized(o: SinkOptions, err: KafkaError | None, what: str) -> None:
    needed = _needed(o, err)
    if needed is not None:
        raise SinkError(f"semel sink: not authorized: {what} was refused with {err.name}; "
                        f"the user needs {needed}")


def _probe_group(r: Cluster, o: SinkOptions, st: wire.TxnState) -> None:
    """Every batch's transaction adds the query's group (AddOffsetsToTxn, then
    TxnOffsetCommit: Read on the group). Asked here, on the probe's own transaction
    (aborted at once), so a missing ACL fails the query at its start, not at the first
    batch's commit after its rows were written."""
    err = _on_txn(r, o, st.txn_id, lambda c: wire.add_offsets(c, st, o.group))
    _authorized(o, err, f"AddOffsetsToTxn of the group {o.group!r}")
    if err == KafkaError.NONE:
        _end(r, o, st.txn_id, st.pid, st.epoch, False)


def probe(o: SinkOptions) -> SinkOptions:
    """At query start: the broker is reachable, the topic exists, and it grants the
    restart window as a transaction timeout (else a branch could be aborted by the
    broker between a crash and the restart that commits it). Returns the options
    with mode (a) on where the broker supports it and semel.atomicBatches allows."""
    probe_id = f"{o.parent}.probe"
    with _connect(o) as r:
        if o.topic is not None:
            _Partitioner(r, 0).count(o.topic)
        err, st = _init_err(r, o, probe_id)
        if err == KafkaError.INVALID_TRANSACTION_TIMEOUT:
            raise SinkError(f"semel sink: the broker refuses a transaction timeout of {o.restart_window_ms} ms "
                            "(semel.restartWindowMs): raise its transaction.max.timeout.ms or lower the option")
        _authorized(o, err, f"InitProducerId {probe_id!r}")
        _ok(err, "InitProducerId probe")
        _probe_group(r, o, st)
        try:
            return replace(o, atomic=atomic.resolve(o.atomic_mode, _txn(r, o, probe_id), probe_id, o.restart_window_ms))
        except atomic.AtomicError as exc:
            raise SinkError(f"semel sink: {exc}") from None


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


# --- the batch's durable decision -----------------------------------------------------

def _checkpoint(o: SinkOptions) -> Checkpoint:
    try:
        return Checkpoint(o.checkpoint, dict(o.fs))
    except CheckpointError as exc:
        raise SinkError(f"semel sink: {exc}") from None


def batch_offsets(o: SinkOptions, batch: int) -> dict[TP, int]:
    """The source end offsets Spark journaled for `batch` (semel/Kafka-shaped sources
    only), read from the checkpoint: driver side only."""
    if o.checkpoint is None:
        return {}
    try:
        return _kafka_offsets(_checkpoint(o).offset_lines(batch) or [])
    except CheckpointError as exc:
        raise SinkError(f"semel sink: {exc}") from None


@dataclass(frozen=True)
class BatchPlan:
    """What the driver side read from the checkpoint for the micro-batch it plans: the
    batch number (None without a checkpoint) and its source end offsets."""
    batch: int | None = None
    offsets: dict = field(default_factory=dict)


def plan_batch(o: SinkOptions) -> tuple[SinkOptions, BatchPlan]:
    """At streamWriter(), on the driver side: the query's id (on the options) and the
    plan of the batch Spark is about to run, the newest of its offset log."""
    if o.checkpoint is None:
        return o, BatchPlan()
    try:
        ck = _checkpoint(o)
        batch = ck.latest_batch()
        offsets = _kafka_offsets(ck.offset_lines(batch) or []) if batch is not None else {}
        return replace(o, query=ck.query_id()), BatchPlan(batch, offsets)
    except CheckpointError as exc:
        raise SinkError(f"semel sink: {exc}") from None


def _kafka_offsets(lines: list[str]) -> dict[TP, int]:
    out: dict[TP, int] = {}
    for line in lines[2:]:  # "v1", Spark's own metadata, then one line per source
        try:
            doc = json.loads(line)
            out.update({(t, int(p)): int(off) for t, ps in doc.items() for p, off in ps.items()})
        except (ValueError, AttributeError, TypeError):
            continue  # another source's offset shape: nothing the sink commits
    return out


def decision_partitions(o: SinkOptions, offsets: dict[TP, int]) -> list[TP]:
    if offsets:
        return sorted(offsets)
    if o.topic is None:
        raise SinkError("semel sink: no semel source offsets in this batch and no 'topic' option to "
                        "record the batch decision on")
    return [(o.topic, 0)]  # a query without a semel source: record the decision on the output


def read_decision(r: Cluster, o: SinkOptions, parts: list[TP], fence_open: bool = True) -> dict | None:
    """The newest decision the query's committed offsets record, or None.

    UNSTABLE_OFFSET_COMMIT means a parent transaction is open. In commit() (the
    only decider of this run, fence_open) it is a killed or zombie run's: fence it
    (the broker aborts it), then read the settled state. A task (not fence_open)
    must not fence it: a speculative copy still writing while this run's commit()
    decides would abort that commit. For a task an open parent means "not decided
    yet" (None): it cannot include the task's branch, whose message is not sent.
    A group coordinator that moved is asked for again."""
    deadline = time.monotonic() + o.request_timeout_ms / 1000
    delay = 0.05
    while True:
        try:
            got = wire.committed_with_metadata(_group(r, o), o.group, parts)
            break
        except ClientError as exc:
            moved = r.seen(exc.error, coordinator=(o.group, GROUP)) in COORDINATOR_MOVED
            if not (moved or exc.error == KafkaError.UNSTABLE_OFFSET_COMMIT) or time.monotonic() > deadline:
                raise SinkError(f"semel sink: {exc}") from None
            if moved:
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            elif not fence_open:
                return None
            else:
                _fence(r, o, o.parent)
    return _decision_in(o, got)


def _decision_in(o: SinkOptions, got: dict) -> dict | None:
    """The newest decision of this run among the committed offsets' metadata."""
    best = None
    for off, meta in got.values():
        if off < 0 or not meta:
            continue
        try:
            doc = json.loads(meta)
        except ValueError:
            continue
        if not isinstance(doc, dict) or doc.get("semel-spark") != 1:
            continue
        if doc.get("query") is not None and doc["query"] != o.query:
            continue  # an earlier checkpoint's batch numbers: not decisions about this run's batches
        if best is None or doc["batch"] > best["batch"]:
            best = doc
    return best


def branch_id(o: SinkOptions, batch: int, partition: int, attempt: int) -> str:
    return atomic.branch_name(o.parent, f"{o.parent}.b{batch}.p{partition}.a{attempt}")


class _Phases:
    """Wall time of each phase of one write() or commit() (ms since the previous mark),
    appended as one JSON line to the file TRACE_ENV names; does nothing when it is unset."""

    def __init__(self, o: SinkOptions, where: str, batch: int):
        self.path = os.environ.get(TRACE_ENV)
        self.doc: dict = {"query": o.group, "where": where, "batch": batch, "pid": os.getpid(), "start": time.time()}
        self.t = time.perf_counter()

    def mark(self, phase: str) -> None:
        if self.path:
            now = time.perf_counter()
            self.doc[phase] = round((now - self.t) * 1000, 2)
            self.t = now

    def done(self, **extra) -> None:
        if self.path:
            self.doc.update(extra, end=time.time())
            # one write() of one short line to an O_APPEND file: lines of concurrent tasks do not mix
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(self.doc) + "\n")


def _kill_if(step: str, batch: int) -> None:
    if os.environ.get(KILL_ENV) != f"{step}@{batch}":
        return
    pgid = os.environ.get(KILL_PGID_ENV)
    if pgid:
        os.killpg(int(pgid), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


# --- tasks -----------------------------------------------------------------------------

@dataclass
class BranchMessage(WriterCommitMessage):
    partition: int
    attempt: int
    pid: int = -1
    epoch: int = -1
    rows: int = 0
    skipped: bool = False  # the batch was decided before this attempt wrote anything
    counts: dict = field(default_factory=dict)


def _task_identity() -> tuple[int | None, int, int]:
    from pyspark import TaskContext
    ctx = TaskContext.get()
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    return (int(batch) if batch is not None else None), ctx.partitionId(), ctx.attemptNumber()


class _Partitioner:
    """Kafka's default choice: explicit partition, else murmur2 of the key, else round robin."""

    def __init__(self, r: Cluster, start: int):
        self.r = r
        self.sizes: dict[str, int] = {}
        self.next = start
        self.hashes: dict[bytes, int] = {}  # murmur2 per key: keys repeat, the hash is pure Python

    def count(self, topic: str) -> int:
        n = self.sizes.get(topic)
        if n is None:
            try:
                n = self.sizes[topic] = self.r.partition_count(topic)
            except ClientError as exc:
                raise SinkError(f"semel sink: {exc}") from None
        return n

    def pick(self, topic: str, key: bytes | None, partition) -> int:
        n = self.count(topic)
        if partition is not None:
            if not 0 <= int(partition) < n:
                raise SinkError(f"semel sink: partition {partition} out of range for topic {topic} ({n})")
            return int(partition)
        if key is not None:
            h = self.hashes.get(key)
            if h is None:
                self._hash([key])
                h = self.hashes[key]
            return h % n
        self.next += 1
        return self.next % n

    def pick_many(self, topic: str, keys, rows: int):
        """pick() for `rows` rows at once, as a NumPy array, with the same choices: murmur2
        of each key (`keys`: an Arrow binary or string column without nulls), or round
        robin where there is no key column (None). Each distinct key is hashed once."""
        import numpy as np
        import pyarrow as pa
        n = self.count(topic)
        if keys is None:
            parts = (self.next + 1 + np.arange(rows, dtype=np.int64)) % n
            self.next += rows
            return parts
        enc = keys.dictionary_encode()
        distinct = enc.dictionary.cast(pa.binary()).to_pylist()
        self._hash(distinct)
        hashes = np.fromiter(map(self.hashes.__getitem__, distinct), dtype=np.int64, count=len(distinct))
        return hashes[enc.indices.to_numpy()] % n

    def _hash(self, keys) -> None:
        """Cache murmur2 of the keys not cached yet."""
        from kafka.partitioner.default import murmur2
        if len(self.hashes) > 100_000:
            self.hashes.clear()
        for key in set(keys).difference(self.hashes):
            self.hashes[key] = murmur2(key) & 0x7FFFFFFF


def _decided(r: Cluster, o: SinkOptions, batch: int, parts: list[TP]) -> bool:
    """Task side: whether `batch` is decided (an open parent counts as not yet); `parts`:
    the batch's decision partitions (decision_partitions of the plan's offsets)."""
    done = read_decision(r, o, parts, fence_open=False)
    return done is not None and done["batch"] >= batch


def _decided_call(o: SinkOptions, batch: int, parts: list[TP]):
    """_decided() as a (call, result) pair that goes in one write with other requests; the
    result is None where the group coordinator moved (then _decided() asks on its own)."""
    call = wire.committed_call(o.group, parts)
    fetched = wire.committed_result(o.group)

    def result(r) -> bool:
        try:
            done = _decision_in(o, fetched(r))
        except ClientError as exc:
            if exc.error in COORDINATOR_MOVED:
                return None
            if exc.error != KafkaError.UNSTABLE_OFFSET_COMMIT:
                raise SinkError(f"semel sink: {exc}") from None
            return False  # an open parent: not decided yet (see read_decision)
        return done is not None and done["batch"] >= batch
    return call, result


def arrow_rows(batches: Iterator, cols: dict[str, int]) -> Iterator[tuple]:
    """Rows as tuples in schema order from Arrow record batches, converted a column at a
    time (Spark's own Row path converts value by value and builds a Row per record)."""
    import pyarrow as pa
    for rb in batches:
        columns = []
        for i, col in enumerate(rb.columns):
            if i in (cols.get("key"), cols.get("value")):
                if pa.types.is_string(col.type):
                    col = col.cast(pa.binary())  # bytes straight from Arrow, no str round trip
                # bytes objects via NumPy: about ten times faster than to_pylist's scalars
                columns.append(col.to_numpy(zero_copy_only=False).tolist())
            else:
                columns.append(col.to_pylist())
        yield from zip(*columns)


class ArrowInput:
    """A task's input as Arrow record batches (what Spark's Arrow writers get): written a
    column at a time where the batch allows it (see _feed_arrow; columnar=False: always
    row by row, the reference the columnar path is tested against)."""

    def __init__(self, batches: Iterator, columnar: bool = True):
        self.batches = batches
        self.columnar = columnar


def _feed_arrow(producer: "_BranchProducer", part: "_Partitioner", cols: dict[str, int], data: ArrowInput,
                topic: str | None) -> None:
    """Each Arrow batch's rows are sent before the next batch is taken: Spark's JVM keeps
    preparing the next one meanwhile, so little is left to send once the input ends (the
    task's tail, on the batch's critical path).

    The common case goes without a Python loop per row: one output topic (the option),
    keys without nulls or no key column, no partition or headers column. Rows are assigned
    and grouped per partition with NumPy, keeping their order within a partition, and their
    record batches are encoded from the Arrow buffers (semel.spark.batches); other batches
    take the row path. Either way the same rows go to the same partitions in the same order
    and produce requests are cut at the same rows."""
    import numpy as np
    ki, vi = cols.get("key"), cols["value"]
    columnar = data.columnar and topic is not None and not {"topic", "partition", "headers"} & cols.keys()
    for rb in data.batches:
        if not columnar or rb.num_rows == 0 or (ki is not None and rb.column(ki).null_count):
            _feed(producer, part, cols, arrow_rows([rb], cols), topic)
            producer.flush()
            continue
        values = batches.BinaryColumn(rb.column(vi))
        sizes = values.sizes() + 16  # what add() counts: key + value bytes + 16
        keys = None
        if ki is not None:
            keys = batches.BinaryColumn(rb.column(ki))
            sizes += keys.sizes()
        parts = part.pick_many(topic, rb.column(ki) if ki is not None else None, rb.num_rows)
        for p in np.unique(parts).tolist():
            idx = np.flatnonzero(parts == p)
            producer.add_columns(topic, p, keys, values, idx, sizes[idx])
        producer.flush()


def write_branch(o: SinkOptions, cols: dict[str, int], rows: Iterator, batch: int, partition: int,
                 attempt: int, check: bool = True, parts: list[TP] | None = None) -> BranchMessage:
    """One task attempt's branch. `parts`: where the batch's decision is recorded (from
    the writer's plan; without one, the `topic` option's partition 0)."""
    ph = _Phases(o, f"write p{partition} a{attempt}", batch)
    bid = branch_id(o, batch, partition, attempt)
    if check and parts is None:
        parts = decision_partitions(o, {})
    with _connect(o) as r:
        ph.mark("connect")
        decided, st = _check_and_init(r, o, batch, bid, check, parts)
        ph.mark("check_and_init")
        if decided:
            return BranchMessage(partition, attempt, skipped=True)
        producer = _BranchProducer(o, r, st)
        part = _Partitioner(r, partition)
        _feed(producer, part, cols, rows, o.topic)
        # The re-check rides with the last Produce request (the broker answers it after that
        # request): no round trip of its own unless nothing was left to send.
        recheck = producer.flush((_group(r, o), _decided_call(o, batch, parts)) if check else None)
        ph.mark("input_and_produce")
        _kill_if("write:produced", batch)
        if check and recheck is None:
            recheck = _decided(r, o, batch, parts)
        ph.mark("recheck")
        ph.done(rows=producer.total, produce_ms=round(producer.send_s * 1000, 2))
        if recheck:
            # Decided while we wrote (a speculative copy or a zombie run lost the
            # race): commit() fenced only the attempt numbers it knew of, so end
            # our own branch now rather than leave it open for the restart window.
            _retrying(o, "EndTxn", lambda: _end(r, o, bid, st.pid, st.epoch, False))
            return BranchMessage(partition, attempt, skipped=True)
        if attempt == 0 and os.environ.get(FAIL_FIRST_ATTEMPT_ENV):
            raise SinkError("semel sink: injected failure of a first task attempt (test hook)")
        return BranchMessage(partition, attempt, st.pid, st.epoch, producer.total,
                             counts={f"{t}:{p}": n for (t, p), n in producer.counts.items()})


def _check_and_init(r: Cluster, o: SinkOptions, batch: int, bid: str, check: bool, parts: list[TP] | None):
    """(decided already?, the branch's TxnState). A replay of a decided batch writes
    nothing. In mode (b) it must not InitProducerId its recorded branches either (that
    would abort them before commit() rolls them forward), so the check goes first. In
    mode (a) the broker completed a decided batch's branches itself and an InitProducerId
    of one changes nothing of it (of a branch of an undecided parent it aborts that parent,
    wanted either way): where the group's and the branch's coordinator are one broker, the
    check and the InitProducerId go in one write."""
    if not check:
        return False, _init(r, o, bid)
    g = _group(r, o)
    if not o.atomic or g is not _txn(r, o, bid):
        if _decided(r, o, batch, parts):
            return True, None
        return False, _init(r, o, bid)
    decided, (err, st) = wire.pipelined(g, _decided_call(o, batch, parts),
                                        (wire.init_producer_id_call(bid, o.restart_window_ms),
                                         wire.init_producer_id_result(bid)))
    if decided is None:
        decided = _decided(r, o, batch, parts)
    if decided:
        return True, None
    if err != KafkaError.NONE:
        st = _init(r, o, bid)  # retried as on its own (CONCURRENT_TRANSACTIONS while the broker ends one)
    return False, st


def _feed(producer: "_BranchProducer", part: _Partitioner, cols: dict[str, int], rows,
          topic: str | None) -> None:
    if isinstance(rows, ArrowInput):
        _feed_arrow(producer, part, cols, rows, topic)
        return
    ki, vi, ti, pi, hi = (cols.get(c) for c in ("key", "value", "topic", "partition", "headers"))
    for row in rows:
        t = (row[ti] or topic) if ti is not None else topic
        key = _bytes(row[ki]) if ki is not None else None
        value = row[vi]
        if value is not None and not isinstance(value, bytes):
            value = _bytes(value)
        headers = [_header(h) for h in (row[hi] or [])] if hi is not None else []
        producer.add(t, part.pick(t, key, row[pi] if pi is not None else None), (key, value, headers))


class _Chunk:
    """Records of one partition that go out as one record batch: rows (the row path,
    with headers) or row indices into Arrow columns (the columnar path)."""
    __slots__ = ("rows", "keys", "values", "idx", "count", "nbytes", "encoded")

    def __init__(self, nbytes: int, rows=None, keys=None, values=None, idx=None):
        self.rows, self.keys, self.values, self.idx = rows, keys, values, idx
        self.count = len(rows) if rows is not None else len(idx)
        self.nbytes = nbytes
        self.encoded: tuple | None = None

    def encode(self, st: wire.TxnState, seq: int) -> bytes:
        """The record batch; a resend (after a leader moved) is the same bytes, same
        producer id, epoch and sequence, so a broker that got it before drops the copy."""
        key = (st.pid, st.epoch, seq)
        if self.encoded is None or self.encoded[0] != key:
            if self.rows is not None:
                data = wire.build_txn_batch(self.rows, st.pid, st.epoch, seq)
            else:
                data = batches.encode(self.keys, self.values, self.idx, producer_id=st.pid, producer_epoch=st.epoch,
                                      base_sequence=seq, timestamp_ms=int(time.time() * 1000))
            self.encoded = (key, data)
        return self.encoded[1]


# A Produce request carries the next batch of every partition with records waiting, up
# to this many bytes (each batch is at most about MAX_REQUEST_BYTES).
MAX_ROUND_BYTES = 4 * MAX_REQUEST_BYTES


class _BranchProducer:
    """Buffers rows per partition and sends them as transactional batches: one Produce
    request per partition leader, each round. Where the coordinator leads them all (one
    broker), in the same write as the AddPartitionsToTxn of those not in the transaction
    yet (the broker handles them in order); else the join is answered first."""

    def __init__(self, o: SinkOptions, r: Cluster, st: wire.TxnState):
        self.o, self.r, self.st = o, r, st
        self.buf: dict[TP, list] = {}   # row path: rows not cut into a chunk yet
        self.size: dict[TP, int] = {}   # buffered key + value bytes per partition
        self.ready: dict[TP, list[_Chunk]] = {}  # chunks to send, in order per partition
        self.added: set[TP] = set()
        self.counts: dict[TP, int] = {}
        self.total = 0
        self.send_s = 0.0  # time in AddPartitionsToTxn and Produce round trips

    def add(self, topic: str, partition: int, rec: tuple) -> None:
        tp = (topic, partition)
        rows = self.buf.setdefault(tp, [])
        rows.append(rec)
        size = self.size[tp] = self.size.get(tp, 0) + len(rec[1] or b"") + len(rec[0] or b"") + 16
        # few large produce requests: each is a round trip (and a log append) on the broker
        if len(rows) >= self.o.batch_rows or size >= MAX_REQUEST_BYTES:
            self._seal(tp)
            self._send_ready()

    def add_columns(self, topic: str, partition: int, keys, values, idx, sizes) -> None:
        """add() of the rows `idx` of Arrow columns (sizes: NumPy array of each one's
        add() size), cut into batches at the same records add() would cut."""
        import numpy as np
        tp = (topic, partition)
        self._seal(tp)
        chunks = self.ready.setdefault(tp, [])
        while len(idx):
            # add() cuts once the rows or bytes reach the cap, the record that reaches it included
            reach = np.cumsum(sizes[:self.o.batch_rows])
            k = min(int(np.searchsorted(reach, MAX_REQUEST_BYTES, side="left")) + 1, len(reach))
            chunks.append(_Chunk(int(reach[k - 1]), keys=keys, values=values, idx=idx[:k]))
            idx, sizes = idx[k:], sizes[k:]

    def flush(self, tail=None):
        """Send everything. `tail`, a (call, result) pair, goes in the same write as the
        last Produce request; its result is returned (None when nothing was sent)."""
        for tp in list(self.buf):
            self._seal(tp)
        return self._send_ready(tail)

    def _seal(self, tp: TP) -> None:
        rows = self.buf.pop(tp, None)
        size = self.size.pop(tp, 0)
        if rows:
            self.ready.setdefault(tp, []).append(_Chunk(size, rows=rows))

    def _next_round(self) -> dict[TP, _Chunk]:
        out: dict[TP, _Chunk] = {}
        size = 0
        for tp, chunks in self.ready.items():
            if chunks and (not out or size < MAX_ROUND_BYTES):
                out[tp] = chunks[0]
                size += chunks[0].nbytes
        return out

    def _send_ready(self, tail=None):
        """Rounds until everything is sent; `tail` as in flush(). A retriable refusal is
        tried again (the request timeout counts from the last round that sent something)."""
        self.ready = {tp: cs for tp, cs in self.ready.items() if cs}
        box: dict = {"got": None, "why": None}

        def rounds() -> tuple[KafkaError, bool]:
            progressed = False
            while self.ready:
                failure, sent = self._send_round(tail, box)
                progressed = progressed or sent
                if failure is not None:
                    box["why"] = failure
                    return failure[2], progressed
            return KafkaError.NONE, progressed
        err = _retry_rounds(self.o, rounds)
        if err != KafkaError.NONE:
            what, (topic, partition), _ = box["why"]
            raise SinkError(f"semel sink: {what} {topic}-{partition}: {err.name}")
        return box["got"]

    def _send_round(self, tail, box: dict):
        """One round: the next chunk of each partition (up to MAX_ROUND_BYTES). Returns
        (None or (what, tp, error) of the first failure, whether any chunk was sent)."""
        t0 = time.perf_counter()
        chunks = self._next_round()
        last = len(chunks) == len(self.ready) and all(len(self.ready[tp]) == 1 for tp in chunks)
        new = sorted(tp for tp in chunks if tp not in self.added)
        data = {tp: ch.encode(self.st, self.st.seq.get(tp, 0)) for tp, ch in chunks.items()}
        add_errs, produced, tail_got = self._round(data, new, tail if last else None)
        self.send_s += time.perf_counter() - t0
        refused = {tp: e for tp, e in add_errs.items() if e != KafkaError.NONE}
        if not refused:
            self.added.update(new)
        failed: dict[TP, KafkaError] = {}
        sent = False
        for tp, ch in chunks.items():
            err = produced.get(tp, KafkaError.UNKNOWN_SERVER_ERROR)
            if err == KafkaError.NONE:
                sent = True
                self.st.seq[tp] = self.st.seq.get(tp, 0) + ch.count
                self.counts[tp] = self.counts.get(tp, 0) + ch.count
                self.total += ch.count
                self.ready[tp].pop(0)
                if not self.ready[tp]:
                    del self.ready[tp]
            elif not (refused and tp in new):  # not in the transaction: the join's error tells why
                failed[tp] = err
        # the cause, not the OPERATION_NOT_ATTEMPTED a broker gives the others of a request
        why = sorted(refused.items(), key=lambda kv: kv[1] == KafkaError.OPERATION_NOT_ATTEMPTED)
        what = "AddPartitionsToTxn"
        if not why:
            why, what = sorted(failed.items()), "Produce"
        if not why:
            if last:
                box["got"] = tail_got
            return None, sent
        tp, err = why[0]
        return (what, tp, err), sent

    def _round(self, data: dict[TP, bytes], new: list[TP], tail):
        """One write per broker: AddPartitionsToTxn of `new` (if any), the Produce of
        `data`, `tail` ((connection, (call, result)) or None). Returns (the join's errors,
        the produce's errors, the tail's result); errors that say a coordinator or leader
        moved drop it from the routing cache, so the next round asks again."""
        coord = _txn(self.r, self.o, self.st.txn_id)
        leaders = {tp: _leader(self.r, tp) for tp in data}
        if all(c is coord for c in leaders.values()) and (tail is None or tail[0] is coord):
            add_errs, produced, tail_got = self._round_on_one(coord, data, new, tail)
        else:
            add_errs, produced, tail_got = self._round_on_many(coord, leaders, data, new, tail)
        for e in add_errs.values():
            self.r.seen(e, coordinator=(_route_key(self.o, self.st.txn_id), TRANSACTION))
        for tp, e in produced.items():
            self.r.seen(e, tp=tp)
        return add_errs, produced, tail_got

    def _round_on_one(self, c: Client, data: dict[TP, bytes], new: list[TP], tail):
        calls = []
        if new:
            calls.append((wire.add_partitions_call(c, self.st, new), wire.add_partitions_result))
        calls.append((wire.produce_call(self.st, data), wire.produce_result))
        if tail is not None:
            calls.append(tail[1])
        got = wire.pipelined(c, *calls)
        add_errs = got.pop(0) if new else {}
        return add_errs, got[0], (got[1] if tail is not None else None)

    def _round_on_many(self, coord: Client, leaders: dict[TP, Client], data: dict[TP, bytes],
                       new: list[TP], tail):
        """The join is answered before any Produce to a joined partition is sent (another
        broker would not see it in order); the Produce requests go out to all leaders at
        once, the tail after their answers."""
        add_errs = wire.add_partitions(coord, self.st, new) if new else {}
        if any(e != KafkaError.NONE for e in add_errs.values()):
            data = {tp: d for tp, d in data.items() if tp not in new}
        by_leader: dict[Client, dict[TP, bytes]] = {}
        for tp, d in data.items():
            by_leader.setdefault(leaders[tp], {})[tp] = d
        got = wire.scatter({c: [(wire.produce_call(self.st, part), wire.produce_result)]
                            for c, part in by_leader.items()})
        produced = {tp: e for answers in got.values() for tp, e in answers[0].items()}
        tail_got = wire.pipelined(tail[0], tail[1])[0] if tail is not None else None
        return add_errs, produced, tail_got


# --- driver-side commit -------------------------------------------------------------

def _written(winners: list[BranchMessage]) -> list[BranchMessage]:
    """Branches with rows. A task that wrote nothing (an empty partition) left its
    branch Empty: no transaction to join or commit (EndTxn would be INVALID_TXN_STATE)."""
    return [m for m in winners if m.rows > 0]


def _winners(messages) -> list[BranchMessage]:
    return [m for m in messages if isinstance(m, BranchMessage) and not m.skipped and m.pid >= 0]


def _init_err(r: Cluster, o: SinkOptions, txn_id: str) -> tuple[KafkaError, wire.TxnState | None]:
    """InitProducerId on txn_id's coordinator, retried while the broker is still ending
    the id's previous transaction (CONCURRENT_TRANSACTIONS) or the coordinator moves,
    within the request timeout."""
    box: dict = {"st": None}

    def call(c: Client) -> KafkaError:
        err, box["st"] = wire.init_producer_id(c, txn_id, o.restart_window_ms)
        return err
    return _retrying(o, "InitProducerId", lambda: _on_txn(r, o, txn_id, call)), box["st"]


def _init(r: Cluster, o: SinkOptions, txn_id: str) -> wire.TxnState:
    err, st = _init_err(r, o, txn_id)
    _ok(err, f"InitProducerId {txn_id}")
    return st


def _fence(r: Cluster, o: SinkOptions, txn_id: str) -> None:
    """InitProducerId on a branch id: the broker aborts what it left open."""
    _init(r, o, txn_id)


def _end_branch(r: Cluster, o: SinkOptions, batch: int, b: list) -> None:
    part, attempt, pid, epoch = b
    bid = branch_id(o, batch, part, attempt)
    err = _retrying(o, "EndTxn", lambda: _end(r, o, bid, pid, epoch, True))
    if err != KafkaError.NONE:
        raise SinkError(f"semel sink: batch {batch} is committed but its branch {bid} cannot be: {err.name} "
                        "(aborted by the broker's transaction timeout? see semel.restartWindowMs)")


def commit_batch(o: SinkOptions, messages, batch: int, offsets: dict[TP, int] | None = None) -> None:
    """`offsets`: the batch's source end offsets where the caller has them (the writer's
    plan), else they are read from the checkpoint."""
    if offsets is None:
        offsets = batch_offsets(o, batch)
    parts = decision_partitions(o, offsets)
    winners = _winners(messages)
    ph = _Phases(o, "commit", batch)
    with _connect(o) as r:
        ph.mark("connect")
        st, done = _init_and_read(r, o, parts)
        ph.mark("init_and_read")
        if done is not None and done["batch"] >= batch:
            _roll_forward(r, o, done, batch, winners)
            return
        written = _written(winners)
        branches = [[m.partition, m.attempt, m.pid, m.epoch] for m in written]
        # Mode (a) records no branches: the parent's decision carries them on the broker,
        # which keeps the metadata small however many tasks the batch has.
        meta = json.dumps({"semel-spark": 1, "batch": batch, "branches": [] if o.atomic else branches,
                           "atomic": o.atomic, "query": o.query}, separators=(",", ":"))
        if len(meta) > MAX_DECISION_BYTES:
            raise SinkError(f"semel sink: batch {batch} has {len(branches)} writing tasks, too many to record in "
                            f"offset metadata ({len(meta)} > {MAX_DECISION_BYTES} bytes) in mode (b): "
                            "coalesce the output or use a semel broker (mode a)")
        marks = offsets or {tp: batch for tp in parts}
        _join_and_offsets(r, o, st, [branch_id(o, batch, m.partition, m.attempt) for m in written], marks, meta)
        ph.mark("join_and_offsets")
        _kill_if("commit:parent-offsets", batch)
        losers = _decide(r, o, st, _loser_ids(o, batch, winners))
        ph.mark("end_txn")
        _kill_if("commit:decided", batch)
        # Mode (a): the parent's EndTxn has completed every joined branch already (the
        # broker's own doing, crash or not), so there is nothing to end one by one.
        for i, b in enumerate([] if o.atomic else branches):
            _end_branch(r, o, batch, b)
            if i == 0:
                _kill_if("commit:branch", batch)
        ph.mark("end_branches")
        for txn_id in losers:
            _fence(r, o, txn_id)
        ph.mark("fence_losers")
        ph.done(branches=len(written))


def _init_and_read(r: Cluster, o: SinkOptions, parts: list[TP]) -> tuple[wire.TxnState, dict | None]:
    """InitProducerId of the parent, then the decision read. The InitProducerId goes
    first: it fences a zombie's parent and aborts one a killed run left open, so the read
    that follows finds settled offsets; for a batch decided already the new epoch is
    unused (the next batch's commit() takes another). Where one broker coordinates both
    the parent and the group, both go in one write; where that broker was still ending
    that parent, both are done again one at a time."""
    c = _txn(r, o, o.parent)
    if c is not _group(r, o):
        st = _init(r, o, o.parent)
        return st, read_decision(r, o, parts)
    fetched = wire.committed_result(o.group)

    def read(resp):
        try:
            return fetched(resp)
        except ClientError as exc:
            return exc
    (err, st), got = wire.pipelined(c, (wire.init_producer_id_call(o.parent, o.restart_window_ms),
                                        wire.init_producer_id_result(o.parent)),
                                    (wire.committed_call(o.group, parts), read))
    if err != KafkaError.NONE or isinstance(got, ClientError):
        r.seen(err, coordinator=(o.parent, TRANSACTION))
        done = read_decision(r, o, parts)
        return _init(r, o, o.parent), done
    return st, _decision_in(o, got)


def _join_and_offsets(r: Cluster, o: SinkOptions, st: wire.TxnState, branch_ids: list[str],
                      marks: dict[TP, int], meta: str) -> None:
    """Mode (a): join the branches; then AddOffsetsToTxn and TxnOffsetCommit of the
    batch's offsets with the decision metadata, all in one write where one broker
    coordinates the parent and the group (it handles them in order). What failed is done
    again one at a time, with its retries; nothing here is the decision (EndTxn is), so a
    failure leaves at most an open parent."""
    c = _txn(r, o, o.parent)
    if c is not _group(r, o):
        _join(r, o, st, branch_ids)
        _offsets(r, o, st, marks, meta)
        return
    join = o.atomic and bool(branch_ids)
    calls = [(wire.add_partitions_call(c, st, [atomic.pseudo_partition(b) for b in branch_ids]),
              wire.add_partitions_result)] if join else []
    calls += [(wire.add_offsets_call(st, o.group), wire.error_result),
              (wire.txn_offset_commit_call(c, st, o.group, marks, meta), wire.txn_offset_commit_result)]
    got = wire.pipelined(c, *calls)
    joined = got.pop(0) if join else {}
    if any(e != KafkaError.NONE for e in joined.values()):
        _join(r, o, st, branch_ids)
    added, errs = got
    if added != KafkaError.NONE or any(e != KafkaError.NONE for e in errs.values()):
        _offsets(r, o, st, marks, meta)


def _offsets(r: Cluster, o: SinkOptions, st: wire.TxnState, marks: dict[TP, int], meta: str) -> None:
    """AddOffsetsToTxn (the parent's coordinator), then TxnOffsetCommit (the group's)."""
    err = _retrying(o, "AddOffsetsToTxn", lambda: _on_txn(r, o, o.parent, lambda c: wire.add_offsets(c, st, o.group)))
    _ok(err, "AddOffsetsToTxn")
    box: dict = {}

    def commit() -> KafkaError:
        box["errs"] = wire.txn_offset_commit(_group(r, o), st, o.group, marks, meta)
        bad = [e for e in box["errs"].values() if e != KafkaError.NONE]
        return r.seen(bad[0], coordinator=(o.group, GROUP)) if bad else KafkaError.NONE
    _retrying(o, "TxnOffsetCommit", commit)
    bad = {tp: e for tp, e in box["errs"].items() if e != KafkaError.NONE}
    if bad:
        raise SinkError(f"semel sink: TxnOffsetCommit: {', '.join(f'{t}-{p} {e.name}' for (t, p), e in bad.items())}")


def _decide(r: Cluster, o: SinkOptions, st: wire.TxnState, losers: list[str]) -> list[str]:
    """EndTxn(commit) of the parent: the batch's durable decision. In mode (a) the look
    at which losing attempts the broker knows (_known) goes in the same write, answered
    after the decision as before (the losers' ids hash like the parent's: one
    coordinator). Returns the losers to fence."""
    calls = [(wire.end_txn_call(o.parent, st.pid, st.epoch, True), wire.error_result)]
    look = o.atomic and bool(losers)
    if look:
        calls.append(_known_call(losers))
    got = wire.pipelined(_txn(r, o, o.parent), *calls)
    if got[0] != KafkaError.NONE:
        r.seen(got[0], coordinator=(o.parent, TRANSACTION))
        _ok(_retrying(o, "EndTxn", lambda: _end(r, o, o.parent, st.pid, st.epoch, True)), f"EndTxn {o.parent}")
        return _known(r, o, losers)  # look again: the first look came before the decision
    return got[1] if look else losers


def _loser_ids(o: SinkOptions, batch: int, winners: list[BranchMessage]) -> list[str]:
    """Failed and speculative attempts wrote under other attempt numbers. One attempt
    number past the highest winner covers a speculative copy that lost."""
    return [branch_id(o, batch, m.partition, attempt) for m in winners
            for attempt in range(0, m.attempt + 2) if attempt != m.attempt]


def _known_call(ids: list[str]):
    """DescribeTransactions as a (call, result): the ids the broker knows."""
    def result(r) -> list[str]:
        unknown = {t.transactional_id for t in r.transaction_states
                   if KafkaError(t.error_code) == KafkaError.TRANSACTIONAL_ID_NOT_FOUND}
        return [i for i in ids if i not in unknown]
    return (65, dict(transactional_ids=list(ids))), result


def _known(r: Cluster, o: SinkOptions, ids: list[str]) -> list[str]:
    """The losers worth fencing. A semel broker (mode a) answers DescribeTransactions: an
    id it has never seen holds no rows, and fencing it would only add a coordinator
    record. (A copy that starts after this look is no different from one that starts
    after a fence: it finds the batch decided and ends its own branch.) Mode (b) keeps
    to the APIs every broker has and fences them all."""
    if not (o.atomic and ids):
        return ids
    return wire.pipelined(_txn(r, o, o.parent), _known_call(ids))[0]


def _join(r: Cluster, o: SinkOptions, st: wire.TxnState, branch_ids: list[str]) -> None:
    """Mode (a): the parent's EndTxn will decide these branches in one record
    (their own EndTxn afterwards only confirms it)."""
    if not o.atomic:
        return
    try:
        atomic.join(lambda: _txn(r, o, st.txn_id), st, branch_ids, time.monotonic() + o.request_timeout_ms / 1000,
                    moved=lambda err: r.seen(err, coordinator=(_route_key(o, st.txn_id), TRANSACTION)))
    except atomic.AtomicError as exc:
        raise SinkError(f"semel sink: {exc}") from None


def _roll_forward(r: Cluster, o: SinkOptions, done: dict, batch: int, winners: list[BranchMessage]) -> None:
    recorded = {(b[0], b[1]) for b in done.get("branches", [])} if done["batch"] == batch else set()
    if done["batch"] == batch:
        for b in done["branches"]:
            _end_branch(r, o, batch, b)
    for m in winners:  # this replay's own branches lost: the batch was decided without them
        if (m.partition, m.attempt) not in recorded:
            _fence(r, o, branch_id(o, batch, m.partition, m.attempt))


def _fence_losers(r: Cluster, o: SinkOptions, batch: int, winners: list[BranchMessage]) -> None:
    """Abort what the losing attempts left open (see _loser_ids, _known)."""
    for txn_id in _known(r, o, _loser_ids(o, batch, winners)):
        _fence(r, o, txn_id)


def abort_batch(o: SinkOptions, messages, batch: int) -> None:
    with _connect(o) as r:
        for m in messages:
            if isinstance(m, BranchMessage) and not m.skipped and m.pid >= 0:
                _fence(r, o, branch_id(o, batch, m.partition, m.attempt))


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
        with _connect(self.o) as r:
            winners = _winners(messages)
            if self.o.atomic and _written(winners):  # one parent decides every task's branch at once
                st = _init(r, self.o, self.o.parent)
                _join(r, self.o, st, [branch_id(self.o, self.job, m.partition, m.attempt)
                                      for m in _written(winners)])
                _ok(_retrying(self.o, "EndTxn", lambda: _end(r, self.o, self.o.parent, st.pid, st.epoch, True)),
                    f"EndTxn {self.o.parent}")
            for m in _written(winners):
                _end_branch(r, self.o, self.job, [m.partition, m.attempt, m.pid, m.epoch])
            _fence_losers(r, self.o, self.job, winners)

    def abort(self, messages) -> None:
        abort_batch(self.o, messages, self.job)


def make_stream_writer(options, schema, overwrite: bool, fs_settings=None) -> SemelStreamWriter:
    """`fs_settings`: Hadoop `fs.*` settings to open the checkpoint with (S3A)."""
    o = parse_options(options, fs_settings)
    cols = check_schema(schema, o.topic)
    ph = _Phases(o, "streamWriter", -1)
    hit = _probe_key(o) in _probed
    o = probe_cached(o)
    ph.mark("probe")
    o, plan = plan_batch(o)
    ph.mark("plan")
    ph.done(cached=hit)
    return SemelStreamWriter(o, cols, plan)


def make_batch_writer(options, schema, overwrite: bool) -> SemelBatchWriter:
    opts = dict(options)
    job = time.time_ns()
    opts.setdefault(QUERY_ID, f"batch-{job}")
    o = parse_options(opts)
    cols = check_schema(schema, o.topic)
    o = probe(o)
    return SemelBatchWriter(o, cols, job)
