"""The source half of format("semel"): `spark.read` and `spark.readStream`.

Offsets (what Spark journals in the checkpoint) are plain JSON like Spark's Kafka
source writes: {"topic": {"0": 42, "1": 7}}, the next offset to read in every
partition. The driver plans one Spark partition per Kafka partition range
[start, end); executors read exactly that range over the wire
(semel/client/reader.py) and hand Spark Arrow record batches.

Under read_committed (the default) every planned end is at or below the
partition's last stable offset, so every transaction inside a range is already
decided: re-reading a range yields the same rows, and aborted and control
records never appear.
"""
from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from typing import Iterator

from pyspark.errors import PySparkValueError
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField,
                               StructType, TimestampType)

from ..client.cluster import EARLIEST, LATEST, ClusterRouter, ReaderError, Retry

from ..client.reader import read_range
from ..protocol.errors import KafkaError
from . import options as opt
from . import pool

TP = tuple[str, int]

log = logging.getLogger(__name__)

_BASE_FIELDS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]
HEADERS_FIELD = StructField("headers", ArrayType(StructType([
    StructField("key", StringType()), StructField("value", BinaryType())])))

# The schema of Spark's own Kafka source; `headers` only with includeHeaders=true, as there.
KAFKA_SCHEMA = StructType(_BASE_FIELDS)
KAFKA_SCHEMA_WITH_HEADERS = StructType(_BASE_FIELDS + [HEADERS_FIELD])


def source_schema(options) -> StructType:
    include = opt.lower(options).get(opt.INCLUDE_HEADERS, "false").strip().lower() == "true"
    return KAFKA_SCHEMA_WITH_HEADERS if include else KAFKA_SCHEMA


class SourceError(PySparkValueError):
    """Why a read cannot start or go on, in one line (shown by Spark as the query's failure)."""

    def __init__(self, message: str):
        super().__init__(message=f"format('semel'): {message}")


def _parse(options, schema, *, batch: bool) -> opt.SourceOptions:
    try:
        parsed = opt.parse_source(options, batch=batch)
    except opt.OptionError as exc:
        raise SourceError(str(exc)) from None
    expected = KAFKA_SCHEMA_WITH_HEADERS if parsed.include_headers else KAFKA_SCHEMA
    if schema is not None and schema != expected:
        raise SourceError("a user-specified schema is not supported: the schema is fixed "
                          f"(that of Spark's Kafka source), got {schema.simpleString()}")
    return parsed


@contextmanager
def _broker_errors():
    """A reader error (the broker said no, or did not answer in time) fails the query in one line."""
    try:
        yield
    except ReaderError as exc:
        raise SourceError(str(exc)) from None


def _driver_retry(o: opt.SourceOptions) -> Retry:
    """The driver's offset requests: retried for kafka.request.timeout.ms, or as Spark's
    fetchOffset.numRetries / fetchOffset.retryIntervalMs say where they are given."""
    backoff = o.fetch_retry_interval_ms / 1000 if o.fetch_retry_interval_ms is not None else Retry.backoff_s
    return Retry(o.request_timeout_ms / 1000, backoff_s=backoff,
                 attempts=None if o.fetch_retries is None else o.fetch_retries + 1)


def _executor_timeout_ms(o: opt.SourceOptions) -> int:
    """How long a task keeps retrying the reading of its range (kafkaConsumer.pollTimeoutMs)."""
    return o.poll_timeout_ms if o.poll_timeout_ms is not None else o.request_timeout_ms


def _connect(o: opt.SourceOptions, topics: list[str] | None = None, *, executor: bool = False) -> ClusterRouter:
    try:
        if executor:
            return ClusterRouter(o.bootstrap, timeout_s=_executor_timeout_ms(o) / 1000, client_id=o.client_id,
                           topics=topics, security=o.security)
        return ClusterRouter(o.bootstrap, timeout_s=o.request_timeout_ms / 1000, client_id=o.client_id,
                       topics=topics, retry=_driver_retry(o), security=o.security)
    except ReaderError as exc:
        raise SourceError(f"cannot reach the brokers: {exc}") from None


# --- planning (driver) ------------------------------------------------------------

# The offsets Spark journals for this source (and hands the sink's batch): the
# next offset to read in each partition. The sink commits offsets_from_json(end)
# of each batch under options.query_group_id(); `startingOffsets=committed` reads them back.

def offsets_to_json(offsets: dict[TP, int]) -> dict:
    out: dict[str, dict[str, int]] = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = o
    return out


def offsets_from_json(offsets: dict | str) -> dict[TP, int]:
    """{(topic, partition): offset} from the journaled form (a dict, or its JSON text)."""
    if isinstance(offsets, str):
        offsets = json.loads(offsets)
    return {(t, int(p)): int(o) for t, ps in (offsets or {}).items() for p, o in ps.items()}


def current_partitions(cluster: ClusterRouter, sub: opt.Subscription) -> tuple[list[TP], list[str]]:
    """The partitions the subscription names now, and the named topics (or assigned
    partitions) that do not exist (yet)."""
    topics = cluster.refresh()
    if sub.assigned:
        tps = list(sub.assigned)
        missing = [f"{t}-{p}" for t, p in tps if topics.get(t, 0) <= p]
    elif sub.pattern is not None:
        return sorted((t, p) for t, n in topics.items() if sub.matches(t) for p in range(n)), []
    else:
        tps = [(t, p) for t in sub.topics for p in range(topics.get(t, 0))]
        missing = [t for t in sub.topics if t not in topics]
    if missing:
        # a topic the user may not see is missing from the listing too: that is an error
        # (naming the ACL) for a batch read and a stream alike, never a wait
        _authorized(cluster, sorted({tp[0] for tp in tps} | set(sub.topics)))
    return sorted(tp for tp in tps if topics.get(tp[0], 0) > tp[1]), missing


def existing_partitions(cluster: ClusterRouter, sub: opt.Subscription) -> list[TP]:
    """current_partitions for a batch read: a named topic that does not exist (or an
    assigned partition beyond its topic) is an error, not an empty read."""
    tps, missing = current_partitions(cluster, sub)
    if missing:
        raise SourceError(f"unknown topic or partition: {', '.join(missing)}")
    return tps


def _authorized(cluster: ClusterRouter, topics: list[str]) -> None:
    """A topic the user may not see reads as missing from a listing: say which ACL it is."""
    denied = [t for t, err in cluster.topic_errors_of(topics).items()
              if err == KafkaError.TOPIC_AUTHORIZATION_FAILED]
    if denied:
        raise SourceError(f"not authorized: Metadata for {', '.join(denied)} was refused with "
                          f"TOPIC_AUTHORIZATION_FAILED; the user needs Read on the topic(s) {', '.join(denied)}")


def _resolve(cluster: ClusterRouter, o: opt.SourceOptions, tps: list[TP], spec, default: int,
             what: str) -> dict[TP, int]:
    """Absolute offsets for `spec` (earliest | latest | committed | per-partition JSON)."""
    rc = o.read_committed
    if spec == "earliest":
        return cluster.list_offsets(tps, EARLIEST, rc)
    if spec == "latest":
        return cluster.latest(tps, rc)
    if spec == "committed":
        # The query's own batches committed these in their transactions; a
        # partition without one has not been read by the query yet.
        got = cluster.committed(o.group_id, tps)
        out = {tp: off for tp, off in got.items() if off >= 0}
        rest = [tp for tp in tps if tp not in out]
        if rest:
            out.update(cluster.list_offsets(rest, EARLIEST, rc))
        return out
    if isinstance(spec, opt.ByTimestamp):
        return _by_timestamp(cluster, o, tps, spec, what)
    given = {(t, p): off for t, ps in spec.items() for p, off in ps.items()}
    unknown = sorted(set(given) - set(tps))
    if unknown:
        raise SourceError(f"{what} names partitions that are not subscribed or do not exist: "
                          + ", ".join(f"{t}-{p}" for t, p in unknown))
    want = {tp: given.get(tp, default) for tp in tps}
    out = {tp: off for tp, off in want.items() if off >= 0}
    for special in (EARLIEST, LATEST):
        sel = [tp for tp, off in want.items() if off == special]
        if sel:
            out.update(cluster.latest(sel, rc) if special == LATEST else
                       cluster.list_offsets(sel, special, rc))
    return out


def _by_timestamp(cluster: ClusterRouter, o: opt.SourceOptions, tps: list[TP], spec: opt.ByTimestamp,
                  what: str) -> dict[TP, int]:
    """ListOffsets by timestamp: each partition's first offset whose record is at or
    after its time. Where there is none, an end is the latest offset, and a start
    follows startingOffsetsByTimestampStrategy (error, or latest), as in Spark."""
    if spec.every is not None:
        want = {tp: spec.every for tp in tps}
    else:
        want = {(t, p): ts for t, ps in spec.per.items() for p, ts in ps.items()}
        # Spark's rule: per-partition timestamps name every partition read, no other.
        if set(want) != set(tps):
            odd = sorted(set(want) ^ set(tps))
            raise SourceError(f"{what} by timestamp must name exactly the partitions read; differs at "
                              + ", ".join(f"{t}-{p}" for t, p in odd))
    rc = o.read_committed
    found: dict[TP, int] = {}
    for ts in sorted(set(want.values())):
        found.update(cluster.list_offsets([tp for tp, t in want.items() if t == ts], ts, rc))
    latest = cluster.latest(tps, rc)
    none = sorted(tp for tp in tps if found.get(tp, -1) < 0)
    if none and what == "startingOffsets" and o.starting_strategy == "error":
        raise SourceError("no record at or after the starting timestamp in " + ", ".join(
            f"{t}-{p}" for t, p in none) + "; set startingOffsetsByTimestampStrategy=latest to start at the end")
    # an end never passes the latest offset (under read_committed: the last stable one)
    return {tp: latest[tp] if found.get(tp, -1) < 0 else min(found[tp], latest[tp]) for tp in tps}


class RangePartition(InputPartition):
    """One Kafka partition range [start, end): one Spark task."""

    def __init__(self, topic: str, partition: int, start: int, end: int):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def _plan(starts: dict[TP, int], ends: dict[TP, int], o: opt.SourceOptions) -> list[RangePartition]:
    ranges = []
    for tp, end in sorted(ends.items()):
        start = starts.get(tp, end)
        if end < start:
            if o.fail_on_data_loss:
                raise SourceError(f"{tp[0]}-{tp[1]}: the end offset {end} is below the start {start} "
                                  "(topic deleted and recreated, or data lost); "
                                  "set failOnDataLoss=false to go on from the new end")
            continue
        if end > start:
            ranges.append((tp, start, end))
    return [RangePartition(tp[0], tp[1], lo, hi)
            for tp, lo, hi in split(ranges, o.min_partitions, o.max_per_partition)]


def split(ranges: list[tuple[TP, int, int]], at_least: int | None,
          at_most: int | None = None) -> list[tuple[TP, int, int]]:
    """Spark's maxRecordsPerPartition: no range longer than `at_most` offsets (each cut
    into equal pieces); then Spark's minPartitions: at least `at_least` pieces, the
    largest cut in the middle first (a range is never cut below one offset)."""
    out = []
    for tp, lo, hi in ranges:
        pieces = -(-(hi - lo) // at_most) if at_most else 1
        bounds = [lo + (hi - lo) * i // pieces for i in range(pieces + 1)]
        out.extend((tp, a, b) for a, b in zip(bounds, bounds[1:]) if b > a)
    while at_least is not None and len(out) < at_least:
        i = max(range(len(out)), key=lambda i: out[i][2] - out[i][1], default=None)
        if i is None or out[i][2] - out[i][1] < 2:
            break
        tp, lo, hi = out[i]
        mid = lo + (hi - lo) // 2
        out[i:i + 1] = [(tp, lo, mid), (tp, mid, hi)]
    return out


# --- reading (executors) ---------------------------------------------------------

def _read(o: opt.SourceOptions, schema: StructType, part: RangePartition) -> Iterator:
    if not isinstance(part, RangePartition):
        # Nothing planned: PySpark runs one task with InputPartition(None) for an empty plan.
        return
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    # The worker keeps its connections for its next task (semel.spark.pool): a ClusterRouter
    # learns the metadata of topics it does not know yet when it first needs a leader.
    with pool.borrow(("source", o.bootstrap, _executor_timeout_ms(o), o.client_id, o.security),
                     lambda: _connect(o, [part.topic], executor=True), _usable, ClusterRouter.close) as cluster:
        with _broker_errors():
            for rows in read_range(cluster, (part.topic, part.partition), part.start, part.end,
                                   read_committed=o.read_committed, include_headers=o.include_headers,
                                   max_bytes=o.fetch_max_bytes, fail_on_data_loss=o.fail_on_data_loss):
                yield _to_arrow(rows, part, arrow_schema)


def _usable(cluster: ClusterRouter) -> bool:
    cluster.drop_closed()  # reopened on first use
    return True


def _to_arrow(rows, part: RangePartition, arrow_schema):
    """Column by column: no Python object per row beyond what the decoder made."""
    import numpy as np
    import pyarrow as pa

    n = len(rows)
    cols = [
        pa.array(rows.keys, pa.binary()),
        pa.array(rows.values, pa.binary()),
        pa.repeat(pa.scalar(part.topic, pa.string()), n),
        pa.repeat(pa.scalar(part.partition, pa.int32()), n),
        pa.array(rows.offsets, pa.int64()),
        pa.array(np.asarray(rows.timestamps, dtype=np.int64) * 1000,
                 type=arrow_schema.field("timestamp").type),
        pa.array(rows.timestamp_types, pa.int32()),
    ]
    if rows.headers is not None:
        cols.append(pa.array(rows.headers, arrow_schema.field("headers").type))
    return pa.RecordBatch.from_arrays(cols, schema=arrow_schema)


# --- batch: spark.read.format("semel") ---------------------------------------------

class SemelBatchReader(DataSourceReader):
    def __init__(self, options, schema):
        self.opts = _parse(options, schema, batch=True)
        self.schema = KAFKA_SCHEMA_WITH_HEADERS if self.opts.include_headers else KAFKA_SCHEMA

    def partitions(self):
        o = self.opts
        cluster = _connect(o)
        try:
            with _broker_errors():
                tps = existing_partitions(cluster, o.subscription)
                starts = _resolve(cluster, o, tps, o.starting, EARLIEST, "startingOffsets")
                ends = _resolve(cluster, o, tps, o.ending, LATEST, "endingOffsets")
        finally:
            cluster.close()
        return _plan(starts, ends, o)

    def read(self, partition):
        return _read(self.opts, self.schema, partition)


# --- streaming: spark.readStream.format("semel") -------------------------------------

class SemelStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options, schema):
        self._cluster: ClusterRouter | None = None
        self._failed: SourceError | None = None
        self._missing: list[str] = []
        try:
            self.opts = _parse(options, schema, batch=False)
            self.schema = KAFKA_SCHEMA_WITH_HEADERS if self.opts.include_headers else KAFKA_SCHEMA
            self._target: dict[TP, int] | None = None   # Trigger.AvailableNow's end
            self._last_batch = time.monotonic()
            self._reported: dict | None = None
            # Fail at query start, not at the first trigger: options valid, brokers reachable.
            self._partitions()
        except SourceError as exc:
            # PySpark's stream-reader worker calls stop() on a reader whose constructor
            # raised, and the UnboundLocalError of that buries the cause: the reader is
            # built and fails at its first call instead, with the cause alone.
            self._failed = exc

    def _ok(self) -> None:
        if self._failed is not None:
            raise self._failed

    # The reader is pickled to the executors for read(); a socket must not travel.
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cluster"] = None
        return state

    def _c(self) -> ClusterRouter:
        if self._cluster is None:
            self._cluster = _connect(self.opts)
        return self._cluster

    def _partitions(self) -> list[TP]:
        """A subscribed topic that does not exist yet is read once it appears (as with
        Spark's Kafka source): a warning, not a failure."""
        with _broker_errors():
            tps, missing = current_partitions(self._c(), self.opts.subscription)
        if missing and missing != self._missing:
            log.warning("format('semel'): waiting for topic or partition %s to appear", ", ".join(missing))
        self._missing = missing
        return tps

    def _latest(self, tps: list[TP]) -> dict[TP, int]:
        with _broker_errors():
            return self._c().latest(tps, self.opts.read_committed)

    def _from_earliest(self, starts: dict[TP, int], tps: list[TP]) -> dict[TP, int]:
        """starts, plus the earliest offset of each of `tps` it lacks: partitions found
        after the last journaled offset are read from their beginning."""
        missing = [tp for tp in tps if tp not in starts]
        if missing:
            with _broker_errors():
                starts.update(self._c().list_offsets(missing, EARLIEST, self.opts.read_committed))
        return starts

    def initialOffset(self) -> dict:
        self._ok()
        o = self.opts
        tps = self._partitions()
        with _broker_errors():
            return offsets_to_json(_resolve(self._c(), o, tps, o.starting, LATEST, "startingOffsets"))

    def prepareForTriggerAvailableNow(self) -> None:
        self._ok()
        self._target = self._latest(self._partitions())

    def getDefaultReadLimit(self) -> ReadLimit:
        self._ok()
        if self.opts.max_offsets is not None:
            return ReadMaxRows(self.opts.max_offsets)
        if self.opts.min_offsets is not None:
            return ReadMinRows(self.opts.min_offsets)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self._ok()
        starts = offsets_from_json(start)
        tps = self._partitions()
        if self._target is not None:
            # AvailableNow: nothing that arrived after the query started, new partitions included.
            tps = [tp for tp in tps if tp in self._target]
        latest = self._latest(tps)
        self._reported = offsets_to_json(latest)
        if self._target is not None:
            latest = {tp: min(off, self._target[tp]) for tp, off in latest.items()}
        starts = self._from_earliest(starts, list(latest))
        back = {tp: off for tp, off in latest.items() if off < starts[tp]}
        if back and self.opts.fail_on_data_loss:
            raise SourceError("the log went back (topic deleted and recreated?): " + ", ".join(
                f"{t}-{p} ends at {back[(t, p)]}, read up to {starts[(t, p)]}" for t, p in sorted(back))
                + "; set failOnDataLoss=false to go on from the new end")
        # failOnDataLoss=false: go on from the new end (what was between is skipped).
        starts.update(back)
        ends = self._admit(starts, latest, limit)
        if ends != {tp: starts[tp] for tp in ends}:
            self._last_batch = time.monotonic()
        # A partition that left the subscription keeps its position in the journal.
        merged = dict(offsets_from_json(start))
        merged.update(ends)
        return offsets_to_json(merged)

    def reportLatestOffset(self) -> dict | None:
        # What the last latestOffset() saw, for the query's progress (no extra request).
        return self._reported

    def _admit(self, starts: dict[TP, int], latest: dict[TP, int], limit: ReadLimit) -> dict[TP, int]:
        """Admission control: Spark's maxOffsetsPerTrigger / minOffsetsPerTrigger /
        maxTriggerDelay, counted in offsets as Spark's Kafka source counts them."""
        lag = {tp: max(0, latest[tp] - starts[tp]) for tp in latest}
        total = sum(lag.values())
        if isinstance(limit, ReadAllAvailable):
            return {tp: starts[tp] + lag[tp] for tp in latest}
        o = self.opts
        # minOffsetsPerTrigger waits for more data; AvailableNow must never wait
        # (it ends when a trigger finds nothing new).
        if o.min_offsets is not None and self._target is None and total < o.min_offsets and \
                (time.monotonic() - self._last_batch) * 1000 < o.max_trigger_delay_ms:
            return {tp: starts[tp] for tp in latest}
        cap = o.max_offsets if o.max_offsets is not None else \
            (limit.max_rows if isinstance(limit, ReadMaxRows) else None)
        if cap is None or total <= cap:
            return {tp: starts[tp] + lag[tp] for tp in latest}
        return {tp: starts[tp] + n for tp, n in share(lag, cap).items()}

    def partitions(self, start: dict, end: dict):
        self._ok()
        ends = offsets_from_json(end)
        starts = self._from_earliest(offsets_from_json(start), list(ends))
        return _plan(starts, ends, self.opts)

    def read(self, partition):
        return _read(self.opts, self.schema, partition)

    def commit(self, end: dict) -> None:
        # Nothing to do: the exactly-once sink commits the consumed offsets in
        # each batch's own transaction (see options.query_group_id).
        pass

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


def share(lag: dict[TP, int], cap: int) -> dict[TP, int]:
    """Split `cap` offsets over partitions in proportion to their lag (largest
    remainders first, ties by partition), never more than a partition's lag."""
    total = sum(lag.values())
    if total <= cap:
        return dict(lag)
    exact = {tp: n * cap / total for tp, n in lag.items()}
    out = {tp: int(x) for tp, x in exact.items()}
    left = cap - sum(out.values())
    for tp in sorted(lag, key=lambda tp: (-(exact[tp] - out[tp]), tp)):
        if left <= 0:
            break
        if out[tp] < lag[tp]:
            out[tp] += 1
            left -= 1
    return out


def make_batch_reader(options, schema) -> SemelBatchReader:
    return SemelBatchReader(options, schema)


def make_stream_reader(options, schema) -> SemelStreamReader:
    return SemelStreamReader(options, schema)
