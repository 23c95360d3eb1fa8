"""The exactly-once runtime's commit cycle across a broker SIGKILL and restart,
shared by tests/integration/test_restart_txn_resume.py.

Run as a module (`python -m tests.support.restart_eos BOOTSTRAP TIMEOUT CONFIG`)
it is the application of the stuck-call case: a runtime whose producer uses
librdkafka's default re-bootstrap, so send_offsets_to_transaction hangs for ever
after the restart (docs/librdkafka-restart-hang.md). Its stuck call cannot be
cancelled and its producer cannot be destroyed while a thread is inside it, so
the case runs in its own process: the process, the stuck thread and the producer
end together, before the test stops the broker (in the test process they lived
until the interpreter exited and logged failed connects after pytest's summary).

Protocol on stdin/stdout, one line each: the child prints the first cycle's
outcome, the parent restarts the broker and writes a line, the child runs to
completion and prints a JSON report, then exits without waiting for the stuck
thread.
"""
from __future__ import annotations

import json
import os
import sys
import time

from semel.client import Client
from semel.eos import CommitFatal, CommitSucceeded, EosRuntime, RuntimeFailed
from semel.eos.kafka import KafkaTxnBackend
from semel.eos.sinks.memory import MemorySink, MemorySinkState
from semel.protocol import records

N = 12   # input records; every one must end in the sink and in "out" exactly once


def fill_input(bootstrap: str) -> None:
    with Client(bootstrap) as c:
        c.create_topic("in", 1)
        c.create_topic("out", 1)
        err, _ = c.produce("in", 0, records.build_batch([(None, str(i).encode()) for i in range(N)]))
        assert not err


def runtime(bootstrap: str, state: MemorySinkState, hook=None, **backend_kw) -> EosRuntime:
    backend = KafkaTxnBackend(bootstrap, "rs-0", [("in", 0)], **backend_kw)
    rt = EosRuntime("rs", "0", backend, [MemorySink("m", state)], commit_interval=0.3, on_event=hook)
    rt.start()
    return rt


def _process(rec, ctx):
    ctx.send("out", rec.value)
    ctx.stage("m", int(rec.value))


def cycle(rt: EosRuntime):
    try:
        return rt.run(_process, max_cycles=1)
    except RuntimeFailed as exc:
        return exc.outcome


def run_until_done(bootstrap: str, rt: EosRuntime, state: MemorySinkState, restarted, bound_s: float = 90):
    """Cycles until every input committed and a cycle committed after the restart
    (restarted() is when it finished, None before). A CommitFatal restarts the
    application (a fresh runtime, whose start() recovers), as the process would
    be restarted. Returns the outcomes and the seconds from the restart to the
    first cycle committed after it."""
    outcomes, resumed = [], None
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        outcome = cycle(rt)
        outcomes.append(outcome)
        at = restarted()
        if at is not None and resumed is None and isinstance(outcome, CommitSucceeded):
            resumed = time.monotonic() - at
        if resumed is not None and len(state.committed_rows()) >= N:
            break
        if isinstance(outcome, CommitFatal):
            rt.close()
            rt = runtime(bootstrap, state, timeout=10)
    rt.close()
    return outcomes, resumed


def _as_json(outcome) -> dict:
    step = getattr(outcome, "step", None)
    return {"kind": outcome.kind, "step": step.value if step is not None else None,
            "reason": getattr(outcome, "reason", "")}


def main(bootstrap: str, timeout: float, producer_config: dict) -> None:
    state = MemorySinkState()
    rt = runtime(bootstrap, state, timeout=timeout, producer_config=producer_config)
    print(json.dumps(_as_json(cycle(rt))), flush=True)
    sys.stdin.readline()                       # the parent restarted the broker
    restarted = time.monotonic()
    outcomes, resumed = run_until_done(bootstrap, rt, state, lambda: restarted)
    print(json.dumps({"outcomes": [_as_json(o) for o in outcomes], "resumed": resumed,
                      "committed": state.committed_rows()}), flush=True)
    # A stuck librdkafka call is still running in a daemon thread: end the process
    # (and it) without the interpreter's shutdown, which would wait on its producer.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3]))
