"""Event-loop watchdog: measures how late the loop wakes a sleeping task (its lag)
and names whoever held it.

One asyncio task sleeps `interval_s` over and over; the extra time it took to wake
is the loop's lag (a handler that computes without awaiting delays every other
connection by exactly that much). Each sample goes into
semel_event_loop_lag_seconds (histogram) and the largest into
semel_event_loop_lag_max_seconds.

A task cannot see what holds the loop it runs on, so a small daemon thread looks
at the loop thread's stack while the heartbeat is late and keeps a description of
the request on it (api, version, client, peer, innermost semel frame). When the
loop comes back the lag is logged with that description: a warning past
`warn_s`, and past `stall_s` an error line carrying STALL_MARKER, which the test
suite looks for in every broker log (a regression net for the next freeze).

The thread also tells a held loop from a process that did not run at all
(SIGSTOP in chaos tests, a starved machine): then the thread was silent as well
and the process used little CPU meanwhile, and the lag is logged as such, without
the marker. (A loop held inside one C call that keeps the GIL also silences the
thread, but burns CPU: that still counts as held.)
"""
from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from types import FrameType

from .metrics import BrokerMetrics

log = logging.getLogger("semel.broker.watchdog")

# Distinctive text of the line logged when the loop was held past the stall bound.
STALL_MARKER = "SEMEL-EVENT-LOOP-STALL"

_DISPATCH = "_dispatch"          # semel.broker.connection._dispatch holds `req` and `peer`
_OURS_DIR = "/semel/"


class LoopWatchdog:
    def __init__(self, metrics: BrokerMetrics, warn_s: float = 0.2, stall_s: float = 2.0, interval_s: float | None = None):
        self.metrics = metrics
        self.warn_s = warn_s
        self.stall_s = stall_s
        # Half the warning bound by default: the thread then looks at least once
        # while a hold that long is still on the loop. Each tick wakes the loop and
        # the thread even when nothing runs (most of an idle broker's CPU), so no
        # more often than that.
        self.interval_s = warn_s / 2 if interval_s is None else interval_s
        self._beat = time.monotonic()
        self._culprit: str | None = None
        self._thread_late = 0.0     # the observer's own worst lateness since the last beat
        self._thread_beat = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def run(self) -> None:
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()
        try:
            while True:
                t0, cpu0 = time.monotonic(), time.process_time()
                self._beat = t0
                await asyncio.sleep(self.interval_s)
                lag = max(time.monotonic() - t0 - self.interval_s, 0.0)
                self._record(lag, time.process_time() - cpu0)
        finally:
            self._stop.set()

    def _record(self, lag: float, cpu_s: float = 0.0) -> None:
        self.metrics.observe_loop_lag(lag)
        culprit, self._culprit = self._culprit, None
        thread_late, self._thread_late = self._thread_late, 0.0
        if lag < self.warn_s:
            return
        # Read now, not only what the thread noted: after SIGCONT this task may run
        # before the thread had a chance to note its own lateness.
        silent = max(thread_late, time.monotonic() - self._thread_beat - self.interval_s)
        if silent >= lag / 2 and cpu_s < lag / 2:
            log.warning("event loop lag %.3fs while the whole process was not running (stopped or starved; "
                        "%.3fs of CPU): not a held loop", lag, cpu_s)
            return
        who = culprit or "no request on the stack (a background task or the loop itself)"
        if lag >= self.stall_s:
            log.error("%s: event loop held for %.3fs by %s", STALL_MARKER, lag, who)
        else:
            log.warning("event loop lag %.3fs, held by %s", lag, who)

    # --- the observer thread ------------------------------------------------

    def _watch(self) -> None:
        while True:
            t0 = time.monotonic()
            if self._stop.wait(self.interval_s):
                return
            now = time.monotonic()
            self._thread_late = max(self._thread_late, now - t0 - self.interval_s)
            self._thread_beat = now
            late = now - self._beat - self.interval_s
            if late >= self.warn_s / 2 and self._culprit is None:
                frame = sys._current_frames().get(self._loop_thread)
                if frame is not None:
                    self._culprit = describe_stack(frame)


def describe_stack(top: FrameType) -> str | None:
    """The request being handled on this stack and its innermost semel frame."""
    request = None
    innermost = None
    frame: FrameType | None = top
    while frame is not None:
        code = frame.f_code
        if innermost is None and _is_application(code.co_filename):
            innermost = f"{_short(code.co_filename)}:{frame.f_lineno} {code.co_name}"
        if request is None and code.co_name == _DISPATCH:
            request = _request_of(frame)
        frame = frame.f_back
    if request is None and innermost is None:
        return None
    return ", ".join(x for x in (request, f"at {innermost}" if innermost else None) if x)


def _is_application(path: str) -> bool:
    """Code of semel or of the program embedding it, not the stdlib or a dependency."""
    path = path.replace("\\", "/")
    if path.endswith("/watchdog.py") or path.startswith("<"):
        return False
    if _OURS_DIR in path:
        return True
    return "site-packages" not in path and not path.startswith(sys.base_prefix)


def _request_of(frame: FrameType) -> str | None:
    try:
        local = frame.f_locals
        req, peer = local.get("req"), local.get("peer")
    except Exception:  # a frame changing under us: no description this time
        return None
    if req is None:
        return None
    return f"api {req.api_key} v{req.api_version} (client_id={req.client_id!r}, peer={peer})"


def _short(path: str) -> str:
    path = path.replace("\\", "/")
    i = path.rfind(_OURS_DIR)
    return path[i + 1:] if i >= 0 else path.rsplit("/", 2)[-1] if "/" in path else path
