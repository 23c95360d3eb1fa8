"""The warning a format("semel") query gets, once per run, when each of its micro-batches
will be written by many Python tasks.

PySpark gives every partition of a Python data source writer's input a Python task of
its own, and a stateful query's output has spark.sql.shuffle.partitions of them (200 by
default), however few rows a batch holds: each costs a Python worker round, and at 200
such a batch takes seconds where Spark's noop sink takes a fraction (docs/spark.md,
Limits). The count is fixed in the query's checkpoint at its first run, so the warning
comes as early as the sink can see it: at the first batch of a Complete-mode query (which
always aggregates), and at the second of an Append-mode one (Spark writes `state/` during
the first).

streamWriter() runs in Python workers on the driver side that Spark reuses or starts
afresh as it likes, so "once per run" is kept by a marker file per (query, Spark JVM).
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile

from semel.spark.checkpoint import Checkpoint, CheckpointError

MANY_TASKS = 64
log = logging.getLogger("semel.spark")


def _process(pid: int) -> tuple[str, int, str]:
    """(command name, parent pid, start time) of a process, from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        text = f.read()
    name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
    return name, int(rest[1]), rest[19]


def _run_id() -> str:
    """The Spark JVM this worker serves (the nearest `java` ancestor: some workers are
    forked by Spark's Python daemon, some started by the JVM itself), with its start
    time (a reused pid is another run); the parent where /proc cannot tell."""
    pid = os.getppid()
    try:
        for _ in range(4):
            name, parent, started = _process(pid)
            if name == "java":
                return f"{pid}-{started}"
            pid = parent
    except (OSError, ValueError, IndexError):
        pass
    return str(os.getppid())


def _marker(group: str) -> str:
    key = hashlib.sha256(f"{group}\0{_run_id()}".encode()).hexdigest()[:24]
    return os.path.join(tempfile.gettempdir(), f"semel-spark-advice-{key}")


def _first(marker: str) -> bool:
    """True for the first caller of this run that settles the question (creates the marker)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        return False
    except OSError:
        return True  # no temp dir to write: a warning too many rather than none


def message(tasks: int) -> str:
    return (f"semel: this query writes each micro-batch from {tasks} Python tasks (spark.sql.shuffle.partitions="
            f"{tasks} after its aggregation, fixed in its checkpoint); PySpark pays a Python worker round per task, "
            f"so even a small batch takes seconds. Lower spark.sql.shuffle.partitions (to the executors' cores, "
            f"say) before the query's first run, with a new checkpoint, or write through "
            f"foreachBatch(write_each_batch(options)), which writes from the executors' cores.")


def warn_many_tasks(group: str, checkpoint: str | None, fs: dict, batch: int | None, tasks: int | None,
                    complete: bool) -> None:
    """At streamWriter(): warn once per run when the planned batch's writer will run more
    than MANY_TASKS Python tasks after an aggregation. `tasks`: the shuffle partitions the
    batch's offset log entry records."""
    if checkpoint is None or batch is None or tasks is None:
        return
    marker = _marker(group)
    if os.path.exists(marker):
        return
    if complete:
        stateful = True
    elif batch == 0:
        return  # an Append query's state is not written yet: asked again at the next batch
    else:
        try:
            stateful = Checkpoint(checkpoint, fs).has_state()
        except CheckpointError:
            return
    if _first(marker) and stateful and tasks > MANY_TASKS:
        log.warning(message(tasks))
