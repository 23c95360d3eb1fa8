"""Chaos instruments for the commit cycle: faulty participants and crashes.

Used by semel's own chaos and property suites, and usable for testing a new
sink: wrap it in `FaultySink`, schedule faults per operation, and check what
the cycle and recovery make of them.

Fault kinds (what the participant does instead of answering OK):

    raise        raises before doing anything              -> Retryable
    retryable    returns Retryable, does nothing           -> Retryable
    fatal        returns Fatal, does nothing               -> Fatal
    garbage      returns something that is not an outcome  -> Fatal
    hang         blocks past the guard's timeout           -> Retryable
    raise_after  does the work, then raises (lost answer)  -> Retryable
    crash        does the work, then raises Crash, a BaseException that no
                 layer catches: the process "dies" right there
    crash_before raises Crash before doing the work
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from semel.eos.outcomes import Fatal, Retryable, SinkOutcome

KINDS = ("raise", "retryable", "fatal", "garbage", "hang", "raise_after")
FATAL_KINDS = ("fatal", "garbage")
EFFECT_KINDS = ("raise_after", "crash")
OPS = ("prepare", "commit", "abort", "recover")


class Crash(BaseException):
    """Simulated process death: propagates through every `except Exception`."""


class InjectedError(RuntimeError):
    pass


# Hung calls wait on this; tests set it at teardown so no thread lingers.
RELEASE_HANGS = threading.Event()


class FaultySink:
    """Wraps a participant; `faults[op]` (a kind) fires on the next call of op, once.

    `plan(op, txn_id)` may return a kind for any call as well.
    """

    def __init__(self, inner: Any, faults: dict[str, str] | None = None,
                 plan: Callable[[str, str], str | None] | None = None, timeout: float | None = 0.05):
        self.inner = inner
        self.name = inner.name
        self.timeout = timeout
        self.faults = dict(faults or {})
        self.plan = plan
        self.calls: list[tuple[str, str]] = []
        for op, kind in self.faults.items():
            if op not in OPS:
                raise ValueError(f"unknown op {op!r}")
            if kind not in KINDS + ("crash", "crash_before"):
                raise ValueError(f"unknown fault kind {kind!r}")

    def stage(self, row: Any) -> None:
        self.inner.stage(row)

    def prepare(self, txn_id: str, rows: Sequence[Any] = ()) -> SinkOutcome:
        return self._call("prepare", txn_id, lambda: self.inner.prepare(txn_id, rows))

    def commit(self, txn_id: str) -> SinkOutcome:
        return self._call("commit", txn_id, lambda: self.inner.commit(txn_id))

    def abort(self, txn_id: str) -> SinkOutcome:
        return self._call("abort", txn_id, lambda: self.inner.abort(txn_id))

    def recover(self) -> list[str]:
        return self._call("recover", "-", self.inner.recover)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    def _call(self, op: str, txn_id: str, fn: Callable[[], Any]) -> Any:
        self.calls.append((op, txn_id))
        kind = self.faults.pop(op, None)
        if kind is None and self.plan is not None:
            kind = self.plan(op, txn_id)
        if kind is None:
            return fn()
        if kind == "crash_before":
            raise Crash(f"{self.name}.{op}({txn_id})")
        if kind == "raise":
            raise InjectedError(f"{self.name}.{op} failed")
        if kind == "retryable":
            return Retryable(f"injected {op}")
        if kind == "fatal":
            return Fatal(f"injected {op}")
        if kind == "garbage":
            return {"surprise": op}
        if kind == "hang":
            RELEASE_HANGS.wait(60)
            raise InjectedError(f"{self.name}.{op} hung")
        value = fn()  # raise_after / crash: the work is done, the answer is lost
        if kind == "crash":
            raise Crash(f"{self.name}.{op}({txn_id})")
        raise InjectedError(f"{self.name}.{op} lost its answer (value was {value!r})")
