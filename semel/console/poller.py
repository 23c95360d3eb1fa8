"""Keeps reading the cluster: the latest snapshot and a few minutes of history.

One thread reads a snapshot every interval and keeps, per read, the points the
chart draws (throughput, total lag, total LSO gap). The web application only reads
what this thread last stored; a slow or dead broker slows this thread, never a page.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from .snapshot import Connect, Pool, Snapshot, collect

log = logging.getLogger("semel.console")


@dataclass(frozen=True)
class Point:
    time_s: float
    throughput: float     # records per second appended over the last interval (sum of high watermarks)
    lag: int              # every group's committed offsets behind the high watermarks
    lso_gap: int          # every partition's high watermark past its last stable offset


class Poller:
    def __init__(self, connect: Connect, bootstrap: str, interval_s: float = 1.0, history_s: float = 600.0):
        self.bootstrap = [s.strip() for s in bootstrap.split(",") if s.strip()]
        self.pool = Pool(connect)
        self.interval_s = interval_s
        self.known: dict[int, str] = {}
        self.history: deque[Point] = deque(maxlen=max(2, int(history_s / interval_s)))
        self.snapshot: Snapshot = Snapshot(time_ms=0)   # until the first read
        self.version = 0              # bumped on every stored snapshot (the live pages wait on it)
        self._wake = threading.Event()       # read again now: a write action, or stop()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout=30)
        self.pool.close()

    def refresh_now(self) -> None:
        """Read again before the interval is up (after a write action)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                snap = collect(self.pool, self.bootstrap, self.known)
            except Exception as exc:   # a fault of the console itself: shown, and the next read tries again
                log.exception("reading the cluster failed")
                self.pool.close()
                snap = Snapshot(time_ms=int(time.time() * 1000), errors=[f"the console failed to read the cluster: "
                                                                        f"{exc!r} (its log has the traceback)"])
            self._store(snap)
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def _store(self, snap: Snapshot) -> None:
        prev = self.snapshot
        dt = (snap.time_ms - prev.time_ms) / 1000 if prev.time_ms else 0
        rate = appended(prev, snap) / dt if dt > 0 else 0.0
        self.history.append(Point(snap.time_ms / 1000, round(rate, 1), snap.lag, snap.lso_gap))
        self.snapshot = snap
        self.version += 1   # after the snapshot: a reader that sees the new version reads the new view

    def series(self) -> dict[str, list[float]]:
        """The history as columns (uPlot's data layout)."""
        pts = list(self.history)
        return {"t": [p.time_s for p in pts], "throughput": [p.throughput for p in pts],
                "lag": [float(p.lag) for p in pts], "lso_gap": [float(p.lso_gap) for p in pts]}


def appended(prev: Snapshot, snap: Snapshot) -> int:
    """Records appended between two views: the high watermarks' growth, over the
    partitions both views read (one whose leader did not answer counts in neither)."""
    before = {(p.topic, p.partition): p.high_watermark for p in prev.partitions if p.high_watermark >= 0}
    return sum(max(0, p.high_watermark - before[(p.topic, p.partition)]) for p in snap.partitions
               if p.high_watermark >= 0 and (p.topic, p.partition) in before)
