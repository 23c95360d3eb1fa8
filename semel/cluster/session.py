"""A broker's etcd session as the broker itself must judge it, and etcd outages as the
background tasks report them.

`LeaseClock` answers "may this broker still take itself as registered?". etcd ends a
lease TTL seconds after the last keepalive it *received*; the broker only knows when
it *sent* its keepalives, so it counts the TTL from the send time of the last one
that came back renewed. A keepalive is received after it is sent, so the broker's
deadline is never later than etcd's expiry (both clocks run on one machine, or at
the same rate): a broker cut off from etcd stops acting as leader and coordinator
before the controller can see it gone and elect anyone else. Lateness of the answer
does not matter, only the send time, which is why a renewal takes `sent_at`.

`OutageLog` turns the failures of etcd calls made by background tasks (lease
keepalives, the watch, ISR changes, the controller) into two WARNING lines per
outage: the first failure, and when etcd answers again, how many calls failed
meanwhile; instead of a line (or a traceback) per failed call.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Callable


class LeaseClock:
    """The local deadline of this broker's lease. `clock` is monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.deadline = -math.inf      # no session before the first grant

    def renewed(self, sent_at: float, ttl_s: float) -> None:
        """A grant or keepalive sent at `sent_at` came back with `ttl_s` left. Answers
        may arrive out of order: an older one never moves the deadline back."""
        if ttl_s > 0:
            self.deadline = max(self.deadline, sent_at + ttl_s)

    def lapsed(self) -> bool:
        return self.clock() >= self.deadline

    def remaining(self) -> float:
        return self.deadline - self.clock()


class OutageLog:
    """One WARNING when etcd calls start failing, one with the count when one succeeds
    again; the failures between are counted, not logged."""

    def __init__(self, log: logging.Logger, what: str):
        self.log = log
        self.what = what
        self.failures = 0

    def failed(self, task: str, exc: BaseException) -> None:
        self.failures += 1
        if self.failures == 1:
            self.log.warning("%s: etcd unreachable (%s failed: %s); retrying, failures counted until it answers",
                             self.what, task, exc)

    def ok(self) -> None:
        if self.failures:
            self.log.warning("%s: etcd answers again after %d failed call(s)", self.what, self.failures)
            self.failures = 0

    @property
    def down(self) -> bool:
        return self.failures > 0
