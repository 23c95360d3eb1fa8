"""The two-phase-commit sink contract and the guard every call goes through.

A sink is one external system taking part in the commit cycle:

    stage(row)              buffer (or write invisibly) one row of the open cycle
    prepare(txn_id, rows)   seal the staged rows plus `rows` under txn_id,
                            durable but invisible to readers
    commit(txn_id)          make the prepared batch visible, atomically
    abort(txn_id)           drop whatever is held for txn_id (prepared or staged)
    recover()               ids currently prepared but not committed

Every operation is idempotent, because retries and restarts replay them:
preparing a prepared (or committed) txn, committing a committed one and
aborting an aborted (or unknown) one answer OK. Committing a txn that is not
prepared or aborting a committed one answers Fatal: the invariant is broken.

The runtime never calls a sink directly: `SinkGuard` runs each call with a
timeout and turns exceptions, hangs and garbage answers into outcomes, with
one log line naming the sink, the step and the txn id.
"""
from __future__ import annotations

import abc
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from semel.eos.deadline import DeadlineExceeded, call_with_deadline
from semel.eos.outcomes import SINK_OUTCOME_TYPES, Fatal, Ok, Retryable, SinkOutcome

log = logging.getLogger("semel.eos")

DEFAULT_TIMEOUT_S = 30.0


class TwoPhaseSink(abc.ABC):
    """Base class for sinks. Subclasses set `name` and implement the five operations."""

    name: str = "sink"
    #: seconds each operation may take before the runtime gives up on it (None: no limit)
    timeout: float | None = DEFAULT_TIMEOUT_S

    @abc.abstractmethod
    def stage(self, row: Any) -> None: ...

    @abc.abstractmethod
    def prepare(self, txn_id: str, rows: Sequence[Any] = ()) -> SinkOutcome: ...

    @abc.abstractmethod
    def commit(self, txn_id: str) -> SinkOutcome: ...

    @abc.abstractmethod
    def abort(self, txn_id: str) -> SinkOutcome: ...

    @abc.abstractmethod
    def recover(self) -> list[str]: ...

    def close(self) -> None:
        """Release connections; optional."""


# ---------------------------------------------------------------- the guard

@dataclass(frozen=True)
class RecoverResult:
    """What a guarded recover() gave: ids, or a failure outcome."""

    ids: tuple[str, ...] = ()
    failure: SinkOutcome | None = None


class SinkGuard:
    """Calls one participant's operations safely and reports them.

    `on_latency(op, seconds)` receives the duration of every prepare/commit
    call (metrics hook); `on_failure(op, outcome)` every non-OK outcome.
    """

    def __init__(self, sink: Any, *, timeout: float | None | object = ...,
                 on_latency: Callable[[str, str, float], None] | None = None,
                 on_failure: Callable[[str, str, SinkOutcome], None] | None = None):
        self.sink = sink
        self.name = str(getattr(sink, "name", type(sink).__name__))
        self.timeout = getattr(sink, "timeout", DEFAULT_TIMEOUT_S) if timeout is ... else timeout
        self._on_latency = on_latency
        self._on_failure = on_failure
        self._left_behind: list[threading.Thread] = []

    @property
    def stuck(self) -> bool:
        """True while a call that timed out is still running inside the sink."""
        self._left_behind = [t for t in self._left_behind if t.is_alive()]
        return bool(self._left_behind)

    # Each operation: run, classify, log, report.
    def prepare(self, txn_id: str, rows: Sequence[Any], step: str = "preCommit2PC") -> SinkOutcome:
        return self._op("prepare", step, txn_id, lambda: self.sink.prepare(txn_id, list(rows)))

    def commit(self, txn_id: str, step: str = "commit2PC") -> SinkOutcome:
        return self._op("commit", step, txn_id, lambda: self.sink.commit(txn_id))

    def abort(self, txn_id: str, step: str = "abort") -> SinkOutcome:
        return self._op("abort", step, txn_id, lambda: self.sink.abort(txn_id))

    def recover(self, step: str = "recover") -> RecoverResult:
        try:
            value = call_with_deadline(self.sink.recover, self.timeout, self._left_behind, "semel-eos-sink-call")
        except DeadlineExceeded as exc:
            return self._recover_failed(step, Retryable(str(exc)))
        except Exception as exc:  # noqa: BLE001
            return self._recover_failed(step, Retryable(f"raised {type(exc).__name__}: {exc}"))
        if not isinstance(value, (list, tuple, set, frozenset)) or not all(isinstance(x, str) for x in value):
            return self._recover_failed(step, Fatal(f"returned garbage: {_short(value)}"))
        return RecoverResult(ids=tuple(sorted(set(value))))

    def _recover_failed(self, step: str, outcome: SinkOutcome) -> RecoverResult:
        self._report("recover", step, "-", outcome)
        return RecoverResult(failure=outcome)

    def _op(self, op: str, step: str, txn_id: str, fn: Callable[[], Any]) -> SinkOutcome:
        started = time.perf_counter()
        try:
            value = call_with_deadline(fn, self.timeout, self._left_behind, "semel-eos-sink-call")
        except DeadlineExceeded as exc:
            outcome: SinkOutcome = Retryable(str(exc))
        except Exception as exc:  # noqa: BLE001 - a sink that raises becomes a value
            outcome = Retryable(f"raised {type(exc).__name__}: {exc}")
        else:
            if isinstance(value, SINK_OUTCOME_TYPES):
                outcome = value
            else:
                # Unknown answer: we cannot tell what the sink did, so nothing
                # built on it can be trusted. Stop rather than guess.
                outcome = Fatal(f"returned garbage: {_short(value)}")
        if self._on_latency is not None and op in ("prepare", "commit"):
            self._on_latency(self.name, op, time.perf_counter() - started)
        if not isinstance(outcome, Ok):
            self._report(op, step, txn_id, outcome)
        return outcome

    def _report(self, op: str, step: str, txn_id: str, outcome: SinkOutcome) -> None:
        kind = "fatal" if isinstance(outcome, Fatal) else "retryable"
        log.warning("eos sink=%s step=%s op=%s txn=%s %s: %s",
                    self.name, step, op, txn_id, kind, getattr(outcome, "reason", outcome))
        if self._on_failure is not None:
            self._on_failure(self.name, step, outcome)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
