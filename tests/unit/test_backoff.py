"""semel.backoff on a fake clock: the deadline counts from the last progress,
delays double up to the cap, and jitter stays within its bounds; FailureLog writes a
few lines however often an operation is retried."""
from __future__ import annotations

import logging
import math
import random

import pytest

from semel.backoff import Backoff, FailureLog


class Clock:
    def __init__(self):
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def backoff(clock: Clock, timeout_s: float = 1.0, rand=lambda: 0.5, **kw) -> Backoff:
    return Backoff(timeout_s, clock=clock, sleep=clock.sleep, rand=rand, **kw)


def test_delays_double_up_to_the_cap_without_jitter_at_the_midpoint():
    c = Clock()
    b = backoff(c, timeout_s=100.0)
    for _ in range(8):
        b.wait()
    assert c.slept == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])


def test_the_deadline_counts_from_the_last_progress():
    c = Clock()
    b = backoff(c, timeout_s=1.0)
    c.now += 0.9
    assert not b.expired()
    b.progress()                      # moved: another full second from here
    c.now += 0.9
    assert not b.expired()
    c.now += 0.2
    assert b.expired()


def test_progress_resets_the_delay():
    c = Clock()
    b = backoff(c, timeout_s=100.0)
    for _ in range(4):
        b.wait()
    b.progress()
    b.wait()
    assert c.slept[-1] == pytest.approx(0.05)


def test_fits_says_whether_the_next_wait_ends_by_the_deadline():
    c = Clock()
    b = backoff(c, timeout_s=0.3)
    assert b.fits()
    b.wait()                          # 0.05
    b.wait()                          # 0.1: 0.15 s in, the next wait is 0.2
    assert not b.fits() and not b.expired()
    b.progress()                      # the deadline moves to 0.45 s, the next wait is 0.05
    assert b.fits()


@pytest.mark.parametrize("seed", range(5))
def test_jitter_stays_within_its_bounds_and_under_the_cap(seed):
    c = Clock()
    b = backoff(c, timeout_s=1000.0, rand=random.Random(seed).random, first_s=0.05, max_s=1.0, jitter=0.2)
    base = 0.05
    for _ in range(40):
        b.wait()
        assert base * 0.8 - 1e-12 <= c.slept[-1] <= min(base * 1.2, 1.0) + 1e-12
        base = min(base * 2, 1.0)
    assert len(set(c.slept[-20:])) > 1   # capped delays still vary
    assert max(c.slept) <= 1.0


def test_jitter_extremes():
    for r, factor in ((0.0, 0.8), (1.0, 1.2)):
        c = Clock()
        backoff(c, timeout_s=10.0, rand=lambda r=r: r).wait()
        assert c.slept == [pytest.approx(0.05 * factor)]


def test_step_gives_the_delays_wait_sleeps_without_sleeping():
    c, d = Clock(), Clock()
    stepped, waited = backoff(c, timeout_s=100.0), backoff(d, timeout_s=100.0)
    delays = [stepped.step() for _ in range(8)]
    for _ in range(8):
        waited.wait()
    assert c.slept == [] and delays == pytest.approx(d.slept)


def test_an_infinite_deadline_never_expires():
    c = Clock()
    b = backoff(c, timeout_s=math.inf)
    c.now += 1e9
    assert not b.expired() and b.fits()


def test_a_retried_failure_is_logged_once_then_counted(caplog):
    """613 refusals 0.5 s apart (about 5 minutes) and a success: the first refusal, one
    summary a minute, and the success with the count; not one line per retry."""
    clock = Clock()
    logger = logging.getLogger("test.failure_log")
    flog = FailureLog(logger, "marker write to t-0 for txn-a", every_s=60, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.failure_log"):
        for _ in range(613):
            flog.failed("NOT_ENOUGH_REPLICAS")
            clock.now += 0.5
        flog.succeeded()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines[0] == ("WARNING", "marker write to t-0 for txn-a failed (NOT_ENOUGH_REPLICAS); will retry")
    summaries = [m for level, m in lines[1:-1]]
    assert len(summaries) == 5   # at 60, 120, ... 300 s
    assert summaries[0] == ("marker write to t-0 for txn-a failed 121 times over 1m00s "
                            "(last: NOT_ENOUGH_REPLICAS); still retrying")
    assert lines[-1] == ("INFO", "marker write to t-0 for txn-a done after 613 failure(s) over 5m06s")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test.failure_log"):
        flog.failed("again")   # a new run of failures starts with its own first line
        flog.succeeded()
        flog.succeeded()       # a success without a failure says nothing
    assert [r.getMessage() for r in caplog.records] == [
        "marker write to t-0 for txn-a failed (again); will retry",
        "marker write to t-0 for txn-a done after 1 failure(s) over 0.0s"]
