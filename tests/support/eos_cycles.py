"""A sink driven by the EOS runtime end to end, for the sinks' integration tests."""
from __future__ import annotations

from typing import Any, Callable

from semel.eos import CommitSucceeded, EosRuntime, RecordingBroker, RecordingTxnBackend
from semel.eos.sink import TwoPhaseSink


def cycle_into(sink: TwoPhaseSink, inputs: int, row: Callable[[Any], Any], *, per_cycle: int, fail: str) -> None:
    """Run a runtime over inputs 0..inputs-1 into `sink` alone, staging row(value) for
    up to `per_cycle` records a cycle. The first cycle fails at the backend step
    `fail` and is rolled back; every later one must commit, until all inputs are read.
    The runtime (and so the sink) is closed after."""
    broker = RecordingBroker(inputs=list(range(inputs)))
    backend = RecordingTxnBackend(broker, "app-0")
    rt = EosRuntime("app", "0", backend, [sink], commit_interval=0.1)
    rt.start()

    def work(ctx):
        for _ in range(per_cycle):
            rec = backend.poll(0)
            if rec is not None:
                ctx.stage(sink.name, row(rec.value))
    try:
        backend.fail(fail)
        rt.run_cycle(work)
        while broker.position != inputs:
            assert isinstance(rt.run_cycle(work), CommitSucceeded)
    finally:
        rt.close()
