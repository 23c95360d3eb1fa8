"""Diagnostics of the exactly-once sink: the benchmark's per-batch phase breakdown."""
from __future__ import annotations

import itertools
import json
import os
import time

from semel.spark.sink_options import SinkOptions

# Diagnostics (the benchmark's per-batch breakdown): a file that gets one JSON line of
# phase timings per write() and per commit(). Unset: nothing is timed or written.
TRACE_ENV = "SEMEL_SPARK_SINK_TRACE"
# The n-th traced call in this process: 1 in a Python worker Spark has just started, more
# in one it reuses (the profile's count of worker starts).
_calls = itertools.count(1)


class Phases:
    """Wall time of each phase of one write() or commit() (ms since the previous mark),
    appended as one JSON line to the file TRACE_ENV names; does nothing when it is unset."""

    def __init__(self, o: SinkOptions, where: str, batch: int):
        self.path = os.environ.get(TRACE_ENV)
        self.doc: dict = {"query": o.group, "where": where, "batch": batch, "pid": os.getpid(), "start": time.time(),
                          "call": next(_calls)}
        self.t = time.perf_counter()
        self.cpu = time.thread_time()  # the rest of the call's wall time waits: on the broker, Spark, the cores
        self.wait_s: float | None = None  # set by waited()

    def mark(self, phase: str) -> None:
        if self.path:
            now = time.perf_counter()
            self.doc[phase] = round((now - self.t) * 1000, 2)
            self.t = now

    def waited(self, batches):
        """`batches` as they come, the time spent waiting for each (Spark preparing the
        task's input: its share of a task, not the sink's) added up for done()."""
        if not self.path:
            return batches
        self.wait_s = 0.0

        def timed():
            it = iter(batches)
            while True:
                t = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    self.wait_s += time.perf_counter() - t
                    return
                self.wait_s += time.perf_counter() - t
                yield item
        return timed()

    def done(self, **extra) -> None:
        if self.path:
            if self.wait_s is not None:
                extra["input_wait_ms"] = round(self.wait_s * 1000, 2)
            self.doc.update(extra, end=time.time(), cpu_ms=round((time.thread_time() - self.cpu) * 1000, 2))
            # one write() of one short line to an O_APPEND file: lines of concurrent tasks do not mix
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(self.doc) + "\n")
