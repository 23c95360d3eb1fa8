"""Every broker, cluster and disk the testing helpers started, closed at the latest
when this process exits.

Three nets, each for a way a test run ends: the fixtures' finalizers (a test that
fails, and Ctrl-C: pytest tears fixtures down on KeyboardInterrupt), atexit (a run
that ends without tearing down, or code outside pytest), and the parent-death signal
set on each server process (semel.launch.process: a test run that is itself killed).
"""
from __future__ import annotations

import atexit
import logging
import threading

log = logging.getLogger("semel.testing")

_live: dict[int, object] = {}   # id -> handle with close(), in start order
_lock = threading.Lock()


def track(handle) -> None:
    with _lock:
        _live[id(handle)] = handle


def untrack(handle) -> None:
    with _lock:
        _live.pop(id(handle), None)


def live() -> list:
    with _lock:
        return list(_live.values())


@atexit.register
def close_all() -> None:
    """Close what is still open, newest first; one handle failing does not stop the rest."""
    for handle in reversed(live()):
        try:
            handle.close()
        except Exception:   # at exit: say it and go on to the next
            log.exception("closing %r at exit failed", handle)
        untrack(handle)
