"""The clocks semel reads, in one place at the bottom (it imports nothing of semel, so
any layer may import it).

The wall clock (`wall_ms`) is for what people and other machines read: record and
marker timestamps, offset commit times, the start time DescribeTransactions shows,
retention by timestamp. Every duration and deadline (a transaction's timeout, a group
member's session, a rebalance's delay) runs on the monotonic clock (`mono_ms`), which a
step of the wall clock (an NTP correction, an operator, a virtual machine resumed)
does not move: such a step must never abort a transaction or expire a session.

Test-only: when SEMEL_CLOCK_STEP_FILE names a file, the number of seconds it holds
(negative too) is added to the wall clock; it is read again at most every 50 ms, so a
chaos test steps one broker process's wall clock by rewriting it (atomically) while the
broker runs. The monotonic clock is never stepped, as on a real machine.
"""
from __future__ import annotations

import os
import time

STEP_FILE_ENV = "SEMEL_CLOCK_STEP_FILE"
_REREAD_S = 0.05

_step_file = os.environ.get(STEP_FILE_ENV) or None
_step_ms = 0
_read_at = -1.0


def _current_step_ms() -> int:
    global _step_ms, _read_at
    now = time.monotonic()
    if now - _read_at >= _REREAD_S:
        _read_at = now
        try:
            with open(_step_file) as f:
                _step_ms = int(float(f.read().strip() or 0) * 1000)
        except (OSError, ValueError):
            _step_ms = 0
    return _step_ms


def wall_ms() -> int:
    """Milliseconds since the epoch, as the machine's (possibly stepped) clock says."""
    ms = int(time.time() * 1000)
    return ms + _current_step_ms() if _step_file is not None else ms


def mono_ms() -> int:
    """Milliseconds of a clock that only moves forward, for durations and deadlines."""
    return int(time.monotonic() * 1000)
