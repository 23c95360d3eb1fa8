"""Broker connections kept by a Python worker between Spark tasks.

Spark reuses its Python workers (spark.python.worker.reuse): the same process runs
one task after another, and the driver-side commit() worker one batch after another.
Opening a connection per task costs a TCP handshake and an ApiVersions round trip
(a ClusterRouter also a Metadata one), and on a busy machine every round trip waits for the
broker to be scheduled: per micro-batch that adds up on the batch's critical path.

A connection goes back to the pool only when the block that used it ended normally
(or a reading generator was closed between two records); after an error it is closed,
since a request may have been left half answered. Before reuse, a connection the
broker has closed meanwhile (a restart, an idle timeout) is dropped (Client.idle_open).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

# key -> one idle connection (a worker runs one task at a time: one is all it reuses)
_idle: dict[tuple, object] = {}


@contextmanager
def borrow(key: tuple, open_: Callable[[], T], usable: Callable[[T], bool],
           close: Callable[[T], None]) -> Iterator[T]:
    conn = _idle.pop(key, None)
    if conn is not None and not usable(conn):
        close(conn)
        conn = None
    if conn is None:
        conn = open_()
    try:
        yield conn
    except GeneratorExit:
        _give_back(key, conn, close)  # a reader closed between records: nothing in flight
        raise
    except BaseException:
        close(conn)
        raise
    _give_back(key, conn, close)


def _give_back(key: tuple, conn, close) -> None:
    old = _idle.pop(key, None)
    if old is not None and old is not conn:
        close(old)
    _idle[key] = conn


def clear() -> None:
    """Close every idle connection (tests; a worker's exit closes them anyway)."""
    while _idle:
        _, conn = _idle.popitem()
        try:
            conn.close()
        except OSError:
            pass
