"""Retry pacing shared by every retry loop of semel, in every layer (it imports
nothing of semel, so any layer may import it): a capped exponential delay with
jitter, and a deadline measured from the last progress.

The deadline counts from the last try that made progress (progress() resets it and the
delay), so a long operation that keeps moving is not cut off by a deadline from its
start, while one that stops moving gives up `timeout_s` after it stopped. Jitter keeps
many tasks that failed together (one broker restarting under a whole Spark job) from
retrying in lockstep. The clock, the sleep and the random source are parameters so the
rules can be tested without waiting. A loop that never gives up passes
timeout_s=math.inf; an asyncio loop awaits asyncio.sleep(step()) instead of wait().

FailureLog is what such a loop writes to the log: a few lines however long it retries.
"""
from __future__ import annotations

import logging
import random
import time
from typing import Callable

FIRST_S = 0.05
MAX_S = 1.0
JITTER = 0.2  # each delay is drawn from [delay * (1 - JITTER), delay * (1 + JITTER)], then capped


class Backoff:
    """One retry loop's pacing: expired() says the deadline has passed, fits() that the
    next wait ends before it, wait() sleeps the next delay (then doubles it up to max_s);
    step() is wait() without the sleep, for a caller that sleeps itself (asyncio)."""

    def __init__(self, timeout_s: float, *, first_s: float = FIRST_S, max_s: float = MAX_S, jitter: float = JITTER,
                 clock: Callable[[], float] | None = None, sleep: Callable[[float], object] | None = None,
                 rand: Callable[[], float] | None = None):
        # None: time.monotonic, time.sleep and random.random, looked up at each use (a test that
        # replaces time.sleep for the whole process reaches every loop)
        self.timeout_s, self.first_s, self.max_s, self.jitter = timeout_s, first_s, max_s, jitter
        self._clock = clock or (lambda: time.monotonic())
        self._sleep = sleep or (lambda s: time.sleep(s))
        self._rand = rand or (lambda: random.random())
        self.progress()

    def progress(self) -> None:
        """A try moved the operation forward: the deadline and the delay start over."""
        self.deadline = self._clock() + self.timeout_s
        self._base = self.first_s
        self._next = self._draw()

    def expired(self) -> bool:
        return self._clock() > self.deadline

    def fits(self) -> bool:
        """Whether the next wait ends by the deadline."""
        return self._clock() + self._next <= self.deadline

    def wait(self) -> None:
        self._sleep(self.step())

    def step(self) -> float:
        """The delay to wait now; the one after it doubles (up to max_s)."""
        delay = self._next
        self._base = min(self._base * 2, self.max_s)
        self._next = self._draw()
        return delay

    def _draw(self) -> float:
        spread = 1 + self.jitter * (2 * self._rand() - 1)
        return min(self._base * spread, self.max_s)


SUMMARY_EVERY_S = 60.0


class FailureLog:
    """The log lines of one retried operation: a WARNING at its first failure, then one
    WARNING with the count every `every_s` while it keeps failing, and an INFO line with
    the count when it succeeds after failing. A loop retrying every few seconds for
    minutes (a transaction's markers refused by a partition below min.insync.replicas)
    so writes a handful of lines instead of one per try."""

    def __init__(self, logger: logging.Logger, what: str, every_s: float = SUMMARY_EVERY_S,
                 clock: Callable[[], float] | None = None):
        self.logger, self.what, self.every_s = logger, what, every_s
        self._clock = clock or (lambda: time.monotonic())
        self.count = 0
        self._first = self._said = 0.0

    def failed(self, reason: object) -> None:
        now = self._clock()
        self.count += 1
        if self.count == 1:
            self._first = self._said = now
            self.logger.warning("%s failed (%s); will retry", self.what, reason)
        elif now - self._said >= self.every_s:
            self._said = now
            self.logger.warning("%s failed %d times over %s (last: %s); still retrying", self.what, self.count,
                                _duration(now - self._first), reason)

    def succeeded(self) -> None:
        if self.count:
            self.logger.info("%s done after %d failure(s) over %s", self.what, self.count,
                             _duration(self._clock() - self._first))
        self.count = 0


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    return f"{minutes}m{s:02d}s" if minutes else f"{seconds:.1f}s"
