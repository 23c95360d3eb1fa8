"""Waiting for a state a broker reaches on its own (a liveness wait, not a timing claim)."""
from __future__ import annotations

import threading
import time


def until(check, what: str, timeout_s: float = 60):
    """check()'s first truthy result; fails the test with `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def in_background(work, progress):
    """Run work() in a thread while the test does harm around it. Returns the thread and
    the list its exception lands in (for the test thread to assert on); `progress`, the
    threading.Event work() sets once it is far enough along, is set on failure too, so
    a test waiting for progress never waits for a worker that died."""
    errors: list[BaseException] = []

    def run():
        try:
            work()
        except BaseException as exc:
            errors.append(exc)
            progress.set()
    worker = threading.Thread(target=run)
    worker.start()
    return worker, errors
