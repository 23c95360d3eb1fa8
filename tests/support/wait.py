"""Waiting for a state a broker reaches on its own (a liveness wait, not a timing claim)."""
from __future__ import annotations

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
