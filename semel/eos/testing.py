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

from semel.eos.outcomes import Fatal, Ok, Retryable, SinkOutcome

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


# ---------------------------------------------------------------- sink conformance

def check_sink_contract(make_sink: Callable[[], Any], committed: Callable[[], dict[str, list]],
                        rows: Sequence[Any], prefix: str = "contract-0-") -> None:
    """Drive a sink through the whole contract and assert what the runtime relies on.

    `make_sink()` returns a new sink object on the same external system (a
    "restarted" process); `committed()` reads what downstream readers see, as
    {txn_id: rows}; `rows` gives at least 4 distinct rows. Row order within a
    batch is not compared (tables have none).
    """

    def ok(x):
        return isinstance(x, Ok)

    def same(a, b):
        return sorted(map(repr, a)) == sorted(map(repr, b))

    r1, r2, r3, r4 = rows[:4]
    t1, t2, t3, t4, t5, t9 = (f"{prefix}{i}" for i in (1, 2, 3, 4, 5, 9))
    s = make_sink()
    s.stage(r1)
    s.stage(r2)
    assert ok(s.prepare(t1, [r3])), "prepare"
    assert t1 not in committed(), "prepared rows must be invisible"
    assert t1 in s.recover(), "a prepared txn must be listed by recover()"
    assert ok(s.prepare(t1, [])), "repeating prepare must be OK"
    assert ok(s.commit(t1)), "commit"
    assert same(committed().get(t1, []), [r1, r2, r3]), f"committed rows of {t1}: {committed().get(t1)}"
    assert t1 not in s.recover(), "a committed txn must not be listed by recover()"
    assert ok(s.commit(t1)), "repeating commit must be OK"
    assert isinstance(s.abort(t1), Fatal), "aborting a committed txn must be Fatal"
    assert isinstance(s.commit(t9), Fatal), "committing what was never prepared must be Fatal"
    s.stage(r4)
    assert ok(s.prepare(t2, [])), "prepare"
    assert ok(s.abort(t2)) and ok(s.abort(t2)), "abort, and its repeat, must be OK"
    assert t2 not in s.recover() and t2 not in committed(), "an aborted txn leaves nothing"
    assert ok(s.abort(t3)), "aborting an unknown txn must be OK"
    s.stage(r1)
    assert ok(s.abort(t3)), "abort drops staged rows"
    assert ok(s.prepare(t4, [r2])), "prepare after an abort carries only new rows"
    s2 = make_sink()  # a restarted process sees the prepared txn
    assert t4 in s2.recover(), "recover() after a restart"
    assert ok(s2.commit(t4)), "commit from a restarted process"
    assert same(committed().get(t4, []), [r2]), f"committed rows of {t4}: {committed().get(t4)}"
    assert ok(s2.prepare(t5, [])) and ok(s2.commit(t5)) and ok(s2.commit(t5)), "an empty batch commits"
    assert t5 not in s2.recover()
    assert set(committed()) >= {t1, t4} and t2 not in committed()
    for sink in (s, s2):
        close = getattr(sink, "close", None)
        if close is not None:
            close()
