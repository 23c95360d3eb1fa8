"""Diagnostics of the exactly-once sink: the benchmark's per-batch phase breakdown."""
from __future__ import annotations

import json
import os
import time

from semel.spark.sink_options import SinkOptions

# Diagnostics (the benchmark's per-batch breakdown): a file that gets one JSON line of
# phase timings per write() and per commit(). Unset: nothing is timed or written.
TRACE_ENV = "SEMEL_SPARK_SINK_TRACE"


class Phases:
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
