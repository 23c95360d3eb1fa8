"""How far a streaming query is behind its topics: the figures Spark's Kafka source
reports in its progress metrics (minOffsetsBehindLatest, maxOffsetsBehindLatest,
avgOffsetsBehindLatest), from a StreamingQueryListener.

PySpark's Python Data Source API has no hook for a source's own progress metrics
(`metrics` stays `{}`), but each progress carries the source's `endOffset` (where the
batch ended) and `latestOffset` (what the source saw available: the semel source's
reportLatestOffset()). The listener takes the difference per partition, as Spark's
Kafka source does, and puts it in the log and on a Prometheus endpoint:

    from semel.spark.metrics import LagListener
    LagListener.install(spark, port=9464)

Prometheus names follow the broker's (semel/broker/metrics.py), under semel_spark_:

- semel_spark_min_offsets_behind_latest{query,source}
- semel_spark_max_offsets_behind_latest{query,source}
- semel_spark_avg_offsets_behind_latest{query,source}
- semel_spark_partition_offsets_behind_latest{query,topic,partition}

`query` is the query's name, else its id; `source` reads `semel:TOPIC[,TOPIC...]` (the
progress itself names the source by a Spark class, e.g.
PythonMicroBatchStreamWithTriggerAvailableNow@1a2b3c). A query's series are removed
when it terminates. Any source whose offsets have Kafka's shape
({"topic": {"partition": offset}}) is measured, Spark's own Kafka source included.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger("semel.spark.lag")

TP = tuple[str, int]


@dataclass(frozen=True)
class Lag:
    """One source of one progress: offsets behind latest, per partition and overall."""
    query: str
    batch: int
    source: str
    partitions: dict[TP, int]

    @property
    def min(self) -> int:
        return min(self.partitions.values())

    @property
    def max(self) -> int:
        return max(self.partitions.values())

    @property
    def avg(self) -> float:
        return sum(self.partitions.values()) / len(self.partitions)

    def line(self) -> str:
        return (f"query {self.query} batch {self.batch} source {self.source}: offsets behind latest "
                f"min {self.min} max {self.max} avg {self.avg:g} over {len(self.partitions)} partitions")


def _kafka_offsets(text) -> dict[TP, int] | None:
    """{(topic, partition): offset} of a Kafka-shaped offset JSON, else None."""
    if not text:
        return None
    try:
        doc = json.loads(text) if isinstance(text, str) else text
        return {(t, int(p)): int(o) for t, ps in doc.items() for p, o in ps.items()}
    except (ValueError, TypeError, AttributeError):
        return None


def behind_latest(end, latest) -> dict[TP, int] | None:
    """Per partition, latest minus end (never below 0), over the partitions both name.
    None when either is not Kafka-shaped or they share no partition."""
    e, l = _kafka_offsets(end), _kafka_offsets(latest)
    if e is None or l is None:
        return None
    out = {tp: max(0, l[tp] - e[tp]) for tp in l if tp in e}
    return out or None


def describe(partitions) -> str:
    return "semel:" + ",".join(sorted({t for t, _ in partitions}))


def lags(progress) -> list[Lag]:
    """The Lag of each Kafka-shaped source of one StreamingQueryProgress."""
    query = progress.name or str(progress.id)
    out = []
    for src in progress.sources:
        parts = behind_latest(src.endOffset, src.latestOffset)
        if parts is not None:
            out.append(Lag(query, progress.batchId, describe(parts), parts))
    return out


class LagListener(StreamingQueryListener):
    """Logs each progress's lag (logger semel.spark.lag, INFO) and keeps the gauges.
    `port`: serve them at http://HOST:port/metrics (None: register them only, e.g.
    to scrape `registry` another way). `last` holds each query's latest Lag list."""

    def __init__(self, port: int | None = None, addr: str = "0.0.0.0", registry: CollectorRegistry | None = None):
        super().__init__()
        self.registry = registry or CollectorRegistry()
        labels = ["query", "source"]
        self.min = Gauge("semel_spark_min_offsets_behind_latest", "Smallest lag of a source's partitions "
                         "(offsets) at the query's last progress", labels, registry=self.registry)
        self.max = Gauge("semel_spark_max_offsets_behind_latest", "Largest lag of a source's partitions "
                         "(offsets) at the query's last progress", labels, registry=self.registry)
        self.avg = Gauge("semel_spark_avg_offsets_behind_latest", "Mean lag of a source's partitions "
                         "(offsets) at the query's last progress", labels, registry=self.registry)
        self.partition = Gauge("semel_spark_partition_offsets_behind_latest", "Offsets between the end of "
                               "the query's last batch and the latest the source saw",
                               ["query", "topic", "partition"], registry=self.registry)
        self.last: dict[str, list[Lag]] = {}
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}    # query id -> label (for removal at termination)
        self.server = None
        if port is not None:
            self.server, _ = start_http_server(port, addr=addr, registry=self.registry)

    @classmethod
    def install(cls, spark, port: int | None = None, **kw) -> "LagListener":
        listener = cls(port, **kw)
        spark.streams.addListener(listener)
        return listener

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None

    # --- StreamingQueryListener ------------------------------------------------

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        self.record(event.progress)

    def onQueryTerminated(self, event) -> None:
        with self._lock:
            label = self._names.pop(str(event.id), None)
            if label is not None:
                self._drop(label)

    # ------------------------------------------------------------------------------

    def record(self, progress) -> list[Lag]:
        found = lags(progress)
        if not found:
            return found
        query = found[0].query
        with self._lock:
            self._drop(query)
            self._names[str(progress.id)] = query
            self.last[query] = found
            for lag in found:
                self.min.labels(query, lag.source).set(lag.min)
                self.max.labels(query, lag.source).set(lag.max)
                self.avg.labels(query, lag.source).set(lag.avg)
                for (topic, p), n in lag.partitions.items():
                    self.partition.labels(query, topic, str(p)).set(n)
        for lag in found:
            log.info("%s", lag.line())
        return found

    def _drop(self, query: str) -> None:
        """Forget a query's series (its sources or partitions may have changed)."""
        for lag in self.last.pop(query, []):
            series = [(g, (query, lag.source)) for g in (self.min, self.max, self.avg)]
            series += [(self.partition, (query, topic, str(p))) for topic, p in lag.partitions]
            for gauge, labels in series:
                try:
                    gauge.remove(*labels)
                except KeyError:
                    pass   # two sources of the same topics share a series


__all__ = ["Lag", "LagListener", "behind_latest", "lags"]
