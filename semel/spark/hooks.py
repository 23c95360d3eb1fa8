"""Test-only crash and failure injection of the exactly-once sink (environment
variables the crash tests and `semel demo` set; unset, nothing happens)."""
from __future__ import annotations

import os
import signal

# Test-only crash injection: "<step>@<batch>" kills process group KILL_PGID_ENV
# (the driver and its JVM) and the calling worker at that step of that batch.
KILL_ENV = "SEMEL_SPARK_SINK_KILL_AT"
KILL_PGID_ENV = "SEMEL_SPARK_SINK_KILL_PGID"
# Test-only: a task's first attempt raises after producing all its rows (a loser
# with data in its branch, which Spark retries).
FAIL_FIRST_ATTEMPT_ENV = "SEMEL_SPARK_SINK_FAIL_FIRST_ATTEMPT"
STEPS = ("write:produced", "commit:parent-offsets", "commit:decided", "commit:branch")


def kill_if(step: str, batch: int) -> None:
    if os.environ.get(KILL_ENV) != f"{step}@{batch}":
        return
    pgid = os.environ.get(KILL_PGID_ENV)
    if pgid:
        os.killpg(int(pgid), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
